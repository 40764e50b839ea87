"""Graph modules whose fx code is written when something asks for it, not at every change.

Why: fx writes a graph's Python ``forward`` when a graph module is made and
at every ``recompile``. A capture made five of them (make_fx's module, the
capture's own recompile, the instrumented step, the workspace
measurement's copy and its recompile), each a fifth of a second for a
graph of a few thousand nodes, and none of them ran: graphprof runs its
graphs through its own code (runtime/codegen.py). torch's lazy graph module
writes the code the first time it is read or the module is called, so
anything that does (printing the module, fx's own fallback) still gets it.
It is torch's private class; a torch without it gets plain graph modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx

try:
    from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module
except ImportError:  # another torch: plain graph modules
    _LazyGraphModule = torch.fx.GraphModule  # type: ignore[misc, assignment]
    _use_lazy_graph_module = None  # type: ignore[assignment]


def graph_module(root: Any, graph: torch.fx.Graph, class_name: str = "GraphModule") -> torch.fx.GraphModule:
    """``torch.fx.GraphModule(root, graph, class_name)``, its code written when first asked for."""
    return _LazyGraphModule(root, graph, class_name=class_name)


@contextmanager
def code_when_asked() -> Iterator[None]:
    """For the ``with`` block, the graph modules torch makes (make_fx's) write their code when asked."""
    if _use_lazy_graph_module is None:
        yield
        return
    with _use_lazy_graph_module(True):
        yield
