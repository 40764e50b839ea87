"""The advisor: rules that turn profile evidence into findings with a hint.

Each rule is a small function ``(AdvisorContext) -> list[Finding]``, listed
in ``RULES``. A finding names what was seen, how much step time is at stake,
what to try, and the nodes and source lines involved. Rules only read the
Profile (and its roofline), so they run on saved profiles without torch.

Thresholds are module constants with the reason next to them; a rule stays
quiet below them so clean programs get no findings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphprof.analysis.eager import eager_overhead as measure_eager_overhead
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.node_arrays import column_mask, graph_spans
from graphprof.analysis.roofline import (BOUNDS, OVERHEAD_RATIO, Bound, Peaks, RooflineBounds, RooflinePoint,
                                         roofline_bounds)
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import NS_PER_S, Phase, Profile

#: A finding about less than this share of step time is noise.
MIN_SHARE = 0.02
#: Dispatch-bound runs: this many consecutive overhead-bound nodes at least.
MIN_TINY_RUN = 20
#: A single-tensor optimizer loop: at least this many optimizer-phase ops.
MIN_OPTIMIZER_OPS = 20
HOST_READ_TYPES = {"_local_scalar_dense", "item", "tolist", "numpy", "nonzero", "__bool__", "__float__", "__int__"}
LAYOUT_COPY_TYPES = {"clone", "contiguous", "_to_copy", "copy", "copy_"}
MATMUL_TYPES = {"mm", "addmm", "bmm", "baddbmm", "matmul", "convolution", "convolution_backward",
                "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}
SLOW_CONV_BACKENDS = {"Slow2d", "SlowDilated2d", "SlowTranspose2d", "SlowDilated3d", "SlowTranspose3d",
                      "Slow3d", "NnpackSpatial", "Empty"}
SLOW_CONV_TYPES = {"_slow_conv2d_forward", "_slow_conv2d_backward", "thnn_conv2d", "slow_conv3d",
                   "slow_conv_dilated2d", "slow_conv_transpose2d"}
ACTIVATION_CATEGORIES = ("activations",)
#: Below this peak, memory is no bottleneck on any machine graphprof runs on.
ACTIVATION_PEAK_MIN_BYTES = 256 * 2**20


class Severity(str, enum.Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


@dataclass(frozen=True)
class Finding:
    """One piece of advice: what, how much time is at stake, what to do, where."""

    rule: str
    severity: Severity
    title: str
    time_s: float
    hint: str
    nodes: tuple[tuple[int, int], ...]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class AdvisorContext:
    """What every rule may read: the profile, its node frame, node times and roofline bounds.

    Rules read nodes by index into the frame's columns (execution order over
    all graphs), never as records: a rule is a pass over a few columns.
    """

    profile: Profile
    frame: NodeFrame
    times: Sequence[float]
    bounds: RooflineBounds
    step_time_s: float

    def column(self, name: str) -> list:
        return self.frame.column(name)

    def spans(self) -> list[tuple[int, int]]:
        """Each graph's (start, end) in the frame, in ``profile.graphs`` order."""
        return graph_spans(self.profile, self.frame)

    def share(self, seconds: float) -> float:
        return seconds / self.step_time_s if self.step_time_s > 0 else 0.0


def _finding(ctx: AdvisorContext, rule: str, title: str, hint: str,
             hits: Sequence[int], severity: Severity | None = None) -> Finding:
    times = ctx.times
    seconds = sum([times[i] for i in hits])
    if severity is None:
        share = ctx.share(seconds)
        severity = Severity.HIGH if share >= 0.2 else Severity.MEDIUM if share >= 0.05 else Severity.LOW
    source, graph_id, node_id = ctx.column("source"), ctx.column("graph_id"), ctx.column("id")
    sources = tuple(dict.fromkeys(source[i] for i in hits if source[i]))
    return Finding(rule, severity, title, seconds, hint, tuple((graph_id[i], node_id[i]) for i in hits), sources)


