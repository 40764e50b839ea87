"""``merge_profiles`` and ``graphprof merge``: layout, step alignment, refusals (torch-free)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from graphprof.profile.records import DistributedInfo, seconds_to_ns
from graphprof.cli import main
from graphprof.profile.merge import graph_ranks, is_merged, merge_profiles, split_graph_name
from graphprof.profile.model import Profile
from graphprof.profile.model import ProfileError, load_profile
from tests.distributed.synthetic import rank_profile


def test_merged_layout_keeps_every_rank_graph_under_a_rank_prefix() -> None:
    ranks = [rank_profile(1, wall_s=0.05), rank_profile(0, wall_s=0.03)]  # any order in
    merged = merge_profiles(ranks)
    assert is_merged(merged) and not is_merged(ranks[0])
    assert [g.id for g in merged.graphs] == list(range(6))
    assert [split_graph_name(g.name) for g in merged.graphs] == [
        (r, name) for r in (0, 1) for name in ("segment 0 forward", "host", "comm")]
    assert graph_ranks(merged) == {g.id: g.id // 3 for g in merged.graphs}
    info = merged.meta.distributed
    assert info is not None
    assert (info.world_size, info.backend, list(info.missing_ranks)) == (2, "gloo", [])
    assert [r["rank"] for r in info.ranks] == [0, 1]
    assert [r["wall_time_s"] for r in info.ranks] == [[0.03] * 3, [0.05] * 3]
    # A synchronous step lasts as long as its slowest rank.
    assert [s.wall_time_s for s in merged.steps] == [0.05] * 3
    assert [n.host_time_s for n in merged.graphs[3].nodes] == [n.host_time_s for n in ranks[0].graphs[0].nodes]


def test_only_the_steps_every_rank_profiled_are_kept() -> None:
    def with_samples(profile: Profile, samples: tuple[float, ...]) -> Profile:
        graph = profile.graphs[0]
        node = replace(graph.nodes[0], host_time_ns=seconds_to_ns(samples))
        return replace(profile, graphs=(replace(graph, nodes=(node,)),) + profile.graphs[1:])

    first = with_samples(rank_profile(0, steps=(2, 3, 4)), (1.0, 2.0, 3.0))
    second = with_samples(rank_profile(1, steps=(3, 4, 5)), (10.0, 20.0, 30.0))
    merged = merge_profiles([first, second])
    assert [s.index for s in merged.steps] == [3, 4]
    assert all(len(n.host_time_s) == 2 for g in merged.graphs for n in g.nodes)
    assert merged.graphs[0].nodes[0].host_time_s == (2.0, 3.0)  # rank 0's steps 3 and 4
    assert merged.graphs[3].nodes[0].host_time_s == (10.0, 20.0)  # rank 1's steps 3 and 4


def test_missing_ranks_are_recorded() -> None:
    merged = merge_profiles([rank_profile(0, world=4), rank_profile(2, world=4)])
    assert merged.meta.distributed is not None and list(merged.meta.distributed.missing_ranks) == [1, 3]


@pytest.mark.parametrize("profiles, message", [
    ([], "nothing to merge"),
    ([rank_profile(0, info=DistributedInfo())], "has no rank"),
    ([rank_profile(0), rank_profile(0)], "rank 0 is given twice"),
    ([rank_profile(0, world=2), rank_profile(1, world=4)], "disagree on world size"),
    ([rank_profile(0, backend="gloo"), rank_profile(1, backend="nccl")], "disagree on backend"),
    ([rank_profile(0, steps=(1, 2)), rank_profile(1, steps=(3, 4))], "share no profiled step"),
    ([rank_profile(3, world=2)], "outside 0..1"),
])
def test_merge_refuses_what_cannot_be_one_job_with_one_sentence(profiles: list, message: str) -> None:
    with pytest.raises(ProfileError, match=message) as info:
        merge_profiles(profiles)
    assert "\n" not in str(info.value)


def test_a_merged_profile_cannot_be_merged_again() -> None:
    merged = merge_profiles([rank_profile(0), rank_profile(1)])
    with pytest.raises(ProfileError, match="already a merged profile"):
        merge_profiles([merged])


def test_cli_merge_writes_a_profile_that_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        rank_profile(rank).save(str(path))
        files.append(str(path))
    out = tmp_path / "merged.json"
    assert main(["merge", *files, "-o", str(out)]) == 0
    assert "merged 2 rank(s)" in capsys.readouterr().err
    loaded = load_profile(str(out))
    assert loaded == merge_profiles([load_profile(f) for f in files], labels=files)
    assert main(["merge", files[0], files[0], "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphprof: error: rank 0 is given twice") and err.count("\n") == 1
