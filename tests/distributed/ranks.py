"""What each rank of the distributed tests runs (in a process of its own, gloo on 127.0.0.1).

``launch`` starts ``world_size`` processes with ``torch.multiprocessing``
(spawn) and waits for them with a deadline; ``rank_main`` runs, on each rank:

1. a DDP training step, unprofiled (the reference);
2. the same step traced with graphprof (``capture="auto"``), same seeds;
   rank ``SLOW_RANK`` sleeps ``DELAY_S`` inside its step, so it is the
   straggler (the sleep does not change any value);
3. a step that averages gradients with ``dist.all_reduce`` itself, unprofiled
   and traced (whole-step capture of ``c10d`` collectives), and traced with
   ``capture="dynamo"`` (functional collectives);
4. a DDP step traced with ``capture="fx"``, which must refuse.

Everything a test checks is written to ``out_dir``: the profiles, and a
``rank<r>.pt`` with losses, parameters, DDP's bucket sizes, warnings, errors.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import graphprof
from graphprof.capture.errors import CaptureError

SLOW_RANK = 1
DELAY_S = 0.1
STEPS = 6  # call 1 eager, call 2 captures or compiles, calls 3..6 are profiled
BUCKET_CAP_MB = 1


class Net(nn.Module):
    """About 1.4 MB of parameters: two gradient buckets of DDP with ``bucket_cap_mb=1``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))))


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own data: averaging matters
    return [(torch.randn(16, 64, generator=data), torch.randint(0, 10, (16,), generator=data)) for _ in range(STEPS)]


def _run(step: Callable[..., torch.Tensor], rank: int) -> list[torch.Tensor]:
    return [step(x, y).detach().clone() for x, y in _batches(rank)]


def _ddp_step(rank: int, profiled: bool, capture: str = "auto") -> tuple[Any, nn.Module, Any]:
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(), bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    delay_s = DELAY_S if rank == SLOW_RANK else 0.0

    def ddp_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        time.sleep(delay_s)
        loss.backward()
        opt.step()
        return loss

    return (graphprof.trace(ddp_step, capture=capture) if profiled else ddp_step), model, opt


def _allreduce_step(profiled: bool, capture: str = "auto") -> tuple[Any, nn.Module]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    world = dist.get_world_size()

    def allreduce_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        return loss

    return (graphprof.trace(allreduce_step, capture=capture) if profiled else allreduce_step), model


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def rank_main(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Everything one rank does; results go to ``out_dir``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two ranks share the cores: no oversubscribed thread pools (as torchrun does)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        result: dict[str, Any] = {"rank": rank}
        step, model, _ = _ddp_step(rank, profiled=False)
        result["ddp_losses_eager"], result["ddp_params_eager"] = _run(step, rank), _params(model)

        traced, model, _ = _ddp_step(rank, profiled=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["ddp_losses_traced"] = _run(traced, rank)
        result["ddp_params_traced"] = _params(model)
        result["warnings"] = [str(w.message) for w in caught if "graphprof" in str(w.message)]
        buckets = model.reducer._get_zeros_like_grad_buckets()
        result["bucket_bytes"] = {b.index(): b.buffer().numel() * b.buffer().element_size() for b in buckets}
        result["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        traced.get_profile().save(os.path.join(out_dir, f"ddp_rank{rank}.json"))

        step, model = _allreduce_step(profiled=False)
        result["ar_losses_eager"], result["ar_params_eager"] = _run(step, rank), _params(model)
        traced, model = _allreduce_step(profiled=True)
        result["ar_losses_traced"], result["ar_params_traced"] = _run(traced, rank), _params(model)
        result["ar_grad_bytes"] = [p.numel() * p.element_size() for p in model.parameters()]
        traced.get_profile().save(os.path.join(out_dir, f"allreduce_rank{rank}.json"))
        traced, model = _allreduce_step(profiled=True, capture="dynamo")  # functional collectives
        result["ar_losses_dynamo"], result["ar_params_dynamo"] = _run(traced, rank), _params(model)
        traced.get_profile().save(os.path.join(out_dir, f"allreduce_dynamo_rank{rank}.json"))

        refused, model, _ = _ddp_step(rank, profiled=True, capture="fx")
        result["fx_error"] = fx_error(refused, *_batches(rank)[0])
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def fx_error(step: Callable[..., Any], *args: Any) -> str | None:
    """What ``capture="fx"`` raises on the call that captures (the first runs eagerly); None if nothing."""
    step(*args)
    try:
        step(*args)
    except CaptureError as exc:
        return str(exc)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(world_size: int, out_dir: str, deadline_s: float = 240.0,
           main: Callable[[int, int, int, str], None] = rank_main) -> None:
    """Run ``main`` (``rank_main``) on ``world_size`` spawned processes; raise if one fails or the deadline passes."""
    context = torch.multiprocessing.start_processes(
        main, args=(world_size, free_port(), out_dir), nprocs=world_size, join=False, start_method="spawn")
    end = time.monotonic() + deadline_s
    while not context.join(timeout=max(0.1, end - time.monotonic())):
        if time.monotonic() > end:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            raise TimeoutError(f"the {world_size} ranks did not finish within {deadline_s:.0f} s")
