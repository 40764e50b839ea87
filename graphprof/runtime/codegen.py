"""Executable code for captured graphs, with the least Python per node.

fx's generated ``forward`` calls ``torch.ops.aten.addmm.default(...)``: an
attribute chain and ``OpOverload.__call__``, a Python frame, before the C++
entry point. On steps of many small ops that Python is a real part of the
step (and of what a node's time measures). Here each op's C++ entry point
(``OpOverload._op``) and every non-literal constant is bound as a global of
the generated function, so a node is one call and one store; values are
deleted after their last use, as fx does, so memory behaves the same.

An op whose kernel reads grad mode runs with the mode it was captured in
(capture/grad_mode.py). Only flat graphs of placeholder, get_attr, call_function and output nodes
(what make_fx and AOTAutograd produce) are compiled; anything else keeps
fx's own code.

``compile_graph(gm, constants=...)`` binds other tensors in place of some
``get_attr`` attributes: the workspace measurement (runtime/workspace.py)
runs the graph on copies of the state it writes, never on the user's.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping

import torch
import torch.fx

from graphprof.capture.grad_mode import needs_grad_mode, with_grad_mode

log = logging.getLogger("graphprof")
_LITERALS = (bool, int, str, type(None))
_SUPPORTED = {"placeholder", "get_attr", "call_function", "output"}


class _Source:
    """Builds the function's text and the globals it needs."""

    def __init__(self) -> None:
        self.globals: dict[str, Any] = {}
        self.names: dict[torch.fx.Node, str] = {}

    def bind(self, value: Any, hint: str) -> str:
        name = f"_{hint}{len(self.globals)}"
        self.globals[name] = value
        return name

    def render(self, value: Any) -> str:
        if isinstance(value, torch.fx.Node):
            return self.names[value]
        if isinstance(value, tuple):
            inner = ", ".join(self.render(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, list):
            return "[" + ", ".join(self.render(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {self.render(v)}" for k, v in value.items()) + "}"
        if type(value) in _LITERALS or (type(value) is float and math.isfinite(value)):
            return repr(value)
        return self.bind(value, "k")  # dtypes, devices, layouts, inf, nan, ...


def _target(node: torch.fx.Node) -> Any:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target._op
    if needs_grad_mode(node):  # its kernel reads grad mode (capture/grad_mode.py)
        return with_grad_mode(target)  # type: ignore[arg-type]  # call_function nodes
    return target


def is_compilable(gm: torch.fx.GraphModule) -> bool:
    """Whether ``compile_graph`` makes its own code for ``gm`` (a flat graph) instead of returning ``gm``."""
    return all(n.op in _SUPPORTED for n in gm.graph.nodes)


def compile_graph(gm: torch.fx.GraphModule, constants: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A function equivalent to ``gm.forward`` (without ``self``), or ``gm`` if the graph is unusual.

    ``constants`` (attribute name -> value) replaces those ``get_attr``
    values in the generated code; it needs a graph ``is_compilable`` accepts.
    """
    nodes = list(gm.graph.nodes)
    if not is_compilable(gm):
        if constants:
            raise ValueError("constants can only be replaced in a flat graph")
        return gm
    constants = constants or {}
    src = _Source()
    last_use: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in nodes:
        for used in node.all_input_nodes:
            last_use[used] = node
    to_free: dict[torch.fx.Node, list[str]] = {}
    params, body = [], []
    line_nodes: list[torch.fx.Node | None] = [None]  # per line of the text (the first: ``def``)
    for i, node in enumerate(nodes):
        name = f"v{i}"
        src.names[node] = name
        if node.op == "placeholder":
            params.append(name)
        elif node.op == "get_attr":
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            value = constants.get(node.target, value)
            body.append(f"    {name} = {src.bind(value, 'a')}")
        elif node.op == "call_function":
            fn = src.bind(_target(node), "f")
            args = [src.render(a) for a in node.args]
            args += [f"{k}={src.render(v)}" for k, v in node.kwargs.items()]
            body.append(f"    {name} = {fn}({', '.join(args)})")
        else:  # output
            body.append(f"    return {src.render(node.args[0])}")
        for used in node.all_input_nodes:
            if node.op != "output" and used in last_use and last_use[used] is node:
                to_free.setdefault(node, []).append(src.names[used])
        if node in to_free:
            body.append(f"    del {', '.join(to_free[node])}")
        if not node.users and node.op not in ("output", "placeholder"):
            body.append(f"    del {name}")
        line_nodes += [node] * (len(body) - len(line_nodes) + 1)
    text = f"def graph({', '.join(params)}):\n" + "\n".join(body) + "\n"
    namespace = dict(src.globals)
    try:
        exec(compile(text, "<graphprof graph>", "exec"), namespace)
    except SyntaxError as exc:  # never expected; keep fx's code rather than fail the user's step
        if constants:  # fx's code would read the real attributes, not the replacements
            raise ValueError(f"graph code did not compile ({exc})") from exc
        log.debug("graphprof: codegen fell back to fx (%s)", exc)
        return gm
    fn = namespace["graph"]
    fn.__graphprof_source__ = text
    fn.__graphprof_nodes__ = tuple(line_nodes)  # which node a line runs: a failed replay's traceback
    return fn
