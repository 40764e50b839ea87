"""Learning-rate schedulers stepped inside a captured step, replayed as host calls.

``sched.step()`` is Python: it counts (``last_epoch``), computes the next
learning rates and writes them into the optimizer's ``param_groups``. A
replayed graph would skip it, so during the capture call every scheduler
class's ``step`` (``LRScheduler`` and each subclass that defines its own,
``ReduceLROnPlateau``, ``SequentialLR`` and user schedulers included) runs
for real, unseen by the tracer, and leaves a host node at its position in
the graph that calls it again on every replay: timed and shown like any other
node. Its arguments (a metric for ``ReduceLROnPlateau``) are graph values.
``get_last_lr()`` returns input scalars, so a logged learning rate is read
when the replay reaches it, as eager reads it.
The tensors that step writes in place (a tensor ``lr`` torch fills in)
pass none of the capture's modes: ``HostWrites`` copies them to the write
log first, so that a capture refused after it puts them back.
A warning it issues (``StepLR.step(epoch)``'s deprecation) is blamed where
eager blames it, by the capture call and by every replay
(capture/step_warnings.py ``call_blamed``), not on this module's lines.

A rate read after a scheduler step of the same call is known only once the
replay has made that step, so no guard may be taken on it (the checks run
before the replay): ``written`` says which step may have changed a group's
value, and such reads carry ``READ_DURING_STEP``. Torch's own schedulers
write their optimizer's ``lr`` (and ``momentum`` or ``betas`` where they
cycle it); any other scheduler class is taken to write every value of its
optimizer's groups, or of every optimizer's when it names none.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils._python_dispatch import _disable_current_modes

from graphprof.capture.host_nodes import effect_node, filled, input_scalar, read_after, real_values, template_of
from graphprof.capture.scalar_operands import contains_traced_scalar
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.snapshot import HostWrites, WriteLog
from graphprof.capture.step_warnings import StepWarning, call_blamed, step_frames

#: Where torch's own schedulers are defined: what their steps write is known (``_writes``).
_TORCH_SCHEDULERS = LRScheduler.__module__


def _scheduler_classes() -> list[type]:
    found: list[type] = []
    todo: list[type] = [LRScheduler]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _with_inner(sched: Any) -> list[Any]:
    """``sched`` and the schedulers it drives (``SequentialLR``, ``ChainedScheduler``), nested ones too: its
    step may move theirs without their ``step`` (``SequentialLR`` calls ``_update_lr`` at a milestone)."""
    found = [sched]
    for inner in getattr(sched, "_schedulers", None) or ():
        found += _with_inner(inner)
    return found


@dataclass(frozen=True, slots=True)
class SchedulerWrite:
    """What one scheduler step of the capture call may have written."""

    what: str  # ``StepLR.step``
    optimizer: int | None  # id of the optimizer whose groups it writes; None: any optimizer's
    keys: frozenset[str] | None  # the group keys it writes; None: any


def _writes(sched: Any, what: str) -> SchedulerWrite:
    """What a step of ``sched`` may write (see the module's docstring)."""
    optimizer = getattr(sched, "optimizer", None)
    owner = id(optimizer) if isinstance(optimizer, torch.optim.Optimizer) else None
    keys: set[str] | None = set()
    for part in [sched, *(getattr(sched, "_schedulers", None) or ())]:  # SequentialLR, ChainedScheduler
        if keys is None or type(part).__module__ != _TORCH_SCHEDULERS:
            keys = None
            continue
        keys.add("lr")
        if getattr(part, "cycle_momentum", False):  # CyclicLR, OneCycleLR
            keys.update(("momentum", "betas"))
    return SchedulerWrite(what, owner, None if keys is None else frozenset(keys))


def _computed_from_traced(sched: Any) -> bool:
    """Whether a scheduler's step left a traced number in its fields or its optimizer's groups: its
    own code (a ``LambdaLR``'s lambda reading ``self.warmup``) read a value the step had changed.

    The numbers the step only reads are real while a scheduler steps (``before_step``); a value the
    step computed is not, and its replay would run before the step's end writes it back."""
    groups = getattr(getattr(sched, "optimizer", None), "param_groups", None) or []
    return contains_traced_scalar([*vars(sched).values(),
                                   *({k: v for k, v in g.items() if k != "params"} for g in groups)])


class SchedulerCalls:
    """Patches schedulers' ``step`` and ``get_last_lr`` for the length of one capture."""

    def __init__(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                 record: Callable[[], Any], source: Callable[[], str], write_log: WriteLog | None = None) -> None:
        self.graph = graph
        #: Where the tensors a scheduler's step writes are copied first (capture/snapshot.py): a refused
        #: capture puts them back with the rest (None: nothing is put back).
        self.write_log = write_log
        self.node_of = node_of
        self.record = record
        self.source = source
        self.depth = 0
        #: Called before and after each scheduler step of the capture call (capture/optimizer_groups.py).
        self.before_step: Callable[[Any], None] = lambda sched: None
        self.on_step: Callable[[], None] = lambda: None
        #: Given each warning a scheduler step of the capture call issues, blamed where eager blames it
        #: (capture/step_warnings.py ``call_blamed``); its replays issue theirs themselves.
        self.on_warning: Callable[[StepWarning], None] = StepWarning.issue
        #: The scheduler steps of the capture call so far, in order.
        self.steps: list[SchedulerWrite] = []
        #: ids of the schedulers a patched ``step`` stepped (inner ones of a ``SequentialLR`` too).
        self.stepped: set[int] = set()

    def written(self, optimizer: Any, key: str) -> str | None:
        """The last scheduler step of this call that may have written ``key`` in ``optimizer``'s
        groups (any optimizer's when None); None when none did: a read of it now is the value the
        call started with, which a check before the replay reads too."""
        for write in reversed(self.steps):
            if (optimizer is None or write.optimizer in (None, id(optimizer))) and (write.keys is None or key in write.keys):
                return write.what
        return None

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        originals: list[tuple[type, str, Any]] = []
        for cls in _scheduler_classes():
            for name, wrap in (("step", self._step), ("get_last_lr", self._get_last_lr)):
                if name in cls.__dict__:
                    original = cls.__dict__[name]
                    originals.append((cls, name, original))
                    setattr(cls, name, wrap(original))
        try:
            yield
        finally:
            for cls, name, original in originals:
                setattr(cls, name, original)

    def _step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        calls = self

        @functools.wraps(original)
        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            calls.stepped.update(map(id, _with_inner(sched)))
            if calls.depth:  # a scheduler inside SequentialLR / ChainedScheduler: the outer call replays it
                return original(sched, *args, **kwargs)
            what = f"{type(sched).__name__}.step"
            template, slots = template_of((args, kwargs), calls.node_of, what, lambda _: "")
            outer = step_frames(sys._getframe(1))  # the step's frames above the call, at their lines now
            calls.before_step(sched)
            calls.depth += 1
            try:
                with _disable_current_modes(), torch._C.DisableTorchFunction(), calls._writes_logged():
                    real_args, real_kwargs = real_values((args, kwargs))
                    if outer is None:  # not called by the step's code: warnings blamed as they fall
                        result = original(sched, *real_args, **real_kwargs)
                    else:
                        result = call_blamed(outer, calls.on_warning, original, sched, *real_args, **real_kwargs)
            finally:
                calls.depth -= 1
            if _computed_from_traced(sched):
                raise DataDependentError(
                    f"{what} at {calls.source()} computes with a number the step changed before it, which its "
                    "replay would read before the replayed step writes it back (at its end)")

            def replay(values: tuple) -> None:
                call_args, call_kwargs = filled(template, values)
                if outer is None:
                    original(sched, *call_args, **call_kwargs)
                else:
                    call_blamed(outer, StepWarning.issue, original, sched, *call_args, **call_kwargs)

            effect_node(calls.graph, what, replay, slots, calls.record())
            calls.steps.append(_writes(sched, what))
            calls.on_step()  # after the scheduler's node: what is read from now on is read after it
            return result

        return step

    def _writes_logged(self) -> contextlib.AbstractContextManager[Any]:
        """The tensors written under it are copied to the write log first (a tensor ``lr`` filled in)."""
        return HostWrites(self.write_log) if self.write_log is not None else contextlib.nullcontext()

    def _get_last_lr(self, original: Callable[..., Any]) -> Callable[..., Any]:
        calls = self

        @functools.wraps(original)
        def get_last_lr(sched: Any) -> Any:
            values = original(sched)
            if calls.depth or not isinstance(values, list):
                return values
            name = type(sched).__name__
            after = calls.written(getattr(sched, "optimizer", None), "lr")
            return [input_scalar(calls.graph, v, (lambda i=i: sched._last_lr[i]), f"{name}.last_lr[{i}]",  # type: ignore[misc]
                                 calls.record(), calls.source(), read_after(f"{name}.last_lr[{i}]", after))
                    if isinstance(v, float) else v for i, v in enumerate(values)]

        return get_last_lr
