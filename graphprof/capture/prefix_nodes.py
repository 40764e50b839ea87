"""The graph facts a value guard's prefix is built from, and how a check runs one of its nodes.

Why apart from ``value_guards``: a prefix is built once, at capture
(``value_guards.ValuePrefix``), but run on every call, alone or with the
other prefixes of the same check (``shared_prefixes``). Both need the same
answers about a node (what it writes in place, what storage it shares, how a
foreach advance of kept counters is cut down) and must run a node the same
way (a counter the step advances is advanced on a copy).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

#: An op node's arguments as a check runs it: (args, kwargs as (name, value) pairs).
Call = tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]]
#: The same, keyword arguments as a dict: how a check passes them when it runs the node.
Arguments = tuple[tuple[Any, ...], dict[str, Any]]


def arguments(call: Call) -> Arguments:
    """``call`` as a check runs it (its keyword arguments a dict)."""
    return call[0], dict(call[1])


def writes(node: torch.fx.Node, call: Call | None = None) -> list[torch.fx.Node]:
    """The argument nodes an op writes in place (``add_``, ``out=``), of ``call`` if given."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    args, kwargs = (node.args, node.kwargs) if call is None else (call[0], dict(call[1]))
    written = []
    for i, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        if isinstance(value, torch.fx.Node):
            written.append(value)
        elif isinstance(value, (list, tuple)):  # ``_foreach_add_(steps, 1)``: every tensor of the list
            written.extend(v for v in value if isinstance(v, torch.fx.Node))
    return written


def sliced_call(node: torch.fx.Node, read: set[Any]) -> Call | None:
    """A foreach op's call cut down to the items whose written tensor the prefix reads, or None when it
    reads them all. Why: RAdam advances every parameter's count in one ``_foreach_add_`` and guards
    each parameter's ``rho_t > 5`` on its own count; each guard ran the whole list, on copies of every
    count (a 200-parameter model's check took seconds per call)."""
    written = next((a for a in node.args if isinstance(a, (list, tuple)) and a and all(
        isinstance(v, torch.fx.Node) for v in a) and set(a) <= set(writes(node))), None)
    if written is None:
        return None
    keep = [i for i, w in enumerate(written) if storage_key(w) in read]
    if len(keep) == len(written):
        return None

    def cut(value: Any) -> Any:
        return tuple(value[i] for i in keep) if isinstance(value, (list, tuple)) and len(value) == len(written) \
            else value

    return tuple(cut(a) for a in node.args), tuple((k, cut(v)) for k, v in node.kwargs.items())


def call_inputs(node: torch.fx.Node, call: Call | None) -> list[torch.fx.Node]:
    """The nodes ``node`` reads, as ``call`` gives its arguments if given."""
    if call is None:
        return node.all_input_nodes
    found: list[torch.fx.Node] = []
    torch.fx.map_arg(call, lambda n: found.append(n) or n)  # type: ignore[func-returns-value]
    return found


def storage_key(node: torch.fx.Node) -> Any:
    """What identifies the storage ``node`` shares: its alias root, or for a kept tensor the attribute's
    name (the graph reads one attribute through a get_attr node per use)."""
    root = alias_root(node)
    return ("attr", root.target) if root.op == "get_attr" else root


def same_attribute(written: torch.fx.Node, nodes: tuple[torch.fx.Node, ...]) -> tuple[torch.fx.Node, ...]:
    """``written`` and, for a kept tensor, the other get_attr nodes of ``nodes`` reading its attribute."""
    if written.op != "get_attr":
        return (written,)
    return (written, *(n for n in nodes if n.op == "get_attr" and n.target == written.target and n is not written))


def alias_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` shares (through views and in-place results)."""
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.args:
        first = node.args[0]
        schema = node.target._schema
        aliases = schema.returns and schema.returns[0].alias_info is not None
        if not aliases or not isinstance(first, torch.fx.Node):
            break
        node = first
    return node




def read_kept(arguments: Any, env: dict[torch.fx.Node, Any]) -> None:
    """Read, into ``env``, the nodes in a node's ``arguments`` that are reader nodes (calls without
    arguments)."""
    def read(arg: torch.fx.Node) -> torch.fx.Node:
        if arg not in env:
            if arg.op != "call_function" or arg.args or arg.kwargs:
                raise KeyError(arg)
            env[arg] = arg.target()  # type: ignore[operator]
        return arg
    torch.fx.map_arg(arguments, read)


def run_node(node: torch.fx.Node, env: dict[torch.fx.Node, Any], call: Arguments | None,
             copies: tuple[tuple[torch.fx.Node, ...], ...] | None, copied: set[torch.fx.Node]) -> None:
    """Run ``node`` (a call_function node) on the values in ``env``, into ``env``; with the arguments
    ``call`` gives (keyword arguments as a dict) where given. ``copies``: the counters it advances in
    place, each with the other nodes that read the same attribute; they are copied first (once per
    ``copied``), so that the check computes what the step will read without changing what it will find."""
    node_args, node_kwargs = call or (node.args, node.kwargs)
    if copies is not None:
        read_kept((node_args, node_kwargs), env)
        for same in copies:  # the counter as the call finds it, written on a copy
            if same[0] not in copied:
                clone = env[same[0]].clone()
                for reader in same:
                    env[reader] = clone
                    copied.add(reader)
    try:
        args = torch.fx.map_arg(node_args, env.__getitem__)
        kwargs = torch.fx.map_arg(node_kwargs, env.__getitem__)
    except KeyError:  # a constant the capture then replaced by a node reading it where it is kept
        read_kept((node_args, node_kwargs), env)
        args = torch.fx.map_arg(node_args, env.__getitem__)
        kwargs = torch.fx.map_arg(node_kwargs, env.__getitem__)
    env[node] = node.target(*args, **kwargs)  # type: ignore[operator, arg-type]  # call_function nodes
