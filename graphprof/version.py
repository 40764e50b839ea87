"""graphprof's version, read from the installed package's metadata (pyproject.toml is the one place it is written).

Its own module, importing nothing of graphprof, so that the runtime can stamp
profiles with it without importing the package's ``__init__`` (which was an
import cycle: ``graphprof`` -> ``tracing`` -> ``runtime.collect`` -> ``graphprof``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("graphprof")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
