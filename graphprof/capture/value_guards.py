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
It is evaluated in ``CapturedPaths.select`` (tracing/captured_paths.py) before a replay runs anything, like
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
from graphprof.capture.prefix_nodes import (
    Arguments, Call, alias_root, arguments, call_inputs, run_node, same_attribute, sliced_call, storage_key, writes,
)
from graphprof.capture.scalars import READ_DURING_STEP, DataDependentError, Guard
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
    #: Foreach counter advances cut down to the counters the value reads (``sliced_call``).
    sliced: tuple[tuple[torch.fx.Node, Call], ...] = ()

    @functools.cached_property
    def _copies(self) -> dict[torch.fx.Node, tuple[tuple[torch.fx.Node, ...], ...]]:
        return dict(self.increments)

    @functools.cached_property
    def _calls(self) -> dict[torch.fx.Node, Arguments]:
        return {node: arguments(call) for node, call in self.sliced}

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
                if node not in env:
                    run_node(node, env, self._calls.get(node), self._copies.get(node), copied)
            return self.convert(env[self.nodes[-1]])


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
        #: Each op node's written arguments and their storages (``_written``): a prefix is found for every
        #: ``.item()``, each looking at every earlier node for writes, on a graph that only grows.
        self._writes_of: dict[torch.fx.Node, tuple[list[torch.fx.Node], frozenset[Any]]] = {}

    def read(self, func: Any, tensor: torch.Tensor, where: str) -> Any:
        """The real value of ``func(tensor)``, kept as a guard; DataDependentError when none can be kept."""
        return self._guard(tensor, *VALUE_READS[func], where)

    def constant_number(self, tensor: torch.Tensor) -> Any:
        """The value of a one-element ``tensor`` computed from the capture's constants alone (no input,
        no state, nothing random): the same on every call, so no guard. None for any other tensor."""
        node = self.tensor_node(tensor)
        if not isinstance(node, torch.fx.Node) or tensor.numel() != 1:
            return None
        prefix, _ = self.prefix(node, _item, "a tensor read as a number")
        if prefix is None or prefix.placeholders or prefix.increments or any(
                self._refusal(n, False) for n, _ in prefix.constants):
            return None
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            return tensor.item()

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
                todo.extend(call_inputs(node, sliced.get(node)))
            read = {storage_key(n) for n in needed}
            for node in self.graph.nodes:  # a tensor the prefix reads, written before the branch
                if node.op != "call_function" or node in needed:
                    continue
                written, keys = self._written(node)
                if keys.isdisjoint(read):
                    continue
                if state_counters and all(w.op == "get_attr" and not self._refusal(w, True) for w in written):
                    cut = sliced_call(node, read)  # foreach ``_foreach_add_(steps, 1)``: the counters' own advance
                    if cut is not None:
                        sliced[node] = cut
                    todo.append(node)
                    continue
                return None, f"depends on a tensor the step writes in place earlier ({node.target})"
        nodes = tuple(sorted(needed))  # in graph order (fx nodes compare by their place in the graph)
        increments = []
        for node in nodes:  # the prefix itself may write only tensors it made, and counters it copies
            written = writes(node, sliced.get(node))
            kept = [w for w in written if alias_root(w).op in ("placeholder", "get_attr")]
            if kept and state_counters and all(w.op == "get_attr" and not self._refusal(w, True) for w in kept):
                increments.append((node, tuple(same_attribute(w, nodes) for w in written)))  # run on a copy
            elif kept:
                return None, f"writes in place into an input ({node.target})"
        placeholders = tuple(n for n in nodes if n.op == "placeholder")
        constants = tuple((n, self._attr(n)) for n in nodes if n.op == "get_attr")
        label = f"{what} computed from inputs by {sum(n.op == 'call_function' for n in nodes)} ops"
        return (ValuePrefix(nodes, placeholders, constants, convert, label, tuple(increments), tuple(sliced.items())),
                "")

    def _written(self, node: torch.fx.Node) -> tuple[list[torch.fx.Node], frozenset[Any]]:
        """The arguments ``node`` writes in place and the storages they share (``storage_key``)."""
        found = self._writes_of.get(node)
        if found is None:
            written = writes(node)
            found = self._writes_of[node] = (written, frozenset(map(storage_key, written)))
        return found

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
        during = node.meta.get(READ_DURING_STEP)
        if during is not None:  # read after the step changed it, or a clock: not known before the replay
            return f"depends on {during}"
        if node.meta.get(_READER) or getattr(target, "__module__", None) in ("_operator", "operator"):
            return ""  # a Python input read at run time, or arithmetic on inputs
        return f"depends on a host call ({getattr(target, '__name__', target)})"
