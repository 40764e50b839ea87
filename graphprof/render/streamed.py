"""Exports written to the file as they are made, and the analysis each format needs.

Why: the largest exports (a Chrome trace, GraphML, node-link JSON) of a
100,000-node profile are 100 to 400 MB of text. Rendering them into one
string first doubled the memory and the time spent in copies; a streamed
writer puts each few thousand nodes' text straight into the one atomic
writer's temporary file (``profile.atomic``), so a failed or refused export
still leaves the user's old file whole. The gzip-compressed trace goes
through ``_Gzipped`` on its way to the file: the 400 MB text is never whole
in memory, and the bytes are those ``gzip.compress(text, 6, mtime=0)`` made.

The writes (and the compression) happen in a second thread (``_Background``),
in order, while the format's writer makes the next block: ``file.write`` and
zlib release the GIL, so on a second core the system calls and the deflate
of a block overlap the making of the next one. A failure in that thread
stops the export with the same error in the caller's thread, and any
failure of the caller stops the thread before the atomic writer removes
its temporary file.

And why not every format gets the roofline and the advisor: those took a
second of a 100,000-node export whose format shows neither. ``ANALYSIS``
says which format reads roofline bounds and which the advisor's findings.
"""

from __future__ import annotations

import enum
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from graphprof.profile.atomic import atomic_file, file_bytes
from graphprof.profile.model import Profile
from graphprof.render.export_options import ExportError, ExportOptions, cannot_write
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
    """A sink that writes while the file stays within ``limit`` bytes and counts all of them.

    It counts what the file gets (UTF-8, or the compressed bytes of a ``.gz``),
    since ``--max-size`` is a size on disk: characters would let a trace of
    non-ASCII names past the limit.
    """

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self.f, self.limit, self.size = f, limit, 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if not self.limit or self.size <= self.limit:
            self.f.write(data)
        return len(data)


class _Gzipped:
    """A sink that writes UTF-8 bytes gzip-compressed to a binary file.

    zlib writes the gzip wrapper itself (``wbits`` 31): no file name and
    mtime 0 in the header, so one profile gives the same bytes every time:
    those of ``gzip.compress(text, 6, mtime=0)`` on the whole text, which
    ``tests/render/test_chrome_trace_gz.py`` checks.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def write(self, data: bytes) -> int:
        packed = self.deflate.compress(data)
        if packed:
            self.f.write(packed)
        return len(data)

    def close(self) -> None:
        self.f.write(self.deflate.flush())


#: Blocks waiting for the writing thread: a few blocks of a few MB, so the caller runs ahead by that much at most.
QUEUE_BLOCKS = 4


class _Background:
    """A text sink whose ``write`` hands the text's UTF-8 bytes to a second thread, which passes them on to
    ``write``, in order.

    Why a thread: a streamed export is a loop of "make a block of text,
    write it"; the write is a system call (and for the gzip trace a deflate)
    that releases the GIL, so in a thread of its own it runs beside the
    making of the next block instead of after it. The queue is bounded, so
    at most ``QUEUE_BLOCKS`` blocks wait in memory. The thread's first error
    is raised by the caller's next ``write`` (or ``finish``); later blocks
    are dropped, never written after a failed one. ``close`` (the gzip
    stream's end) runs in the thread after the last block.

    The text is encoded here, in the caller's thread, as the text-mode
    atomic file would (UTF-8, lone surrogates as their ``\\udXXXX``
    escape): encoding holds the GIL wherever it runs, and here the second
    thread needs the GIL only between its system calls.
    """

    def __init__(self, write: Callable[[bytes], object], close: Callable[[], object] | None = None) -> None:
        self._write, self._close = write, close
        self._queue: queue.Queue[bytes | bool] = queue.Queue(QUEUE_BLOCKS)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="graphprof-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()  # a block, True: finish (close), False: abandoned
            if item is False:
                return
            if self._error is None:  # else drop what was queued behind a failed write
                try:
                    if item is not True:
                        self._write(item)  # type: ignore[arg-type]
                    elif self._close is not None:
                        self._close()
                except BaseException as exc:  # handed to the caller's thread, which decides
                    self._error = exc
            if item is True:
                return

    def write(self, text: str) -> int:
        if self._error is not None:
            raise self._error
        self._queue.put(file_bytes(text))
        return len(text)

    def finish(self) -> None:
        """Wait until every block is written and ``close`` has run; raise the first error a write met."""
        self._queue.put(True)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """Drop the blocks not yet written and wait for the one being written (the caller failed)."""
        self._error = self._error or _Abandoned()
        self._queue.put(False)
        self._thread.join()


class _Abandoned(Exception):
    """Marks a ``_Background`` whose caller failed: what is still queued is dropped."""


@contextmanager
def _in_background(write: Callable[[bytes], object], close: Callable[[], object] | None = None
                   ) -> Iterator[_Background]:
    """A ``_Background`` sink for the ``with`` block; all written when it ends, the thread gone when it fails."""
    sink = _Background(write, close)
    try:
        yield sink
    except BaseException:
        sink.abandon()
        raise
    sink.finish()


def write_streamed(path: str, format: str, writer: StreamWriter, profile: Profile, options: ExportOptions,
                   limit: int, input_bytes: int) -> None:
    """Write ``format`` to ``path`` through ``atomic_file``; refuse (ExportError) a document over ``limit``.

    The caller has checked ``path`` (``exporters.check_target``). Past the limit the text is only counted, so the refusal names the size the
    file would have had, as the one for rendered formats does; the temporary
    file is removed and the user's file is left as it was.
    """
    try:
        with atomic_file(path, binary=True) as f:
            counted = _Counted(f, limit)  # the file's bytes, counted in the writing thread
            packed = _Gzipped(counted) if format in GZIPPED else None  # type: ignore[arg-type]
            with (_in_background(packed.write, packed.close) if packed is not None
                  else _in_background(counted.write)) as background:
                writer(profile, options, background)  # type: ignore[arg-type]
            refusal = too_large(format, counted.size, limit, input_bytes, estimated=False)
            if refusal:
                raise ExportError(refusal)
    except OSError as exc:
        raise cannot_write(path, exc) from None
