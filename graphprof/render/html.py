"""One self-contained HTML report of a profile.

Sections: summary, advisor findings, sortable top-nodes and per-op-type
tables, breakdowns by phase, module and source line, the roofline scatter,
the memory timeline and the critical path. Everything is inline (CSS, the
sorting script, SVG plots) and the page's Content-Security-Policy forbids
every fetch, so it opens with no network and cannot leak one. Every name is
escaped (``render.escape``); the machine-readable summary embedded for
tools is JSON escaped for a ``<script>`` element.

The advisor's findings and the roofline bounds are the caller's:
``options.findings`` (objects with ``severity``, ``title``, ``time_s``,
``hint``, ``sources``) and ``options.bounds``; an export gets both from
``exporters.analysed_options``. Without them the report says there are no
findings and leaves out the bound column.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import numpy as np

from graphprof.analysis.aggregate import aggregate
from graphprof.analysis.entries import GroupEntry, bytes_moved, ratio
from graphprof.analysis.critical_path import CriticalPath, critical_paths
from graphprof.analysis.eager import eager_overhead
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.memory_columns import has_memory_records
from graphprof.analysis.node_arrays import column_codes, exact_sum, int_array
from graphprof.analysis.options import TableOptions
from graphprof.analysis.stats import median
from graphprof.analysis.utilisation import utilisation
from graphprof.profile.model import GraphRecord, NodeRecord, Profile
from graphprof.render.escape import html_text, json_for_script
from graphprof.render.html_assets import CSS, JS
from graphprof.render.labels import bound_of, shapes_text
from graphprof.render.html_plots import MAX_POINTS, RooflinePoint, bar_rows, roofline_svg
from graphprof.render.html_tables import critical_section, num_cell, slowest_first, source_cell
from graphprof.render.units import format_bytes, format_count, format_number, format_time

if TYPE_CHECKING:
    from graphprof.render.export_options import Bounds, ExportOptions

TOP_NODES = 50
#: How a breakdown labels ops outside any module.
TOP_LEVEL = "(top level)"
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
_SEVERITY_CLASSES = {"critical", "high", "error", "medium", "warning", "low", "info"}

Timed = tuple[GraphRecord, NodeRecord, float]


def _card(key: str, value: str, sub: str = "") -> str:
    return (f'<div class="card"><div class="k">{html_text(key)}</div><div class="v">{html_text(value)}</div>'
            f'<div class="s">{html_text(sub)}</div></div>')


def summary_cards(profile: Profile, frame: NodeFrame, total: float, paths: Sequence[CriticalPath], stat: str) -> str:
    """The summary's cards (step time, wall time, ops, FLOPs, bytes, critical path, memory peak): the report's and the notebook's."""
    steps = len(profile.steps)
    walls = [s.wall_time_s for s in profile.steps]
    flops, counted, moved = _totals(frame)
    cp_len = sum(p.length_s for p in paths)
    path_share = cp_len / total if total > 0 else 0.0
    cards = [
        _card("time per step", format_time(total), f"sum of op times, {stat} of {steps} step{'s' * (steps != 1)}"),
        _card("wall time per step", format_time(median(walls)) if walls else "N/A", "median, whole call"),
        _card("ops", str(len(frame)), f"in {len(profile.graphs)} graph{'s' * (len(profile.graphs) != 1)}"),
        _card("FLOPs per step", format_count(flops, "FLOP"),
              f"{format_count(ratio(flops, total), 'FLOP/s')}; {counted} of {len(frame)} ops counted"),
        _card("bytes moved", format_bytes(moved) if moved is not None else "N/A",
              f"{format_bytes(ratio(moved, total), 'B/s')}" if moved is not None else "no byte counts"),
        _card("critical path", format_time(cp_len), f"{path_share:.0%} of the serial sum" if total > 0 else ""),
    ]
    peaks = [g.memory_peak for g in profile.graphs if g.memory_peak is not None]
    if peaks:
        cards.append(_card("modelled memory peak", format_bytes(max(p.live_bytes for p in peaks)), "largest over graphs"))
    return '<div class="cards">' + "".join(cards) + "</div>"


