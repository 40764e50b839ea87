"""The trace's per-node fixed texts are the JSON the dict-built trace wrote, whichever way they are made."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import pytest

from graphprof.render.chrome_texts import _counts, _series, series_texts

HOSTILE_KEYS = ["act\u00e9", 'a"b', "a\\b", "a\x01b", "},{", "\x7f", "\u2028", "%d"]


@pytest.mark.parametrize("rows", [
    [{"parameters": 5}, {"activations": 7, "parameters": 5}, {"parameters": 0}],  # categories differ by node
    [{"activations": 2**62, "parameters": -3}] * 4,
    [{k: i} for i, k in enumerate(HOSTILE_KEYS)],  # escaped as encode_basestring_ascii does
    [{"a": 1}, {"a": 2**70}],  # beyond 64 bits
    [{"a": True}, {"a": 1}],  # a bool, as %d and int() write it
    [{"a": 1.5}, {"a": 2}],  # a float, truncated as int() does
    [{"a": 1}, None, {}],  # no memory; memory without categories
    [OrderedDict(a=1), {"a": 2}],  # a mapping that is not a plain dict
    [],
])
def test_series_texts_are_each_nodes_json(rows: list[Any]) -> None:
    live = [100 + i for i in range(len(rows))]
    assert series_texts(rows, live) == [_series(r, v) for r, v in zip(rows, live)]


@pytest.mark.parametrize("values", [[0, -1, 7, 2**63 - 1, -2**63, 2**64 - 1], [2**64, 3], [5], [1, None, 2.5, True], []])
def test_counts_are_what_json_writes(values: list[Any]) -> None:
    assert _counts(values) == [json.dumps(v) for v in values]
