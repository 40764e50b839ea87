"""New data given to a parameter or buffer inside the step (``p.data = ...``, ``vector_to_parameters``).

The assignment is no op of the trace: a replay computed the new values and
dropped them, silently. It is replayed where the step makes it
(capture/data_assignments.py): the tensor, the same object, gets the new
storage the graph computed, as eager's gets the one its ops computed. What a
replay cannot repeat (a shape change, a tensor the step made) is refused,
and the parameters get their own data back before the step runs again
another way.

Each test runs an eager twin and a traced twin and compares, after every
call, results, parameters, buffers, gradients, optimizer state, version
counters and which tensors got new storage or share it.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

import graphprof

from tests.helpers import assert_modules_equal

#: What a setup builds: every module the step uses (one module), its optimizer, the step.
Setup = tuple[nn.Module, torch.optim.Optimizer, Callable[..., Any]]


def _data(model: nn.Module) -> list[torch.Tensor]:
    """The data of every parameter and buffer of ``model``, held: its storage cannot be reused meanwhile."""
    return [t.data for t in [*model.parameters(), *model.buffers()]]


def _holders(t: torch.Tensor) -> int:
    """How many tensors (and storage objects) hold ``t``'s storage."""
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


def _storage_facts(model: nn.Module, before: list[torch.Tensor], versions: bool) -> tuple[Any, ...]:
    """Per tensor of ``model``: whether it got new storage since ``before`` (``_data`` then), how many hold
    the storage it had then (no more than eager's once it was replaced), its version counter (when
    ``versions``) and ``requires_grad``; and which tensors share storage (by their positions)."""
    tensors = [*model.parameters(), *model.buffers()]
    addresses = [t.data_ptr() for t in tensors]
    shared = [addresses.index(a) for a in addresses]
    return (tuple((a != old.data_ptr(), _holders(old), t._version if versions else None, t.requires_grad)
                  for t, a, old in zip(tensors, addresses, before)), tuple(shared))


def _assert_same_optimizer(a: torch.optim.Optimizer, b: torch.optim.Optimizer, model_a: nn.Module,
                           model_b: nn.Module, where: str) -> None:
    """The optimizers' states are equal, and each is keyed by the same parameter of its model."""
    index_a = {id(p): i for i, p in enumerate(model_a.parameters())}
    index_b = {id(p): i for i, p in enumerate(model_b.parameters())}
    assert [index_a[id(p)] for p in a.state] == [index_b[id(p)] for p in b.state], f"state keys differ {where}"
    for p, q in zip(a.state, b.state):
        for name, value in a.state[p].items():
            other = b.state[q][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, \
                f"optimizer state {name} differs {where}"


def _twins(make: Callable[[], Setup], inputs: Callable[[int], tuple], calls: int = 5,
           versions: bool = True) -> tuple[Any, list[str]]:
    """Run ``make()``'s step eagerly and traced for ``calls`` calls, comparing everything after each;
    returns the traced function and graphprof's warnings. ``versions``: compare version counters too (not
    for a refused capture: putting back what its call wrote counts as writes)."""
    torch.manual_seed(0)
    model_a, opt_a, step_a = make()
    torch.manual_seed(0)
    model_b, opt_b, step_b = make()
    traced = graphprof.trace(step_b)
    messages: list[str] = []
    for i in range(calls):
        where = f"after call {i}"
        args = inputs(i)
        before_a, before_b = _data(model_a), _data(model_b)
        out_a = step_a(*args)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out_b = traced(*pytree.tree_map_only(torch.Tensor, torch.clone, args))
        messages += [str(w.message) for w in caught]
        for x, y in zip(pytree.tree_leaves(out_a), pytree.tree_leaves(out_b)):
            assert torch.equal(torch.as_tensor(x), torch.as_tensor(y)), f"result differs {where}"
        assert_modules_equal(model_a, model_b, where)
        assert _storage_facts(model_a, before_a, versions) == _storage_facts(model_b, before_b, versions), \
            f"new storage, versions or sharing differ {where}"
        _assert_same_optimizer(opt_a, opt_b, model_a, model_b, where)
    return traced, messages


def _batch(i: int) -> tuple[torch.Tensor]:
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(i)),)


