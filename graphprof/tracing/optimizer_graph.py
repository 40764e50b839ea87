"""An optimizer's step as a whole-step graph of its own, inside a step profiled as segments.

A segmented step (capture/segmented.py) compiles the model's forwards; the
optimizer's update is no forward, so it is captured by a traced function of
its own, marked as part of the step's call. When that capture is refused,
the update runs eagerly (timed as one host node) from then on. This wrapper
holds that choice and hands the segmented step the last replay's stamps.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

import torch
import torch.fx

from graphprof.capture.caller_warnings import warn_caller
from graphprof.capture.errors import CaptureError
from graphprof.runtime.runner import Runner
from graphprof.runtime.whole_step_runner import WholeStepRunner

log = logging.getLogger("graphprof")


class TracedStep(Protocol):
    """What the wrapper needs of the optimizer's traced step (a ``TracedFunction``)."""

    __name__: str
    captures: int
    profiling: bool
    _calls: int

    @property
    def runner(self) -> Runner | None: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class OptimizerGraph:
    """An optimizer's step under segmented capture: its whole-step graph, or eager when it cannot be one.

    Only the last sample is read (the segmented step keeps the stamps), so the
    traced step keeps at most one.
    """

    def __init__(self, traced: TracedStep, step: Callable[..., Any], warn: bool = True) -> None:
        self.traced = traced
        self.step = step
        self.eager = False
        self.warn = warn

    @property
    def captures(self) -> int:
        return self.traced.captures

    @property
    def profiling(self) -> bool:
        return self.traced.profiling

    @profiling.setter
    def profiling(self, value: bool) -> None:
        self.traced.profiling = value

    def last_sample(self) -> tuple[tuple[int, ...], torch.fx.GraphModule] | None:
        """The stamps of the last call and their graph, when that call was a profiled replay."""
        runner = self.traced.runner
        if self.eager or not isinstance(runner, WholeStepRunner) or not runner.samples.steps:
            return None
        last = runner.samples.steps[-1]
        if last.index != self.traced._calls - 1:
            return None
        return last.stamps_ns, runner.graph_module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager:
            return self.step(*args, **kwargs)
        try:
            return self.traced(*args, **kwargs)
        except CaptureError as exc:
            # Warned only where the step did not warn already (segments the user asked for): after the
            # step's own fallback warning, a second one for the same reason (LBFGS's closure refuses
            # both) broke the one-warning promise, so it is logged.
            self.eager = True
            message = f"graphprof: {exc}; running {self.traced.__name__} eagerly (timed as one host node)"
            if self.warn:
                warn_caller(message)
            else:
                log.info(message)
            return self.step(*args, **kwargs)
