"""Two real ranks (gloo on 127.0.0.1) profile an FSDP2 training step (see ``fsdp_ranks.py``).

One launch serves every test here; it takes about 20-30 s on two CPU cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from graphprof.analysis.distributed import analyze_distributed
from graphprof.cli import main
from graphprof.profile.merge import graph_ranks, merge_profiles
from graphprof.profile.model import Profile
from graphprof.profile.model import load_profile
from tests.distributed.fsdp_ranks import BLOCKS, SLOW_RANK, rank_main
from tests.distributed.ranks import launch

WORLD = 2


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_ranks")
    launch(WORLD, str(out), main=rank_main)
    return out


@pytest.fixture(scope="module")
def results(ranks_dir: Path) -> list[dict[str, Any]]:
    return [torch.load(ranks_dir / f"rank{r}.pt") for r in range(WORLD)]


@pytest.fixture(scope="module")
def profiles(ranks_dir: Path) -> list[Profile]:
    return [load_profile(str(ranks_dir / f"fsdp_rank{r}.json")) for r in range(WORLD)]


@pytest.fixture(scope="module")
def merged(profiles: list[Profile]) -> Profile:
    return merge_profiles(profiles)


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_profiled_fsdp_run_is_bitwise_the_unprofiled_one_on_every_rank(results: list[dict[str, Any]]) -> None:
    for r in results:
        eager, traced = r["eager"], r["traced"]
        assert _equal(traced["losses"], eager["losses"]), f"rank {r['rank']}: losses differ"
        for step, (want, got) in enumerate(zip(eager["states"], traced["states"])):
            for key in ("params", "grads", "moments"):
                assert _equal(got[key], want[key]), f"rank {r['rank']} step {step}: {key} differ"
            assert set(got["grad_types"]) == {"DTensor"}  # the user still sees FSDP's DTensor gradients
    # The ranks saw different data, so the reduce-scatter really averaged.
    assert not torch.equal(results[0]["eager"]["losses"][0], results[1]["eager"]["losses"][0])


def test_whole_step_capture_refuses_with_one_warning_and_segments_profile(results: list[dict[str, Any]],
                                                                         profiles: list[Profile]) -> None:
    for r, profile in zip(results, profiles):
        ours = [(m, f) for m, f in r["warnings"] if "graphprof" in m or "/graphprof/" in f]
        assert len(ours) == 1, ours
        assert "FSDP2" in ours[0][0] and "torch.compile segments" in ours[0][0]
        assert r["fx_error"] is not None and "FSDP2" in r["fx_error"]
        assert profile.meta.capture == "dynamo"
        names = [g.name for g in profile.graphs]
        assert "optimizer" in names and "comm" in names  # AdamW on DTensor shards is a graph of its own


def test_all_gathers_and_reduce_scatters_are_nodes_with_their_bytes(results: list[dict[str, Any]],
                                                                    profiles: list[Profile]) -> None:
    modules = ["root", *(f"blocks.{i}" for i in range(BLOCKS))]
    for r, profile in zip(results, profiles):
        expected = r["expected"]["gather_bytes"]
        comm = next(g for g in profile.graphs if g.name == "comm")
        seen: dict[tuple[str, str, str], int] = {}
        for node in comm.nodes:
            attrs = dict(node.attrs)
            assert attrs["world_size"] == WORLD and attrs["source"] == "fsdp" and attrs["blocking"] is True
            assert node.flops == 0 and attrs["bytes"] == node.bytes_read
            assert len(node.host_time_s) == len(profile.steps) and all(t > 0 for t in node.host_time_s)
            seen[(attrs["collective"], node.module or "root", node.phase.value)] = attrs["bytes"]
        for module in modules:  # NCCL-tests sizes: the gathered output, the reduce-scatter's input
            assert seen[("allgather", module, "forward")] == expected[module]
            assert seen[("reduce_scatter", module, "backward")] == expected[module]
        for block in modules[1:]:  # resharded after forward: gathered again for backward
            assert seen[("allgather", block, "backward")] == expected[block]


def test_graphs_host_gaps_and_collectives_add_up_to_each_step(profiles: list[Profile]) -> None:
    for profile in profiles:
        for j, step in enumerate(profile.steps):
            total = sum(n.host_time_s[j] for g in profile.graphs for n in g.nodes)
            assert total == pytest.approx(step.wall_time_s, rel=1e-6)


def test_overlap_figures_are_consistent_with_the_comm_nodes(profiles: list[Profile], merged: Profile) -> None:
    for profile in profiles:
        assert profile.meta.distributed is not None and profile.meta.distributed.fsdp is not None
        info = profile.meta.distributed.fsdp
        comm = next(g for g in profile.graphs if g.name == "comm")
        for j, step in enumerate(profile.steps):
            figures = info["steps"][str(step.index)]
            # Blocking collectives never overlap each other: their union is the sum of the nodes.
            assert figures["comm_s"] == pytest.approx(sum(n.host_time_s[j] for n in comm.nodes), rel=1e-6)
            # gloo runs each collective on the thread that computes: no graph runs beside it.
            assert figures["hidden_s"] == 0.0
    sharding = analyze_distributed(merged).sharding
    assert sharding is not None and [o.rank for o in sharding.overlap] == list(range(WORLD))
    for o in sharding.overlap:
        assert o.comm_s > 0 and o.hidden_s + o.exposed_s == pytest.approx(o.comm_s) and o.hidden_share == 0.0


def test_sharded_memory_against_the_unsharded_model(results: list[dict[str, Any]], merged: Profile) -> None:
    sharding = analyze_distributed(merged).sharding
    assert sharding is not None
    for m in sharding.memory:
        expected = results[m.rank]["expected"]
        assert m.params_bytes == m.grads_bytes == expected["local_param_bytes"]
        assert m.optimizer_state_bytes == 2 * expected["local_param_bytes"] + 4 * len(results[m.rank]["eager"]["states"][0]["params"])
        assert m.unsharded_need_bytes == expected["unsharded_need_bytes"]
        assert max(expected["gather_bytes"].values()) <= m.unsharded_peak_bytes <= sum(expected["gather_bytes"].values())
        assert m.saving is not None and m.saving < 1


def test_slowed_rank_is_the_straggler(merged: Profile) -> None:
    analysis = analyze_distributed(merged)
    assert analysis is not None and analysis.straggler is not None
    assert analysis.straggler.rank == SLOW_RANK and analysis.straggler.significant
    by_rank = {r.rank: r for r in analysis.ranks}
    assert by_rank[1 - SLOW_RANK].comm_wait_s > by_rank[SLOW_RANK].comm_wait_s
    kinds = {c.collective for c in analysis.collectives}
    assert kinds == {"allgather", "reduce_scatter"}
    assert all(c.busbw_bytes_per_s and c.busbw_bytes_per_s > 0 for c in analysis.collectives)


def test_cli_merge_and_report_show_overlap_memory_and_straggler(ranks_dir: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged.json"
    assert main(["merge", *(str(ranks_dir / f"fsdp_rank{r}.json") for r in range(WORLD)), "-o", str(out)]) == 0
    assert main(["report", str(out), "-t", "3"]) == 0
    text = capsys.readouterr().out
    for needle in (f"straggler: rank {SLOW_RANK}", "communication overlap per rank", "hidden share",
                   "sharded memory per rank", "reduce_scatter", "busbw"):
        assert needle in text
    assert sorted(graph_ranks(load_profile(str(out))).values()) == sorted(r for r in range(WORLD) for _ in range(5))
