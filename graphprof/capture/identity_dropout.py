"""Dropout in segments does what eager's does: nothing where eager skips it, eager's own ops on a CPU
tensor in half precision.

Eager ``F.dropout(x, p, training)`` returns ``x`` itself when ``p == 0`` or
not training (ATen's ``_dropout_impl``: no kernel, no copy). AOTAutograd's
decomposition of ``aten.dropout`` returns ``x.clone()`` instead, because a
functional graph's output may not alias its input. On the demo GPT step
(``dropout=0.0``, as nanoGPT and Llama-style configs use) that put 7 copies
of activations into each forward graph that the user's step never makes:
~0.1-0.16 ms per step, ~1% (measured), and 7 profiled nodes that are not
the user's work.

So before AOTAutograd sees dynamo's graph, a dropout call whose ``p`` and
``training`` are constants and which eager would skip is replaced by its
input, exactly what eager returns (the same tensor). Any other dropout
(``p > 0`` in training, or arguments only known at run time) is left to
AOTAutograd as before.

And on CPU, eager's dropout (ATen's ``_dropout_impl``) makes a noise tensor
in the input's dtype, ``bernoulli_(1 - p).div_(1 - p)``, and multiplies by
it, forward and backward; AOTAutograd's decomposition is ``native_dropout``,
whose scale ``1 / (1 - p)`` is applied in float. In float32 and float64 the
two are the same numbers; in bfloat16 and float16 the noise's rounded scale
(1.109375 for p = 0.1) is not, and a step under CPU autocast that fell back
to segments got gradients a bf16 bit away from eager's from the first call.
So such a dropout is given eager's ops before AOTAutograd sees it
(``eager_dropout``): the same draws from the generator, the same roundings.
On CUDA eager itself takes ``native_dropout`` (its fused kernel), so only
CPU tensors are rewritten.
"""

from __future__ import annotations

import torch
import torch.fx

_DROPOUTS = {torch.nn.functional.dropout: ("input", "p", "training", "inplace"),
             torch.dropout: ("input", "p", "train"), torch.dropout_: ("input", "p", "train")}
_DEFAULTS = {"p": 0.5, "training": True, "train": True, "inplace": False}


def _arguments(node: torch.fx.Node) -> dict[str, object] | None:
    names = _DROPOUTS.get(node.target)  # type: ignore[call-overload,arg-type]
    if names is None or len(node.args) > len(names) or not set(node.kwargs) <= set(names):
        return None
    defaults = {name: _DEFAULTS[name] for name in names if name in _DEFAULTS}
    return {**defaults, **dict(zip(names, node.args)), **node.kwargs}


def _constant_dropout(node: torch.fx.Node) -> tuple[torch.fx.Node, float, bool, bool] | None:
    """A dropout's input, ``p``, training flag and whether it is in place, where ``p`` and the flag are
    constants eager accepts; None for any other node (run-time values, or a ``p`` eager rejects: those
    are left to AOTAutograd, whose graph does what eager does)."""
    values = _arguments(node) if node.op == "call_function" else None
    if values is None or not isinstance(values.get("input"), torch.fx.Node):
        return None
    p, training = values["p"], values.get("training", values.get("train"))
    if type(p) not in (int, float) or type(training) is not bool or not 0.0 <= p <= 1.0:  # type: ignore[operator]
        return None
    inplace = values.get("inplace", node.target is torch.dropout_)
    return values["input"], p, training, bool(inplace)  # type: ignore[return-value]


def eager_skips(node: torch.fx.Node) -> bool:
    """Whether eager execution would return this dropout's input unchanged (no copy, same tensor)."""
    return _skipped(_constant_dropout(node))


def _skipped(dropout: tuple[torch.fx.Node, float, bool, bool] | None) -> bool:
    return dropout is not None and (dropout[1] == 0 or not dropout[2])


def eager_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """ATen's CPU dropout, op for op: a noise tensor in the input's dtype, scaled there, and a product."""
    if p == 0 or not training or input.numel() == 0:
        return input
    if p == 1:
        zero = torch.zeros((), dtype=input.dtype, device=input.device)
        return input.mul_(zero) if inplace else input * zero
    noise = torch.empty_like(input).bernoulli_(1 - p).div_(1 - p)
    return input.mul_(noise) if inplace else input * noise


def _half_precision_cpu(node: torch.fx.Node) -> bool:
    value = node.meta.get("example_value")
    return (isinstance(value, torch.Tensor) and value.device.type == "cpu"
            and value.dtype in (torch.bfloat16, torch.float16))


def use_eager_dropouts(gm: torch.fx.GraphModule) -> int:
    """Make each dropout of a CPU tensor in half precision eager's ops; returns how many were changed."""
    changed = 0
    for node in gm.graph.nodes:
        dropout = _constant_dropout(node)
        if dropout is None or not _half_precision_cpu(dropout[0]):
            continue
        node.target, node.args, node.kwargs = eager_dropout, dropout, {}
        changed += 1
    if changed:
        gm.recompile()
    return changed


def drop_skipped_dropouts(gm: torch.fx.GraphModule) -> int:
    """Replace each dropout eager would skip by its input; returns how many were replaced."""
    replaced = 0
    for node in list(gm.graph.nodes):
        dropout = _constant_dropout(node)
        if dropout is not None and _skipped(dropout):
            node.replace_all_uses_with(dropout[0])
            gm.graph.erase_node(node)
            replaced += 1
    if replaced:
        gm.recompile()
    return replaced
