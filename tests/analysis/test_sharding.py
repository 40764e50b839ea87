"""Overlap and sharded memory per FSDP2 rank of a merged profile (analysis/sharding.py), torch-free."""

from __future__ import annotations

import pytest

from graphprof.analysis.distributed import analyze_distributed
from graphprof.analysis.sharding import analyze_sharding
from graphprof.profile.merge import merge_profiles
from graphprof.profile.records import DistributedInfo
from graphprof.render.distributed_text import render_distributed
from tests.distributed.synthetic import rank_profile

MEMORY = {"params_bytes": 100, "grads_bytes": 100, "optimizer_state_bytes": 200, "unsharded_peak_bytes": 150,
          "unsharded_params_bytes": 200, "unsharded_grads_bytes": 200, "unsharded_optimizer_state_bytes": 400}


def _fsdp_rank(rank: int, comm_s: list[float], hidden_s: list[float]):
    steps = {str(i): {"comm_s": c, "hidden_s": h, "memory": MEMORY} for i, c, h in zip((2, 3, 4), comm_s, hidden_s)}
    info = DistributedInfo(rank=rank, world_size=2, backend="nccl", fsdp={"modules": 3, "steps": steps})
    return rank_profile(rank, info=info)


def test_hidden_and_exposed_add_up_to_communication_per_rank() -> None:
    merged = merge_profiles([_fsdp_rank(0, [0.010, 0.012, 0.011], [0.004, 0.006, 0.005]),
                             _fsdp_rank(1, [0.020, 0.020, 0.020], [0.0, 0.0, 0.0])])
    sharding = analyze_sharding(merged)
    assert sharding is not None
    first, second = sharding.overlap
    assert (first.rank, first.comm_s, first.hidden_s) == (0, 0.011, 0.005)
    assert first.exposed_s + first.hidden_s == pytest.approx(first.comm_s)
    assert first.hidden_share == pytest.approx(0.005 / 0.011)
    assert second.hidden_share == 0.0 and second.exposed_s == 0.020


def test_memory_is_set_against_the_unsharded_need() -> None:
    merged = merge_profiles([_fsdp_rank(r, [0.01] * 3, [0.0] * 3) for r in range(2)])
    memory = analyze_sharding(merged).memory
    assert [m.rank for m in memory] == [0, 1]
    assert memory[0].total_bytes == 550 and memory[0].unsharded_need_bytes == 800
    assert memory[0].saving == pytest.approx(550 / 800)


def test_report_section_only_for_fsdp_ranks() -> None:
    plain = analyze_distributed(merge_profiles([rank_profile(r) for r in range(2)]))
    assert plain.sharding is None and "communication overlap" not in render_distributed(plain)
    fsdp = analyze_distributed(merge_profiles([_fsdp_rank(r, [0.01] * 3, [0.002] * 3) for r in range(2)]))
    text = render_distributed(fsdp)
    assert "communication overlap per rank" in text and "20%" in text and "sharded memory per rank" in text
