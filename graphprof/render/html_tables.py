"""Table pieces of the HTML report: cells, and the critical-path tables.

The critical path of a 100,000-node graph can be every node of it (a chain),
so its tables read only the rows they show, and its slowest rows are found
with numpy rather than by sorting the whole path in Python. Names repeated
row after row (op types, modules, phases, source lines) are escaped once.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from graphprof.analysis.critical_path import CriticalPath
from graphprof.analysis.frame import NodeFrame
from graphprof.render.escape import html_text
from graphprof.render.units import format_time

CRITICAL_ROWS = 1000


def num_cell(value: float | None, text: str) -> str:
    """A numeric cell: the text shown, the exact value (for sorting) in ``data-v``."""
    data = "" if value is None else f' data-v="{value:.9g}"'
    return f'<td class="num"{data}>{html_text(text)}</td>'


#: ``html_text`` of names a report repeats row after row (op types, modules, phases), escaped once each.
escaped = functools.lru_cache(maxsize=4096)(html_text)


@functools.lru_cache(maxsize=4096)
def source_cell(source: str) -> str:
    """``models.py:67`` in the cell, the full ``graphprof/demo/models.py:67`` on hover and for sorting."""
    short = source.rsplit("/", 1)[-1] if source else "-"
    return f'<td class="src" title="{html_text(source)}" data-v="{html_text(source)}">{html_text(short)}</td>'


def path_positions(frame: NodeFrame, paths: Sequence[CriticalPath]) -> list[np.ndarray]:
    """Each path's nodes as frame indices (``critical_paths`` gives one path per graph, in graph order),
    found by binary search in the graph's ids: a dict over every node was a tenth of a second at 100k.
    Of equal ids in a graph the last one is taken, as such a dict would."""
    ids = frame.array("id")
    out = []
    for path, (start, end) in zip(paths, frame.spans()):
        order = np.argsort(ids[start:end], kind="stable")
        at = np.searchsorted(ids[start:end][order], np.asarray(path.nodes, dtype=ids.dtype), side="right") - 1
        out.append(order[at] + start)
    return out


def slowest_first(times: np.ndarray, count: int) -> list[int]:
    """Indices of the ``count`` largest ``times``, largest first, equal times in index order:
    ``sorted(range(len(times)), key=times.__getitem__, reverse=True)[:count]`` without sorting them all."""
    if count <= 0:
        return []
    if np.isnan(times).any():  # NaN has no place in an order: keep Python's answer
        values = times.tolist()
        return sorted(range(len(values)), key=values.__getitem__, reverse=True)[:count]
    candidates = np.arange(len(times))
    if len(times) > count:
        threshold = np.partition(times, len(times) - count)[len(times) - count]
        candidates = np.flatnonzero(times >= threshold)
    return candidates[np.argsort(-times[candidates], kind="stable")][:count].tolist()  # type: ignore[no-any-return]


def critical_section(paths: Sequence[CriticalPath], frame: NodeFrame, times: Sequence[float], total: float) -> str:
    """Length against the serial sum, the slowest ops on the path, then the whole path (capped).

    Only the rows shown are read, from the frame's columns: a path can hold thousands of nodes
    (the whole graph, when it is one chain), so the slowest are found with numpy.
    """
    length = sum(p.length_s for p in paths)
    ratio = length / total if total > 0 else 0.0
    head = (f"<p>The longest chain of dependent ops (data edges and in-place ordering) takes "
            f"<b>{html_text(format_time(length))}</b> of the <b>{html_text(format_time(total))}</b> serial sum "
            f"(<b>{ratio:.0%}</b>): running independent ops concurrently could save at most "
            f"{html_text(format_time(max(total - length, 0.0)))} per step; only faster ops on this path "
            "shorten it further.</p>")
    positions = path_positions(frame, paths)
    on_path = sum(map(len, positions))
    if not on_path:
        return head
    # Entry j of the concatenated paths: step steps[j] of path paths[owner[j]], frame index where[j].
    where = np.concatenate(positions)
    steps = np.concatenate([np.arange(len(p)) for p in positions])
    owner = np.repeat(np.arange(len(positions)), [len(p) for p in positions])
    col = frame.column

    def row(j: int) -> str:
        i, p, k = int(steps[j]), paths[owner[j]], int(where[j])
        t = times[k]
        via = p.edge_kinds[i - 1].value if i > 0 else ""
        return (f'<tr><td class="num" data-v="{i}">{i + 1}</td><td class="name">{escaped(col("type")[k])}</td>'
                f'<td class="name">{escaped(col("module")[k] or "-")}</td>{source_cell(col("source")[k])}'
                f"<td>{escaped(col('phase')[k])}</td>" + num_cell(t, format_time(t))
                + num_cell(t / length if length else 0, f"{100 * t / length:.1f}" if length else "0")
                + f"<td>{html_text(via)}</td></tr>")

    def table(rows: list[str], table_id: str) -> str:
        return (f'<div class="scroll"><table class="sortable" id="{table_id}"><thead><tr><th class="num">#</th>'
                '<th>op</th><th>module</th><th>source</th><th>phase</th><th class="num">time</th>'
                '<th class="num">% of path</th><th>reached by</th></tr></thead><tbody>' + "".join(rows)
                + "</tbody></table></div>")

    path_times = np.asarray(times, dtype=np.float64)[where]
    slowest = [row(j) for j in slowest_first(path_times, 10)]
    every = [row(j) for j in range(min(on_path, CRITICAL_ROWS))]
    more = f" (the first {CRITICAL_ROWS})" if on_path > CRITICAL_ROWS else ""
    return (head + "<h3>Slowest ops on the path</h3>" + table(slowest, "critical-path-slowest")
            + f"<details><summary>all {on_path} nodes on the path{more}, in order</summary>"
            + table(every, "critical-path-nodes") + "</details>")
