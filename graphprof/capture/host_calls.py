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
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils._python_dispatch import _disable_current_modes

from graphprof.capture.host_nodes import effect_node, filled, input_scalar, real_values, template_of


def _scheduler_classes() -> list[type]:
    found: list[type] = []
    todo: list[type] = [LRScheduler]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


class SchedulerCalls:
    """Patches schedulers' ``step`` and ``get_last_lr`` for the length of one capture."""

    def __init__(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                 record: Callable[[], Any], source: Callable[[], str]) -> None:
        self.graph = graph
        self.node_of = node_of
        self.record = record
        self.source = source
        self.depth = 0
        #: Called before and after each scheduler step of the capture call (capture/optimizer_groups.py).
        self.before_step: Callable[[], None] = lambda: None
        self.on_step: Callable[[], None] = lambda: None

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
            if calls.depth:  # a scheduler inside SequentialLR / ChainedScheduler: the outer call replays it
                return original(sched, *args, **kwargs)
            what = f"{type(sched).__name__}.step"
            template, slots = template_of((args, kwargs), calls.node_of, what, lambda _: "")
            calls.before_step()
            calls.depth += 1
            try:
                with _disable_current_modes(), torch._C.DisableTorchFunction():
                    real_args, real_kwargs = real_values((args, kwargs))
                    result = original(sched, *real_args, **real_kwargs)
            finally:
                calls.depth -= 1

            def replay(values: tuple) -> None:
                call_args, call_kwargs = filled(template, values)
                original(sched, *call_args, **call_kwargs)

            effect_node(calls.graph, what, replay, slots, calls.record())
            calls.on_step()  # after the scheduler's node: what is read from now on is read after it
            return result

        return step

    def _get_last_lr(self, original: Callable[..., Any]) -> Callable[..., Any]:
        calls = self

        @functools.wraps(original)
        def get_last_lr(sched: Any) -> Any:
            values = original(sched)
            if calls.depth or not isinstance(values, list):
                return values
            name = type(sched).__name__
            return [input_scalar(calls.graph, v, (lambda i=i: sched._last_lr[i]), f"{name}.last_lr[{i}]",  # type: ignore[misc]
                                 calls.record(), calls.source()) if isinstance(v, float) else v
                    for i, v in enumerate(values)]

        return get_last_lr