def _mask(ctx: AdvisorContext, name: str, test: Callable[[Any], bool]) -> np.ndarray:
    """Where ``test`` holds for a column (judged once per distinct value)."""
    return column_mask(ctx.frame, name, test)


def _indices(mask: np.ndarray) -> list[int]:
    return np.flatnonzero(mask).tolist()


_NOT_OPTIMIZER = lambda phase: phase != Phase.OPTIMIZER.value  # noqa: E731


# -- rules --------------------------------------------------------------------
def host_sync(ctx: AdvisorContext) -> list[Finding]:
    """Host reads of tensor values: a device sync on accelerators, a graph break under torch.compile."""
    hits = _indices(_mask(ctx, "type", HOST_READ_TYPES.__contains__) & _mask(ctx, "phase", _NOT_OPTIMIZER))
    if not hits:
        return []
    accelerator = ctx.profile.meta.device_type not in ("cpu", "")
    return [_finding(
        ctx, "host-sync", f"{len(hits)} host read(s) of tensor values (.item(), .numpy(), nonzero ...)",
        "each waits for the device to finish and breaks torch.compile graphs; log scalars every N steps, "
        "keep values on the device, or read them after the step",
        hits, None if accelerator else Severity.LOW,
    )]


def _cross_device_copy(op_type: str, attrs: tuple) -> bool:
    if not attrs:  # no devices recorded: not a cross-device copy
        return False
    devices = dict(attrs).get("devices", "")
    return op_type in ("_to_copy", "copy_", "to") and "," in devices and len(set(devices.split(","))) > 1


def device_copies(ctx: AdvisorContext) -> list[Finding]:
    """Copies between host and device inside the step."""
    types, attrs = ctx.column("type"), ctx.column("attrs")
    copies = _mask(ctx, "type", lambda t: t in ("_to_copy", "copy_", "to"))
    hits = [i for i in _indices(copies) if _cross_device_copy(types[i], attrs[i])]
    if not hits:
        return []
    return [_finding(ctx, "device-copy", f"{len(hits)} host<->device copies inside the step",
                     "move data once before the loop, use pin_memory() with non_blocking=True, "
                     "or create tensors on the device directly", hits)]


def float64_work(ctx: AdvisorContext) -> list[Finding]:
    flops = ctx.column("flops")
    hits = [i for i in _indices(_mask(ctx, "in_dtypes", lambda dtypes: "float64" in dtypes)) if (flops[i] or 0) > 0]
    if not hits:
        return []
    return [_finding(ctx, "float64", f"{len(hits)} ops compute in float64",
                     "float64 runs at a fraction of float32 speed (far less on GPUs); use float32 "
                     "(torch.set_default_dtype, model.float(), check torch.tensor(...) of Python floats)", hits)]


def slow_convolution(ctx: AdvisorContext) -> list[Finding]:
    findings = []
    types, attrs_of, modules = ctx.column("type"), ctx.column("attrs"), ctx.column("module")
    # Only a recorded backend can make ops other than the slow kernels slow.
    for i in _indices(_mask(ctx, "attrs", bool) | _mask(ctx, "type", SLOW_CONV_TYPES.__contains__)):
        op_type, attrs = types[i], attrs_of[i]
        recorded = dict(attrs)
        backend = recorded.get("conv_backend", "")
        slow = op_type in SLOW_CONV_TYPES or (backend in SLOW_CONV_BACKENDS and recorded.get("fast_conv_available"))
        time_s = ctx.times[i]
        if slow and ctx.share(time_s) >= MIN_SHARE / 4:
            findings.append(_finding(
                ctx, "slow-conv", f"{op_type} in {modules[i] or 'the step'} takes the slow path ({backend or op_type})",
                "a fast convolution backend exists on this device but was not used: check "
                "torch.backends.mkldnn.enabled / torch.backends.cudnn.enabled, dtype and memory format",
                [i], Severity.HIGH if ctx.share(time_s) >= 0.05 else Severity.MEDIUM))
    return findings


