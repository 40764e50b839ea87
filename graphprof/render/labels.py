"""Small text helpers shared by the export renderers (trace, graph, HTML).

Kept here rather than in ``units`` so the exporters do not depend on the
console table's column formatting, which evolves with its own needs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def shapes_text(shapes: Sequence[Sequence[int] | None], limit: int = 3) -> str:
    """``[16, 3, 32, 32], [16]`` with at most ``limit`` shapes, then ``+N``; ``-`` for a non-tensor."""
    parts = ["-" if s is None else "[" + ", ".join(map(str, s)) + "]" for s in shapes[:limit]]
    if len(shapes) > limit:
        parts.append(f"+{len(shapes) - limit}")
    return ", ".join(parts)


def bound_of(bounds: Mapping[Any, Any] | None, graph_id: int, node_id: int) -> str | None:
    """A node's roofline bound from a mapping keyed by ``(graph id, node id)`` or by node id.

    Values may be strings or enums (their ``value`` is shown).
    """
    if not bounds:
        return None
    value = bounds.get((graph_id, node_id))
    if value is None:
        value = bounds.get(node_id)
    if value is None:
        return None
    return str(getattr(value, "value", value))
