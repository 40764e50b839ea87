"""What graphprof records while a function runs under ``make_fx``.

make_fx gives the aten ops; it does not say which module, source line, phase
or ``record_function`` scope each op came from, and backward ops have no
module at all. The recorder sits above make_fx's proxy mode for the length of
the capture and writes a ``CaptureRecord`` on every op node it creates:

* module: a global forward pre/post hook keeps the module stack;
* phase: backward while the autograd engine runs a node (or inside
  ``Tensor.backward``), optimizer inside ``Optimizer.step`` (global hooks);
* backward attribution: autograd sequence numbers tie a backward op to the
  forward op it differentiates, whose module and source it inherits;
* scope: ``record_function`` enter/exit ops are consumed here, not recorded;
* ``.item()`` returns a TracedScalar (see ``scalars.py``);
* activation checkpointing's recomputation: ops of the module that runs
  them, phase backward, scope ``checkpoint recompute`` (``checkpointing.py``);
  RNG state reads and writes are replayed (``rng_calls.py``);
* custom autograd Functions: their backward belongs to the application
  (``custom_functions.py``);
* a host read of a tensor value computed from inputs only (``bool(t)``) is
  kept as a value guard (``value_guards.py``); other host reads refuse,
  even where the step's code catches the refusal (``refusals``).
"""

from __future__ import annotations

import contextlib
import operator
import types
from typing import Any, Iterator, Sequence

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch import nn
from torch.fx.experimental.proxy_tensor import get_proxy_slot
from torch.utils._python_dispatch import _disable_current_modes

from graphprof.capture.checkpointing import RECOMPUTE_SCOPE, CheckpointRecompute
from graphprof.capture.custom_functions import FunctionApplies
from graphprof.capture.cumulative_averages import CumulativeAverages, unused_by_backward
from graphprof.capture.data_assignments import DataAssignments
from graphprof.capture.data_sizes import DataSizedTensors
from graphprof.capture.dropped_grads import DroppedGrads, GradDrop
from graphprof.capture.host_calls import SchedulerCalls
from graphprof.capture.host_read_ops import LOCAL_SCALAR_DENSE
from graphprof.capture.distribution_checks import DistributionChecks
from graphprof.capture.host_sources import HostSources
from graphprof.capture.fast_paths import fused_fast_paths
from graphprof.capture.caught_exceptions import CatchingFrames
from graphprof.capture.grad_reads import GradReads
from graphprof.capture.math_calls import traced_math
from graphprof.capture.linked_numbers import CallScalars, link_scalars
from graphprof.capture.parsed_numbers import ParsedNumbers
from graphprof.capture.sources import is_library, user_source
from graphprof.capture.hyperparameter_inputs import HyperparameterInputs
from graphprof.capture.handed_tensors import HandedTensors, tensors_before
from graphprof.capture.kept_history import BackwardNodes
from graphprof.capture.recorder_modes import HostReadMode, OpRecordingMode
from graphprof.capture.rng_calls import RngStateCalls
from graphprof.capture.saved_numbers import SavedNumbers
from graphprof.capture.scheduler_fields import SchedulerFields
from graphprof.capture.snapshot import WriteLog, written_small_tensors
from graphprof.capture.step_warnings import own_global_hooks
from graphprof.capture.scalars import (
    GUARD_SINKS, LINKED_SINKS, PENDING_SINKS, DataDependentError, Guard, TracedScalar,
)
from graphprof.capture.state import StateIndex, add_parameter, state_tensors
from graphprof.capture.value_guards import ValueGuards
from graphprof.passes.records import CAPTURE, SCALAR, CaptureRecord
from graphprof.profile.model import Phase

aten = torch.ops.aten