def dispatch_bound_runs(ctx: AdvisorContext) -> list[Finding]:
    """Long runs of tiny ops whose time is overhead, not arithmetic or traffic."""
    findings = []
    ids = ctx.column("id")
    overhead = ctx.bounds.codes == BOUNDS.index(Bound.OVERHEAD)
    for start, end in ctx.spans():
        # Runs of overhead-bound nodes inside the graph: where the mask turns on, and off again.
        edges = np.flatnonzero(np.diff(overhead[start:end].astype(np.int8), prepend=0, append=0))
        for first, stop in zip(edges[::2].tolist(), edges[1::2].tolist()):
            run = range(start + first, start + stop)
            if len(run) >= MIN_TINY_RUN and ctx.share(sum([ctx.times[i] for i in run])) >= MIN_SHARE:
                findings.append(_finding(
                    ctx, "dispatch-bound", f"{len(run)} consecutive tiny ops (nodes {ids[run[0]]}-{ids[run[-1]]}) "
                    "are bound by per-op overhead",
                    "fuse them: torch.compile, a fused or foreach implementation, or larger tensors per op", run))
    return findings


def _layout_copy(op_type: str, phase: str, in_dtypes: tuple, out_dtypes: tuple) -> bool:
    return (op_type in LAYOUT_COPY_TYPES and phase != Phase.OPTIMIZER.value
            and len(set(filter(None, in_dtypes + out_dtypes))) <= 1)


def layout_copies(ctx: AdvisorContext) -> list[Finding]:
    types, phases, in_dtypes, out_dtypes = (ctx.column(name) for name in ("type", "phase", "in_dtypes", "out_dtypes"))
    hits = [i for i in _indices(_mask(ctx, "type", LAYOUT_COPY_TYPES.__contains__))
            if _layout_copy(types[i], phases[i], in_dtypes[i], out_dtypes[i])]
    if not hits or ctx.share(sum([ctx.times[i] for i in hits])) < MIN_SHARE:
        return []
    return [_finding(ctx, "layout-copy", f"{len(hits)} layout copies (contiguous/clone/permute copies)",
                     "avoid .contiguous() after transpose/permute where the consumer accepts strides, "
                     "use view-friendly layouts (e.g. keep heads last) or channels_last end to end", hits)]


def slow_matmuls(ctx: AdvisorContext) -> list[Finding]:
    slow = _mask(ctx, "type", MATMUL_TYPES.__contains__) & (ctx.bounds.codes == BOUNDS.index(Bound.SLOW))
    hits = [i for i in _indices(slow) if ctx.share(ctx.times[i]) >= MIN_SHARE / 2]
    if not hits:
        return []
    return [_finding(ctx, "slow-matmul", f"{len(hits)} matmuls/convolutions run at under "
                     f"{100 * 0.1:.0f}% of the attainable rate",
                     "check shapes (tiny or odd dimensions), dtype (use bf16/tf32 where the device runs them "
                     "fast), memory format and thread count; compare with graphprof calibrate's peaks", hits)]


def activation_peak(ctx: AdvisorContext) -> list[Finding]:
    findings = []
    ids = ctx.column("id")
    for graph, (start, end) in zip(ctx.profile.graphs, ctx.spans()):
        peak = getattr(graph, "memory_peak", None)
        if peak is None or getattr(peak, "live_bytes", 0) < ACTIVATION_PEAK_MIN_BYTES:
            continue
        by_cat = dict(getattr(peak, "by_category_bytes", {}) or {})
        activations = sum(v for k, v in by_cat.items() if k.startswith(ACTIVATION_CATEGORIES))
        if activations / peak.live_bytes >= 0.5:
            hits = next(([i] for i in range(start, end) if ids[i] == peak.node_id), [])
            f = _finding(ctx, "activation-peak",
                         f"activations saved for backward are {100 * activations / peak.live_bytes:.0f}% "
                         f"of the memory peak ({peak.live_bytes / 2**20:.1f} MiB)",
                         "activation checkpointing (torch.utils.checkpoint) trades recomputation for memory; "
                         "so do smaller micro-batches or lower-precision activations", hits, Severity.MEDIUM)
            findings.append(f)
    return findings


