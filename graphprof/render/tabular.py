"""Machine-readable profile tables: ``--format json`` and ``--format csv``.

Raw SI numbers (seconds, FLOPs, bytes, FLOP/s, bytes/s), never scaled; an
unknown value is JSON ``null`` / an empty CSV cell. Keys are the column keys
of ``graphprof.analysis.columns`` (the names ``--order-by`` takes).

* json: one object ``{"schema": "graphprof.table/1", "summary": {...},
  "table": {..., "rows": [...]}}``; ``--print-only`` leaves out the other part.
* csv: the rows with a header line; ``--print-only summary`` gives the
  summary as ``key,value`` lines instead. A CSV holds one table, so without
  ``--print-only`` it is the rows.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from typing import Any

from graphprof.analysis.table import Row, TableResult

TABLE_SCHEMA = "graphprof.table/1"


def json_value(value: Any) -> Any:
    """``value`` with its tuples (shapes) as lists, for JSON; the table's and the diff's rule."""
    if isinstance(value, tuple):
        return [json_value(v) for v in value]
    return value


def row_dict(row: Row, columns: tuple[str, ...]) -> dict[str, Any]:
    """One row as a JSON-ready dict of the given columns."""
    return {k: json_value(getattr(row, k)) for k in columns}


def summary_dict(result: TableResult) -> dict[str, Any]:
    """The summary, plus what the filters selected, as a JSON-ready dict."""
    out = asdict(result.summary)
    out["phases"] = [dict(p) for p in out["phases"]]
    out["matched_nodes"] = result.matched_nodes
    out["matched_time_s"] = result.matched_time_s
    return out


def table_dict(result: TableResult) -> dict[str, Any]:
    """The table part: how rows were chosen and the rows themselves."""
    o = result.options
    return {
        "stat": o.stat, "clock": result.clock, "order_by": str(result.order),
        "aggregate": o.aggregate_fn if o.aggregated else None, "aggregate_by": o.aggregate_by,
        "module_depth": o.module_depth, "top": o.top, "total_rows": result.total_rows,
        "total_time_s": result.total_time_s, "note": result.note,
        "columns": list(result.columns),
        "rows": [row_dict(r, result.columns) for r in result.rows],
    }


def render_json(result: TableResult) -> str:
    """The result as one JSON document (``--print-only`` respected)."""
    doc: dict[str, Any] = {"schema": TABLE_SCHEMA}
    if result.options.print_only in (None, "summary"):
        doc["summary"] = summary_dict(result)
    if result.options.print_only in (None, "table"):
        doc["table"] = table_dict(result)
    return json.dumps(doc, indent=1, allow_nan=False)


def csv_cell(value: Any) -> Any:
    """A CSV cell: None empty, a tuple, list or dict as compact JSON; the table's and the diff's rule."""
    if value is None:
        return ""
    if isinstance(value, (tuple, list, dict)):
        return json.dumps(json_value(value), separators=(",", ":"))
    return value


def render_csv(result: TableResult) -> str:
    """The rows as CSV with a header, or the summary as key,value lines with ``--print-only summary``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if result.options.print_only == "summary":
        writer.writerow(["key", "value"])
        for key, value in summary_dict(result).items():
            if key == "phases":  # flattened: one key per phase and figure
                for phase in value:
                    for name in ("nodes", "time_s", "percent"):
                        writer.writerow([f"{phase['phase']}_{name}", phase[name]])
                continue
            writer.writerow([key, csv_cell(value)])
        return buf.getvalue().rstrip("\n")
    writer.writerow(result.columns)
    for row in result.rows:
        writer.writerow([csv_cell(getattr(row, k)) for k in result.columns])
    return buf.getvalue().rstrip("\n")
