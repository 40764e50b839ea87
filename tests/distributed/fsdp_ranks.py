"""What each rank of the FSDP2 test runs (a process of its own, gloo on 127.0.0.1).

A small transformer language model with ``fully_shard`` on every block and on
the root, AdamW, ``STEPS`` training steps; on each rank:

1. unprofiled (the reference): loss, local parameter shards, AdamW moments
   and gradient shards after every step;
2. the same, traced with graphprof (``capture="auto"``): rank ``SLOW_RANK``
   sleeps ``DELAY_S`` inside its step, so it is the straggler;
3. the step traced with ``capture="fx"``, which must refuse.

Everything a test checks goes to ``out_dir``: the rank's profile and a
``rank<r>.pt`` with the values, the warnings and the byte counts the
collectives must have (computed here from parameter shapes, not read from
FSDP).
"""

from __future__ import annotations

import datetime
import math
import os
import time
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import graphprof
from tests.distributed.ranks import fx_error

SLOW_RANK = 1
DELAY_S = 0.1
STEPS = 4  # call 1 eager, call 2 falls back and compiles segments, calls 3 and 4 are profiled
VOCAB, WIDTH, BLOCKS = 65, 32, 2  # an odd vocabulary: the embedding and head shards are padded


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _step(rank: int, profiled: bool, capture: str = "auto") -> tuple[Callable[..., Any], nn.Module, Any]:
    torch.manual_seed(0)
    model = TinyLM()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    delay_s = DELAY_S if profiled and rank == SLOW_RANK else 0.0

    def train_step(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        time.sleep(delay_s)  # changes no value
        loss.backward()
        opt.step()
        return loss

    return (graphprof.trace(train_step, capture=capture) if profiled else train_step), model, opt


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    return [(torch.randint(0, VOCAB, (4, 8), generator=data), torch.randint(0, VOCAB, (4, 8), generator=data))
            for _ in range(STEPS)]


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[torch.Tensor]]:
    params = list(model.parameters())
    return {
        "params": [p.to_local().clone() for p in params],
        "grads": [p.grad.to_local().clone() for p in params],
        "grad_types": [type(p.grad).__name__ for p in params],
        "moments": [opt.state[p][k].to_local().clone() for p in params for k in ("exp_avg", "exp_avg_sq")],
    }


def _run(step: Callable[..., Any], model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
    losses, states = [], []
    for tokens, targets in _batches(rank):
        # Ranks start each step together: the first profiled step must not carry the skew of the
        # compiling call before it (a barrier outside the step changes no value).
        dist.barrier()
        losses.append(step(tokens, targets).detach().clone())
        states.append(_state(model, opt))
    return {"losses": losses, "states": states}


def _padded_bytes(module: nn.Module, world: int) -> int:
    """Bytes FSDP2 gathers for ``module``'s own parameters: dim 0 padded to a multiple of the world size."""
    own = [p for name, p in module.named_parameters() if not name.startswith("blocks.")]
    return sum(math.ceil(p.shape[0] / world) * world * (p[0].numel() if p.dim() > 1 else 1) * p.element_size()
               for p in own)


def _expected(world: int, rank: int) -> dict[str, Any]:
    model = TinyLM()
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    local = sum(p.chunk(world)[rank].numel() * p.element_size() if len(p.chunk(world)) > rank else 0 for p in params)
    return {
        "gather_bytes": {"root": _padded_bytes(model, world),
                         **{f"blocks.{i}": _padded_bytes(b, world) for i, b in enumerate(model.blocks)}},
        "local_param_bytes": local,
        # parameters, gradients and AdamW's two moments at full size, plus one 4-byte step count per parameter
        "unsharded_need_bytes": 4 * numel * 4 + 4 * len(params),
        "unsharded_param_bytes": 4 * numel,
    }


def rank_main(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        result: dict[str, Any] = {"rank": rank, "expected": _expected(world_size, rank)}
        step, model, opt = _step(rank, profiled=False)
        result["eager"] = _run(step, model, opt, rank)

        traced, model, opt = _step(rank, profiled=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["traced"] = _run(traced, model, opt, rank)
        result["warnings"] = [(str(w.message), w.filename) for w in caught]
        traced.get_profile().save(os.path.join(out_dir, f"fsdp_rank{rank}.json"))

        refused, model, opt = _step(rank, profiled=True, capture="fx")
        result["fx_error"] = fx_error(refused, *_batches(rank)[0])
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
