"""Checking a captured graph's guards on a call's own values, before the replay touches anything.

A guard (capture/guards.py) is ``op(*operands) == expected`` as seen during
the capture call; its operands are the call's number or tensor arguments
(placeholders), reads of the user's Python state (reader nodes), Python
arithmetic on those (``operator.*`` nodes), ``.item()`` values recomputed
from tensor inputs (a ``ValuePrefix``, capture/value_guards.py) and
constants. Every replay checks every guard first (``CapturedPaths.select`` (tracing/captured_paths.py)).

Walking the operand nodes on every call (dict lookups, ``node.meta``, a
Python call per node) cost more than the checks themselves on a step of tiny
ops. ``compile_guards`` therefore writes the walk out once, after the capture,
as straight-line Python: the same operations on the same objects, in the
same order, with an exception while computing a guard meaning that guard is
broken, as before. Reads of the user's Python state and the arithmetic on
them are done at every occurrence (nothing is cached between guards or
calls: a read returns whatever the user's state holds now). The tensor
values recomputed from the call's inputs are not reads of anything the user
can change during the check: the prefixes of all the guards run as one pass
(``shared_prefixes``), each node once per call, and a value asked for again
is the one already computed.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch.fx

from graphprof.capture.scalars import Guard
from graphprof.capture.shared_prefixes import SharedPrefixes
from graphprof.capture.value_guards import VALUE_PREFIX, ValuePrefix


class _Writer:
    """The check's lines and the objects its code names (bound as globals of the generated function)."""

    def __init__(self, positions: dict[torch.fx.Node, int], shared: SharedPrefixes | None) -> None:
        self.positions = positions
        self.globals: dict[str, Any] = {}
        self.lines: list[str] = []
        self._temps = 0
        self.shared = shared
        #: The name holding each prefix's value once a guard computed it (with ``shared``).
        self._prefix_values: dict[int, str] = {}

    def bind(self, value: Any) -> str:
        name = f"_k{len(self.globals)}"
        self.globals[name] = value
        return name

    def temp(self) -> str:
        self._temps += 1
        return f"v{self._temps}"

    def prefix_value(self, prefix: ValuePrefix, indent: str) -> str:
        """Emit, the first time it is asked for, the statement taking ``prefix``'s value from the call's
        pass (started before the first one); the name holding it."""
        assert self.shared is not None
        name = self._prefix_values.get(id(prefix))
        if name is None:
            if not self._prefix_values:
                self.lines.append(f"{indent}prefixes = {self.bind(self.shared.begin)}(leaves)")
            name = self._prefix_values[id(prefix)] = self.temp()
            self.lines.append(f"{indent}{name} = prefixes.value({self.shared.end(prefix)}, {self.bind(prefix)})")
        return name

    def operand(self, operand: Any, indent: str) -> str:
        """Emit statements computing ``operand`` for this call; returns the name holding it.

        Mirrors the interpretation it replaces: a placeholder is the call's own
        leaf, an ``.item()`` node with a prefix recomputes it from its inputs,
        any other node is its target called on its evaluated arguments
        (keyword arguments were never passed), anything else is the constant.
        Arguments are computed left to right before their call, each
        occurrence anew; the walk keeps its own stack, so a long chain of
        arithmetic (a counter incremented in a loop) has no depth limit.
        """
        names: list[str] = []
        todo: list[tuple[Any, bool]] = [(operand, False)]
        while todo:
            item, ready = todo.pop()
            if not isinstance(item, torch.fx.Node):
                names.append(self.bind(item))
                continue
            if item in self.positions:
                out = self.temp()
                self.lines.append(f"{indent}{out} = leaves[{self.positions[item]}]")
                names.append(out)
                continue
            prefix = item.meta.get(VALUE_PREFIX)
            if prefix is not None and self.shared is not None:
                names.append(self.prefix_value(prefix, indent))
                continue
            call, args = (prefix, prefix.placeholders) if prefix is not None else (item.target, item.args)
            if not ready:  # its arguments first, then itself
                todo.append((item, True))
                todo.extend((a, False) for a in reversed(args))
                continue
            values = names[len(names) - len(args):]
            del names[len(names) - len(args):]
            out = self.temp()
            self.lines.append(f"{indent}{out} = {self.bind(call)}({''.join(v + ', ' for v in values)})")
            names.append(out)
        return names[-1]


class GuardCheck:
    """The compiled check of one graph's guards: ``broken(leaves)`` is the first guard that fails, or None."""

    def __init__(self, guards: Sequence[Guard], positions: dict[torch.fx.Node, int]) -> None:
        self.guards = tuple(guards)
        self._first_broken = _compile(self.guards, positions)

    def broken(self, leaves: list[Any]) -> Guard | None:
        index = self._first_broken(leaves)
        return None if index < 0 else self.guards[index]


def _compile(guards: tuple[Guard, ...], positions: dict[torch.fx.Node, int]) -> Callable[[list[Any]], int]:
    """``def check(leaves)``: the index of the first guard this call breaks, or -1."""
    prefixes = prefixes_of(guards)
    writer = _Writer(positions, None if prefixes is None else SharedPrefixes.of(prefixes, positions))
    lines = writer.lines
    lines.append("def check(leaves):")
    for i, guard in enumerate(guards):
        lines.append("    try:")
        if isinstance(guard.op, ValuePrefix) and writer.shared is not None:  # a branch on a value from inputs
            lines.append(f"        outcome = {writer.prefix_value(guard.op, '        ')}")
        else:
            names = [writer.operand(o, "        ") for o in guard.operands]
            lines.append(f"        outcome = {writer.bind(guard.op)}({''.join(n + ', ' for n in names)})")
        lines.append("    except Exception:")
        lines.append(f"        return {i}")
        expected = writer.bind(guard.expected)
        # The outcome must have the captured type too: 1 == True, but a branch on 1 is not one on True.
        lines.append(f"    if type(outcome) is not type({expected}) or outcome != {expected}:")
        lines.append(f"        return {i}")
    lines.append("    return -1")
    namespace = dict(writer.globals)
    exec(compile("\n".join(lines), "<graphprof guards>", "exec"), namespace)  # noqa: S102 - our own generated text
    return namespace["check"]  # type: ignore[no-any-return]


def prefixes_of(guards: Sequence[Guard]) -> list[ValuePrefix] | None:
    """The value prefixes the guards compute: guards' own (a branch on a value from inputs) and those of
    the ``.item()`` reads among their operands, each once; None when one is another callable (each
    then runs alone, as it is)."""
    found: dict[int, ValuePrefix] = {}
    seen: set[torch.fx.Node] = set()
    todo: list[Any] = []
    for guard in guards:
        if isinstance(guard.op, ValuePrefix):
            found.setdefault(id(guard.op), guard.op)
        todo.extend(guard.operands)
    while todo:
        item = todo.pop()
        if not isinstance(item, torch.fx.Node) or item in seen:
            continue
        seen.add(item)
        prefix = item.meta.get(VALUE_PREFIX)
        if prefix is None:
            todo.extend(item.args)
        elif not isinstance(prefix, ValuePrefix):
            return None
        else:
            found.setdefault(id(prefix), prefix)
    return list(found.values())
