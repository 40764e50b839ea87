"""The op_attrs pass: op-specific facts the advisor needs, typed (text, counts, flags).

Some facts about an op are only knowable with torch at hand: which
convolution backend the device will run for these shapes (oneDNN, cuDNN, or a
slow fallback such as Slow2d/NNPACK when the fast one is disabled), and which
devices a copy moves data between. They are written as ``OpAttrs`` under the
``ATTRS`` key and land in ``NodeRecord.attrs``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from graphprof.passes.annotate import is_op_node
from graphprof.passes.cost_formulas_comm import node_collective_attrs
from graphprof.passes.records import ANNOTATION, ATTRS, OpAttrs
from graphprof.profile.records import AttrValue

aten = torch.ops.aten
_CONV_TYPES = {"convolution", "convolution_backward"}
_COPY_TYPES = {"_to_copy", "copy_", "to", "_copy_from", "copy"}


def _fast_conv_available(device: torch.device) -> bool:
    if device.type == "cpu":
        return bool(torch.backends.mkldnn.is_available())
    if device.type == "cuda":
        return bool(torch.backends.cudnn.is_available())
    return False


def _conv_backend(node: torch.fx.Node) -> dict[str, AttrValue]:
    """The backend torch selects for this convolution's shapes and current flags."""
    args: list[Any] = list(node.args)
    if node.meta[ANNOTATION].type == "convolution_backward":
        # convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation, transposed, ...)
        args = [args[1], args[2], None, *args[4:10]]
    x, w = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in args[:2])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return {}
    stride, padding, dilation, transposed, output_padding, groups = args[3:9]
    try:
        # Real (empty) tensors of the node's shapes: backend selection reads
        # only metadata and global flags, and refuses fake tensors.
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            xr = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            wr = torch.empty_strided(w.shape, w.stride(), dtype=w.dtype, device=w.device)
            backend = torch._C._select_conv_backend(xr, wr, None, list(stride), list(padding), list(dilation),
                                                     bool(transposed), list(output_padding), int(groups), None)
    except (RuntimeError, TypeError, ValueError):
        return {}
    return {"conv_backend": str(backend).rsplit(".", 1)[-1],
            "fast_conv_available": _fast_conv_available(x.device)}


def _copy_devices(node: torch.fx.Node) -> dict[str, AttrValue]:
    ann = node.meta[ANNOTATION]
    devices = [t.device for t in ann.in_tensors if t is not None] + [t.device for t in ann.out_tensors if t]
    return {"devices": ",".join(dict.fromkeys(devices))} if devices else {}


def op_attrs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Write OpAttrs on convolution and copy nodes; returns ``gm``."""
    for node in gm.graph.nodes:
        if not is_op_node(node) or ANNOTATION not in node.meta:
            continue
        op_type = node.meta[ANNOTATION].type
        attrs: dict[str, AttrValue] = {}
        if op_type in _CONV_TYPES:
            attrs = _conv_backend(node)
        elif op_type in _COPY_TYPES:
            attrs = _copy_devices(node)
        else:
            attrs = node_collective_attrs(node, gm)  # collective, bytes communicated, world size
        if attrs:
            node.meta[ATTRS] = OpAttrs(tuple(sorted(attrs.items())))
    return gm
