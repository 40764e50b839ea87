"""MFU/HFU, throughput and the eager comparison as terminal text (a section of the report).

Every utilisation figure is printed with the peak it was divided by, and
the step time it used, so a reader can redo the division.
"""

from __future__ import annotations

from graphprof.analysis.eager import EagerOverhead
from graphprof.analysis.utilisation import PeakUsed, Utilisation, UtilisationReport
from graphprof.render.fit import TextColumn, fitted_table, wrap_lines
from graphprof.render.units import format_count, format_time


def _percent(value: float | None) -> str:
    return "N/A" if value is None else f"{100 * value:.1f}%"


def _peak_label(peak: PeakUsed) -> str:
    dtype = f" {peak.dtype}" if peak.dtype else ""
    return f"{format_count(peak.flops_per_s, 'FLOP/s')}{dtype} ({peak.source})"


def _row(part: Utilisation, peaks: tuple[PeakUsed, ...]) -> list[str]:
    return [part.label, format_time(part.time_s), format_count(part.model_flops, "FLOP"),
            format_count(part.model_flop_per_s, "FLOP/s"), *(_percent(part.mfu(p)) for p in peaks),
            format_count(part.hardware_flops, "FLOP"), *(_percent(part.hfu(p)) for p in peaks)]


def render_utilisation(u: UtilisationReport, width: int | None = None) -> str:
    """The MFU/HFU table: the step, then each phase; the peaks used above it; fitted to ``width``."""
    peaks = u.peaks
    if peaks:
        used = "; ".join(_peak_label(p) for p in peaks)
        head = f"utilisation against peak {used}"
    else:
        head = ("utilisation: no peak known (run `graphprof calibrate`, or give one: --peak-gflops, "
                "report(peak_flops_per_s=...)); achieved FLOP/s only")
    lines = [head, f"  how: a step takes the {u.stat} profiled step less probe cost, a phase the sum of its nodes' "
             "times; model FLOPs = forward matmul/conv/attention x3 with a backward; executed = every counted FLOP"]
    if u.ranks > 1:
        lines.append(f"  per device: FLOPs and phase times are averages over the profile's {u.ranks} ranks")
    names = [p.source for p in peaks]
    rows = [_row(u.step, peaks)] + [_row(p, peaks) for p in u.phases]
    columns = [TextColumn("", keep=True), TextColumn("time", keep=True), TextColumn("model FLOPs", 3),
               TextColumn("model FLOP/s", 4), *(TextColumn(f"MFU ({n})", keep=True) for n in names),
               TextColumn("executed FLOPs", 5), *(TextColumn(f"HFU ({n})", 2) for n in names)]
    table = fitted_table(columns, rows, None if width is None else width - 2)
    lines = wrap_lines(lines, width)
    lines.append("\n".join("  " + line for line in table.splitlines()))
    if len(u.per_step) > 1 and peaks:
        mfus = [m for s in u.per_step if (m := s.mfu(peaks[0])) is not None]
        if mfus:
            lines.extend(wrap_lines([f"  MFU ({peaks[0].source}) per profiled step: {min(mfus) * 100:.1f}% to "
                                     f"{max(mfus) * 100:.1f}% over {len(mfus)} steps"], width))
    throughput = []
    if u.tokens_per_s is not None and u.workload is not None:
        throughput.append(f"{format_count(u.tokens_per_s, 'tokens/s')} ({u.workload.tokens_per_step:g} tokens per step)")
    if u.samples_per_s is not None and u.workload is not None:
        throughput.append(f"{format_count(u.samples_per_s, 'samples/s')} ({u.workload.samples_per_step:g} samples per step)")
    if throughput:
        lines.extend(wrap_lines(["  throughput: " + ", ".join(throughput)], width))
    return "\n".join(lines)


def render_eager(e: EagerOverhead) -> str:
    """One line: eager against replay, with the gap and whether it is beyond noise."""
    first = f"; the first call took {format_time(e.first_call_s)} (cold, left out)" if e.first_call_s is not None else ""
    gap = f"{format_time(abs(e.overhead_s))} ({100 * abs(e.share):.0f}% of the eager step)"
    if e.significant:
        verdict = f"the static graph removes {gap} of Python, module-call and autograd bookkeeping"
    elif e.overhead_s < 0:
        verdict = f"the profiled replay was {gap} slower than eager: no bookkeeping to remove here"
    else:
        verdict = f"no gap beyond noise ({gap})"
    return (f"eager vs graph: eager step {format_time(e.eager_s)} ({e.stat} of {e.eager_calls} warm eager call(s){first}) "
            f"vs replay {format_time(e.replay_s)} ({e.stat} of {e.replay_steps} step(s), probes removed): {verdict}")
