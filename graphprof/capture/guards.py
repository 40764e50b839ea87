"""Guards: a question the step asked of its input numbers, and the answer a replay must get again.

Why a module of its own: a ``Guard`` is recorded by a traced number
(capture/scalars.py) each time the step branches on an input scalar, and is
checked before every replay (capture/guard_check.py). An optimizer asks the
same question once per parameter, so the capture keeps each distinct check
once (``distinct_guards``); telling two guards apart by what their operands
compute is this module's job. It depends on nothing of the capture, so the
traced number's module builds on it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch
import torch.fx


@dataclass(frozen=True)
class Guard:
    """``op(*operands) == expected`` held at capture; operands are scalar nodes or constants."""

    op: Callable[..., Any]
    operands: tuple[Any, ...]
    expected: Any
    where: str

    def describe(self) -> str:
        expression = getattr(self.op, "expression", None)  # a value guard (value_guards.py) says what it computes
        if expression is not None:
            return f"{expression()} == {self.expected!r} at {self.where}"
        names = [o.name if isinstance(o, torch.fx.Node) else repr(o) for o in self.operands]
        op = getattr(self.op, "__name__", str(self.op))
        return f"{op}({', '.join(names)}) == {self.expected!r} at {self.where}"

    @property
    def formats_text(self) -> bool:
        """A guard on the text of a number the step prints or formats (``TracedScalar._text``)."""
        return self.op is str or self.op is format or self.op is repr

    @property
    def holds_value(self) -> bool:
        """A guard on a number itself (``int(n)``, an index, ``float(x)``) or its text, rather than on a
        branch's outcome: it names one call's value, not a path (capture/refused_paths.py)."""
        return self.formats_text or self.op is int or self.op is float or self.op is operator.index

    def broken_reason(self) -> str:
        """Why a call that breaks this guard needs another graph, in the user's terms."""
        if self.formats_text:
            return f"a number the step prints or formats changed ({self.describe()})"
        return f"a branch took another way ({self.describe()})"


def distinct_guards(guards: list[Guard]) -> tuple[Guard, ...]:
    """The guards in order, each distinct check once.

    An optimizer step asks the same question of the same hyperparameter for
    every parameter (``momentum != 0``: 385 times on a 40-layer MLP; ``1 -
    dampening == 1``, a fresh ``sub`` node each time, 29 times on the demo
    ResNet), and every replay checks the guards before it runs: asked once,
    the answer is the same. Operands are compared by what they compute
    (``_operand_key``), and operand and expected types are part of the key,
    since a guard holds only when its outcome has the captured type.
    """
    seen: dict[Hashable, Guard] = {}
    kept: list[Guard] = []
    for guard in guards:
        try:
            key: Hashable = (guard.op, tuple(map(_operand_key, guard.operands)),
                             type(guard.expected), guard.expected)
            hash(key)
        except TypeError:  # an unhashable constant: kept as it is
            kept.append(guard)
            continue
        if key not in seen:
            seen[key] = guard
            kept.append(guard)
    return tuple(kept)


def _operand_key(operand: Any) -> Hashable:
    """What a guard operand computes: equal keys give equal values in one replay's check.

    Python arithmetic (``operator.*`` nodes) is keyed by its function and its
    operands' keys, so two ``sub`` nodes of the same reads are one; every
    other node (an input, a read of the user's state, an ``.item()`` recomputed
    from tensors) by its identity. Constants by type and value (``1`` is not ``True``).
    """
    if not isinstance(operand, torch.fx.Node):
        return (type(operand), operand)
    if operand.op == "call_function" and operand.target in _PURE_OPS and not operand.kwargs:
        return (operand.target, tuple(map(_operand_key, operand.args)))
    return operand


#: Python arithmetic and comparisons a TracedScalar records: no side effects, same operands, same value.
_PURE_OPS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.abs, operator.lt, operator.le, operator.gt,
    operator.ge, operator.eq, operator.ne, operator.not_, operator.truth, operator.and_, operator.or_,
    operator.xor, operator.invert, operator.lshift, operator.rshift, operator.index,
})
