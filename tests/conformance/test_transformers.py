"""Conformance: Hugging Face models train whole-step, bitwise equal to eager.

Each architecture (tests/conformance/models.py) is built twice from one seed
from a small config (no download) and trained 6 steps, one copy eagerly and
one under ``graphprof.trace`` with probes; after every call losses,
parameters, buffers, gradients and the RNG state are bitwise equal. Masked
models alternate batches without and with padding: transformers decides from
``padding_mask.all()`` whether to build a mask, so each gets one graph per
path behind a value guard, and the capture mode stays whole-step.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import graphprof

pytest.importorskip("transformers")

from graphprof.capture.checkpointing import RECOMPUTE_SCOPE  # noqa: E402
from tests.conformance.models import ARCHITECTURES, Architecture, build  # noqa: E402
from tests.helpers import assert_bitwise_against_eager, assert_modules_equal  # noqa: E402

STEPS = 6
#: Architectures whose batches alternate between no padding and padding: two paths.
MASKED = {"llama", "bert", "t5", "gpt2-checkpointed"}
#: Architectures whose loss keeps the unpadded tokens only, padded three ways in turn: one graph per count.
COUNTED = {"electra"}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[a.name for a in ARCHITECTURES])
def test_training_steps_are_whole_step_and_bitwise(arch: Architecture) -> None:
    fn = assert_bitwise_against_eager(lambda: build(arch), arch.inputs, STEPS, profiling=True)
    assert fn.capture_mode == "whole-step"
    assert fn.captures == (2 if arch.name in MASKED else 3 if arch.name in COUNTED else 1)
    profile = fn.get_profile()
    assert profile.meta.capture == "fx"
    nodes = [n for g in profile.graphs for n in g.nodes]
    assert {"forward", "backward", "optimizer"} <= {n.phase for n in nodes}
    if arch.name in MASKED:
        guards = profile.meta.extra["guards"]
        assert any("masking_utils.py" in g for g in guards), guards
    if arch.name == "gpt2-checkpointed":
        recomputed = [n for n in nodes if RECOMPUTE_SCOPE in n.scope]
        assert recomputed and {n.phase for n in recomputed} == {"backward"}
        assert all(n.module.startswith("transformer.h.") for n in recomputed if n.type == "addmm")



def test_a_tokenizer_s_batch_encoding_trains_whole_step_and_bitwise() -> None:
    """The batch as a tokenizer returns it (a ``BatchEncoding``, a ``UserDict``), the step popping its
    labels as Trainer's ``compute_loss`` does: one graph per path, and each caller's batch loses its
    labels as in eager."""
    from transformers import BatchEncoding

    bert = next(a for a in ARCHITECTURES if a.name == "bert")

    def make() -> tuple[torch.nn.Module, Any]:
        model, _ = build(bert)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(batch: BatchEncoding) -> torch.Tensor:
            labels = batch.pop("labels")
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(**batch).logits, labels)
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    torch.manual_seed(0)
    eager_model, eager = make()
    torch.manual_seed(0)
    model, step = make()
    traced = graphprof.trace(step, profiling=True)
    for i in range(STEPS):
        (plain,) = bert.inputs(i)
        a, b = BatchEncoding(dict(plain)), BatchEncoding(dict(plain))
        torch.manual_seed(1000 + i)
        loss_a = eager(a)
        torch.manual_seed(1000 + i)
        loss_b = traced(b)
        assert torch.equal(loss_a, loss_b), f"loss differs after call {i}"
        assert sorted(a) == sorted(b) == ["attention_mask", "input_ids"]
        assert_modules_equal(eager_model, model, f"after call {i}")
    assert traced.capture_mode == "whole-step" and traced.captures == 2
