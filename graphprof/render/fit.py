"""Fitting text tables and prose to a terminal's width: one rule for ``analyze`` and ``report``.

A table that wraps in a terminal is unreadable, and one cut by the terminal
loses its right-hand columns silently. So a table drops its least important
columns first, then clips its text columns (in the middle: both ends of a
module path or ``file:line`` say which one it is), and only then drops the
columns that name a row. Prose lines wrap at the width instead.

Tables are laid out by tabulate, except its default ``simple`` layout, which
is made here (``text_table``). Why: importing tabulate costs every
``analyze``, ``report`` and ``diff`` about 40 ms (it reads its own version
from the installed package metadata, importing ``importlib.metadata``,
``email``, ``zipfile`` and ``csv``), a tenth of what the command itself
needs on a 100,000-node profile. ``simple`` is a few lines of padding:
left-aligned text columns two spaces apart, a rule of dashes under the
headers (or above and below a table without headers), trailing spaces cut
from every line. The tables are all text (callers pass ``disable_numparse``,
so tabulate aligns nothing as a number either). A table is laid out here
only where the result is certainly tabulate's: every cell and header a
printable ``str`` on one line (no line break, tab or escape sequence, which
tabulate measures and splits its own way), rows as long as the headers, and
no ``wcwidth`` installed (with it, tabulate counts East Asian characters as
two columns). Anything else goes to tabulate; the tests compare the two on
random tables.
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from graphprof.render.escape import terminal_line
from graphprof.render.units import clip_middle

#: tabulate's default table format, the one ``text_table`` lays out itself.
SIMPLE = "simple"


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

    Cells are ``terminal_line``'d first (they hold op, module and source names from the profile: a
    newline or escape sequence in one shows as ``\\n``, ``\\x1b``), so they are measured as printed.
    ``core``: as in ``fit_widths``, the priority up to which a column is clipped before it is dropped.
    """
    rows = [list(map(terminal_line, row)) for row in rows]
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
    """Each line ``terminal_line``'d (a name in it cannot break it or send an escape sequence), then
    wrapped at ``width``; a continuation is indented 2 more than its line."""
    lines = list(map(terminal_line, lines))
    if width is None:
        return lines
    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out.extend(textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent + "  ",
                                 break_on_hyphens=False, drop_whitespace=True) or [line])
    return out


# -- laying out ---------------------------------------------------------------
def text_table(rows: Sequence[Sequence[str]], headers: Sequence[str] = (), fmt: str = SIMPLE) -> str:
    """``tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)``, without tabulate where it can."""
    text = simple_table(rows, headers) if fmt == SIMPLE else None
    if text is not None:
        return text
    from tabulate import tabulate

    return tabulate(rows, headers=list(headers), tablefmt=fmt, disable_numparse=True)


def simple_table(rows: Sequence[Sequence[str]], headers: Sequence[str] = ()) -> str | None:
    """The ``simple`` table of ``rows`` as tabulate lays it out, or None where that is not certain here."""
    if not rows or _wide_characters():
        return None
    ncols = len(headers) if headers else len(rows[0])
    if not ncols:
        return None
    for row in rows:
        if len(row) != ncols or not _plain(row):
            return None
    if headers and not _plain(headers):
        return None
    columns = [[cell.strip() for cell in column] for column in zip(*rows)]
    if headers:
        # tabulate keeps two characters beside every header: a column is at least its header + 2 wide
        widths = [max(len(h) + 2, max(map(len, col))) for h, col in zip(headers, columns)]
    else:
        widths = [max(map(len, col)) for col in columns]
    rule = "  ".join("-" * w for w in widths).rstrip()
    lines = [rule] if not headers else ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), rule]
    padded = [[cell.ljust(w) for cell in col] for col, w in zip(columns, widths)]
    lines.extend("  ".join(cells).rstrip() for cells in zip(*padded))
    if not headers:
        lines.append(rule)
    return "\n".join(lines)


def _plain(cells: Sequence[str]) -> bool:
    """Whether every cell is a one-line printable string (no break, tab, escape or other control character)."""
    return all(type(c) is str and c.isprintable() for c in cells)


@lru_cache(maxsize=None)
def _wide_characters() -> bool:
    """Whether tabulate would measure cells with ``wcwidth`` (installed) instead of ``len``."""
    from importlib.util import find_spec

    return find_spec("wcwidth") is not None
