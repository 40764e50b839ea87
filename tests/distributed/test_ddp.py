"""Two real ranks (gloo on 127.0.0.1, spawned processes) profile DDP and all_reduce steps.

One launch serves every test here (see ``ranks.py`` for what each rank
runs); the tests read what the ranks wrote. Nothing is skipped: the launch
takes about 20-40 s on two CPU cores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from graphprof.analysis.distributed import analyze_distributed
from graphprof.cli import main
from graphprof.profile.merge import graph_ranks, merge_profiles
from graphprof.profile.model import Profile
from graphprof.profile.model import load_profile
from tests.distributed.ranks import SLOW_RANK, launch

WORLD = 2


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    launch(WORLD, str(out))
    return out


@pytest.fixture(scope="module")
def results(ranks_dir: Path) -> list[dict[str, Any]]:
    return [torch.load(ranks_dir / f"rank{r}.pt") for r in range(WORLD)]


@pytest.fixture(scope="module")
def ddp_merged(ranks_dir: Path) -> Profile:
    return merge_profiles([load_profile(str(ranks_dir / f"ddp_rank{r}.json")) for r in range(WORLD)])


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_profiled_ddp_run_is_bitwise_the_unprofiled_one(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert _equal(r["ddp_losses_traced"], r["ddp_losses_eager"]), f"rank {r['rank']} losses differ"
        assert _equal(r["ddp_params_traced"], r["ddp_params_eager"]), f"rank {r['rank']} parameters differ"
    # DDP keeps the replicas identical, and the ranks saw different data: averaging really happened.
    assert _equal(results[0]["ddp_params_traced"], results[1]["ddp_params_traced"])
    assert not torch.equal(results[0]["ddp_losses_traced"][0], results[1]["ddp_losses_traced"][0])


def test_ddp_falls_back_to_segments_and_whole_step_capture_refuses(results: list[dict[str, Any]],
                                                                   ddp_merged: Profile) -> None:
    for r in results:
        assert any("DistributedDataParallel" in w and "torch.compile segments" in w for w in r["warnings"])
        assert r["fx_error"] is not None and "DistributedDataParallel" in r["fx_error"]
    assert {rank["capture"] for rank in ddp_merged.meta.distributed.ranks} == {"dynamo"}


def test_each_rank_profile_records_rank_world_size_and_backend(ranks_dir: Path) -> None:
    for r in range(WORLD):
        info = load_profile(str(ranks_dir / f"ddp_rank{r}.json")).meta.distributed
        assert info is not None and (info.rank, info.world_size, info.backend) == (r, WORLD, "gloo")
        assert info.details["ddp_buckets_timed"] is True


def test_bucket_allreduces_are_nodes_with_ddps_bucket_bytes(ddp_merged: Profile,
                                                            results: list[dict[str, Any]]) -> None:
    ranks_of = graph_ranks(ddp_merged)
    comm = [g for g in ddp_merged.graphs if g.name.endswith("/comm")]
    assert sorted(ranks_of[g.id] for g in comm) == list(range(WORLD))
    for graph in comm:
        expected = results[ranks_of[graph.id]]["bucket_bytes"]
        assert len(expected) >= 2  # the model is sized for several buckets
        seen = {dict(n.attrs)["bucket"]: n for n in graph.nodes}
        assert set(seen) == set(expected)
        for index, node in seen.items():
            attrs = dict(node.attrs)
            assert (node.op, attrs["collective"], attrs["world_size"]) == ("c10d.allreduce", "allreduce", WORLD)
            assert attrs["bytes"] == node.bytes_read == node.bytes_written == expected[index]
            assert node.flops == 0 and len(node.host_time_s) == len(ddp_merged.steps)
            assert all(t > 0 for t in node.host_time_s)
        assert sum(n.bytes_read for n in graph.nodes) == results[ranks_of[graph.id]]["param_bytes"]


def test_slowed_rank_is_the_straggler(ddp_merged: Profile) -> None:
    analysis = analyze_distributed(ddp_merged)
    assert analysis is not None and analysis.straggler is not None
    assert analysis.straggler.rank == SLOW_RANK and analysis.straggler.significant
    # The sleep runs in eager code between segments: the top slow node is a host gap.
    assert analysis.straggler.nodes[0].node.kind == "host"
    by_rank = {r.rank: r for r in analysis.ranks}
    assert by_rank[1 - SLOW_RANK].comm_wait_s > by_rank[SLOW_RANK].comm_wait_s
    assert {c.collective for c in analysis.collectives} == {"allreduce"}
    assert all(c.busbw_bytes_per_s and c.busbw_bytes_per_s > 0 for c in analysis.collectives)


def test_direct_all_reduce_is_captured_whole_step_and_still_communicates(ranks_dir: Path,
                                                                          results: list[dict[str, Any]]) -> None:
    for r in results:
        assert _equal(r["ar_losses_traced"], r["ar_losses_eager"]), f"rank {r['rank']} losses differ"
        assert _equal(r["ar_params_traced"], r["ar_params_eager"]), f"rank {r['rank']} parameters differ"
        profile = load_profile(str(ranks_dir / f"allreduce_rank{r['rank']}.json"))
        assert profile.meta.capture == "fx"
        collectives = [n for g in profile.graphs for n in g.nodes if n.op == "c10d.allreduce_.default"]
        assert [dict(n.attrs)["bytes"] for n in collectives] == r["ar_grad_bytes"]
        assert all(n.flops == 0 and n.bytes_written == dict(n.attrs)["bytes"] for n in collectives)
    assert _equal(results[0]["ar_params_traced"], results[1]["ar_params_traced"])


def test_all_reduce_under_segmented_capture_runs_in_the_steps_eager_python(
        ranks_dir: Path, results: list[dict[str, Any]]) -> None:
    """Segmented capture compiles only the model's forward: a collective the step calls itself runs
    eagerly, as written (its time is host time after the backward graph), with eager's results."""
    for r in results:
        assert _equal(r["ar_losses_dynamo"], r["ar_losses_eager"]), f"rank {r['rank']} losses differ"
        assert _equal(r["ar_params_dynamo"], r["ar_params_eager"]), f"rank {r['rank']} parameters differ"
        profile = load_profile(str(ranks_dir / f"allreduce_dynamo_rank{r['rank']}.json"))
        assert profile.meta.capture == "dynamo"
        assert not [n for _, n in profile.iter_nodes() if "allreduce" in n.op]
        gaps = [n for _, n in profile.iter_nodes() if n.name.startswith("host gap: backward 1")]
        assert gaps and all(t > 0 for n in gaps for t in n.host_time_s)


def test_cli_merges_reports_and_exports_one_process_per_rank(ranks_dir: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    merged = tmp_path / "merged.json"
    files = [str(ranks_dir / f"ddp_rank{r}.json") for r in reversed(range(WORLD))]
    assert main(["merge", *files, "-o", str(merged)]) == 0
    assert main(["report", str(merged), "-t", "3"]) == 0
    out = capsys.readouterr().out
    assert f"straggler: rank {SLOW_RANK}" in out and "busbw" in out
    trace = tmp_path / "merged.trace.json"
    assert main(["export", str(merged), "-o", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [1, 2] and "rank 1" in names[2]
    assert {e["pid"] for e in events if e["ph"] == "X" and e.get("cat") != "step"} == {1, 2}
    assert os.path.getsize(merged) > 0
