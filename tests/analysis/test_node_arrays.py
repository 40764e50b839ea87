"""Array views of the node frame give the same answers as the node-by-node code they replace."""

from __future__ import annotations

import json
import random

import numpy as np

from graphprof.analysis.frame import node_frame
from graphprof.analysis.node_arrays import (
    codes, exact_sum, graph_spans, group_order, int_array, merged_codes, paired_codes,
)
from graphprof.analysis.report import top_indices
from graphprof.analysis.roofline import BOUNDS, Peaks, classify, roofline_bounds
from graphprof.profile.model import (
    GraphKind, GraphRecord, MemoryRecord, NodeRecord, Phase, Profile, StepRecord, node_source, profile_from_document,
)


def _random_profile(seed: int) -> Profile:
    rng = random.Random(seed)
    graphs = []
    for g in range(3):
        nodes = tuple(NodeRecord(
            id=i, name=f"n{i}", op="aten.mm", type=rng.choice(["mm", "add", "relu_"]),
            in_dtypes=rng.choice([(), ("float32",), ("bfloat16",)]),
            flops=rng.choice([None, 0, 7, 10**6, 3 * 10**12]), bytes_read=rng.choice([None, 0, 8, 10**9]),
            bytes_written=rng.choice([None, 0, 8, 4096]),
            host_time_ns=(rng.choice([0, 1, 900, 40_000, 60_000, 10**7]),),
        ) for i in range(rng.randint(0, 40)))
        graphs.append(GraphRecord(g, f"g{g}", GraphKind.STEP, nodes))
    return Profile(steps=(StepRecord(0, 1.0),), graphs=tuple(graphs))


def test_bounds_over_arrays_are_those_classify_gives_each_node() -> None:
    peaks = Peaks(1e11, 2e10, {"bfloat16": 4e11})
    for seed in range(20):
        profile = _random_profile(seed)
        bounds = roofline_bounds(profile, peaks)
        times = node_frame(profile).times("median", "auto")
        nodes = [n for g in profile.graphs for n in g.nodes]
        expected = [classify(n, t, peaks) for n, t in zip(nodes, times)]
        assert [BOUNDS[c] for c in bounds.codes] == [p.bound for p in expected]
        assert [bounds.point(i).roofline_time_s for i in range(len(nodes))] == [p.roofline_time_s for p in expected]
        by_bound: dict = {}
        for p in expected:  # the old running sum, in node order
            by_bound[p.bound] = by_bound.get(p.bound, 0.0) + p.time_s
        assert bounds.time_by_bound() == by_bound and list(bounds.time_by_bound()) == list(by_bound)


def test_graph_spans_split_the_flat_columns_by_graph() -> None:
    profile = _random_profile(3)
    spans = graph_spans(profile, node_frame(profile))
    assert [end - start for start, end in spans] == [len(g.nodes) for g in profile.graphs]
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_top_indices_is_a_stable_descending_sort_cut_to_top() -> None:
    rng = random.Random(0)
    for _ in range(500):
        values = [rng.choice([0.0, -0.0, 1.0, 2.5, rng.random()]) for _ in range(rng.randint(0, 25))]
        top = rng.randint(-2, 30)
        assert top_indices(np.array(values, dtype=float), top) == \
            sorted(range(len(values)), key=values.__getitem__, reverse=True)[:top]


def test_codes_number_values_in_first_seen_order() -> None:
    found, values = codes(["b", "a", "b", None, ("x",), "a"])
    assert found.tolist() == [0, 1, 0, 2, 3, 1] and values == ["b", "a", None, ("x",)]


def test_integer_columns_stay_exact() -> None:
    big = 2**62
    assert exact_sum(np.array([big, big, 3], dtype=np.int64)) == 2 * big + 3  # would overflow int64
    profile = _random_profile(5)
    values, known = int_array(node_frame(profile), "flops")
    column = node_frame(profile).column("flops")
    assert known.tolist() == [v is not None for v in column]
    assert values.tolist() == [v or 0 for v in column]


