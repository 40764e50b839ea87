"""The annotated graph as Graphviz DOT, and as SVG through Graphviz's ``dot``.

A heatmap: each box is filled by its share of the step's time (fixed,
logarithmic bins, so colours mean the same in every profile; the legend
names them), labelled with op, time, share, FLOPs and, when known, the
roofline bound. Boxes are clustered by phase and module; the critical path
is drawn with bold outlines and arrows; dashed arrows are in-place ordering
edges. ``graph_view`` decides what is drawn; this module only writes it.

Why no dependency on the PyPI ``graphviz`` package: it is a thin wrapper
that builds DOT text and runs the same ``dot`` binary through
``subprocess``. Writing DOT ourselves keeps escaping in one audited place
(``render.escape``), keeps ``render`` free of optional imports, and leaves
only the binary to install (Debian package ``graphviz``), which the wrapper
needs as well.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING

from graphprof.render.escape import dot_html, dot_string
from graphprof.render.export_options import ExportError
from graphprof.render.graph_view import GraphView, ViewNode, build_view
from graphprof.render.units import format_count, format_time

if TYPE_CHECKING:
    from graphprof.profile.model import Profile
    from graphprof.render.export_options import ExportOptions

#: Lower edge of each heat bin, as a share of the step's time; colours are ColorBrewer YlOrRd.
HEAT_BINS: tuple[float, ...] = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
HEAT_COLOURS: tuple[str, ...] = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c",
                                 "#fc4e2a", "#e31a1c", "#bd0026", "#800026")
PHASE_COLOURS = {"forward": "#eef4fb", "backward": "#fbf1e9", "optimizer": "#eef8ee", "other": "#f3f3f3"}
CRITICAL_COLOUR = "#1f3a93"
DOT_TIMEOUT_S = 300


def heat_bin(share: float) -> int:
    """Index of the heat bin a share of time falls in."""
    index = 0
    for i, lower in enumerate(HEAT_BINS):
        if share >= lower:
            index = i
    return index


def _percent(share: float) -> str:
    return "<0.01%" if 0 < share < 1e-4 else f"{100 * share:.3g}%"


def _legend(view: GraphView) -> str:
    cells = []
    for i, colour in enumerate(HEAT_COLOURS):
        upper = f"–{_percent(HEAT_BINS[i + 1])}" if i + 1 < len(HEAT_BINS) else "+"
        text_colour = "white" if i >= 6 else "black"
        cells.append(f'<TD BGCOLOR="{colour}"><FONT COLOR="{text_colour}">{dot_html(_percent(HEAT_BINS[i]) + upper)}</FONT></TD>')
    ratio = view.critical_length_s / view.serial_s if view.serial_s > 0 else 0.0
    level = (f"module level (depth {view.depth}) of {view.op_nodes} ops" if view.module_level
             else f"{view.op_nodes - view.hidden} of {view.op_nodes} ops shown")
    rows = [
        f'<TR><TD COLSPAN="{len(cells)}"><B>share of step time ({dot_html(view.stat)})</B></TD></TR>',
        "<TR>" + "".join(cells) + "</TR>",
        f'<TR><TD COLSPAN="{len(cells)}" ALIGN="LEFT">bold blue: critical path, {dot_html(format_time(view.critical_length_s))} '
        f'of {dot_html(format_time(view.serial_s))} serial ({ratio:.0%}); dashed: in-place ordering; {dot_html(level)}</TD></TR>',
    ]
    return ('legend [shape=plaintext, style="", tooltip="legend", label=<<TABLE BORDER="0" CELLBORDER="1" '
            'CELLSPACING="0" CELLPADDING="4">' + "".join(rows) + "</TABLE>>];")


def _node_line(node: ViewNode) -> str:
    lines = [node.title]
    if node.subtitle:
        lines.append(node.subtitle)
    lines.append(f"{format_time(node.time_s)} · {_percent(node.share)}")
    extra = [format_count(node.flops, "FLOP")] if node.flops else []  # views' "0 FLOP" is noise
    if node.bound:
        extra.append(node.bound)
    if extra:
        lines.append(" · ".join(extra))
    colour = heat_bin(node.share)
    attrs = [f"label={dot_string(chr(10).join(lines))}", f'fillcolor="{HEAT_COLOURS[colour]}"',
             f"tooltip={dot_string(node.tooltip)}"]
    if colour >= 6:
        attrs.append('fontcolor="white"')
    if node.critical:
        attrs.append(f'penwidth=3, color="{CRITICAL_COLOUR}"')
    return f"{node.key} [{', '.join(attrs)}];"


#: Module paths nest at most this deep in clusters; a deeper path's tail is one cluster, so a
#: hostile 2,000-part path neither recurses past Python's limit nor overwhelms Graphviz.
MAX_CLUSTER_DEPTH = 24


def _cluster_tree(nodes: tuple[ViewNode, ...]) -> dict:
    tree: dict = {"nodes": [], "children": {}}
    for node in nodes:
        branch = tree
        path = tuple(node.cluster)
        if len(path) > MAX_CLUSTER_DEPTH:
            path = (*path[:MAX_CLUSTER_DEPTH - 1], ".".join(path[MAX_CLUSTER_DEPTH - 1:]))
        for name in path:
            branch = branch["children"].setdefault(name, {"nodes": [], "children": {}})
        branch["nodes"].append(node)
    return tree


def _write_clusters(tree: dict, out: list[str], indent: str, counter: list[int], phase: str | None) -> None:
    for node in tree["nodes"]:
        out.append(indent + _node_line(node))
    for name, child in tree["children"].items():
        counter[0] += 1
        child_phase = name if phase is None and name in PHASE_COLOURS else phase
        fill = PHASE_COLOURS.get(name, "#ffffff") if phase is None else "#ffffff"
        out.append(f"{indent}subgraph cluster_{counter[0]} {{")
        out.append(f'{indent}  label={dot_string(name)}; tooltip={dot_string(name)}; style="rounded,filled"; '
                   f'fillcolor="{fill}"; color="#b0b0b0";')
        _write_clusters(child, out, indent + "  ", counter, child_phase)
        out.append(f"{indent}}}")


def view_dot(view: GraphView, title: str = "") -> str:
    """DOT text for a graph view."""
    out = [
        "digraph graphprof {",
        f'  graph [label={dot_string(title)}, labelloc="t", fontname="Helvetica", fontsize=16, '
        'rankdir="TB", nodesep=0.25, ranksep=0.35, newrank=true];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.08,0.04"];',
        '  edge [color="#606060", arrowsize=0.6];',
        "  " + _legend(view),
    ]
    _write_clusters(_cluster_tree(view.nodes), out, "  ", [0], None)
    for edge in view.edges:
        attrs = []
        if edge.layout_only:
            attrs.append("style=invis")
        elif edge.kind.value == "order":
            attrs.append('style=dashed, color="#a0a0a0"')
        if edge.cross_phase:
            attrs.append("weight=0")
        if edge.critical:
            attrs.append(f'penwidth=3, color="{CRITICAL_COLOUR}"')
        out.append(f"  {edge.src} -> {edge.dst}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    out.append("}")
    return "\n".join(out) + "\n"


def profile_dot(profile: Profile, options: ExportOptions) -> str:
    """The annotated graph of a profile as DOT text."""
    view = build_view(profile, stat=options.stat, module_level=options.module_level,
                      hide_views=options.hide_views, max_nodes=options.max_nodes, bounds=options.bounds)
    steps = len(profile.steps)
    title = (f"graphprof: {profile.meta.function or 'profile'} — {format_time(view.total_time_s)} per step "
             f"({options.stat} of {steps} step{'s' if steps != 1 else ''})")
    return view_dot(view, title)


def dot_to_svg(dot_text: str, timeout_s: float = DOT_TIMEOUT_S) -> str:
    """Lay out DOT text with Graphviz's ``dot`` and return the SVG."""
    binary = shutil.which("dot")
    if binary is None:
        raise ExportError("writing SVG needs Graphviz's dot program, which is not installed "
                          "(Debian/Ubuntu: apt-get install graphviz); export .dot instead")
    try:
        done = subprocess.run([binary, "-Tsvg"], input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ExportError(f"Graphviz's dot took more than {timeout_s:.0f} s; export with module_level "
                          "(--module-level) for a smaller picture") from None
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ExportError(f"Graphviz's dot failed: {reason[0] if reason else f'exit status {done.returncode}'}")
    return done.stdout.decode("utf-8")
