"""Eval-mode attention and encoder modules replay torch's fused path, bit for bit as eager.

``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` and
``nn.TransformerEncoder`` run one fused kernel in eval mode without
autograd, and leave it whenever a capture runs: the replayed graph held the
ops one by one and differed from eager in the last bits (6e-8), silently.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal

CALLS = 5


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    if i % 2:
        pad[1:, 4:] = True
    return torch.randn(3, 6, 8, generator=g), pad


def _attention() -> Callable[..., Any]:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()

    def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
    return step


def _encoder() -> Callable[..., Any]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()

    def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return encoder(x, src_key_padding_mask=pad)
    return step


@pytest.mark.parametrize("make", [_attention, _encoder], ids=["MultiheadAttention", "TransformerEncoder"])
def test_an_eval_module_on_torchs_fused_path_replays_it_bit_for_bit(make: Callable[[], Any]) -> None:
    eager, traced = make(), graphprof.trace(make())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x, pad = _batch(i)
            expected, got = eager(x, pad), traced(x, pad)
            keep = ~pad[..., None].expand_as(expected)  # padded rows: no number eager promises
            assert torch.equal(expected[keep], got[keep]), f"call {i}"
        profile = traced.get_profile()
    assert traced.capture_mode == "whole-step"
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert any(node.op.startswith("graphprof.eager_forward") for _, node in profile.iter_nodes())


def test_a_training_module_is_captured_op_by_op() -> None:
    """No fused path in training mode: the attention's own ops are in the graph, as before."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    opt = torch.optim.SGD(mha.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = mha(x, x, x, need_weights=False)[0].pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    traced = graphprof.trace(step)
    for i in range(3):
        traced(_batch(i)[0])
    ops = {node.op for _, node in traced.get_profile().iter_nodes()}
    assert not any(op.startswith("graphprof.eager_forward") for op in ops) and any("addmm" in op or "linear" in op for op in ops), ops


def _training_then_evaluating(kind: str) -> tuple[nn.Module, torch.optim.Optimizer, Callable[..., Any]]:
    """A step that trains a module with dropout, then evaluates it (``eval()``, ``no_grad``) and puts it back
    in training mode: the evaluation takes the fused path, the training does not."""
    torch.manual_seed(0)
    module: nn.Module
    if kind == "MultiheadAttention":
        module = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
    else:
        layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.1, batch_first=True)
        module = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True)

    def run(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        if isinstance(module, nn.MultiheadAttention):
            return module(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return module(x, src_key_padding_mask=pad)

    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    held_out, held_out_pad = _batch(99)

    def step(x: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = run(x, pad).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        module.eval()
        with torch.no_grad():
            evaluated = run(held_out, held_out_pad)
        module.train()
        return loss.detach(), evaluated
    return module, opt, step


def _assert_same_optimizer_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer, where: str) -> None:
    state_a, state_b = a.state_dict()["state"], b.state_dict()["state"]
    assert state_a.keys() == state_b.keys(), where
    for key, values in state_a.items():
        for name, value in values.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_b[key][name])), f"{name} {where}"


@pytest.mark.parametrize("kind", ["MultiheadAttention", "TransformerEncoder"])
def test_an_evaluation_inside_a_training_step_replays_in_eval_mode(kind: str) -> None:
    """The step's ``eval()`` runs only in the capture call: the recorded forward sets the modes it had then.
    It ran in training mode on every replay: dropout drew from the RNG and the evaluation differed by ~1."""
    module_a, opt_a, eager = _training_then_evaluating(kind)
    module_b, opt_b, step = _training_then_evaluating(kind)
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's nested-tensor prototype notice
        for i in range(CALLS + 1):
            x, pad = _batch(i)
            torch.manual_seed(1000 + i)  # one global generator for both: each call starts from the same state
            expected = eager(x, pad)
            rng_after_eager = torch.get_rng_state()
            torch.manual_seed(1000 + i)
            got = traced(x, pad)
            where = f"after call {i}"
            assert torch.equal(torch.get_rng_state(), rng_after_eager), f"RNG state {where}"
            assert torch.equal(expected[0], got[0]), f"loss {where}"
            keep = ~_batch(99)[1][..., None].expand_as(expected[1])  # padded rows: no number eager promises
            assert torch.equal(expected[1][keep], got[1][keep]), f"evaluation {where}"
            assert_modules_equal(module_a, module_b, where)
            _assert_same_optimizer_state(opt_a, opt_b, where)
            assert [m.training for m in module_a.modules()] == [m.training for m in module_b.modules()], where
    assert traced.capture_mode == "whole-step"


