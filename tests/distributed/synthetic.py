"""Hand-built per-rank profiles (torch-free) for the merge and analysis tests.

Each rank has a compute graph (one matmul), a host graph (one gap) and a
comm graph (DDP bucket allreduces, as graphprof's comm hook records them);
every time is given by the caller, so tests derive expected figures from
their own inputs.
"""

from __future__ import annotations

from typing import Sequence

from graphprof.profile.records import AttrValue, seconds_to_ns
from graphprof.profile.model import DistributedInfo, GraphKind, GraphRecord, NodeRecord, Phase, Profile, ProfileMeta, StepRecord


def comm_node(node_id: int, nbytes: int, world: int, times: Sequence[float], kind: str = "allreduce",
              source: str = "ddp_comm_hook") -> NodeRecord:
    attrs: tuple[tuple[str, AttrValue], ...] = tuple(sorted({"collective": kind, "bytes": nbytes, "world_size": world,
                          "source": source, "bucket": node_id}.items()))
    return NodeRecord(id=node_id, name=f"{kind} bucket {node_id}", op=f"c10d.{kind}", type=kind, phase=Phase.BACKWARD,
                      flops=0, bytes_read=nbytes, bytes_written=nbytes, host_time_ns=seconds_to_ns(tuple(times)), attrs=attrs)


def rank_profile(rank: int, world: int = 2, steps: Sequence[int] = (2, 3, 4), compute_s: float = 0.010,
                 host_s: float = 0.002, comm_s: Sequence[float] = (0.004,), bucket_bytes: int = 1 << 20,
                 wall_s: float | None = None, backend: str = "gloo", info: DistributedInfo | None = None) -> Profile:
    """One rank's profile; every step has the same times (``comm_s``: one time per bucket)."""
    n = len(steps)
    compute = GraphRecord(0, "segment 0 forward", GraphKind.FORWARD, nodes=(
        NodeRecord(id=0, name="mm", op="aten.mm.default", type="mm", module="fc1", phase=Phase.FORWARD,
                   flops=2_000_000, bytes_read=4096, bytes_written=4096, host_time_ns=seconds_to_ns((compute_s,) * n)),))
    host = GraphRecord(1, "host", GraphKind.HOST, nodes=(
        NodeRecord(id=0, name="host gap", op="host.gap", type="host_gap", source="train.py:12",
                   host_time_ns=seconds_to_ns((host_s,) * n)),))
    comm = GraphRecord(2, "comm", GraphKind.HOST, nodes=tuple(
        comm_node(i, bucket_bytes, world, (t,) * n) for i, t in enumerate(comm_s)))
    wall = wall_s if wall_s is not None else compute_s + host_s
    distributed = info if info is not None else DistributedInfo(rank=rank, world_size=world, backend=backend)
    meta = ProfileMeta(function="train_step", capture="dynamo", distributed=distributed)
    return Profile(meta=meta, steps=tuple(StepRecord(i, wall, compute_s) for i in steps),
                   graphs=(compute, host, comm))
