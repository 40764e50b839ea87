"""Writing a profile to a file whose format follows from its name.

Each format is an ``ExportFormat`` record: a name, the file-name endings it
claims, and ``render(profile, options)`` returning the file's content, or
None for the formats ``streamed.STREAMED`` writes to the file as they are
made (the trace, GraphML, node-link JSON: hundreds of MB at 100,000 nodes).
``EXPORTERS`` is the registry, by name; the longest
matching ending wins, so ``step.trace.json`` is a Chrome trace,
``g.nodelink.json`` node-link JSON and ``step.memory.svg`` the memory
timeline rather than the graph SVG. ``format=`` overrides the name.

Every write is atomic (a temporary file in the target directory, then
``os.replace``), so a failed export never leaves half a file, and every
mistake a user can make (unknown format, missing directory, Graphviz absent)
is one ``ExportError`` sentence.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from graphprof.analysis.stats import stat_fn
from graphprof.profile.atomic import atomic_file, file_bytes, refuse_special_file
from graphprof.profile.model import Profile
from graphprof.profile.node_columns import gc_paused
from graphprof.render.export_options import ExportError, ExportOptions, cannot_write
from graphprof.render.streamed import ANALYSIS, STREAMED, Analysis, write_streamed
from graphprof.render.size_guard import clip_profile_text, default_max_bytes, estimated_bytes, stored_bytes, too_large

if TYPE_CHECKING:
    from graphprof.analysis.roofline import RooflineBounds


@dataclass(frozen=True)
class ExportFormat:
    """One output format: its name, the file-name endings it claims, and what renders it.

    ``render(profile, options)`` returns the file's content: text (written as
    UTF-8) or bytes (a compressed format); None: the format is streamed, and
    ``streamed.STREAMED[name]`` writes it.
    """

    name: str
    suffixes: tuple[str, ...]
    description: str
    render: Callable[[Profile, ExportOptions], str | bytes] | None


# The renderers import their modules when called, so choosing a format imports none of them.
def _dot(profile: Profile, options: ExportOptions) -> str:
    from graphprof.render.dot import profile_dot

    return profile_dot(profile, options)


def _svg(profile: Profile, options: ExportOptions) -> str:
    from graphprof.render.dot import dot_to_svg, profile_dot

    return dot_to_svg(profile_dot(profile, options))


def _folded(profile: Profile, options: ExportOptions) -> str:
    from graphprof.render.folded import folded_stacks

    return folded_stacks(profile, stat=options.stat)


def _html(profile: Profile, options: ExportOptions) -> str:
    from graphprof.render.html import html_report

    return html_report(profile, options)


def _memory_svg(profile: Profile, options: ExportOptions) -> str:
    from graphprof.render.memory_svg import memory_timeline_svg

    return memory_timeline_svg(profile, graph_id=options.graph_id)


#: The formats by name, in the order help texts list them; a new format is one entry here.
EXPORTERS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat("chrome", (".trace.json", ".json"), "Chrome/Perfetto trace (Trace Event Format)", None),
    ExportFormat("chrome-gz", (".trace.json.gz", ".json.gz"),
                 "gzip-compressed Chrome/Perfetto trace (Perfetto and chrome://tracing open it as is)", None),
    ExportFormat("dot", (".dot", ".gv"), "annotated graph as Graphviz DOT", _dot),
    ExportFormat("svg", (".svg",), "annotated graph as SVG (runs Graphviz's dot)", _svg),
    ExportFormat("graphml", (".graphml",), "dataflow graph as GraphML", None),
    ExportFormat("nodelink", (".nodelink.json",), "dataflow graph as networkx node-link JSON", None),
    ExportFormat("folded", (".folded",), "folded stacks for flamegraph.pl and speedscope", _folded),
    ExportFormat("html", (".html", ".htm"), "self-contained HTML report", _html),
    ExportFormat("memory-svg", ("memory.svg",), "memory timeline as SVG", _memory_svg),
)}
FORMATS: tuple[str, ...] = tuple(EXPORTERS)


def exporter_for(path: str, format: str | None = None) -> ExportFormat:
    """The format named ``format``, else the one whose ending of ``path`` is longest."""
    if format is not None:
        if format in EXPORTERS:
            return EXPORTERS[format]
        raise ExportError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    filename = os.path.basename(path).lower()
    matches = [(len(s), f) for f in EXPORTERS.values() for s in f.suffixes if filename.endswith(s)]
    if not matches:
        endings = ", ".join(s for f in EXPORTERS.values() for s in f.suffixes)
        raise ExportError(f"cannot tell the format of {path} from its name (known endings: {endings}); "
                          "choose one with --format (format= in Python)")
    return max(matches, key=lambda m: m[0])[1]


def check_target(path: str) -> None:
    """Fail early, with one sentence, when ``path`` cannot be a file we write."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ExportError(f"cannot write {path}: it is a directory")
    try:
        refuse_special_file(path)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    if not os.path.isdir(directory):
        raise ExportError(f"cannot write {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise ExportError(f"cannot write {path}: directory {directory} is not writable")


def write_atomic(path: str, text: str | bytes) -> None:
    """Write ``text`` (str as UTF-8, or bytes as they are) to ``path`` through ``atomic_file``.

    A symbolic link at ``path`` stays a link: its target is what gets replaced.
    """
    check_target(path)
    try:
        with atomic_file(path, binary=isinstance(text, bytes)) as f:
            f.write(text)
    except OSError as exc:
        raise cannot_write(path, exc) from None


def analysed_options(format: str, profile: Profile, options: ExportOptions) -> ExportOptions:
    """``options`` with the roofline bounds and advisor findings ``format`` shows filled in, and only those."""
    need = ANALYSIS.get(format, Analysis.NONE)
    if need is Analysis.NONE:
        return options
    if format in ("dot", "svg"):
        from graphprof.render.graph_view import draws_modules

        if draws_modules(profile, options.module_level, options.max_nodes):  # module boxes show no bound
            return options
    if need is Analysis.BOUNDS and options.findings is None:
        return options if options.bounds is not None else replace(options, bounds=node_bounds(profile, options.stat))
    return with_analysis(profile, options)


def node_bounds(profile: Profile, stat: str) -> dict[tuple[int, int], str] | None:
    """Each node's roofline bound by (graph id, node id), None when no bound is known: ``with_analysis``'s
    bounds. Why from ``roofline_bounds``: its arrays decide as the points of ``roofline`` do, and a
    format that shows only bounds need not build a point per node (a third of a 100,000-node export)."""
    from graphprof.analysis.roofline import roofline_bounds

    return _bounds_by_node(profile, roofline_bounds(profile, stat=stat))


def _bounds_by_node(profile: Profile, computed: RooflineBounds) -> dict[tuple[int, int], str] | None:
    """``computed``'s known bounds by (graph id, node id), in node order; only known nodes are read."""
    from graphprof.analysis.frame import node_frame
    from graphprof.analysis.roofline import BOUNDS, Bound

    known = np.flatnonzero(computed.codes != BOUNDS.index(Bound.UNKNOWN)).tolist()
    if not known:
        return None
    frame = node_frame(profile)
    graph_ids, ids, codes = frame.column("graph_id"), frame.column("id"), computed.codes.tolist()
    labels = [b.value for b in BOUNDS]
    return {(graph_ids[i], ids[i]): labels[codes[i]] for i in known}


def with_analysis(profile: Profile, options: ExportOptions) -> ExportOptions:
    """Fill in roofline bounds and advisor findings the caller did not give.

    Both come from ``roofline_bounds``' arrays, which decide as ``roofline``'s
    points do: a point per node was most of an HTML export's analysis."""
    from graphprof.analysis.advisor import advise
    from graphprof.analysis.roofline import roofline_bounds

    bounds, findings = options.bounds, options.findings
    if bounds is None or findings is None:
        computed = roofline_bounds(profile, stat=options.stat)
        bounds = bounds if bounds is not None else _bounds_by_node(profile, computed)
        findings = findings if findings is not None else advise(profile, stat=options.stat, bounds=computed)
    return replace(options, bounds=bounds, findings=tuple(findings))


def export_profile(profile: Profile, path: str | os.PathLike[str], format: str | None = None,
                   **options: Any) -> str:
    """Write ``profile`` to ``path`` in the format its name implies; returns the format's name.

    ``options`` are the fields of ``ExportOptions`` (``stat``, ``module_level``,
    ``hide_views``, ``max_nodes``, ``graph_id``, ``bounds``, ``findings``).
    """
    path = os.fspath(path)
    check_target(path)  # before rendering, which can take a while
    exporter = exporter_for(path, format)
    unknown = set(options) - set(ExportOptions.__dataclass_fields__)
    if unknown:
        raise ExportError(f"unknown export option(s): {', '.join(sorted(unknown))}")
    opts = replace(ExportOptions(), **options)
    stat_fn(opts.stat)
    if opts.max_bytes is not None and (type(opts.max_bytes) is not int or opts.max_bytes < 0):
        raise ExportError("max_bytes must be a whole number of bytes, 0 for no limit")
    profile = clip_profile_text(profile)
    input_bytes = stored_bytes(profile)
    limit = default_max_bytes(input_bytes) if opts.max_bytes is None else opts.max_bytes
    estimate = estimated_bytes(profile, exporter.name)
    refusal = estimate is not None and too_large(exporter.name, estimate, limit, input_bytes, estimated=True)
    if refusal:
        raise ExportError(refusal)

    with gc_paused():  # as in build_report: no cycles are made, so no full collection need walk the profile
        opts = analysed_options(exporter.name, profile, opts)
        if exporter.render is None:
            write_streamed(path, exporter.name, STREAMED[exporter.name], profile, opts, limit, input_bytes)
            return exporter.name
        text = exporter.render(profile, opts)
    data = text if isinstance(text, bytes) else file_bytes(text)  # the limit is on the file's bytes
    refusal = too_large(exporter.name, len(data), limit, input_bytes, estimated=False)
    if refusal:
        raise ExportError(refusal)
    write_atomic(path, data)
    return exporter.name
