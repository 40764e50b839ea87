"""Whole-step capture: one ``make_fx`` trace of forward, backward and optimizer.

The trace runs for real (``tracing_mode="real"``): the capture call *is* a
training step, and its result is returned to the user. Nothing is
functionalised or decomposed beyond what eager dispatch does, so the graph
holds the aten ops eager runs, in-place updates included. Parameters, buffers
and optimizer state enter the graph as ``get_attr`` constants that are the
user's own tensor objects, so replaying the graph updates them in place.

Two things eager does outside aten ops are restored around replay: setting
``param.grad`` (the graph returns the new gradients, the runner assigns them)
and ``zero_grad(set_to_none=True)`` (gradients the graph no longer reads are
dropped before it runs, so memory behaves as in eager).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes
from torch import nn
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from graphprof.capture.distributed import OPTIMIZER_ONLY
from graphprof.capture.data_sizes import guard_baked_sizes
from graphprof.capture.dtensor import check_new_gradients, is_dtensor, local_shard, same_gradient
from graphprof.capture.guard_check import GuardCheck
from graphprof.capture.held_values import HeldValue
from graphprof.capture.host_nodes import host_function
from graphprof.capture.graph_constants import (read_constants_at_run_time, read_grads_at_run_time, read_input_grads,
                                               refuse_contained_tensors)
from graphprof.capture.inputs import PythonState, assignment_source
from graphprof.capture.module_structure import ModuleStructure, hook_functions, optimizer_hook_functions
from graphprof.capture.recorder import CaptureRecorder, GradDrop
from graphprof.capture.sources import is_library
from graphprof.capture.refused_paths import refused_path
from graphprof.capture.scaler_state import ScalerStates
from graphprof.capture.step_warnings import StepWarning
from graphprof.capture.scalars import DataDependentError, Guard, TracedScalar, distinct_guards
from graphprof.capture.argument_writes import ArgumentWrites
from graphprof.capture.arguments import argument_objects, parameter_names
from graphprof.capture.batches import flatten_call, flatten_call_with_path, flatten_output
from graphprof.capture.caught_exceptions import CatchingFrames, refuse_caught_exceptions
from graphprof.capture.state import StateIndex, candidate_objects, discover_state
from graphprof.capture.state_names import name_state
from graphprof.capture.optimizer_groups import GroupWrites
from graphprof.capture.grad_mode import refuse_differentiable_outputs, refuse_opaque_outputs
from graphprof.capture.kept_history import with_history
from graphprof.capture.kept_results import KeptResult, kept_places, read_kept_results
from graphprof.capture.registered_hooks import RegisteredHooks
from graphprof.capture.module_contents import ModuleContents
from graphprof.capture.errors import StateNotRestored
from graphprof.capture.torch_settings import refuse_changed_settings, restore_settings, torch_settings
from graphprof.capture.growing_lists import traced_builtins
from graphprof.capture.name_reads import (NameReads, grown_lists, refuse_reading_extended_lists,
                                          put_back_unseen_globals, refuse_rebuilt_containers,
                                          refuse_unseen_global_writes, unnamed_attributes, unread_lists)
from graphprof.capture.optimizer_state import OptimizerStateEntries, refuse_replaced, snapshot
from graphprof.capture.foreign_calls import ForeignCalls
from graphprof.capture.escaped_scalars import DeepContents, refuse_escaped_scalars
from graphprof.capture.fake_values import one_fake_mode
from graphprof.capture.switched_flags import SwitchedFlags, module_modes, parameter_flags
from graphprof.capture.numpy_draws import NumpyDraws
from graphprof.capture.torch_objects import TorchObjects
from graphprof.capture.data_assignments import restore_data_assignments, storages_of
from graphprof.capture.unseen_writes import refuse_unknown_constants, tensors_in_argument_objects
from graphprof.passes.graph_modules import code_when_asked
from graphprof.passes.records import CAPTURE

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled

@dataclass
class CapturedStep:
    """A captured step: the graph plus what the runner needs around it."""

    graph_module: torch.fx.GraphModule
    in_spec: pytree.TreeSpec
    #: Leaves the graph takes as placeholders: tensors and int/float arguments.
    input_positions: tuple[int, ...]
    out_spec: pytree.TreeSpec
    grad_params: list[nn.Parameter]
    clear_grads: list[nn.Parameter]
    state: StateIndex
    result: Any = None
    #: Puts the user's state back as it was before the capture call (for
    #: failures after capture, before the graph is usable).
    undo: Callable[[], None] = lambda: None
    #: Branch outcomes on inputs this graph was captured with (capture/inputs.py).
    guards: tuple[Guard, ...] = ()
    #: Python values the graph was decided on, checked before each replay (capture/held_values.py).
    held: tuple[HeldValue, ...] = ()
    #: The modules' parameters, buffers, submodules and hooks it was traced through (none of an
    #: optimizer-only step, which runs no module), and its optimizers' step hooks.
    structure: ModuleStructure | None = None
    #: Whether the call was made inside ``torch.autocast``: the graph holds the casts it made, so a
    #: replay runs it with autocast off (the signature keeps the regions, capture/signature.py).
    autocast: bool = False
    #: Placeholder of each argument (number or tensor) -> its index in the call's leaves: guards
    #: read the call's own values through it (value guards recompute from tensor inputs).
    scalar_positions: dict[torch.fx.Node, int] = field(default_factory=dict)
    #: Per grad param, whether its ``.grad`` existed when the step was captured: a replay
    #: accumulates into the existing gradients or creates them, as this call did.
    grads_at_entry: tuple[bool, ...] = ()
    #: Per grad param, its ``requires_grad`` at capture: the graph computes exactly those gradients,
    #: so freezing or unfreezing a parameter between calls needs another graph.
    requires_grad_at_entry: tuple[bool, ...] = ()
    #: Each module's ``training`` flag when the capture call began, in ``state.module_objects()``
    #: order (None: read from the modules as the step left them, for a step made by hand in tests).
    modes_at_entry: tuple[Any, ...] | None = None
    #: False where no code the step ran names ``training`` (``unnamed_attributes``): the graph
    #: depends on no module's flag, and a replay checks none.
    modes_read: bool = True
    #: The warnings its replay issues (capture/step_warnings.py): one the filters now make an error
    #: would stop the replay, perhaps after the update; such a call runs eagerly (``raises_a_warning``).
    step_warnings: tuple[StepWarning, ...] = ()

    #: What hook the capture call registered or removed and left so (capture/registered_hooks.py), or None:
    #: the call stands, and its graph is not kept.
    hooks_left: str | None = None

    #: The lists and dicts among the arguments that the step changes, and the tensors whose
    #: ``requires_grad`` or ``.grad`` it sets (capture/argument_writes.py): the runner gives it each
    #: replay's arguments. None when it changes none.
    argument_writes: ArgumentWrites | None = None

    #: Per optimizer, whether the graph depends on its ``state``: False for one whose state was empty
    #: and stayed so, that the step did not step and whose ``state`` no code it ran names (the micro-
    #: batches of an accumulation loop before its first update). Empty: every optimizer's.
    optimizer_state_read: tuple[bool, ...] = ()
    #: Per optimizer whose state the graph depends on, how many parameters had state (``exp_avg``,
    #: ``momentum_buffer``) at capture: a graph that created the state lazily would create it again
    #: on every replay.
    optimizer_states_at_entry: tuple[int, ...] = ()
    #: The capture call's output (its prints, its logging), made when the capture is committed.
    flush_output: Callable[[], None] = lambda: None
    #: The outputs (flattened) that were inference tensors (made under ``torch.inference_mode()``): a
    #: replay returns them as inference tensors too, as eager does (``is_inference()``, and in-place
    #: ops on them outside the mode raise).
    inference_outputs: tuple[int, ...] = ()
    #: The outputs (flattened) eager returns with autograd's record (a loss the step's backward used),
    #: and the name of each one's ``grad_fn``: a replay returns them so too (capture/kept_history.py).
    history_outputs: tuple[tuple[int, str], ...] = ()
    #: Per optimizer whose state the graph depends on, its ``state`` dict at capture: the graph holds the tensors in it, and
    #: ``load_state_dict`` (a resumed run) puts new ones in a new dict, which another graph must hold.
    optimizer_state_objects: tuple[Any, ...] = ()
    #: The optimizers' per-parameter dicts and values the graph holds (capture/optimizer_state.py).
    optimizer_state_entries: OptimizerStateEntries | None = None

    #: The gradients of ``clear_grads`` a replay drops before its graph runs (None: all of them); nodes
    #: of the graph drop the others where eager does (``DROPS_GRADS``, ``_place_drops``).
    cleared_at_start: list[nn.Parameter] | None = None
    #: Whether the capture did not see where the step drops some of those (then a failed replay cannot
    #: tell whether eager still held them when it raised: runtime/failed_replays.py).
    drop_unseen: bool = False
    #: Whether the step's code reads gradients of ``clear_grads`` before it drops them (``p.grad is not
    #: None``: capture/grad_reads.py): their presence is then checked before each replay, and a failed
    #: replay that had dropped them cannot run the step again eagerly.
    dropped_grads_read: bool = False

    #: ``cleared_at_start`` as a list.
    start_clears: list[nn.Parameter] = field(init=False, repr=False)
    #: The optimizers whose state the graph depends on (``optimizer_state_read``), in order.
    stateful_optimizers: list[torch.optim.Optimizer] = field(init=False, repr=False)
    #: The parameters whose ``.grad`` entry_mismatch reads, and whether each had one at capture.
    entry_checked: tuple[list[nn.Parameter], tuple[bool, ...]] = field(init=False, repr=False)
    #: The guards' compiled check (``compile_guards``: after the passes, which may touch the graph).
    _guard_check: GuardCheck | None = field(default=None, init=False, repr=False)
    #: Whether the user's result is the graph's one output as it is (``return loss``): a replay then
    #: skips ``tree_unflatten``, which would return that element itself.
    _single_output: bool = field(init=False, repr=False)
    #: Whether a parameter is a DTensor: its gradient output is its local shard (``same_gradient``).
    _dtensor_params: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # A gradient the step drops first (``zero_grad(set_to_none=True)`` inside it: the parameter
        # is in clear_grads) is neither read nor accumulated into: eager and the graph compute the
        # same new gradient whether or not one exists when the call starts, so it is not checked.
        self.start_clears = self.clear_grads if self.cleared_at_start is None else self.cleared_at_start
        self.stateful_optimizers = stateful(self.state.optimizers, self.optimizer_state_read)
        cleared = {id(p) for p in self.clear_grads}
        kept = [i for i, p in enumerate(self.grad_params) if id(p) not in cleared]
        self.entry_checked = ([self.grad_params[i] for i in kept],
                               tuple(self.grads_at_entry[i] for i in kept) if self.grads_at_entry else ())
        self._single_output = self.out_spec.is_leaf()
        self._dtensor_params = any(map(is_dtensor, self.grad_params))

    def raises_a_warning(self) -> bool:
        """Whether the filters of now make one of its warnings an error: eager raises there, with
        what it ran before in place (an update, gradients), which a replay could not leave as eager
        leaves it. Only a graph that issues warnings asks."""
        return any(w.raises() for w in self.step_warnings)

    def entry_mismatch(self) -> str | None:
        """Why this call's gradients or optimizer state differ from the capture call's, or None.

        Asked before every replay, so the per-parameter test runs as C-level
        ``map``s rather than a Python loop, over the parameters whose
        gradient the graph reads or creates (none for the usual step that
        zeroes its gradients itself; all 80 of a 40-layer MLP's when the loop
        zeroes them outside the step).
        """
        if self.requires_grad_at_entry and tuple(map(_REQUIRES_GRAD, self.grad_params)) != self.requires_grad_at_entry:
            return "a parameter's requires_grad changed (frozen or unfrozen)"
        params, expected = self.entry_checked
        if params:
            present = tuple(map(operator.is_not, map(_GRAD, params), repeat(None)))
            if present != expected:
                return ("parameters' gradients exist where they did not at capture, or the reverse "
                        "(accumulation)")
        if self.dropped_grads_read and self.clear_grads[0].grad is None:  # the step reads them: it sees none
            return "parameters' gradients were dropped before the call, and the step reads them"
        optimizers = self.stateful_optimizers
        if any(o.state is not s for o, s in zip(optimizers, self.optimizer_state_objects)):
            return OPTIMIZER_STATE_REPLACED
        if tuple(len(o.state) for o in optimizers) != self.optimizer_states_at_entry:
            return OPTIMIZER_STATE_CREATED
        entries = self.optimizer_state_entries
        if entries is not None and entries.replaced(optimizers):
            return OPTIMIZER_STATE_VALUE_REPLACED
        return None

    def compile_guards(self) -> GuardCheck:
        """The guards' compiled check, generated on the first call of this (the runner calls it in the
        capture call, after the passes, so that no recorded step pays for generating code)."""
        check = self._guard_check
        if check is None:
            check = self._guard_check = GuardCheck(self.guards, self.scalar_positions)
        return check

    def broken_guard(self, leaves: list[Any]) -> Guard | None:
        """The first guard this call's values break (``leaves``: its flattened arguments), or None."""
        return self.compile_guards().broken(leaves)


