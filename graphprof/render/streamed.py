"""Exports written to the file as they are made, and the analysis each format needs.

Why: the largest exports (a Chrome trace, GraphML, node-link JSON) of a
100,000-node profile are 100 to 400 MB of text. Rendering them into one
string first doubled the memory and the time spent in copies; a streamed
writer puts each few thousand nodes' text straight into the one atomic
writer's temporary file (``profile.atomic``), so a failed or refused export
still leaves the user's old file whole. The gzip-compressed trace goes
through ``_Gzipped`` on its way to the file: the 400 MB text is never whole
in memory, and the bytes are those ``gzip.compress(text, 6, mtime=0)`` made.

And why not every format gets the roofline and the advisor: those took a
second of a 100,000-node export whose format shows neither. ``ANALYSIS``
says which format reads roofline bounds and which the advisor's findings.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable
from typing import IO, Any

from graphprof.profile.atomic import atomic_file
from graphprof.profile.model import Profile
from graphprof.render.export_options import ExportError, ExportOptions
from graphprof.render.size_guard import too_large


#: A streamed writer: ``(profile, options, text file)``, writing the whole document.
StreamWriter = Callable[[Profile, ExportOptions, IO[str]], None]


class Analysis(enum.Enum):
    """What a format reads from ``exporters.with_analysis``."""

    NONE = "none"
    BOUNDS = "bounds"
    BOUNDS_AND_FINDINGS = "bounds and findings"


#: Formats not listed here need neither bounds nor findings.
ANALYSIS = {"chrome": Analysis.BOUNDS, "chrome-gz": Analysis.BOUNDS, "dot": Analysis.BOUNDS,
            "svg": Analysis.BOUNDS, "html": Analysis.BOUNDS_AND_FINDINGS}


def _chrome(profile: Profile, options: ExportOptions, f: IO[str]) -> None:
    from graphprof.render.chrome_stream import write_chrome_trace

    write_chrome_trace(profile, f, stat=options.stat, bounds=options.bounds)


def _graphml(profile: Profile, options: ExportOptions, f: IO[str]) -> None:
    from graphprof.render.graphml import write_graphml_file

    write_graphml_file(profile, f, stat=options.stat)


def _node_link(profile: Profile, options: ExportOptions, f: IO[str]) -> None:
    from graphprof.render.node_link_stream import write_node_link

    write_node_link(profile, f, stat=options.stat)


#: Formats written by a streamed writer instead of ``Exporter.render``.
STREAMED: dict[str, StreamWriter] = {"chrome": _chrome, "chrome-gz": _chrome, "graphml": _graphml,
                                     "nodelink": _node_link}
#: Streamed formats whose text is gzip-compressed on its way to the file.
GZIPPED = frozenset({"chrome-gz"})
#: Their compression level: gzip's usual trade of size for time.
GZIP_LEVEL = 6


class _Counted:
    """A sink that writes while the document stays within ``limit`` units and counts all of it:
    characters of a text file, or bytes of a compressed one."""

    def __init__(self, f: IO[Any], limit: int) -> None:
        self.f, self.limit, self.size = f, limit, 0

    def write(self, data: str | bytes) -> int:
        self.size += len(data)
        if not self.limit or self.size <= self.limit:
            self.f.write(data)
        return len(data)


class _Gzipped:
    """A text sink that writes the text's UTF-8 bytes gzip-compressed to a binary file.

    zlib writes the gzip wrapper itself (``wbits`` 31): no file name and
    mtime 0 in the header, so one profile gives the same bytes every time;
    they are the bytes ``gzip.compress(text, 6, mtime=0)`` gave for the whole
    text at once, which is how this format was written before it was streamed.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def write(self, text: str) -> int:
        packed = self.deflate.compress(text.encode("utf-8"))
        if packed:
            self.f.write(packed)
        return len(text)

    def close(self) -> None:
        self.f.write(self.deflate.flush())


def write_streamed(path: str, format: str, writer: StreamWriter, profile: Profile, options: ExportOptions,
                   limit: int, input_bytes: int) -> None:
    """Write ``format`` to ``path`` through ``atomic_file``; refuse (ExportError) a document over ``limit``.

    The caller has checked ``path`` (``exporters.check_target``). Past the limit the text is only counted, so the refusal names the size the
    file would have had, as the one for rendered formats does; the temporary
    file is removed and the user's file is left as it was.
    """
    try:
        with atomic_file(path, binary=format in GZIPPED) as f:
            if format in GZIPPED:
                sink = _Counted(f, limit)
                packed = _Gzipped(sink)  # type: ignore[arg-type]
                writer(profile, options, packed)  # type: ignore[arg-type]
                packed.close()
            else:
                sink = _Counted(f, limit)
                writer(profile, options, sink)  # type: ignore[arg-type]
            refusal = too_large(format, sink.size, limit, input_bytes, estimated=False)
            if refusal:
                raise ExportError(refusal)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None
