"""Cost formulas and facts of communication ops: ``torch.distributed`` collectives.

Two families of ops carry collectives into a graph:

- ``c10d::*`` (``c10d::allreduce_``, ``c10d::broadcast_``, ...): what
  ``dist.all_reduce`` and friends dispatch in eager code, so what a
  whole-step ``make_fx`` capture records. They return a ``Work`` handle.
- ``_c10d_functional::*`` (``all_reduce`` plus a ``wait_tensor``): the
  traceable collectives dynamo turns ``dist.all_reduce`` into, so what a
  segmented capture records.

Conventions (also in the README):

- **FLOPs: 0.** A collective moves data; the additions of a sum-reduction
  are part of its algorithm (ring, tree, ...), depend on the backend and are
  not attributed to the op. A 0 (not None) keeps collectives out of the
  "no formula" coverage list: their cost *is* known, it is bytes.
- **Bytes read / written:** the tensors the op reads and writes, by the
  usual rule (an in-place allreduce of N bytes reads N and writes N).
- **Bytes communicated** (the ``bytes`` attr) follow the NCCL-tests
  convention for the "size" of a collective: the buffer of one rank
  (allreduce, broadcast, reduce, send, recv), the gathered output
  (allgather, gather), the input before scattering (reduce-scatter,
  scatter), the input (all-to-all); a barrier moves 0. Bus bandwidth is
  derived from it in ``graphprof.analysis.distributed``.

``collective_attrs`` gives the op_attrs pass the facts a profile keeps per
collective node: ``collective`` (its kind: ``allreduce``, ``allgather``,
``reduce_scatter``, ``broadcast``, ``reduce``, ``alltoall``, ``gather``,
``scatter``, ``send``, ``recv``, ``barrier``, or ``wait`` for a
``wait_tensor``), ``bytes`` and ``world_size``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from graphprof.passes.cost_formulas import OpCall, builtin, cost, nbytes
from graphprof.passes.op_call import op_call
from graphprof.passes.records import CostRecord
from graphprof.profile.records import AttrValue

#: Collective kind of each op (by schema name), and which of its values is
#: the NCCL-tests "size": "in" (tensors read), "out" (tensors written) or "none".
_OPS: dict[str, tuple[str, str]] = {
    "c10d::allreduce_": ("allreduce", "in"),
    "c10d::allreduce_coalesced_": ("allreduce", "in"),
    "c10d::broadcast_": ("broadcast", "in"),
    "c10d::reduce_": ("reduce", "in"),
    "c10d::allgather_": ("allgather", "out"),
    "c10d::_allgather_base_": ("allgather", "out"),
    "c10d::allgather_coalesced_": ("allgather", "out"),
    "c10d::allgather_into_tensor_coalesced_": ("allgather", "out"),
    "c10d::reduce_scatter_": ("reduce_scatter", "in"),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", "in"),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", "in"),
    "c10d::alltoall_": ("alltoall", "in"),
    "c10d::alltoall_base_": ("alltoall", "in"),
    "c10d::gather_": ("gather", "out"),
    "c10d::scatter_": ("scatter", "in"),
    "c10d::send": ("send", "in"),
    "c10d::recv_": ("recv", "in"),
    "c10d::recv_any_source_": ("recv", "in"),
    "c10d::barrier": ("barrier", "none"),
    "c10d::monitored_barrier_": ("barrier", "none"),
    "_c10d_functional::all_reduce": ("allreduce", "in"),
    "_c10d_functional::all_reduce_": ("allreduce", "in"),
    "_c10d_functional::all_reduce_coalesced": ("allreduce", "in"),
    "_c10d_functional::all_reduce_coalesced_": ("allreduce", "in"),
    "_c10d_functional::broadcast": ("broadcast", "in"),
    "_c10d_functional::broadcast_": ("broadcast", "in"),
    "_c10d_functional::all_gather_into_tensor": ("allgather", "out"),
    "_c10d_functional::all_gather_into_tensor_out": ("allgather", "out"),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("allgather", "out"),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", "in"),
    "_c10d_functional::reduce_scatter_tensor_out": ("reduce_scatter", "in"),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", "in"),
    "_c10d_functional::all_to_all_single": ("alltoall", "in"),
    "_c10d_functional::isend": ("send", "in"),
    "_c10d_functional::irecv": ("recv", "in"),
    "_c10d_functional::wait_tensor": ("wait", "none"),
}
#: The ``c10d::`` ops hand back a Work handle that eager code waits on.
WORK_OPS = frozenset(name for name in _OPS if name.startswith("c10d::"))


def schema_name(target: Any) -> str:
    """``"c10d::allreduce_"`` for an op overload, "" for anything else."""
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else ""


def collective_kind(target: Any) -> str | None:
    """The collective an op target performs (``"allreduce"``, ...), or None for other ops."""
    entry = _OPS.get(schema_name(target))
    return entry[0] if entry else None


def communicated_bytes(call: OpCall) -> int:
    """The NCCL-tests "size" of a collective call (see the module docstring)."""
    side = _OPS[schema_name(call.target)][1]
    if side == "none":
        return 0
    if side == "out":
        return sum(nbytes(t) for t in call.written)
    return sum(nbytes(t) for t in call.inputs)


def _collective(call: OpCall) -> CostRecord:
    if collective_kind(call.target) == "wait":  # hands back the tensor it is given: moves nothing
        return CostRecord(flops=0, bytes_read=0, bytes_written=0)
    return cost(call, 0)


builtin(list(_OPS))(_collective)


def world_size_of(call: OpCall) -> int | None:
    """Ranks in the op's process group: from the ProcessGroup argument, or a group name."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    for value in list(call.args) + list(call.kwargs.values()):
        if isinstance(value, torch.ScriptObject):
            try:
                return int(dist.ProcessGroup.unbox(value).size())
            except (RuntimeError, TypeError, AttributeError):
                continue
    group = call.arg("group_name")
    if isinstance(group, str):
        try:
            from torch.distributed.distributed_c10d import _resolve_process_group

            return int(_resolve_process_group(group).size())  # type: ignore[arg-type]  # a group name
        except (RuntimeError, KeyError, ValueError, AttributeError):
            pass
    return int(dist.get_world_size())


def collective_attrs(call: OpCall) -> dict[str, AttrValue]:
    """The facts a profile keeps about a collective node (empty for other ops)."""
    kind = collective_kind(call.target)
    if kind is None:
        return {}
    attrs: dict[str, AttrValue] = {"collective": kind}
    if kind != "wait":
        attrs["bytes"] = communicated_bytes(call)
        size = world_size_of(call)
        if size is not None:
            attrs["world_size"] = size
    return attrs


def node_collective_attrs(node: torch.fx.Node, gm: torch.fx.GraphModule) -> dict[str, AttrValue]:
    """``collective_attrs`` of an fx node (empty when it is not a collective)."""
    if collective_kind(node.target) is None:
        return {}
    return collective_attrs(op_call(node, gm))
