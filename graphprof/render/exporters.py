"""Writing a profile to a file whose format follows from its name.

Each format is a small ``Exporter`` class (pyinstrument's renderer style):
a name, the file-name endings it claims, and ``render(profile, options)``
returning the file's text. ``EXPORTERS`` is the registry; the longest
matching ending wins, so ``step.trace.json`` is a Chrome trace,
``g.nodelink.json`` node-link JSON and ``step.memory.svg`` the memory
timeline rather than the graph SVG. ``format=`` overrides the name.

Every write is atomic (a temporary file in the target directory, then
``os.replace``), so a failed export never leaves half a file, and every
mistake a user can make (unknown format, missing directory, Graphviz absent)
is one ``ExportError`` sentence.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping, Sequence

from graphprof.analysis.stats import stat_fn
from graphprof.profile.atomic import atomic_file
from graphprof.profile.model import Profile
from graphprof.profile.serialize import _gc_paused
from graphprof.render.size_guard import clip_profile_text, default_max_bytes, estimated_bytes, stored_bytes, too_large


class ExportError(ValueError):
    """An export the user asked for cannot be done; the message is one sentence."""


@dataclass(frozen=True)
class ExportOptions:
    """What every exporter may honour (each ignores what does not apply to it).

    ``module_level``: True collapses graph views to one node per module and
    phase, False never does, None (default) does so above ``max_nodes``.
    ``hide_views``: leave views, tuple projections and constant factories out
    of graph views. ``bounds``: roofline bound per node, keyed by
    ``(graph_id, node_id)`` or by node id; None computes them from the peaks in
    the profile's meta (none without peaks). ``findings``: advisor findings
    (objects with ``severity``, ``title``, ``time_s``, ``hint``, ``sources``)
    for the HTML report; None runs the advisor. ``graph_id``: the graph the memory timeline shows.
    ``max_bytes``: refuse a file larger than this (``render.size_guard``): None for the default
    limit (50 times the profile's size, at least 256 MiB), 0 for none.
    """

    stat: str = "median"
    module_level: bool | None = None
    hide_views: bool = False
    max_nodes: int = 600
    graph_id: int = 0
    bounds: Mapping[Any, str] | None = None
    findings: Sequence[Any] | None = None
    max_bytes: int | None = None


class Exporter:
    """One output format. Subclasses set ``name``/``suffixes`` and implement ``render``."""

    name: ClassVar[str] = ""
    suffixes: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""

    def render(self, profile: Profile, options: ExportOptions) -> str | bytes:
        """The file's content: text (written as UTF-8) or bytes (a compressed format)."""
        raise NotImplementedError


class ChromeTraceExporter(Exporter):
    name, suffixes, description = "chrome", (".trace.json", ".json"), "Chrome/Perfetto trace (Trace Event Format)"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        from graphprof.render.chrome_trace import chrome_trace_json

        return chrome_trace_json(profile, stat=options.stat, bounds=options.bounds)


class ChromeTraceGzExporter(Exporter):
    name, suffixes = "chrome-gz", (".trace.json.gz", ".json.gz")
    description = "gzip-compressed Chrome/Perfetto trace (Perfetto and chrome://tracing open it as is)"

    def render(self, profile: Profile, options: ExportOptions) -> bytes:
        from graphprof.render.chrome_trace import chrome_trace_json

        # mtime=0: the same profile gives the same bytes (no timestamp in the gzip header).
        return gzip.compress(chrome_trace_json(profile, stat=options.stat, bounds=options.bounds).encode("utf-8"),
                             compresslevel=6, mtime=0)


class DotExporter(Exporter):
    name, suffixes, description = "dot", (".dot", ".gv"), "annotated graph as Graphviz DOT"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        from graphprof.render.dot import profile_dot

        return profile_dot(profile, options)


class SvgExporter(Exporter):
    name, suffixes, description = "svg", (".svg",), "annotated graph as SVG (runs Graphviz's dot)"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        from graphprof.render.dot import dot_to_svg, profile_dot

        return dot_to_svg(profile_dot(profile, options))


class GraphMLExporter(Exporter):
    name, suffixes, description = "graphml", (".graphml",), "dataflow graph as GraphML"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        from graphprof.render.graphml import graphml_text

        return graphml_text(profile, stat=options.stat)


class NodeLinkExporter(Exporter):
    name, suffixes, description = "nodelink", (".nodelink.json",), "dataflow graph as networkx node-link JSON"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        from graphprof.render.graphml import node_link_json

        return node_link_json(profile, stat=options.stat)


class FoldedExporter(Exporter):
    name, suffixes, description = "folded", (".folded",), "folded stacks for flamegraph.pl and speedscope"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        from graphprof.render.folded import folded_stacks

        return folded_stacks(profile, stat=options.stat)


class HtmlExporter(Exporter):
    name, suffixes, description = "html", (".html", ".htm"), "self-contained HTML report"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        from graphprof.render.html import html_report

        return html_report(profile, options)


class MemorySvgExporter(Exporter):
    name, suffixes, description = "memory-svg", ("memory.svg",), "memory timeline as SVG"

    def render(self, profile: Profile, options: ExportOptions) -> str:
        try:  # written by the memory work; imported lazily so its absence costs nothing else
            from graphprof.render.memory_svg import memory_timeline_svg
        except ImportError:
            raise ExportError("this graphprof has no memory timeline renderer (graphprof.render.memory_svg)") from None
        return memory_timeline_svg(profile, graph_id=options.graph_id)


EXPORTERS: tuple[type[Exporter], ...] = (
    ChromeTraceExporter, ChromeTraceGzExporter, DotExporter, SvgExporter, GraphMLExporter, NodeLinkExporter,
    FoldedExporter, HtmlExporter, MemorySvgExporter,
)
FORMATS: tuple[str, ...] = tuple(e.name for e in EXPORTERS)


def exporter_for(path: str, format: str | None = None) -> Exporter:
    """The exporter named ``format``, else the one whose ending of ``path`` is longest."""
    if format is not None:
        for cls in EXPORTERS:
            if cls.name == format:
                return cls()
        raise ExportError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    filename = os.path.basename(path).lower()
    matches = [(len(s), cls) for cls in EXPORTERS for s in cls.suffixes if filename.endswith(s)]
    if not matches:
        endings = ", ".join(s for cls in EXPORTERS for s in cls.suffixes)
        raise ExportError(f"cannot tell the format of {path} from its name (known endings: {endings}); "
                          "choose one with --format (format= in Python)")
    return max(matches, key=lambda m: m[0])[1]()


def check_target(path: str) -> None:
    """Fail early, with one sentence, when ``path`` cannot be a file we write."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ExportError(f"cannot write {path}: it is a directory")
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
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None


def with_analysis(profile: Profile, options: ExportOptions) -> ExportOptions:
    """Fill in roofline bounds and advisor findings the caller did not give."""
    from graphprof.analysis.advisor import advise
    from graphprof.analysis.roofline import Bound, roofline

    points = roofline(profile, stat=options.stat) if options.bounds is None or options.findings is None else []
    bounds = options.bounds
    if bounds is None:
        bounds = {(p.graph_id, p.node_id): p.bound.value for p in points if p.bound is not Bound.UNKNOWN} or None
    findings = options.findings if options.findings is not None else advise(profile, stat=options.stat, points=points)
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
    from graphprof.render.streamed import STREAMED, analysed_options, write_streamed

    with _gc_paused():  # as in build_report: no cycles are made, so no full collection need walk the profile
        opts = analysed_options(exporter.name, profile, opts)
        if exporter.name in STREAMED:
            write_streamed(path, exporter.name, STREAMED[exporter.name], profile, opts, limit, input_bytes)
            return exporter.name
        text = exporter.render(profile, opts)
    refusal = too_large(exporter.name, len(text), limit, input_bytes, estimated=False)
    if refusal:
        raise ExportError(refusal)
    write_atomic(path, text)
    return exporter.name
