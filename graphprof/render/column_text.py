"""Text of many nodes made a column at a time: per-node text as constants between text columns.

Why: GraphML and node-link JSON of a 100,000-node profile are 90 to 140 MB
of text in which only a few pieces per node change. Formatting each node
with its own template (or dozens of small joins) cost a few microseconds per
node; here every column's text is made in C-level passes (each distinct
value encoded once, escaping checked on a whole column at once, sample
times formatted a whole array at a time) and a chunk of nodes becomes
one list of pieces, filled a column at a time by slice assignment, and one
``str.join``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, Protocol, Union

import numpy as np

from graphprof.profile.model import NS_PER_S
from graphprof.render.json_floats import float_texts

#: Nodes per write: large enough that writes are few, small enough that a chunk's text stays small.
CHUNK_NODES = 8192
#: Tick counts up to this convert to float exactly, so ``ticks / NS_PER_S`` is the same division in numpy.
_EXACT_INT = 2**53


class TextSink(Protocol):
    """Where text goes: a text file, or a sink in front of one."""

    def write(self, text: str, /) -> int: ...


class Coded:
    """Per-node text as a table of distinct texts and each node's index into it (an intp array).

    Why: most of a node's lines take one of a few values (op, dtypes, module
    type, flags, byte counts). ``NodeText.write`` makes neighbouring such
    columns, with the constant text around them, into one piece per node,
    made once per combination that occurs: fewer pieces to place and join.
    """

    __slots__ = ("table", "codes")

    def __init__(self, table: list[str], codes: np.ndarray) -> None:
        self.table, self.codes = table, codes

    def texts(self) -> list[str]:
        """Each node's text."""
        return np.asarray(self.table, dtype=object)[self.codes].tolist()  # type: ignore[no-any-return]


Part = Union[str, Sequence[str], Coded]
#: A laid part: a constant, or one text per node.
Column = Union[str, Sequence[str]]
#: A ``Coded`` column of more distinct texts than this stays a column of its own.
SMALL_TABLE = 4096
#: Neighbouring ``Coded`` columns are combined while the product of their table sizes stays below this.
COMBINED_LIMIT = 1 << 20


class NodeText:
    """Each node's text: constant text and columns of per-node text (``str``s, or ``Coded``), in order."""

    def __init__(self) -> None:
        self.parts: list[Part] = []

    def text(self, constant: str) -> NodeText:
        if constant:
            if self.parts and isinstance(self.parts[-1], str):
                self.parts[-1] += constant
            else:
                self.parts.append(constant)
        return self

    def column(self, values: Sequence[str] | Coded) -> NodeText:
        self.parts.append(values)
        return self

    def between(self, before: str, values: Sequence[str] | Coded, after: str) -> NodeText:
        return self.text(before).column(values).text(after)

    def columns(self, size: int) -> list[Column]:
        """The parts as constants and per-node columns, runs of small ``Coded`` columns combined first.

        A column's strings are shared between the nodes that have the same text (a ``Coded`` table's
        entries): a writer that lays these columns between its own makes no string per node, where
        ``joined`` makes one."""
        return [p.texts() if isinstance(p, Coded) else p for p in combined(self.parts, size)]

    def write(self, f: TextSink, size: int, skip: int = 0) -> None:
        """Write the text of nodes ``0..size-1`` to ``f``, leaving out the first ``skip`` characters."""
        parts = self.columns(size)
        width = len(parts)
        for start in range(0, size, CHUNK_NODES):
            count = min(CHUNK_NODES, size - start)
            pieces: list[str] = [""] * (count * width)
            for j, part in enumerate(parts):
                pieces[j::width] = [part] * count if isinstance(part, str) else part[start:start + count]
            text = "".join(pieces)
            f.write(text[skip:] if skip and start == 0 else text)


def joined(columns: list[Column], size: int) -> list[str]:
    """Each node's text from ``columns`` (``NodeText.columns``), as a string of its own.

    The columns are laid side by side with a NUL after each node, joined once and split once: they
    must hold no NUL, which JSON and XML text never do (both escape or drop it).
    """
    if len(columns) == 1 and not isinstance(columns[0], str):
        return list(columns[0])
    width = len(columns) + 1
    pieces = [""] * (size * width)
    for j, column in enumerate(columns):
        pieces[j::width] = [column] * size if isinstance(column, str) else column
    pieces[width - 1::width] = ["\x00"] * size
    return "".join(pieces).split("\x00")[:-1]


