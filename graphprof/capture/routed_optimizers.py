"""A segmented step's optimizers, their ``step`` routed to a whole-step graph of their own.

Dynamo traced the optimizer through its compile-time code path and changed
Adam's updates in the last bits (capture/segmented.py says how), so no
optimizer step of a segmented step is compiled: each is replaced, while the
step runs, by a routed step that replays the optimizer's own make_fx graph
(tracing/optimizer_graph.py) and puts its run on the step's timeline. This
module makes those routed steps, puts them in place where the step will call
them (on the optimizer, or inside a wrapper of the user's), and gives the
user's own values back afterwards; the capture keeps the compiling.
"""

from __future__ import annotations

import logging
import types
from typing import Any, Callable, Protocol

import torch
from torch import nn

from graphprof.capture.host_reads import HostReadTimer
from graphprof.capture.segment_timeline import CompileSpan, OptimizerRun, StepTimeline
from graphprof.capture.step_wrappers import route_wrapped_step, users_wrapper
from graphprof.passes.instrument import Clock

log = logging.getLogger("graphprof")
_MISSING = object()


class RoutedStep(Protocol):
    """What the routing needs of the segmented step it routes for (``SegmentedCapture``), read at each call."""

    probing: bool
    compiled_once: bool
    timeline: StepTimeline
    compiles: list[CompileSpan]


