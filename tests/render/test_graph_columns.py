"""A loaded profile's GraphML and node-link text, read from its stored rows and edge arrays, equals the
text of the profile it was saved from (read from records)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from graphprof.analysis.frame import node_frame
from graphprof.api import Profile
from graphprof.profile.model import MemoryRecord
from graphprof.render.graph_columns import category_column, category_items, indexed_texts, input_texts
from graphprof.render.graphml import graphml_text, node_link_json
from tests.render.export_profiles import hostile_profile, make_profile, node


def _memory(live: int, **categories: int) -> MemoryRecord:
    return MemoryRecord(allocated_bytes=8, freed_bytes=0, live_bytes=live, live_by_category_bytes=categories)


def _profile(chain: bool) -> Profile:
    """Nodes with and without a memory record, with no, one and (unless ``chain``) two inputs; mappings
    that repeat, are empty, or hold a category another node lacks (keys in the order a saved file keeps them)."""
    nodes = [
        node(0, "mm", (), memory=_memory(100, parameters=100)),
        node(1, "relu", (0,), memory=None),
        node(2, "add", (1,) if chain else (0, 1), memory=_memory(300, activations=200, parameters=100)),
        node(3, "mul", (2,), memory=_memory(0)),
        node(4, "sum", (3,), memory=_memory(100, parameters=100)),
        node(5, "neg", (), memory=_memory(50, activations=50)),
    ]
    return make_profile(nodes)


@pytest.mark.parametrize("make", [lambda: _profile(True), lambda: _profile(False), hostile_profile])
def test_loaded_text_equals_the_saved_profiles(make: Callable[[], Profile], tmp_path: Path) -> None:
    """Names that need escaping included: a stored table's entries are escaped as the column's values are."""
    built = make()
    built.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    assert graphml_text(loaded) == graphml_text(built)
    assert node_link_json(loaded) == node_link_json(built)


def test_category_column_equals_the_frames_mappings(tmp_path: Path) -> None:
    """Items in the frame column's key order, zero counts dropped, () for an empty mapping, None without a record."""
    built = _profile(chain=True)
    built.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    expected = category_items(node_frame(built).column("live_by_category_bytes"))
    assert category_column(node_frame(loaded)) == expected
    assert expected[1] is None and expected[3] == ()
    assert category_column(node_frame(built)) == expected


def test_input_texts_only_for_stored_chains(tmp_path: Path) -> None:
    """One input at most per node: the ids' text from the edge arrays; two inputs, or no stored
    columns: None, so the writer formats the tuples themselves."""
    for chain in (True, False):
        built = _profile(chain)
        built.save(tmp_path / f"{chain}.json")
        graph = Profile.load(tmp_path / f"{chain}.json").graphs[0]
        texts = input_texts(graph, 0, 6)
        assert texts == (["", "0", "1", "2", "3", ""] if chain else None)
        assert input_texts(graph, 3, 5) == ["2", "3"]
        assert input_texts(built.graphs[0], 0, 6) is None


def test_indexed_texts_encode_each_used_entry_once(tmp_path: Path) -> None:
    _profile(chain=True).save(tmp_path / "p.json")
    graph = Profile.load(tmp_path / "p.json").graphs[0]
    seen: list[list[object]] = []

    def texts_of(entries: list[object]) -> list[str]:
        seen.append(entries)
        return [f"<{e}>" for e in entries]

    coded = indexed_texts(graph, "type", 1, 4, texts_of)
    assert coded is not None and coded.texts() == ["<relu>", "<add>", "<mul>"]
    assert sorted(seen[0]) == ["add", "mul", "relu"]  # type: ignore[type-var]
    empty = indexed_texts(graph, "type", 2, 2, texts_of)
    assert empty is not None and empty.texts() == []
