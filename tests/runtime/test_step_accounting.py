"""A whole step's nodes plus graphprof's own node add up to its wall time, on a fake clock.

The fake clock advances by an uneven amount per reading, so that a gap left
out anywhere (before the first probe, between the graph and the gradient
assignment, after it) would show as a difference in nanoseconds.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

import graphprof
from graphprof.analysis.coverage import is_host_time
from graphprof.analysis.steps import step_accounts
from graphprof.profile.model import OVERHEAD_NODE, OVERHEAD_OP


class UnevenClock:
    """Each reading is 1 to 4 us after the last (a fixed, irregular pattern)."""

    def __init__(self) -> None:
        self._now = 0
        self._steps = itertools.cycle((1_000, 3_000, 2_000, 4_000, 1_500))

    def __call__(self) -> int:
        self._now += next(self._steps)
        return self._now


def _profiled(clock: UnevenClock, calls: int = 6) -> graphprof.Profile:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 8)

    @graphprof.trace(profiling=True, clock=clock)
    def step(inp):
        opt.zero_grad(set_to_none=True)
        loss = model(inp).square().mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(calls):
        step(x)
    return step.get_profile()


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def test_nodes_plus_graphprofs_own_node_add_up_to_each_steps_wall_time() -> None:
    profile = _profiled(UnevenClock())
    assert len(profile.steps) == 4  # calls 3 to 6
    host = [g for g in profile.graphs if g.name == "host"][0]
    own = [n for n in host.nodes if n.name == OVERHEAD_NODE]
    assert len(own) == 1 and own[0].op == OVERHEAD_OP and is_host_time(own[0])
    for k, step in enumerate(profile.steps):
        total_ns = sum(_ns(n.host_time_s[k]) for _, n in profile.iter_nodes())
        assert total_ns == _ns(step.wall_time_s)
        # graphprof's own work is there and is not folded into any op's time
        assert own[0].host_time_s[k] > 0
    for account in step_accounts(profile):
        assert abs(account.unaccounted_s) < 1e-12
        assert 0 < account.coverage < 1
        assert _ns(account.nodes_s) + _ns(account.overhead_s) == _ns(account.wall_time_s)


def test_a_segmented_steps_graphs_host_gaps_and_reads_add_up_to_its_wall_time() -> None:
    """capture="dynamo" has no graphprof.overhead node: its host gaps hold all time between graphs.

    Between segments run the user's Python, torch.compile's guards and
    graphprof's own bookkeeping around each segment; the host graph's gap
    nodes take all of it (less host reads and compiles, shown or left out on
    their own), so on an uneven fake clock the nodes add up to the wall time
    of every step to the nanosecond, and nothing is unaccounted for.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 8)
    logged: list[float] = []

    @graphprof.trace(profiling=True, clock=UnevenClock(), capture="dynamo")
    def step(inp):
        opt.zero_grad(set_to_none=True)
        loss = model(inp).square().mean()
        logged.append(loss.item())  # a host read between the forward and the backward segment
        loss.backward()
        opt.step()
        return loss

    for _ in range(6):
        step(x)
    profile = step.get_profile()
    assert len(profile.steps) == 4 and len(logged) == 6
    host = next(g for g in profile.graphs if g.name == "host")
    kinds = {n.op for n in host.nodes}
    assert "host.gap" in kinds and "Tensor.item" in kinds and OVERHEAD_OP not in kinds
    for k, step_record in enumerate(profile.steps):
        total_ns = sum(_ns(n.host_time_s[k]) for _, n in profile.iter_nodes())
        assert total_ns == _ns(step_record.wall_time_s)
    for account in step_accounts(profile):
        assert abs(account.unaccounted_s) < 1e-12 and account.overhead_s == 0


def test_every_part_of_a_whole_step_call_is_in_its_nodes_or_graphprofs_own_node() -> None:
    """The whole-step path with everything graphprof does per call: keyword arguments (the
    signature flattens them), AdamW (hyperparameters read and guarded at run time), a logged
    ``.item()``, clipping, and a schedule whose warm-up calls run probes but keep nothing.

    Each call's wall time is its step graph's nodes, the gradient nodes and
    graphprof.overhead, to the nanosecond, on a clock that advances unevenly.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    logged: list[float] = []

    @graphprof.trace(profiling=True, clock=UnevenClock(), schedule=graphprof.schedule(skip_first=2, warmup=1, active=4))
    def step(batch: dict[str, torch.Tensor], scale: float = 1.0) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(batch["x"]).square().mean() * scale
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        logged.append(loss.item())
        return loss

    batch = {"x": torch.randn(4, 8)}
    for _ in range(7):
        step(batch=batch, scale=0.5)
    profile = step.get_profile()
    assert [s.index for s in profile.steps] == [3, 4, 5, 6] and len(logged) == 7
    own = [n for _, n in profile.iter_nodes() if n.op == OVERHEAD_OP]
    assert len(own) == 1
    for k, step_record in enumerate(profile.steps):
        total_ns = sum(_ns(n.host_time_s[k]) for _, n in profile.iter_nodes())
        assert total_ns == _ns(step_record.wall_time_s)
        assert own[0].host_time_s[k] > 0
    for account in step_accounts(profile):
        assert abs(account.unaccounted_s) < 1e-12 and 0 < account.coverage < 1
