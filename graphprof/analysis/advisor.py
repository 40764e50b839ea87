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
from typing import Callable, Iterable, Sequence

from graphprof.analysis.eager import eager_overhead as measure_eager_overhead
from graphprof.analysis.roofline import OVERHEAD_RATIO, Bound, Peaks, RooflinePoint, roofline
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import GraphRecord, NodeRecord, Phase, Profile

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
    """What every rule may read: the profile, node times, roofline points."""

    profile: Profile
    times: dict[tuple[int, int], float]
    points: dict[tuple[int, int], RooflinePoint]
    step_time_s: float

    def nodes(self) -> Iterable[tuple[GraphRecord, NodeRecord]]:
        return self.profile.iter_nodes()

    def time(self, graph: GraphRecord, node: NodeRecord) -> float:
        return self.times[(graph.id, node.id)]

    def share(self, seconds: float) -> float:
        return seconds / self.step_time_s if self.step_time_s > 0 else 0.0


def _attrs(node: NodeRecord) -> dict:
    return dict(getattr(node, "attrs", None) or {})


def _finding(ctx: AdvisorContext, rule: str, title: str, hint: str,
             hits: Sequence[tuple[GraphRecord, NodeRecord]], severity: Severity | None = None) -> Finding:
    seconds = sum(ctx.time(g, n) for g, n in hits)
    if severity is None:
        share = ctx.share(seconds)
        severity = Severity.HIGH if share >= 0.2 else Severity.MEDIUM if share >= 0.05 else Severity.LOW
    sources = tuple(dict.fromkeys(n.source for _, n in hits if n.source))
    return Finding(rule, severity, title, seconds, hint, tuple((g.id, n.id) for g, n in hits), sources)


# -- rules --------------------------------------------------------------------
def host_sync(ctx: AdvisorContext) -> list[Finding]:
    """Host reads of tensor values: a device sync on accelerators, a graph break under torch.compile."""
    hits = [(g, n) for g, n in ctx.nodes() if n.type in HOST_READ_TYPES and n.phase is not Phase.OPTIMIZER]
    if not hits:
        return []
    accelerator = ctx.profile.meta.device_type not in ("cpu", "")
    return [_finding(
        ctx, "host-sync", f"{len(hits)} host read(s) of tensor values (.item(), .numpy(), nonzero ...)",
        "each waits for the device to finish and breaks torch.compile graphs; log scalars every N steps, "
        "keep values on the device, or read them after the step",
        hits, None if accelerator else Severity.LOW,
    )]


def device_copies(ctx: AdvisorContext) -> list[Finding]:
    """Copies between host and device inside the step."""
    hits = []
    for g, n in ctx.nodes():
        if not n.attrs:  # no devices recorded: not a cross-device copy
            continue
        devices = _attrs(n).get("devices", "")
        if n.type in ("_to_copy", "copy_", "to") and "," in devices and len(set(devices.split(","))) > 1:
            hits.append((g, n))
    if not hits:
        return []
    return [_finding(ctx, "device-copy", f"{len(hits)} host<->device copies inside the step",
                     "move data once before the loop, use pin_memory() with non_blocking=True, "
                     "or create tensors on the device directly", hits)]


def float64_work(ctx: AdvisorContext) -> list[Finding]:
    hits = [(g, n) for g, n in ctx.nodes() if "float64" in n.in_dtypes and (n.flops or 0) > 0]
    if not hits:
        return []
    return [_finding(ctx, "float64", f"{len(hits)} ops compute in float64",
                     "float64 runs at a fraction of float32 speed (far less on GPUs); use float32 "
                     "(torch.set_default_dtype, model.float(), check torch.tensor(...) of Python floats)", hits)]


def slow_convolution(ctx: AdvisorContext) -> list[Finding]:
    findings = []
    for g, n in ctx.nodes():
        if not n.attrs and n.type not in SLOW_CONV_TYPES:  # only a recorded backend can make other ops slow
            continue
        backend = _attrs(n).get("conv_backend", "")
        slow = n.type in SLOW_CONV_TYPES or (backend in SLOW_CONV_BACKENDS and _attrs(n).get("fast_conv_available"))
        if slow and ctx.share(ctx.time(g, n)) >= MIN_SHARE / 4:
            findings.append(_finding(
                ctx, "slow-conv", f"{n.type} in {n.module or 'the step'} takes the slow path ({backend or n.type})",
                "a fast convolution backend exists on this device but was not used: check "
                "torch.backends.mkldnn.enabled / torch.backends.cudnn.enabled, dtype and memory format",
                [(g, n)], Severity.HIGH if ctx.share(ctx.time(g, n)) >= 0.05 else Severity.MEDIUM))
    return findings