def _totals(frame: NodeFrame) -> tuple[int | None, int, int | None]:
    """The FLOPs of the nodes that count them (None: none does), how many do, and the bytes they move
    (read + written, as ``bytes_moved``; None: no node counts bytes), summed from the integer arrays."""
    try:
        flops, flops_known = int_array(frame, "flops")
        read, read_known = int_array(frame, "bytes_read")
        written, written_known = int_array(frame, "bytes_written")
    except ValueError:  # not all int64: Python's sums of the columns
        known_flops = [f for f in frame.column("flops") if f is not None]
        moved = [m for m in frame.column("bytes_moved") if m is not None]
        return sum(known_flops) if known_flops else None, len(known_flops), sum(moved) if moved else None
    counted = int(flops_known.sum())
    any_moved = bool((read_known | written_known).any())
    return (exact_sum(flops) if counted else None, counted,
            exact_sum(read) + exact_sum(written) if any_moved else None)


def utilisation_cards(profile: Profile, stat: str) -> str:
    """MFU/HFU against the peak used, throughput and eager-vs-graph as summary cards (none: empty)."""
    cards = []
    u = utilisation(profile, stat=stat)
    if u is not None and u.peaks:
        peak = u.peaks[0]
        dtype = f" {peak.dtype}" if peak.dtype else ""
        cards.append(_card(f"MFU ({peak.source} peak)", f"{100 * (u.step.mfu(peak) or 0):.1f}%",
                           f"HFU {100 * (u.step.hfu(peak) or 0):.1f}%; peak {format_count(peak.flops_per_s, 'FLOP/s')}{dtype}"))
    elif u is not None:
        cards.append(_card("model FLOP/s", format_count(u.step.model_flop_per_s, "FLOP/s"),
                           "no peak recorded: run graphprof calibrate for MFU"))
    if u is not None and u.tokens_per_s is not None and u.workload is not None:
        cards.append(_card("tokens/s", format_count(u.tokens_per_s, ""), f"{u.workload.tokens_per_step:g} per step"))
    if u is not None and u.samples_per_s is not None and u.workload is not None:
        cards.append(_card("samples/s", format_count(u.samples_per_s, ""), f"{u.workload.samples_per_step:g} per step"))
    e = eager_overhead(profile, stat)
    if e is not None:
        verdict = f"{100 * e.share:.0f}% of the eager step" if e.significant else "no gap beyond noise"
        cards.append(_card("eager step vs graph", f"{format_time(e.eager_s)} vs {format_time(e.replay_s)}", verdict))
    return '<div class="cards">' + "".join(cards) + "</div>" if cards else ""


def findings_html(findings: Sequence[Any]) -> str:
    """The advisor's findings, each with its severity, title, time at stake, hint and up to 8 sources."""
    if not findings:
        return '<p class="note">No advisor findings.</p>'
    out = []
    for f in findings:
        severity = getattr(f, "severity", "") or ""
        severity = str(getattr(severity, "value", severity))  # enums print their value, not Class.NAME
        css = f"sev-{severity.lower()}" if str(severity).lower() in _SEVERITY_CLASSES else "sev-other"
        sources = [str(s) for s in (getattr(f, "sources", None) or ())]
        time_s = getattr(f, "time_s", None)
        src = ""
        if sources:
            shown = ", ".join(sources[:8]) + (f" (+{len(sources) - 8} more)" if len(sources) > 8 else "")
            src = f'<div class="src">{html_text(shown)}</div>'
        out.append(f'<div class="finding {css}"><span class="sev">{html_text(severity)}</span>'
                   f'<span class="t">{html_text(getattr(f, "title", ""))}</span>'
                   f' <span class="src">({html_text(format_time(time_s))} at stake)</span>'
                   f'<div>{html_text(getattr(f, "hint", ""))}</div>{src}</div>')
    return "".join(out)


def slowest_nodes(frame: NodeFrame, times: Sequence[float], count: int) -> list[Timed]:
    """The ``count`` slowest nodes as (graph, record, time), slowest first, ties in execution order
    (``sorted(..., reverse=True)[:count]``): only these records are built, none for the other nodes."""
    time_s = np.asarray(times, dtype=np.float64)
    if np.isnan(time_s).any():  # no order among NaN: the heap's own answer
        slowest = heapq.nlargest(count, range(len(times)), key=times.__getitem__)
    else:
        slowest = slowest_first(time_s, count)
    return [(*frame.pair(i), times[i]) for i in slowest]


