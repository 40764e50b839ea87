"""Communication overlap and sharded memory per rank, from a merged FSDP2 profile.

Each FSDP2 rank's profile carries, per recorded step, the length of the
union of its collectives' intervals (``comm_s``), the part of it during
which a captured graph ran (``hidden_s``), and its memory at the end of the
step (``runtime/fsdp_comm.py`` says how each is measured). Here, per rank
and under the report's statistic over the steps every rank has:

- **communication** time, **hidden** (overlapped with computation) and
  **exposed** (the rest: the step waits for it), with the hidden share. By
  construction exposed + hidden = communication, per step and so per
  statistic when the statistic is taken of communication and hidden and
  exposed is their difference. On gloo (CPU) FSDP2's collectives are
  synchronous on the computing thread, so the hidden share is 0 there.
- **memory**: the rank's local shards of parameters, gradients and
  optimizer state, the most unsharded parameter storage alive at once, their
  sum, and what the same model needs unsharded (parameters, gradients and
  optimizer state at full size), with the ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from graphprof.analysis.stats import stat_fn
from graphprof.profile.merge import is_merged, rank_info
from graphprof.profile.model import Profile


@dataclass(frozen=True)
class RankOverlap:
    """One rank's communication and how much of it computation hid."""

    rank: int
    comm_s: float
    hidden_s: float

    @property
    def exposed_s(self) -> float:
        return self.comm_s - self.hidden_s

    @property
    def hidden_share(self) -> float | None:
        return self.hidden_s / self.comm_s if self.comm_s > 0 else None


@dataclass(frozen=True)
class RankMemory:
    """One rank's bytes with sharding, against the same model's need unsharded."""

    rank: int
    params_bytes: int
    grads_bytes: int
    optimizer_state_bytes: int
    unsharded_peak_bytes: int
    unsharded_need_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_state_bytes + self.unsharded_peak_bytes

    @property
    def saving(self) -> float | None:
        """The rank's bytes as a share of the unsharded need (0.5: half)."""
        return self.total_bytes / self.unsharded_need_bytes if self.unsharded_need_bytes > 0 else None


@dataclass(frozen=True)
class ShardingAnalysis:
    """Overlap and memory of every FSDP2 rank of a merged profile."""

    stat: str
    overlap: tuple[RankOverlap, ...]
    memory: tuple[RankMemory, ...]


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


def _memory(rank: int, record: Mapping[str, Any]) -> RankMemory:
    need = sum(_int(record.get(k)) for k in ("unsharded_params_bytes", "unsharded_grads_bytes",
                                              "unsharded_optimizer_state_bytes"))
    return RankMemory(rank, _int(record.get("params_bytes")), _int(record.get("grads_bytes")),
                      _int(record.get("optimizer_state_bytes")), _int(record.get("unsharded_peak_bytes")), need)


def analyze_sharding(profile: Profile, stat: str = "median") -> ShardingAnalysis | None:
    """Overlap and memory per FSDP2 rank; None when no rank of a merged profile carries FSDP data."""
    if not is_merged(profile):
        return None
    fn = stat_fn(stat)
    kept = [str(s.index) for s in profile.steps]
    overlap, memory = [], []
    info = rank_info(profile)
    for entry in info.ranks if info is not None else ():
        fsdp = entry.get("fsdp")
        steps = fsdp.get("steps") if isinstance(fsdp, Mapping) else None
        if not isinstance(steps, Mapping):
            continue
        records = [steps[k] for k in kept if isinstance(steps.get(k), Mapping)]
        if not records:
            continue
        rank = int(entry["rank"])
        comm = fn([float(r.get("comm_s", 0.0)) for r in records])
        hidden = min(comm, fn([float(r.get("hidden_s", 0.0)) for r in records]))
        overlap.append(RankOverlap(rank, comm, hidden))
        last = records[-1].get("memory")
        if isinstance(last, Mapping):
            memory.append(_memory(rank, last))
    if not overlap:
        return None
    return ShardingAnalysis(stat, tuple(overlap), tuple(memory))
