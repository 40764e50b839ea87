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

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from graphprof.capture.recorder import CaptureRecorder
from graphprof.capture.scalars import TracedScalar
from graphprof.capture.state import StateIndex, discover_state
from graphprof.passes.records import STATE, StateRecord, StateRole


@dataclass
class CapturedStep:
    """A captured step: the graph plus what the runner needs around it."""

    graph_module: torch.fx.GraphModule
    in_spec: pytree.TreeSpec
    tensor_positions: tuple[int, ...]
    out_spec: pytree.TreeSpec
    grad_params: list[nn.Parameter]
    clear_grads: list[nn.Parameter]
    state: StateIndex
    result: Any = None
    #: Puts the user's state back as it was before the capture call (for
    #: failures after capture, before the graph is usable).
    undo: Callable[[], None] = lambda: None


def _safe_attr(name: str, taken: set[str]) -> str:
    base = "".join(c if c.isalnum() else "_" for c in name) or "state"
    candidate, i = base, 1
    while candidate in taken:
        candidate, i = f"{base}_{i}", i + 1
    taken.add(candidate)
    return candidate


def _name_state(gm: torch.fx.GraphModule, state: StateIndex) -> None:
    """Give get_attr constants the user's names and roles; rename the attributes."""
    state.refresh_gradients()
    taken: set[str] = set()
    renames: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta[STATE] = StateRecord(f"input{len(taken)}", StateRole.INPUT)
            taken.add(node.target)
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):  # torchbind objects (a ProcessGroup) keep their attribute
                continue
            record = state.describe(value) if isinstance(value, torch.Tensor) else None
            if record is None:
                role = StateRole.PARAMETER if isinstance(value, nn.Parameter) else StateRole.CONSTANT
                record = StateRecord(node.target, role)
            node.meta[STATE] = record
            if node.target not in renames:
                renames[node.target] = _safe_attr(record.name, taken)
            node.target = renames[node.target]
    for old, new in renames.items():
        value = getattr(gm, old)
        delattr(gm, old)
        if isinstance(value, nn.Parameter):
            gm.register_parameter(new, value)
        else:
            gm.register_buffer(new, value)


def capture_whole_step(fn: Callable[..., Any], args: tuple, kwargs: dict) -> CapturedStep:
    """Run ``fn(*args, **kwargs)`` once under make_fx and return the captured step."""
    state = discover_state(fn)
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    pre_grads = {id(p): p.grad for p in state.params.values()}
    holder: dict[str, Any] = {}

    def traced(*tensors: torch.Tensor) -> Any:
        filled = list(leaves)
        for pos, t in zip(positions, tensors):
            filled[pos] = t
        call_args, call_kwargs = pytree.tree_unflatten(filled, in_spec)
        recorder = CaptureRecorder(get_proxy_mode().tracer, state)
        holder["recorder"] = recorder
        with recorder.active():
            out = fn(*call_args, **call_kwargs)
        params = list(state.params.values())
        for p in recorder.params_seen.values():
            if not any(p is q for q in params):
                params.append(p)
        out_flat, out_spec = pytree.tree_flatten(out)
        holder.update(out=out, out_spec=out_spec, params=params,
                      scalar_outputs={i: s for i, s in enumerate(out_flat) if isinstance(s, TracedScalar)})
        plain = [s.value if isinstance(s, TracedScalar) else s for s in out_flat]
        return plain, [p.grad for p in params]

    try:
        gm = make_fx(traced, tracing_mode="real")(*(leaves[i] for i in positions))
        _link_scalar_outputs(gm, holder["scalar_outputs"])
        _name_state(gm, state)
        referenced = {id(getattr(gm, n.target)) for n in gm.graph.nodes if n.op == "get_attr"}
        params = holder["params"]
        clear = [p for p in params if pre_grads.get(id(p)) is not None and id(pre_grads[id(p)]) not in referenced]
        gm.graph.lint()
        gm.recompile()
    except BaseException:
        # The step ran (part way or whole): undo it, or a fallback would run it twice.
        if "recorder" in holder:
            holder["recorder"].write_log.restore()
        raise
    out = holder["out"]
    out = pytree.tree_map_only(TracedScalar, lambda s: s.value, out)
    return CapturedStep(gm, in_spec, positions, holder["out_spec"], params, clear, state, result=out,
                        undo=holder["recorder"].write_log.restore)


def _link_scalar_outputs(gm: torch.fx.GraphModule, scalars: dict[int, TracedScalar]) -> None:
    """Outputs that were ``.item()`` values return their scalar node, not a constant."""
    if not scalars:
        return
    output = next(n for n in gm.graph.nodes if n.op == "output")
    user_outputs, grads = output.args[0]
    user_outputs = list(user_outputs)
    for index, scalar in scalars.items():
        user_outputs[index] = scalar.node
    output.args = ((user_outputs, grads),)


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
    for p in step.clear_grads:
        p.grad = None
    # The backward pass is explicit in the graph: autograd must not record it again.
    with torch.no_grad():
        out = graph_module(*[leaves[i] for i in step.tensor_positions])
    stamps = None
    if instrumented:
        out, stamps = out
    out_flat, grads = out
    for p, g in zip(step.grad_params, grads):
        if p.grad is not g:
            p.grad = g
    host = (started, clock()) if instrumented and clock is not None else None
    return pytree.tree_unflatten(out_flat, step.out_spec), stamps, host
