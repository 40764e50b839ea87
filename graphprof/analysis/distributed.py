"""Comparing the ranks of a merged distributed profile.

Input: a profile written by ``graphprof.profile.merge.merge_profiles`` (one
graph set per rank). Output, as data (``render.distributed_text`` prints it):

- **per rank:** step time, and where it goes: compute (op nodes of the
  captured graphs), host (host gaps and reads between segments, gradient
  bookkeeping), communication (collective nodes, launch to completion);
- **per node across ranks:** nodes are matched by graph (name without the
  rank prefix), node id and op; the spread is the largest minus the smallest
  time over ranks (a node a rank does not run counts 0 s there);
- **the straggler:** the rank the others wait for, and the nodes that make it
  slow;
- **per collective:** bytes, time, algorithm and bus bandwidth.

How the straggler is found. In a synchronous step every rank finishes
together: a fast rank spends the difference waiting inside collectives
(its allreduce cannot complete before the slowest rank joins). So step
times do not tell ranks apart, but time in collectives does: per
collective, a rank's *wait* is its time minus the shortest time any rank
took for it (the last rank to arrive waits least). A rank's *busy* time is
its step time minus its waits; the straggler is the rank with the most busy
time, its *lag* how much more it needs than the median of the others. The
waits of collectives that overlap each other (DDP's bucket allreduces, timed
by graphprof's comm hook, and FSDP2 collectives launched with
``async_op=True``, all wait for the same late rank) count once, by their
largest; collectives inside a graph, and FSDP2's blocking ones, run one
after another and add up.
Without collectives, busy time is step time. The straggler's slow nodes are
its non-collective nodes ordered by *excess*: its time minus the median time
of the other ranks.

Bus bandwidth follows the NCCL-tests convention (``PERFORMANCE.md`` of
nccl-tests), so figures compare with ``all_reduce_perf``: algorithm bandwidth
= bytes / time; bus bandwidth = algorithm bandwidth x a factor that makes it
comparable to the link speed whatever the rank count n: allreduce 2(n-1)/n;
allgather, reduce-scatter, all-to-all, gather, scatter (n-1)/n; broadcast,
reduce, send, recv 1. Bytes are the NCCL-tests "size" (see
``passes/cost_formulas_comm.py``: one rank's buffer for allreduce). The time
is the shortest over ranks: the rank that arrived last waited least, so its
time is closest to the transfer itself. A functional collective
(``_c10d_functional.all_reduce`` + ``wait_tensor``) counts launch plus wait.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import partial
from typing import Callable, Mapping

from graphprof.analysis.frame import graph_column
from graphprof.analysis.sharding import ShardingAnalysis, analyze_sharding
from graphprof.analysis.stats import stat_fn
from graphprof.profile.merge import graph_ranks, is_merged, rank_info, split_graph_name
from graphprof.profile.model import NS_PER_S, AttrValue, GraphRecord, Profile

#: NCCL-tests bus-bandwidth factor of each collective kind, as a function of the rank count.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
#: A straggler is called significant when its lag exceeds this share of the median step.
SIGNIFICANT_LAG = 0.05

Key = tuple[str, int, str]  # graph name without rank prefix, node id, op


def bus_factor(kind: str, ranks: int) -> float | None:
    """The NCCL-tests bus-bandwidth factor of ``kind`` over ``ranks`` ranks (None: no bandwidth)."""
    fn = BUS_FACTORS.get(kind)
    return fn(ranks) if fn is not None and ranks > 0 else None


@dataclass(frozen=True)
class NodeAcrossRanks:
    """One node of the job's program, with its time on each rank that runs it."""

    graph: str
    node_id: int
    name: str
    op: str
    type: str
    module: str
    source: str
    kind: str  # "compute", "host" or "comm"
    times_s: Mapping[int, float]

    def time_on(self, rank: int) -> float:
        return self.times_s.get(rank, 0.0)

    def spread_s(self, ranks: tuple[int, ...]) -> float:
        times = [self.time_on(r) for r in ranks]
        return max(times) - min(times) if times else 0.0

    def slowest_rank(self) -> int:
        return max(self.times_s, key=lambda r: (self.times_s[r], -r))


@dataclass(frozen=True)
class RankTimes:
    """Where one rank's step goes (seconds, under the chosen statistic)."""

    rank: int
    step_time_s: float
    compute_s: float
    host_s: float
    comm_s: float
    comm_wait_s: float
    busy_s: float


