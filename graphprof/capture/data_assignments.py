"""New data given to a parameter or buffer inside the step (``p.data = ...``), replayed where eager gives it.

An assignment to ``.data`` is no aten op: make_fx records the ops that
compute the new value and not the assignment, so a replay computed the new
values and dropped them. The momentum updates of MoCo, BYOL, MoCo v3,
lightly's ``update_momentum`` and solo-learn's ``MomentumUpdater`` are all
written so::

    pk.data = pk.data * m + pq.data * (1 - m)

The setter goes through ``__torch_function__`` (torch's
``handle_torch_function_setter``), so the recorder sees each assignment
where the step makes it, and puts a host node there (``DataAssignments``):
on every replay it gives the tensor the value the graph computed at that
point, which is what eager does: the same tensor object (its identity,
``requires_grad``, ``.grad``, version counter and the optimizer state keyed
by it stay) now holds the new tensor's storage, sizes and strides, and no
longer the old storage. Later ops of the step read the tensor as a graph
constant, the user's own object, so they read the new data, as eager's do;
a view of the old data taken before keeps the old storage, in both.

Accepted: a parameter or buffer of the step's modules (their identity is
checked before every replay, capture/module_structure.py) given a tensor of
its own sizes, strides, dtype, device and layout. The value may alias
anything (``p.data = q.data``, a slice of a flat vector in
``vector_to_parameters``): the replay passes the tensor its own ops made at
that point, aliasing what eager's aliases. Refused, as before, with the
parameters given their own data back (``restore_data_assignments``):

* another shape, strides, dtype, device or layout: the graph was traced, and
  is checked before a replay, with the tensor as the capture call found it,
  and decisions the step's Python took on its sizes would not be taken again;
* a tensor that is no parameter or buffer of the step's modules (one the
  step made, an argument, a tensor kept elsewhere): the graph reads those
  through the node that made them, or as the capture call's object, not
  through the tensor given the new data;
* an assignment the recorder did not see (made with its modes off).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx

from graphprof.capture.host_nodes import effect_node
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.state import StateIndex

#: The meta key of the host node that gives a tensor new data: that tensor.
ASSIGNED_DATA = "graphprof.assigned_data"
#: The ``.data`` setter as ``__torch_function__`` is given it (a method-wrapper of the getset descriptor).
DATA_SETTER = vars(torch._C.TensorBase)["data"].__set__
_METHOD_WRAPPER = type(DATA_SETTER)


def is_data_setter(func: Any) -> bool:
    """Whether ``func`` (given to ``__torch_function__``) assigns ``.data``."""
    return type(func) is _METHOD_WRAPPER and func == DATA_SETTER


def assigned_data(graph: torch.fx.Graph) -> set[int]:
    """ids of the tensors ``graph`` gives new data. Whoever keeps a tensor's storage from one replay to
    the next (runtime/kept_buffers.py) must not keep theirs: it is another after every replay."""
    return {id(node.meta[ASSIGNED_DATA]) for node in graph.nodes if ASSIGNED_DATA in node.meta}


def storages_of(state: StateIndex) -> dict[int, tuple[Any, int, Any]]:
    """id -> (tensor, address of its data, its data) for every parameter and buffer of the step's
    modules (the data kept to be put back)."""
    tensors: list[torch.Tensor] = list(state.params.values())
    tensors += [b for _, module in state.modules.values() for b in module._buffers.values() if b is not None]
    found: dict[int, tuple[Any, int, Any]] = {}
    for t in tensors:
        try:
            found[id(t)] = (t, t.data_ptr(), t.data)
        except RuntimeError:  # a tensor without storage of its own (a DTensor, a meta tensor)
            continue
    return found


def restore_data_assignments(before: dict[int, tuple[Any, int, Any]]) -> list[tuple[Any, Any]]:
    """Give every parameter and buffer that got new data (``p.data = ...``) since ``before`` its own
    data back; returns them, with that data.

    Why: the write log undoes in-place writes only, and an assignment is no op. A capture refused
    after one (MoCo's momentum update ``pk.data = pk.data * m + pq.data * (1 - m)``, then
    ``int(queue_ptr)``) left the new data in place, and the fallback applied the update again.
    Run before the write log's undo: that writes the originals into the data put back here."""
    changed = [(t, data) for t, address, data in before.values() if t.data_ptr() != address]
    for t, data in changed:
        t.data = data
    return changed


def _refusal(state: StateIndex, tensor: torch.Tensor, why: str = "") -> DataDependentError:
    record = state.describe(tensor)
    name = record.name if record is not None else f"a {tuple(tensor.shape)} tensor"
    return DataDependentError(f"the step assigns new data to {name} (.data = ...){why}, which a replayed graph "
                              "would not repeat")


class DataAssignments:
    """The ``.data`` assignments of the capture call: each accepted one made, with its host node."""

    def __init__(self, graph: torch.fx.Graph, tensor_node: Callable[[torch.Tensor], Any],
                 context: Callable[[], Any], state: StateIndex, targets: frozenset[int]) -> None:
        self.graph = graph
        self.tensor_node = tensor_node
        self.context = context
        self.state = state
        #: ids of the tensors that may be given new data (``storages_of``'s keys). Not their data: the
        #: recorder outlives the capture, and the old storage of a tensor given new data would with it.
        self.targets = targets
        #: ids of the tensors given new data by an accepted assignment.
        self.assigned: set[int] = set()

    def assign(self, setter: Any, target: torch.Tensor, value: Any) -> None:
        """Make ``target.data = value`` (``setter``: torch's), and the node that makes it in every replay;
        refuses what a replay could not repeat (see the module's docstring)."""
        if id(target) not in self.targets:
            raise _refusal(self.state, target, ", a tensor that is no parameter or buffer of the step's modules")
        if not isinstance(value, torch.Tensor):
            setter(target, value)  # torch's own error, as eager's
        if (value.shape != target.shape or value.stride() != target.stride() or value.dtype != target.dtype
                or value.device != target.device or value.layout != target.layout):
            raise _refusal(self.state, target, f" of another shape, strides, dtype, device or layout "
                           f"({tuple(value.shape)} {value.dtype}, was {tuple(target.shape)} {target.dtype})")
        if value.is_inference():  # a replay's own tensors are no inference tensors
            raise _refusal(self.state, target, " made under torch.inference_mode()")
        node = self.tensor_node(value)
        if not isinstance(node, torch.fx.Node):
            raise _refusal(self.state, target, ", a tensor the graph does not hold")
        setter(target, value)

        def apply(values: tuple, target: torch.Tensor = target) -> None:
            target.data = values[0]
        effect_node(self.graph, "assign .data", apply, [node], self.context()).meta[ASSIGNED_DATA] = target
        self.assigned.add(id(target))

    def refuse_unseen(self, storages: dict[int, tuple[Any, int, Any]]) -> None:
        """Refuse a parameter or buffer of ``storages`` given new data by no assignment recorded here (made
        with the recorder's modes off: ``restore_data_assignments`` gives them theirs back when it raises).
        In-place updates (an optimizer's) keep the address."""
        unseen = [t for t, address, _ in storages.values()
                  if id(t) not in self.assigned and t.data_ptr() != address]
        if unseen:
            raise _refusal(self.state, unseen[0])