class RoutedOptimizers:
    """The optimizers of one segmented step and the routed step each runs while the step runs."""

    def __init__(self, step: RoutedStep, name: str, clock: Clock, reads: HostReadTimer) -> None:
        self._step = step
        self._name = name
        self._clock = clock
        self._reads = reads
        self.optimizers: list[tuple[torch.optim.Optimizer, Callable[..., Any]]] = []
        #: Per optimizer, the step it has while the step is not running (its class's, or one set on it,
        #: a scheduler's wrapper): what torch.compile'd code of the user's traces (``_user_compiles_see``).
        self._user_steps: list[Callable[..., Any]] = []
        self._own_frames = [False]  # whether a forward graphprof compiled is running (``own_frame``)
        self._class_steps: list[Callable[..., Any]] = []
        #: Per optimizer, a wrapper of the user's run eagerly, and its dynamo-disabled self (``_eager_wrapper``).
        self._eager_wrappers: dict[int, tuple[Any, Callable[..., Any]]] = {}

    def route(self, optimizers: list[torch.optim.Optimizer],
              optimizer_step: Callable[[torch.optim.Optimizer, nn.Module | None], Callable[..., Any]],
              primary: nn.Module | None, compiles_whole_step: bool) -> None:
        """Make each optimizer's routed step; where graphprof compiles the step itself (no module),
        ``opt.step`` must stay routed for dynamo too."""
        for slot, opt in enumerate(optimizers):
            routed = torch._dynamo.disable(self._optimizer_runner(slot, opt, optimizer_step(opt, primary)),
                                           recursive=True)
            self._class_steps.append(types.MethodType(type(opt).step, opt))
            self._user_steps.append(self._class_steps[-1])
            # Where graphprof compiles the step itself (no module), its ``opt.step`` must stay routed.
            self.optimizers.append((opt, self._user_compiles_see(slot, routed) if compiles_whole_step else routed))

    def _optimizer_runner(self, slot: int, opt: torch.optim.Optimizer, traced: Any) -> Callable[..., Any]:
        """``opt.step`` as the step sees it: the optimizer's whole-step graph, its run put on the timeline.

        The graph is of the class's step (its hooks included), not of the step
        it replaces. Where that is an LR scheduler's wrapper, whose one effect
        is ``opt._opt_called = True`` before the class's step, the flag is set
        here as the wrapper sets it: without it, a program whose first
        ``opt.step()`` ran routed got the scheduler's warning "Detected call of
        ``lr_scheduler.step()`` before ``optimizer.step()``", which eager never gave.
        """
        user_steps = self._user_steps

        def step(*args: Any, **kwargs: Any) -> Any:
            if hasattr(user_steps[slot], "_wrapped_by_lr_sched"):
                opt._opt_called = True  # type: ignore[attr-defined]
            self._reads.paused = True  # a capture's reads are compile time; a replay makes none
            traced.profiling = self._step.probing  # plain graph when the step is not recorded
            captures, start = traced.captures, self._clock()
            try:
                return traced(*args, **kwargs)
            finally:
                end = self._clock()
                self._reads.paused = False
                if self._step.probing:
                    self._step.timeline.events.append(self._optimizer_event(slot, traced, captures, start, end))

        return step

    def _user_compiles_see(self, slot: int, routed: Callable[..., Any]) -> Callable[..., Any]:
        """``opt.step`` as installed: the routed step, and to torch.compile tracing the user's own
        compiled code the optimizer's step as it is without graphprof.

        Why: a step that calls a function the user compiled (``opt_step =
        torch.compile(opt_step)``, PyTorch's "compiling the optimizer" recipe)
        runs the optimizer as inductor code in eager. Seen through the routed
        step, which dynamo cannot trace, that function recompiled with a graph
        break at ``opt.step()`` and ran graphprof's graph of eager's Adam:
        parameters 3.7e-8 away from eager's from the first segmented call.
        Dynamo reads ``is_compiling()`` as True and traces the user's step,
        as it did without graphprof; run as Python, it is False. Made once per
        optimizer, so that the user's compiled code keeps the one extra entry
        its guards on ``opt.step`` compile.
        """
        user_steps, own = self._user_steps, self._own_frames

        def step(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling() and not own[0]:
                return user_steps[slot](*args, **kwargs)
            return routed(*args, **kwargs)

        return step

    def own_frame(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """``forward`` (a module's compiled forward), telling ``_user_compiles_see`` while it runs that
        what dynamo traces is graphprof's: an ``opt.step()`` in a forward (a module that is the whole
        training step) stays routed, as dynamo traced Adam otherwise (capture/segmented.py's docstring).
        Dynamo reads the flag as a constant of the frame it traces, and guards on it."""
        own = self._own_frames

        def run(*args: Any, **kwargs: Any) -> Any:
            was, own[0] = own[0], True
            try:
                return forward(*args, **kwargs)
            finally:
                own[0] = was

        return run

    def _optimizer_event(self, slot: int, traced: Any, captures: int, start: int, end: int) -> Any:
        if traced.captures != captures:
            reason = "its settings changed" if captures else "it is captured once, as a whole-step graph"
            span = CompileSpan(start, end, f"optimizer {slot + 1}", reason)
            if self._step.compiled_once:
                self._step.compiles.append(span)
            return span
        last = traced.last_sample()
        if last is not None:
            stamps, graph_module = last
            return OptimizerRun(slot, start, end, stamps, graph_module)
        return OptimizerRun(slot, start, end)

    def install(self) -> list[tuple[Any, str | None, Any, Any]]:
        """Put the routed steps in place: (owner, attribute, the user's value,
        graphprof's), the owner a ``Location`` and no attribute where a wrapper's step was routed."""
        saved: list[tuple[Any, str | None, Any, Any]] = []
        for slot, (opt, replacement) in enumerate(self.optimizers):
            own = opt.__dict__.get("step", _MISSING)
            self._user_steps[slot] = self._class_steps[slot] if own is _MISSING else own
            if own is not _MISSING and users_wrapper(own):  # the user's wrapper runs; the step it calls is routed
                swapped = route_wrapped_step(own, opt, replacement)
                if swapped is not None:
                    saved += [(place, None, step, replacement) for place, step in swapped]
                else:
                    saved.append((opt, "step", own, self._eager_wrapper(slot, own)))
                    opt.__dict__["step"] = saved[-1][3]
                continue
            saved.append((opt, "step", own, replacement))
            if hasattr(own, "_wrapped_by_lr_sched"):  # an LR scheduler's first step checks for its wrapper,
                replacement._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # warning if it is gone
            opt.__dict__["step"] = replacement
        return saved

    def _eager_wrapper(self, slot: int, wrapper: Any) -> Callable[..., Any]:
        """A wrapper of the user's whose step no cell holds (capture/step_wrappers.py), run as Python,
        never traced by dynamo: dynamo traced Adam's update differently from eager (capture/segmented.py's
        docstring). Made once per wrapper, so that code dynamo traces keeps the entry it guards."""
        kept = self._eager_wrappers.get(slot)
        if kept is None or kept[0] is not wrapper:
            log.info("graphprof: %s: the step set on optimizer %d calls its optimizer's step in a way graphprof "
                     "cannot route; it runs eagerly, and its ops are missing from the profile", self._name, slot + 1)
            kept = self._eager_wrappers[slot] = (wrapper, torch._dynamo.disable(wrapper, recursive=True))
        return kept[1]  # type: ignore[no-any-return]

    @staticmethod
    def uninstall(saved: list) -> None:
        """Give the user's values back where graphprof's are still in place. Why only there: a step
        that sets ``opt.step`` itself (a wrapper installed at some call) keeps it, as in eager."""
        for obj, attr, old, installed in reversed(saved):
            if attr is None:  # where a wrapper keeps its step (``route_wrapped_step``)
                if obj.get() is installed:
                    obj.set(old)
            elif obj.__dict__.get(attr, _MISSING) is not installed:
                continue
            elif old is _MISSING:
                obj.__dict__.pop(attr, None)
            else:
                obj.__dict__[attr] = old
