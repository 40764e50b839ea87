"""Writes to a file from a second thread while the caller makes the next text.

Why: a 100,000-node GraphML or node-link export hands the file 90 to 140 MB
of text; copying it into the page cache is a tenth of a second or more of
system time that the writer otherwise waits for between blocks of nodes.
``file.write`` releases the GIL for the system call, so a thread that does
the writes lets the second core do them while this one formats the next
block. The queue is bounded (``DEPTH`` texts): at most that many blocks
wait in memory.

Nothing changes about where the text goes or what happens on failure: the
thread writes to the file object the caller has (``atomic_file``'s
temporary file, through ``streamed.write_streamed``'s counting sink). An
error in the thread is raised in the caller at its next write or at the end;
an error in the caller stops the thread (pending texts are dropped) before
the exception leaves ``background_writes``, so ``atomic_file`` removes its
temporary file as for any failed write.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

#: Texts handed over and not yet written, at most.
DEPTH = 2


class BackgroundWriter:
    """A text sink whose ``write`` hands the text to a thread that writes it to ``f``."""

    def __init__(self, f: IO[str] | Any) -> None:
        self.f = f
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=DEPTH)
        self._error: BaseException | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="graphprof-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            text = self._queue.get()
            if text is None:
                return
            if self._error is None and not self._stopped:
                try:
                    self.f.write(text)
                except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                    self._error = exc

    def write(self, text: str) -> int:
        if self._error is not None:
            raise self._error
        self._queue.put(text)
        return len(text)

    def finish(self, failed: bool) -> None:
        """Wait for the thread: after writing what is queued, or (``failed``) dropping it; raise its error."""
        self._stopped = failed
        self._queue.put(None)
        self._thread.join()
        if self._error is not None and not failed:
            raise self._error


@contextmanager
def background_writes(f: IO[str] | Any) -> Iterator[BackgroundWriter]:
    """A ``BackgroundWriter`` to ``f`` for the ``with`` block; every text is in ``f`` when it ends without error."""
    writer = BackgroundWriter(f)
    try:
        yield writer
    except BaseException:
        writer.finish(failed=True)
        raise
    writer.finish(failed=False)
