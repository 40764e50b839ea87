"""The value prefixes of one graph's guards, run as one pass in graph order on each call.

Why: RAdam with ``foreach=True`` (the default on a GPU) reads each
parameter's step count three times with ``.item()`` and branches on the
result twice (``rho_t > 5``, ``rect > 0``). Each read carries its own prefix
(``value_guards.ValuePrefix``: copy the count, advance the copy, read it),
and the check ran a prefix at every occurrence of its read in every guard:
2,400 runs of 600 prefixes per call on a 200-parameter model, ten times the
eager step. Run together, each node runs once per call: the prefixes' nodes,
merged and in the graph's order, advance each counter once on its copy, and
a read's value is taken from the pass when a guard first asks for it.

Why it computes what each prefix alone computes: a prefix's nodes are pure
tensor ops on the call's inputs and the capture's constants (value guards
refuse random ops, host calls and reads of state other than counters), and
the only things they write in place are tensors they made and copies of
counters. Every writer of a tensor a prefix reads is part of that prefix,
and the pass runs every node in graph order, so each node sees what it saw
in its own prefix. A foreach advance cut down to one prefix's counters is
cut down to the counters of all of them.

The pass runs lazily (up to the node a guard needs), so a call whose first
guard breaks does not pay for the rest; an error anywhere in the pass breaks
the guard being checked, which then captures anew, as an error in that
guard's own prefix did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from graphprof.capture.prefix_nodes import (
    Arguments, arguments, call_inputs, run_node, same_attribute, sliced_call, storage_key, writes,
)
from graphprof.capture.value_guards import ValuePrefix


class SharedPrefixes:
    """The union of some prefixes' nodes, in graph order, with what a pass over them needs."""

    def __init__(self, nodes: tuple[torch.fx.Node, ...], leaves: tuple[tuple[torch.fx.Node, int], ...],
                 constants: dict[torch.fx.Node, Any], calls: dict[torch.fx.Node, Arguments],
                 copies: dict[torch.fx.Node, tuple[tuple[torch.fx.Node, ...], ...]]) -> None:
        self.nodes = nodes
        self.leaves = leaves  # each placeholder with its position among the call's flattened values
        self.constants = constants
        self.calls = calls  # foreach advances cut down to the counters the prefixes read
        self.copies = copies  # counter advances, with the nodes reading each counter
        self._index = {node: i for i, node in enumerate(nodes)}

    @classmethod
    def of(cls, prefixes: Sequence[ValuePrefix], positions: dict[torch.fx.Node, int]) -> SharedPrefixes | None:
        """The prefixes as one pass; None when one reads a placeholder that is not among the call's
        flattened values, or a counter advance would read a node no prefix has (then each runs alone)."""
        if not prefixes:
            return None
        graph = prefixes[0].nodes[-1].graph
        order = {node: i for i, node in enumerate(graph.nodes)}
        members = set().union(*(p.nodes for p in prefixes))
        if any(node.graph is not graph or node.op == "placeholder" and node not in positions for node in members):
            return None
        # A constant the capture replaced by a reader node is no longer in the graph; it runs nowhere
        # (the pass starts with the constants' values), so it may stand first.
        nodes = tuple(sorted(members, key=lambda node: order.get(node, -1)))
        read = {storage_key(n) for n in nodes}
        calls: dict[torch.fx.Node, Arguments] = {}
        copies: dict[torch.fx.Node, tuple[tuple[torch.fx.Node, ...], ...]] = {}
        for node in dict.fromkeys(node for p in prefixes for node, _ in p.increments):
            cut = sliced_call(node, read)
            if not set(call_inputs(node, cut)) <= members:
                return None
            if cut is not None:
                calls[node] = arguments(cut)
            copies[node] = tuple(same_attribute(w, nodes) for w in writes(node, cut))
        constants = {node: value for p in prefixes for node, value in p.constants}
        leaves = tuple((node, positions[node]) for node in nodes if node.op == "placeholder")
        return cls(nodes, leaves, constants, calls, copies)

    def end(self, prefix: ValuePrefix) -> int:
        """Where ``prefix``'s value node stands in the pass."""
        return self._index[prefix.nodes[-1]]

    def begin(self, leaves: list[Any]) -> PrefixPass:
        """A pass over one call's flattened values (nothing runs until a value is asked for)."""
        env = dict(self.constants)
        for node, position in self.leaves:
            env[node] = leaves[position]
        return PrefixPass(self, env)


class PrefixPass:
    """One call's pass: the nodes run so far and their values."""

    __slots__ = ("shared", "env", "copied", "done")

    def __init__(self, shared: SharedPrefixes, env: dict[torch.fx.Node, Any]) -> None:
        self.shared = shared
        self.env = env
        self.copied: set[torch.fx.Node] = set()
        self.done = 0  # the nodes before this index have run

    def value(self, end: int, prefix: ValuePrefix) -> Any:
        """``prefix``'s value on this call (its value node stands at ``end``), running the pass that far."""
        if self.done <= end:
            shared, env, copied = self.shared, self.env, self.copied
            with torch.no_grad():
                for node in shared.nodes[self.done:end + 1]:
                    if node not in env:
                        run_node(node, env, shared.calls.get(node), shared.copies.get(node), copied)
            self.done = end + 1
        return prefix.convert(self.env[prefix.nodes[-1]])
