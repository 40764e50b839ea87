"""``python -m graphprof`` and the ``graphprof`` command (``run``).

The entry point lives here, outside ``graphprof.cli``, because importing the
CLI imports numpy, and what numpy's BLAS does with threads is decided when
numpy is imported (``one_blas_thread``).
"""

from __future__ import annotations

import os
import sys

#: The variable OpenBLAS (numpy's BLAS in its wheels) reads once, when it is loaded.
BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def one_blas_thread() -> None:
    """Import numpy with its BLAS on one thread, unless the user set the thread count or numpy is loaded.

    Why: no command does linear algebra, yet OpenBLAS starts a thread per
    core when loaded, and they take CPU the command never asked for: 0.1 s
    of CPU on ``analyze`` of 10,000 nodes, 0.3 s on the trace of 100,000
    (whose writing thread needs the second core). The variable is set for the
    import only, so nothing the command starts later (Graphviz, torch in
    ``demo``) inherits it.
    """
    if BLAS_THREADS in os.environ or "numpy" in sys.modules:
        return
    os.environ[BLAS_THREADS] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ[BLAS_THREADS]


def run() -> None:
    """The ``graphprof`` command."""
    one_blas_thread()
    from graphprof.cli import run as command

    command()


if __name__ == "__main__":
    run()
