"""The bottleneck report as terminal text.

Names from the profile reach it through ``fit.wrap_lines`` (prose) and ``fit.fitted_table`` (tables),
which show them as ``terminal_line`` does: a newline or escape sequence in a name cannot break a line.
"""

from __future__ import annotations

import numpy as np

from graphprof.analysis.dataflow import positions
from graphprof.analysis.frame import node_frame
from graphprof.analysis.node_arrays import graph_spans, times_array
from graphprof.analysis.report import Report, top_indices
from graphprof.analysis.roofline import Bound
from graphprof.analysis.table import TableResult
from graphprof.render.fit import TextColumn, fitted_table, wrap_lines
from graphprof.render.utilisation_text import render_eager, render_utilisation
from graphprof.render.units import share_of, format_bytes, format_count, format_time


def _share(part: float, whole: float) -> str:
    return share_of(part, whole, digits=1)


def _header(report: Report) -> list[str]:
    meta, s, st = report.profile.meta, report.overview.summary, report.steps
    lines = [f"graphprof report: {meta.function or 'profile'} ({meta.capture} capture) on "
             f"{meta.device_type}{' ' + meta.device_name if meta.device_name else ''}"]
    if st.steps:
        outliers = (f"; outlier steps: {', '.join(f'{o.index} ({o.ratio_to_median:.1f}x)' for o in st.outliers)}"
                    if st.outliers else "")
        lines.append(f"{st.steps} profiled steps: median {format_time(st.median_s)}, min {format_time(st.min_s)}, "
                     f"max {format_time(st.max_s)}, stdev {format_time(st.stdev_s)}{outliers}")
    lines.append(f"{s.nodes} nodes in {s.graphs} graph(s), {format_time(s.total_time_s)} of node time ({report.stat}); "
                 f"{format_count(s.total_flops, 'FLOP')}, {format_count(s.achieved_flop_per_s, 'FLOP/s')} achieved; "
                 f"{format_bytes(s.total_bytes_moved)} moved")
    if report.host_device is not None:
        lines.append(_host_device(report))
    if report.peaks:
        p = report.peaks
        extra = "".join(f", {k} {format_count(v, 'FLOP/s')}" for k, v in (p.flops_per_s_by_dtype or {}).items()
                        if k != "float32")
        lines.append(f"peaks: {format_count(p.flops_per_s, 'FLOP/s')} (float32){extra}, "
                     f"{format_bytes(p.bytes_per_s, 'B/s')} memory")
        note = report.profile.meta.peaks_note
        if note:
            lines.append(f"note: {note}")
        over = [r for r in report.roofline_rows if (r.point.fraction_of_attainable or 0) > 1.1]
        if over:
            lines.append(f"note: {len(over)} top node(s) beat these peaks: the peaks may be low (calibrated on a busy "
                         "machine? re-run `graphprof calibrate` when idle) or the kernels do less arithmetic than "
                         "the FLOP convention counts (e.g. Winograd convolutions)")
    else:
        lines.append("peaks: unknown (run `graphprof calibrate` once, then profile again, for roofline bounds)")
    if s.peak_live_bytes is not None:
        lines.append(f"modelled memory peak: {format_bytes(s.peak_live_bytes)} at {s.peak_live_node}")
    return lines


def _host_device(report: Report) -> str:
    """Host dispatch beside device time, and which side sets the pace."""
    hd = report.host_device
    assert hd is not None  # only called for a report with host and device times
    device = report.profile.meta.device
    timing = device.timing if device is not None else ""
    if hd.device_s > 1.25 * hd.host_s:
        pace = "the host runs ahead; the device sets the pace"
    elif hd.device_s >= 0.8 * hd.host_s:
        pace = "device time tracks dispatch: the host may set the pace"
    else:
        pace = "the device finishes well inside dispatch time: the host sets the pace"
    return (f"host vs device ({report.stat} per step over {hd.nodes} nodes{', ' + timing if timing else ''}): "
            f"host dispatch {format_time(hd.host_s)}, device {format_time(hd.device_s)}; {pace}")


def _shares(report: Report) -> list[str]:
    total = report.overview.summary.total_time_s
    phases = ", ".join(f"{p.phase} {p.percent:.1f}%" for p in report.overview.summary.phases)
    bounds = ", ".join(f"{b.value} {_share(t, total)}" for b in Bound
                       if (t := report.time_by_bound_s.get(b, 0.0)) > 0)
    return [f"time by phase: {phases or '-'}", f"time by bound: {bounds or '-'}"]


#: Roofline columns: what names a node stays; its rates go before its module and source are clipped.
_ROOFLINE_COLUMNS = {
    "#": TextColumn("#", keep=True), "op": TextColumn("op", 1, least=18, keep=True),
    "module": TextColumn("module", 3, least=16), "source": TextColumn("source", 4, least=16),
    "time": TextColumn("time", keep=True), "device": TextColumn("device", keep=True),
    "host": TextColumn("host", 5), "FLOPs": TextColumn("FLOPs", 6), "FLOP/B": TextColumn("FLOP/B", 8),
    "achieved": TextColumn("achieved", 7), "of roofline": TextColumn("of roofline", keep=True),
    "bound": TextColumn("bound", keep=True),
}


