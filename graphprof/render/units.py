"""Human units, used only by renderers (the data stays in seconds, FLOPs and bytes).

Three significant digits everywhere, like profile_analyze's ``{:.3}``; an
unknown or non-finite value is "N/A" (never "inf", never a crash).
"""

from __future__ import annotations

import math


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


_TIME_UNITS = (("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0))


def format_time(seconds: float | None) -> str:
    """``1.23 ms``-style time, from ns to s."""
    if not _known(seconds):
        return "N/A"
    value = float(seconds)  # type: ignore[arg-type]
    i = 0
    while i < len(_TIME_UNITS) - 1 and abs(value) >= _TIME_UNITS[i + 1][1]:
        i += 1
    if i < len(_TIME_UNITS) - 1 and abs(float(f"{value / _TIME_UNITS[i][1]:.3g}")) >= 1000:
        i += 1  # 999.96 us prints as 1 ms, not 1e+03 us
    unit, scale = _TIME_UNITS[i]
    return f"{value / scale:.3g} {unit}"


def _scaled(value: float, base: float, units: tuple[str, ...]) -> tuple[float, str]:
    i = 0
    while abs(value) >= base and i < len(units) - 1:
        value /= base
        i += 1
    if i < len(units) - 1 and abs(float(f"{value:.3g}")) >= base:  # 999.9 rounds up to the next unit
        value /= base
        i += 1
    return value, units[i]


def format_count(value: float | None, unit: str) -> str:
    """Decimal prefixes, FLOP to PFLOP: ``format_count(2.5e9, "FLOP")`` is ``2.5 GFLOP``."""
    if not _known(value):
        return "N/A"
    scaled, prefix = _scaled(float(value), 1000.0, ("", "K", "M", "G", "T", "P", "E"))  # type: ignore[arg-type]
    return f"{scaled:.3g} {prefix}{unit}"


def format_bytes(value: float | None, suffix: str = "B") -> str:
    """Binary prefixes, B to GiB and beyond: ``format_bytes(3 * 2**20)`` is ``3 MiB``."""
    if not _known(value):
        return "N/A"
    scaled, prefix = _scaled(float(value), 1024.0, ("", "Ki", "Mi", "Gi", "Ti", "Pi"))  # type: ignore[arg-type]
    # Between 1000 and 1023 of a unit, three significant digits would print 1.02e+03.
    text = f"{scaled:.0f}" if abs(scaled) >= 1000 else f"{scaled:.3g}"
    return f"{text} {prefix}{suffix}"


def format_number(value: float | None) -> str:
    """A plain number with three significant digits (arithmetic intensity, FLOP/B)."""
    if not _known(value):
        return "N/A"
    return f"{value:.3g}"


def format_percent(value: float | None) -> str:
    """``12.3`` (the header says %)."""
    if not _known(value):
        return "N/A"
    return f"{value:.1f}"


def clip(text: str | None, width: int, keep_end: bool = True, empty: str = "") -> str:
    """Cut ``text`` to ``width``, marking the cut with …; paths keep their end
    (file and line, leaf module). A missing or empty text prints as ``empty``."""
    if not text:
        return empty
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1):] if keep_end else text[: width - 1] + "…"


def clip_middle(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` in the middle (``layer3.0…conv2``): both ends of a name or path
    tell which one it is, as in torch.profiler's name column."""
    if len(text) <= width:
        return text
    if width < 3:
        return text[:width]
    head = (width - 1 + 1) // 2
    tail = width - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def plural(n: int, noun: str) -> str:
    """``1 node``, ``2 nodes``: a count with its noun."""
    return f"{n} {noun}" + ("s" if n != 1 else "")


def share_of(part: float, whole: float, digits: int = 1) -> str:
    """``part`` as a percentage of ``whole`` (``"12.3%"``), or ``-`` when the whole is 0."""
    return f"{100 * part / whole:.{digits}f}%" if whole > 0 else "-"


def format_shape(shape: tuple[int, ...] | None) -> str:
    """``[16, 3, 32, 32]``; ``[]`` for a scalar; ``-`` for a non-tensor value."""
    return "-" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def format_shapes(
    shapes: tuple[tuple[int, ...] | None, ...] | None, limit: int | None = 3, width: int | None = None,
) -> str:
    """``[16, 3, 32, 32], [16]``; ``*`` when a group's shapes differ.

    At most ``limit`` shapes (None: all) and, with ``width``, only those that
    fit; the rest are counted (``[16, 3, 32, 32], +2``): the first inputs are
    the ones a reader recognises (activation, weight).
    """
    if shapes is None:
        return "*"
    parts = [format_shape(s) for s in shapes]
    keep = len(parts) if limit is None else min(limit, len(parts))

    def text(k: int) -> str:
        return ", ".join(parts[:k] + ([f"+{len(parts) - k}"] if k < len(parts) else []))

    while keep > 1 and width is not None and len(text(keep)) > width:
        keep -= 1
    out = text(keep)
    if width is not None and len(out) > width:  # one shape alone is too wide
        out = parts[0][: max(width - 1, 1)] + "…" + (f", +{len(parts) - 1}" if len(parts) > 1 else "")
    return out


def format_value(value: float | None, unit: str) -> str:
    """Format a column value by its unit key (as in ``graphprof.analysis.columns``)."""
    if unit == "s":
        return format_time(value)
    if unit == "%":
        return format_percent(value)
    if unit in ("B", "B/s"):
        return format_bytes(value, unit)
    if unit in ("FLOP", "FLOP/s"):
        return format_count(value, unit)
    if unit in ("count", "id"):
        return "N/A" if value is None else str(value)
    return format_number(value)
