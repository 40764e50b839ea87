"""Fitting text tables and prose to a terminal's width: one rule for ``analyze`` and ``report``.

A table that wraps in a terminal is unreadable, and one cut by the terminal
loses its right-hand columns silently. So a table drops its least important
columns first, then clips its text columns (in the middle: both ends of a
module path or ``file:line`` say which one it is), and only then drops the
columns that name a row. Prose lines wrap at the width instead.
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from graphprof.render.units import clip_middle


def terminal_width() -> int:
    """Columns to fit: ``COLUMNS`` when set, else the terminal's, else 120 (a pipe, a file, CI).

    120 when the output is not a terminal keeps saved and piped tables
    readable in an editor and a code review without wrapping, where the
    old full table was about 260 characters wide.
    """
    return shutil.get_terminal_size(fallback=(120, 24)).columns


def resolve_width(width: int | None, wide: bool) -> int | None:
    """The width to fit (None: no fitting, for ``--wide``): ``width``, else the terminal's.

    A width below the narrowest useful table is one sentence (ValueError), as ``analyze --width`` says it.
    """
    from graphprof.analysis.options import MIN_WIDTH

    if wide:
        return None
    if width is None:
        return terminal_width()
    if isinstance(width, bool) or not isinstance(width, int) or width < MIN_WIDTH:
        raise ValueError(f"--width must be a whole number >= {MIN_WIDTH}, not {width!r}")
    return width


@lru_cache(maxsize=None)
def _probe(fmt: str, n: int, cell: int, header: int) -> int:
    from graphprof.render.text_table import text_table

    text = text_table([["x" * cell] * n], ["y" * header] * n, fmt)
    return max(len(line) for line in text.splitlines())


def format_overhead(fmt: str, n: int) -> int:
    """Characters a ``fmt`` table of ``n`` columns adds to its cells (separators, borders, padding)."""
    return _probe(fmt, n, 8, 1) - 8 * n


def header_padding(fmt: str) -> int:
    """What ``fmt`` adds to a header's length for its column's width (tabulate pads some formats' headers)."""
    return max(_probe(fmt, 1, 1, 8) - format_overhead(fmt, 1) - 8, 0)


@dataclass(frozen=True)
class FitColumn:
    """What fitting needs to know of a column: its widths and how much it matters.

    ``least`` equal to ``natural`` means the column is never clipped;
    ``priority``: lower numbers stay longer; ``keep``: never dropped.
    """

    key: str
    natural: int
    least: int
    priority: int
    keep: bool = False


def fit_widths(columns: Sequence[FitColumn], fmt: str, width: int, core: int) -> dict[str, int]:
    """The columns that fit ``width`` (in their order) and each one's width.

    Columns with a priority above ``core`` are dropped before any text is
    clipped; columns up to ``core`` are clipped to their least width before
    they are dropped too. Kept columns are never dropped, so a very narrow
    width can still be exceeded.
    """
    shown = list(columns)

    def needed(widths: dict[str, int]) -> int:
        return sum(widths[c.key] for c in shown) + format_overhead(fmt, len(shown))

    def drop_until_fits(widths: dict[str, int], most_important: int) -> None:
        while needed(widths) > width:
            droppable = [c for c in shown if not c.keep and c.priority > most_important]
            if not droppable:
                return
            shown.remove(max(droppable, key=lambda c: (c.priority, shown.index(c))))

    drop_until_fits({c.key: c.natural for c in columns}, core)
    drop_until_fits({c.key: c.least for c in columns}, -1)
    widths = {c.key: c.natural for c in shown}
    excess = needed(widths) - width
    while excess > 0:
        candidates = [c for c in shown if widths[c.key] > c.least]
        if not candidates:
            break
        widest = max(candidates, key=lambda c: widths[c.key] - c.least)
        widths[widest.key] -= 1
        excess -= 1
    return widths


@dataclass(frozen=True)
class TextColumn:
    """A column of a table of ready strings: its header, least width (None: never clipped) and priority."""

    header: str
    priority: int = 0
    least: int | None = None
    keep: bool = False


def fitted_table(columns: Sequence[TextColumn], rows: Sequence[Sequence[str]], width: int | None,
                 fmt: str = "simple", core: int = 4) -> str:
    """``rows`` under ``columns`` as a tabulate table, fitted to ``width`` (None: as they are).

    ``core``: as in ``fit_widths``, the priority up to which a column is clipped before it is dropped.
    """
    from graphprof.render.text_table import text_table

    keys = [str(i) for i in range(len(columns))]
    if width is None:
        shown = dict.fromkeys(keys, 0)
        clipped = set()
    else:
        pad = header_padding(fmt)
        fit = []
        for key, col, cells in zip(keys, columns, zip(*rows) if rows else [()] * len(columns)):
            natural = max([len(col.header) + pad, *(len(c) for c in cells)])
            least = natural if col.least is None else max(len(col.header) + pad, min(natural, col.least))
            fit.append(FitColumn(key, natural, least, col.priority, col.keep))
        shown = fit_widths(fit, fmt, width, core)
        clipped = {k for k, c in zip(keys, columns) if c.least is not None}
    picked = [i for i, k in enumerate(keys) if k in shown]
    body = [[clip_middle(row[i], shown[keys[i]]) if keys[i] in clipped else row[i] for i in picked] for row in rows]
    return text_table(body, [columns[i].header for i in picked], fmt)


def wrap_lines(lines: Sequence[str], width: int | None) -> list[str]:
    """Each line wrapped at ``width``; a continuation is indented 2 more than its line."""
    if width is None:
        return list(lines)
    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out.extend(textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent + "  ",
                                 break_on_hyphens=False, drop_whitespace=True) or [line])
    return out
