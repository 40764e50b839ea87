"""The ``simple`` tables ``render.fit`` makes without tabulate are tabulate's, byte for byte, and the rest still go to it."""

from __future__ import annotations

import random

import pytest
from tabulate import tabulate

from graphprof.render.fit import simple_table, text_table

#: Cell material: plain words, spaces at either end, clip marks, digits, words tabulate treats
#: specially when parsing (True/False), and empty cells.
_PIECES = ["a", "conv", " x", "y ", "  ", "…", "1.5", "-3", "True", "False", "", "layer3.0…conv2", "µs", "é"]


def _cell(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 4)))


def _reference(rows: list[list[str]], headers: list[str], fmt: str = "simple") -> str:
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


@pytest.mark.parametrize("seed", range(300))
def test_simple_tables_are_tabulates(seed: int) -> None:
    rng = random.Random(seed)
    ncols, nrows = rng.randint(1, 6), rng.randint(1, 8)
    rows = [[_cell(rng) for _ in range(ncols)] for _ in range(nrows)]
    headers = [_cell(rng) for _ in range(ncols)] if rng.random() < 0.7 else []
    assert simple_table(rows, headers) is not None
    assert text_table(rows, headers) == _reference(rows, headers)


def test_tuples_and_empty_columns() -> None:
    rows = [("total time", ""), ("FLOPs", "")]
    assert text_table(rows) == _reference([list(r) for r in rows], [])
    assert text_table(rows, ["", ""]) == _reference([list(r) for r in rows], ["", ""])


@pytest.mark.parametrize("rows, headers", [
    ([["two\nlines", "b"]], ["h1", "h2"]),  # a multi-line cell: tabulate's own layout
    ([["tab\there", "b"]], []),
    ([["\x1b[31mred\x1b[0m", "b"]], ["h1", "h2"]),  # an escape sequence tabulate measures invisibly
    ([["a", "b"], ["c"]], ["h1", "h2"]),  # a short row
    ([["a", "b"]], ["only"]),  # fewer headers than columns
    ([], ["h1", "h2"]),
    ([["a", 1]], ["h1", "h2"]),  # not text
])
def test_what_only_tabulate_lays_out_goes_to_it(rows: list, headers: list[str]) -> None:
    assert simple_table(rows, headers) is None
    assert text_table(rows, headers) == _reference(rows, headers)


@pytest.mark.parametrize("fmt", ["github", "grid", "plain"])
def test_other_formats_are_tabulates(fmt: str) -> None:
    rows = [["conv", "1.5 ms"], ["relu", ""]]
    assert text_table(rows, ["op", "time"], fmt) == _reference(rows, ["op", "time"], fmt)
