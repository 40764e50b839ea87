"""Host scalars read from tensors during whole-step capture (``.item()``).

Why this exists: torch's Adam and AdamW read their step count with ``.item()``
and do the bias correction in Python floats. A static trace would bake that
float into the graph, and every later step would reuse step 2's correction.
Instead ``.item()`` returns a ``TracedScalar``: it carries the real value (so
the capture step computes exactly what eager does) and an fx node. Python
arithmetic on it records ``operator.*`` nodes, and when it reaches a torch op
as a scalar argument the op's node refers to that node. At replay the graph
therefore does the same ``_local_scalar_dense`` and the same float arithmetic
as eager Python: bitwise the same numbers, nothing baked.

Uses that a static graph cannot replay (branching on the value, printing it,
``float()``, ``math.sqrt``) raise ``DataDependentError`` at capture time, so
capture falls back or fails loudly instead of silently baking a constant.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch.fx


class DataDependentError(RuntimeError):
    """The function uses a tensor's value on the host in a way a static graph cannot replay."""


_Number = (int, float, bool)


class TracedScalar:
    """A Python number read from a tensor, with the fx node that computes it at replay."""

    __slots__ = ("value", "node", "_graph", "_where")

    def __init__(self, value: int | float | bool, node: torch.fx.Node, graph: torch.fx.Graph, where: str) -> None:
        self.value = value
        self.node = node
        self._graph = graph
        self._where = where

    # -- recording arithmetic ------------------------------------------------
    def _record(self, fn: Callable[..., Any], *operands: Any) -> "TracedScalar | Any":
        for op in operands:
            if not isinstance(op, (TracedScalar, *_Number)):
                return NotImplemented
        values = [op.value if isinstance(op, TracedScalar) else op for op in operands]
        result = fn(*values)
        args = tuple(op.node if isinstance(op, TracedScalar) else op for op in operands)
        node = self._graph.call_function(fn, args)
        node.meta["graphprof_scalar"] = True
        for op in operands:  # arithmetic belongs where its operand was read
            if isinstance(op, TracedScalar) and "graphprof.capture" in op.node.meta:
                node.meta["graphprof.capture"] = op.node.meta["graphprof.capture"]
                break
        return TracedScalar(result, node, self._graph, self._where)

    def __add__(self, o: Any) -> Any: return self._record(operator.add, self, o)
    def __radd__(self, o: Any) -> Any: return self._record(operator.add, o, self)
    def __sub__(self, o: Any) -> Any: return self._record(operator.sub, self, o)
    def __rsub__(self, o: Any) -> Any: return self._record(operator.sub, o, self)
    def __mul__(self, o: Any) -> Any: return self._record(operator.mul, self, o)
    def __rmul__(self, o: Any) -> Any: return self._record(operator.mul, o, self)
    def __truediv__(self, o: Any) -> Any: return self._record(operator.truediv, self, o)
    def __rtruediv__(self, o: Any) -> Any: return self._record(operator.truediv, o, self)
    def __floordiv__(self, o: Any) -> Any: return self._record(operator.floordiv, self, o)
    def __rfloordiv__(self, o: Any) -> Any: return self._record(operator.floordiv, o, self)
    def __mod__(self, o: Any) -> Any: return self._record(operator.mod, self, o)
    def __rmod__(self, o: Any) -> Any: return self._record(operator.mod, o, self)
    def __pow__(self, o: Any) -> Any: return self._record(operator.pow, self, o)
    def __rpow__(self, o: Any) -> Any: return self._record(operator.pow, o, self)
    def __neg__(self) -> Any: return self._record(operator.neg, self)
    def __pos__(self) -> Any: return self._record(operator.pos, self)
    def __abs__(self) -> Any: return self._record(operator.abs, self)

    # -- uses a static graph cannot replay -------------------------------------
    def _refuse(self, what: str) -> Any:
        raise DataDependentError(
            f"{what} of a value read from a tensor with .item() at {self._where} "
            "cannot be replayed by a static graph"
        )

    def __bool__(self) -> bool: return self._refuse("branching on the value")
    def __float__(self) -> float: return self._refuse("float()")
    def __int__(self) -> int: return self._refuse("int()")
    def __index__(self) -> int: return self._refuse("using as an index")
    def __str__(self) -> str: return self._refuse("printing")
    def __format__(self, spec: str) -> str: return self._refuse("formatting")
    def __lt__(self, o: Any) -> bool: return self._refuse("comparing")
    def __le__(self, o: Any) -> bool: return self._refuse("comparing")
    def __gt__(self, o: Any) -> bool: return self._refuse("comparing")
    def __ge__(self, o: Any) -> bool: return self._refuse("comparing")
    def __eq__(self, o: object) -> bool: return self._refuse("comparing")  # type: ignore[override]
    def __ne__(self, o: object) -> bool: return self._refuse("comparing")  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TracedScalar({self.value!r}, node={self.node.name})"

    # Reaching a torch function as an argument (a Scalar position): the
    # capture's TorchFunctionMode unwraps it and links the op node to it. This
    # method exists so that torch's argument parser accepts the object.
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from graphprof.capture.recorder import call_with_scalars

        return call_with_scalars(func, args, kwargs or {})


def contains_traced_scalar(tree: Any) -> bool:
    """True when a (nested) argument structure holds a TracedScalar."""
    if isinstance(tree, TracedScalar):
        return True
    if isinstance(tree, (list, tuple)):
        return any(contains_traced_scalar(x) for x in tree)
    if isinstance(tree, dict):
        return any(contains_traced_scalar(x) for x in tree.values())
    return False


def unwrap_scalars(tree: Any, found: list[TracedScalar]) -> Any:
    """Replace TracedScalars by their values, collecting them in ``found``."""
    if isinstance(tree, TracedScalar):
        found.append(tree)
        return tree.value
    if isinstance(tree, list):
        return [unwrap_scalars(x, found) for x in tree]
    if isinstance(tree, tuple):
        return tuple(unwrap_scalars(x, found) for x in tree)
    if isinstance(tree, dict):
        return {k: unwrap_scalars(v, found) for k, v in tree.items()}
    return tree
