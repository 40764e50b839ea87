"""A gradient scaler's own state, read where it is kept: its scale, its growth tracker, its settings.

``torch.amp.GradScaler`` keeps its scale and growth tracker as one-element
tensors (``_scale``, ``_growth_tracker``) that ``scale()`` reads and
``update()`` rewrites in place (``torch._amp_update_scale_``), and its
settings as numbers (``_growth_factor``, ``_backoff_factor``,
``_growth_interval``) that ``update()`` passes to that op. Torch's objects
are not walked for state (capture/reachable.py), so the tensors were
constants no name reached, and the capture was refused. Read here as a
field of an object the step names is: the tensors where they are kept (a
replay reads the scaler's current ones), the numbers as inputs
(``set_growth_factor`` between calls is seen), ``_enabled`` and
``_device`` held.

Its per-optimizer states (``_per_optimizer_states``: whether ``unscale_``
or ``step`` ran this iteration) are Python state that ``update()`` replaces
by an empty dict at the end of each iteration. A graph was captured from a
fresh one: each replay requires it still empty when the call begins
(``unscale_`` called outside the step would have the step skip its own),
and gives the scaler a new empty one as ``update()`` does. A step that
leaves them filled (``step`` without ``update``) is refused.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any, Callable, Iterator

import torch
import torch.fx

from graphprof.capture.held_values import HeldValue, Hold, Place
from graphprof.capture.host_nodes import effect_node
from graphprof.capture.locations import Location, attribute_location
from graphprof.capture.scalars import DataDependentError

#: The scaler's fields a step reads: tensors read where they are kept, numbers as inputs, the rest held.
SCALER_FIELDS = ("_enabled", "_device", "_scale", "_growth_tracker", "_init_scale", "_growth_factor",
                 "_backoff_factor", "_growth_interval", "_init_growth_tracker")
_STATES = "_per_optimizer_states"


def scaler_fields(scaler: torch.amp.GradScaler, label: str) -> Iterator[tuple[Location, Any, bool]]:
    """The fields of ``scaler`` a step reads (``SCALER_FIELDS``), as the step's own state."""
    fields = vars(scaler)
    for name in SCALER_FIELDS:
        if name in fields:
            yield attribute_location(scaler, name, label), fields[name], True


def _states_length(scaler: torch.amp.GradScaler) -> int:
    return len(getattr(scaler, _STATES))


class ScalerStates:
    """The gradient scalers a step reaches: their per-optimizer states, checked and renewed per replay."""

    def __init__(self, objects: list[Any]) -> None:
        found = {id(o): o for o in objects if isinstance(o, torch.amp.GradScaler) and hasattr(o, _STATES)}
        #: Each scaler, its per-optimizer states dict and its scale tensor when the call began.
        self._before = [(s, getattr(s, _STATES), getattr(s, "_scale", None)) for s in found.values()]
        for scaler, states, _ in self._before:
            if states:  # ``unscale_`` or ``step`` ran before the step: the step's own would not
                error = DataDependentError(f"the gradient scaler {type(scaler).__name__} had unscaled or stepped an "
                                           "optimizer before the step began (its unscale_ or step was called outside "
                                           "the step), which a graph of a step that does both would repeat")
                error.this_call_only = True
                raise error

    def effects(self, graph: torch.fx.Graph, record: Any) -> None:
        """After the step: an effect node giving each scaler a new empty per-optimizer dict where its
        ``update()`` did; refuses a step that leaves them filled or made the scale."""
        for scaler, states, scale in self._before:
            now = getattr(scaler, _STATES)
            if scale is None and getattr(scaler, "_scale", None) is not None:
                error = DataDependentError(f"the gradient scaler {type(scaler).__name__} made its scale in this "
                                           "call (its first scale()), which a replay would make again")
                error.this_call_only = True
                raise error
            if now or type(now) is not defaultdict:
                raise DataDependentError(f"the step leaves the gradient scaler {type(scaler).__name__} part way "
                                         "through an iteration (step() or unscale_() without update()), which a "
                                         "replayed graph would not repeat")
            if now is not states:
                effect_node(graph, f"renew {type(scaler).__name__}.{_STATES}",
                            functools.partial(_renew, scaler, now.default_factory), [], record)

    def held(self) -> tuple[HeldValue, ...]:
        """Each scaler's per-optimizer states must be empty when a replay begins, as at the capture."""
        return tuple(HeldValue(f"len({type(s).__name__}.{_STATES})", Place.WITHIN, None, None, Hold.VALUE, 0,
                               functools.partial(_states_length, s)) for s, _, _ in self._before)


def _renew(scaler: torch.amp.GradScaler, factory: Callable[[], Any] | None, values: tuple) -> None:
    """Give ``scaler`` a new empty per-optimizer dict, as its ``update()`` does (an effect node's ``apply``)."""
    setattr(scaler, _STATES, defaultdict(factory))
