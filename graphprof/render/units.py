"""Human units, used only by renderers (the data stays in seconds and bytes)."""

from __future__ import annotations

import math


def format_time(seconds: float | None) -> str:
    """``1.23 ms``-style time, from ns to s."""
    if seconds is None or not math.isfinite(seconds):
        return "N/A"
    magnitude = abs(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if magnitude >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _scaled(value: float, base: float, units: tuple[str, ...]) -> tuple[float, str]:
    i = 0
    while abs(value) >= base and i < len(units) - 1:
        value /= base
        i += 1
    return value, units[i]


def format_count(value: float | None, unit: str) -> str:
    """Decimal prefixes: ``format_count(2.5e9, "FLOP")`` is ``2.50 GFLOP``."""
    if value is None or not math.isfinite(value):
        return "N/A"
    scaled, prefix = _scaled(float(value), 1000.0, ("", "K", "M", "G", "T", "P", "E"))
    return f"{scaled:.3g} {prefix}{unit}"


def format_bytes(value: float | None, suffix: str = "B") -> str:
    """Binary prefixes: ``format_bytes(3 * 2**20)`` is ``3.00 MiB``."""
    if value is None or not math.isfinite(value):
        return "N/A"
    scaled, prefix = _scaled(float(value), 1024.0, ("", "Ki", "Mi", "Gi", "Ti", "Pi"))
    return f"{scaled:.3g} {prefix}{suffix}"


def format_shapes(shapes: tuple[tuple[int, ...] | None, ...], limit: int = 3) -> str:
    """``[16, 3, 32, 32], [16]`` with at most ``limit`` shapes shown."""
    parts = ["[" + ", ".join(map(str, s)) + "]" if s is not None else "-" for s in shapes[:limit]]
    if len(shapes) > limit:
        parts.append(f"+{len(shapes) - limit}")
    return ", ".join(parts)