def _roofline(report: Report, width: int | None) -> str:
    rows = []
    both = any(r.host_time_s is not None for r in report.roofline_rows)  # device time, host time beside it
    for r in report.roofline_rows:
        p = r.point
        host = [format_time(r.host_time_s) if r.host_time_s is not None else "-"] if both else []
        rows.append([
            str(r.node.id), r.node.type, r.node.module or "-", r.node.source or "-", format_time(p.time_s),
            *host, format_count(p.flops, "FLOP"), "N/A" if p.intensity is None else f"{p.intensity:.2f}",
            format_count(p.achieved_flops_per_s, "FLOP/s"),
            "N/A" if p.fraction_of_attainable is None else f"{100 * p.fraction_of_attainable:.1f}%",
            p.bound.value,
        ])
    times = ["device", "host"] if both else ["time"]
    headers = ["#", "op", "module", "source", *times, "FLOPs", "FLOP/B", "achieved", "of roofline", "bound"]
    table = fitted_table([_ROOFLINE_COLUMNS[h] for h in headers], rows, width)
    return f"roofline of the top {len(rows)} nodes\n" + table


def _critical(report: Report) -> list[str]:
    lines = ["critical path (dataflow, weighted by measured time)"]
    profile = report.profile
    frame = node_frame(profile)
    spans = graph_spans(profile, frame)
    first_of: dict[int, int] = {}  # graph id -> index of the first graph with it
    for k, g in enumerate(profile.graphs):
        first_of.setdefault(g.id, k)
    ids, types, modules = frame.column("id"), frame.column("type"), frame.column("module")
    for cp in report.critical:
        k = first_of[cp.graph_id]
        graph, (start, end) = profile.graphs[k], spans[k]
        # each path node's position: the last node of the graph with its id, as a dict of them would say
        span_ids = np.fromiter(ids[start:end], dtype=np.int64, count=end - start)
        on_path = start + positions(span_ids, np.fromiter(cp.nodes, dtype=np.int64, count=len(cp.nodes)))
        times = times_array(frame, cp.stat, "auto")  # the per-node time the path was weighted by
        # the longest first, the earliest of equals: (node id, position)
        heavy = [(cp.nodes[k], int(on_path[k])) for k in top_indices(times[on_path], 5)]
        lines.append(f"  {graph.name}: {len(cp.nodes)} of {end - start} nodes, {format_time(cp.length_s)} of "
                     f"{format_time(cp.serial_s)} serial ({100 * cp.ratio:.0f}%)")
        if heavy:
            lines.append("    heaviest on it: " + ", ".join(
                f"#{i} {types[at]} {modules[at] or ''}".rstrip() for i, at in heavy))
    return lines


_BREAKDOWN_COLUMNS = (TextColumn("", 1, least=16, keep=True), TextColumn("nodes", 2), TextColumn("time", keep=True),
                      TextColumn("%", keep=True), TextColumn("FLOPs", 5))


def _breakdown(title: str, result: TableResult, width: int | None) -> str:
    rows = [[r.label or "-", str(r.calls), format_time(r.time_s), f"{r.percent:.1f}", format_count(r.flops, "FLOP")]
            for r in result.rows]
    return f"{title}\n" + fitted_table(_BREAKDOWN_COLUMNS, rows, width)


def _findings(report: Report) -> list[str]:
    if not report.findings:
        return ["findings: none (no rule fired)"]
    step = report.steps.median_s or report.overview.summary.total_time_s
    lines = [f"findings ({len(report.findings)})"]
    for f in report.findings:
        lines.append(f"  [{f.severity.value.upper()}] {f.title}: {format_time(f.time_s)} at stake ({_share(f.time_s, step)} of a step)")
        lines.append(f"      hint: {f.hint}")
        if f.sources:
            more = f" (+{len(f.sources) - 3} more)" if len(f.sources) > 3 else ""
            lines.append(f"      where: {', '.join(f.sources[:3])}{more}")
    return lines


def render_report(report: Report, width: int | None = None) -> str:
    """The whole report, sections separated by blank lines, fitted to ``width`` characters.

    Tables drop and clip columns as ``graphprof analyze``'s do, prose wraps;
    ``width=None`` leaves every line as long as it is (``--wide``).
    """
    def prose(lines: list[str]) -> str:
        return "\n".join(wrap_lines(lines, width))

    sections = [
        prose(_header(report)),
        prose(_shares(report)),
        prose(_findings(report)),
        _roofline(report, width),
        prose(_critical(report)),
        _breakdown("by module", report.breakdowns["module"], width),
        _breakdown("by op type", report.breakdowns["type"], width),
        _breakdown("by source line", report.breakdowns["source"], width),
    ]
    extra = [render_utilisation(report.utilisation, width)] if report.utilisation is not None else []
    if report.eager is not None:
        extra.append(prose(render_eager(report.eager).splitlines()))
    sections[1:1] = extra
    if report.distributed is not None:  # a profile merged from several ranks
        from graphprof.render.distributed_text import render_distributed

        sections.insert(2, render_distributed(report.distributed))
    return "\n\n".join(sections)
