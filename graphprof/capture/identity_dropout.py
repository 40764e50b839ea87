"""Dropout that eager execution skips is skipped in segments too (no copy where eager makes none).

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


def eager_skips(node: torch.fx.Node) -> bool:
    """Whether eager execution would return this dropout's input unchanged (no copy, same tensor)."""
    if node.op != "call_function":
        return False
    values = _arguments(node)
    if values is None or not isinstance(values.get("input"), torch.fx.Node):
        return False
    p, training = values["p"], values.get("training", values.get("train"))
    if type(p) not in (int, float) or type(training) is not bool or not 0.0 <= p <= 1.0:  # type: ignore[operator]
        return False  # run-time values, or one eager rejects: AOTAutograd's graph does what eager does
    return p == 0 or not training


def drop_skipped_dropouts(gm: torch.fx.GraphModule) -> int:
    """Replace each dropout eager would skip by its input; returns how many were replaced."""
    replaced = 0
    for node in list(gm.graph.nodes):
        if eager_skips(node):
            values = _arguments(node)
            assert values is not None
            node.replace_all_uses_with(values["input"])  # type: ignore[arg-type]
            gm.graph.erase_node(node)
            replaced += 1
    if replaced:
        gm.recompile()
    return replaced
