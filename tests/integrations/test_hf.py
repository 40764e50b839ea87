"""The Hugging Face Trainer, profiled in one line: a tiny GPT-2 trains bitwise as without graphprof."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

import graphprof.integrations.hf as gp_hf  # noqa: E402
from graphprof.analysis.utilisation import utilisation  # noqa: E402
from graphprof.profile.step_facts import eager_calls  # noqa: E402

BATCH, SEQ, VOCAB, WIDTH, LAYERS = 4, 32, 128, 32, 2


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, the same every time; labels are the inputs (the model shifts them)."""

    def __init__(self) -> None:
        self.ids = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(tmp_path: Path, profile: bool, accumulation: int = 1, steps: int = 9, **options: Any):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=WIDTH, n_layer=LAYERS, n_head=2,
                        bos_token_id=0, eos_token_id=0)  # built offline from a config: no weights downloaded
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(output_dir=str(tmp_path / ("p" if profile else "e")), per_device_train_batch_size=BATCH,
                             max_steps=steps, logging_steps=1,
                             gradient_accumulation_steps=accumulation, report_to="none", use_cpu=True, save_strategy="no",
                             dataloader_num_workers=0, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    profiler = gp_hf.profile_trainer(trainer, **options) if profile else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in caught if "graphprof" in str(w.message)], "the steps replay: no warning"
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, model, losses, profiler


def test_trainer_steps_profiled_with_results_bitwise_equal(tmp_path: Path) -> None:
    _, eager_model, eager_losses, _ = _train(tmp_path, profile=False)
    trainer, model, losses, profiler = _train(tmp_path, profile=True)
    assert losses == eager_losses and len(losses) == 9
    eager_state, state = eager_model.state_dict(), model.state_dict()
    assert all(torch.equal(eager_state[k], state[k]) for k in eager_state)
    assert "training_step" not in trainer.__dict__  # the trainer has its own method back after training

    assert profiler.traced.capture_mode == "whole-step" and profiler.traced.captures == 1
    profile = profiler.get_profile()
    assert len(profile.steps) >= 2 and profile.node_count > 100
    calls = eager_calls(profile)
    assert calls is not None and len(calls.wall_time_s) == gp_hf.DEFAULT_EAGER_STEPS and calls.first_is_cold
    u = utilisation(profile)
    tokens = BATCH * SEQ
    matmul_weights = LAYERS * (WIDTH * 3 * WIDTH + WIDTH * WIDTH + 2 * WIDTH * 4 * WIDTH) + WIDTH * VOCAB
    attention = LAYERS * 2 * 2 * BATCH * SEQ * SEQ * WIDTH
    assert u.step.model_flops == 6 * tokens * matmul_weights + 3 * attention
    assert u.tokens_per_s == pytest.approx(tokens / u.step.time_s)
    assert u.samples_per_s == pytest.approx(BATCH / u.step.time_s)
    assert "utilisation against peak" in profile.report() or "no peak known" in profile.report()


def test_gradient_accumulation_replays_a_few_graphs_bitwise(tmp_path: Path) -> None:
    """With accumulation the micro-batches meet gradients absent (the first after the optimizer's
    zero_grad) or present, and the loop around the step changes the trainer's Python state
    (``current_flos`` set to ``0`` then added floats to, ``log_history`` appended to) that the step
    never reads: a few graphs, one per kind of micro-batch, replay to the end, without a warning."""
    _, eager_model, eager_losses, _ = _train(tmp_path, profile=False, accumulation=2, steps=8)
    # One eager micro-batch: graphprof captures before the Trainer's first update creates AdamW's state.
    trainer, model, losses, profiler = _train(tmp_path, profile=True, accumulation=2, steps=8, eager_steps=1)
    assert losses == eager_losses and len(losses) == 8
    eager_state, state = eager_model.state_dict(), model.state_dict()
    assert all(torch.equal(eager_state[k], state[k]) for k in eager_state)
    traced = profiler.traced
    assert traced.capture_mode == "whole-step" and traced.captures == 2
    assert len(profiler.get_profile().steps) >= 2


def test_bad_eager_steps() -> None:
    with pytest.raises(ValueError, match="eager_steps"):
        gp_hf.TrainerProfiler(object(), eager_steps=-1)
