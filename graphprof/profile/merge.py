"""Merge the per-rank profiles of one distributed run into one Profile.

Each rank of a ``torch.distributed`` job profiles its own process and saves
its own file; its ``meta.distributed`` (``DistributedInfo``) holds ``rank``,
``world_size`` and ``backend``. ``merge_profiles`` combines them so that one
file holds the whole job and every existing view (table, report, exports)
reads it, while ``graphprof.analysis.distributed`` compares the ranks.

Layout of a merged profile (torch-free, plain JSON like any profile):

- ``graphs``: every graph of every rank, ranks in order, renumbered
  ``0..N-1``; a graph's name gets its rank as prefix: ``rank1/segment 0
  forward``, ``rank1/comm``, ``rank0/step``. Nodes keep their ids.
- ``steps``: the profiled step indices all ranks have (ranks of one job run
  in lock step, so usually all of them). A step's ``wall_time_s`` and
  ``graph_time_s`` are the largest over ranks: a synchronous step lasts as
  long as its slowest rank. Node samples are kept for those steps only, in
  the same order.
- ``meta``: rank 0's (function, capture, device, versions, peaks), and
  ``distributed`` (in the file ``extra["distributed"]``) = ``{"merged": true, "world_size", "backend",
  "ranks": [{"rank", "graph_ids", "wall_time_s", "graph_time_s", "host",
  "capture", "created_at", "notes"?, "fsdp"?}, ...], "missing_ranks": [...]}``, per rank
  its graphs and its own step times (aligned with ``steps``). Rank 0's
  ``cost_coverage`` is not carried over (``analysis.coverage`` recomputes it
  for the whole job).

Merging refuses, with one sentence, a profile without a rank, an already
merged one, a rank given twice, and ranks that disagree on world size or
backend or share no profiled step.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Sequence

from graphprof.profile.model import DistributedInfo, GraphRecord, NodeRecord, Profile, ProfileError, ProfileMeta, StepRecord

_RANK_PREFIX = re.compile(r"^rank(\d+)/(.*)$", re.S)


def rank_info(profile: Profile) -> DistributedInfo | None:
    """The distributed section of a profile (None when it has none)."""
    return profile.meta.distributed


def is_merged(profile: Profile) -> bool:
    """True for a profile written by ``merge_profiles``."""
    info = profile.meta.distributed
    return info is not None and info.merged


def graph_ranks(profile: Profile) -> dict[int, int]:
    """Graph id → rank, for a merged profile (empty for any other)."""
    info = profile.meta.distributed
    if info is None or not info.merged:
        return {}
    return {int(g): int(r["rank"]) for r in info.ranks for g in r.get("graph_ids", ())}


def split_graph_name(name: str) -> tuple[int | None, str]:
    """``"rank1/comm"`` → ``(1, "comm")``; a name without a rank prefix → ``(None, name)``."""
    match = _RANK_PREFIX.match(name)
    return (int(match.group(1)), match.group(2)) if match else (None, name)


def _info_of(profile: Profile, label: str) -> DistributedInfo:
    info = profile.meta.distributed
    if info is not None and (info.merged or info.details.get("merged")):
        raise ProfileError(f"{label} is already a merged profile; merge the per-rank files instead")
    if info is None or info.rank is None or info.world_size is None:
        raise ProfileError(f"{label} has no rank: it was not profiled inside a torch.distributed process group")
    return info


def _pick(samples: tuple[int, ...], positions: Sequence[int]) -> tuple[int, ...]:
    """The samples of the kept steps; samples that do not line up with the steps are kept as they are."""
    if not samples:
        return samples
    return tuple(samples[p] for p in positions if p < len(samples))


def _graph_for_rank(graph: GraphRecord, rank: int, new_id: int, positions: Sequence[int],
                    kept_steps: set[int], all_steps: int) -> GraphRecord:
    aligned = all(len(n.host_time_ns) in (0, all_steps) for n in graph.nodes)
    nodes: tuple[NodeRecord, ...] = graph.nodes
    if aligned:
        nodes = tuple(replace(n, host_time_ns=_pick(n.host_time_ns, positions),
                              device_time_ns=_pick(n.device_time_ns, positions)) for n in graph.nodes)
    memory = tuple(s for s in graph.device_memory if s.step in kept_steps)
    return replace(graph, id=new_id, name=f"rank{rank}/{graph.name}", nodes=nodes, device_memory=memory)


def merge_profiles(profiles: Sequence[Profile], labels: Sequence[str] | None = None) -> Profile:
    """One Profile holding every rank's graphs (see the module docstring for the layout)."""
    if not profiles:
        raise ProfileError("nothing to merge: give one profile per rank")
    labels = list(labels) if labels is not None else [f"profile {i + 1}" for i in range(len(profiles))]
    infos = [_info_of(p, label) for p, label in zip(profiles, labels)]
    rank_of = [int(info.rank or 0) for info in infos]  # _info_of refused a profile without one
    seen: dict[int, str] = {}
    for rank, label in zip(rank_of, labels):
        if rank in seen:
            raise ProfileError(f"rank {rank} is given twice ({seen[rank]} and {label})")
        seen[rank] = label
    for key in ("world_size", "backend"):
        values = {str(getattr(info, key)) for info in infos}
        if len(values) > 1:
            raise ProfileError(f"the profiles disagree on {key.replace('_', ' ')} ({', '.join(sorted(values))}); "
                               "merge the files of one run")
    world_size = int(infos[0].world_size or 0)
    if any(not 0 <= rank < world_size for rank in rank_of):
        raise ProfileError(f"a rank is outside 0..{world_size - 1} (the world size is {world_size})")
    order = sorted(range(len(profiles)), key=lambda i: rank_of[i])
    common = set.intersection(*(set(s.index for s in profiles[i].steps) for i in order))
    if not common:
        raise ProfileError("the profiles share no profiled step index; profile the same steps on every rank")
    kept = sorted(common)

    graphs: list[GraphRecord] = []
    ranks: list[dict[str, Any]] = []
    walls: list[list[float]] = []
    graph_times: list[list[float]] = []
    for i in order:
        profile, info = profiles[i], infos[i]
        by_index = {s.index: (pos, s) for pos, s in enumerate(profile.steps)}
        positions = [by_index[k][0] for k in kept]
        ids = []
        for graph in profile.graphs:
            ids.append(len(graphs))
            graphs.append(_graph_for_rank(graph, rank_of[i], len(graphs), positions, common, len(profile.steps)))
        wall = [by_index[k][1].wall_time_s for k in kept]
        gtime = [by_index[k][1].graph_time_s for k in kept]
        walls.append(wall)
        graph_times.append(gtime)
        entry: dict[str, Any] = {
            "rank": rank_of[i], "graph_ids": ids, "wall_time_s": wall, "graph_time_s": gtime,
            "host": info.host, "capture": profile.meta.capture, "created_at": profile.meta.created_at,
            "function": profile.meta.function,
        }
        if info.details.get("notes"):
            entry["notes"] = list(info.details["notes"])
        if info.fsdp is not None:  # per-step overlap and memory of an FSDP2 rank
            entry["fsdp"] = dict(info.fsdp)
        ranks.append(entry)
    steps = tuple(StepRecord(index=k, wall_time_s=max(w[j] for w in walls), graph_time_s=max(g[j] for g in graph_times))
                  for j, k in enumerate(kept))
    first = profiles[order[0]]
    distributed = DistributedInfo(
        merged=True, world_size=world_size, backend=infos[0].backend, ranks=tuple(ranks),
        missing_ranks=tuple(sorted(set(range(world_size)) - set(seen))),
    )
    extra = {k: v for k, v in first.meta.extra.items() if k != "cost_coverage"}
    meta: ProfileMeta = replace(first.meta, distributed=distributed, extra=extra)
    return Profile(meta=meta, steps=steps, graphs=tuple(graphs))
