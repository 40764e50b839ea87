"""The memory summary as console text: the peak, where it happens, what is alive then.

Names from the profile (nodes, ops, modules, sources, tensors) are shown as ``terminal_line`` shows them.
"""

from __future__ import annotations

from tabulate import tabulate

from graphprof.analysis.memory import MemorySummary, NodeRef
from graphprof.render.escape import terminal_line
from graphprof.render.units import format_bytes


def _where(node: NodeRef) -> str:
    """Module, source and phase of a node, as ``terminal_line`` shows the names in them."""
    parts = []
    if node.module_type:
        parts.append(f"{node.module or 'root module'} ({node.module_type})")
    elif node.module:
        parts.append(node.module)
    parts.append(node.source or "unknown source")
    parts.append(node.phase)
    return terminal_line(", ".join(parts))


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}" if whole else "-"


def render_memory_summary(summary: MemorySummary, top: int = 10) -> str:
    """Text for ``Profile.memory_summary()``: peak, node/module/source, categories, largest tensors."""
    if not summary.has_model:
        line = f"graph {summary.graph!r} has no memory records (profiles from before the memory pass, or no op nodes)"
        return line + ("\n" + _device_lines(summary) if summary.device else "")
    lines = [f"Memory of graph {summary.graph!r}, modelled from shapes, aliasing and last uses"]
    if summary.peak_node is not None:
        node = summary.peak_node
        lines.append(f"  peak {format_bytes(summary.peak_bytes)} while node {node.id} "
                     f"{terminal_line(f'{node.name} ({node.op})')} runs")
        lines.append(f"       at {_where(node)}")
    else:
        lines.append(f"  peak {format_bytes(summary.peak_bytes)} before the first op")
    lines.append(
        f"  live before the step {format_bytes(summary.start_bytes)}, after it {format_bytes(summary.end_bytes)}; "
        f"allocated in the step {format_bytes(summary.allocated_bytes)}, freed {format_bytes(summary.freed_bytes)}"
    )
    if summary.device is not None:
        lines.append(_device_lines(summary))
    lines.append("")
    lines.append("At the peak, by category:")
    rows = [[terminal_line(c), format_bytes(b), _percent(b, summary.peak_bytes)] for c, b in summary.by_category_bytes]
    lines.append(tabulate(rows, headers=["category", "bytes", "%"], colalign=("left", "right", "right")))
    if summary.largest:
        lines.append("")
        lines.append("Largest tensors alive at the peak:")
        rows = []
        for t in summary.largest[:top]:
            made = (f"{t.made_by.id} {terminal_line(t.made_by.op)}, {_where(t.made_by)}" if t.made_by
                    else "step input or state")
            rows.append([format_bytes(t.nbytes), terminal_line(t.category), terminal_line(t.name), made])
        lines.append(tabulate(rows, headers=["bytes", "category", "tensor", "made by"],
                              colalign=("right", "left", "left", "left")))
    return "\n".join(lines)


def _device_lines(summary: MemorySummary) -> str:
    d = summary.device
    assert d is not None
    return (
        f"  measured on the accelerator ({d.samples} allocator reads over {d.steps} steps): "
        f"allocated up to {format_bytes(d.max_allocated_bytes)}, high-water {format_bytes(d.max_peak_bytes)}, "
        f"reserved up to {format_bytes(d.max_reserved_bytes)}"
    )