def combined(parts: list[Part], size: int) -> list[Part]:
    """``parts`` with each run of constants and small ``Coded`` columns made into one ``Coded`` column."""
    out: list[Part] = []
    run: list[str | Coded] = []
    span = 1

    def flush() -> None:
        if any(isinstance(p, Coded) for p in run):
            out.append(run[0] if len(run) == 1 else _run_coded(run, size, span))
        elif run:
            out.append("".join(run))  # type: ignore[arg-type]
        run.clear()

    for part in parts:
        if isinstance(part, str):
            run.append(part)
        elif isinstance(part, Coded) and len(part.table) <= SMALL_TABLE:
            n = max(len(part.table), 1)
            if span * n > COMBINED_LIMIT:
                flush()
                span = 1
            run.append(part)
            span *= n
        else:
            flush()
            span = 1
            out.append(part)
    flush()
    return out


def _run_coded(run: list[str | Coded], size: int, span: int) -> Coded:
    """One ``Coded`` column for a run of constants and ``Coded`` columns (the product of whose table
    sizes is ``span``): each combination's text is made once, from one node that has it."""
    key = np.zeros(size, dtype=np.intp)
    for part in run:
        if isinstance(part, Coded):
            key *= max(len(part.table), 1)
            key += part.codes
    first = np.full(span, size, dtype=np.intp)
    first[key] = np.arange(size, dtype=np.intp)  # some node of each combination: all of them have its text
    used = np.flatnonzero(first < size)
    remap = np.zeros(span, dtype=np.intp)
    remap[used] = np.arange(len(used), dtype=np.intp)
    nodes = first[used]
    columns = [[part] * len(used) if isinstance(part, str)
               else np.asarray(part.table, dtype=object)[part.codes[nodes]].tolist() for part in run]
    return Coded(list(map("".join, zip(*columns))), remap[key])


def encoded(values: Sequence[Any], encode: Callable[[Any], str], by_identity: bool = False) -> Coded:
    """``encode(v)`` for each of ``values``, computed once per distinct value.

    ``by_identity``: values are told apart by identity (tuples a loaded profile
    shares between nodes: hashing them would cost more than encoding twice).
    """
    keys: Sequence[Any] = list(map(id, values)) if by_identity else values
    where = {v: i for i, v in enumerate(dict.fromkeys(keys))}
    codes = np.fromiter(map(where.__getitem__, keys), dtype=np.intp, count=len(keys))
    if by_identity:
        first = dict(zip(keys, values))
        return Coded([encode(first[k]) for k in where], codes)
    return Coded(list(map(encode, where)), codes)


def escaped(values: Sequence[Any], escape: Callable[[str], str]) -> list[str] | None:
    """The strings themselves when all are strings and ``escape`` leaves every one unchanged, else None.

    ``escape`` must work character by character (``escape.xml_text``, JSON string
    escaping), so that escaping the whole column at once and finding it
    unchanged proves each string unchanged: a column of plain names costs one
    pass instead of one call per name.
    """
    if set(map(type, values)) - {str}:
        return None
    joined = "".join(values)
    return list(values) if escape(joined) == joined else None


def int_lists(values: Sequence[Sequence[Any]]) -> list[str] | None:
    """Each tuple of ints as the text between its JSON brackets (``"1, 2"``), or None unless every item is an int.

    One ``repr`` of the whole column, split where one list ends and the next begins.
    """
    if not values or set(map(type, chain.from_iterable(values))) - {int}:
        return None
    text = repr(list(map(list, values)))
    return text[2:-2].split("], [")


def seconds_columns(ticks_ns: np.ndarray) -> list[list[str]] | None:
    """Per step, each node's sample (``ticks_ns``: steps x nodes) as ``repr`` of its seconds, or None
    when a sample is too large to convert exactly."""
    if ticks_ns.size and int(np.abs(ticks_ns).max()) >= _EXACT_INT:
        return None
    return [float_texts(row / NS_PER_S) for row in ticks_ns]