def dispatch_bound_runs(ctx: AdvisorContext) -> list[Finding]:
    """Long runs of tiny ops whose time is overhead, not arithmetic or traffic."""
    findings = []
    for graph in ctx.profile.graphs:
        run: list[tuple[GraphRecord, NodeRecord]] = []
        for node in (*graph.nodes, None):
            point = ctx.points.get((graph.id, node.id)) if node is not None else None
            if node is not None and point is not None and point.bound is Bound.OVERHEAD:
                run.append((graph, node))
                continue
            if len(run) >= MIN_TINY_RUN and ctx.share(sum(ctx.time(g, n) for g, n in run)) >= MIN_SHARE:
                first, last = run[0][1], run[-1][1]
                findings.append(_finding(
                    ctx, "dispatch-bound", f"{len(run)} consecutive tiny ops (nodes {first.id}-{last.id}) "
                    "are bound by per-op overhead",
                    "fuse them: torch.compile, a fused or foreach implementation, or larger tensors per op", run))
            run = []
    return findings


def layout_copies(ctx: AdvisorContext) -> list[Finding]:
    hits = [(g, n) for g, n in ctx.nodes()
            if n.type in LAYOUT_COPY_TYPES and n.phase is not Phase.OPTIMIZER
            and len(set(filter(None, n.in_dtypes + n.out_dtypes))) <= 1]
    if not hits or ctx.share(sum(ctx.time(g, n) for g, n in hits)) < MIN_SHARE:
        return []
    return [_finding(ctx, "layout-copy", f"{len(hits)} layout copies (contiguous/clone/permute copies)",
                     "avoid .contiguous() after transpose/permute where the consumer accepts strides, "
                     "use view-friendly layouts (e.g. keep heads last) or channels_last end to end", hits)]


def slow_matmuls(ctx: AdvisorContext) -> list[Finding]:
    hits = []
    for g, n in ctx.nodes():
        point = ctx.points.get((g.id, n.id))
        if n.type in MATMUL_TYPES and point is not None and point.bound is Bound.SLOW \
                and ctx.share(point.time_s) >= MIN_SHARE / 2:
            hits.append((g, n))
    if not hits:
        return []
    return [_finding(ctx, "slow-matmul", f"{len(hits)} matmuls/convolutions run at under "
                     f"{100 * 0.1:.0f}% of the attainable rate",
                     "check shapes (tiny or odd dimensions), dtype (use bf16/tf32 where the device runs them "
                     "fast), memory format and thread count; compare with graphprof calibrate's peaks", hits)]


def activation_peak(ctx: AdvisorContext) -> list[Finding]:
    findings = []
    for graph in ctx.profile.graphs:
        peak = getattr(graph, "memory_peak", None)
        if peak is None or getattr(peak, "live_bytes", 0) < ACTIVATION_PEAK_MIN_BYTES:
            continue
        by_cat = dict(getattr(peak, "by_category_bytes", {}) or {})
        activations = sum(v for k, v in by_cat.items() if k.startswith(ACTIVATION_CATEGORIES))
        if activations / peak.live_bytes >= 0.5:
            node = next((n for n in graph.nodes if n.id == peak.node_id), None)
            hits = [(graph, node)] if node is not None else []
            f = _finding(ctx, "activation-peak",
                         f"activations saved for backward are {100 * activations / peak.live_bytes:.0f}% "
                         f"of the memory peak ({peak.live_bytes / 2**20:.1f} MiB)",
                         "activation checkpointing (torch.utils.checkpoint) trades recomputation for memory; "
                         "so do smaller micro-batches or lower-precision activations", hits, Severity.MEDIUM)
            findings.append(f)
    return findings


def single_tensor_optimizer(ctx: AdvisorContext) -> list[Finding]:
    hits = [(g, n) for g, n in ctx.nodes() if n.phase is Phase.OPTIMIZER]
    if len(hits) < MIN_OPTIMIZER_OPS or any("_foreach_" in n.op or "_fused_" in n.op for _, n in hits):
        return []
    if ctx.share(sum(ctx.time(g, n) for g, n in hits)) < MIN_SHARE:
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
    findings = []
    for graph in ctx.profile.graphs:
        timed = [n for n in graph.nodes if n.device_time_ns and n.host_time_ns]
        if not timed:
            continue
        device_total = 0.0
        hits: list[tuple[GraphRecord, NodeRecord]] = []
        paced_s = 0.0
        for node in timed:
            host, device = _median(node.host_time_s), _median(node.device_time_s)
            device_total += device
            if host <= 0 or abs(device - host) > LAUNCH_TRACK_TOLERANCE * host:
                continue
            point = ctx.points.get((graph.id, node.id))
            roof = point.roofline_time_s if point is not None else None
            if roof is not None and roof >= OVERHEAD_RATIO * device:
                continue
            hits.append((graph, node))
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
           points: Sequence[RooflinePoint] | None = None) -> list[Finding]:
    """Every rule's findings, most severe and most expensive first.

    ``points`` may pass a roofline already computed with the same peaks and stat.
    """
    if points is None:
        points = roofline(profile, peaks, stat)
    by_key = {(p.graph_id, p.node_id): p for p in points}
    times = {key: p.time_s for key, p in by_key.items()}
    step = stat_fn(stat)([s.wall_time_s for s in profile.steps]) if profile.steps else sum(times.values())
    ctx = AdvisorContext(profile, times, by_key, step)
    findings = [f for rule in RULES for f in rule(ctx)]
    findings.sort(key=lambda f: (_ORDER[f.severity], -f.time_s))
    return findings
