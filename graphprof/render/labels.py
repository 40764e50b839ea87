"""Small text helpers shared by the export renderers (trace, graph, HTML).

Kept here rather than in ``units`` so the exporters do not depend on the
console table's column formatting, which evolves with its own needs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


#: A shape of more dimensions is shown by its first and last dimensions and its rank: text that
#: grows with the rank would let one odd shape fill a trace (it is repeated per step).
SHAPE_DIMS_SHOWN = 16


def _shape_text(shape: Sequence[int] | None) -> str:
    if shape is None:
        return "-"
    if len(shape) <= SHAPE_DIMS_SHOWN:
        return "[" + ", ".join(map(str, shape)) + "]"
    half = SHAPE_DIMS_SHOWN // 2
    return (f"[{', '.join(map(str, shape[:half]))}, …, {', '.join(map(str, shape[-half:]))}] "
            f"({len(shape)} dims)")


def shapes_text(shapes: Sequence[Sequence[int] | None], limit: int = 3) -> str:
    """``[16, 3, 32, 32], [16]`` with at most ``limit`` shapes, then ``+N``; ``-`` for a non-tensor."""
    parts = [_shape_text(s) for s in shapes[:limit]]
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