def _attention_with_mismatched_masks(mode: str) -> tuple[nn.Module, Callable[..., Any]]:
    """The ``nn.Transformer`` tutorial's masks: a float causal mask and a bool padding mask, which torch's
    ``F._canonical_mask`` warns about (Python's ``warnings.warn``) on every call. In training mode the
    module's forward runs op by op, in eval mode without autograd it is recorded as one op."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).train(mode == "training")
    opt = torch.optim.SGD(mha.parameters(), lr=0.1)
    causal = nn.Transformer.generate_square_subsequent_mask(6)

    def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(mode == "training"):
            out = mha(x, x, x, key_padding_mask=pad, attn_mask=causal, need_weights=False)[0]
        if mode == "training":
            loss = out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        return out
    return mha, step


@pytest.mark.parametrize("profiling", [True, False], ids=["profiling", "plain"])
@pytest.mark.parametrize("mode", ["training", "eval"])
def test_a_warning_inside_the_modules_forward_is_issued_on_every_call(mode: str, profiling: bool) -> None:
    """While a step is captured, the modules' ``forward`` is graphprof's stand-in; a warning under it was
    not the step's, so it was issued once, by the capture call, and never by a replay."""
    module_a, eager = _attention_with_mismatched_masks(mode)
    module_b, step = _attention_with_mismatched_masks(mode)
    traced = graphprof.trace(step, profiling=profiling)
    for i in range(CALLS + 1):
        x, pad = _batch(i)
        issued = []
        for fn in (eager, traced):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = fn(x, pad)
            issued.append((out, [(w.category, str(w.message), w.filename, w.lineno) for w in caught]))
        (expected, eager_warnings), (got, traced_warnings) = issued
        where = f"call {i}"
        assert len(eager_warnings) == 1 and traced_warnings == eager_warnings, where
        keep = ~pad[..., None].expand_as(expected) if mode == "eval" else torch.ones_like(expected, dtype=torch.bool)
        assert torch.equal(expected[keep], got[keep]), where
        assert_modules_equal(module_a, module_b, where)
    assert traced.capture_mode == "whole-step"


def _evaluating_attention(where: str) -> tuple[nn.Module, Callable[..., Any]]:
    """An eval-mode attention in the autocast region ``where`` says: one the step enters around it
    ("step"), or none of its own ("caller", whose call is made in one)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()

    def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        region = torch.autocast("cpu", dtype=torch.bfloat16) if where == "step" else contextlib.nullcontext()
        with torch.no_grad(), region:
            return mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
    return mha, step


@pytest.mark.parametrize("where", ["step", "caller"])
def test_a_recorded_forward_runs_in_the_autocast_region_of_its_call(where: str) -> None:
    """The step's ``torch.autocast`` around the attention is not entered by a replay, and a replay of a call
    made inside one runs its graph with autocast off: the recorded forward ran in neither, and returned
    float32 where eager returns bfloat16."""
    model_a, eager = _evaluating_attention(where)
    model_b, step = _evaluating_attention(where)
    traced = graphprof.trace(step)
    for i in range(CALLS + 1):
        x, pad = _batch(i)
        with torch.autocast("cpu", dtype=torch.bfloat16) if where == "caller" else contextlib.nullcontext():
            expected, got = eager(x, pad), traced(x, pad)
        keep = ~pad[..., None].expand_as(expected)  # padded rows: no number eager promises
        assert expected.dtype == got.dtype and torch.equal(expected[keep], got[keep]), f"call {i}"
        assert_modules_equal(model_a, model_b, f"after call {i}")
    assert traced.capture_mode == "whole-step"
    assert any(node.op.startswith("graphprof.eager_forward") for _, node in traced.get_profile().iter_nodes())


@pytest.fixture
def fused_path_setting() -> Any:
    """``torch.backends.mha``'s fast-path setting, put back as it was after the test."""
    before = torch.backends.mha.get_fastpath_enabled()
    yield torch.backends.mha.set_fastpath_enabled
    torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("first", [False, True], ids=["enabled-later", "disabled-later"])
