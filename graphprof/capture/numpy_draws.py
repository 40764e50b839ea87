"""Draws from numpy random generators the step keeps: refused, as draws from ``random`` are.

Why: ``mask = torch.from_numpy(rng.random(x.shape) > 0.5)`` with ``rng`` a
``np.random.default_rng(0)`` or ``np.random.RandomState(0)`` the step keeps
(a global, a closure cell, an attribute of ``self`` or of one of its
modules) made the capture call's mask a constant of the graph: every replay
used it, and ``rng`` never advanced again, silently. numpy's generators are
C types whose methods cannot be patched (``host_sources`` patches the
``random`` module and numpy's legacy global functions instead), so the
generators the step can reach are found before the capture call and their
states compared after it: one that moved refuses the capture, naming it.
Its state is put back when any capture is undone, so that the step run
another way draws what eager draws.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterable
from typing import Any

from torch import nn

from graphprof.capture.scalars import DataDependentError


def _generator_types() -> tuple[type, ...]:
    numpy = sys.modules.get("numpy")
    if numpy is None:  # the step cannot hold one
        return ()
    return numpy.random.Generator, numpy.random.RandomState


def _state(generator: Any) -> bytes:
    """The generator's whole state (its bit generator's), as comparable bytes."""
    bits = getattr(generator, "bit_generator", None) or generator._bit_generator
    return pickle.dumps(bits.state)


def _set_state(generator: Any, state: bytes) -> None:
    bits = getattr(generator, "bit_generator", None) or generator._bit_generator
    bits.state = pickle.loads(state)


class NumpyDraws:
    """The numpy generators a step can reach, and their states before the capture call."""

    def __init__(self, objects: Iterable[tuple[str, Any]], modules: Iterable[nn.Module]) -> None:
        kinds = _generator_types()
        found: dict[int, tuple[str, Any]] = {}
        if kinds:
            places = list(objects)
            for module in modules:  # ``self.rng`` in a model's forward
                places += [(f"{type(module).__name__}.{k}", v) for k, v in vars(module).items()]
            for name, value in places:
                candidates = [(name, value)]
                if not isinstance(value, (nn.Module, type)) and type(getattr(value, "__dict__", None)) is dict:
                    candidates += [(f"{name}.{k}", v) for k, v in vars(value).items()]
                for where, obj in candidates:
                    if isinstance(obj, kinds):
                        found.setdefault(id(obj), (where, obj))
        self._before = [(where, obj, _state(obj)) for where, obj in found.values()]

    def refuse_drawn(self) -> None:
        """Refuse the capture when the step drew from one of the generators (its state moved)."""
        for where, obj, state in self._before:
            if _state(obj) != state:
                raise DataDependentError(f"the step draws from the numpy random generator {where}, which a "
                                         "replayed graph would not draw from again")

    def restore(self) -> None:
        """Put every generator's state back (the capture is undone)."""
        for _, obj, state in self._before:
            _set_state(obj, state)
