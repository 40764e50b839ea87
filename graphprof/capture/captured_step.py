"""A captured step: its graph, what a replay checks first, and running it in place of the user's function.

Why a module of its own: capture/whole_step.py makes a ``CapturedStep`` once,
from the capture call; the runner (runtime/whole_step_runner.py) asks it on
every later call whether this call may replay it (``entry_mismatch``,
``broken_guard``), and runs it (``run_captured``). What a replay needs is all
here, and nothing of how the capture was made.

Two things eager does outside aten ops are restored around replay: setting
``param.grad`` (the graph returns the new gradients, ``run_captured`` assigns
them) and ``zero_grad(set_to_none=True)`` (gradients the graph no longer reads
are dropped before it runs, or where eager drops them: capture/grad_drops.py,
so memory behaves as in eager).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn

from graphprof.capture.argument_writes import ArgumentWrites
from graphprof.capture.dtensor import is_dtensor, same_gradient
from graphprof.capture.guard_check import GuardCheck
from graphprof.capture.held_values import HeldValue
from graphprof.capture.kept_history import with_history
from graphprof.capture.module_structure import ModuleStructure
from graphprof.capture.optimizer_state import OptimizerStateEntries
from graphprof.capture.scalars import Guard
from graphprof.capture.state import StateIndex
from graphprof.capture.step_warnings import StepWarning

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
    #: of the graph drop the others where eager does (capture/grad_drops.py).
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


_GRAD = operator.attrgetter("grad")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
#: Why ``entry_mismatch`` finds the optimizers' state is not the one the graph holds.
OPTIMIZER_STATE_CREATED = "the optimizer created its state since the capture"
OPTIMIZER_STATE_REPLACED = "the optimizer's state was replaced since the capture (load_state_dict)"
OPTIMIZER_STATE_VALUE_REPLACED = "a value in the optimizer's per-parameter state was replaced since the capture"
#: Entry mismatches that never go away: the graph of such a path will not run again.
NEVER_AGAIN = frozenset({OPTIMIZER_STATE_CREATED, OPTIMIZER_STATE_REPLACED, OPTIMIZER_STATE_VALUE_REPLACED})


def stateful(optimizers: Sequence[torch.optim.Optimizer], read: tuple[bool, ...]) -> list[torch.optim.Optimizer]:
    """The ``optimizers`` whose state a graph depends on (``read``, per optimizer; empty: all)."""
    return list(optimizers) if not read else [o for o, r in zip(optimizers, read) if r]


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
