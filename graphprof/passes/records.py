"""The ``node.meta`` keys graphprof writes, and the typed record under each.

One place for all of them, so a pass documents what it reads and writes by
naming keys from this module. Each key holds one frozen dataclass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from graphprof.profile.model import Phase
from graphprof.profile.records import AttrValue

#: Facts only known while the function runs under capture (CaptureRecord).
CAPTURE = "graphprof.capture"
#: Where a graph input or constant comes from (StateRecord).
STATE = "graphprof.state"
#: What the annotate pass derived for an op node (OpAnnotation).
ANNOTATION = "graphprof.annotation"
#: Cost model output (CostRecord), written by the cost pass.
COST = "graphprof.cost"
#: Marks a probe node inserted by the instrument pass (ProbeRecord).
PROBE = "graphprof.probe"
#: On an op node of the instrumented graph's source: the ProbeRecord of the probe just after it,
#: written by the instrument pass; its ``slot`` is how the node's samples are found in a step's stamps.
PROBE_AFTER = "graphprof.probe_after"
#: Modelled memory of an op node (MemoryEffect), written by the memory pass.
MEMORY = "graphprof.memory"
#: The step's modelled peak, on the output node (StepMemoryRecord), written by the memory pass.
MEMORY_STEP = "graphprof.memory.step"
#: Op-specific facts for the advisor (OpAttrs), written by the op_attrs pass.
ATTRS = "graphprof.attrs"
#: On the reader of a sparse constant, whose ``val`` make_fx leaves None: a meta tensor with its layout,
#: sizes, dtypes and number of stored elements, and no data (``op_call.note_sparse``); the one key that
#: holds no record.
SPARSE_VALUE = "graphprof.sparse_value"
#: Set on scalar arithmetic nodes recorded from ``.item()`` values.
SCALAR = "graphprof_scalar"


class StateRole(str, enum.Enum):
    """What a graph input or constant tensor is to the user."""

    INPUT = "input"
    PARAMETER = "parameter"
    BUFFER = "buffer"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    CONSTANT = "constant"


@dataclass(frozen=True)
class CaptureRecord:
    """Context of one op at capture: module, source line, phase and user scope.

    Backward ops carry the module and source of the forward op they
    differentiate (matched through autograd sequence numbers).
    """

    module: str
    module_type: str
    source: str
    phase: Phase
    scope: str


@dataclass(frozen=True)
class StateRecord:
    """Name and role of a placeholder or get_attr node (parameters, state, inputs)."""

    name: str
    role: StateRole
    module: str = ""


@dataclass(frozen=True)
class TensorInfo:
    """Static description of one tensor value."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    device: str
    nbytes: int


@dataclass(frozen=True)
class OpAnnotation:
    """Everything the annotate pass knows about an op node."""

    index: int
    op: str
    type: str
    inputs: tuple[str, ...]
    in_tensors: tuple[TensorInfo, ...]
    out_tensors: tuple[TensorInfo | None, ...]
    module: str
    module_type: str
    source: str
    phase: Phase
    scope: str
    is_view: bool
    is_inplace: bool


@dataclass(frozen=True)
class CostRecord:
    """FLOPs and bytes moved by one op; ``flops`` is None when no formula exists."""

    flops: int | None
    bytes_read: int
    bytes_written: int


@dataclass(frozen=True)
class ProbeRecord:
    """A probe node: ``slot`` is the index of the sample it writes in a step."""

    slot: int
    after: str


@dataclass(frozen=True)
class MemoryEffect:
    """What one op node does to memory: bytes it allocates, frees, and live after it.

    ``live_by_category_bytes`` splits ``live_bytes`` into the memory pass's
    categories (parameters, gradients, activations, ...); zero entries are left out.
    """

    allocated_bytes: int
    freed_bytes: int
    live_bytes: int
    live_by_category_bytes: Mapping[str, int]


@dataclass(frozen=True)
class PeakTensorRecord:
    """A storage alive at the step's peak: ``producer`` is its op node ('' for graph inputs and state)."""

    name: str
    nbytes: int
    category: str
    producer: str


@dataclass(frozen=True)
class StepMemoryRecord:
    """The step's modelled memory: live bytes before and after it, and its peak.

    ``peak_bytes`` is the high-water mark while ``peak_node`` runs (its
    outputs exist next to the inputs it frees).
    """

    start_bytes: int
    end_bytes: int
    allocated_bytes: int
    peak_bytes: int
    peak_node: str
    peak_by_category_bytes: Mapping[str, int]
    largest_at_peak: tuple[PeakTensorRecord, ...]


@dataclass(frozen=True)
class OpAttrs:
    """Op-specific facts as sorted (key, value) pairs, typed (conv backend, copy devices, collective sizes)."""

    items: tuple[tuple[str, AttrValue], ...]