def _ema(kind: str) -> Setup:
    """A network trained by SGD and its moving average, updated by ``.data =`` after the update and
    read later in the step (the average's output is returned)."""
    net = nn.Linear(8, 4)
    ema = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pk, pq in zip(ema.parameters(), net.parameters()):
                pk.data = pk.data * 0.99 + pq.data * 0.01
            if kind == "assigned twice":  # read between two assignments to the same tensor
                shifted = ema(x).sum()
                ema.weight.data = ema.weight.data - shifted * 1e-3
            return loss.detach(), ema(x)
    return nn.ModuleDict({"net": net, "ema": ema}), opt, step


@pytest.mark.parametrize("kind", ["once", "assigned twice"])
def test_a_moving_average_assigned_by_data_replays_whole_step(kind: str) -> None:
    """``pk.data = pk.data * m + pq.data * (1 - m)`` (MoCo, BYOL, lightly's ``update_momentum``) was refused;
    it replays the assignment: the average gets new storage holding the new values on every call."""
    traced, messages = _twins(lambda: _ema(kind), _batch)
    assert traced.capture_mode == "whole-step" and messages == []


class _Byol(nn.Module):
    """BYOL's shape: an online encoder and predictor, a target encoder (a copy) read before the update, and
    the target's moving average, with a rate from a cosine schedule of the step count, after it."""

    def __init__(self) -> None:
        super().__init__()
        self.online = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 6))
        self.predictor = nn.Linear(6, 6)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.steps = 0

    def loss(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        online = self.predictor(self.online(torch.cat([x1, x2])))
        with torch.no_grad():
            target = self.target(torch.cat([x2, x1]))
        return 2 - 2 * nn.functional.cosine_similarity(online, target.detach(), dim=-1).mean()

    def update_moving_average(self, total: int = 8) -> None:
        self.steps += 1
        tau = 1 - (1 - 0.99) * (math.cos(math.pi * self.steps / total) + 1) / 2
        for target, online in zip(self.target.parameters(), self.online.parameters()):
            target.data = target.data * tau + (1 - tau) * online.data


def _byol() -> Setup:
    model = _Byol()
    opt = torch.optim.Adam([*model.online.parameters(), *model.predictor.parameters()], lr=1e-3)

    def step(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        loss = model.loss(x1, x2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.update_moving_average()
        return loss.detach()
    return model, opt, step


def test_byol_target_average_with_a_scheduled_rate_replays_whole_step() -> None:
    def views(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    traced, messages = _twins(_byol, views, calls=6)
    assert traced.capture_mode == "whole-step" and messages == []


class _QueuedMomentumEncoder(nn.Module):
    """MoCo's builder with a queue shifted in place: the key encoder's momentum update by ``.data =`` in the
    forward, before the key encoder reads its new weights."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder_q = nn.Linear(8, 4)
        self.encoder_k = nn.Linear(8, 4)
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data.copy_(pq.data)
            pk.requires_grad = False
        self.register_buffer("queue", nn.functional.normalize(torch.randn(4, 12), dim=0))

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        q = nn.functional.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
                pk.data = pk.data * 0.9 + pq.data * 0.1
            k = nn.functional.normalize(self.encoder_k(im_k), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().detach()], dim=1) / 0.07
        with torch.no_grad():
            self.queue.copy_(torch.cat([k.T, self.queue[:, :-4]], dim=1))
        return logits


def _moco() -> Setup:
    model = _QueuedMomentumEncoder()
    opt = torch.optim.SGD(model.encoder_q.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)

    def step(im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(im_q, im_k), torch.zeros(4, dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return model, opt, step


def test_moco_momentum_update_in_the_forward_replays_whole_step() -> None:
    def pair(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    traced, messages = _twins(_moco, pair)
    assert traced.capture_mode == "whole-step" and messages == []


def _data_assigning(kind: str) -> Setup:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # its state is keyed by the parameter

    def step(x: torch.Tensor) -> torch.Tensor:
        if kind == "vector_to_parameters":  # a hand-written update through a flat vector
            loss = model(x).pow(2).mean()
            grads = torch.autograd.grad(loss, list(model.parameters()))
            with torch.no_grad():
                flat = nn.utils.parameters_to_vector(model.parameters())
                nn.utils.vector_to_parameters(flat - 0.1 * torch.cat([g.flatten() for g in grads]),
                                              model.parameters())
        else:  # weight clipping by assigning new data after the optimizer
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            model.weight.data = model.weight.data.clamp(-0.02, 0.02)
        return loss.detach()
    return model, opt, step


@pytest.mark.parametrize("kind", ["vector_to_parameters", ".data = clamp"])
def test_new_data_given_to_an_optimized_parameter_is_replayed(kind: str) -> None:
    """``p.data = ...`` is no op of the trace: a replay computed the new values and dropped them. Replayed,
    the parameter keeps its identity (the optimizer's momentum is keyed by it) and gets the new storage."""
    traced, messages = _twins(lambda: _data_assigning(kind),
                              lambda i: (torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
                                         * (10 if i == 3 else 1),))
    assert traced.capture_mode == "whole-step" and messages == []


def _shared() -> Setup:
    """Two averages of one network, the second given the first's data each call (``p.data = q.data``)."""
    net = nn.Linear(8, 4)
    first, second = copy.deepcopy(net).requires_grad_(False), copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pa, pb, pq in zip(first.parameters(), second.parameters(), net.parameters()):
                pa.data = pa.data * 0.9 + pq.data * 0.1
                pb.data = pa.data
            first.weight.mul_(1.001)  # seen through the second too: it shares the first's storage
        return loss.detach() + second(x).sum()
    return nn.ModuleDict({"net": net, "first": first, "second": second}), opt, step


def test_data_assigned_a_tensor_that_aliases_another_shares_it_as_in_eager() -> None:
    """The tensor assigned may alias state (``p.data = q.data``): the replay passes the one its ops made,
    which aliases what eager's does, so the two share storage after every call in both."""
    traced, messages = _twins(_shared, _batch)
    assert traced.capture_mode == "whole-step" and messages == []


def _growing_bank() -> Setup:
    """A memory bank buffer grown by ``.data = torch.cat(...)``: a shape the next call's graph was not traced with."""
    model = nn.Linear(8, 4)
    model.register_buffer("bank", torch.zeros(0, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        out = model(x)
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.bank.data = torch.cat([model.bank.data, out.detach()])
        return loss.detach()
    return model, opt, step


def test_data_of_another_shape_is_refused() -> None:
    traced, messages = _twins(_growing_bank, _batch, versions=False)
    assert traced.capture_mode == "segments"
    refusals = [m for m in messages if "assigns new data" in m]
    assert len(refusals) == 1 and "assigns new data to bank" in refusals[0] and "another shape" in refusals[0]


def test_data_given_to_a_tensor_the_step_made_is_refused() -> None:
    """``t.data = ...`` on a tensor the step made: the graph reads ``t`` through the op that made it, so a
    replay read the zeros, silently."""
    def make() -> Setup:
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            t = torch.zeros(4)
            t.data = x * 2
            with torch.no_grad():
                return (model(t) + t).sum()
        return model, opt, step
    traced, messages = _twins(make, lambda i: (torch.full((4,), float(i)),), versions=False)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "assigns new data to a (4,) tensor" in messages[0]




class _MomentumEncoder(nn.Module):
    """MoCo v2's builder: a key encoder updated by ``.data =`` in the forward, a queue pointer read by ``int``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder_q = nn.Linear(8, 4)
        self.encoder_k = nn.Linear(8, 4)
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data.copy_(pq.data)
            pk.requires_grad = False
        self.register_buffer("queue", torch.randn(4, 12))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        q = self.encoder_q(im_q)
        with torch.no_grad():
            for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
                pk.data = pk.data * 0.9 + pq.data * 0.1
            k = self.encoder_k(im_k)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone()], dim=1)
        ptr = int(self.queue_ptr)  # refuses the capture, after the assignments above ran
        self.queue[:, ptr:ptr + 4] = k.T
        self.queue_ptr[0] = (ptr + 4) % 12
        return logits


def _momentum_encoder() -> tuple[nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    model = _MomentumEncoder()
    opt = torch.optim.SGD(model.encoder_q.parameters(), lr=0.03, momentum=0.9)

    def step(im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(im_q, im_k), torch.zeros(4, dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


def test_data_assigned_before_a_refusal_is_given_back() -> None:
    """A capture refused after ``pk.data = ...`` (MoCo: ``int(queue_ptr)`` later in the forward) left the
    new data in place, and the step's fallback run applied the momentum update a second time."""
    (eager_model, eager), (model, step) = _momentum_encoder(), _momentum_encoder()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal and the uncompiled forward say so once each
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            im_q, im_k = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
            assert torch.equal(eager(im_q, im_k), traced(im_q.clone(), im_k.clone())), f"loss differs on call {i}"
            for (name, a), (_, b) in zip(eager_model.state_dict().items(), model.state_dict().items()):
                assert torch.equal(a, b), f"{name} differs after call {i}"
    assert traced.capture_mode == "segments"
