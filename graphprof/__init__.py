"""graphprof: profile PyTorch programs as static graphs.

Public API: ``trace``, ``schedule``, ``register_cost``, ``Profile``, ``load``,
``diff`` (the comparison as data), the views ``table``, ``report``, ``export``,
``diff_text`` and ``memory_summary`` (each also a method of ``Profile``), ``__version__``. Importing this package does not import torch; ``trace`` and
``register_cost`` import it on first use, so saved profiles can be analysed
on machines without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphprof.analysis.diff import diff
    from graphprof.api import diff_text, export, load, memory_summary, report, table
    from graphprof.profile.model import Profile
    from graphprof.runtime.schedule import schedule
    from graphprof.version import __version__

__all__ = ["trace", "schedule", "register_cost", "Profile", "load", "diff", "table", "report", "export",
           "diff_text", "memory_summary", "__version__"]

#: Where each re-exported name lives. Imported on first access (PEP 562), so that
#: ``python -m graphprof report`` (which imports this package first) pays only for the
#: modules its command uses: the diff, the api views and the installed package's metadata
#: behind ``__version__`` were a tenth of a second of every command's start.
_LAZY = {
    "diff": "graphprof.analysis.diff", "Profile": "graphprof.profile.model", "schedule": "graphprof.runtime.schedule",
    "__version__": "graphprof.version",
    **{name: "graphprof.api" for name in ("diff_text", "export", "load", "memory_summary", "report", "table")},
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found here from now on, without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def trace(fn: Any = None, **options: Any) -> Any:
    """Capture ``fn`` (a training or inference step) as a static graph and profile it.

    ``@trace``, ``@trace(profiling=True)`` or ``trace(fn, profiling=False)``.
    Options:

    - ``profiling``: default True.
    - ``capture``: "auto" (whole step, else segments), "fx" or "dynamo".
    - ``cache_size``: captured signatures kept, default 8.
    - ``schedule``: ``graphprof.schedule(...)``.
    - ``on_profile_ready``: called with each completed cycle's Profile.
    - ``max_steps``: steps kept without a schedule.
    - ``peaks``: ``{"flops_per_s": ..., "bytes_per_s": ...}``; default: the
      cached ``graphprof calibrate`` result.
    - ``timing``: "pipelined" (default) or "isolated" (a sync after every op,
      on accelerators).
    - ``sample_rate``: read the accelerator's allocator every N ops; 0 is off.
    """
    from graphprof.tracing import trace as _trace

    return _trace(fn, **options)


def register_cost(op: Any, fn: Any = None) -> Any:
    """Register the cost formula of a custom op (an op overload, an op packet or a callable).

    ``fn(call)`` receives a ``graphprof.passes.cost_formulas.OpCall`` (argument
    values with FakeTensors for tensors, the distinct inputs, the written
    tensors) and returns a ``CostRecord``, an ``int`` of FLOPs (bytes then
    follow the default rule), or ``None``. ``register_cost(op, fn)`` or
    ``@register_cost(op)``; it takes precedence over built-in formulas.
    """
    from graphprof.passes.cost import register_cost as _register_cost

    return _register_cost(op, fn)
