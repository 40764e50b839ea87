"""Conformance: Whisper with layerdrop trains as segments without raising, bitwise equal to eager.

``if torch.rand([]) < layerdrop`` skips a layer on a random draw, which no
check can know before a replay, so the step runs as torch.compile segments
after one warning. A dropped encoder layer leaves the next one a gradient
whose layout the compiled backward was not traced with, and that
backward's ``view`` raised on most calls where eager ran on (torch.compile
with its own AOTAutograd backend raises there too). The compiled backwards
now reshape instead (capture/segmented.py, ``_reshape_views``).

With decoder layerdrop, each decoder layer's cross-attention reads the
encoder's output twice, and the layers fall in separate graphs: the
gradients of those reads are now handed to autograd one by one, as eager
adds them (capture/gradient_uses.py); parameters differed in the last bits
from the first call before.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

from tests.helpers import assert_bitwise_against_eager

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def _whisper(encoder_layerdrop: float, decoder_layerdrop: float) -> tuple[nn.Module, Callable[..., Any]]:
    import transformers
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    transformers.logging.set_verbosity_error()
    config = WhisperConfig(vocab_size=100, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
                           dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
                           encoder_layerdrop=encoder_layerdrop, decoder_layerdrop=decoder_layerdrop, suppress_tokens=None,
                           begin_suppress_tokens=None)
    model = WhisperForConditionalGeneration(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(input_features=features, labels=labels).loss
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


def _inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(2, 8, 32, generator=g), torch.randint(3, 100, (2, 8), generator=g)


@pytest.mark.parametrize("layerdrop", [(0.3, 0.0), (0.0, 0.3)], ids=["encoder", "decoder"])
def test_whisper_with_layerdrop_trains_as_segments_bitwise(layerdrop: tuple[float, float]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(lambda: _whisper(*layerdrop), _inputs, 5, profiling=True)
    assert traced.capture_mode == "segments"
    refusals = [str(w.message) for w in caught if "cannot capture" in str(w.message)]
    assert len(refusals) == 1 and "random numbers" in refusals[0], refusals
