"""Rank comparison of merged profiles: straggler, waits, bus bandwidth, report and trace (torch-free)."""

from __future__ import annotations

import json

import pytest

from graphprof.profile.records import seconds_to_ns
from graphprof.analysis.distributed import analyze_distributed, bus_factor
from graphprof.analysis.report import build_report
from graphprof.profile.merge import merge_profiles
from graphprof.profile.model import DistributedInfo, GraphKind, GraphRecord, NodeRecord, Profile, ProfileMeta, StepRecord
from graphprof.render.chrome_trace import chrome_trace
from graphprof.render.distributed_text import render_distributed
from graphprof.render.report_text import render_report
from tests.distributed.synthetic import comm_node, rank_profile

WALL = 0.050


def _job(extra_compute_s: float = 0.030, slow: int = 1, world: int = 2) -> Profile:
    """Every rank takes WALL per step; rank ``slow`` computes longer, the others wait that much in each bucket."""
    ranks = []
    for r in range(world):
        late = r == slow
        ranks.append(rank_profile(r, world=world, compute_s=0.010 + (extra_compute_s if late else 0.0),
                                  comm_s=(0.004, 0.003) if late else (0.004 + extra_compute_s, 0.003 + extra_compute_s),
                                  wall_s=WALL))
    return merge_profiles(ranks)


def test_the_rank_others_wait_for_is_the_straggler_and_its_slow_node_is_named() -> None:
    analysis = analyze_distributed(_job(extra_compute_s=0.030))
    assert analysis is not None
    by_rank = {r.rank: r for r in analysis.ranks}
    # Overlapping bucket allreduces (the comm hook's) wait once for the late rank: their largest wait counts.
    assert by_rank[0].comm_wait_s == pytest.approx(0.030)
    assert by_rank[1].comm_wait_s == pytest.approx(0.0)
    assert by_rank[0].busy_s == pytest.approx(WALL - 0.030) and by_rank[1].busy_s == pytest.approx(WALL)
    s = analysis.straggler
    assert s is not None and (s.rank, s.significant, s.basis) == (1, True, "collective waits")
    assert s.lag_s == pytest.approx(0.030)
    top = s.nodes[0]
    assert (top.node.type, top.node.module, top.node.kind) == ("mm", "fc1", "compute")
    assert top.excess_s == pytest.approx(0.030)
    assert by_rank[1].compute_s == pytest.approx(0.040) and by_rank[0].comm_s == pytest.approx(0.067)


def test_the_straggler_is_found_on_any_rank_and_flagged_only_when_it_lags() -> None:
    assert analyze_distributed(_job(slow=2, world=4)).straggler.rank == 2
    even = analyze_distributed(_job(extra_compute_s=0.0))
    assert even.straggler is not None and not even.straggler.significant and even.straggler.lag_s == 0


def test_collectives_inside_graphs_add_their_waits() -> None:
    def graph_profile(rank: int, times: tuple[float, float]) -> Profile:
        nodes = tuple(comm_node(i, 1024, 2, (t,), source="graph") for i, t in enumerate(times))
        step = GraphRecord(0, "step", GraphKind.STEP, nodes=nodes)
        meta = ProfileMeta(capture="fx", distributed=DistributedInfo(rank=rank, world_size=2, backend="gloo"))
        return Profile(meta=meta, steps=(StepRecord(3, 0.1),), graphs=(step,))

    analysis = analyze_distributed(merge_profiles([graph_profile(0, (0.010, 0.020)), graph_profile(1, (0.001, 0.002))]))
    assert {r.rank: r.comm_wait_s for r in analysis.ranks} == pytest.approx({0: 0.027, 1: 0.0})


def test_bus_bandwidth_follows_nccl_tests() -> None:
    assert bus_factor("allreduce", 4) == pytest.approx(1.5)
    assert bus_factor("allgather", 4) == bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 4) == 1.0 and bus_factor("barrier", 4) is None
    analysis = analyze_distributed(_job(extra_compute_s=0.030, world=4))
    bucket0 = next(c for c in analysis.collectives if c.node.node_id == 0)
    # The shortest time over ranks: the late rank's, which waited least.
    assert (bucket0.bytes, bucket0.world_size, bucket0.time_s) == (1 << 20, 4, pytest.approx(0.004))
    assert bucket0.algbw_bytes_per_s == pytest.approx((1 << 20) / 0.004)
    assert bucket0.busbw_bytes_per_s == pytest.approx((1 << 20) / 0.004 * 2 * 3 / 4)