@dataclass(frozen=True)
class SlowNode:
    """A node where the straggler takes longer than the other ranks."""

    node: NodeAcrossRanks
    time_s: float
    others_s: float

    @property
    def excess_s(self) -> float:
        return self.time_s - self.others_s


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for."""

    rank: int
    busy_s: float
    others_busy_s: float
    lag_s: float
    significant: bool
    basis: str  # "collective waits" or "step time"
    nodes: tuple[SlowNode, ...]


@dataclass(frozen=True)
class CollectiveStat:
    """One collective of the program: size, time and bandwidth."""

    node: NodeAcrossRanks
    collective: str
    bytes: int
    world_size: int
    time_s: float
    max_time_s: float
    algbw_bytes_per_s: float | None
    busbw_bytes_per_s: float | None


@dataclass(frozen=True)
class DistributedAnalysis:
    """The rank comparison of a merged profile."""

    world_size: int
    backend: str
    stat: str
    ranks: tuple[RankTimes, ...]
    missing_ranks: tuple[int, ...]
    straggler: Straggler | None
    spread: tuple[NodeAcrossRanks, ...]
    collectives: tuple[CollectiveStat, ...]
    nodes: tuple[NodeAcrossRanks, ...]
    sharding: ShardingAnalysis | None = None  # FSDP2 ranks: overlap and sharded memory


def _kind(graph: GraphRecord, attrs: dict[str, AttrValue]) -> str:
    if "collective" in attrs:
        return "comm"
    return "host" if graph.kind.value == "host" else "compute"


def _collective_units(ids: list[int], inputs: list[tuple[int, ...]], attrs: list[dict[str, AttrValue]]) -> dict[int, int]:
    """wait node id → the collective node id it waits for (functional collectives), from a graph's columns."""
    known = set(ids)
    return {node_id: node_inputs[0] for node_id, node_inputs, node_attrs in zip(ids, inputs, attrs)
            if node_attrs.get("collective") == "wait" and node_inputs and node_inputs[0] in known}


def _attr_dicts(graph: GraphRecord) -> list[dict[str, AttrValue]]:
    """Each node's attributes as a dict, made once per distinct attribute tuple (most nodes share one)."""
    made: dict[int, dict[str, AttrValue]] = {}
    column = graph_column(graph, "attrs")
    for attrs in dict(zip(map(id, column), column)).values():
        made[id(attrs)] = dict(attrs)
    return [made[id(attrs)] for attrs in column]


def _samples_s(host_ns: tuple[int, ...], device_ns: tuple[int, ...]) -> tuple[float, ...]:
    """``node_samples_s`` of a node from its two sample columns (device where recorded, else host)."""
    return tuple([t / NS_PER_S for t in device_ns or host_ns])


def match_nodes(profile: Profile, stat: str = "median") -> tuple[NodeAcrossRanks, ...]:
    """Every node of a merged profile, matched across ranks, times under ``stat``.

    A functional collective's time includes that of the ``wait_tensor`` that
    waits for it (the wait node keeps its own time too). Read from the graphs'
    columns: a loaded merged profile builds no NodeRecord.
    """
    fn = stat_fn(stat)
    ranks_of = graph_ranks(profile)
    found: dict[Key, dict] = {}
    for graph in profile.graphs:
        rank = ranks_of.get(graph.id)
        if rank is None:
            continue
        _, name = split_graph_name(graph.name)
        col = partial(graph_column, graph)
        ids, ops, attrs = col("id"), col("op"), _attr_dicts(graph)
        waits = _collective_units(ids, col("inputs"), attrs)
        times = {i: fn(_samples_s(h, d)) for i, h, d in zip(ids, col("host_time_ns"), col("device_time_ns"))}
        for wait_id, launch_id in waits.items():
            times[launch_id] = times.get(launch_id, 0.0) + times[wait_id]
        for k, (node_id, op) in enumerate(zip(ids, ops)):
            entry = found.setdefault((name, node_id, op), {"graph": graph, "col": col, "at": k, "attrs": attrs[k],
                                                           "times": {}})
            entry["times"][rank] = times[node_id]
    return tuple(
        NodeAcrossRanks(key[0], key[1], e["col"]("name")[e["at"]], key[2], e["col"]("type")[e["at"]],
                        e["col"]("module")[e["at"]], e["col"]("source")[e["at"]], _kind(e["graph"], e["attrs"]),
                        dict(e["times"]))
        for key, e in found.items()
    )


def _is_wait(node: NodeAcrossRanks, attrs: Mapping[Key, dict[str, AttrValue]]) -> bool:
    return attrs[(node.graph, node.node_id, node.op)].get("collective") == "wait"


def _comm_waits(nodes: tuple[NodeAcrossRanks, ...], ranks: tuple[int, ...],
                attrs: Mapping[Key, dict[str, AttrValue]]) -> dict[int, float]:
    serial = {r: 0.0 for r in ranks}
    overlapping = {r: 0.0 for r in ranks}
    for node in nodes:
        if node.kind != "comm" or _is_wait(node, attrs) or len(node.times_s) < 2:
            continue
        fastest = min(node.times_s.values())
        a = attrs[(node.graph, node.node_id, node.op)]
        overlaps = a.get("source") == "ddp_comm_hook" or a.get("blocking") is False  # asynchronous: may overlap
        for r, t in node.times_s.items():
            if overlaps:
                overlapping[r] = max(overlapping[r], t - fastest)
            else:
                serial[r] += t - fastest
    return {r: serial[r] + overlapping[r] for r in ranks}


