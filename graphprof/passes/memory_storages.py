"""The storages the memory pass (passes/memory.py) follows, and which values share them.

Kept apart from the pass's walk over the graph: this is the part that knows
torch's aliasing rules (op schemas' alias sets, ``_unsafe_view``, the loss
kernels that reduce into their elementwise buffer, storages shared by tied
state) and gives every value node its storages ("slots"); the pass decides
when each is freed and what is live at every node.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.fx

from graphprof.passes.cost_formulas import is_sparse, sparse_bytes
from graphprof.passes.records import SPARSE_VALUE, STATE, StateRole

ROLE_CATEGORY = {
    StateRole.INPUT: "inputs",
    StateRole.PARAMETER: "parameters",
    StateRole.BUFFER: "buffers",
    StateRole.CONSTANT: "buffers",
    StateRole.GRADIENT: "gradients",
    StateRole.OPTIMIZER_STATE: "optimizer_state",
}
#: Ops whose output shares its input's storage though the schema has no alias annotation.
_ALIASES_DESPITE_SCHEMA = {"aten::_unsafe_view"}
#: Losses whose reduced (0-d) result keeps the storage of the elementwise loss
#: it was reduced from: their kernels reduce into that buffer (seen on CPU,
#: torch 2.13; the real-run test in tests/passes/test_memory.py checks it).
_KEEPS_ELEMENTWISE_BUFFER = {"aten::mse_loss", "aten::smooth_l1_loss", "aten::binary_cross_entropy",
                             "aten::soft_margin_loss"}

# A value's storages, shaped like its ``val``: a storage id, None, or a list of those.
Slots = Any


@dataclass
class Storage:
    """One allocation: who made it and how big it is."""

    nbytes: int
    name: str
    producer: torch.fx.Node | None = None
    category: str = "temporaries"
    persistent: bool = False


def slot_ids(slots: Slots) -> Iterable[int]:
    if isinstance(slots, int):
        yield slots
    elif isinstance(slots, list):
        for s in slots:
            yield from slot_ids(s)


def storage_nbytes(t: torch.Tensor) -> int:
    if is_sparse(t):  # no storage of its own: its indices and values
        return sparse_bytes(t)
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # tensors without storage (nested)
        return int(t.numel()) * t.element_size()


class StorageModel:
    """Storages and the slots of every value node, built in graph order."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.storages: list[Storage] = []
        self.slots: dict[torch.fx.Node, Slots] = {}
        self.allocated_by: dict[torch.fx.Node, list[int]] = {}
        self._state_storage: dict[tuple[str, int], int] = {}

    def new_storage(self, nbytes: int, name: str, producer: torch.fx.Node | None) -> int:
        self.storages.append(Storage(nbytes, name, producer))
        return len(self.storages) - 1

    def fresh(self, value: Any, node: torch.fx.Node) -> Slots:
        """New storages for every tensor in ``value`` (an op's non-aliasing outputs)."""
        if isinstance(value, torch.Tensor):
            sid = self.new_storage(storage_nbytes(value), node.name, node)
            self.allocated_by.setdefault(node, []).append(sid)
            return sid
        if isinstance(value, (list, tuple)):
            return [self.fresh(v, node) for v in value]
        return None

    def state(self, node: torch.fx.Node) -> Slots:
        """Storages of a placeholder or get_attr: live before the step, never freed by it."""
        record = node.meta.get(STATE)
        category = ROLE_CATEGORY.get(record.role, "inputs") if record is not None else "inputs"
        name = record.name if record is not None else node.name
        value = node.meta.get("val")
        if value is None:  # a sparse constant read at run time: make_fx kept no value of it
            value = node.meta.get(SPARSE_VALUE)
        if node.op == "get_attr":
            value = getattr(self.gm, str(node.target), value)  # the real tensor: storages can be shared

        def one(t: Any) -> Slots:
            if not isinstance(t, torch.Tensor):
                return None
            key = None
            if (node.op == "get_attr" and not isinstance(t, torch._subclasses.FakeTensor) and t.device.type != "meta"
                    and not is_sparse(t)):
                storage = t.untyped_storage()
                if storage.nbytes() > 0 and storage.data_ptr() != 0:
                    key = (str(t.device), storage.data_ptr())
            if key is not None and key in self._state_storage:
                return self._state_storage[key]
            sid = self.new_storage(storage_nbytes(t), name, None)
            self.storages[sid].category = category
            self.storages[sid].persistent = True
            if key is not None:
                self._state_storage[key] = sid
            return sid

        if isinstance(value, (list, tuple)):
            return [one(v) for v in value]
        return one(value)

    def op(self, node: torch.fx.Node) -> Slots:
        value = node.meta.get("val")
        target = node.target
        if target is operator.getitem:
            source = self.slots.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
            index = node.args[1]
            if isinstance(source, list) and isinstance(index, int) and -len(source) <= index < len(source):
                return source[index]
            return self.fresh(value, node)
        if not isinstance(target, torch._ops.OpOverload):
            return self.fresh(value, node)
        if target._schema.name in _KEEPS_ELEMENTWISE_BUFFER and isinstance(value, torch.Tensor):
            return self._reduced_loss(node, value)
        returns = target._schema.returns
        if target._schema.name in _ALIASES_DESPITE_SCHEMA and node.args and isinstance(node.args[0], torch.fx.Node):
            source = self.slots.get(node.args[0])
            return source if source is not None else self.fresh(value, node)
        if len(returns) == 1:
            return self._return_slots(node, returns[0], value)
        if not isinstance(value, (list, tuple)) or len(value) != len(returns):
            return self.fresh(value, node)
        return [self._return_slots(node, r, v) for r, v in zip(returns, value)]

    def _reduced_loss(self, node: torch.fx.Node, value: torch.Tensor) -> Slots:
        sid = self.fresh(value, node)
        inp = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if value.dim() == 0 and isinstance(inp, torch.Tensor):
            self.storages[sid].nbytes = max(self.storages[sid].nbytes, int(inp.numel()) * inp.element_size())
        return sid

    def _return_slots(self, node: torch.fx.Node, ret: Any, value: Any) -> Slots:
        alias = ret.alias_info
        if alias is None:
            return self.fresh(value, node)
        # ``Tensor(a)[]`` (split, unbind): Python sees the list's empty alias set,
        # not its elements'; they alias the argument marked ``Tensor(a -> *)``.
        source = self._aliased_argument(node, set(alias.before_set) or {"*"})
        if source is None:
            return self.fresh(value, node)
        if isinstance(value, (list, tuple)):
            if isinstance(source, list) and len(source) == len(value):
                return list(source)
            return [source for _ in value]
        return source

    def _aliased_argument(self, node: torch.fx.Node, alias_set: set[str]) -> Slots:
        """Slots of the argument whose alias set the return shares (``self``, ``out``)."""
        target: torch._ops.OpOverload = node.target  # type: ignore[assignment]
        for i, arg in enumerate(target._schema.arguments):
            info = arg.alias_info
            if info is None or not ((set(info.before_set) | set(info.after_set)) & alias_set):
                continue
            if i < len(node.args) and not arg.kwarg_only:
                value = node.args[i]
            else:
                value = node.kwargs.get(arg.name)
            if isinstance(value, torch.fx.Node):
                return self.slots.get(value)
            if isinstance(value, (list, tuple)):
                return [self.slots.get(v) if isinstance(v, torch.fx.Node) else None for v in value]
        return None
