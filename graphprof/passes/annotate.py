"""The annotate pass: an ``OpAnnotation`` on every op node.

Reads ``CAPTURE`` (module, source, phase, scope recorded at capture) and the
``val`` metadata make_fx leaves on every node (a FakeTensor with shape,
dtype, stride and device), and writes ``ANNOTATION``. Op nodes are the
``call_function`` nodes: aten ops and the host scalar arithmetic recorded
from ``.item()`` values. Placeholders, constants and the output are not ops.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from graphprof.passes.records import ANNOTATION, CAPTURE, OpAnnotation, TensorInfo
from graphprof.profile.model import Phase

_UNKNOWN_CAPTURE_PHASE = Phase.OTHER


def is_op_node(node: torch.fx.Node) -> bool:
    """True for nodes that execute an operation (and get timed)."""
    return node.op == "call_function"


def op_name(target: Any) -> tuple[str, str]:
    """``("aten.addmm.default", "addmm")`` for an op target; Python operators too."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target), target.overloadpacket.__name__
    name = getattr(target, "__name__", str(target))
    module = getattr(target, "__module__", None) or "python"
    if module in ("_operator", "operator"):
        module = "operator"
    return f"{module}.{name}", name


def tensor_info(value: Any) -> TensorInfo | None:
    """Static description of a tensor value (FakeTensor or real), else None."""
    if not isinstance(value, torch.Tensor):
        return None
    return TensorInfo(
        shape=tuple(int(d) for d in value.shape),
        dtype=str(value.dtype).removeprefix("torch."),
        stride=tuple(int(s) for s in value.stride()),
        device=str(value.device),
        nbytes=int(value.numel()) * value.element_size(),
    )


def _value_of(node: torch.fx.Node, gm: torch.fx.GraphModule) -> Any:
    if node.op == "get_attr":
        return getattr(gm, str(node.target), node.meta.get("val"))
    return node.meta.get("val")


def _flat_args(node: torch.fx.Node) -> list[Any]:
    return pytree.tree_leaves((node.args, node.kwargs))


def _out_infos(value: Any) -> tuple[TensorInfo | None, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(tensor_info(v) for v in value)
    if value is None:
        return ()
    return (tensor_info(value),)


def _is_view(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and bool(getattr(target, "is_view", False))


def _is_inplace(target: Any) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None and r.alias_info.is_write for r in target._schema.returns)


def annotate(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Write an OpAnnotation on every op node of ``gm``; returns ``gm``."""
    index = 0
    for node in gm.graph.nodes:
        if not is_op_node(node):
            continue
        op, op_type = op_name(node.target)
        in_tensors: list[TensorInfo | None] = []
        producers: list[str] = []
        for arg in _flat_args(node):
            if isinstance(arg, torch.fx.Node):
                in_tensors.append(tensor_info(_value_of(arg, gm)))
                if is_op_node(arg) and arg.name not in producers:
                    producers.append(arg.name)
        capture = node.meta.get(CAPTURE)
        node.meta[ANNOTATION] = OpAnnotation(
            index=index,
            op=op,
            type=op_type,
            inputs=tuple(producers),
            in_tensors=tuple(t for t in in_tensors if t is not None),
            out_tensors=_out_infos(node.meta.get("val")),
            module=capture.module if capture else "",
            module_type=capture.module_type if capture else "",
            source=capture.source if capture else "",
            phase=capture.phase if capture else _UNKNOWN_CAPTURE_PHASE,
            scope=capture.scope if capture else "",
            is_view=_is_view(node.target),
            is_inplace=_is_inplace(node.target),
        )
        index += 1
    return gm
