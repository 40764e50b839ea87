"""Kernel workspace: memory an op allocates and frees inside one call.

Why measured, not modelled: oneDNN convolutions and batch norms (and other
kernels) allocate scratch buffers (reordered copies of inputs and weights,
a second output buffer) and free them before they return. Shapes do not say
how much, so the memory pass cannot know it; the allocator can.

When: during the capture call, right after the graph is made, so no call
of the user's is spent on it (calls from the third on are all profiled).
The plain graph runs once more under ``torch.profiler.profile(activities=
[CPU], profile_memory=True)``, on *copies* of its inputs and of every tensor
it holds (parameters, buffers, gradients, optimizer state). All are copied,
not only those the op schemas mark as written: ``native_batch_norm``
updates its running statistics without saying so. The CPU random state and every ``torch.Generator`` the graph uses are put
back afterwards. So the user's tensors, results and random streams are
untouched; the cost is one more step's time and, briefly, a second copy of
the step's state, inside the capture call.

Not measured (``WorkspaceResult.reason`` says why, and the profile's
``meta.extra["workspace"]`` records it): a graph on an accelerator (this
reads the CPU allocator), a graph with collectives or Python calls other
than pure scalar arithmetic (running them again would be seen by others),
a profiler already running (profilers do not nest), or events that do not
line up with the nodes.

How events become per-node figures: top-level aten events occur in the
graph's node order; each is matched to the next op node that dispatches an
aten op (``operator.getitem`` and Python scalar arithmetic produce no
event), checking the names. Inside a matched event, allocations whose free
(same address) also happens inside it are the node's workspace:
``peak_bytes`` is the most of them outstanding at once, ``allocated_bytes``
their total. If the events do not line up with the nodes, nothing is
recorded: a guess would put memory on the wrong node.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.fx
from torch.profiler import ProfilerActivity, profile

from graphprof.passes.annotate import is_op_node
from graphprof.passes.cost_formulas import is_sparse
from graphprof.passes.graph_modules import graph_module

log = logging.getLogger("graphprof")


@dataclass(frozen=True)
class Workspace:
    """Transient bytes of one node's call: the peak outstanding and the total allocated."""

    peak_bytes: int
    allocated_bytes: int


def _event_type() -> Any:
    from torch._C._profiler import _EventType  # private, but the only per-event allocation record

    return _EventType


def _allocations(event: Any, allocation_tag: Any) -> list[tuple[int, int, int]]:
    """(time ns, signed bytes, address) of every CPU allocation event under ``event``."""
    out: list[tuple[int, int, int]] = []
    stack = [event]
    while stack:
        node = stack.pop()
        if node.tag == allocation_tag:
            fields = node.extra_fields
            if fields.device.type == "cpu":
                out.append((node.start_time_ns, int(fields.alloc_size), int(fields.ptr)))
            continue
        stack.extend(node.children)
    out.sort(key=lambda e: e[0])
    return out


def transient(events: Iterable[tuple[int, int, int]]) -> Workspace:
    """The workspace in one op's allocation events: allocations freed inside the op.

    ``events`` are (time, signed bytes, address) in time order; an allocation
    is transient when a free of the same address follows it in ``events``.
    """
    events = list(events)
    open_at: dict[int, int] = {}
    paired: set[int] = set()
    for i, (_, nbytes, ptr) in enumerate(events):
        if nbytes > 0:
            open_at[ptr] = i
        elif ptr in open_at:
            paired.update((open_at.pop(ptr), i))
    outstanding = peak = total = 0
    for i in sorted(paired):
        nbytes = events[i][1]
        outstanding += nbytes
        peak = max(peak, outstanding)
        total += max(nbytes, 0)
    return Workspace(peak, total)


def _emits_event(node: torch.fx.Node) -> bool:
    """Whether running ``node`` dispatches an aten op the profiler records at top level."""
    return is_op_node(node) and isinstance(node.target, torch._ops.OpOverload)


