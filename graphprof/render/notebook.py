"""A profile shown in a Jupyter notebook: ``Profile._repr_html_``.

Made from the HTML report's own parts (``render.html``): the summary cards,
the advisor's findings and the top-nodes table, plus MFU/HFU and the eager
comparison as cards. What differs from the report is only what a notebook
needs:

- one ``<div class="graphprof-nb">``, no document, no script (notebook
  front ends drop or sandbox scripts in untrusted outputs, and every number
  is in the markup anyway);
- the report's stylesheet scoped to that div, so showing a profile never
  restyles the notebook around it;
- every name escaped, as in the report (``render.escape``).
"""

from __future__ import annotations

import re

from graphprof.analysis.critical_path import critical_paths
from graphprof.analysis.frame import node_frame
from graphprof.profile.model import Profile
from graphprof.render.escape import html_text
from graphprof.render.exporters import ExportOptions, with_analysis
from graphprof.render.html import (
    TOP_NODES, findings_html, slowest_nodes, summary_cards, top_nodes_table, utilisation_cards,
)
from graphprof.render.html_assets import CSS

ROOT_CLASS = "graphprof-nb"
#: The report's rules a notebook view uses; the page-level ones (body, header, nav, footer) stay out.
_KEPT_SELECTORS = (".cards", ".card", ".note", "table", "th", "td", "tr.crit", ".scroll", ".finding", "code")


def scoped_css(css: str = CSS) -> str:
    """The report's stylesheet, limited to the notebook view's rules and scoped under its root div."""
    variables = re.search(r":root\s*{([^}]*)}", css)
    out = [f".{ROOT_CLASS} {{{variables.group(1) if variables else ''} color: var(--fg); "
           "font: 13px/1.45 system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; }"]
    for selectors, body in re.findall(r"(?m)^([^@:{}\n][^{}\n]*)\{([^}]*)\}", css):
        parts = [s.strip() for s in selectors.split(",")]
        if all(p.startswith(_KEPT_SELECTORS) for p in parts):
            out.append(", ".join(f".{ROOT_CLASS} {p}" for p in parts) + f" {{{body}}}")
    out.append(f".{ROOT_CLASS} h4 {{ margin: 12px 0 4px; font-size: 14px; }}")
    return "\n".join(out)


def notebook_html(profile: Profile, stat: str = "median") -> str:
    """The notebook view of ``profile``: one scoped ``<div>``, summary, utilisation, findings, top nodes."""
    meta = profile.meta
    title = f"graphprof profile: {meta.function or 'profile'}"
    device = " ".join(x for x in (meta.device_type, meta.device_name) if x)
    sub = f"{meta.capture} capture on {device or 'unknown device'} · {len(profile.steps)} profiled steps, {stat} shown"
    if not profile.graphs or not profile.steps:
        body = '<p class="note">No profiled step: nothing to show yet.</p>'
    else:
        options = with_analysis(profile, ExportOptions(stat=stat))
        frame = node_frame(profile)
        times = frame.times(stat, "auto")
        total = sum(times)
        paths = critical_paths(profile, stat=stat)
        critical = {(p.graph_id, nid) for p in paths for nid in p.nodes}
        body = (summary_cards(profile, frame, total, paths, stat) + utilisation_cards(profile, stat)
                + "<h4>Advisor findings</h4>" + findings_html(options.findings or ())
                + "<h4>Top nodes</h4>" + top_nodes_table(slowest_nodes(frame, times, TOP_NODES), total, critical,
                                                    options.bounds))
    return (f'<div class="{ROOT_CLASS}"><style>{scoped_css()}</style>'
            f"<h4>{html_text(title)}</h4><p class=\"note\">{html_text(sub)}</p>{body}</div>")
