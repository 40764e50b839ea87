"""Find aten ops that write an argument their schema does not mark as written.

A failed capture is undone from a copy-on-write log that trusts each op's
schema (``Tensor(a!)``). An op that writes without saying so (batch norm's
running statistics) must be listed in ``graphprof.capture.snapshot.UNDECLARED_WRITES``.
This script runs training steps over the layers and optimizers graphprof's
cost and memory tables cover (norms in training mode, RNNs, attention,
dropout, embeddings with max_norm, every common optimizer in its for-loop,
foreach and fused forms) on CPU under a dispatch mode that copies every
tensor argument before each aten call and compares it after; an argument that changed without a write annotation is reported, with
whether the undo log already knows it and whether graphprof's cost table
knows the op.

Usage: python -m benchmarks.undeclared_writes (exit status 1 when an undeclared write is not listed)
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    return bool(torch.equal(a, b))


class _Watch(TorchDispatchMode):
    """Records (op schema name, argument name) for every undeclared change of an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, set[str]] = defaultdict(set)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        schema = func._schema
        declared = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        named = list(zip((a.name for a in schema.arguments if not a.kwarg_only), args)) + list(kwargs.items())
        before = []
        for name, value in named:
            if name in declared:
                continue
            for t in tree_flatten(value)[0]:
                if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta:
                    before.append((name, t, t.detach().clone()))
        out = func(*args, **kwargs)
        for name, t, copy in before:
            if not _same(t.detach(), copy):
                self.found[schema.name].add(name)
        return out


def _workloads() -> list[tuple[str, Any]]:
    """Training steps over the layers and optimizers whose ops graphprof's cost table covers."""
    from torch import nn

    def step(module: nn.Module, x: torch.Tensor, opt: type = torch.optim.SGD, **opt_kw: Any) -> Any:
        def run() -> None:
            module.train()
            params = [p for p in module.parameters() if p.requires_grad]
            optimizer = opt(params, lr=0.01, **opt_kw) if params else None
            for _ in range(2):
                out = module(x)
                out = out[0] if isinstance(out, tuple) else out
                out.float().square().mean().backward()
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad()
        return run

    img = torch.randn(2, 3, 8, 8)
    seq = torch.randn(2, 5, 8)
    return [
        ("BatchNorm1d", step(nn.BatchNorm1d(8), torch.randn(4, 8))),
        ("BatchNorm2d", step(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), img)),
        ("BatchNorm3d", step(nn.BatchNorm3d(3), torch.randn(2, 3, 4, 4, 4))),
        ("InstanceNorm2d(track_running_stats)", step(nn.InstanceNorm2d(3, affine=True, track_running_stats=True), img)),
        ("GroupNorm", step(nn.GroupNorm(1, 3), img)),
        ("LayerNorm+Adam", step(nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), seq, torch.optim.Adam)),
        ("AdamW foreach", step(nn.Linear(8, 8), seq, torch.optim.AdamW, foreach=True)),
        ("AdamW fused", step(nn.Linear(8, 8), seq, torch.optim.AdamW, fused=True)),
        ("SGD momentum", step(nn.Linear(8, 8), seq, torch.optim.SGD, momentum=0.9, foreach=False)),
        ("RMSprop", step(nn.Linear(8, 8), seq, torch.optim.RMSprop)),
        ("Adagrad", step(nn.Linear(8, 8), seq, torch.optim.Adagrad)),
        ("RReLU", step(nn.Sequential(nn.Linear(8, 8), nn.RReLU()), seq)),
        ("Dropout", step(nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)), seq)),
        ("Embedding(max_norm)", step(nn.Embedding(10, 8, max_norm=1.0), torch.tensor([[1, 2, 3]]))),
        ("LSTM", step(nn.LSTM(8, 8, batch_first=True), seq)),
        ("GRU", step(nn.GRU(8, 8, batch_first=True), seq)),
        ("MultiheadAttention", lambda m=nn.MultiheadAttention(8, 2, batch_first=True): m(seq, seq, seq)[0].sum().backward()),
        ("Conv+MaxPool+AvgPool", step(nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1)), img)),
    ]


def scan() -> tuple[dict[str, set[str]], int]:
    """The undeclared writes every workload's ops make, and the number of workloads run."""
    watch = _Watch()
    torch.manual_seed(0)
    workloads = _workloads()
    for _, run in workloads:
        with watch:
            run()
    return watch.found, len(workloads)


def main(argv: list[str] | None = None) -> int:
    import graphprof.passes.cost  # noqa: F401 - registers the cost table
    from graphprof.capture.snapshot import UNDECLARED_WRITES
    from graphprof.passes.cost_formulas import lookup

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    start = time.perf_counter()
    found, runs = scan()
    print(f"{runs} workloads in {time.perf_counter() - start:.1f} s; ops writing undeclared arguments: {len(found)}")
    missing = 0
    for name, arguments in sorted(found.items()):
        listed = set(UNDECLARED_WRITES.get(name, ((), None))[0])
        packet = getattr(torch.ops.aten, name.split("::", 1)[1], None)
        costed = packet is not None and any(lookup(getattr(packet, o)) is not None for o in packet.overloads())
        unknown = sorted(arguments - listed)
        missing += bool(unknown)
        print(f"  {name}: {', '.join(sorted(arguments))}"
              f"{'' if not unknown else '  NOT IN UNDECLARED_WRITES: ' + ', '.join(unknown)}"
              f"{'  (in the cost table)' if costed else ''}")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