def top_nodes_table(slowest: list[Timed], total: float, critical: set[tuple[int, int]], bounds: Bounds | None) -> str:
    """The slowest nodes (``slowest``, slowest first); a ``bound`` column only when the caller knows bounds."""
    rows = []
    for g, n, t in slowest[:TOP_NODES]:
        moved = bytes_moved(n.bytes_read, n.bytes_written)
        crit = (g.id, n.id) in critical
        intensity = n.flops / moved if n.flops is not None and moved else None
        bound_cell = f"<td>{html_text(bound_of(bounds, g.id, n.id) or '')}</td>" if bounds else ""
        rows.append(
            f'<tr{" class=crit" if crit else ""}><td class="num" data-v="{n.id}">{n.id}</td>'
            f'<td class="name" title="{html_text(n.op)}">{html_text(n.type)}</td>'
            f'<td class="name" title="{html_text(n.module)}">{html_text(n.module or "-")}</td>'
            f'{source_cell(n.source)}<td>{html_text(n.phase.value)}</td>'
            f'<td class="shapes" title="{html_text(shapes_text(n.in_shapes, limit=16))}">{html_text(shapes_text(n.in_shapes))}</td>'
            + num_cell(t, format_time(t)) + num_cell(100 * t / total if total else 0, f"{100 * t / total:.1f}" if total else "0")
            + num_cell(n.flops, format_count(n.flops, "FLOP")) + num_cell(ratio(n.flops, t), format_count(ratio(n.flops, t), "FLOP/s"))
            + num_cell(moved, format_bytes(moved)) + num_cell(ratio(moved, t), format_bytes(ratio(moved, t), "B/s"))
            + num_cell(intensity, format_number(intensity))
            + f"{bound_cell}<td>{'&#10003;' if crit else ''}</td></tr>")
    numeric = ("#", "time", "%", "FLOPs", "FLOP/s", "bytes", "bandwidth", "FLOP/B")
    headers = ("#", "op", "module", "source", "phase", "in shapes", "time", "%", "FLOPs", "FLOP/s", "bytes",
               "bandwidth", "FLOP/B") + (("bound",) if bounds else ()) + ("crit.",)
    head = "".join(f'<th class="num">{h}</th>' if h in numeric else f"<th>{h}</th>" for h in headers)
    return (f'<div class="scroll"><table class="sortable" id="top-nodes"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>'
            '<p class="note">A blue edge marks nodes on the critical path; hover an op, module, source or shape for the full text.</p>')


def _groups(frame: NodeFrame, times: Sequence[float], by: str, depth: int | None = None) -> list[GroupEntry]:
    """The profile's nodes grouped ``by`` a column by the analysis (sums over one step), slowest first."""
    total = sum(times)
    options = TableOptions(aggregate_by=by, module_depth=depth)
    entries = aggregate(frame, times, range(len(times)), options, total)
    return sorted(entries, key=lambda e: (-e.time_s, e.order))


def _by_op_type(frame: NodeFrame, times: Sequence[float], total: float) -> str:
    rows = []
    for e in _groups(frame, times, "type"):
        t = e.time_s
        rows.append(f'<tr><td class="name">{html_text(e.label)}</td>' + num_cell(e.calls, str(e.calls))
                    + num_cell(t, format_time(t)) + num_cell(100 * t / total if total else 0, f"{100 * t / total:.1f}" if total else "0")
                    + num_cell(e.flops, format_count(e.flops, "FLOP")) + num_cell(e.flop_per_s, format_count(e.flop_per_s, "FLOP/s"))
                    + num_cell(e.bytes_moved, format_bytes(e.bytes_moved))
                    + num_cell(e.bandwidth_bytes_per_s, format_bytes(e.bandwidth_bytes_per_s, "B/s")) + "</tr>")
    head = "<th>op</th>" + "".join(f'<th class="num">{h}</th>' for h in ("ops", "time", "%", "FLOPs", "FLOP/s", "bytes", "bandwidth"))
    return (f'<div class="scroll"><table class="sortable" id="by-op"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _breakdown(frame: NodeFrame, times: Sequence[float], total: float, by: str, detail: Callable[[str], str],
               limit: int, depth: int | None = None, detail_header: str | None = "type",
               blank: str = "-") -> str:
    rows = [(e.label or blank, detail(e.label), e.time_s, e.time_s / total if total else 0.0, e.calls)
            for e in _groups(frame, times, by, depth)[:limit]]
    return bar_rows(rows, detail_header)


