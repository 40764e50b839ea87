"""The one atomic file writer: every file graphprof writes goes through ``atomic_file``.

Why one: a profile (``Profile.save``, ``graphprof merge -o``), an export and
the calibration cache must all keep the user's old file whole when a write
fails or is stopped, leave no temporary file behind, keep a symbolic link a
link and get the mode any new file of the user gets. How:

* the text goes to a temporary file next to the target, named
  ``.graphprof-<pid>-<random>.tmp``, which ``os.replace`` renames over the
  target only once it is complete (a link at the target: over the link's
  target, so the link stays);
* the temporary file gets ``0666 & ~umask`` (``mkstemp`` makes it 0600);
* any exception, Ctrl-C's ``KeyboardInterrupt`` included, removes it; so do
  SIGTERM and SIGHUP while a write is in progress: when their handler is the
  default one (the process would just die), the writer raises instead for
  the length of the write, removes its temporary file, and then lets the
  signal end the process as it would have;
* SIGKILL (or a power cut) cannot be caught, so the next write in the same
  directory removes temporary files that are clearly ours and dead: our
  name pattern, owned by this user, untouched for ``STALE_AFTER_S`` seconds,
  and naming a process id that no longer runs on this machine;
* only a regular file (or nothing) is ever replaced: a device, pipe or
  socket at the target (``-o /dev/null``) is refused with an ``OSError``
  before anything is written, since renaming over it would put a regular
  file in its place (with the rights to ``/dev``, the system's ``/dev/null``).

Errors are ``OSError``s naming the target, never the temporary file; each
caller turns them into its own one-sentence error.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import stat
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import IO, Iterator

TEMP_PREFIX = ".graphprof-"
TEMP_SUFFIX = ".tmp"
#: A temporary file not written to for this long, whose process is gone, is left from a killed write.
STALE_AFTER_S = 600.0
#: How a text file's characters become its bytes: UTF-8, and a lone surrogate (a name from a
#: hostile file) as its ``\udXXXX`` escape instead of an error.
TEXT_ERRORS = "backslashreplace"
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX))
#: Signals whose default action ends the process without any cleanup.
_CAUGHT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class _Stopped(BaseException):
    """A catchable stop signal arrived during a write (raised by the temporary handler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, OSError):
        return False  # someone else's process, or not a pid we can ask about: not provably gone
    return False


def remove_stale_temporaries(directory: str, now: float | None = None) -> list[str]:
    """Remove temporary files a killed write left in ``directory``; returns the names removed.

    Only files that are clearly ours and dead go (the rules in the module
    docstring); anything else, and any error, is left alone.
    """
    now = time.time() if now is None else now
    removed: list[str] = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.fullmatch(entry.name)
        if match is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_file(follow_symlinks=False) or (uid is not None and st.st_uid != uid):
                continue
            if now - st.st_mtime < STALE_AFTER_S or not _process_gone(int(match.group(1))):
                continue
            os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            continue
    return removed


@contextmanager
def _signals_raise() -> Iterator[None]:
    """While the body runs, SIGTERM/SIGHUP (when left at their default) raise ``_Stopped``.

    Afterwards the previous handlers are back, and a signal that arrived is
    sent again so the process ends the way it would have without us.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a worker's write is still cleaned on exceptions
        return
    previous = {}
    for signum in _CAUGHT_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, _raise_stopped)
    stopped = None
    try:
        yield
    except _Stopped as exc:
        stopped = exc.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if stopped is not None:
        os.kill(os.getpid(), stopped)  # the default action now: the process ends
        raise SystemExit(128 + stopped)  # in case the signal is blocked in this thread


def file_bytes(text: str) -> bytes:
    """The bytes a text-mode ``atomic_file`` writes for ``text``: for a writer that encodes once
    (a size limit is on these bytes) or on another thread."""
    return text.encode("utf-8", TEXT_ERRORS)


def refuse_special_file(path: str | os.PathLike[str]) -> None:
    """OSError when ``path`` (links followed) exists and is not a regular file or a directory.

    A directory is left to the caller, whose own sentence says so; a device,
    pipe or socket cannot be replaced whole and must not be replaced at all.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent (or unreadable): the write says what is wrong
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise OSError(errno.EINVAL, "it is a device, pipe or socket, not a file graphprof can replace whole",
                      os.fspath(path))


@contextmanager
def atomic_file(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO]:
    """A file object whose content replaces ``path`` when the ``with`` block ends without error.

    Text mode writes UTF-8 with ``\\n`` line ends; ``backslashreplace``
    keeps a lone surrogate a format's own escaping let through as its
    ``\\udXXXX`` escape instead of failing the write.
    """
    target = os.path.realpath(os.fspath(path))
    refuse_special_file(target)
    directory = os.path.dirname(target)
    remove_stale_temporaries(directory)
    with _signals_raise():
        # Signals wait while the temporary file is made and named, and arrive once its removal is armed.
        blocked = set(_CAUGHT_SIGNALS) | {signal.SIGINT}
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked) if hasattr(signal, "pthread_sigmask") else None

        def unblock() -> None:
            if old_mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

        try:
            fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=TEMP_SUFFIX, dir=directory)
        except BaseException:
            unblock()
            raise
        try:
            try:
                unblock()
                os.fchmod(fd, 0o666 & ~_umask())
                if binary:
                    f: IO = os.fdopen(fd, "wb")
                else:
                    f = os.fdopen(fd, "w", encoding="utf-8", newline="\n", errors=TEXT_ERRORS)
            except BaseException:
                os.close(fd)
                raise
            with f:
                yield f
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
