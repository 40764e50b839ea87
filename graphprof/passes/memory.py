"""The memory pass: bytes allocated, freed and live at every op node.

Reads ``ANNOTATION`` (phase), ``STATE`` (roles of graph inputs and constants)
and ``val`` (the FakeTensor make_fx leaves on every node); writes ``MEMORY``
on every op node and ``MEMORY_STEP`` on the output node. Which storages each
value holds (torch's aliasing rules) is passes/memory_storages.py's part.

The model is the one the executed code follows, so it is exact up to what
kernels allocate internally:

* A tensor op allocates one storage per output tensor that does not alias an
  input; the size is that storage's ``nbytes`` (the FakeTensor's, so odd
  strides are counted as allocated). Which outputs alias which inputs comes
  from the op schema (``Tensor(a)``: views; ``Tensor(a!)``: in-place and
  ``out=``), plus ``_unsafe_view``, which aliases although its schema does
  not say so. ``getitem`` picks tensors out of a tuple: no allocation.
  A few loss kernels reduce into their elementwise buffer, so their scalar
  result keeps that whole buffer alive; the model knows them by name.
* fx's generated code drops each value after its last use (``x = None``), and
  a value nobody uses right after it is made. A storage is freed after the
  node that drops the last value referring to it (a view keeps its base's
  storage alive). Values the graph returns stay alive.
* Graph inputs and constants (parameters, buffers, optimizer state, the
  gradients a step accumulates into, the step's inputs) are live before the
  step and are never freed by it: the caller and the module hold them.
  Tensors that share a storage (tied weights) are counted once.

Categories: ``parameters``, ``buffers`` (buffers and constants),
``optimizer_state``, ``inputs``, ``gradients`` (gradient state and the
gradients the step returns), ``outputs`` (the user's returned tensors),
``activations`` (made by a forward op and read by a backward op, through any
alias) and ``temporaries`` (every other intermediate).

``live_bytes`` is measured after the node's frees. While a node runs, its
outputs exist next to inputs freed after it, so the step's peak is the
largest ``live_bytes + freed_bytes`` of a node: the high-water mark an
allocator sees.

Kernel workspace (``workspace``): scratch a kernel allocates and frees inside
one call (oneDNN convolutions and batch norms reorder inputs and weights into
buffers of their own), which shapes cannot predict. It is measured once,
during the first replayed step, from torch.profiler's allocator events
(``graphprof/runtime/workspace.py``) and given to this pass as node name ->
(peak bytes, bytes allocated). It adds its total to the step's allocated
bytes and its peak to the node's high-water mark (live before the node + the
node's allocations + its workspace peak); when that node is the step's
peak, the peak's breakdown gets a ``workspace`` category. Without a
measurement (``profiling=False``, the first cycle of some schedules) the
figures are the shape-based ones.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.fx

from graphprof.passes.annotate import is_op_node
from graphprof.passes.memory_storages import Storage, StorageModel, slot_ids
from graphprof.passes.records import (
    ANNOTATION,
    MEMORY,
    MEMORY_STEP,
    STATE,
    MemoryEffect,
    PeakTensorRecord,
    StepMemoryRecord,
)
from graphprof.profile.model import MEMORY_CATEGORIES, Phase

CATEGORIES = MEMORY_CATEGORIES
_LARGEST_AT_PEAK = 10


def _release_points(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.fx.Node | None]:
    """For each value node, the node after which generated code drops it (None: never)."""
    release: dict[torch.fx.Node, torch.fx.Node | None] = {}
    for node in reversed(gm.graph.nodes):
        for inp in node.all_input_nodes:
            if inp not in release:
                release[inp] = None if node.op == "output" else node
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr") or STATE in node.meta:
            release[node] = None
        elif node not in release and node.op != "output":
            release[node] = node  # unused: dropped right after it is made
    return release


def _output_parts(gm: torch.fx.GraphModule) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """Nodes the step returns to the user, and those it returns as gradients.

    Whole-step capture returns ``((user_outputs, grads),)``; any other layout
    is taken as user outputs only.
    """
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is None:
        return [], []
    result = output.args[0] if output.args else None
    parts: list[list[torch.fx.Node]] = [[], []]

    def collect(arg: Any, into: list[torch.fx.Node]) -> None:
        def add(n: torch.fx.Node) -> torch.fx.Node:
            into.append(n)
            return n

        torch.fx.map_arg(arg, add)

    if isinstance(result, (list, tuple)) and len(result) == 2 and all(isinstance(p, (list, tuple)) for p in result):
        collect(result[0], parts[0])
        collect(result[1], parts[1])
    else:
        collect(result, parts[0])
    return parts[0], parts[1]


def _phase(node: torch.fx.Node) -> Phase:
    ann = node.meta.get(ANNOTATION)
    return ann.phase if ann is not None else Phase.OTHER


def _categorise(model: StorageModel, gm: torch.fx.GraphModule) -> None:
    user_out, grad_out = _output_parts(gm)
    returned_grads = {sid for n in grad_out for sid in slot_ids(model.slots.get(n))}
    returned_user = {sid for n in user_out for sid in slot_ids(model.slots.get(n))}
    read_in_backward: set[int] = set()
    for node in gm.graph.nodes:
        if is_op_node(node) and _phase(node) is Phase.BACKWARD:
            for inp in node.all_input_nodes:
                read_in_backward.update(slot_ids(model.slots.get(inp)))
    for sid, storage in enumerate(model.storages):
        if storage.persistent:
            continue
        if sid in returned_grads:
            storage.category = "gradients"
        elif sid in returned_user:
            storage.category = "outputs"
        elif storage.producer is not None and _phase(storage.producer) is Phase.FORWARD and sid in read_in_backward:
            storage.category = "activations"
        else:
            storage.category = "temporaries"


def memory(gm: torch.fx.GraphModule, workspace: Mapping[str, tuple[int, int]] | None = None) -> torch.fx.GraphModule:
    """Write a MemoryEffect on every op node and a StepMemoryRecord on the output; returns ``gm``.

    ``workspace`` maps node names to measured (peak bytes, bytes allocated)
    of kernel scratch (see the module docstring); run again with it once measured.
    """
    workspace = workspace or {}
    model = StorageModel(gm)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr") or STATE in node.meta:
            model.slots[node] = model.state(node)
        elif node.op == "call_function":
            model.slots[node] = model.op(node)
    _categorise(model, gm)

    # A storage dies after the last release among the values that refer to it.
    release = _release_points(gm)
    holders_left: dict[int, int] = {}
    kept: set[int] = {sid for sid, s in enumerate(model.storages) if s.persistent}
    for node, slots in model.slots.items():
        for sid in set(slot_ids(slots)):
            if release.get(node) is None:
                kept.add(sid)
            holders_left[sid] = holders_left.get(sid, 0) + 1
    released_at: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for value, point in release.items():
        if point is not None and value in model.slots:
            released_at.setdefault(point, []).append(value)

    live: dict[int, int] = {sid: s.nbytes for sid, s in enumerate(model.storages) if s.persistent}
    by_category = dict.fromkeys(CATEGORIES, 0)
    for sid in live:
        by_category[model.storages[sid].category] += model.storages[sid].nbytes
    live_bytes = sum(live.values())
    op_nodes = [n for n in gm.graph.nodes if is_op_node(n)]
    made_at: dict[int, int] = {}
    freed_at: dict[int, int] = {}
    peak_bytes, peak_index, peak_workspace = live_bytes, -1, 0
    total_allocated = 0
    for index, node in enumerate(op_nodes):
        allocated = model.allocated_by.get(node, [])
        for sid in allocated:
            live[sid] = model.storages[sid].nbytes
            by_category[model.storages[sid].category] += model.storages[sid].nbytes
            made_at[sid] = index
        allocated_bytes = sum(model.storages[sid].nbytes for sid in allocated)
        workspace_peak, workspace_allocated = workspace.get(node.name, (0, 0))
        total_allocated += allocated_bytes + workspace_allocated
        during = live_bytes + allocated_bytes
        if during + workspace_peak > peak_bytes:
            peak_bytes, peak_index, peak_workspace = during + workspace_peak, index, workspace_peak
        freed_bytes = 0
        for value in released_at.get(node, []):
            for sid in set(slot_ids(model.slots[value])):
                holders_left[sid] -= 1
                if holders_left[sid] == 0 and sid not in kept and sid in live:
                    nbytes = live.pop(sid)
                    by_category[model.storages[sid].category] -= nbytes
                    freed_bytes += nbytes
                    freed_at[sid] = index
        live_bytes = during - freed_bytes
        node.meta[MEMORY] = MemoryEffect(
            allocated_bytes=allocated_bytes,
            freed_bytes=freed_bytes,
            live_bytes=live_bytes,
            live_by_category_bytes={c: b for c, b in by_category.items() if b},
        )

    # Alive at the high-water mark of the peak node: made at or before it, freed at or after it.
    at_peak = [
        sid for sid, s in enumerate(model.storages)
        if (s.persistent or made_at.get(sid, len(op_nodes)) <= peak_index)
        and freed_at.get(sid, len(op_nodes)) >= peak_index
    ]
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is not None:
        peak_node = op_nodes[peak_index] if peak_index >= 0 else None
        output.meta[MEMORY_STEP] = _step_record(model, peak_bytes, peak_node, at_peak, live_bytes, total_allocated,
                                                peak_workspace)
    return gm


def _step_record(model: StorageModel, peak_bytes: int, peak_node: torch.fx.Node | None, at_peak: list[int],
                 end_bytes: int, allocated_bytes: int, workspace_bytes: int = 0) -> StepMemoryRecord:
    by_category = dict.fromkeys(CATEGORIES, 0)
    for sid in at_peak:
        by_category[model.storages[sid].category] += model.storages[sid].nbytes
    if workspace_bytes:
        by_category["workspace"] = workspace_bytes  # only at the peak node: scratch outlives no op
    largest = sorted(at_peak, key=lambda sid: -model.storages[sid].nbytes)[:_LARGEST_AT_PEAK]
    return StepMemoryRecord(
        start_bytes=sum(s.nbytes for s in model.storages if s.persistent),
        end_bytes=end_bytes,
        allocated_bytes=allocated_bytes,
        peak_bytes=peak_bytes,
        peak_node=peak_node.name if peak_node is not None else "",
        peak_by_category_bytes={c: b for c, b in by_category.items() if b},
        largest_at_peak=tuple(_peak_tensor(model.storages[sid]) for sid in largest),
    )


def _peak_tensor(storage: Storage) -> PeakTensorRecord:
    return PeakTensorRecord(
        name=storage.name,
        nbytes=storage.nbytes,
        category=storage.category,
        producer=storage.producer.name if storage.producer is not None else "",
    )
