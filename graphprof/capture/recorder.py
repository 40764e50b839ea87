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
from dataclasses import dataclass
import sys
import operator
import types
from typing import Any, Iterator, Sequence

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch import nn
from torch.fx.experimental.proxy_tensor import get_proxy_slot
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from graphprof.capture.checkpointing import RECOMPUTE_SCOPE, CheckpointRecompute
from graphprof.capture.custom_functions import FunctionApplies
from graphprof.capture.copied_values import COPYING_METHODS, copied_values
from graphprof.capture.cumulative_averages import CumulativeAverages, unused_by_backward
from graphprof.capture.data_assignments import DataAssignments, is_data_setter
from graphprof.capture.data_sizes import DataSizedTensors
from graphprof.capture.host_calls import SchedulerCalls
from graphprof.capture.host_reads import original
from graphprof.capture.distribution_checks import DistributionChecks
from graphprof.capture.host_sources import HostSources
from graphprof.capture.fast_paths import fused_fast_paths
from graphprof.capture.caught_exceptions import CatchingFrames
from graphprof.capture.grad_reads import GradReads
from graphprof.capture.math_calls import traced_math
from graphprof.capture.linked_numbers import CallScalars, link_scalars
from graphprof.capture.parsed_numbers import ParsedNumbers, scalar_tensors
from graphprof.capture.printed_texts import PRINTED_TEXTS, printed_here
from graphprof.capture.sources import is_library, user_source
from graphprof.capture.hyperparameter_inputs import HyperparameterInputs
from graphprof.capture.handed_tensors import HandedTensors, tensors_before
from graphprof.capture.kept_history import BackwardNodes
from graphprof.capture.rng_calls import RngStateCalls
from graphprof.capture.saved_numbers import SavedNumbers, passed_through
from graphprof.capture.scheduler_fields import SchedulerFields
from graphprof.capture.snapshot import WriteLog, written_small_tensors
from graphprof.capture.step_warnings import own_global_hooks
from graphprof.capture.scalars import (
    GUARD_SINKS, LINKED_SINKS, PENDING_SINKS, DataDependentError, Guard, TracedScalar, call_with_scalars,
    contains_traced_scalar,
)
from graphprof.capture.state import StateIndex, add_parameter, state_tensors
from graphprof.capture.value_guards import VALUE_READS, ValueGuards
from graphprof.passes.records import CAPTURE, SCALAR, CaptureRecord
from graphprof.profile.model import Phase

aten = torch.ops.aten
#: The op torch runs where it reads a tensor as a number (``.item()``, a size given as a tensor).
_LOCAL_SCALAR_DENSE = aten._local_scalar_dense.default
_RF_ENTER = {torch.ops.profiler._record_function_enter_new.default}
_RF_EXIT = {torch.ops.profiler._record_function_exit._RecordFunction}
# Host reads of tensor values that a static graph cannot replay.
_ITEM = original(torch.Tensor.item)
_REFUSED = {
    original(torch.Tensor.tolist): "tolist()",
    original(torch.Tensor.numpy): "numpy()",
    original(torch.Tensor.__bool__): "branching on a tensor",
    original(torch.Tensor.__float__): "float() of a tensor",
    original(torch.Tensor.__int__): "int() of a tensor",
    original(torch.Tensor.__index__): "using a tensor as an index",
    **COPYING_METHODS,
    torch.Tensor.__repr__: "printing a tensor",
    torch.Tensor.__format__: "formatting a tensor",
}
_FORMAT = torch.Tensor.__format__
_FLOAT = original(torch.Tensor.__float__)
_BACKWARD_ENTRIES = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}

_ONE_HOT = torch._C._nn.one_hot


def _one_hot_by_scatter_applies(args: tuple, kwargs: dict) -> bool:
    """``F.one_hot(y, n)`` of a CPU index tensor with ``n`` given: see ``_one_hot_by_scatter``."""
    tensor = args[0] if args else kwargs.get("tensor")
    classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    return (isinstance(tensor, torch.Tensor) and tensor.dtype == torch.int64 and tensor.device.type == "cpu"
            and type(classes) is int and classes >= 0 and len(args) + len(kwargs) == 2)


