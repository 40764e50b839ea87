"""graphprof: profile PyTorch programs as static graphs.

Public API: ``trace``, ``Profile``, ``load``, ``__version__``. Importing this
package does not import torch; ``trace`` imports it on first use, so saved
profiles can be analysed on machines without torch.
"""

from __future__ import annotations

from typing import Any

from graphprof.api import Profile, load
from graphprof.runtime.schedule import schedule

__version__ = "0.1.0"
__all__ = ["trace", "schedule", "Profile", "load", "__version__"]


def trace(fn: Any = None, **options: Any) -> Any:
    """Capture ``fn`` (a training or inference step) as a static graph and profile it.

    ``@trace``, ``@trace(profiling=True)`` or ``trace(fn, profiling=False)``.
    Options: ``profiling`` (default True), ``capture`` ("auto" or "fx"),
    ``cache_size`` (captured signatures kept, default 8), ``schedule``
    (``graphprof.schedule(...)``), ``on_profile_ready`` (called with each
    completed cycle's Profile), ``max_steps`` (steps kept without a schedule).
    """
    from graphprof.tracing import trace as _trace

    return _trace(fn, **options)
