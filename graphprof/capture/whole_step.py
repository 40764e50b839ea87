"""Whole-step capture: one ``make_fx`` trace of forward, backward and optimizer.

The trace runs for real (``tracing_mode="real"``): the capture call *is* a
training step, and its result is returned to the user. Nothing is
functionalised or decomposed beyond what eager dispatch does, so the graph
holds the aten ops eager runs, in-place updates included. Parameters, buffers
and optimizer state enter the graph as ``get_attr`` constants that are the
user's own tensor objects, so replaying the graph updates them in place.

What the capture makes is a ``CapturedStep`` (capture/captured_step.py, which
also runs it); the gradients the step drops part way are dropped by nodes of the
graph (capture/grad_drops.py); a refused or failed capture is undone
(capture/capture_undo.py) before the step runs another way. ``capture_whole_step``
stays in this module: capture/step_warnings.py knows the frame that calls the
step by this file's name.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from graphprof.capture.distributed import OPTIMIZER_ONLY
from graphprof.capture.data_sizes import guard_baked_sizes
from graphprof.capture.dtensor import check_new_gradients, local_shard
from graphprof.capture.held_values import HeldValue
from graphprof.capture.grad_drops import place_drops
from graphprof.capture.graph_constants import (read_constants_at_run_time, read_grads_at_run_time, read_input_grads,
                                               refuse_contained_tensors)
from graphprof.capture.inputs import PythonState, assignment_source
from graphprof.capture.module_structure import ModuleStructure, hook_functions, optimizer_hook_functions
from graphprof.capture.recorder import CaptureRecorder
from graphprof.capture.sources import is_library
from graphprof.capture.refused_paths import refused_path
from graphprof.capture.scaler_state import ScalerStates
from graphprof.capture.guards import distinct_guards
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.argument_writes import ArgumentWrites
from graphprof.capture.arguments import argument_objects, parameter_names
from graphprof.capture.captured_step import CapturedStep, stateful
from graphprof.capture.capture_undo import LeafGrads, undo_capture
from graphprof.capture.batches import flatten_call, flatten_call_with_path, flatten_output
from graphprof.capture.caught_exceptions import CatchingFrames, refuse_caught_exceptions
from graphprof.capture.state import candidate_objects, discover_state
from graphprof.capture.state_names import name_state
from graphprof.capture.optimizer_groups import GroupWrites
from graphprof.capture.grad_mode import refuse_differentiable_outputs, refuse_opaque_outputs
from graphprof.capture.kept_results import KeptResult, kept_places, read_kept_results
from graphprof.capture.registered_hooks import RegisteredHooks
from graphprof.capture.module_contents import ModuleContents
from graphprof.capture.torch_settings import refuse_changed_settings, restore_settings, torch_settings
from graphprof.capture.growing_lists import traced_builtins
from graphprof.capture.name_read_checks import (grown_lists, refuse_reading_extended_lists,
                                                refuse_rebuilt_containers, refuse_unseen_global_writes,
                                                unnamed_attributes, unread_lists)
from graphprof.capture.name_reads import NameReads
from graphprof.capture.optimizer_state import OptimizerStateEntries, refuse_replaced, snapshot
from graphprof.capture.foreign_calls import ForeignCalls
from graphprof.capture.escaped_scalars import DeepContents, refuse_escaped_scalars
from graphprof.capture.fake_values import one_fake_mode
from graphprof.capture.switched_flags import module_modes, parameter_flags
from graphprof.capture.numpy_draws import NumpyDraws
from graphprof.capture.torch_objects import TorchObjects
from graphprof.capture.data_assignments import restore_data_assignments, storages_of
from graphprof.capture.unseen_writes import refuse_unknown_constants, tensors_in_argument_objects
from graphprof.passes.graph_modules import code_when_asked


def _holds_values(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.state`` holds any value (its per-parameter dicts may exist, empty: reading
    ``state[p]`` of its defaultdict makes one)."""
    return any(optimizer.state.values())


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
        holder["leaf_grads"] = LeafGrads(python, state.params)
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
        at_start, drop_unseen = place_drops(gm, clear, recorder.grads_dropped)
        gm.graph.lint()
        gm.recompile()

        writes = holder["writes"] or None  # one that changes nothing needs no runner's help

        def undo() -> None:
            undo_capture(holder, flags, modes, hyperparameters=False)  # the capture call already gave them back

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
        undo_capture(holder, flags, modes, hyperparameters=True)
        if isinstance(exc, DataDependentError) and "recorder" in holder:  # the path it refused on
            exc.refused_path = refused_path(holder["recorder"].guards, holder.get("scalar_positions", {}))
        raise


def _held(held: tuple[HeldValue, ...], optimizer_only: bool) -> tuple[HeldValue, ...]:
    """What a path holds: everything watched, but of an optimizer-only step (a segmented step's
    ``opt.step``) not the model it names for its parameters' names and never runs. What the
    optimizer keeps is held: a wrapper decides on it (accelerate's ``AcceleratedOptimizer``
    steps only when its ``gradient_state.sync_gradients`` is set), and without it the update
    captured in a synchronising call was replayed in every accumulating one."""
    if not optimizer_only:
        return held
    return tuple(h for h in held if not isinstance(h.owner, nn.Module) and not isinstance(h.value, nn.Module))


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