def attribute(gm: torch.fx.GraphModule, roots: list[Any]) -> dict[str, Workspace] | None:
    """Workspace per node name from the profiler's top-level events, or None if they do not match."""
    tags = _event_type()
    ops = [r for r in sorted(roots, key=lambda r: r.start_time_ns) if r.tag == tags.TorchOp]
    nodes = [n for n in gm.graph.nodes if _emits_event(n)]
    if len(ops) != len(nodes):
        log.debug("graphprof: workspace not recorded: %d top-level aten events for %d op nodes",
                  len(ops), len(nodes))
        return None
    out: dict[str, Workspace] = {}
    for node, event in zip(nodes, ops):
        expected = node.target._schema.name  # type: ignore[union-attr]
        if event.name != expected:
            log.debug("graphprof: workspace not recorded: node %s (%s) met profiler event %s",
                      node.name, expected, event.name)
            return None
        ws = transient(_allocations(event, tags.Allocation))
        if ws.allocated_bytes:
            out[node.name] = ws
    return out


@dataclass(frozen=True)
class WorkspaceResult:
    """Per-node workspace, or None with the reason it was not measured."""

    by_node: dict[str, Workspace] | None
    reason: str = ""

    @property
    def note(self) -> str:
        """What the profile's ``meta.extra["workspace"]`` says."""
        return "measured" if self.by_node is not None else f"not measured: {self.reason}"


_PURE_MODULES = ("_operator", "operator", "math", "builtins")
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_dtensor")


def _unsafe_to_rerun(gm: torch.fx.GraphModule) -> str:
    """Why running ``gm`` once more could be seen outside it; "" when it cannot."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if node.op != "call_function":
            return f"the graph has a {node.op} node"
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target.namespace in _COLLECTIVE_NAMESPACES:
                return "the step has collectives, which other ranks would see run twice"
        elif getattr(target, "__module__", None) not in _PURE_MODULES:
            return f"the graph calls {getattr(target, '__name__', target)!r}, which may act outside it"
    return ""


def _without_host_effects(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` as it may run once more: Python effects dropped, Python reads kept, gradients copied.

    Host nodes (capture/host_nodes.py) read Python values (pure: kept), read a
    parameter's ``.grad`` (a tensor the graph may write: a copy, as a
    constant), or act on the user's Python (a scheduler step, a counter, a
    list: dropped; nothing in the graph reads their result).
    """
    host = [n for n in gm.graph.nodes if n.op == "call_function" and getattr(n.target, "__module__", None) == "host"]
    if not host:
        return gm
    graph = torch.fx.Graph()
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, mapping)
    graph.output(out)
    copy = graph_module(gm, graph)
    for node in host:
        new = mapping[node]
        if node.meta.get("graphprof_input_reader") and node.meta.get("graphprof_scalar"):
            new.target = _PureRead(node.target)
        elif node.meta.get("graphprof_input_reader"):
            value = node.target()
            name = f"_graphprof_read_{new.name}"
            if isinstance(value, torch.Tensor):
                copy.register_buffer(name, value)
            else:
                setattr(copy, name, value)
            with graph.inserting_before(new):
                # Not ``get_attr``: it warns, checking the owner before the copy's attribute is visible,
                # and silencing it would change the filters (``step_warnings.quiet``).
                constant = graph.create_node("get_attr", name)
            new.replace_all_uses_with(constant)
            graph.erase_node(new)
        elif not new.users:
            graph.erase_node(new)
    copy.recompile()
    return copy


class _PureRead:
    """A host read, marked as free of effects for ``_unsafe_to_rerun``."""

    __module__ = "builtins"

    def __init__(self, read: Any) -> None:
        self.read = read
        self.__name__ = getattr(read, "__name__", "read")

    def __call__(self, *args: Any) -> Any:
        return self.read(*args)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides, dtype and device (the same kernels run on it).

    An expanded view (``torch.arange(S).expand(B, -1)``: position or token type ids, stride 0) has
    elements sharing memory, which ``copy_`` refuses to write into: its storage is copied whole and
    viewed with the same layout. (Copying into a tensor of those strides raised into the step.)
    A sparse tensor has neither strides nor a storage of its own: its indices and values are copied.
    """
    if is_sparse(t):
        with torch.no_grad():
            return t.clone()
    if torch._debug_has_internal_overlap(t) != 0:
        storage = t.untyped_storage().clone()
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.size(), t.stride())
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    with torch.no_grad():
        out.copy_(t)
    return out


def _generators(gm: torch.fx.GraphModule) -> list[torch.Generator]:
    """The user's random generators the graph draws from: ``get_attr`` values or constant arguments."""
    found: dict[int, torch.Generator] = {}

    def note(v: Any) -> Any:
        if isinstance(v, torch.Generator):
            found[id(v)] = v
        return v

    for node in gm.graph.nodes:
        if node.op == "get_attr":
            note(getattr(gm, node.target))
        torch.fx.node.map_aggregate((node.args, node.kwargs), note)
    return list(found.values())


