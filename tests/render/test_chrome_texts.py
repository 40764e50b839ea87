"""The trace's per-node fixed texts are the JSON the dict-built trace wrote, whichever way they are made."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import pytest

from graphprof.analysis.frame import node_frame
from graphprof.profile import GraphKind, GraphRecord, MemoryRecord, NodeRecord, Profile, StepRecord
from graphprof.profile.model import node_source, profile_from_document
from graphprof.render.chrome_texts import _coded_counts, _counts, _mapping_texts, _series, loaded_series_texts, series_texts
from graphprof.render.chrome_trace import chrome_trace

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


@pytest.mark.parametrize("values", [[0, -1, 7, 2**63 - 1, -2**63, 2**64 - 1, 7, 0], [2**70, 3, 2**70], [5] * 9,
                                    [2**63 - 1, -2**63, 0, -1, 2**63 - 1, 10**18, -2**63],
                                    [1, True, 1.0, None, 1], [], list(range(5000)) + [1, 2]])
def test_coded_counts_are_the_counts(values: list[Any]) -> None:
    """As a table of distinct texts or as a column, each node's count is the text ``_counts`` writes (a
    ``True`` or ``1.0`` beside a ``1`` keeps its own text)."""
    coded = _coded_counts(values)
    assert (coded if isinstance(coded, list) else coded.texts()) == _counts(values)


def _loaded(memory: list[MemoryRecord | None], edit: Callable[[dict[str, Any]], None] | None = None) -> Profile:
    """One graph of nodes with these memory records, saved and loaded (``edit``: changes the saved memory column)."""
    nodes = tuple(NodeRecord(id=i, name=f"n{i}", op="aten.add.Tensor", type="add", memory=m,
                             host_time_ns=(1000,)) for i, m in enumerate(memory))
    document = json.loads(json.dumps(Profile(steps=(StepRecord(0, 1.0),),
                                             graphs=(GraphRecord(0, "step", GraphKind.STEP, nodes),)).to_dict()))
    if edit is not None:
        edit(document["graphs"][0]["columns"]["memory"])
    return profile_from_document(document)


def _by_the_mappings(profile: Profile) -> list[str | None]:
    frame = node_frame(profile)
    return series_texts(frame.column("live_by_category_bytes"), frame.column("live_bytes"))


def _mem(live: int, categories: dict[str, int]) -> MemoryRecord:
    return MemoryRecord(live_bytes=live, live_by_category_bytes=categories)


def _null_row(column: dict[str, Any]) -> None:
    column["live_by_category_bytes"]["values"][0] = None  # a record whose mapping the file leaves out


@pytest.mark.parametrize("memory, edit", [
    ([_mem(5, {"parameters": 5}), _mem(12, {"activations": 7, "parameters": 5}), _mem(9, {"parameters": 0}),
      None, _mem(4, {}), _mem(3, {"activations": 3})], None),  # categories differ by node; zeros; no record
    ([_mem(i, {k: i + 1, "b": -i}) for i, k in enumerate(HOSTILE_KEYS)], None),  # escaped as json.dumps does
    ([_mem(0, {"a": 2**63 - 1, "b": -2**63}), _mem(1, {"b": 1})], None),  # int64's ends
    ([_mem(1, {"a": 1}), _mem(2, {"a": 2})], _null_row),
    ([_mem(1, {}), _mem(2, {})], None),  # records without categories
])
def test_loaded_series_texts_are_the_mappings_texts(memory: list[MemoryRecord | None], edit: Any) -> None:
    loaded = _loaded(memory, edit)
    texts = loaded_series_texts(node_source(loaded.graphs[0]))
    assert texts == _by_the_mappings(loaded)
    wrapped = loaded_series_texts(node_source(loaded.graphs[0]), ',"args":', "}")  # the counter event's text around them
    assert wrapped == [None if t is None else f',"args":{t}}}' for t in texts]


def test_a_graph_without_a_memory_column_has_no_counter_args() -> None:
    loaded = _loaded([None, None])  # the file then has no memory column
    assert node_source(loaded.graphs[0]).memory is None
    assert loaded_series_texts(node_source(loaded.graphs[0])) == _by_the_mappings(loaded) == [None, None]


def _repeat_key(column: dict[str, Any]) -> None:
    column["live_by_category_bytes"]["keys"] = ["a", "a"]


@pytest.mark.parametrize("memory, edit", [
    ([_mem(1, {"a": 1, "b": 2}), _mem(2, {"a": 0, "b": 3})], _repeat_key),  # the mapping keeps the later value
    ([_mem(1, {f"c{i}": i + 1 for i in range(70)})], None),  # more categories than an int64 has bits
])
def test_layouts_the_columns_do_not_code_are_left_to_the_mappings(memory: list[MemoryRecord | None], edit: Any) -> None:
    loaded = _loaded(memory, edit)
    assert loaded_series_texts(node_source(loaded.graphs[0])) is None
    trace = chrome_trace(loaded)
    counters = [e["args"] for e in trace["traceEvents"] if e["ph"] == "C"]
    assert counters == [json.loads(t) for t in _by_the_mappings(loaded) if t is not None]


@pytest.mark.parametrize("order", ["C", "F"])
def test_mapping_texts_read_a_matrix_in_either_layout(order: str) -> None:
    """Each category's numbers are one column of the matrix; a C-ordered matrix's column is not contiguous."""
    values = np.array([[1, 2, 3], [4, -5, 2**62]], dtype=np.int64, order=order)
    keys = ["a", "b", "c\u00e9"]
    assert _mapping_texts(keys, values) == [json.dumps(dict(zip(keys, row)), separators=(",", ":")) for row in values.tolist()]
