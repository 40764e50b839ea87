"""Which literal of an op node is the number the step passed, when the node holds that value twice.

Why: a number the step passes to torch (``x.select(1, k)`` with ``k`` read
by ``.item()``, ``x.clamp(0.0, hi)`` with ``hi`` an argument) reaches the op
node as a plain literal, and the recorder links it back to the number's
node by its value (``link_scalars``). When the call also holds a
constant equal to it (``k == 1`` beside the dim 1, ``hi == 0.0`` beside the
lower bound 0.0), linking by value linked both: every replay computed
``select(x, k, k)`` or ``clamp(x, hi, hi)``, silently, and a random
``rot90`` or ``roll`` raised on a later call.

How: a node holding more literals of a value than the call has numbers of
that value is ambiguous. If the node is the op the call names (``select``
for ``Tensor.select``) and its numbers are the call's, in order, the
numbers the step passed are at the same places: those are linked, the rest
stay constants. Otherwise the capture refuses: a static graph cannot tell
them apart, and the step is profiled another way, with one warning.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch
import torch.fx

from graphprof.capture.call_numbers import CallScalars, number_leaves, replace_numbers
from graphprof.capture.host_nodes import rebuilt
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.sources import user_source


def _kind(value: Any) -> type:
    """float or int: a numpy float64 (a float of its own type) is a float, as torch takes it."""
    return float if isinstance(value, float) else int


def _substitute(value: Any, scalars: list[TracedScalar], used: set[int]) -> Any:
    """Replace a literal equal to a pending scalar's value by that scalar's node.

    Of several scalars with that value, the first one no literal took yet: a
    foreach optimizer's list of bias corrections, one per parameter, is equal
    while the step counts are, and each item stays linked to its own count.
    """
    if isinstance(value, (list, tuple)):
        return rebuilt(value, [_substitute(v, scalars, used) for v in value])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        equal = [s for s in scalars if _kind(s.value) is _kind(value) and s.value == value]
        if equal:
            chosen = next((s for s in equal if id(s) not in used), equal[0])
            used.add(id(chosen))
            return chosen.node
    return value


def _number_argument(argument: Any) -> bool:
    """A schema argument that takes a number to compute with.

    Scalar and float arguments, lists of them, and Tensor arguments: a number
    found in a Tensor slot is a wrapped number (``p.mul_(1 - lr * wd)``).
    """
    kind = argument.type
    if isinstance(kind, torch._C.OptionalType):
        kind = kind.getElementType()
    if isinstance(kind, torch._C.ListType):
        kind = kind.getElementType()
    return isinstance(kind, (torch._C.NumberType, torch._C.FloatType, torch._C.TensorType))


def _numeric_places(node: torch.fx.Node, schema: Any) -> tuple[list[bool], dict[str, bool]]:
    """Which of the node's positional and keyword arguments take a number to compute with
    (``_number_argument``); every one of an op without a schema. Worked out once per node."""
    if schema is None:
        return [True] * len(node.args), dict.fromkeys(node.kwargs, True)
    by_name = {a.name: a for a in schema.arguments}
    return ([i < len(schema.arguments) and _number_argument(schema.arguments[i]) for i in range(len(node.args))],
            {k: k in by_name and _number_argument(by_name[k]) for k in node.kwargs})


def _op_name(node: torch.fx.Node) -> str:
    return str(getattr(node.target, "_opname", None) or getattr(node.target, "__name__", ""))


def _linked_by_place(node: torch.fx.Node, scalars: list[TracedScalar], used: set[int], call: CallScalars | None,
                     places: tuple[list[bool], dict[str, bool]]) -> bool:
    """Link the numbers of an op node that holds a traced number's value more often than the pending
    numbers have it (``x.select(1, k)`` with ``k == 1``) by their places in the call, when the node is
    the call's own op; refuse when it is not. False when the node is not ambiguous."""
    numeric_args, numeric_kwargs = places
    numeric = [v for value, numeric_arg in zip(node.args, numeric_args) if numeric_arg
               for v in number_leaves(value, _no_scalar)]
    numeric += [v for k, value in node.kwargs.items() if numeric_kwargs[k] for v in number_leaves(value, _no_scalar)]
    literals = number_leaves((node.args, node.kwargs), _no_scalar)
    value = ambiguous_value(literals, numeric, scalars, lambda s: not s.is_input)
    if value is None:
        return False
    linked_at = None if call is None else aligned_scalars(_op_name(node), literals, call, _is_traced)
    if linked_at is None:
        raise DataDependentError(
            f"a number the step passes at {user_source(4)} equals {value!r}, a constant of the same op "
            f"({node.target}), and a static graph could not tell which is which")
    linked = iter([None if s is None else s.node for s in linked_at])
    node.args, node.kwargs = replace_numbers((node.args, node.kwargs), linked)
    used.update(id(s) for s in linked_at if s is not None)
    return True


