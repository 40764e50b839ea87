"""Where the user's code is: the innermost frame that is not torch, graphprof or the standard library.

Every record of a captured op names a ``file:line`` of the user's code, and
every refusal to capture names the line that caused it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from types import FrameType
from typing import Callable

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)
#: graphprof's own folder: frames of files under it are graphprof's, not the user's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# graphprof's own machinery is never "user code"; its demo models are.
_SKIP_DIRS = (
    _TORCH_DIR,
    *(os.path.join(PACKAGE_DIR, d) for d in ("capture", "passes", "runtime", os.path.join("tracing", ""))),
    os.path.dirname(contextlib.__file__),
)


def is_machinery(filename: str) -> bool:
    """Code of graphprof's own capture and replay machinery (not its demo models)."""
    return filename.startswith(_SKIP_DIRS[1:-1])


def is_standard_library(filename: str) -> bool:
    """Code of Python's standard library (``logging``, ``contextlib``)."""
    return filename.startswith(_SKIP_DIRS[-1])


def is_library(filename: str) -> bool:
    """Code of torch, graphprof's machinery, the standard library or generated code; not the user's."""
    if filename.startswith("<"):
        return not filename.startswith(("<ipython", "<stdin>", "<string>"))
    return filename.startswith(_SKIP_DIRS)


def installed(filename: str) -> bool:
    """Code of an installed package (transformers, numpy, a tracker), torch's own included."""
    return "site-packages" in filename or "dist-packages" in filename


def file_line(filename: str, line: int) -> str:
    """``file:line``, the file relative to the working directory when it can be (not across drives)."""
    return f"{_relative(filename, os.getcwd())}:{line}"


@functools.lru_cache(maxsize=256)
def _relative(filename: str, cwd: str) -> str:
    """``filename`` relative to ``cwd``: cached, because host reads are named on every probed step.

    ``os.path.relpath`` took 12-15 us, as long as the read it names (an
    ``.item()`` of the demo GPT step's loss).
    """
    try:
        return os.path.relpath(filename, cwd)
    except ValueError:
        return filename


def user_source(skip: int = 2) -> str:
    """``file:line`` of the innermost frame of user code (not torch, not graphprof)."""
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library(filename) and not filename.startswith("<"):
            return file_line(filename, frame.f_lineno)
        frame = frame.f_back
    return ""


def from_user(skip_files: tuple[str, ...], library: Callable[[str], bool], depth: int = 2) -> bool:
    """Whether the innermost caller outside ``skip_files`` (random.py itself) is the user's code."""
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename in skip_files:
        frame = frame.f_back
    return frame is not None and not library(frame.f_code.co_filename)