def test_merged_codes_are_paired_codes_of_the_values() -> None:
    rng = random.Random(3)
    pool = ["a", "b", "c", None, ("x",), (1, 2), "", 1, 1.0, True]  # 1, 1.0 and True are one dict key
    for _ in range(200):
        a = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        b = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        merged = merged_codes(codes(a), codes(b))
        expected = paired_codes(a, b)
        assert [x.tolist() for x in merged[:2]] == [x.tolist() for x in expected[:2]]
        assert merged[2] == expected[2]
    # sides whose values repeat (as a caller's own coding may give them) are coded again
    repeated = (np.array([0, 1, 2]), ["a", "b", "a"]), (np.array([1, 0]), ["c", "a"])
    assert [x.tolist() for x in merged_codes(*repeated)[:2]] == [[0, 1, 0], [0, 2]]


def _counted_profile(seed: int) -> Profile:
    """Every node with FLOPs and a memory record (the loader keeps those columns as arrays)."""
    rng = random.Random(seed)
    graphs = tuple(GraphRecord(g, f"g{g}", GraphKind.STEP, tuple(NodeRecord(
        id=i, name=f"n{i}", op="aten.mm", type="mm", flops=rng.choice([0, 7, 3 * 10**12]),
        bytes_read=rng.choice([None, 8]), memory=MemoryRecord(allocated_bytes=rng.choice([0, -8, 2**40]), live_bytes=i),
        host_time_ns=(i,)) for i in range(rng.randint(1, 30)))) for g in range(2))
    return Profile(steps=(StepRecord(0, 1.0),), graphs=graphs)


def test_loaded_integer_columns_are_the_files_arrays() -> None:
    loaded = profile_from_document(json.loads(json.dumps(_counted_profile(0).to_dict())))
    source = node_source(loaded.graphs[0])
    assert source is not None and source.int_column("flops") is not None  # type: ignore[attr-defined]
    assert source.int_column("live_bytes") is not None  # type: ignore[attr-defined]
    for seed in range(20):
        profile = _random_profile(seed) if seed % 2 else _counted_profile(seed)
        loaded = profile_from_document(json.loads(json.dumps(profile.to_dict())))
        for name in ("flops", "bytes_read", "bytes_written", "allocated_bytes", "live_bytes"):
            try:
                expected = int_array(node_frame(profile), name)
            except ValueError:
                continue
            found = int_array(node_frame(loaded), name)
            assert [x.tolist() for x in found] == [x.tolist() for x in expected]
            assert not found[0].flags.writeable and not found[1].flags.writeable


def test_group_order_is_the_stable_argsort() -> None:
    rng = np.random.default_rng(0)
    for groups in (1, 3, 1000, 1 << 16, (1 << 16) + 5):
        found = rng.integers(0, groups, 5000)
        assert group_order(found, groups).tolist() == np.argsort(found, kind="stable").tolist()
    assert group_order(np.zeros(0, dtype=np.intp), 0).tolist() == []


def test_loaded_derived_columns_and_summary_equal_the_records() -> None:
    from graphprof.analysis.table import build_table

    rng = random.Random(7)
    nodes = tuple(NodeRecord(
        id=i, name=f"n{i}", op="aten.mm", type=rng.choice(["mm", "add"]), phase=rng.choice(list(Phase)),
        bytes_read=rng.choice([0, 8, 2**40]), bytes_written=rng.choice([0, 4096]),
        memory=MemoryRecord(allocated_bytes=rng.choice([0, 64]), freed_bytes=rng.choice([0, -8]), live_bytes=i),
        host_time_ns=(rng.randint(1, 10**6), rng.randint(1, 10**6))) for i in range(50))
    profile = Profile(steps=(StepRecord(0, 1.0), StepRecord(1, 1.0)), graphs=(GraphRecord(0, "g", GraphKind.STEP, nodes),))
    loaded = profile_from_document(json.loads(json.dumps(profile.to_dict())))
    for name in ("bytes_moved", "allocated_bytes", "freed_bytes", "live_bytes", "phase"):
        assert node_frame(loaded).column(name) == node_frame(profile).column(name)
    for name in ("bytes_moved", "allocated_bytes", "freed_bytes"):
        assert [x.tolist() for x in int_array(node_frame(loaded), name)] == \
            [x.tolist() for x in int_array(node_frame(profile), name)]
    assert build_table(loaded).summary == build_table(profile).summary