def single_tensor_optimizer(ctx: AdvisorContext) -> list[Finding]:
    hits = _indices(_mask(ctx, "phase", lambda phase: phase == Phase.OPTIMIZER.value))
    ops = ctx.column("op")
    if len(hits) < MIN_OPTIMIZER_OPS or any("_foreach_" in ops[i] or "_fused_" in ops[i] for i in hits):
        return []
    if ctx.share(sum([ctx.times[i] for i in hits])) < MIN_SHARE:
        return []
    return [_finding(ctx, "single-tensor-optimizer",
                     f"the optimizer updates parameters one tensor at a time ({len(hits)} ops)",
                     "pass foreach=True (or fused=True for SGD/Adam/AdamW) to the optimizer: "
                     "one multi-tensor kernel per step instead of several ops per parameter", hits)]


#: Launch-bound: a node runs at the host's pace when its device time is within this fraction of its
#: host (dispatch) time. In a pipelined step whose device waits for launches, the device reaches each
#: node's end event just after the host records it, so device and host times of a node agree closely.
LAUNCH_TRACK_TOLERANCE = 0.25
#: ... and the step is launch-bound when such nodes (whose roofline time is also far below their
#: device time) hold at least this share of a graph's device time, over at least this many nodes.
LAUNCH_BOUND_SHARE = 0.5
LAUNCH_BOUND_MIN_NODES = 10


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    half = len(s) // 2
    return s[half] if len(s) % 2 else (s[half - 1] + s[half]) / 2


def _median_s(samples_ns: Sequence[int]) -> float:
    """The median of a node's samples in seconds (``NodeRecord.host_time_s``), as the rule has always taken it."""
    return _median([t / NS_PER_S for t in samples_ns])


def launch_bound(ctx: AdvisorContext) -> list[Finding]:
    """A step whose device idles while the host dispatches: device self times track host dispatch times.

    Needs device times (an accelerator profile). A node is host-paced when
    its median device time is within ``LAUNCH_TRACK_TOLERANCE`` of its
    median host time and, where the roofline is known, the roofline time is
    under ``OVERHEAD_RATIO`` of the device time (the kernel itself is short;
    the rest is waiting for the launch). When the device is the bottleneck
    the host runs ahead and device times far exceed dispatch times, so the
    rule stays quiet.
    """
    findings: list[Finding] = []
    has_device = ctx.frame.sampled("device_time_ns")
    if not has_device.any():  # a CPU profile: no sample column of tuples is needed
        return findings
    host_ns, device_ns = ctx.column("host_time_ns"), ctx.column("device_time_ns")
    roofline_s = ctx.bounds.roofline_time_s
    for graph, (start, end) in zip(ctx.profile.graphs, ctx.spans()):
        timed = [i for i in range(start, end) if device_ns[i] and host_ns[i]] if has_device[start:end].any() else []
        if not timed:
            continue
        device_total = 0.0
        hits: list[int] = []
        paced_s = 0.0
        for i in timed:
            host, device = _median_s(host_ns[i]), _median_s(device_ns[i])
            device_total += device
            if host <= 0 or abs(device - host) > LAUNCH_TRACK_TOLERANCE * host:
                continue
            roof = float(roofline_s[i])
            if roof == roof and roof >= OVERHEAD_RATIO * device:  # NaN: no roofline time
                continue
            hits.append(i)
            paced_s += device
        if len(hits) < LAUNCH_BOUND_MIN_NODES or device_total <= 0 or paced_s < LAUNCH_BOUND_SHARE * device_total:
            continue
        findings.append(_finding(
            ctx, "launch-bound",
            f"launch-bound: the device idles while the host dispatches ({len(hits)} of {len(timed)} nodes of "
            f"{graph.name}, {100 * paced_s / device_total:.0f}% of its device time, run at the host's pace)",
            "the device's pace is set by Python and kernel launches, not by its kernels: replay the step as a "
            "device graph (CUDA graphs, e.g. torch.compile(mode=\"reduce-overhead\")), fuse small ops "
            "(torch.compile), use foreach/fused optimizers, or give each kernel more work (larger batches)",
            hits))
    return findings


