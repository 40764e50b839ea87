"""Hyperparameters the step writes into an optimizer's ``param_groups`` itself.

A hand-written warm-up (``for g in opt.param_groups: g["lr"] = base *
min(1, self.it / warm)``) or decay (``g["lr"] *= 0.99``) changes the
optimizer's groups from the step's own Python. An LR scheduler does the
same through its ``step``, which is replayed as a host call
(capture/host_calls.py); these writes are nobody's call.

Optimizers are not watched state (capture/reachable.py), so the capture
call's write was never repeated: a replay left ``lr`` as it was, and a
value computed from the step's counters stayed in the group as graphprof's
traced number. ``GroupWrites`` notes the groups' values before the step and
after each scheduler step, and afterwards looks at what changed:

* a value computed from the step's inputs (a traced number, or a tuple of
  them) becomes an effect at the graph's end that writes the value the
  replay computed, and the group gets the capture call's real number;
* so does a constant written over a number the group held (``g["lr"] =
  0.2 if it % 3 == 0 else 0.05``, Lookahead's ``group["counter"] = 0``,
  ``g["betas"] = (0.5, 0.999)``): the path that writes it is a graph of
  its own, chosen by its guards, and writes it on every replay, as eager
  does. The group held graphprof's input scalar there
  (capture/hyperparameter_inputs.py), so a write of the value it already
  held is seen too;
* any other change (a new key, a flag or a string changed: a write of the
  value it held could not be told from no write) refuses the capture,
  naming the group.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import torch

from graphprof.capture.host_nodes import effect_node, filled, real_values, refusal, template_of
from graphprof.capture.hyperparameter_inputs import is_hyperparameter_number
from graphprof.capture.scalar_operands import contains_traced_scalar


class GroupWrites:
    """The optimizers' group values, as the step found them or a scheduler last left them."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], source: Callable[[str], str],
                 ours: Callable[[dict, str, Any], bool] = lambda group, key, value: False) -> None:
        self.source = source
        #: Whether a value is graphprof's own input scalar for the user's reads (``HyperparameterInputs``).
        self.ours = ours
        distinct = {id(o): o for o in optimizers}.values()  # one optimizer may be reached twice
        # and one group too: a wrapper shares the groups of the optimizer it wraps (timm's Lookahead),
        # whose write seen once was an effect and seen again a change of plain numbers.
        self._groups: list[tuple[str, dict]] = []
        seen: set[int] = set()
        for o in distinct:
            for i, group in enumerate(o.param_groups):
                if id(group) not in seen:
                    seen.add(id(group))
                    self._groups.append((f"{type(o).__name__}.param_groups[{i}]", group))
        self._expected: dict[tuple[int, Any], Any] = {}
        self.settle()

    def before_scheduler(self) -> None:
        """Refuse a write of the step's own that a scheduler is about to read (capture/host_calls.py
        runs the scheduler with real numbers, and the replay of its call would read the group)."""
        changed = next(self._changes(), None)
        if changed is not None:
            raise refusal(changed[0], "changes", self.source)

    def settle(self) -> None:
        """Take the values as they are now: before the step, or after a scheduler wrote its own."""
        self._expected = {(id(group), key): value for _, group in self._groups
                          for key, value in group.items() if key != "params"}

    def effects(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any], record: Any) -> None:
        """Turn the step's own writes into effects, or refuse the capture (see the module's docstring)."""
        for what, group, key, now in self._changes():
            if not contains_traced_scalar(now) and not (
                    is_hyperparameter_number(now) and contains_traced_scalar(self._expected.get((id(group), key)))):
                raise refusal(what, "changes", self.source)
            template, slots = template_of(now, node_of, what, self.source)
            group[key] = real_values(now)
            effect_node(graph, f"set {what}", lambda vals, g=group, k=key, t=template:  # type: ignore[misc]  # binds by default arguments
                        g.__setitem__(k, filled(t, vals)), slots, record)

    def _changes(self) -> Iterator[tuple[str, dict, Any, Any]]:
        """(what, group, key, value) of each value changed since ``settle``."""
        for label, group in self._groups:
            for key, now in list(group.items()):
                if key == "params":
                    continue
                was = self._expected.get((id(group), key), _MISSING)
                if now is was or self.ours(group, key, now):
                    continue
                if type(now) is type(was) and not contains_traced_scalar((now, was)) and _equal(now, was):
                    continue  # the same plain value; one holding graphprof's scalars is told by identity
                yield f"{label}[{key!r}]", group, key, now


_MISSING = object()


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a tensor hyperparameter: compared as the same object only
        return False
