"""Machine-readable diffs: ``graphprof diff --format json`` and ``--format csv``.

Raw SI numbers (seconds, FLOPs), never scaled; unknown values are JSON
``null`` / empty CSV cells, as in ``render.tabular``. Rows are the changed
node pairs (or, with ``--aggregate-by``, the changed groups), ordered and
cut to ``--top`` like the text tables.

* json: ``{"schema": "graphprof.diff/1", "summary": {...}, "gate": {...},
  "nodes": {...}, "aggregates": {"type": [...], ...}}``;
  ``--print-only`` leaves out the other part.
* csv: the changed node pairs with a header line (``--aggregate-by``: the
  groups; profiles without shared graphs: the op type and module groups,
  told apart by the ``by`` column), or with ``--print-only summary`` the
  summary as ``key,value`` lines.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from typing import Any, Sequence

from graphprof.analysis.diff import DiffResult, GroupDiff, GroupDiffs, NodeDiff
from graphprof.render.tabular import csv_cell, json_value

DIFF_SCHEMA = "graphprof.diff/1"
NODE_COLUMNS = (
    "status", "graph", "before_id", "after_id", "name", "op", "type", "module", "module_type", "phase", "source",
    "before_in_shapes", "after_in_shapes", "before_time_s", "after_time_s", "delta_time_s", "ratio",
    "before_flops", "after_flops", "delta_flops",
)
GROUP_COLUMNS = (
    "by", "key", "before_nodes", "after_nodes", "before_time_s", "after_time_s", "delta_time_s", "ratio",
    "before_flops", "after_flops", "delta_flops",
)


def node_dict(n: NodeDiff) -> dict[str, Any]:
    """One node pair as a JSON-ready dict of ``NODE_COLUMNS`` (read from the profiles' columns, not records)."""
    value = n.value
    before_shapes, after_shapes = n.side("in_shapes", "before"), n.side("in_shapes", "after")
    return {
        "status": n.status.value, "graph": n.graph,
        "before_id": n.side("id", "before"), "after_id": n.side("id", "after"),
        "name": value("name"), "op": value("op"), "type": value("type"), "module": value("module"),
        "module_type": value("module_type"), "phase": value("phase"), "source": value("source"),
        "before_in_shapes": None if n.before_index is None else json_value(before_shapes),
        "after_in_shapes": None if n.after_index is None else json_value(after_shapes),
        "before_time_s": n.before_time_s, "after_time_s": n.after_time_s, "delta_time_s": n.delta_time_s,
        "ratio": n.ratio, "before_flops": n.side("flops", "before"),
        "after_flops": n.side("flops", "after"), "delta_flops": n.delta_flops,
    }


def group_dict(g: GroupDiff) -> dict[str, Any]:
    """One group as a JSON-ready dict of ``GROUP_COLUMNS``."""
    return {k: getattr(g, k) for k in GROUP_COLUMNS}


def changed_groups(groups: Sequence[GroupDiff]) -> Sequence[GroupDiff]:
    """Groups whose node count, time or FLOPs differ."""
    if isinstance(groups, GroupDiffs):
        return groups.changed()  # from its columns, building only the groups that are read
    # after - before != 0 exactly when after != before (IEEE floats, subnormals included); no property call
    return [g for g in groups if g.after_time_s != g.before_time_s or g.before_nodes != g.after_nodes
            or g.before_flops != g.after_flops]


def top_rows(items: Sequence[Any], top: int) -> Sequence[Any]:
    """The first ``top`` of ``items`` (0: all): the rows the text, JSON and CSV of a diff show."""
    return items[:top] if top else items


def summary_dict(result: DiffResult) -> dict[str, Any]:
    """Totals of both profiles and their changes, the step comparison and the matching."""
    s = result.steps
    return {
        "mode": result.mode, "stat": result.options.stat, "clock": result.clock,
        "before": asdict(result.before), "after": asdict(result.after),
        "delta_time_s": result.delta_time_s, "delta_flops": result.delta_flops,
        "before_step_median_s": s.before_median_s, "after_step_median_s": s.after_median_s,
        "step_delta_s": s.delta_s, "step_change_pct": s.change_pct, "step_noise_margin_s": s.noise_margin_s,
        "counts": dict(result.counts), "changed_nodes": len(result.changed),
        "graph_pairs": [list(p) for p in result.graph_pairs], "note": result.note,
    }


def gate_dict(result: DiffResult) -> dict[str, Any] | None:
    gate = result.gate
    if gate is None:
        return None
    return {"threshold_pct": gate.threshold_pct, "regressed": gate.regressed, "reason": gate.reason}


def render_diff_json(result: DiffResult) -> str:
    """The diff as one JSON document (``--print-only`` respected)."""
    o = result.options
    doc: dict[str, Any] = {"schema": DIFF_SCHEMA}
    if o.print_only in (None, "summary"):
        doc["summary"] = summary_dict(result)
        doc["gate"] = gate_dict(result)
    if o.print_only in (None, "table"):
        changed = result.changed
        doc["nodes"] = {"order_by": str(result.order), "top": o.top, "total_rows": len(changed),
                        "columns": list(NODE_COLUMNS), "rows": [node_dict(n) for n in top_rows(changed, o.top)]}
        doc["aggregates"] = {by: [group_dict(g) for g in top_rows(changed_groups(groups), o.top)]
                             for by, groups in result.aggregates.items()}
    return json.dumps(doc, indent=1, allow_nan=False)


def render_diff_csv(result: DiffResult) -> str:
    """The changed nodes (or ``--aggregate-by`` groups) as CSV; ``--print-only summary``: key,value lines."""
    o = result.options
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if o.print_only == "summary":
        writer.writerow(["key", "value"])
        flat = summary_dict(result)
        for side in ("before", "after"):
            for key, value in flat.pop(side).items():
                flat[f"{side}_{key}"] = value
        for key, value in {**flat, **{f"gate_{k}": v for k, v in (gate_dict(result) or {}).items()}}.items():
            writer.writerow([key, csv_cell(value)])
        return buf.getvalue().rstrip("\n")
    if o.aggregated or result.mode == "aggregate":
        # No node-by-node diff: the op type and module groups, told apart by the "by" column.
        bys = [o.aggregate_by or "all"] if o.aggregated else ["type", "module"]
        writer.writerow(GROUP_COLUMNS)
        for by in bys:
            for g in top_rows(changed_groups(result.aggregates[by]), o.top):
                writer.writerow([csv_cell(v) for v in group_dict(g).values()])
    else:
        writer.writerow(NODE_COLUMNS)
        for n in top_rows(result.changed, o.top):
            writer.writerow([csv_cell(v) for v in node_dict(n).values()])
    return buf.getvalue().rstrip("\n")
