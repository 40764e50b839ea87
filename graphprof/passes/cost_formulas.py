"""The cost registry: formulas for FLOPs and bytes moved, keyed by aten op.

A formula is a function of one :class:`OpCall` (what an op node reads and
writes, with FakeTensors for tensors) returning a :class:`CostRecord`, or an
``int`` (FLOPs, with bytes by the default rule). Formulas are looked up by
``OpOverload`` first, then by its ``OpOverloadPacket``; Python callables
(``operator.getitem``, ``operator.pow``) are keys too.

Conventions (also in the README):

- 1 multiply-add = 2 FLOPs; every elementwise arithmetic operation,
  comparison, select or transcendental function (exp, log, erf, tanh, sqrt)
  counts 1 FLOP per element it produces.
- bytes read = bytes of the distinct tensor inputs an op reads, each counted
  once at its own size (a broadcast input is not expanded; a stride-0
  dimension of an expanded view adds nothing; a sparse tensor's are its
  indices and values); bytes written = bytes of the outputs, in-place
  outputs and mutated arguments included.
- views and metadata ops cost 0 FLOPs and 0 bytes.

Lookup order: formulas registered by the user (``register_cost``), then
graphprof's built-in formulas (by op object, then by qualified name such as
``prims::fma`` for ops torch registers lazily), then ``torch.utils.flop_counter``'s registry
(so a formula registered with torch's ``register_flop_formula`` is used too,
with bytes by the default rule), then views are free. Anything else has no
formula: the cost pass records ``flops=None``, never a silent 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Union

import torch
import torch.utils.flop_counter as flop_counter

from graphprof.passes.records import CostRecord

aten = torch.ops.aten

Formula = Callable[["OpCall"], Union[CostRecord, int, None]]
OpKey = Any  # OpOverload, OpOverloadPacket or a Python callable

_BUILTIN: dict[OpKey, Formula] = {}
#: Built-in formulas by qualified name ("prims::fma"), for ops registered lazily by torch.
_BUILTIN_BY_NAME: dict[str, Formula] = {}
_USER: dict[OpKey, Formula] = {}
#: Names in the built-in tables that this torch build does not have.
MISSING_OPS: set[str] = set()


@dataclass(frozen=True)
class OpCall:
    """What a formula sees of one op node.

    ``args``/``kwargs`` are the node's arguments with every graph node
    replaced by its value (a FakeTensor, a list of them, or a Python scalar;
    ``None`` for a host scalar only known at run time). ``inputs`` are the
    distinct tensors the node receives, ``written`` the tensors it writes.
    """

    target: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    out: Any
    inputs: tuple[torch.Tensor, ...]
    written: tuple[torch.Tensor, ...]

    def arg(self, name: str, default: Any = None) -> Any:
        """The argument called ``name`` in the op's schema (positional or keyword)."""
        if name in self.kwargs:
            return self.kwargs[name]
        schema = getattr(self.target, "_schema", None)
        if schema is None:
            return default
        for i, argument in enumerate(schema.arguments):
            if argument.name != name:
                continue
            if i < len(self.args) and not argument.kwarg_only:
                return self.args[i]
            if argument.has_default_value():
                return argument.default_value
            return default
        return default

    @property
    def out_numel(self) -> int:
        """Elements of the first output (or of the first written tensor)."""
        tensors = tensors_in(self.out) or list(self.written)
        return numel(tensors[0]) if tensors else 0