def recompiles(ctx: AdvisorContext) -> list[Finding]:
    """torch.compile compiled again after the first call (segmented capture): time no step table shows.

    Step times leave compile time out, so that nodes and steps add up; the
    cost is the compile time itself, from ``meta.recompiles``.
    """
    events = ctx.profile.meta.recompiles or ()
    if not events:
        return []
    seconds = sum(e.compile_time_s for e in events)
    last = events[-1]
    severity = Severity.HIGH if len(events) > 2 else Severity.MEDIUM
    return [Finding(
        "recompiles", severity,
        f"torch.compile compiled {len(events)} time(s) after the first call ({seconds:.3g} s), last: "
        f"{last.graphs} because {last.reason}",
        seconds,
        "keep what the guards check stable across calls (input shapes, Python attributes the forward "
        "reads, module modes); torch.compile(dynamic=True) or torch._dynamo.mark_dynamic for shapes that vary",
        (), ())]


def eager_overhead(ctx: AdvisorContext) -> list[Finding]:
    """Python, module-call and autograd bookkeeping of the eager step that the replayed graph does not pay.

    Both times are measured (``analysis/eager.py``): warm eager calls of the
    user's function against the profiled replays less their probes. Quiet
    without warm eager calls or when the gap is within noise.
    """
    found = measure_eager_overhead(ctx.profile)
    if found is None or not found.significant:
        return []
    share = found.share
    return [Finding(
        "eager-overhead", Severity.HIGH if share >= 0.2 else Severity.MEDIUM,
        f"eager execution takes {found.speedup:.2f}x the replayed graph's step time "
        f"({found.eager_s * 1e3:.3g} ms vs {found.replay_s * 1e3:.3g} ms, {found.stat} of {found.eager_calls} warm "
        f"eager call(s) and {found.replay_steps} replay(s)): {100 * share:.0f}% of the eager step is Python, "
        "module-call and autograd bookkeeping",
        found.overhead_s,
        "the static graph runs the same ops without it: torch.compile the step (on CUDA mode=\"reduce-overhead\" "
        "adds CUDA graphs) to remove it in training; else fewer, larger modules and no per-step Python work "
        "(logging, data reshaping) inside the step",
        (), (),
    )]


RULES: tuple[Callable[[AdvisorContext], list[Finding]], ...] = (
    host_sync, device_copies, float64_work, slow_convolution, dispatch_bound_runs,
    layout_copies, slow_matmuls, activation_peak, single_tensor_optimizer, launch_bound, eager_overhead,
    recompiles,
)
_ORDER = {Severity.HIGH: 0, Severity.MEDIUM: 1, Severity.LOW: 2}


def advise(profile: Profile, peaks: Peaks | None = None, stat: str = "median",
           points: Sequence[RooflinePoint] | None = None, bounds: RooflineBounds | None = None) -> list[Finding]:
    """Every rule's findings, most severe and most expensive first.

    ``bounds`` (``roofline_bounds``) or ``points`` (``roofline``'s, one per node
    in frame order) may pass a roofline already computed with the same peaks and stat.
    """
    if bounds is None:
        bounds = (RooflineBounds.of_points(profile, peaks, points) if points is not None
                  else roofline_bounds(profile, peaks, stat))
    times = bounds.times
    step = stat_fn(stat)([s.wall_time_s for s in profile.steps]) if profile.steps else sum(times)
    ctx = AdvisorContext(profile, node_frame(profile), times, bounds, step)
    findings = [f for rule in RULES for f in rule(ctx)]
    findings.sort(key=lambda f: (_ORDER[f.severity], -f.time_s))
    return findings
