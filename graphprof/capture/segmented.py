"""Segmented capture: the user's step runs as Python, its modules as torch.compile graphs.

Design (measured, see benchmarks/results.md and the README): compiling the
whole step with dynamo changed results. Dynamo traced the optimizer through
its compile-time code path (a tensor step count, other bias-correction
arithmetic), so Adam's updates differed from eager in the last bits and the
difference grew (4.6e-4 after 6 steps); it evaluated ``random.Random``
draws at trace time and replayed the traced RNG state; and it guarded on
Python state the step mutates (``len(logs)`` of a list the step appends a
logged ``.item()`` to), so such a step recompiled on every call. So here
the step's own Python runs eagerly, exactly as written, and dynamo sees only:

* the ``forward`` of each module the step reaches by name (closure, globals,
  ``self``), compiled with an AOTAutograd backend whose forward, backward and
  inference graphs graphprof annotates, instruments and runs as generated
  code. Graph breaks inside a forward (``.item()``, NumPy) split it into
  segments as before. AOTAutograd's graphs match eager bitwise on CPU for the
  models we test (BERT and GPT-2 with dropout and gradient checkpointing);
* nothing of the optimizer: each optimizer's ``step`` is routed through a
  whole-step capture of its own (``optimizer_step`` factory, given by the
  policy), i.e. the make_fx graph of eager dispatch, replayed with its
  hyperparameters read at run time: bitwise, and profiled op by op.

A function with no module in reach is compiled whole, as before (there is
nothing else to compile); its optimizer calls are still routed as above.

Between segments the host runs Python; that time is kept as host gaps, and
host reads of tensors there (``.item()``, ``.numpy()``, ``.cpu()``,
``.tolist()``) are timed individually by wrapping those few tensor methods
while steps are probed (``host_reads``: a ``sys.setprofile`` hook cost more
than all the probes). Dynamo's compile time (and an optimizer's
capture) is kept as ``CompileSpan`` events, so step times can leave it out.

This module keeps the compiling (dynamo's backend and callbacks, the
segments made, the recompiles reported); which forwards are compiled and
through what entry is capture/compiled_forwards.py's, the routed optimizer
steps are capture/routed_optimizers.py's, and the records a step leaves are
capture/segment_timeline.py's.
"""

from __future__ import annotations

import logging
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
from torch import nn
from torch._dynamo.backends.common import aot_autograd

from graphprof.capture import host_reads
from graphprof.capture.caller_warnings import warn_caller
from graphprof.capture.compiled_forwards import compile_targets, compiled_forward, expanding
from graphprof.capture.double_backward import double_backward_site
from graphprof.capture.identity_dropout import drop_skipped_dropouts, use_eager_dropouts
from graphprof.capture.gradient_hooks import GradientHooks, hooks_note
from graphprof.capture.gradient_layouts import eager_gradient_layouts, reshape_views
from graphprof.capture.gradient_uses import split_gradient_uses
from graphprof.capture.installed_forwards import InstalledForwards
from graphprof.capture.step_warnings import quiet
from graphprof.capture.host_reads import HostReadTimer
from graphprof.capture.routed_optimizers import RoutedOptimizers
from graphprof.capture.segment_nodes import caller_source, first_source, write_capture_records
from graphprof.capture.segment_timeline import CompileSpan, Segment, StepTimeline
from graphprof.capture.state import discover_state
from graphprof.passes.annotate import is_op_node
from graphprof.passes.instrument import Clock, instrument
from graphprof.runtime.codegen import compile_graph
from graphprof.profile.model import GraphKind

log = logging.getLogger("graphprof")


@dataclass
class _Compiling:
    """The compile in progress, between dynamo's start and end callbacks."""

    start_ns: int
    failures_before: dict[Any, int]  # per key of dynamo's guard_failures, how many it held
    graphs: list[str] = field(default_factory=list)


def _failure_counts() -> dict[Any, int]:
    """How many guard failures dynamo has recorded so far, per code."""
    from torch._dynamo.utils import guard_failures
    return {code: len(reasons) for code, reasons in list(guard_failures.items())}


