"""Profile a DistributedDataParallel training step on every rank, merge the profiles, report.

Run (2 ranks on CPU with the gloo backend, loopback networking only):

    torchrun --nproc_per_node=2 --master_addr=127.0.0.1 examples/ddp_train.py

or, without torchrun (the script spawns the ranks itself):

    python examples/ddp_train.py --nproc 2

``--slow-rank 1 --delay-ms 30`` makes rank 1 sleep inside its step, so the
report names it as the straggler. Each rank saves ``ddp_profiles/rank<r>.json``;
rank 0 merges them into ``ddp_profiles/merged.json`` (what ``graphprof merge
ddp_profiles/rank*.json -o merged.json`` does) and prints the report. Then:

    graphprof report ddp_profiles/merged.json
    graphprof export ddp_profiles/merged.json -o ddp.trace.json   # one process per rank

DDP steps are profiled with segmented capture (torch.compile segments): a
whole-step graph cannot replay DDP's gradient averaging, so graphprof falls
back with a warning, and times each gradient bucket's allreduce with a DDP
communication hook that keeps DDP's numerics.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import graphprof


class MLP(nn.Module):
    """About 3 MB of parameters: three gradient buckets with ``bucket_cap_mb=1``."""

    def __init__(self, width: int = 512, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        x = torch.relu(self.fc3(x))
        return self.head(x)


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    """One rank: DDP model, profiled steps, this rank's profile file."""
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(MLP(), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    delay_s = args.delay_ms / 1000 if rank == args.slow_rank else 0.0

    @graphprof.trace(profiling=True)
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        time.sleep(delay_s)  # the deliberate straggler (0 s on the other ranks)
        loss.backward()
        opt.step()
        return loss

    data = torch.Generator().manual_seed(rank)  # each rank its own shard of data
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.compile segments.*")  # the expected DDP fallback
        warnings.filterwarnings("ignore", message=".*time.sleep.*")  # dynamo on the deliberate sleep
        for _ in range(args.steps):  # call 1 eager, call 2 compiles, calls 3.. are profiled
            x, y = torch.randn(64, 512, generator=data), torch.randint(0, 10, (64,), generator=data)
            loss = train_step(x, y)
    os.makedirs(args.out, exist_ok=True)
    train_step.get_profile().save(os.path.join(args.out, f"rank{rank}.json"))
    print(f"rank {rank}: loss {loss.item():.4f}, saved {args.out}/rank{rank}.json", flush=True)
    dist.barrier()
    if rank == 0:
        from graphprof.profile.merge import merge_profiles

        ranks = [graphprof.load(os.path.join(args.out, f"rank{r}.json")) for r in range(world_size)]
        merged = merge_profiles(ranks)
        merged.save(os.path.join(args.out, "merged.json"))
        print(merged.report(top=5))
        print(f"\nsaved {args.out}/merged.json; try: graphprof report {args.out}/merged.json")


def _spawned(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1: ranks sharing cores must not oversubscribe them
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        train(rank, world_size, args)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="calls of the step (the first two are not profiled)")
    parser.add_argument("--slow-rank", type=int, default=1, help="rank that sleeps in its step (-1: none)")
    parser.add_argument("--delay-ms", type=float, default=30.0, help="how long the slow rank sleeps per step")
    parser.add_argument("--out", default="ddp_profiles", help="folder for the per-rank and merged profiles")
    parser.add_argument("--nproc", type=int, default=2, help="ranks to spawn when not started by torchrun")
    args = parser.parse_args()
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
        try:
            train(dist.get_rank(), dist.get_world_size(), args)
        finally:
            dist.destroy_process_group()
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_spawned, args=(args.nproc, port, args), nprocs=args.nproc)


if __name__ == "__main__":
    main()
