"""Profile an FSDP2 (``fully_shard``) training step on every rank, merge the profiles, report.

Run (2 ranks on CPU with the gloo backend, loopback networking only):

    torchrun --nproc_per_node=2 --master_addr=127.0.0.1 examples/fsdp_train.py

or, without torchrun (the script spawns the ranks itself):

    python examples/fsdp_train.py --nproc 2

A small transformer language model gets ``fully_shard`` on every block and on
the root, and trains with AdamW. ``--slow-rank 1 --delay-ms 60`` makes rank 1
sleep inside its step, so the report names it as the straggler. Each rank
saves ``fsdp_profiles/rank<r>.json``; rank 0 merges them into
``fsdp_profiles/merged.json`` (what ``graphprof merge fsdp_profiles/rank*.json
-o merged.json`` does) and prints the report: per rank the all-gathers and
reduce-scatters with their bytes and bus bandwidth, the communication hidden
behind computation and the exposed rest, the straggler, and the memory
sharding saves. ``--compare`` also trains a second, unprofiled copy of the
model, its steps interleaved with the profiled ones, and prints the ratio of
their median step times.

FSDP2 steps are profiled with segmented capture (torch.compile segments): a
whole-step graph would freeze FSDP's all-gather, free and reduce-scatter
decisions, so graphprof falls back with one warning, leaves FSDP's hooks to
run as they do, and times the collectives they issue.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
import warnings
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import graphprof


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _model(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # same initial weights on every rank
    model = TinyLM(args.vocab, args.width, args.depth)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _train_step(args: argparse.Namespace, rank: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    model, opt = _model(args)
    delay_s = args.delay_ms / 1000 if rank == args.slow_rank else 0.0

    def train_step(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        time.sleep(delay_s)  # the deliberate straggler (0 s on the other ranks)
        loss.backward()
        opt.step()
        return loss

    return train_step


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    """One rank: profiled steps (with --compare, interleaved with the same steps unprofiled), its profile file."""
    profiled = graphprof.trace(_train_step(args, rank), profiling=True)
    steps = {"profiled": profiled}
    if args.compare:
        steps["unprofiled"] = _train_step(args, rank)  # a second model: same weights, same data
    times: dict[str, list[float]] = {name: [] for name in steps}
    data = torch.Generator().manual_seed(rank)  # each rank its own shard of data
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.compile segments.*")  # the expected FSDP2 fallback
        for i in range(args.steps):  # call 1 eager, call 2 compiles, calls 3.. are profiled
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=data)
            targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=data)
            for name, step in steps.items():
                dist.barrier()  # ranks start each step together
                start = time.perf_counter()
                step(tokens, targets)
                if i >= 2:
                    times[name].append(time.perf_counter() - start)
    os.makedirs(args.out, exist_ok=True)
    profiled.get_profile().save(os.path.join(args.out, f"rank{rank}.json"))
    print(f"rank {rank}: saved {args.out}/rank{rank}.json", flush=True)
    if args.compare:
        ours, theirs = statistics.median(times["profiled"]), statistics.median(times["unprofiled"])
        print(f"rank {rank}: median step {1e3 * theirs:.1f} ms unprofiled, {1e3 * ours:.1f} ms profiled "
              f"({ours / theirs:.2f}x, {len(times['profiled'])} interleaved steps each)", flush=True)
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
    parser.add_argument("--steps", type=int, default=10, help="calls of the step (the first two are not profiled)")
    parser.add_argument("--slow-rank", type=int, default=1, help="rank that sleeps in its step (-1: none)")
    parser.add_argument("--delay-ms", type=float, default=60.0, help="how long the slow rank sleeps per step")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--compare", action="store_true", help="also time the steps unprofiled")
    parser.add_argument("--out", default="fsdp_profiles", help="folder for the per-rank and merged profiles")
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
