"""Numbers a step reads from its learning-rate schedulers' own fields: inputs, read where it reads them.

``if sched.last_epoch % 100 == 0: log(...)``, or ``warm = sched.last_epoch <
warmup``: a scheduler counts its steps and keeps its settings in plain
fields. Schedulers are not watched state (capture/reachable.py: their steps
are replayed as host calls, capture/host_calls.py), so such a read in the
capture call was the capture call's number, baked into the graph: every
replay took that call's branch, silently.

``SchedulerFields`` does for the public number fields of the schedulers a
step reaches what ``HyperparameterInputs`` does for an optimizer's groups:
while the user's code runs they hold input scalars, whose reads are reader
nodes at the point the step reads them (unused ones are dropped from the
graph). A scheduler's own step runs on the real numbers (``unwrap`` before
it, ``wrap`` after it); a field read after a step of a scheduler of the same
optimizer carries ``READ_DURING_STEP``, so no guard is taken on it before the
replay has made that step. A number the step writes into a field itself
(``sched.last_epoch = 0``) is refused: a replay would not repeat it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from graphprof.capture.host_nodes import input_scalar, read_after
from graphprof.capture.scalars import DataDependentError, TracedScalar


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class SchedulerFields:
    """The public number fields of some schedulers, as input scalars while the user's code runs."""

    def __init__(self, graph: torch.fx.Graph, record: Callable[[], Any],
                 written: Callable[[Any, str], str | None]) -> None:
        self.graph = graph
        self.record = record
        #: The last scheduler step of the call that wrote the scheduler's optimizer (host_calls.py).
        self.written = written
        self._schedulers: list[Any] = []
        #: (scheduler, field, real value, the scalar put there) while the user's code runs.
        self._wrapped: list[tuple[Any, str, Any, TracedScalar]] = []
        self._readers: list[torch.fx.Node] = []

    def watch(self, objects: Iterable[Any]) -> None:
        """From now on, the user's code reads the fields of the schedulers among ``objects`` as inputs."""
        found = {id(o): o for o in objects if isinstance(o, (LRScheduler, ReduceLROnPlateau))}
        self._schedulers = list(found.values())
        self.wrap()

    def add(self, sched: Any) -> None:
        """Watch ``sched`` too from its first step on (capture/host_calls.py): the step reached it through
        an object that is not watched (a tuple, a library's object). A read before that step is not
        seen; the README says so."""
        if isinstance(sched, (LRScheduler, ReduceLROnPlateau)) and all(s is not sched for s in self._schedulers):
            self._schedulers.append(sched)

    def wrap(self) -> None:
        """Put input scalars, read at this point of the graph, where the schedulers hold numbers."""
        for sched in self._schedulers:
            name = type(sched).__name__
            after = self.written(getattr(sched, "optimizer", None), "lr")
            fields = vars(sched)
            for field, value in list(fields.items()):
                if field.startswith("_") or not _number(value):
                    continue
                what = f"{name}.{field}"
                scalar = input_scalar(self.graph, value, (lambda f=fields, k=field: f[k]), what,  # type: ignore[misc]
                                      self.record(), what, read_after(what, after))
                self._readers.append(scalar.node)
                fields[field] = scalar
                self._wrapped.append((sched, field, value, scalar))

    def unwrap(self) -> None:
        """Give the fields their real numbers back (before a scheduler step, and at the step's end);
        refuse a field the user's code wrote meanwhile."""
        wrapped, self._wrapped = self._wrapped, []
        written = None
        for sched, field, value, scalar in wrapped:
            now = vars(sched).get(field)
            vars(sched)[field] = value
            if now is not scalar and written is None:
                written = f"{type(sched).__name__}.{field}"
        if written is not None:
            raise DataDependentError(f"the step changes {written}, which a replayed graph would not repeat")

    def restore(self) -> None:
        """Put back every real number (a failed capture); nothing is refused any more."""
        for sched, field, value, _ in self._wrapped:
            vars(sched)[field] = value
        self._wrapped.clear()
        self._schedulers = []

    def unused_readers(self) -> list[torch.fx.Node]:
        """The readers ``wrap`` made that nothing in the graph uses."""
        return [node for node in self._readers if not node.users]