def _node_attrs(profile: Profile) -> dict[Key, dict[str, AttrValue]]:
    out: dict[Key, dict[str, AttrValue]] = {}
    for graph in profile.graphs:
        _, name = split_graph_name(graph.name)
        for node_id, op, attrs in zip(graph_column(graph, "id"), graph_column(graph, "op"), _attr_dicts(graph)):
            out.setdefault((name, node_id, op), attrs)
    return out


def _straggler(ranks: tuple[RankTimes, ...], nodes: tuple[NodeAcrossRanks, ...], basis: str,
               top: int) -> Straggler | None:
    if len(ranks) < 2:
        return None
    slow = max(ranks, key=lambda r: (r.busy_s, -r.rank))
    others = [r for r in ranks if r.rank != slow.rank]
    others_busy = statistics.median(r.busy_s for r in others)
    lag = slow.busy_s - others_busy
    step = statistics.median(r.step_time_s for r in ranks)
    slow_nodes = []
    for node in nodes:
        if node.kind == "comm" or slow.rank not in node.times_s:
            continue
        others_s = statistics.median(node.time_on(r.rank) for r in others)
        if node.time_on(slow.rank) > others_s:
            slow_nodes.append(SlowNode(node, node.time_on(slow.rank), others_s))
    slow_nodes.sort(key=lambda s: -s.excess_s)
    return Straggler(slow.rank, slow.busy_s, others_busy, lag, step > 0 and lag > SIGNIFICANT_LAG * step,
                     basis, tuple(slow_nodes[:top]))


def _collectives(nodes: tuple[NodeAcrossRanks, ...], attrs: Mapping[Key, dict[str, AttrValue]],
                 world_size: int) -> tuple[CollectiveStat, ...]:
    out = []
    for node in nodes:
        a = attrs[(node.graph, node.node_id, node.op)]
        kind = None if a.get("collective") is None else str(a.get("collective"))
        if node.kind != "comm" or kind in (None, "wait") or not node.times_s:
            continue
        nbytes, n = a.get("bytes", 0), a.get("world_size", world_size)
        nbytes = nbytes if type(nbytes) is int else 0  # a count, typed on load (old files' text included)
        n = n if type(n) is int and n > 0 else world_size
        time_s, max_s = min(node.times_s.values()), max(node.times_s.values())
        factor = bus_factor(kind, n)
        alg = nbytes / time_s if time_s > 0 and nbytes > 0 else None
        bus = alg * factor if alg is not None and factor is not None else None
        out.append(CollectiveStat(node, kind, nbytes, n, time_s, max_s, alg, bus))
    return tuple(out)


def analyze_distributed(profile: Profile, stat: str = "median", top: int = 10) -> DistributedAnalysis | None:
    """The rank comparison of a merged profile; None for a single-rank profile."""
    if not is_merged(profile):
        return None
    info = rank_info(profile)
    assert info is not None  # a merged profile has its distributed section
    fn = stat_fn(stat)
    nodes = match_nodes(profile, stat)
    attrs = _node_attrs(profile)
    rank_ids = tuple(int(r["rank"]) for r in info.ranks)
    waits = _comm_waits(nodes, rank_ids, attrs)
    rows = []
    for entry in info.ranks:
        r = int(entry["rank"])
        sums = {"compute": 0.0, "host": 0.0, "comm": 0.0}
        for node in nodes:
            if r in node.times_s and not (node.kind == "comm" and _is_wait(node, attrs)):
                sums[node.kind] += node.times_s[r]
        step = fn([float(w) for w in entry.get("wall_time_s", ())])
        rows.append(RankTimes(r, step, sums["compute"], sums["host"], sums["comm"], waits[r], step - waits[r]))
    ranks = tuple(rows)
    has_comm = any(n.kind == "comm" for n in nodes)
    spread = sorted((n for n in nodes if n.spread_s(rank_ids) > 0), key=lambda n: -n.spread_s(rank_ids))
    return DistributedAnalysis(
        world_size=info.world_size or len(ranks), backend=info.backend, stat=stat,
        ranks=ranks, missing_ranks=info.missing_ranks,
        straggler=_straggler(ranks, nodes, "collective waits" if has_comm else "step time", top),
        spread=tuple(spread[:top]), collectives=_collectives(nodes, attrs, info.world_size or len(ranks)),
        nodes=nodes, sharding=analyze_sharding(profile, stat),
    )
