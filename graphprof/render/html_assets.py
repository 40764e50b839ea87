"""The HTML report's inline stylesheet and script.

Both are constants inlined into every report: the file has to open from a
disk, an e-mail or a CI artefact store with no network, and the page's
Content-Security-Policy forbids loading anything at all. The script only
sorts tables (a cell's ``data-v`` value, a number or the full text, is its sort key) and marks the
document ready; every number is in the HTML already, so the report reads
the same with scripts off.
"""

from __future__ import annotations

CSS = """
:root { --fg: #1d232b; --muted: #5b6670; --line: #dde2e7; --accent: #1f3a93; --bg: #ffffff; --soft: #f5f7f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       color: var(--fg); background: var(--bg); }
header { padding: 18px 28px 12px; border-bottom: 1px solid var(--line); background: var(--soft); }
header h1 { margin: 0 0 4px; font-size: 22px; font-weight: 600; }
header p { margin: 0; color: var(--muted); }
nav { position: sticky; top: 0; z-index: 2; background: #fff; border-bottom: 1px solid var(--line);
      padding: 6px 28px; font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 16px; }
main { padding: 6px 28px 40px; max-width: 1560px; }
section { margin-top: 22px; }
h2 { font-size: 17px; margin: 0 0 8px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 14px; margin: 14px 0 6px; color: var(--muted); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 10px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; background: #fff; }
.card .k { font-size: 12px; color: var(--muted); }
.card .v { font-size: 19px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card .s { font-size: 12px; color: var(--muted); }
.note { color: var(--muted); font-style: italic; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; }
th, td { padding: 3px 7px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; white-space: nowrap; position: sticky; top: 0; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th:hover { color: var(--accent); }
th[aria-sort="ascending"]::after { content: " \\25B2"; font-size: 9px; }
th[aria-sort="descending"]::after { content: " \\25BC"; font-size: 9px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.name { max-width: 260px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
td.src { color: var(--muted); white-space: nowrap; }
td.shapes { max-width: 190px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; font-size: 11.5px; }
tr.crit td:first-child { box-shadow: inset 3px 0 0 var(--accent); }
td.bar { width: 28%; }
td.bar div { height: 11px; background: #e6550d; border-radius: 2px; min-width: 1px; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 22px; }
@media (max-width: 1000px) { .grid2 { grid-template-columns: 1fr; } }
.scroll { max-height: 560px; overflow: auto; border: 1px solid var(--line); }
svg.plot { max-width: 100%; height: auto; font: 11px system-ui, Helvetica, Arial, sans-serif; }
svg.plot .tick { fill: #555; font-size: 10.5px; }
svg.plot .axis { fill: #333; font-size: 12px; }
svg.plot .roof { fill: none; stroke: #b22222; stroke-width: 2; stroke-dasharray: 6 3; }
svg.plot .roof-label { fill: #b22222; font-size: 11px; paint-order: stroke; stroke: #fff; stroke-width: 3px; }
svg.plot .pt { fill-opacity: 0.65; stroke: #fff; stroke-width: 0.6; }
svg.plot .pt:hover { fill-opacity: 1; stroke: #000; }
.memory svg { max-width: 100%; height: auto; }
.finding { border: 1px solid var(--line); border-left: 5px solid #999; border-radius: 4px; padding: 6px 12px;
           margin: 6px 0; }
.finding.sev-high, .finding.sev-critical, .finding.sev-error { border-left-color: #c0392b; }
.finding.sev-medium, .finding.sev-warning { border-left-color: #e67e22; }
.finding.sev-low, .finding.sev-info { border-left-color: #2e86c1; }
.finding .t { font-weight: 600; }
.finding .sev { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin-right: 8px; }
.finding .src { font-size: 12px; color: var(--muted); }
code { font-size: 12px; }
details summary { cursor: pointer; color: var(--accent); margin: 6px 0; }
footer { color: var(--muted); font-size: 12px; padding: 16px 28px; border-top: 1px solid var(--line); }
"""

JS = """
(function () {
  "use strict";
  function key(cell) {
    var v = cell.getAttribute("data-v");
    if (v !== null && v !== "") {
      var n = Number(v);
      return isNaN(n) ? {s: v.toLowerCase()} : {n: n};
    }
    return {s: cell.textContent.trim().toLowerCase()};
  }
  function compare(a, b) {
    if (a.n !== undefined && b.n !== undefined) { return a.n - b.n; }
    if (a.n !== undefined) { return -1; }
    if (b.n !== undefined) { return 1; }
    return a.s < b.s ? -1 : (a.s > b.s ? 1 : 0);
  }
  function sortBy(table, col, th) {
    var body = table.tBodies[0];
    var descending = th.getAttribute("aria-sort") !== "descending";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r1, r2) {
      var c = compare(key(r1.cells[col]), key(r2.cells[col]));
      return descending ? -c : c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var head = table.tHead && table.tHead.rows[0];
    if (!head) { return; }
    Array.prototype.forEach.call(head.cells, function (th, col) {
      th.setAttribute("title", "sort");
      th.addEventListener("click", function () { sortBy(table, col, th); });
    });
  });
  document.documentElement.setAttribute("data-ready", "1");
})();
"""