#: Kineto's log level above all it prints: its ``USDT`` start and stop lines are of its highest kind (5).
_KINETO_SILENT = "6"


@contextmanager
def _kineto_silent() -> Iterator[None]:
    """Kineto's log level set above everything while this run starts the profiler, unless the user set one.

    Why: torch 2.13's Kineto prints ``USDT: ... profiler_start`` and
    ``profiler_stop`` to stderr (fd 2) whenever a profiler starts, so every
    capture printed lines the user's eager step never does. Kineto reads
    ``KINETO_LOG_LEVEL`` once, when the process first starts a profiler; it is
    set in the C environment only (``os.putenv``: the user's ``os.environ`` is
    not touched) and removed straight after. Where the user started a profiler
    first, Kineto keeps the level it read then; where this run is the first, the
    process's later profilers print no Kineto lines either (README, "Memory").
    """
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.putenv("KINETO_LOG_LEVEL", _KINETO_SILENT)
    try:
        yield
    finally:
        os.unsetenv("KINETO_LOG_LEVEL")


def measure_on_copies(gm: torch.fx.GraphModule, inputs: list[Any],
                      compile_graph: Callable[..., Callable[..., Any]]) -> WorkspaceResult:
    """Run ``gm`` once on copies of what it writes, under torch.profiler; the workspace per node.

    ``inputs`` are the graph's placeholder values (the user's tensors, only
    read here); ``compile_graph(gm, constants)`` makes the code to run
    (runtime/codegen.py). Never raises for a graph it cannot measure.
    """
    from graphprof.runtime.allocator import graph_device_types

    if torch.autograd.profiler._is_profiler_enabled:
        return WorkspaceResult(None, "a profiler was already running (profilers do not nest)")
    devices = graph_device_types(gm)
    if devices - {"cpu"}:
        return WorkspaceResult(None, f"the graph runs on {', '.join(sorted(devices - {'cpu'}))}; "
                                     "the measurement reads the CPU allocator")
    gm = _without_host_effects(gm)
    reason = _unsafe_to_rerun(gm)
    if reason:
        return WorkspaceResult(None, reason)
    # Every tensor is copied, not only those the schemas say are written: some
    # ops write without saying so (native_batch_norm's running statistics).
    constants = {n.target: _copy(getattr(gm, n.target)) for n in gm.graph.nodes
                 if n.op == "get_attr" and isinstance(getattr(gm, n.target), torch.Tensor)}
    args = [_copy(v) if isinstance(v, torch.Tensor) else v for v in inputs]
    try:
        run = compile_graph(gm, constants)
    except ValueError as exc:
        return WorkspaceResult(None, str(exc))
    generators = [(g, g.get_state()) for g in _generators(gm)]
    rng = torch.get_rng_state()
    try:
        with _kineto_silent(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
                torch.no_grad():
            run(*args)
    except Exception as exc:  # the user's step already ran; a failed measurement only loses the figures
        log.debug("graphprof: workspace not recorded: %r", exc)
        return WorkspaceResult(None, f"the measuring run failed ({type(exc).__name__})")
    finally:
        torch.set_rng_state(rng)
        for g, state in generators:
            g.set_state(state)
        del constants, args
    try:
        roots = list(prof.profiler.kineto_results.experimental_event_tree())
    except (AttributeError, RuntimeError) as exc:  # a torch without the event tree
        return WorkspaceResult(None, f"torch.profiler gave no event tree ({exc})")
    by_node = attribute(gm, roots)
    if by_node is None:
        return WorkspaceResult(None, "torch.profiler's events did not line up with the graph's nodes")
    return WorkspaceResult(by_node)
