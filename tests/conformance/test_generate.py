"""Conformance: ``generate()`` under ``no_grad`` on a small Llama.

Greedy decoding to ``max_new_tokens`` branches only on values computed from
its inputs (the padding check of the attention mask, the length criterion):
value guards keep it whole-step, one graph per padding path. With an
end-of-sequence token, whether to stop is read from the generated tokens: one
warning, segments, and the same tokens as eager.

The number of new tokens comes from a variable, as a script's argument
would: ``generate`` formats the length into a message on every call, which
refused whole-step capture until a formatted setting became a guard
(``tests/capture/test_formatted_numbers.py``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import graphprof  # noqa: E402
from tests.conformance.models import BATCH, SEQ, VOCAB, _mask  # noqa: E402

pytestmark = pytest.mark.slow


def _generate(eos: int | None, new_tokens: int) -> Any:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         eos_token_id=eos, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()

    def generate(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)

    return generate


def _run(eos: int | None, calls: int, new_tokens: int = 4) -> tuple[Any, list[str]]:
    generate = _generate(eos, new_tokens)
    traced = graphprof.trace(_generate(eos, new_tokens))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(i))
            mask = _mask(i, left=True)
            assert torch.equal(generate(ids, mask), traced(ids, mask)), f"tokens differ at call {i}"
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def test_greedy_generate_to_a_fixed_length_is_whole_step() -> None:
    traced, messages = _run(eos=None, calls=6)
    assert messages == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2


def test_generate_with_an_end_token_falls_back_with_one_warning() -> None:
    # Segments compile once per sequence length: two calls (both padding paths) of two tokens each.
    traced, messages = _run(eos=5, calls=2, new_tokens=2)
    assert len(messages) == 1 and "model's or optimizer's state" in messages[0], messages
    assert traced.capture_mode == "segments"
