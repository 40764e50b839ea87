"""Text tables: tabulate's ``simple`` layout made here, every other format by tabulate.

Why: importing tabulate costs every ``analyze``, ``report`` and ``diff`` about
40 ms (it reads its own version from the installed package metadata, which
imports ``importlib.metadata``, ``email``, ``zipfile`` and ``csv``), a tenth of
what the command itself needs on a 100,000-node profile. The default format,
``simple``, is a few lines of padding: left-aligned text columns two spaces
apart, a rule of dashes under the headers (or above and below a table
without headers), trailing spaces cut from every line.

The tables passed here are all text (the callers pass ``disable_numparse``,
so tabulate aligns nothing as a number either). A table is laid out here only
where the result is certainly tabulate's: every cell and header a printable
``str`` on one line (no line break, tab or escape sequence, which tabulate
measures and splits its own way), rows as long as the headers, and no
``wcwidth`` installed (with it, tabulate counts East Asian characters as
two columns). Anything else goes to tabulate itself; the tests compare the
two on random tables.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

SIMPLE = "simple"


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
    lines = []
    if headers:
        lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
        lines.append(rule)
    else:
        lines.append(rule)
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
