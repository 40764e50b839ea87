"""Python's ``repr`` of every float of an array at once: the text ``json.dumps`` writes for each.

Why: a Chrome trace of 100,000 nodes over 5 steps holds two million
per-step numbers (start, duration, FLOP/s, bytes/s); ``repr`` one float at a
time was a third of the export. orjson formats a float64 array in C with the
same shortest round-trip digits as ``repr`` and the same notation, except
below 1e-4, where it writes ``0.00001`` and ``1e-7`` for ``repr``'s
``1e-05`` and ``1e-07``: those few (and NaN and infinities, which JSON has
no number for) are taken from ``repr`` itself, once per distinct value;
an array of mostly such values (sample times in seconds) skips orjson.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import orjson

#: Below this magnitude (0 excepted) orjson's notation differs from ``repr``'s.
_FIXED_FROM = 1e-4


def float_texts(values: np.ndarray) -> list[str]:
    """``[repr(float(v)) for v in values]`` for a 1-d float64 array."""
    if not len(values):
        return []
    values = np.ascontiguousarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        odd = ~(np.isfinite(values) & ((np.abs(values) >= _FIXED_FROM) | (values == 0)))
    mended = np.count_nonzero(odd)
    if 2 * mended > len(values):  # mostly small (times in seconds): orjson's text would be redone
        return _distinct_reprs(values)
    texts = number_texts(values)
    if mended:  # (usually none: no search for them)
        where = np.flatnonzero(odd)
        for i, text in zip(where.tolist(), _distinct_reprs(values[where])):
            texts[i] = text
    return texts


def number_texts(values: Sequence[Any] | np.ndarray) -> list[str]:
    """The text orjson writes for each number of a list or a 1-d array, from one dump of them all: an
    int's is ``str``'s, a float's ``repr``'s except where ``float_texts`` mends it. orjson.JSONEncodeError
    for an int beyond 64 bits.

    orjson reads an array only when it is C-contiguous (a column of a matrix is not): such an array
    is copied first.
    """
    if not len(values):
        return []
    if isinstance(values, np.ndarray):
        values = np.ascontiguousarray(values)
    texts = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).decode("ascii").split(",")
    texts[0] = texts[0][1:]  # "[" and "]", without a copy of the whole text
    texts[-1] = texts[-1][:-1]
    return texts


def _distinct_reprs(values: np.ndarray) -> list[str]:
    """``repr`` of each float, made once per distinct bit pattern (so ``-0.0`` keeps its sign)."""
    distinct, where = np.unique(values.view(np.int64), return_inverse=True)
    reprs = np.array(list(map(repr, distinct.view(np.float64).tolist())) or [""], dtype=object)
    return reprs[where.reshape(-1)].tolist()  # type: ignore[no-any-return]
