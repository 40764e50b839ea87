"""Overlap of communication with computation, and sharded memory, per FSDP2 rank, as terminal text.

A sub-section of the rank comparison in ``graphprof report`` of a merged
profile (``analysis/sharding.py`` says how the figures are made).
"""

from __future__ import annotations

from tabulate import tabulate

from graphprof.analysis.sharding import ShardingAnalysis
from graphprof.render.units import format_bytes, format_time


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def render_sharding(analysis: ShardingAnalysis) -> str:
    rows = [[o.rank, format_time(o.comm_s), format_time(o.hidden_s), format_time(o.exposed_s),
             _percent(o.hidden_share)] for o in analysis.overlap]
    lines = [f"communication overlap per rank ({analysis.stat} over profiled steps)",
             tabulate(rows, headers=["rank", "comm", "hidden", "exposed", "hidden share"], disable_numparse=True),
             "comm = union of collective intervals (launch to completion); hidden = the part during which a "
             "captured graph ran; exposed = comm - hidden. On gloo (CPU) FSDP2's collectives block the computing "
             "thread, so nothing is hidden there."]
    if analysis.memory:
        rows = [[m.rank, format_bytes(m.params_bytes), format_bytes(m.grads_bytes),
                 format_bytes(m.optimizer_state_bytes), format_bytes(m.unsharded_peak_bytes),
                 format_bytes(m.total_bytes), format_bytes(m.unsharded_need_bytes), _percent(m.saving)]
                for m in analysis.memory]
        lines += ["", "sharded memory per rank (end of the last profiled step)",
                  tabulate(rows, headers=["rank", "params", "grads", "optim state", "unsharded peak", "total",
                                          "unsharded model", "share"], disable_numparse=True),
                  "params, grads, optim state = this rank's local shards; unsharded peak = most unsharded parameter "
                  "storage FSDP held at once (sampled at collective completions); unsharded model = the same "
                  "parameters, gradients and optimizer state at full size on one device"]
    return "\n".join(lines)