#: Ops Python's indexing records for ``x[k]``, ``x[a:b]`` and ``x[a:b] = y``, with the numbers it was given.
_INDEXING = {"__getitem__": {"select", "slice", "index"}, "__setitem__": {"select", "slice", "index", "index_put", "copy"}}


def _own_op(node: torch.fx.Node, call: CallScalars | None) -> bool:
    """Whether ``node`` is the op the call names (``select`` for ``Tensor.select``), so that its
    arguments are the call's, not numbers torch computed from them."""
    name = getattr(call.func, "__name__", None) if call is not None else None
    op_name = _op_name(node)
    return name is not None and (name.rstrip("_") == op_name.rstrip("_") or op_name in _INDEXING.get(name, ()))


def _refuse_derived_sizes(node: torch.fx.Node, numeric_args: list[bool], computed: list[TracedScalar],
                          call: CallScalars | None) -> None:
    """Refuse a number read from a tensor that reaches a size, an index or a dim of an op other than
    the one the step called: torch made that op from the call, and may have computed other sizes from
    the number on the way (``x.narrow(1, k, 1)`` is recorded as ``slice(x, 1, k, k + 1)``, its end a
    constant), which a replay would keep."""
    sizes = [v for value, numeric_arg in zip(node.args, numeric_args) if not numeric_arg
             for v in number_leaves(value, _no_scalar)]
    if not sizes or _own_op(node, call):
        return
    keys = {_key(v) for v in sizes}
    reaching = next((s for s in computed if _key(s.value) in keys), None)
    if reaching is not None:
        name = getattr(call.func, "__name__", "a torch call") if call is not None else "a torch call"
        raise DataDependentError(
            f"a value read from a tensor with .item() at {reaching._where} reaches {name} as a size or an "
            f"index, which torch records as {node.target}, computing its other numbers from it; a static "
            "graph would keep those")


def link_scalars(node: torch.fx.Node, scalars: list[TracedScalar], used: set[int],
                 call: CallScalars | None = None) -> None:
    """Point an op node's scalar arguments at the nodes that compute them.

    Values read from tensors (``.item()``) link wherever they appear. Input
    scalars link only where the op computes with a number; elsewhere (a size,
    a dim, a flag) the graph is specialised to the value and a guard says so.
    """
    computed = [s for s in scalars if not s.is_input]
    places = _numeric_places(node, getattr(node.target, "_schema", None))
    if _linked_by_place(node, scalars, used, call, places):
        return
    numeric_args, numeric_kwargs = places
    if computed:
        _refuse_derived_sizes(node, numeric_args, computed, call)
    node.args = tuple(_substitute(value, scalars if numeric_arg else computed, used)
                      for value, numeric_arg in zip(node.args, numeric_args))
    node.kwargs = {k: _substitute(v, scalars if numeric_kwargs[k] else computed, used) for k, v in node.kwargs.items()}


def _key(value: Any) -> tuple[type, Any]:
    return type(value), value


def ambiguous_value(literals: list[Any], numeric_literals: list[Any], scalars: list[Any],
                    computed: Callable[[Any], bool]) -> Any | None:
    """A value the node holds in more places a traced number could link to than the pending traced
    numbers (``scalars``) have it, or None. A number read from a tensor (``computed``) links anywhere
    (``literals``: every number of the node); one known before the step only where the op computes
    with a number (``numeric_literals``)."""
    wanted = Counter(_key(s.value) for s in scalars)
    anywhere = {_key(s.value) for s in scalars if computed(s)}
    held_anywhere = Counter(_key(v) for v in literals)
    held_numeric = Counter(_key(v) for v in numeric_literals)
    for key, n in wanted.items():
        if (held_anywhere if key in anywhere else held_numeric)[key] > n:
            return key[1]
    return None


def aligned_scalars(op_name: str, literals: list[Any], call: CallScalars,
                    is_scalar: Callable[[Any], bool]) -> list[Any] | None:
    """Per number of the node (``literals``, in order), the traced number to link there or None (a
    constant), when the node is the op ``call`` names and holds the call's numbers in order; else None."""
    name = getattr(call.func, "__name__", None)
    if name is None or name.rstrip("_") != op_name.rstrip("_") or len(literals) != len(call.numbers):
        return None
    values = [n.value if is_scalar(n) else n for n in call.numbers]
    if any(_key(a) != _key(b) for a, b in zip(literals, values)):
        return None
    return [n if is_scalar(n) else None for n in call.numbers]


def _no_scalar(value: Any) -> bool:
    return False


def _is_traced(value: Any) -> bool:
    return isinstance(value, TracedScalar)
