"""The rank comparison of a merged distributed profile, as terminal text.

One section of ``graphprof report`` on a merged profile: time per rank
(compute, host, communication, waiting), the straggler and its slow nodes,
the nodes whose time differs most across ranks, and the bandwidth of each
collective (NCCL-tests bus bandwidth); for FSDP2 ranks, the overlap of
communication with computation and the sharded memory (``sharding_text``).
"""

from __future__ import annotations

from tabulate import tabulate

from graphprof.analysis.distributed import DistributedAnalysis, NodeAcrossRanks
from graphprof.render.escape import terminal_line
from graphprof.render.sharding_text import render_sharding
from graphprof.render.units import clip, share_of, format_bytes, format_time

_WIDTH = 34


def _clipped(text: str | None, width: int = _WIDTH) -> str:
    """A name from the profile for a cell: shown as ``terminal_line`` does, cut to ``width``."""
    return clip(terminal_line(text) if text else text, width, empty="-")


def _share(part: float, whole: float) -> str:
    return share_of(part, whole, digits=0)


def _where(node: NodeAcrossRanks) -> str:
    return _clipped(node.module or node.source or node.name, 30)


def _ranks(analysis: DistributedAnalysis) -> list[str]:
    rows = [[r.rank, format_time(r.step_time_s), format_time(r.compute_s), format_time(r.host_s),
             format_time(r.comm_s), f"{format_time(r.comm_wait_s)} ({_share(r.comm_wait_s, r.step_time_s)})",
             format_time(r.busy_s)] for r in analysis.ranks]
    headers = ["rank", "step", "compute", "host", "comm", "comm wait", "busy"]
    missing = (f"; no profile from rank(s) {', '.join(map(str, analysis.missing_ranks))}"
               if analysis.missing_ranks else "")
    return [f"distributed: {len(analysis.ranks)} of {analysis.world_size} ranks ({terminal_line(analysis.backend or 'unknown backend')})"
            f", {analysis.stat} over profiled steps{missing}",
            tabulate(rows, headers=headers, disable_numparse=True),
            "comm = collective nodes from launch to completion (DDP bucket allreduces overlap backward); "
            "comm wait = time beyond the fastest rank in each collective; busy = step - comm wait"]


def _straggler(analysis: DistributedAnalysis) -> list[str]:
    s = analysis.straggler
    if s is None:
        return ["straggler: - (one rank)"]
    verdict = "straggler" if s.significant else "slowest rank (within noise)"
    lines = [f"{verdict}: rank {s.rank}, busy {format_time(s.busy_s)} per step vs {format_time(s.others_busy_s)} "
             f"on the other ranks (median): {format_time(s.lag_s)} more, found from {s.basis}"]
    if s.nodes:
        rows = [[terminal_line(n.node.graph), n.node.node_id, _clipped(n.node.type, 18), _where(n.node), format_time(n.time_s),
                 format_time(n.others_s), format_time(n.excess_s)] for n in s.nodes]
        lines.append(f"nodes that make rank {s.rank} slow (its time minus the other ranks' median)")
        lines.append(tabulate(rows, headers=["graph", "#", "op", "where", f"rank {s.rank}", "others", "excess"],
                              disable_numparse=True))
    return lines


def _spread(analysis: DistributedAnalysis) -> list[str]:
    ranks = tuple(r.rank for r in analysis.ranks)
    if not analysis.spread:
        return ["spread across ranks: none (every node takes the same time on every rank)"]
    rows = []
    for n in analysis.spread:
        times = [n.time_on(r) for r in ranks]
        rows.append([terminal_line(n.graph), n.node_id, _clipped(n.type, 18), _where(n), format_time(min(times)),
                     format_time(max(times)), format_time(n.spread_s(ranks)), n.slowest_rank()])
    return [f"spread across ranks (top {len(rows)}; a node a rank does not run counts 0 s there)",
            tabulate(rows, headers=["graph", "#", "op", "where", "min", "max", "spread", "slowest"],
                     disable_numparse=True)]


def _collectives(analysis: DistributedAnalysis) -> list[str]:
    if not analysis.collectives:
        return ["collectives: none recorded"]
    rows = [[terminal_line(c.node.graph), c.node.node_id, _clipped(c.node.name, 24), terminal_line(c.collective), format_bytes(c.bytes), c.world_size,
             format_time(c.time_s), format_time(c.max_time_s), format_bytes(c.algbw_bytes_per_s, "B/s"),
             format_bytes(c.busbw_bytes_per_s, "B/s")] for c in analysis.collectives]
    return ["collectives (time: shortest over ranks; bus bandwidth as NCCL-tests: allreduce algbw x 2(n-1)/n)",
            tabulate(rows, headers=["graph", "#", "name", "collective", "bytes", "n", "time", "max", "algbw", "busbw"],
                     disable_numparse=True)]


def render_distributed(analysis: DistributedAnalysis) -> str:
    """The whole rank comparison, sub-sections separated by blank lines."""
    parts = [_ranks(analysis), _straggler(analysis), _spread(analysis), _collectives(analysis)]
    if analysis.sharding is not None:
        parts.append([render_sharding(analysis.sharding)])
    return "\n\n".join("\n".join(p) for p in parts)
