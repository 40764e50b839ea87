"""Paths of a step that cannot be one static graph, told apart from those that can by their guards.

A step that logs every few calls (``if self.n % 10 == 0: print(f"loss
{loss.item():.4f}")``) has a path no static graph can replay (the text is
known only once the replay has run) and a path one can. The refusal of the
first sent every later call to segments, the nine calls in ten with a
whole-step graph included: faithful, and as slow as segments.

A refused capture knows the guards it took before it refused (the branch into
the logging code among them). When another path of the same signature was
captured already, the refusal is kept as a ``RefusedPath``: a later call whose
values meet all those guards would take that path again, and runs as
segments without trying to capture it; any other call selects or captures
its graph as before.

Why this changes no result: a call runs a whole-step graph only when that
graph's own checks hold, as before, and a call sent to segments runs the
user's code. At worst a call is sent to segments that a graph could have
replayed. Guards that recompute values from tensors are kept (a BERT step
branches on its attention mask before it logs): a check that cannot run them
treats them as broken, and the call is captured, and refused, as before.
Guards on a number's value or text (``int(n)``, ``f"{n}"``) are not kept:
they name the call rather than the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch.fx

from graphprof.capture.guard_check import GuardCheck, prefixes_of
from graphprof.capture.guards import distinct_guards
from graphprof.capture.scalars import Guard


@dataclass
class RefusedPath:
    """The guards a refused capture took before it refused, checked like a captured path's."""

    guards: tuple[Guard, ...]
    positions: dict[torch.fx.Node, int]
    _check: GuardCheck | None = field(default=None, init=False, repr=False)

    def taken_by(self, leaves: list[Any]) -> bool:
        """Whether a call with these flattened arguments meets every guard (would refuse again)."""
        if self._check is None:
            self._check = GuardCheck(self.guards, self.positions)
        return self._check.broken(leaves) is None


def refused_path(guards: Sequence[Guard], positions: dict[torch.fx.Node, int]) -> RefusedPath | None:
    """The path of a capture refused after taking ``guards``; None when a recomputed value cannot be
    checked with the others (``prefixes_of``)."""
    # A text or a number kept as a guard (``f"step {self.n}"``, ``range(self.n)`` on the way to the
    # refusal) names this call, not the path: left out, the path is met by every later call of it.
    # Leaving a guard out only sends more calls to segments.
    kept = distinct_guards([g for g in guards if not g.holds_value])
    if prefixes_of(kept) is None:
        return None
    return RefusedPath(kept, dict(positions))