def _first_by(frame: NodeFrame, key: str, value: str, skip_empty: bool) -> dict[str, str]:
    """Per value of column ``key``, ``value`` of its first node (the first non-empty one with ``skip_empty``).

    From the columns' codes: the first node of each key is found by a stable sort, not a walk."""
    key_codes, keys = column_codes(frame, key)
    value_codes, values = column_codes(frame, value)
    at = np.arange(len(key_codes))
    if skip_empty:
        usable = np.array([bool(v) for v in values], dtype=bool)
        at = at[usable[value_codes]] if len(values) else at[:0]
    candidates = key_codes[at]
    order = np.argsort(candidates, kind="stable")
    ordered = candidates[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    key_texts, value_texts = cast("list[str]", keys), cast("list[str]", values)
    return {key_texts[k]: value_texts[v] or "" for k, v in zip(
        ordered[first].tolist(), value_codes[at[order[first]]].tolist())}


def _memory_section(profile: Profile, options: ExportOptions) -> str:
    from graphprof.render.memory_svg import memory_timeline_svg

    if not has_memory_records(profile.graphs):
        return '<p class="note">The profile has no modelled memory (the memory pass did not run).</p>'
    try:
        svg = memory_timeline_svg(profile, graph_id=options.graph_id)
    except Exception as exc:  # a report with one plot missing beats no report
        return f'<p class="note">The memory timeline could not be drawn: {html_text(exc)}</p>'
    start = svg.find("<svg")
    return f'<div class="memory">{svg[start:] if start >= 0 else svg}</div>'


def _plotted(frame: NodeFrame, time_s: np.ndarray) -> np.ndarray:
    """Indices of the nodes with FLOPs, bytes moved (both non-zero) and a positive time.

    From the integer arrays where the columns are int64 and the bytes moved cannot wrap (no negative
    count); else judged node by node, ``bool(flops and bytes_moved)``."""
    try:
        flops, flops_known = int_array(frame, "flops")
        read, read_known = int_array(frame, "bytes_read")
        written, written_known = int_array(frame, "bytes_written")
        if len(read) and min(int(read.min()), int(written.min())) < 0:
            raise ValueError("a negative byte count")
        has_moved = (read_known | written_known) & ((read != 0) | (written != 0))
        has = flops_known & (flops != 0) & has_moved
    except ValueError:
        flops_col, moved = frame.column("flops"), frame.column("bytes_moved")
        has = np.fromiter((bool(f and m) for f, m in zip(flops_col, moved)), dtype=bool, count=len(flops_col))
    return np.flatnonzero(has & (time_s > 0))


def _roofline(frame: NodeFrame, times: Sequence[float], total: float, profile: Profile) -> str:
    col = frame.column
    flops, read, written = col("flops"), col("bytes_read"), col("bytes_written")
    types, modules, ids, phases = col("type"), col("module"), col("id"), col("phase")

    time_s = np.asarray(times, dtype=np.float64)
    plotted = _plotted(frame, time_s)
    # Only the points the plot keeps (the slowest MAX_POINTS, ties in node order, as its stable sort) are made.
    kept = plotted[slowest_first(time_s[plotted], MAX_POINTS)].tolist()
    points = [RooflinePoint(f"{types[i]} ({modules[i] or '-'}) #{ids[i]}", phases[i],
                            flops[i] / bytes_moved(read[i], written[i]), flops[i] / times[i], times[i], times[i] / total if total else 0.0)
              for i in kept]
    peaks = {str(k): float(v) for k, v in profile.meta.peaks.items() if isinstance(v, (int, float))}
    caption = ('<p>One dot per op node with FLOPs and bytes moved: x = FLOPs per byte, y = achieved FLOP/s, '
               "size = share of step time (hover for the op). "
               + ("The dashed lines are the device's roofs." if peaks else
                  "No device peaks are recorded in this profile (run graphprof calibrate), so no roofs are drawn.")
               + "</p>")
    return (caption if points else "") + roofline_svg(points, peaks)


def html_report(profile: Profile, options: ExportOptions) -> str:
    """The report as one HTML document."""
    stat = options.stat
    frame = node_frame(profile)  # the per-node times analysis already computed, not one statistic per node again
    times = frame.times(stat, "auto")
    total = sum(times)
    slowest = slowest_nodes(frame, times, max(TOP_NODES, 10))
    paths = critical_paths(profile, stat=stat)
    on_path: dict[int, set[int]] = {}
    for p in paths:
        on_path.setdefault(p.graph_id, set()).update(p.nodes)
    critical = {(g.id, n.id) for g, n, _ in slowest if n.id in on_path.get(g.id, ())}  # the rows that show it
    meta = profile.meta
    title = f"graphprof report: {meta.function or 'profile'}"
    module_types = _first_by(frame, "module", "module_type", skip_empty=True)  # a module's own type
    first_modules = _first_by(frame, "source", "module", skip_empty=False)
    depth1 = _breakdown(frame, times, total, "module", lambda m: module_types.get(m, "") if m else "", 25, 1, blank=TOP_LEVEL)
    depth2 = _breakdown(frame, times, total, "module", lambda m: module_types.get(m, "") if m else "", 30, 2, blank=TOP_LEVEL)
    by_phase = _breakdown(frame, times, total, "phase", lambda p: "", 10, detail_header=None)
    by_source = _breakdown(frame, times, total, "source", lambda src: first_modules.get(src, ""), 20,
                           detail_header="first module")
    summary_data = {
        "function": meta.function, "stat": stat, "steps": len(profile.steps), "ops": len(times),
        "time_per_step_s": total, "critical_path_s": sum(p.length_s for p in paths),
        "top": [{"op": n.type, "module": n.module, "source": n.source, "time_s": t}
                for _, n, t in slowest[:10]],
    }
    device = " ".join(x for x in (meta.device_type, meta.device_name) if x)
    sub = (f"{device} · torch {meta.torch_version or '?'} · graphprof {meta.graphprof_version or '?'} · "
           f"{meta.created_at or ''} · {len(profile.steps)} profiled steps, {stat} shown")
    sections = [
        ("summary", "Summary", summary_cards(profile, frame, total, paths, stat) + utilisation_cards(profile, stat)),
        ("findings", "Advisor findings", findings_html(options.findings or ())),
        ("top-ops", f"Top {min(TOP_NODES, len(times))} nodes", top_nodes_table(slowest, total, critical, options.bounds)
         + "<h3>By op type</h3>" + _by_op_type(frame, times, total)),
        ("breakdown", "Breakdown", '<div class="grid2"><div><h3>By phase</h3>' + by_phase
         + "<h3>By top-level module</h3>" + depth1 + "</div><div><h3>By module (depth 2)</h3>" + depth2
         + "<h3>By source line</h3>" + by_source + "</div></div>"),
        ("roofline", "Roofline", _roofline(frame, times, total, profile)),
        ("memory", "Memory timeline", _memory_section(profile, options)),
        ("critical-path", "Critical path", critical_section(paths, frame, times, total)),
    ]
    nav = "".join(f'<a href="#{sid}">{html_text(name)}</a>' for sid, name, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{html_text(name)}</h2>{content}</section>' for sid, name, content in sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html_text(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{html_text(title)}</h1><p>{html_text(sub)}</p></header><nav>{nav}</nav><main>{body}</main>"
        f'<footer>Generated by graphprof. Times are per step ({html_text(stat)} over profiled steps).</footer>'
        f'<script type="application/json" id="graphprof-summary">{json_for_script(summary_data)}</script>'
        f"<script>{JS}</script></body></html>\n"
    )