def test_functional_collective_time_includes_its_wait() -> None:
    def profile(rank: int) -> Profile:
        launch = NodeRecord(id=0, name="all_reduce", op="_c10d_functional.all_reduce.default", type="all_reduce",
                            flops=0, bytes_read=64, bytes_written=64, host_time_ns=seconds_to_ns((0.001,)),
                            attrs=(("bytes", 64), ("collective", "allreduce"), ("world_size", 2)))
        wait = NodeRecord(id=1, name="wait_tensor", op="_c10d_functional.wait_tensor.default", type="wait_tensor",
                          inputs=(0,), flops=0, host_time_ns=seconds_to_ns((0.005 * (rank + 1),)), attrs=(("collective", "wait"),))
        meta = ProfileMeta(capture="dynamo", distributed=DistributedInfo(rank=rank, world_size=2, backend="gloo"))
        return Profile(meta=meta, steps=(StepRecord(3, 0.1),),
                       graphs=(GraphRecord(0, "segment 0 forward", GraphKind.FORWARD, nodes=(launch, wait)),))

    analysis = analyze_distributed(merge_profiles([profile(0), profile(1)]))
    (collective,) = analysis.collectives
    assert collective.time_s == pytest.approx(0.006) and collective.max_time_s == pytest.approx(0.011)
    assert {r.rank: r.comm_s for r in analysis.ranks} == pytest.approx({0: 0.006, 1: 0.011})


def test_spread_lists_nodes_by_their_difference_across_ranks() -> None:
    analysis = analyze_distributed(_job(extra_compute_s=0.030))
    spreads = [n.spread_s((0, 1)) for n in analysis.spread]
    assert spreads == sorted(spreads, reverse=True) and spreads[0] == pytest.approx(0.030)
    assert all(s > 0 for s in spreads)


def test_a_single_rank_profile_has_no_rank_comparison() -> None:
    assert analyze_distributed(rank_profile(0)) is None
    report = build_report(rank_profile(0))
    assert report.distributed is None and "straggler" not in render_report(report)
    lonely = analyze_distributed(merge_profiles([rank_profile(0, world=1)]))
    assert lonely.straggler is None and "straggler: - (one rank)" in render_distributed(lonely)


def test_report_of_a_merged_profile_has_the_distributed_section() -> None:
    text = render_report(build_report(_job(extra_compute_s=0.030), top=3))
    assert "distributed: 2 of 2 ranks (gloo)" in text
    assert "straggler: rank 1" in text and "nodes that make rank 1 slow" in text
    assert "busbw" in text and "spread across ranks" in text


def test_chrome_trace_of_a_merged_profile_has_one_process_per_rank() -> None:
    merged = _job(extra_compute_s=0.030)
    doc = json.loads(json.dumps(chrome_trace(merged)))
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {1: "graphprof: rank 0: train_step", 2: "graphprof: rank 1: train_step"}
    nodes = [e for e in events if e["ph"] == "X" and e["cat"] != "step"]
    assert {e["pid"] for e in nodes} == {1, 2}
    assert {e["args"]["graph"].split("/")[0] for e in nodes if e["pid"] == 2} == {"rank1"}
    steps = [e for e in events if e.get("cat") == "step"]
    assert len(steps) == 2 * len(merged.steps)
    # Every rank's step k starts at the same time.
    assert len({(e["ts"]) for e in steps}) == len(merged.steps)


def test_names_in_the_rank_comparison_cannot_break_its_lines() -> None:
    """Graph, node, module and collective names and the backend are shown escaped, as everywhere in the terminal."""
    from dataclasses import replace

    bad = "\x1b[2J\nsecond line"

    def hostile(node: NodeRecord) -> NodeRecord:
        attrs = tuple((k, f"{v}{bad}" if k == "collective" else v) for k, v in node.attrs)
        return replace(node, name=node.name + bad, type=node.type + bad, module=node.module + bad, attrs=attrs)

    merged = _job(extra_compute_s=0.030)
    meta = merged.meta
    assert meta.distributed is not None
    merged = replace(merged, meta=replace(meta, distributed=replace(meta.distributed, backend="gloo" + bad)),
                     graphs=tuple(replace(g, name=g.name + bad, nodes=tuple(map(hostile, g.nodes))) for g in merged.graphs))
    analysis = analyze_distributed(merged)
    assert analysis is not None
    text = render_distributed(analysis)
    assert "\\nsecond line" in text and "\x1b" not in text
    assert not [line for line in text.splitlines() if line.lstrip().startswith("second line")]
