"""Memory fields as arrays: a loaded graph's columns give what its records give, whatever the values."""

from __future__ import annotations

import numpy as np
import pytest

import graphprof
from graphprof.analysis.memory import memory_summary, memory_timeline
from graphprof.analysis.memory_columns import graph_memory, has_memory_records, last_index
from graphprof.api import Profile
from graphprof.profile.model import MemoryPeak, MemoryRecord, NodeRecord, PeakTensor, Phase, node_source
from graphprof.render.memory_svg import memory_timeline_svg
from tests.analysis.conftest import node, one_graph_profile


def _profile(scale: int = 1, with_gap: bool = True) -> Profile:
    """Five nodes, one of them (with ``with_gap``) without a memory record; byte counts times ``scale``."""
    def mem(alloc: int, freed: int, cats: dict[str, int], workspace: int = 0) -> MemoryRecord:
        return MemoryRecord(alloc * scale, freed * scale, sum(cats.values()) * scale,
                            {c: b * scale for c, b in cats.items()}, workspace * scale, 2 * workspace * scale)

    ids = [0, 1, 2, 3, 4]
    records = [
        mem(40, 0, {"parameters": 100, "activations": 40}),
        None if with_gap else mem(0, 0, {"parameters": 100, "activations": 40}),
        mem(10, 0, {"parameters": 100, "activations": 40, "temporaries": 10}, workspace=7),
        mem(100, 50, {"parameters": 100, "gradients": 100, "zeroed": 0}),
        mem(0, 100, {"parameters": 100, "gradients": 100}),
    ]
    phases = [Phase.FORWARD, Phase.FORWARD, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER]
    nodes = [node(i, "op", name=f"op_{k}", phase=p, memory=m) for k, (i, p, m) in enumerate(zip(ids, phases, records))]
    peak = MemoryPeak(node_id=ids[3], live_bytes=250 * scale, by_category_bytes={"parameters": 100 * scale},
                      largest_tensors=(PeakTensor("w", 100 * scale, "parameters"), PeakTensor("g", 9, "gradients", 1)),
                      start_bytes=100 * scale, allocated_bytes=150 * scale)
    return one_graph_profile(nodes, walls_s=(1.0,), memory_peak=peak)


def _loaded(profile: Profile, tmp_path) -> Profile:
    path = tmp_path / "p.json"
    profile.save(str(path))
    return graphprof.load(str(path))


@pytest.mark.parametrize("scale", [1, 2**40, 2**55])  # 2**55: sums leave int64, so Python ints are kept
@pytest.mark.parametrize("with_gap", [True, False])
def test_loaded_columns_give_what_the_records_give(tmp_path, scale: int, with_gap: bool) -> None:
    built = _profile(scale, with_gap)
    loaded = _loaded(built, tmp_path)
    assert memory_timeline(loaded) == memory_timeline(built)
    assert memory_summary(loaded) == memory_summary(built)
    assert memory_timeline_svg(loaded) == memory_timeline_svg(built)
    timeline = memory_timeline(built)
    assert all(type(v) is int for v in timeline.during_bytes + timeline.live_by_category[0])
    assert "zeroed" not in timeline.categories  # named, but never non-zero
    assert timeline.node_ids == ((0, 2, 3, 4) if with_gap else (0, 1, 2, 3, 4))


def test_values_are_the_records_arithmetic() -> None:
    t = memory_timeline(_profile(2**55))
    assert t.during_bytes[1] == (150 + 7) * 2**55 and t.during_bytes[3] == 300 * 2**55  # the last past int64
    assert t.start_bytes == 100 * 2**55 and t.peak_index == 2 and t.peak_bytes == 250 * 2**55
    s = memory_summary(_profile(2**55))
    assert s.allocated_bytes == (150 + 14) * 2**55 and s.freed_bytes == (150 + 14) * 2**55


def test_graph_memory_of_a_graph_without_records() -> None:
    bare = one_graph_profile([NodeRecord(0, "a", "aten.a", "a")])
    memory = graph_memory(bare.graphs[0])
    assert len(memory) == 0 and memory.by_category == {}
    assert not has_memory_records(bare.graphs) and has_memory_records(_profile().graphs)


def test_has_memory_records_on_loaded_graphs(tmp_path) -> None:
    assert has_memory_records(_loaded(_profile(), tmp_path).graphs)
    assert not has_memory_records(_loaded(one_graph_profile([node(0)], walls_s=(1.0,)), tmp_path).graphs)


def test_last_index_is_what_a_dict_of_positions_gives() -> None:
    values = [3, 1, 3, 2]
    assert [last_index(values, v) for v in (3, 1, 2, 9)] == [{v: i for i, v in enumerate(values)}.get(v)
                                                             for v in (3, 1, 2, 9)]
    assert last_index(np.array([1, 1]).tolist(), 1) == 1


@pytest.mark.parametrize("scale, kept_as_loaded", [(1, True), (2**55, False)])
def test_a_loaded_field_without_nulls_is_the_loaders_array(tmp_path, scale: int, kept_as_loaded: bool) -> None:
    """Where every node has a record, a field is the int64 array the loader checked, unless sums could leave int64."""
    graph = _loaded(_profile(scale, with_gap=False), tmp_path).graphs[0]
    fields = graph_memory(graph).fields
    ints = node_source(graph).memory.per_field["live_bytes"].ints
    assert (fields["live_bytes"] is ints) == kept_as_loaded
    assert fields["live_bytes"].dtype == (np.int64 if kept_as_loaded else object)
    assert fields["live_bytes"].tolist() == ints.tolist()
