"""Branches on tensor values computed from the step's inputs: value guards.

Library code decides things from the data: transformers asks
``padding_mask.all()`` to skip building an attention mask when a batch has
no padding, and its answer changes which ops run. A static graph holds one
answer. When Python reads a tensor's value during capture (``bool(t)``,
``int(t)``, ``float(t)``, ``t.__index__()``) and that value depends only on
the step's inputs, the read is allowed: it returns the real value and records
a ``Guard`` whose check recomputes the value from the call's own inputs.

The check is the *prefix* of the graph that computes the value: the nodes
``t`` depends on, from the step's inputs (tensor and number arguments,
numbers the step reads from its own objects) and constants the trace made.
It is evaluated in ``tracing._select`` before a replay runs anything, like
guards on input scalars; a different outcome selects or captures another
path, so a failed guard never leaves the user's state half-updated. A value
that a prefix cannot reproduce before the step refuses the capture, naming
why: it reads parameters, gradients or large buffers or optimizer state,
draws random numbers, calls the host, or reads a tensor the step wrote in
place before the branch.

A branch on a counter or flag the model or optimizer keeps as a tensor of at
most ``STATE_COUNTER_NUMEL`` elements (``AveragedModel.n_averaged``, asked
``== 0`` on every update) reads it in the check as the call finds it: the graph
reads that very tensor at that point, since nothing wrote it earlier in the
step, and the per-call checks make sure it is still the same tensor. A
prefix that read the parameters would run the forward pass again before
every replay.

A tensor the graph reads where it is kept (a closure's ``w``, a buffer the
step replaces), a reader node in place of its constant, the check reads
there too, as the replay will. It used to fail on that node, so every call
captured again, and after five a ``capture="fx"`` step raised.

The library is not told it is being traced (``is_tracing`` stays False), so
the profile is of the program eager runs.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from graphprof.capture.host_reads import original
from graphprof.capture.scalars import DataDependentError, Guard
from graphprof.capture.state import StateIndex
from graphprof.passes.records import STATE, StateRole

#: The most elements a model's or optimizer's state tensor may have to be read by a value guard's check.
STATE_COUNTER_NUMEL = 1

#: Host reads of a tensor's value that a value guard can stand for, and how each converts.
VALUE_READS: dict[Any, tuple[str, Callable[[Any], Any]]] = {
    original(torch.Tensor.__bool__): ("branching on a tensor", bool),
    original(torch.Tensor.__int__): ("int() of a tensor", int),
    original(torch.Tensor.__float__): ("float() of a tensor", float),
    original(torch.Tensor.__index__): ("using a tensor as an index", operator.index),
}
_READER = "graphprof_input_reader"
#: On an ``.item()`` node whose tensor is computed from inputs: the prefix that recomputes it.
VALUE_PREFIX = "graphprof.value_prefix"


#: An op node's arguments as a check runs it: (args, kwargs as (name, value) pairs).
Call = tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]]


def _writes(node: torch.fx.Node, call: Call | None = None) -> list[torch.fx.Node]:
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


def _sliced(node: torch.fx.Node, read: set[Any]) -> Call | None:
    """A foreach op's call cut down to the items whose written tensor the prefix reads, or None when it
    reads them all. Why: RAdam advances every parameter's count in one ``_foreach_add_`` and guards
    each parameter's ``rho_t > 5`` on its own count; each guard ran the whole list, on copies of every
    count (a 200-parameter model's check took seconds per call)."""
    written = next((a for a in node.args if isinstance(a, (list, tuple)) and a and all(
        isinstance(v, torch.fx.Node) for v in a) and set(a) <= set(_writes(node))), None)
    if written is None:
        return None
    keep = [i for i, w in enumerate(written) if _storage_key(w) in read]
    if len(keep) == len(written):
        return None

    def cut(value: Any) -> Any:
        return tuple(value[i] for i in keep) if isinstance(value, (list, tuple)) and len(value) == len(written) \
            else value

    return tuple(cut(a) for a in node.args), tuple((k, cut(v)) for k, v in node.kwargs.items())


def _inputs(node: torch.fx.Node, call: Call | None) -> list[torch.fx.Node]:
    """The nodes ``node`` reads, as ``call`` gives its arguments if given."""
    if call is None:
        return node.all_input_nodes
    found: list[torch.fx.Node] = []
    torch.fx.map_arg(call, lambda n: found.append(n) or n)  # type: ignore[func-returns-value]
    return found


def _expression(node: torch.fx.Node, depth: int) -> str:
    if node.op == "placeholder":
        record = node.meta.get(STATE)
        return record.name if record is not None else node.name
    if node.op == "get_attr":
        return str(node.target)
    if depth >= 4:
        return "..."
    target = node.target
    name = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else getattr(
        target, "__name__", str(target))
    parts = [_expression(a, depth + 1) if isinstance(a, torch.fx.Node) else repr(a) for a in node.args
             if not isinstance(a, (list, tuple)) or not a]
    return f"{name}({', '.join(parts)})"


def _storage_key(node: torch.fx.Node) -> Any:
    """What identifies the storage ``node`` shares: its alias root, or for a kept tensor the attribute's
    name (the graph reads one attribute through a get_attr node per use)."""
    root = _alias_root(node)
    return ("attr", root.target) if root.op == "get_attr" else root


def _same_attribute(written: torch.fx.Node, nodes: tuple[torch.fx.Node, ...]) -> tuple[torch.fx.Node, ...]:
    """``written`` and, for a kept tensor, the other get_attr nodes of ``nodes`` reading its attribute."""
    if written.op != "get_attr":
        return (written,)
    return (written, *(n for n in nodes if n.op == "get_attr" and n.target == written.target and n is not written))


def _alias_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` shares (through views and in-place results)."""
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.args:
        first = node.args[0]
        schema = node.target._schema
        aliases = schema.returns and schema.returns[0].alias_info is not None
        if not aliases or not isinstance(first, torch.fx.Node):
            break
        node = first
    return node


@dataclass(frozen=True)
class ValuePrefix:
    """The nodes that compute a value from the step's inputs, run again on a call's own inputs."""

    nodes: tuple[torch.fx.Node, ...]  # in graph order, the value's node last
    placeholders: tuple[torch.fx.Node, ...]  # the step's inputs it reads, in the order of call arguments
    constants: tuple[tuple[torch.fx.Node, Any], ...]  # get_attr nodes and the tensors the trace made
    convert: Callable[[Any], Any]
    label: str
    #: Nodes that advance a kept counter in place (``step_t += 1``, ``_foreach_add_(steps, 1)``), each
    #: with the nodes it writes: run on a copy of them, so that the check computes what the step will
    #: read without changing what it will find. A written counter comes with the other get_attr nodes
    #: of its attribute, which read it back and share its copy.
    increments: tuple[tuple[torch.fx.Node, tuple[tuple[torch.fx.Node, ...], ...]], ...] = ()
    #: Foreach counter advances cut down to the counters the value reads (``_sliced``).
    sliced: tuple[tuple[torch.fx.Node, Call], ...] = ()

    @functools.cached_property
    def _copies(self) -> dict[torch.fx.Node, tuple[tuple[torch.fx.Node, ...], ...]]:
        return dict(self.increments)

    @functools.cached_property
    def _calls(self) -> dict[torch.fx.Node, tuple[tuple[Any, ...], dict[str, Any]]]:
        return {node: (args, dict(kwargs)) for node, (args, kwargs) in self.sliced}

    @property
    def __name__(self) -> str:
        return self.label

    def expression(self) -> str:
        """The checked value as an expression over the step's inputs: ``bool(all(input1))``."""
        return f"{getattr(self.convert, '__name__', 'value')}({_expression(self.nodes[-1], 0)})"

    def __call__(self, *inputs: Any) -> Any:
        env: dict[torch.fx.Node, Any] = dict(zip(self.placeholders, inputs))
        env.update(self.constants)
        copied: set[torch.fx.Node] = set()
        with torch.no_grad():
            for node in self.nodes:
                if node in env:
                    continue
                node_args, node_kwargs = self._calls.get(node) or (node.args, node.kwargs)
                written = self._copies.get(node)
                if written is not None:
                    _read_kept((node_args, node_kwargs), env)
                    for same in written:  # the counter as the call finds it, written on a copy
                        if same[0] not in copied:
                            clone = env[same[0]].clone()
                            for reader in same:
                                env[reader] = clone
                                copied.add(reader)
                try:
                    args = torch.fx.map_arg(node_args, env.__getitem__)
                    kwargs = torch.fx.map_arg(node_kwargs, env.__getitem__)
                except KeyError:  # a constant the capture then replaced by a node reading it where it is kept
                    _read_kept((node_args, node_kwargs), env)
                    args = torch.fx.map_arg(node_args, env.__getitem__)
                    kwargs = torch.fx.map_arg(node_kwargs, env.__getitem__)
                env[node] = node.target(*args, **kwargs)  # type: ignore[operator]  # call_function nodes
            return self.convert(env[self.nodes[-1]])


def _read_kept(arguments: Any, env: dict[torch.fx.Node, Any]) -> None:
    """Read, into ``env``, the nodes in a node's ``arguments`` that are reader nodes (calls without
    arguments)."""
    def read(arg: torch.fx.Node) -> torch.fx.Node:
        if arg not in env:
            if arg.op != "call_function" or arg.args or arg.kwargs:
                raise KeyError(arg)
            env[arg] = arg.target()  # type: ignore[operator]
        return arg
    torch.fx.map_arg(arguments, read)


def _item(tensor: torch.Tensor) -> Any:
    return tensor.item()


def sizes(value: Any) -> tuple[Any, ...]:
    """A tensor's sizes, as a guard compares them; of an op's several outputs (``torch.unique`` gives
    the values, the inverse and the counts), each one's."""
    if isinstance(value, (tuple, list)):
        return tuple(sizes(v) for v in value if isinstance(v, torch.Tensor))
    return tuple(value.shape)


class ValueGuards:
    """Turns host reads of input-derived tensor values into guards during one capture."""

    def __init__(self, graph: torch.fx.Graph, root: nn.Module, tensor_node: Callable[[torch.Tensor], Any],
                 state: StateIndex, guards: list[Guard]) -> None:
        self.graph = graph
        self.root = root
        self.tensor_node = tensor_node
        self.state = state
        self.guards = guards

    def read(self, func: Any, tensor: torch.Tensor, where: str) -> Any:
        """The real value of ``func(tensor)``, kept as a guard; DataDependentError when none can be kept."""
        return self._guard(tensor, *VALUE_READS[func], where)

    def read_sizes(self, func: Any, args: tuple, kwargs: dict, where: str) -> Any:
        """``func(*args, **kwargs)``, a read of the sizes of ``args[0]``, a tensor sized by its data
        (capture/data_sizes.py): its sizes are kept as a guard, or DataDependentError."""
        self._guard(args[0], "reading the size of a tensor sized by its data", sizes, where)
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            return func(*args, **kwargs)

    def _guard(self, tensor: torch.Tensor, what: str, convert: Callable[[Any], Any], where: str) -> Any:
        node = self.tensor_node(tensor)
        if not isinstance(node, torch.fx.Node):
            raise DataDependentError(f"{what} at {where} reads a tensor's value on the host, "
                                     "which a static graph cannot replay")
        # A branch on a counter the model keeps (``if self.n_averaged == 0``) has one answer for many
        # calls; a number read from one would be guarded on its exact value, which changes every call.
        prefix, why_not = self.prefix(node, convert, what, state_counters=convert is bool)
        if prefix is None:
            raise DataDependentError(f"{what} at {where} reads a value that {why_not}, "
                                     "which a static graph cannot check before it runs")
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            value = convert(tensor)
        self.guards.append(Guard(prefix, prefix.placeholders, value, where))
        return value

    def mark_item(self, item: torch.fx.Node, tensor: torch.Tensor) -> tuple[bool, bool]:
        """Whether ``.item()`` of ``tensor`` (node ``item``) is computed from inputs alone, and else whether
        from inputs and one-element counters the model or optimizer keeps (``TracedScalar.counted``).

        Either way the node carries its prefix, so a guard on the number (``if
        mask.sum().item() > 0``, RAdam's ``if rho_t > 5.0`` on its step count)
        is checked like any guard on an input.
        """
        node = self.tensor_node(tensor)
        if not isinstance(node, torch.fx.Node):
            return False, False
        # One walk (it visits the whole graph, once per ``.item()``): a prefix that reads no counter and
        # advances none is what a walk without counters would have found.
        prefix, _ = self.prefix(node, _item, ".item()", state_counters=True)
        if prefix is None:
            return False, False
        item.meta[VALUE_PREFIX] = prefix
        from_inputs = not prefix.increments and not any(self._refusal(n, False) for n, _ in prefix.constants)
        return from_inputs, not from_inputs

    def prefix(self, value: torch.fx.Node, convert: Callable[[Any], Any],
               what: str, state_counters: bool = False) -> tuple[ValuePrefix | None, str]:
        """The nodes computing ``value`` from the step's inputs alone (and, with ``state_counters``,
        the model's and optimizer's one-element state tensors), or None and why not."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        needed: set[torch.fx.Node] = set()
        sliced: dict[torch.fx.Node, Call] = {}
        todo = [value]
        while todo:
            while todo:
                node = todo.pop()
                if node in needed:
                    continue
                needed.add(node)
                why_not = self._refusal(node, state_counters)
                if why_not:
                    return None, why_not
                todo.extend(_inputs(node, sliced.get(node)))
            read = {_storage_key(n) for n in needed}
            for node in self.graph.nodes:  # a tensor the prefix reads, written before the branch
                if node in needed or node.op != "call_function":
                    continue
                written = _writes(node)
                if not any(_storage_key(w) in read for w in written):
                    continue
                if state_counters and all(w.op == "get_attr" and not self._refusal(w, True) for w in written):
                    cut = _sliced(node, read)  # foreach ``_foreach_add_(steps, 1)``: the counters' own advance
                    if cut is not None:
                        sliced[node] = cut
                    todo.append(node)
                    continue
                return None, f"depends on a tensor the step writes in place earlier ({node.target})"
        nodes = tuple(sorted(needed, key=order.__getitem__))
        increments = []
        for node in nodes:  # the prefix itself may write only tensors it made, and counters it copies
            written = _writes(node, sliced.get(node))
            kept = [w for w in written if _alias_root(w).op in ("placeholder", "get_attr")]
            if kept and state_counters and all(w.op == "get_attr" and not self._refusal(w, True) for w in kept):
                increments.append((node, tuple(_same_attribute(w, nodes) for w in written)))  # run on a copy
            elif kept:
                return None, f"writes in place into an input ({node.target})"
        placeholders = tuple(n for n in nodes if n.op == "placeholder")
        constants = tuple((n, self._attr(n)) for n in nodes if n.op == "get_attr")
        label = f"{what} computed from inputs by {sum(n.op == 'call_function' for n in nodes)} ops"
        return (ValuePrefix(nodes, placeholders, constants, convert, label, tuple(increments), tuple(sliced.items())),
                "")

    def _attr(self, node: torch.fx.Node) -> Any:
        value: Any = self.root
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return value

    def _refusal(self, node: torch.fx.Node, state_counters: bool) -> str:
        """Why ``node`` cannot be part of a prefix run before the step, or ""."""
        if node.op == "placeholder":
            return ""
        if node.op == "get_attr":
            value = self._attr(node)
            if isinstance(value, nn.Parameter) or (isinstance(value, torch.Tensor) and self.state.describe(value)):
                record = self.state.describe(value)
                if (state_counters and record is not None and record.role in (StateRole.BUFFER, StateRole.OPTIMIZER_STATE)
                        and not isinstance(value, nn.Parameter) and value.numel() <= STATE_COUNTER_NUMEL):
                    return ""  # a counter or flag, read as the call finds it
                return f"depends on the model's or optimizer's state ({record.name if record else node.target})"
            return ""
        if node.op != "call_function":
            return f"depends on a {node.op} node"
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if torch.Tag.nondeterministic_seeded in target.tags:
                return f"depends on random numbers ({target})"
            return ""
        if node.meta.get(_READER) or getattr(target, "__module__", None) in ("_operator", "operator"):
            return ""  # a Python input read at run time, or arithmetic on inputs
        return f"depends on a host call ({getattr(target, '__name__', target)})"