# -- sizes -----------------------------------------------------------------------
def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a value (a tensor, or a nested list/tuple of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def numel(t: torch.Tensor) -> int:
    return int(math.prod(int(d) for d in t.shape))


def itemsize(t: torch.Tensor) -> int:
    return t.dtype.itemsize


def nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements, as written into a fresh output (a sparse one's indices and values)."""
    return sparse_bytes(t) if is_sparse(t) else numel(t) * itemsize(t)


_COMPRESSED_ROWS = (torch.sparse_csr, torch.sparse_bsr)
_COMPRESSED_COLUMNS = (torch.sparse_csc, torch.sparse_bsc)


def is_sparse(t: torch.Tensor) -> bool:
    """Whether ``t`` is a sparse tensor (COO or compressed): no strides, no storage of its own."""
    return t.layout is torch.sparse_coo or t.layout in _COMPRESSED_ROWS or t.layout in _COMPRESSED_COLUMNS


def sparse_stand_in(t: torch.Tensor, transposed: bool = False) -> torch.Tensor | None:
    """A meta tensor like the sparse COO matrix ``t`` (or its transpose): its sizes, dtypes and number of
    stored elements, no data. None for another layout or rank. (``t.to("meta")`` and fake tensors keep
    no stored elements, and a meta COO's ``t()`` drops them too.)"""
    if t.layout is not torch.sparse_coo or t.dim() != 2:
        return None
    indices, values = t._indices(), t._values()
    size = (t.shape[1], t.shape[0]) if transposed else tuple(t.shape)
    return torch.sparse_coo_tensor(torch.empty(indices.shape, dtype=indices.dtype, device="meta"),
                                   torch.empty(values.shape, dtype=values.dtype, device="meta"), size,
                                   device="meta", check_invariants=False)


def sparse_bytes(t: torch.Tensor) -> int:
    """Bytes a sparse tensor holds: its indices and its values (COO), or its compressed and plain indices
    and its values (CSR, CSC, BSR, BSC). Its dense size would count every zero it leaves out."""
    if t.layout is torch.sparse_coo:
        parts = [t._indices(), t._values()]
    elif t.layout in _COMPRESSED_ROWS:
        parts = [t.crow_indices(), t.col_indices(), t.values()]
    else:
        parts = [t.ccol_indices(), t.row_indices(), t.values()]
    return sum(nbytes(p) for p in parts)


def footprint_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a (possibly expanded) tensor refers to.

    A dimension of stride 0 (``expand``, broadcasting views) repeats the same
    elements, so it does not multiply what is read.
    """
    if is_sparse(t):
        return sparse_bytes(t)
    sizes = [int(d) for d in t.shape]
    if any(s == 0 for s in sizes):
        return 0
    distinct = math.prod(s for s, st in zip(sizes, t.stride()) if int(st) != 0)
    return int(distinct) * itemsize(t)


def read_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(footprint_bytes(t) for t in tensors)


def written_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(nbytes(t) for t in tensors)


def cost(call: OpCall, flops: int, bytes_read: int | None = None, bytes_written: int | None = None) -> CostRecord:
    """A CostRecord; bytes default to all inputs read and all written tensors."""
    return CostRecord(
        flops=int(flops),
        bytes_read=read_bytes(call.inputs) if bytes_read is None else int(bytes_read),
        bytes_written=written_bytes(call.written) if bytes_written is None else int(bytes_written),
    )


def default_bytes(call: OpCall) -> CostRecord:
    """Bytes by the default rule and no FLOP count (an op without a formula)."""
    return CostRecord(flops=None, bytes_read=read_bytes(call.inputs), bytes_written=written_bytes(call.written))


def is_one(value: Any) -> bool:
    """True when a scalar multiplier is known to be 1 (so it costs no multiply)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


# -- registry --------------------------------------------------------------------
def resolve(names: Iterable[str], optional: bool = False) -> list[torch._ops.OpOverloadPacket]:
    """The aten packets called ``names``; names this torch lacks go to MISSING_OPS
    unless ``optional`` (variants generated by rule, such as ``_foreach_<op>_``)."""
    packets = []
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            packets.append(packet)
        elif not optional:
            MISSING_OPS.add(name)
    return packets


def builtin(names: Iterable[str] | str, optional: bool = False) -> Callable[[Formula], Formula]:
    """Decorator: register a built-in formula for the aten packets called ``names``
    (or, for a qualified name such as ``"prims::fma"``, for the op of that name)."""
    names = [names] if isinstance(names, str) else list(names)

    def register(fn: Formula) -> Formula:
        for name in names:
            if "::" in name:
                _BUILTIN_BY_NAME[name] = fn
        for packet in resolve([n for n in names if "::" not in n], optional):
            _BUILTIN[packet] = fn
        return fn

    return register


def register_builtin(keys: Iterable[OpKey], fn: Formula) -> None:
    """Register a built-in formula for explicit keys (Python callables, overloads)."""
    for key in keys:
        _BUILTIN[key] = fn


def _check_key(op: OpKey) -> None:
    if not callable(op):  # overloads, packets and Python functions are all callable
        raise TypeError(f"register_cost needs an op overload, an op packet or a callable, not {type(op).__name__}")


def register_cost(op: OpKey, fn: Formula | None = None) -> Any:
    """Register ``fn`` as the cost formula of ``op`` (an overload, a packet, or a callable).

    ``fn(call: OpCall)`` returns a ``CostRecord``, or an ``int`` of FLOPs
    (bytes then follow the default rule), or ``None`` (cost unknown).
    A user formula takes precedence over graphprof's and torch's. Usable as
    ``register_cost(op, fn)`` or as a decorator ``@register_cost(op)``.
    """
    _check_key(op)

    def register(f: Formula) -> Formula:
        if not callable(f):
            raise TypeError("a cost formula must be callable")
        _USER[op] = f
        return f

    return register(fn) if fn is not None else register


def unregister_cost(op: OpKey) -> None:
    """Remove a user formula registered with ``register_cost`` (no error if none)."""
    _USER.pop(op, None)


def _packet(target: Any) -> Any:
    return target.overloadpacket if isinstance(target, torch._ops.OpOverload) else None


def _torch_formula(call: OpCall) -> CostRecord:
    return cost(call, torch_flops(call))


def torch_flops(call: OpCall) -> int:
    """FLOPs from ``torch.utils.flop_counter``'s formula for this op (shapes only)."""
    fn = flop_counter.flop_registry[_packet(call.target)]
    return int(fn(*call.args, out_val=call.out, **call.kwargs))


def _free(call: OpCall) -> CostRecord:
    return CostRecord(flops=0, bytes_read=0, bytes_written=0)


def is_view_op(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and bool(getattr(target, "is_view", False))


def lookup(target: Any) -> Formula | None:
    """The formula for an op target, or None when there is none."""
    packet = _packet(target)
    for table in (_USER, _BUILTIN):
        for key in (target, packet):
            if key is not None and key in table:
                return table[key]
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.name in _BUILTIN_BY_NAME:
        return _BUILTIN_BY_NAME[schema.name]
    if packet is not None and packet in flop_counter.flop_registry:
        return _torch_formula
    if is_view_op(target):
        return _free
    if getattr(target, "__module__", None) == "host":  # replayed Python (capture/host_nodes.py): no tensor work
        return _free
    return None


def free_formula() -> Formula:
    """The formula of views and metadata ops: 0 FLOPs, 0 bytes."""
    return _free
