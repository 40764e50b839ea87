"""Conformance: Whisper with layerdrop trains as segments without raising, bitwise equal to eager.

``if torch.rand([]) < layerdrop`` skips a layer on a random draw, which no
check can know before a replay, so the step runs as torch.compile segments
after one warning. A dropped encoder layer leaves the next one a gradient
whose layout the compiled backward was not traced with, and that
backward's ``view`` raised on most calls where eager ran on (torch.compile
with its own AOTAutograd backend raises there too). The compiled backwards
now reshape instead (capture/gradient_layouts.py, ``reshape_views``).

With decoder layerdrop, each decoder layer's cross-attention reads the
encoder's output twice, and the layers fall in separate graphs: the
gradients of those reads are now handed to autograd one by one, as eager
adds them (capture/gradient_uses.py); parameters differed in the last bits
from the first call before.

wav2vec2 with its default layerdrop: dynamo runs the encoder's frame
eagerly, and its positional convolution, whose output is transposed, is a
graph of its own. AOTAutograd copied the contiguous gradient eager's add
hands it into the output's layout, and GELU's backward after it rounded
otherwise than eager's; compiled backwards now take gradients in the
layout they come in (capture/gradient_layouts.py). Parameters differed in
the last bits from the first call before.
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


def _wav2vec2() -> tuple[nn.Module, Callable[..., Any]]:
    """wav2vec2's CTC step with its default layerdrop (no SpecAugment: numpy draws): the encoder's frame runs eagerly, its
    transposed positional convolution a compiled graph of its own (capture/gradient_layouts.py)."""
    import transformers
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    transformers.logging.set_verbosity_error()
    config = Wav2Vec2Config(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.0,
                            mask_time_length=2, layerdrop=0.3, hidden_dropout=0.1, attention_dropout=0.1,
                            activation_dropout=0.1, feat_proj_dropout=0.1, pad_token_id=0, ctc_zero_infinity=True)
    model = Wav2Vec2ForCTC(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(audio: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(input_values=audio, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


def _audio(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    mask = torch.ones(2, 400, dtype=torch.long)
    mask[1, 300 + 20 * (i % 3):] = 0
    labels = torch.randint(1, 32, (2, 6), generator=g)
    labels[1, -2:] = -100
    return torch.randn(2, 400, generator=g), mask, labels


def test_wav2vec2_with_layerdrop_trains_as_segments_bitwise() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warnings are tested elsewhere
        traced = assert_bitwise_against_eager(_wav2vec2, _audio, 3, profiling=True)
    assert traced.capture_mode == "segments"