def _random_variables() -> Any:
    """dynamo's class for ``random.Random`` objects, when it has the check this module patches."""
    misc = getattr(getattr(torch._dynamo, "variables", None), "misc", None)
    variable = getattr(misc, "RandomVariable", None)
    return variable if variable is not None and "is_supported_random_obj" in vars(variable) else None


def _never(value: Any) -> bool:
    return False


def keep_distribution_checks() -> None:
    """Let dynamo make its once-per-process changes to torch now, then give ``torch.distributions``
    back the argument checks it had.

    Why: dynamo's first compile turns those checks off for the whole process
    (``Distribution.set_default_validate_args(False)``, so that constructors
    trace without a branch). A step that fell back to segments then made the
    user's distributions stop checking, there and everywhere else: eager
    raised ValueError on a NaN batch, the traced run trained on NaN. With the
    checks kept, dynamo breaks the graph at a check that raises, and the step
    raises as eager does.
    """
    from torch.distributions import Distribution

    patcher = getattr(torch._dynamo.eval_frame, "TorchPatcher", None)
    checks = Distribution._validate_args
    if patcher is not None:
        patcher.patch()  # cached: runs once per process, and never again
    Distribution.set_default_validate_args(checks)


class SegmentedCapture:
    """The user's function with its modules' forwards compiled and its optimizers routed."""

    def __init__(self, fn: Callable[..., Any], prepare: Callable[[torch.fx.GraphModule], None],
                 clock: Clock, optimizer_step: Callable[[torch.optim.Optimizer, nn.Module | None], Callable[..., Any]]
                 | None = None, name: str = "", warned: bool = False) -> None:
        self.segments: list[Segment] = []
        self.probing = False
        self.compiled_once = False
        self.timeline = StepTimeline()
        self.compiles: list[CompileSpan] = []  # every compile after the first call, in order
        self._name = name or getattr(fn, "__name__", type(fn).__name__)
        self._prepare = prepare
        self._clock = clock
        self._fn = fn
        self._kind_counts: dict[GraphKind, int] = {}
        self._compiling: _Compiling | None = None
        self._trace_numpy: bool | None = None  # the user's setting, while a compile runs without it
        #: Whether the step already warned, as a step that fell back to segments did: its recompiles are
        #: logged, so that the user has the one warning about the step.
        self._recompiles_warned = warned
        self._uncompiled_warned = False
        self._hooks_warned = warned  # a step that fell back to segments said so in its warning
        #: dynamo's RandomVariable and its own check, while a compile sees no ``random.Random``.
        self._random_objects: tuple[Any, Any] | None = None
        self._failures_seen: dict[Any, int] = {}  # guard failures dynamo had recorded, per code, when this call started
        self._reads = HostReadTimer(lambda read: self.timeline.events.append(read), clock)
        # Dynamo calls these from inside a compile, holding its callbacks' lock; it can do so while its
        # frame hook is active (a backward compiled lazily when a traced step nests another). A hook
        # that converted their frames would compile again and wait on that lock forever: disabled.
        self._start_callback = torch._dynamo.disable(self._on_compile_start)
        self._end_callback = torch._dynamo.disable(self._on_compile_end)
        weakref.finalize(self, host_reads.uninstall)
        keep_distribution_checks()
        state = discover_state(fn)
        roots = list(dict.fromkeys(target for r in state.roots for target in compile_targets(r)))
        self.modules: list[tuple[nn.Module, Callable[..., Any]]] = []
        twice = double_backward_site(fn)
        if twice is not None:  # AOTAutograd's graphs cannot be differentiated twice (capture/double_backward.py)
            names = [type(root).__name__ for root in roots]
            what = (f"the forward{'s' if len(names) > 1 else ''} of {' and '.join(names)}" if names
                    else "the step")
            self._warn_uncompiled(what, f"the step differentiates a gradient again, with create_graph at {twice}, "
                                  "and AOTAutograd supports no double backward", plural=len(names) > 1)
            self.compiled = fn
        else:
            for root in roots:
                self.modules.append((root, compiled_forward(root, self._backend(type(root).__name__))))
            self.compiled = fn if self.modules else torch.compile(fn, backend=self._backend(""), dynamic=False)
        primary = state.roots[0] if state.roots else None
        #: The optimizers, each with the routed step it runs while the step runs.
        self.routed = RoutedOptimizers(self, self._name, clock, self._reads)
        self.gradient_hooks = GradientHooks(module for module, _ in self.modules)
        self._forwards = InstalledForwards([(module, self.routed.own_frame(forward))
                                            for module, forward in self.modules])
        if optimizer_step is not None:
            self.routed.route(state.optimizers, optimizer_step, primary, self.compiled is fn)

    # -- compiling ------------------------------------------------------------------
    def _backend(self, root_type: str) -> Any:
        aot = aot_autograd(
            fw_compiler=self._compiler(GraphKind.FORWARD, root_type),
            bw_compiler=self._compiler(GraphKind.BACKWARD, root_type),
            inference_compiler=self._compiler(GraphKind.SEGMENT, root_type),
        )

        def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            drop_skipped_dropouts(gm)  # no copies eager does not make (capture/identity_dropout.py)
            use_eager_dropouts(gm)  # and eager's roundings in half precision on CPU
            made = len(self.segments)
            split = split_gradient_uses(gm, example_inputs)  # eager's order of gradient sums (capture/gradient_uses.py)
            try:
                # What torch warns while graphprof compiles is not the step's: eager never compiles. And each
                # backward takes its gradients in eager's layouts (capture/gradient_layouts.py).
                with quiet(), eager_gradient_layouts():
                    if split is None:
                        return aot(gm, example_inputs)
                    return expanding(aot(split[0], split[1]), split[2])
            except Exception as exc:
                del self.segments[made:]  # a forward compiled before its backward failed: never run
                self._not_compiled(root_type, exc)
                raise torch._dynamo.exc.SkipFrame(str(exc)) from exc

        return backend

    def _not_compiled(self, root_type: str, exc: Exception) -> None:
        """One warning that a frame runs eagerly, unprofiled: AOTAutograd could not compile it.

        Why eagerly, the whole frame: dynamo's own answer to a backend that fails
        is to raise into the step (MoCo's ``param_k.data = param_k.data * m +
        ...`` in a forward: "a set_ on a graph input ... other mutations"),
        after the step's earlier segments had run. A backend that raises
        ``SkipFrame`` makes dynamo run that frame, and its later calls, as
        plain Python: eager's results, without the frame's ops in the profile.
        """
        what = f"the forward of {root_type}" if root_type else "a part of the step"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        self._warn_uncompiled(what, f"{type(exc).__name__}: {first}")

    def _warn_uncompiled(self, what: str, why: str, plural: bool = False) -> None:
        """The step's one warning that ``what`` runs eagerly (later ones are logged)."""
        message = (f"graphprof: {self._name}: torch.compile could not compile {what} ({why}); "
                   f"{'they run' if plural else 'it runs'} eagerly, and {'their' if plural else 'its'} ops are "
                   "missing from the profile")
        if self._uncompiled_warned:
            log.info(message)
        else:
            self._uncompiled_warned = True
            warn_caller(message)

    def runs_eagerly(self) -> bool:
        """Whether this call runs the step eagerly, unprofiled, because its parameters' gradient hooks
        would run in another order (capture/gradient_hooks.py); said in the step's one warning."""
        hooked = self.gradient_hooks.hooked()
        if not hooked:
            return False
        message = f"graphprof: {self._name}: segments{hooks_note(hooked)}"
        if self._hooks_warned:
            log.info(message)
        else:
            self._hooks_warned = True
            warn_caller(message)
        return True

    def _compiler(self, kind: GraphKind, root_type: str) -> Callable[[torch.fx.GraphModule, Any], Any]:
        def compile_segment(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            write_capture_records(gm, kind, root_type, caller_source(sys._getframe(1)))
            self._prepare(gm)
            if kind is GraphKind.BACKWARD:
                reshape_views(gm)
            n = self._kind_counts[kind] = self._kind_counts.get(kind, 0) + 1
            source = first_source(gm)
            name = f"{kind.value} {n}" + (f" ({root_type})" if root_type else "") + (f" at {source}" if source else "")
            segment = Segment(len(self.segments), kind, name, gm, instrument(gm, self._clock))
            self.segments.append(segment)
            if self._compiling is not None:
                self._compiling.graphs.append(name)
            if self.compiled_once:
                log.info("graphprof: compiled %s (%d ops) after the first call", segment.name,
                         sum(1 for n in gm.graph.nodes if is_op_node(n)))
            return self._runner(segment)

        return compile_segment

    def _on_compile_start(self, args: Any) -> None:
        # Dynamo records why guards failed before it starts compiling: count from the call's start.
        self._compiling = _Compiling(self._clock(), self._failures_seen)
        self._reads.paused = True  # compile time is left out whole
        # Traced numpy draws from torch's generator: ``np.random.rand()`` in a module's forward
        # (wav2vec2's time masks) drew other numbers than eager, and moved torch's stream. Left
        # untraced, numpy runs as Python between the graphs, as eager runs it.
        self._trace_numpy = torch._dynamo.config.trace_numpy
        torch._dynamo.config.trace_numpy = False
        # And a ``random.Random`` of the user's (``self.rng.uniform(0.8, 1.2)`` in a forward): dynamo
        # made the compile's draw a constant of the graph, so every later call used it and the
        # generator stopped. Seen as a plain object, its C methods break the graph and run as Python.
        variable = _random_variables()
        if variable is not None and self._random_objects is None:
            self._random_objects = (variable, vars(variable)["is_supported_random_obj"])
            variable.is_supported_random_obj = staticmethod(_never)

    def _on_compile_end(self, args: Any) -> None:
        from torch._dynamo.utils import guard_failures
        if self._trace_numpy is not None:
            torch._dynamo.config.trace_numpy, self._trace_numpy = self._trace_numpy, None
        if self._random_objects is not None:
            variable, check = self._random_objects
            variable.is_supported_random_obj = check  # dynamo's own check again
            self._random_objects = None
        started, self._compiling = self._compiling, None
        self._reads.paused = False
        if started is None or not self.compiled_once:
            return  # the first call's compiles are expected: nothing to report
        # Per code: equal code objects share one key (every module's entry is a copy of one code), so a
        # new failure can land in the middle of the flattened lists; count from each key's own length.
        reasons = [r for k, v in list(guard_failures.items()) for r in v[started.failures_before.get(k, 0):]]
        self._failures_seen = _failure_counts()
        reason = reasons[-1].split("\n", 1)[0] if reasons else "a new code path (no guard failed)"
        what = ", ".join(started.graphs) or "no new graph"
        lazy = getattr(getattr(args, "callback_trigger", None), "name", "") == "LAZY_BACKWARD"
        span = CompileSpan(started.start_ns, self._clock(), what, "" if lazy else reason, lazy)
        self.timeline.events.append(span)  # left out of the step's time either way
        if started.graphs:  # dynamo looked at a frame and made no graph: nothing was recompiled
            self.compiles.append(span)
        if started.graphs and not lazy:  # a lazily compiled backward belongs to the forward's warning
            message = (f"graphprof: {self._name}: torch.compile compiled {what} after the first call because "
                       f"{reason}; its compile time is left out of step times")
            if self._recompiles_warned:  # a number dynamo specialised on recompiles every call: one warning
                log.info(message)
            else:
                self._recompiles_warned = True
                warn_caller(message + " (later compiles are logged, not warned)")

    def _runner(self, segment: Segment) -> Callable[[list], Any]:
        plain, probed = compile_graph(segment.graph_module), compile_graph(segment.instrumented)
        seg_id = segment.id

        def run(args: list) -> Any:
            if not self.probing:
                return plain(*args)
            out, stamps = probed(*args)
            self.timeline.events.append((seg_id, stamps))
            return out

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the step; with ``probing`` set, record its timeline."""
        self.timeline = StepTimeline()
        self._failures_seen = _failure_counts()
        handler = torch._dynamo.callback_handler
        handler.register_start_callback(self._start_callback)
        handler.register_end_callback(self._end_callback)
        self._forwards.install()
        saved = self.routed.install()
        try:
            if not self.probing:
                host_reads.uninstall()  # no step is timed now: torch.Tensor gets its own methods back
                return self.compiled(*args, **kwargs)
            with self._reads:
                return self.compiled(*args, **kwargs)
        finally:
            self.routed.uninstall(saved)
            self._forwards.uninstall()
            handler.remove_start_callback(self._start_callback)
            handler.remove_end_callback(self._end_callback)
            self.compiled_once = True