#: Marks a node that drops gradients where eager drops them (``_place_drops``).
DROPS_GRADS = "graphprof.drops_grads"
_GRAD = operator.attrgetter("grad")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
OPTIMIZER_STATE_CREATED = "the optimizer created its state since the capture"
OPTIMIZER_STATE_REPLACED = "the optimizer's state was replaced since the capture (load_state_dict)"
OPTIMIZER_STATE_VALUE_REPLACED = "a value in the optimizer's per-parameter state was replaced since the capture"
#: Entry mismatches that never go away: the graph of such a path will not run again.
NEVER_AGAIN = frozenset({OPTIMIZER_STATE_CREATED, OPTIMIZER_STATE_REPLACED, OPTIMIZER_STATE_VALUE_REPLACED})


def _holds_values(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.state`` holds any value (its per-parameter dicts may exist, empty: reading
    ``state[p]`` of its defaultdict makes one)."""
    return any(optimizer.state.values())


def stateful(optimizers: Sequence[torch.optim.Optimizer], read: tuple[bool, ...]) -> list[torch.optim.Optimizer]:
    """The ``optimizers`` whose state a graph depends on (``read``, per optimizer; empty: all)."""
    return list(optimizers) if not read else [o for o, r in zip(optimizers, read) if r]


def capture_whole_step(fn: Callable[..., Any], args: tuple, kwargs: dict) -> CapturedStep:
    """Run ``fn(*args, **kwargs)`` once under make_fx and return the captured step."""
    refuse_caught_exceptions(fn)  # before anything runs: nothing to undo
    arguments = argument_objects(fn, args, kwargs)
    state = discover_state(fn, arguments)
    leaves, in_spec = flatten_call(args, kwargs)
    positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) or is_number_input(leaf))
    pre_grads = {id(p): p.grad for p in state.params.values()}
    flags = parameter_flags(state.params.values())
    modes = module_modes(state.module_objects())
    optimizer_states = tuple(len(o.state) for o in state.optimizers)
    optimizer_state_objects = tuple(o.state for o in state.optimizers)
    optimizer_values_at_entry = tuple(map(_holds_values, state.optimizers))
    optimizer_state_before = snapshot(state.optimizers)
    autocast = torch._C._is_any_autocast_enabled()
    # An optimizer-only step names the model for its parameters' names, never runs it.
    optimizer_only = getattr(fn, OPTIMIZER_ONLY, False)
    structure = ModuleStructure(() if optimizer_only else state.module_objects(), state.optimizers)
    holder: dict[str, Any] = {}
    # Hooks the step registers and leaves (one more each call) cannot be replayed; a refused capture takes
    # the capture call's back (capture/registered_hooks.py).
    holder["hooks"] = RegisteredHooks(state.params.values(), state.module_objects(), state.optimizers)
    holder["modules"] = ModuleContents(state.module_objects())  # before any input number is put in one
    storages = storages_of(state)  # before make_fx: its mode would trace reading ``.data`` as a detach
    # The gradients arguments already have (an input that requires grad, given again): read from it.
    input_grads = {id(leaf.grad): i for i, leaf in enumerate(leaves)
                   if isinstance(leaf, torch.Tensor) and leaf.grad is not None}

    def traced(*inputs: Any) -> Any:
        mode = get_proxy_mode()
        assert mode is not None  # make_fx runs this function under its proxy mode
        recorder = CaptureRecorder(mode.tracer, state, tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor)),
                                   CatchingFrames(fn), frozenset(storages))
        holder["recorder"] = recorder
        placeholders = [n for n in recorder.graph.nodes if n.op == "placeholder"]
        filled = list(leaves)
        for pos, value, node in zip(positions, inputs, placeholders):
            holder.setdefault("scalar_positions", {})[node] = pos
            if is_number_input(value):
                value = TracedScalar(value, node, recorder.graph, f"argument {node.name}", is_input=True)
            filled[pos] = value
        call_args, call_kwargs = pytree.tree_unflatten(filled, in_spec)
        # The step is given rebuilt lists and dicts, and the caller's tensors: what it changes is replayed.
        paths = [path for path, _ in flatten_call_with_path(args, kwargs)]
        holder["writes"] = ArgumentWrites((call_args, call_kwargs), filled, paths, parameter_names(fn))
        python = PythonState.watch(fn, recorder.graph, lambda: recorder.context(()), arguments,
                                   [*hook_functions(state.module_objects()), *optimizer_hook_functions(state.optimizers)])
        holder["python"] = python
        holder["leaf_grads"] = _LeafGrads(python, state.params)
        holder["deep"] = DeepContents(python.places.watched)
        python.lists.view(recorder.graph, lambda: recorder.context(()))
        reached = [*python.reached(), *(obj for _, obj in arguments)]
        holder["torch_objects"] = TorchObjects([*state.optimizers, *reached])
        holder["scalers"] = ScalerStates(reached)
        holder["numpy"] = NumpyDraws(candidate_objects(fn, arguments=arguments), state.module_objects())
        hyperparameters = recorder.hyperparameters
        hyperparameters.watch_groups(state.optimizers)  # the user's reads of a group's lr are inputs
        scheduler_fields = recorder.scheduler_fields  # and of a scheduler's ``last_epoch``
        scheduler_fields.watch(reached)
        groups = GroupWrites(state.optimizers, assignment_source(fn), hyperparameters.holds_own)

        def before_scheduler(sched: Any) -> None:
            holder["torch_objects"].add(sched)  # one the step reached through another object too
            scheduler_fields.add(sched)
            groups.before_scheduler()
            hyperparameters.unwrap_groups()  # a scheduler reads and writes real numbers
            scheduler_fields.unwrap()
            python.places.real_numbers(True)

        def after_scheduler() -> None:
            python.places.real_numbers(False)
            hyperparameters.wrap_groups()
            scheduler_fields.wrap()
            groups.settle()

        recorder.schedulers.before_step, recorder.schedulers.on_step = before_scheduler, after_scheduler
        names = holder.setdefault("names", NameReads(is_library))
        names.grown = grown_lists(python.places.watched)
        foreign = ForeignCalls()
        names.on_library_call = foreign.on_call
        functions = python.places.functions  # the user's functions the step can run
        settings = torch_settings()
        try:
            with recorder.active(functions), traced_builtins(functions, bool(python.lists.views)), names:
                out = fn(*call_args, **call_kwargs)
        except DataDependentError:  # refused where it was made: the step runs again another way
            restore_settings(settings)
            raise
        out = python.lists.put_back(out, names.records())  # the user's lists, with what was appended, before any compare
        refuse_changed_settings(settings)
        holder["hooks_left"] = holder["hooks"].changed()
        holder["numpy"].refuse_drawn()
        if recorder.catching is not None:
            recorder.catching.refuse()
        if recorder.raised is not None:  # it returned all the same: code it calls caught the error
            raise DataDependentError(f"the step catches an error that {recorder.raised} raised (a try, a "
                                     "contextlib.suppress, in a function it calls): a replay would follow the path "
                                     "the capture call took, or raise what the step catches")
        filters = recorder.host_sources.filters_refusal()
        if filters is not None:
            raise DataDependentError(filters)
        unprinted = recorder.host_sources.texts.unprinted()
        if unprinted is not None:
            raise DataDependentError(f"formatting at {unprinted} cannot be replayed by a static graph")
        foreign.refuse()
        history = recorder.backward_nodes.history_of  # a kept tensor has autograd's record, as eager's
        places = kept_places(entry.location for entry in python.places.watched)  # before effects copy what they keep
        python.effects(recorder.graph, recorder.tensor_node, assignment_source(fn), recorder.context(()), history)
        holder["scalers"].effects(recorder.graph, recorder.context(()))
        refuse_reading_extended_lists(python, names)
        refuse_rebuilt_containers(python, names)
        refuse_unseen_global_writes(python, names)
        groups.effects(recorder.graph, recorder.tensor_node, recorder.context(()))
        hyperparameters.restore()  # the user's optimizer keeps its real numbers
        scheduler_fields.unwrap()  # and its schedulers theirs
        unseen = holder["torch_objects"].stepped_unseen(recorder.schedulers.stepped)
        if unseen is not None:
            raise DataDependentError(f"the step steps a {unseen} through a method bound before the capture "
                                     "(advance = sched.step), which a replayed graph would not step again")
        holder["writes"].effects(recorder.graph, recorder.tensor_node, assignment_source(fn),
                                 recorder.context(()), history)
        params = list(state.params.values())
        for p in recorder.params_seen.values():
            if not any(p is q for q in params):
                params.append(p)
        out = read_kept_results(out, places, recorder.graph, recorder.context(()))  # the kept object itself
        places.clear()  # it holds the kept containers, which nothing of graphprof's may (capture/name_reads.py)
        out_flat, out_spec = flatten_output(out)
        refuse_differentiable_outputs(out_flat, recorder.backwards)
        holder["history_outputs"] = tuple((i, name) for i, t in enumerate(out_flat) if isinstance(t, torch.Tensor)
                                          and (name := history(t, "the step's result")) is not None)
        refuse_opaque_outputs(out_flat, lambda v: isinstance(v, TracedScalar) or (
            isinstance(v, torch.Tensor) and not recorder.is_preexisting(v)))
        holder.update(out_flat=out_flat, out_spec=out_spec, params=params,
                      scalar_outputs={i: s for i, s in enumerate(out_flat) if isinstance(s, TracedScalar)})
        plain = [None if isinstance(s, KeptResult) else s.value if isinstance(s, TracedScalar) else s
                 for s in out_flat]
        check_new_gradients(params, pre_grads)
        flags.effects(recorder.graph, recorder.context(()))  # a GAN's frozen discriminator, per path
        modes.effects(recorder.graph, recorder.context(()))  # ``model.train()`` inside the step
        refuse_escaped_scalars(python.places.watched)  # after every effect: what is left was never watched
        refuse_replaced(optimizer_state_before)
        return plain, [local_shard(p.grad) for p in params]

    try:
        with one_fake_mode(), code_when_asked():  # one mode for the ops' metadata, not one per op
            gm = make_fx(traced, tracing_mode="real")(*(leaves[i] for i in positions))
        holder["recorder"].data_assignments.refuse_unseen(storages)
        guard_baked_sizes(gm.graph, holder["recorder"].value_guards, holder["recorder"].guards)
        _link_scalar_outputs(gm, holder["scalar_outputs"])
        _link_scalar_outputs(gm, {i: leaf for i, leaf in enumerate(holder["out_flat"]) if isinstance(leaf, KeptResult)})
        for node in [*holder["recorder"].hyperparameters.unused_readers(),
                     *holder["recorder"].scheduler_fields.unused_readers()]:
            gm.graph.erase_node(node)
        name_state(gm, state)
        referenced = {id(getattr(gm, n.target)) for n in gm.graph.nodes if n.op == "get_attr"}
        params = holder["params"]
        clear = [p for p in params
                 if pre_grads.get(id(p)) is not None and id(local_shard(pre_grads[id(p)])) not in referenced]
        read_grads_at_run_time(gm, {id(local_shard(g)): p for p in params if (g := pre_grads.get(id(p))) is not None})
        # Tensors the step keeps in its own state (``self.ema``) are read where they are kept.
        model_state = set(state.tensors) | {id(g) for g in pre_grads.values() if g is not None}
        model_state -= holder["python"].replaced_tensors()
        kept = holder["python"].kept_tensors(model_state, referenced)
        holder["leaf_grads"].refuse(referenced)
        if structure is not None:
            structure.read_where_kept((loc.keeper, loc.key) for loc in kept.values() if isinstance(loc.keeper, nn.Module))
        read_constants_at_run_time(gm, {key: location.get for key, location in kept.items()})
        refuse_contained_tensors(gm, holder["python"].contained_tensors(model_state))
        refuse_contained_tensors(gm, {key: where for key, where in tensors_in_argument_objects(leaves).items()
                                       if key not in model_state})
        read_input_grads(gm, input_grads, {pos: node for node, pos in holder.get("scalar_positions", {}).items()})
        refuse_unknown_constants(gm, model_state | {id(local_shard(g)) for g in pre_grads.values() if g is not None})
        recorder, python = holder["recorder"], holder["python"]
        at_start, drop_unseen = _place_drops(gm, clear, recorder.grads_dropped)
        gm.graph.lint()
        gm.recompile()

        writes = holder["writes"] or None  # one that changes nothing needs no runner's help

        def undo() -> None:
            _undo(holder, flags, modes, hyperparameters=False)  # the capture call already gave them back

        out = pytree.tree_unflatten([s.value if isinstance(s, TracedScalar) else s.read() if isinstance(s, KeptResult)
                                     else s for s in holder["out_flat"]], holder["out_spec"])
        unnamed = unnamed_attributes(holder["names"], state.module_objects(), leaves, params)
        # An optimizer the step neither stepped nor named the state of, whose state was empty and still is
        # (a micro-batch before the loop's first update): the graph holds none of it, and decided nothing
        # on it, so the state the loop's update creates afterwards does not make it stale.
        state_read = tuple(held or _holds_values(o) or id(o) in recorder.stepped_optimizers or not unnamed("state")
                           for o, held in zip(state.optimizers, optimizer_values_at_entry))
        optimizers = stateful(state.optimizers, state_read)
        return CapturedStep(gm, in_spec, positions, holder["out_spec"], params, clear, state, result=out,
                                undo=undo, guards=distinct_guards(recorder.guards),
                                held=_held(python.held(model_state, unread_lists(
                                    python, holder["names"], leaves, params), unnamed)
                                    + recorder.distribution_checks.held() + recorder.host_sources.environment.held()
                                    + holder["scalers"].held(),
                                    optimizer_only),
                                structure=structure,
                                autocast=autocast,
                                scalar_positions=holder.get("scalar_positions", {}),
                                grads_at_entry=tuple(pre_grads.get(id(p)) is not None for p in params),
                                # A parameter first met during the step (registered by it) as it is now.
                                requires_grad_at_entry=tuple(map(flags.at_entry, params)),
                                modes_at_entry=modes.all_at_entry, modes_read=not unnamed("training"),
                                optimizer_state_read=state_read,
                                optimizer_states_at_entry=tuple(c for c, r in zip(optimizer_states, state_read) if r),
                                optimizer_state_objects=tuple(s for s, r in zip(optimizer_state_objects, state_read)
                                                              if r), argument_writes=writes,
                                optimizer_state_entries=OptimizerStateEntries.of(optimizers),
                                inference_outputs=tuple(i for i, leaf in enumerate(holder["out_flat"])
                                                        if isinstance(leaf, torch.Tensor) and leaf.is_inference()),
                                history_outputs=holder["history_outputs"],
                                cleared_at_start=at_start, drop_unseen=drop_unseen,
                                dropped_grads_read=any(id(p) in recorder.grad_reads.read for p in clear),
                                flush_output=recorder.host_sources.flush, hooks_left=holder["hooks_left"],
                                step_warnings=tuple(recorder.host_sources.step_warnings))
    except BaseException as exc:
        # The step ran (part way or whole): undo it, or a fallback would run it twice. Everything
        # up to the finished CapturedStep is in here: a failure anywhere after the step must undo it.
        restore_data_assignments(storages)  # first: the write log's undo writes into the data put back
        _undo(holder, flags, modes, hyperparameters=True)
        if isinstance(exc, DataDependentError) and "recorder" in holder:  # the path it refused on
            exc.refused_path = refused_path(holder["recorder"].guards, holder.get("scalar_positions", {}))
        raise


class _LeafGrads:
    """The tensors the step reaches that require grad and are not its parameters (``d["w"] =
    torch.ones(4, requires_grad=True)``, put there by the user), with their ``.grad`` before the call.

    Why: eager's backward accumulates into their ``.grad``; the graph writes the gradients of the
    parameters it knows, so a replay reading one left its ``.grad`` as the last eager call had it,
    silently. Such a graph is refused (``refuse``), and the capture call's accumulation is put back
    first, so that the fallback runs the call and accumulates once.
    """

    def __init__(self, python: PythonState, params: Any) -> None:
        with _disable_current_modes():  # copies of the caller's values, not ops of the traced step
            self.found = [(e.location.describe, t, None if t.grad is None else t.grad.detach().clone(), t.grad)
                          for e in python.places.watched if isinstance(t := e.before, torch.Tensor) and t.requires_grad
                          and t.is_leaf and id(t) not in params]

    def refuse(self, read: set[int]) -> None:
        for where, t, _, _ in self.found:
            if id(t) in read:
                with _disable_current_modes():
                    self.restore()
                raise DataDependentError(f"the step reads {where}, a tensor that requires grad and is not a "
                                         "parameter of its model or optimizer: a replay would not accumulate its "
                                         ".grad as eager's backward does")

    def restore(self) -> None:
        for _, t, values, grad in self.found:
            if grad is not None and values is not None:
                grad.copy_(values)  # the same tensor the caller may hold, with its values from before
            t.grad = grad


def _place_drops(gm: torch.fx.GraphModule, clear: list[nn.Parameter],
                 drops: list[GradDrop]) -> tuple[list[nn.Parameter], bool]:
    """Drop ``clear``'s gradients in the graph where the step dropped them after an op (``loss =
    model(x); opt.zero_grad(); loss.backward()``): a node right before the first op after each drop.
    Returns the ones a replay drops before it starts (dropped before any op, as eager did, or where
    the capture did not see it), and whether some were not seen.

    Why: until eager drops them, it holds them. A replay that dropped them
    first held less memory through the forward than eager does, and when an
    op there raised (a bad batch) it had lost what eager still held.
    """
    by_id = {id(p): p for p in clear}
    nodes = list(gm.graph.nodes)
    at = {n.name: i for i, n in enumerate(nodes)}
    first_op = next((i for i, n in enumerate(nodes) if isinstance(n.target, torch._ops.OpOverload)), len(nodes))
    at_start: list[nn.Parameter] = []
    for drop in drops:
        params = tuple(by_id.pop(id(p)) for p in clear if id(p) in drop.params and id(p) in by_id)
        where = at.get(drop.before)
        if not params or where is None:  # (an op node is never removed: not expected)
            by_id.update((id(p), p) for p in params)
            continue
        if where <= first_op:  # before any op ran: where the replay drops them too
            at_start += params
            continue

        def zero_grad(params: tuple[nn.Parameter, ...] = params) -> None:
            for p in params:
                p.grad = None
        with gm.graph.inserting_before(nodes[where]):
            dropping = gm.graph.call_function(host_function(zero_grad, "zero_grad"), ())
        dropping.meta[DROPS_GRADS] = True
        dropping.meta[CAPTURE] = drop.record
    unseen = [p for p in clear if id(p) in by_id]
    return at_start + unseen, bool(unseen)


def _held(held: tuple[HeldValue, ...], optimizer_only: bool) -> tuple[HeldValue, ...]:
    """What a path holds: everything watched, but of an optimizer-only step (a segmented step's
    ``opt.step``) not the model it names for its parameters' names and never runs. What the
    optimizer keeps is held: a wrapper decides on it (accelerate's ``AcceleratedOptimizer``
    steps only when its ``gradient_state.sync_gradients`` is set), and without it the update
    captured in a synchronising call was replayed in every accumulating one."""
    if not optimizer_only:
        return held
    return tuple(h for h in held if not isinstance(h.owner, nn.Module) and not isinstance(h.value, nn.Module))


def _undo(holder: dict[str, Any], flags: SwitchedFlags, modes: SwitchedFlags, hyperparameters: bool) -> None:
    """Put back what the capture call changed, as far as it got (``holder``: what it had set up): the
    flags, the recorded tensor writes, the contents below the watched values, the optimizers,
    schedulers and scalers, then the watched values themselves (they hold the capture's inputs: a
    scaler's or a custom optimizer's number fields, which the torch objects' copy, taken after the
    inputs were put in, holds too)."""
    steps: list[tuple[str, Callable[[], Any]]] = [("parameters' requires_grad", flags.restore),
                                                  ("modules' training modes", modes.restore)]
    if "recorder" in holder:
        recorder = holder["recorder"]
        if hyperparameters:
            steps += [("optimizers' hyperparameters", recorder.hyperparameters.restore),
                      ("schedulers' fields", recorder.scheduler_fields.restore)]
        steps.append(("tensors the step wrote", recorder.write_log.restore))
    if "names" in holder:
        steps.append(("globals", functools.partial(put_back_unseen_globals, holder["names"], holder.get("python"))))
    steps += [(what, holder[key].restore) for key, what in _UNDONE if key in holder]
    # Every one is tried: one that stopped the rest left the user's objects holding graphprof's numbers.
    failures: list[tuple[str, BaseException]] = []
    for what, restore in steps:
        try:
            restore()
        except StateNotRestored as exc:
            failures += exc.failures
        except Exception as exc:
            failures.append((what, exc))
    if failures:
        raise StateNotRestored(failures)


#: What ``_undo`` puts back after the tensors, in this order: (key in its holder, what it holds). The
#: modules' dicts first: a module's attribute is put back where the module keeps it (a pruned ``weight``,
#: a plain attribute again once ``prune.remove``'s registered parameter is gone).
_UNDONE = (("modules", "modules' attributes"), ("deep", "the contents of the step's lists, dicts and objects"),
           ("torch_objects", "optimizers, schedulers and scalers"), ("python", "the step's Python values"),
           ("numpy", "numpy's random state"), ("hooks", "hooks"))


def is_number_input(value: Any) -> bool:
    """An int or float argument: a graph input, not part of the signature's key."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _link_scalar_outputs(gm: torch.fx.GraphModule, scalars: dict[int, TracedScalar] | dict[int, KeptResult]) -> None:
    """Outputs that were ``.item()`` values (or kept objects, capture/kept_results.py) return their node,
    not a constant."""
    if not scalars:
        return
    output = next(n for n in gm.graph.nodes if n.op == "output")
    user_outputs, grads = output.args[0]
    user_outputs = list(user_outputs)
    for index, scalar in scalars.items():
        user_outputs[index] = scalar.node
    output.args = ((user_outputs, grads),)


