"""A sign of life on a terminal: one status line on stderr while long work runs.

Capture and the passes on a large model take seconds to minutes, and so does
``graphprof report`` on a big file. On a terminal, ``stage("capturing
train_step")`` shows ``graphprof: capturing train_step ...`` and erases it
when the stage ends, so nothing is left in the output. It stays quiet when
stderr is not a terminal (a pipe, a log file, CI, a notebook's captured
stream), with ``GRAPHPROF_PROGRESS=0``, and with ``graphprof -q``.

Why not tqdm or rich: these stages have no known length (a capture is one
call into make_fx), so a bar could only spin; a line that names the stage
says as much without a dependency. Torch-free, so the CLI's torch-free
commands can use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterator

_quiet = False


def set_quiet(quiet: bool) -> None:
    """``graphprof -q``: no status lines for the rest of the process."""
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    """Status lines only on a terminal, and only when not asked to be quiet."""
    if _quiet or os.environ.get("GRAPHPROF_PROGRESS", "1") == "0":
        return False
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


@contextlib.contextmanager
def stage(text: str) -> Iterator[None]:
    """Show ``graphprof: <text> ...`` for the length of the block, then erase it."""
    if not enabled():
        yield
        return
    started = time.perf_counter()
    line = f"graphprof: {text} ..."
    sys.stderr.write("\r" + line)
    sys.stderr.flush()
    try:
        yield
    finally:
        seconds = time.perf_counter() - started
        # A long stage leaves its time behind (a sign of where the wait went); a short one leaves nothing.
        sys.stderr.write("\r\033[K" + (f"{line} {seconds:.1f} s\n" if seconds >= 5 else ""))
        sys.stderr.flush()
