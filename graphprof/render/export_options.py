"""What an export may be asked for, and the error it raises.

Below ``exporters`` (which picks the format and writes the file) and the
format modules it calls (``dot``, ``html`` ...), which read these options
and raise this error, so that none of them imports ``exporters`` back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence


#: Roofline bound per node, keyed by ``(graph_id, node_id)`` or by node id: a string, or an enum whose
#: ``value`` is shown (``labels.bound_of`` reads it; the analysis gives strings, a caller may give ``Bound``s).
Bounds = Mapping[Any, Any]


class ExportError(ValueError):
    """An export the user asked for cannot be done; the message is one sentence."""


def cannot_write(path: str, exc: OSError) -> ExportError:
    """The one sentence for a file the system would not let an export write."""
    return ExportError(f"cannot write {path}: {exc.strerror or exc}")


@dataclass(frozen=True)
class ExportOptions:
    """What every exporter may honour (each ignores what does not apply to it).

    ``module_level``: True collapses graph views to one node per module and
    phase, False never does, None (default) does so above ``max_nodes``.
    ``hide_views``: leave views, tuple projections and constant factories out
    of graph views. ``bounds``: roofline bound per node, keyed by
    ``(graph_id, node_id)`` or by node id; None computes them from the peaks in
    the profile's meta (none without peaks). ``findings``: advisor findings
    (objects with ``severity``, ``title``, ``time_s``, ``hint``, ``sources``)
    for the HTML report; None runs the advisor. ``graph_id``: the graph the memory timeline shows.
    ``max_bytes``: refuse a file larger than this (``render.size_guard``): None for the default
    limit (50 times the profile's size, at least 256 MiB), 0 for none.
    """

    stat: str = "median"
    module_level: bool | None = None
    hide_views: bool = False
    max_nodes: int = 600
    graph_id: int = 0
    bounds: Bounds | None = None
    findings: Sequence[Any] | None = None
    max_bytes: int | None = None
