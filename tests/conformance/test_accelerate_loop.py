"""Conformance: the training loop of accelerate's "no_trainer" examples, in miniature, as eager runs it.

A BERT classifier from a small config, ``accelerator.prepare`` of the model,
AdamW and transformers' linear warmup schedule, two calls accumulated per
update inside ``accelerator.accumulate``, the running ``total_loss +=
loss.detach().float()`` of the examples, and ``completed_steps`` counted when
``accelerator.sync_gradients``; with and without a ``tqdm`` bar updated in the
step (its open stream refuses the whole-step capture: segments). After the
same calls the losses, parameters, counters, the running loss and the bar
equal eager's bit for bit. Eager runs first: accelerate keeps one gradient
state per process, so two loops side by side would share it.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest
import torch

import graphprof

pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
tqdm = pytest.importorskip("tqdm")

from transformers import BertConfig, BertForSequenceClassification, get_scheduler  # noqa: E402

CALLS = 8
pytestmark = pytest.mark.slow


def _loop(progress: bool) -> tuple[torch.nn.Module, dict[str, Any], Any]:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=3)
    model = BertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    sched = get_scheduler("linear", optimizer=opt, num_warmup_steps=2, num_training_steps=CALLS)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    bar = tqdm.tqdm(range(CALLS // 2), file=io.StringIO()) if progress else None
    kept: dict[str, Any] = {"completed_steps": 0, "bar": bar}
    total_loss: Any = 0

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        nonlocal total_loss
        model.train()
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            total_loss += loss.detach().float()
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            if bar is not None:
                bar.update(1)
            kept["completed_steps"] += 1
        kept["total_loss"] = total_loss
        return loss

    return model, kept, step


def _batch(i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    mask = torch.ones(4, 12, dtype=torch.long)
    return {"input_ids": torch.randint(0, 100, (4, 12), generator=g), "attention_mask": mask,
            "labels": torch.randint(0, 3, (4,), generator=g)}


def _run(progress: bool, traced: bool) -> tuple[torch.nn.Module, dict[str, Any], list[torch.Tensor], Any]:
    model, kept, step = _loop(progress)
    fn = graphprof.trace(step, profiling=True) if traced else step
    losses = []
    for i in range(CALLS):
        torch.manual_seed(100 + i)  # dropout draws: the same in both runs
        losses.append(fn(_batch(i)))
    return model, kept, losses, fn


@pytest.mark.parametrize("progress", [False, True], ids=["plain", "with a progress bar"])
def test_the_no_trainer_loop_matches_eager(progress: bool) -> None:
    model_a, kept_a, losses_a, _ = _run(progress, traced=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model_b, kept_b, losses_b, fn = _run(progress, traced=True)
    assert all(map(torch.equal, losses_a, losses_b))
    for (name, p), q in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.equal(p, q), name
    assert kept_a["completed_steps"] == kept_b["completed_steps"] == CALLS // 2
    assert torch.equal(kept_a["total_loss"], kept_b["total_loss"])
    refusals = [str(w.message) for w in caught if "cannot capture" in str(w.message)]
    if progress:
        assert kept_a["bar"].n == kept_b["bar"].n == CALLS // 2
        assert len(refusals) == 1 and "open file" in refusals[0], refusals
        assert fn.get_profile().meta.capture == "dynamo"
    else:
        assert not refusals and fn.get_profile().meta.capture == "fx"
