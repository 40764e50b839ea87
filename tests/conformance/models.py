"""Small Hugging Face models built offline from configs, each with a training step.

Shared by the conformance tests and ``benchmarks/conformance.py``. Every
model is built from a config (random weights, no download), trained with a
real optimizer, and fed batches that exercise what the library branches on:
attention masks with and without padding in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

VOCAB = 64
SEQ = 8
BATCH = 2


@dataclass(frozen=True)
class Architecture:
    """How to build one model and its step, and the arguments of call ``i``."""

    name: str
    build: Callable[[], tuple[nn.Module, Callable[..., Any]]]
    inputs: Callable[[int], tuple]


def _quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


def _mask(i: int, left: bool = False) -> torch.Tensor:
    """All ones on even calls; on odd calls the second row has two padding positions."""
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if i % 2:
        if left:
            mask[1, :2] = 0
        else:
            mask[1, -2:] = 0
    return mask


def _ids(i: int, salt: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(100 * salt + i))


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, clip: float | None = None) -> Callable[..., Any]:
    def step(**batch: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss.detach()
    return step


def _kw(step: Callable[..., Any]) -> Callable[..., Any]:
    """The traced function takes one dict of tensors (a batch, as a DataLoader yields)."""
    def call(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return step(**batch)
    return call


# -- decoder-only: Llama, left padding, grouped-query attention, AdamW + clipping ---------
def _llama() -> tuple[nn.Module, Callable[..., Any]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attention_dropout=0.1)
    model = LlamaForCausalLM(config).train()
    return model, _kw(_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), clip=1.0))


def _llama_inputs(i: int) -> tuple:
    ids, mask = _ids(i), _mask(i, left=True)
    return ({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)},)


# -- encoder with attention mask and padding: BERT sequence classification -----------------
def _bert() -> tuple[nn.Module, Callable[..., Any]]:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3)
    model = BertForSequenceClassification(config).train()
    return model, _kw(_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3)))


def _bert_inputs(i: int) -> tuple:
    labels = torch.randint(0, 3, (BATCH,), generator=torch.Generator().manual_seed(i))
    return ({"input_ids": _ids(i), "attention_mask": _mask(i), "labels": labels},)


# -- encoder-decoder: T5 with masks on the encoder --------------------------------------------
def _t5() -> tuple[nn.Module, Callable[..., Any]]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).train()
    return model, _kw(_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3)))


def _t5_inputs(i: int) -> tuple:
    return ({"input_ids": _ids(i), "attention_mask": _mask(i), "labels": _ids(i, salt=1)},)


# -- vision: ViT image classification, SGD with momentum -------------------------------------
def _vit() -> tuple[nn.Module, Callable[..., Any]]:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=5, hidden_dropout_prob=0.1)
    model = ViTForImageClassification(config).train()
    return model, _kw(_train_step(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)))


def _vit_inputs(i: int) -> tuple:
    g = torch.Generator().manual_seed(i)
    return ({"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
             "labels": torch.randint(0, 5, (BATCH,), generator=g)},)


# -- GPT-2 with gradient checkpointing and dropout, right padding -----------------------------
def _gpt2_checkpointed() -> tuple[nn.Module, Callable[..., Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config).train()
    model.gradient_checkpointing_enable()
    return model, _kw(_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3)))


def _gpt2_inputs(i: int) -> tuple:
    ids, mask = _ids(i), _mask(i)
    return ({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)},)


# -- a loss over the unpadded tokens only: ELECTRA's replaced-token detection -----------------
def _electra() -> tuple[nn.Module, Callable[..., Any]]:
    from transformers import ElectraConfig, ElectraForPreTraining

    config = ElectraConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    model = ElectraForPreTraining(config).train()  # BCE with logits over ``logits[attention_mask == 1]``
    return model, _kw(_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3)))


def _electra_inputs(i: int) -> tuple:
    """Batches padded by 0, 1 and 2 positions in turn: the loss keeps 16, 15 or 14 tokens."""
    replaced = torch.randint(0, 2, (BATCH, SEQ), generator=torch.Generator().manual_seed(50 + i))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - i % 3:] = 0
    return ({"input_ids": _ids(i), "attention_mask": mask, "labels": replaced},)


ARCHITECTURES = (
    Architecture("llama", _llama, _llama_inputs),
    Architecture("bert", _bert, _bert_inputs),
    Architecture("t5", _t5, _t5_inputs),
    Architecture("vit", _vit, _vit_inputs),
    Architecture("gpt2-checkpointed", _gpt2_checkpointed, _gpt2_inputs),
    Architecture("electra", _electra, _electra_inputs),
)


def build(arch: Architecture) -> tuple[nn.Module, Callable[..., Any]]:
    _quiet()
    return arch.build()