def test_the_fused_path_setting_of_a_call_selects_its_graph(first: bool, fused_path_setting: Any) -> None:
    """A graph captured with the fused path disabled holds the attention op by op, where eager takes the
    fused path once it is enabled again (other last bits): the setting is part of the graph's key."""
    eager, traced = _attention(), graphprof.trace(_attention())
    for i in range(CALLS + 1):
        fused_path_setting(first if i < 3 else not first)
        x, pad = _batch(i)
        expected, got = eager(x, pad), traced(x, pad)
        keep = ~pad[..., None].expand_as(expected)
        assert torch.equal(expected[keep], got[keep]), f"call {i}"
    assert traced.capture_mode == "whole-step"


def test_a_step_that_enables_the_fused_path_for_its_evaluation(fused_path_setting: Any) -> None:
    """The step's own ``set_fastpath_enabled(True)`` before the attention is not run by a replay: the
    recorded forward enables the path as the capture call had it, and the step's ``False`` after it is kept."""
    def make() -> Callable[..., Any]:
        attend = _attention()

        def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            torch.backends.mha.set_fastpath_enabled(True)
            out = attend(x, pad)
            torch.backends.mha.set_fastpath_enabled(False)
            return out
        return step

    eager, traced = make(), graphprof.trace(make())
    for i in range(CALLS + 1):
        fused_path_setting(False)
        x, pad = _batch(i)
        expected = eager(x, pad)
        fused_path_setting(False)
        got = traced(x, pad)
        assert torch.backends.mha.get_fastpath_enabled() is False, f"call {i}"
        keep = ~pad[..., None].expand_as(expected)
        assert torch.equal(expected[keep], got[keep]), f"call {i}"
    assert traced.capture_mode == "whole-step"



def test_a_step_that_leaves_the_fused_path_disabled_is_not_replayed(fused_path_setting: Any) -> None:
    """A replay would not disable the path again where the caller enabled it between calls: the step runs
    another way, and says so once."""
    def make() -> tuple[nn.Module, Callable[..., Any]]:
        torch.manual_seed(0)
        mha = nn.MultiheadAttention(8, 2, batch_first=True)
        opt = torch.optim.SGD(mha.parameters(), lr=0.1)

        def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            torch.backends.mha.set_fastpath_enabled(False)  # a library's set-up, run on every call
            loss = mha(x, x, x, key_padding_mask=pad, need_weights=False)[0].pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        return mha, step

    (module_a, eager), (module_b, step) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS + 1):
            x, pad = _batch(i)
            fused_path_setting(True)
            expected = eager(x, pad)
            fused_path_setting(True)
            got = traced(x, pad)
            assert torch.backends.mha.get_fastpath_enabled() is False, f"call {i}"
            assert torch.equal(expected, got), f"call {i}"
            assert_modules_equal(module_a, module_b, f"after call {i}")
    refusals = [str(w.message) for w in caught if str(w.message).startswith("graphprof")]
    assert len(refusals) == 1 and "fused attention path" in refusals[0], refusals