def _one_hot_by_scatter(tensor: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``F.one_hot(tensor, num_classes)``, as ops a graph can replay: the same tensor (values, dtype,
    strides) and, for a class out of range, the same error.

    Why: torch's ``one_hot`` checks its classes with two ``.item()`` reads on
    the host, so a step using it (a DQN's actions, a custom label smoothing)
    refused capture. The checks become ``_assert_async`` ops with torch's
    own messages (on the CPU they raise at once, as the reads did).
    """
    torch._assert_async((tensor >= 0).all(), "Class values must be non-negative.")
    torch._assert_async((tensor < num_classes).all(), "Class values must be smaller than num_classes.")
    return torch.zeros((*tensor.shape, num_classes), dtype=torch.int64).scatter_(-1, tensor.unsqueeze(-1), 1)


def _formats_as_number(tensor: Any) -> bool:
    """A tensor ``format`` writes as its number (``Tensor.__format__``: a plain tensor of one value)."""
    return type(tensor) is torch.Tensor and tensor.dim() == 0 and not tensor.is_meta


_GRAD = operator.attrgetter("grad")


@dataclass(frozen=True)
class GradDrop:
    """Gradients the call began with that the step dropped at one place (``CaptureRecorder.grads_dropped``)."""

    #: The first node of the op after the drop (op nodes are never removed by the passes after capture).
    before: str
    #: ``id`` of each parameter whose gradient was gone there.
    params: frozenset[int]
    #: The context of the op after the drop (the node that drops them gets it).
    record: CaptureRecord


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
        #: (``zero_grad()``), one ``GradDrop`` per place, in order. A replay drops them where eager did;
        #: a failed one needs to know whether eager had.
        entry = [p for p in state.params.values() if p.grad is not None]
        self._entry_grads = (entry, [p.grad for p in entry])
        self.grad_reads = GradReads({id(p): p.grad for p in entry})  # the user's reads of them
        self.grads_dropped: list[GradDrop] = []
        self._dropped_now: tuple[frozenset[int], CaptureRecord] | None = None  # seen, its op not yet recorded
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
        self.rng_calls = RngStateCalls(self.graph, self.tensor_node, lambda: self.context(()))
        self.distribution_checks = DistributionChecks(self.graph, self.tensor_node, lambda: self.context(()),
                                                      lambda: user_source(3))
        self.recompute_depth = 0
        self.recompute = CheckpointRecompute(self._enter_recompute, self._exit_recompute)
        self.function_records: list[CaptureRecord] = []  # custom Functions being applied
        self.functions = FunctionApplies(self._enter_function, self.function_records.pop, self._link_function)
        #: ``p.data = ...`` made in the step, replayed where it made them (None: not recorded).
        self.data_assignments = None if data_targets is None else DataAssignments(
            self.graph, self.tensor_node, lambda: self.context(()), state, data_targets)

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

    def _note_dropped_grads(self) -> None:
        """Before an op: whether a gradient not yet seen dropped is gone (C-level maps, one per op)."""
        params, grads = self._entry_grads
        if all(map(operator.is_, map(_GRAD, params), grads)):
            return
        kept = [(p, g) for p, g in zip(params, grads) if p.grad is g]
        gone = frozenset(id(p) for p, g in zip(params, grads) if p.grad is not g)
        if self._dropped_now is not None:  # the op before made no node: the same place
            gone |= self._dropped_now[0]
        self._dropped_now = (gone, self.context(()))
        self._entry_grads = ([p for p, _ in kept], [g for _, g in kept])

    def _place_dropped_grads(self, before: torch.fx.Node | None) -> None:
        """After an op: the gradients seen dropped before it were dropped before its first node."""
        first = next((n for n in self._new_nodes(before) if n.op == "call_function"), None)
        if first is not None and self._dropped_now is not None:
            gone, record = self._dropped_now
            self.grads_dropped.append(GradDrop(first.name, gone, record))
            self._dropped_now = None

    def record_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self._entry_grads[0]:
            self._note_dropped_grads()
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
        if func is _LOCAL_SCALAR_DENSE and isinstance(args[0], torch.Tensor):
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
        if self._dropped_now is not None:
            self._place_dropped_grads(before)
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
            with own_global_hooks(*handles[:2]), self.schedulers.patched(), self.host_sources.patched(), \
                    self.rng_calls.patched(), self.recompute.patched(), self.functions.patched(), fused_fast_paths(), traced_math(functions), \
                    self.grad_reads.patched(), self.distribution_checks.patched(), \
                    _ScalarMode(self), _OpMode(self):
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


class _OpMode(TorchDispatchMode):
    """Tags every op node make_fx creates; consumes record_function ops."""

    def __init__(self, recorder: CaptureRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _RF_ENTER:
            self.recorder.scopes.append(str(args[0]))
            with _disable_current_modes():
                return func(*args, **kwargs)
        if func in _RF_EXIT:
            if self.recorder.scopes:
                self.recorder.scopes.pop()
            with _disable_current_modes():
                return func(*args, **kwargs)
        trace = sys.gettrace()
        if trace is None or getattr(func, "namespace", None) not in _BUILTIN_NAMESPACES:
            return self.recorder.record_op(func, args, kwargs)
        # Recording a built-in op is torch's and graphprof's Python only: no user code runs in it, so
        # the trace of the user's name loads (capture/name_reads.py) is paused, not paid per call.
        sys.settrace(None)
        try:
            return self.recorder.record_op(func, args, kwargs)
        finally:
            sys.settrace(trace)


#: Namespaces of ops torch implements itself (a user's Python custom op is traced like user code).
_BUILTIN_NAMESPACES = frozenset({"aten", "prims", "c10d", "_c10d_functional"})


class _ScalarMode(TorchFunctionMode):
    """Python-level view: ``.item()``, backward entry points, refused host reads."""

    def __init__(self, recorder: CaptureRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        func = original(func)  # a segmented step's host-read timer may have wrapped the method
        if func is _ITEM:
            return self.recorder.traced_item(args[0])
        if is_data_setter(func) and self.recorder.data_assignments is not None:
            return self.recorder.data_assignments.assign(func, *args)
        if func in VALUE_READS:
            factor_count = self.recorder.cumulative_averages.read(args[0], sys._getframe(1)) if func is _FLOAT else None
            if factor_count is not None:  # batch norm's ``1.0 / float(num_batches_tracked)``
                return factor_count
            try:
                return self.recorder.value_guards.read(func, args[0], user_source(2))
            except DataDependentError as exc:
                self.recorder.refusals.append(exc)
                raise
        if func is _ONE_HOT and _one_hot_by_scatter_applies(args, kwargs):
            return _one_hot_by_scatter(*args, **kwargs)
        if func is _FORMAT and _formats_as_number(args[0]) and PRINTED_TEXTS and printed_here():
            # ``print(f"loss {loss:.4f}")``: torch formats a 0-dim tensor as its ``.item()``
            return format(self.recorder.traced_item(args[0]), *args[1:])
        refused = _REFUSED.get(func) or copied_values(func, args, kwargs)
        if refused is not None:
            error = DataDependentError(f"{refused} at {user_source(2)} reads a tensor's value on the host, "
                                       "which a static graph cannot replay")
            self.recorder.refusals.append(error)
            raise error
        if func in _BACKWARD_ENTRIES:
            self.recorder.backwards += 1
            self.recorder.backward_depth += 1
            self.recorder.backward_nodes.enter(func, args, kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                self.recorder.backward_nodes.exit()
                self.recorder.backward_depth -= 1
        if self.recorder.data_sized.read_by_step(func, args):
            return self.recorder.value_guards.read_sizes(func, args, kwargs, user_source(2))
        if self.recorder.cumulative_averages.pending:  # its forward's ``F.batch_norm`` takes the traced factor
            kwargs = self.recorder.cumulative_averages.momentum(func, kwargs, sys._getframe(1))
        if contains_traced_scalar(args) or contains_traced_scalar(kwargs):
            if passed_through(func):  # its body gives them to the one op that takes them
                return func(*args, **kwargs)
            return call_with_scalars(func, args, kwargs)
        tensors = scalar_tensors(args, kwargs)
        if tensors:  # torch's argument parser may read one as a number
            return self.recorder.parsed_numbers.call(func, args, kwargs, tensors)
        return func(*args, **kwargs)