class CaptureRecorder:
    """Capture-time context; entered inside the function make_fx traces."""

    def __init__(self, tracer: Any, state: StateIndex, arguments: tuple[torch.Tensor, ...] = (),
                 catching: CatchingFrames | None = None, data_targets: frozenset[int] | None = None) -> None:
        self.tracer = tracer
        self.graph: torch.fx.Graph = tracer.graph
        self.state = state
        self.module_stack: list[nn.Module] = []
        self.scopes: list[str] = []
        self.optimizer_depth = 0
        #: ids of the optimizers whose ``step`` ran in the capture call.
        self.stepped_optimizers: set[int] = set()
        self.backward_depth = 0
        #: Backward passes the step ran (``loss.backward()``, ``torch.autograd.grad``).
        self.backwards = 0
        #: What the tensors it hands out or finds carry besides their values (capture/handed_tensors.py).
        self.handed_tensors = HandedTensors(self.graph, self.tensor_node, self._made_here, lambda: self.context(()),
                                            tensors_before(state, arguments))
        #: The autograd nodes its backward passes ran and freed (capture/kept_history.py).
        self.backward_nodes = BackwardNodes(self._made_here, self.handed_tensors.note)
        self.forward_by_seq: dict[int, CaptureRecord] = {}
        self.pending_scalars: list[list[TracedScalar]] = []
        self.params_seen: dict[int, nn.Parameter] = {}
        self.optimizer_module = ""
        self._last_seq = torch.autograd._get_sequence_nr()
        # The argument tensors too: a capture that fails after ``x.mul_(0.5)`` puts ``x`` back, or the
        # eager run after it halves it again.
        self.write_log = WriteLog(lambda: [*state_tensors(state), *arguments])
        for p in state.params.values():
            self.write_log.note_grad(p)
        #: The gradients the call began with and not yet seen dropped, and where the step dropped them
        #: (``zero_grad()``). A replay drops them where eager did; a failed one needs to know whether eager had.
        self._dropped_grads = DroppedGrads(list(state.params.values()))
        entry = self._dropped_grads.entry_grads[0]
        self.grad_reads = GradReads({id(p): p.grad for p in entry})  # the user's reads of them
        #: The first op that raised while the step ran (it returned all the same: it caught the error).
        self.raised: str | None = None
        #: Code the step calls that catches exceptions around an op (None: not looked for).
        self.catching = catching
        #: The refusals of host reads of tensors made while the step runs, first first: code that catches
        #: one (a helper's ``try``; numpy, which falls back from ``__index__`` to another conversion) goes
        #: on with a value the graph would bake in, so the capture refuses all the same.
        self.refusals: list[DataDependentError] = []
        #: Outcomes of branches on input scalars, checked before every replay.
        self.guards: list[Guard] = []
        #: Input numbers autograd saved for a backward not yet run (capture/saved_numbers.py).
        self.saved_numbers = SavedNumbers(self.guards)
        #: Batch norm's ``1.0 / float(num_batches_tracked)`` (capture/cumulative_averages.py).
        self.cumulative_averages = CumulativeAverages(self.traced_item)
        #: Tensors torch's argument parser reads as numbers (capture/parsed_numbers.py).
        self.parsed_numbers = ParsedNumbers(self.traced_item, self._last_node)
        self.data_sized = DataSizedTensors()
        self.value_guards = ValueGuards(self.graph, tracer.root, self.tensor_node, state, self.guards)
        self.schedulers = SchedulerCalls(self.graph, self.tensor_node, lambda: self.context(()),
                                         lambda: user_source(3), self.write_log)
        self.hyperparameters = HyperparameterInputs(self.graph, lambda: self.context(()), self.schedulers.written)
        self.scheduler_fields = SchedulerFields(self.graph, lambda: self.context(()), self.schedulers.written)
        self.host_sources = HostSources(self.graph, lambda: self.context(()), lambda: user_source(3), is_library,
                                        self.tensor_node)
        self.schedulers.on_warning = self.host_sources.host_call_warned
        self.rng_calls = RngStateCalls(self.graph, self.tensor_node, lambda: self.context(()), self.write_log)
        self.distribution_checks = DistributionChecks(self.graph, self.tensor_node, lambda: self.context(()),
                                                      lambda: user_source(3))
        self.recompute_depth = 0
        self.recompute = CheckpointRecompute(self._enter_recompute, self._exit_recompute)
        self.function_records: list[CaptureRecord] = []  # custom Functions being applied
        self.functions = FunctionApplies(self._enter_function, self.function_records.pop, self._link_function)
        #: ``p.data = ...`` made in the step, replayed where it made them (None: not recorded).
        self.data_assignments = None if data_targets is None else DataAssignments(
            self.graph, self.tensor_node, lambda: self.context(()), state, data_targets)

    @property
    def grads_dropped(self) -> list[GradDrop]:
        """Where the step dropped the gradients the call began with, one ``GradDrop`` per place, in order."""
        return self._dropped_grads.drops

    # -- context of the op being dispatched -------------------------------------
    def context(self, args: tuple) -> CaptureRecord:
        scope = "/".join(self.scopes)
        grad_node = torch._C._current_autograd_node()
        if self.recompute_depth and self.module_stack:  # a checkpointed block's forward, run again
            top = self.module_stack[-1]
            return CaptureRecord(self.state.module_name(top), type(top).__name__, user_source(3), Phase.BACKWARD,
                                 scope)
        if grad_node is not None or self.backward_depth:
            if grad_node is not None:
                self.backward_nodes.ran(grad_node)
            return self._backward_context(grad_node, scope)
        source = user_source(3)
        if self.optimizer_depth:
            # Attribute an update to the module whose parameter it touches; ops on
            # temporaries inherit the last one (single-tensor loops go param by param).
            for a in args:
                if isinstance(a, torch.Tensor) and (module := self.state.module_of(a)):
                    self.optimizer_module = module
                    break
            module = self.optimizer_module
            return CaptureRecord(module, self._module_type(module), source, Phase.OPTIMIZER, scope)
        if self.module_stack:
            top = self.module_stack[-1]
            return CaptureRecord(self.state.module_name(top), type(top).__name__, source, Phase.FORWARD, scope)
        if self.function_records:  # inside a custom Function's forward: grad mode is off there
            applied = self.function_records[-1]
            return CaptureRecord(applied.module, applied.module_type, source, applied.phase, scope)
        grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        return CaptureRecord("", "", source, Phase.FORWARD if grad else Phase.OTHER, scope)

    def _module_type(self, path: str) -> str:
        module = self.state.module_at(path)
        return type(module).__name__ if module is not None else ""

    def _backward_context(self, grad_node: Any, scope: str) -> CaptureRecord:
        if grad_node is not None:
            variable = getattr(grad_node, "variable", None)
            if isinstance(variable, torch.Tensor):  # AccumulateGrad of a parameter
                record = self.state.describe(variable)
                module = record.module if record else ""
                return CaptureRecord(module, self._module_type(module), user_source(4), Phase.BACKWARD, scope)
            forward = self.forward_by_seq.get(grad_node._sequence_nr())
            if forward is not None:
                return CaptureRecord(forward.module, forward.module_type, forward.source, Phase.BACKWARD, scope)
        return CaptureRecord("", "", user_source(4), Phase.BACKWARD, scope)

    # -- node bookkeeping ----------------------------------------------------------
    def _last_node(self) -> torch.fx.Node | None:
        """The graph's newest node; None while it is empty (a step with no tensor inputs)."""
        return next(iter(reversed(self.graph.nodes)), None)

    def _new_nodes(self, before: torch.fx.Node | None) -> list[torch.fx.Node]:
        new = []
        for node in reversed(self.graph.nodes):
            if node is before:
                break
            new.append(node)
        new.reverse()
        return new

    def is_preexisting(self, tensor: torch.Tensor) -> bool:
        """True for tensors from before the capture (make_fx tracks only new ones)."""
        return get_proxy_slot(tensor, self.tracer, None) is None

    def _made_here(self, tensor: torch.Tensor) -> bool:
        """Whether the call's ops made ``tensor``: neither from before the capture nor an argument."""
        slot = get_proxy_slot(tensor, self.tracer, None)
        return slot is not None and slot.proxy.node.op != "placeholder"

    def tensor_node(self, tensor: torch.Tensor) -> Any:
        slot = get_proxy_slot(tensor, self.tracer, None)
        if slot is not None:
            return slot.proxy.node
        return self.tracer.create_arg(tensor)

    def record_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        dropped = self._dropped_grads
        if dropped.entry_grads[0]:
            dropped.note(self.context)
        if self.catching is not None:
            self.catching.note()
        for a in args:
            if isinstance(a, nn.Parameter) and id(a) not in self.params_seen:
                self.params_seen[id(a)] = a
                self.write_log.note_grad(a)
                add_parameter(self.state, a)
        self.write_log.before_write(func, args, kwargs, self.is_preexisting)
        record = self.context(args)
        before = self._last_node()
        small = written_small_tensors(func, args, kwargs, self.is_preexisting)
        originals = []
        if small:
            with _disable_current_modes(), torch.no_grad():
                originals = [t.detach().clone() for t in small]
        if func is LOCAL_SCALAR_DENSE and isinstance(args[0], torch.Tensor):
            # A tensor torch itself reads as a number, made from constants alone
            # (``x.view(n, torch.div(s, w, rounding_mode="trunc"))`` in Longformer: a size computed as a
            # tensor from two ints): the same number on every call. Any other such read refuses below.
            # A tensor the step passed where the op takes a number is read at replay (capture/parsed_numbers.py);
            # one from before the step first, which no check holds constant (a scale the step decays in place).
            kept = self.is_preexisting(args[0])
            number = self.parsed_numbers.read(args[0]) if kept else None
            if number is None:
                number = self.value_guards.constant_number(args[0])
            if number is None and not kept:
                number = self.parsed_numbers.read(args[0])
            if number is not None:
                return number
        try:
            out = func(*args, **kwargs)
            self.data_sized.note_op(func, args, kwargs, out)
            if small:  # make_fx may have run it twice on them (constant propagation): run it once, for real
                with _disable_current_modes(), torch.no_grad():
                    for t, original in zip(small, originals):
                        t.copy_(original)
                    func(*args, **kwargs)
        except Exception as exc:
            if isinstance(exc, RuntimeError) and "get value out of a tracing tensor" in str(exc):
                raise DataDependentError(
                    f"the step reads a tensor's value on the host ({func}) at {record.source}, "
                    "which a static graph cannot replay"
                ) from None
            self.raised = self.raised or f"{func} at {record.source} ({type(exc).__name__})"
            raise
        if dropped.dropped_now is not None:
            dropped.place(self._new_nodes(before))
        # The innermost call's scalars first: a literal is linked to the number its own call was given.
        scalars = [s for group in reversed(self.pending_scalars) for s in group]
        used: set[int] = set()
        new = self._new_nodes(before)
        for node in new:
            if node.op != "call_function":
                continue
            node.meta[CAPTURE] = record
            if scalars:
                innermost = self.pending_scalars[-1] if self.pending_scalars else None
                link_scalars(node, scalars, used, innermost if isinstance(innermost, CallScalars) else None)
        for linked in LINKED_SINKS:
            linked |= used
        if self.saved_numbers:
            grad_node = torch._C._current_autograd_node()
            self.saved_numbers.op_ran(None if grad_node is None else grad_node._sequence_nr(), new)
        # Autograd numbers each node it creates; the counter moved only if this
        # op created one, and then the newest number is this op's backward node.
        seq = torch.autograd._get_sequence_nr()
        differentiable = seq != self._last_seq
        if differentiable:
            self._last_seq = seq
            if record.phase is Phase.FORWARD or self.recompute_depth:  # a reentrant checkpoint differentiates
                self.forward_by_seq[seq - 1] = record                    # its recomputation
        for s in scalars:
            # The graph holds the value (an unlinked literal, or one autograd saved for a backward
            # that computes with it in C++): replay only while it is the same.
            if s.is_input and (id(s) not in used or differentiable):
                if id(s) in used and self.saved_numbers.defer(func, new, s, seq - 1, record.source,
                                                              self._called_with(s)):
                    continue  # linked in the backward that uses it, where it does as it is
                self.guards.append(Guard(operator.eq, (s.node, s.value), True, record.source))
            elif differentiable and id(s) in used and not unused_by_backward(new, s):  # a new number every call
                raise DataDependentError(
                    f"a value read from a tensor with .item() at {record.source} reaches {func}, whose backward "
                    "keeps it as a number, which a static graph would replay with the capture call's value; keep "
                    "it a tensor (.detach() instead of .item())")
        return out

    def _called_with(self, scalar: TracedScalar) -> Any:
        """The torch function the step's call gave ``scalar`` to (None: not known)."""
        for call in reversed(self.pending_scalars):
            if isinstance(call, CallScalars) and any(s is scalar for s in call):
                return call.func
        return None

    def traced_item(self, tensor: torch.Tensor) -> TracedScalar:
        with _disable_current_modes():
            value = tensor.item()
        node = self.graph.call_function(aten._local_scalar_dense.default, (self.tensor_node(tensor),))
        record = self.context((tensor,))
        node.meta[CAPTURE] = record
        node.meta[SCALAR] = True
        # Computed from the inputs alone: an input scalar (branches on it become guards).
        is_input, counted = self.value_guards.mark_item(node, tensor)
        return TracedScalar(value, node, self.graph, record.source, is_input=is_input, counted=counted)

    # -- hooks -------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self, functions: Sequence[types.FunctionType] = ()) -> Iterator["CaptureRecorder"]:
        """Inside: the recorder's hooks and patches are on (``functions``: the user's functions the step can
        run, whose names of ``math``'s functions are wrapped too)."""
        handles = [
            nn.modules.module.register_module_forward_pre_hook(lambda m, a: self.module_stack.append(m)),
            nn.modules.module.register_module_forward_hook(lambda m, a, o: self._pop_module(m), always_call=True),
            register_optimizer_step_pre_hook(lambda o, a, k: self._enter_optimizer(o)),
            register_optimizer_step_post_hook(lambda o, a, k: self._exit_optimizer()),
        ]
        GUARD_SINKS.append(self.guards)
        PENDING_SINKS.append(self.pending_scalars)
        try:
            with own_global_hooks(*handles[:2]), self.schedulers.patched(), self.host_sources.patched(functions), \
                    self.rng_calls.patched(), self.recompute.patched(), self.functions.patched(), fused_fast_paths(), traced_math(functions), \
                    self.grad_reads.patched(), self.distribution_checks.patched(), \
                    HostReadMode(self), OpRecordingMode(self):
                try:
                    yield self
                except Exception as exc:
                    if self.refusals and not isinstance(exc, DataDependentError):
                        raise self.refusals[0] from exc  # what the step did after catching it: not the reason
                    raise
                if self.refusals:  # the step caught it and went on with a value a graph would bake in
                    raise self.refusals[0]
                self.saved_numbers.settle()
                self.cumulative_averages.settle()
                self.handed_tensors.settle()
        finally:
            PENDING_SINKS.pop()
            GUARD_SINKS.pop()
            for h in handles:
                h.remove()

    def _enter_function(self, args: tuple) -> CaptureRecord:
        record = self.context(args)
        self.function_records.append(record)
        return record

    def _link_function(self, seq: int, record: CaptureRecord) -> None:
        if record.phase is Phase.FORWARD or self.recompute_depth:
            self.forward_by_seq[seq] = record

    def _enter_recompute(self) -> None:
        self.recompute_depth += 1
        self.scopes.append(RECOMPUTE_SCOPE)

    def _exit_recompute(self) -> None:
        self.recompute_depth -= 1
        self.scopes.pop()

    def _pop_module(self, module: nn.Module) -> None:
        if self.module_stack and self.module_stack[-1] is module:
            self.module_stack.pop()

    def _enter_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer_depth += 1
        self.stepped_optimizers.add(id(optimizer))
        if self.optimizer_depth == 1:
            self.hyperparameters.enter(optimizer)  # read as eager reads them: when the step starts

    def _exit_optimizer(self) -> None:
        if self.optimizer_depth == 1:
            self.hyperparameters.exit()
        self.optimizer_depth -= 1
        self.optimizer_module = ""

