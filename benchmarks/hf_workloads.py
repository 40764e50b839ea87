"""Hugging Face-style training steps for the overhead and coverage rows: small BERT and GPT-2 with AdamW.

Why: the demo ResNet, GPT and tiny MLP are graphprof's own models; users
profile ``transformers`` models trained with AdamW, gradient clipping and a
loss they log every step (``loss.item()``), and that step is what the
overhead (probes / eager) and coverage targets must hold on too. Both models
are built from a config (random weights, nothing downloaded), small enough
for a CPU benchmark run, with the shapes of the real thing (attention masks,
token-type and position embeddings, tied LM head).

Each builder returns a ``DemoStep`` like ``graphprof.demo.steps.DEMO_STEPS``'s,
so ``benchmarks.overhead`` and ``benchmarks.coverage_threads`` measure them
the same way (``workload_step`` finds either kind by name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from graphprof.demo.steps import DEMO_STEPS, DemoStep

VOCAB = 1000
BATCH = 8
SEQ = 64
#: Overhead targets (graph with probes / graph without) as for the demo GPT step.
TARGETS = {"hf-bert": 1.05, "hf-gpt2": 1.05}


def _quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, logged: list[float]) -> Callable[..., torch.Tensor]:
    def step_fn(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        logged.append(loss.item())  # what a training loop logs every step
        return loss
    return step_fn


def _inputs(labels_like_ids: bool, num_labels: int = 3) -> Callable[[int], tuple[Any, ...]]:
    def make_inputs(index: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(10_007 + index)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[: BATCH // 2, SEQ - SEQ // 4:] = 0  # padded rows, as a real batch has
        labels = ids.clone() if labels_like_ids else torch.randint(0, num_labels, (BATCH,), generator=g)
        return ids, mask, labels
    return make_inputs


def hf_bert(seed: int = 0) -> DemoStep:
    """BertForSequenceClassification (2 layers, hidden 128) + AdamW, clipped, loss logged."""
    _quiet()
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=SEQ, num_labels=3)
    model = BertForSequenceClassification(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    logged: list[float] = []
    return DemoStep("hf-bert", model, optimizer, _step(model, optimizer, logged), _inputs(False))


def hf_gpt2(seed: int = 0) -> DemoStep:
    """GPT2LMHeadModel (2 layers, 128 wide, tied head) + AdamW, clipped, loss logged."""
    _quiet()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    logged: list[float] = []
    return DemoStep("hf-gpt2", model, optimizer, _step(model, optimizer, logged), _inputs(True))


HF_STEPS: dict[str, Callable[..., DemoStep]] = {"hf-bert": hf_bert, "hf-gpt2": hf_gpt2}


def workload_step(name: str, seed: int = 0) -> DemoStep:
    """A demo step (``resnet``, ``gpt``, ``tiny-mlp``, ...) or a Hugging Face one (``hf-bert``, ``hf-gpt2``)."""
    if name in HF_STEPS:
        return HF_STEPS[name](seed=seed)
    return DEMO_STEPS[name](seed=seed)


WORKLOAD_NAMES = (*sorted(DEMO_STEPS), *HF_STEPS)