def _as_inference(out_flat: Any, positions: tuple[int, ...]) -> list[Any]:
    """``out_flat`` with the tensors at ``positions`` copied as inference tensors (bit for bit)."""
    out = list(out_flat)
    with torch.inference_mode():
        for i in positions:
            out[i] = out[i].clone()
    return out


def run_captured(step: CapturedStep, graph_module: Callable[..., Any], leaves: list[Any],
                 instrumented: bool = False, clock: Callable[[], int] | None = None) -> tuple[Any, Any, Any]:
    """Run a captured step's graph in place of the user's function.

    ``leaves`` are the call's flattened ``(args, kwargs)``, in
    ``pytree.tree_leaves`` order (the caller flattens once per step).

    Returns the user's result and, for an instrumented graph, its probe stamps
    and the clock readings just before dropping the old gradients and just
    after assigning the new ones (that work is part of the user's step too).
    """
    started = clock() if instrumented and clock is not None else 0
    for p in step.start_clears:
        p.grad = None
    # The backward pass is explicit in the graph: autograd must not record it again. What
    # ``torch.no_grad()`` does, without its three Python frames inside the step's own time.
    enabled = _grad_enabled()
    _set_grad_enabled(False)
    try:
        if step.autocast:  # the casts autocast made are in the graph: not made twice
            with torch._C._DisableAutocast():
                out = graph_module(*[leaves[i] for i in step.input_positions])
        else:
            out = graph_module(*[leaves[i] for i in step.input_positions])
    finally:
        _set_grad_enabled(enabled)
    stamps = None
    if instrumented:
        out, stamps = out
    out_flat, grads = out
    if step.inference_outputs:
        out_flat = _as_inference(out_flat, step.inference_outputs)
    if step.history_outputs:
        out_flat = list(out_flat)
        for i, name in step.history_outputs:
            out_flat[i] = with_history(out_flat[i], name)
    if step._dtensor_params:
        for p, g in zip(step.grad_params, grads):
            if not same_gradient(p.grad, g):
                p.grad = g
    else:  # the same test without a call per parameter: this loop is inside the step's time
        for p, g in zip(step.grad_params, grads):
            if p.grad is not g:
                p.grad = g
    host = (started, clock()) if instrumented and clock is not None else None
    if step._single_output and len(out_flat) == 1:
        return out_flat[0], stamps, host
    return pytree.tree_unflatten(out_flat, step.out_spec), stamps, host
