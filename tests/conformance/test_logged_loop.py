"""Conformance: a BERT training step that logs a formatted loss every third call, as eager runs it.

A BERT classifier from a small config, AdamW, transformers' linear warmup
schedule stepped inside the step, the rate appended to a history on every
call and ``print(f"step {n} loss {loss.item():.4f} lr {lr:.2e}")`` every third
call; batches with and without padding (the model branches on its attention
mask). Printed, the text is formatted by the replay and every call replays a
graph (capture/printed_texts.py); written with ``sys.stdout.write``, the
logging calls cannot be one graph and run as segments while the others
replay their graphs (capture/refused_paths.py). After every call the printed
text, the losses, the parameters and the rate history equal eager's.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import Any

import pytest
import torch

import graphprof

pytest.importorskip("transformers")

from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup  # noqa: E402

CALLS = 10
pytestmark = pytest.mark.slow


def _loop(sink: str) -> tuple[Any, torch.nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=2)
    model = BertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=20)
    state: dict[str, Any] = {"n": 0, "lrs": []}

    def step(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        state["n"] += 1
        state["lrs"].append(sched.get_last_lr()[0])
        if state["n"] % 3 == 0:
            if sink == "print":
                print(f"step {state['n']} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e}")
            else:
                sys.stdout.write(f"step {state['n']} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e}\n")
        return loss.detach()

    return step, model, state


def _batch(i: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(i)
    mask = torch.ones(4, 12, dtype=torch.long)
    if i % 2:
        mask[1:, 9:] = 0
    return torch.randint(0, 100, (4, 12), generator=g), mask, torch.randint(0, 2, (4,), generator=g)


@pytest.mark.parametrize("sink", ["print", "write"])
def test_a_logged_bert_loop_replays_its_graphs_and_matches_eager(sink: str) -> None:
    eager, eager_model, eager_state = _loop(sink)
    step, model, state = _loop(sink)
    traced = graphprof.trace(step)
    modes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            texts = []
            for fn in (eager, traced):
                torch.manual_seed(1000 + i)  # the same dropout masks for both
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    loss = fn(*_batch(i))
                texts.append((out.getvalue(), loss))
            modes.append(traced.capture_mode)
            assert texts[0][0] == texts[1][0] and torch.equal(texts[0][1], texts[1][1]), f"call {i}"
            assert all(torch.equal(a, b) for a, b in zip(eager_model.parameters(), model.parameters())), f"call {i}"
            assert eager_state["lrs"] == state["lrs"]
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    if sink == "print":
        assert modes[2:] == ["whole-step"] * (CALLS - 2) and messages == [], messages
    else:
        assert modes[3:] == ["whole-step" if (i + 1) % 3 else "segments" for i in range(3, CALLS)]
        assert len(messages) == 1, messages
