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

import pytest

pytest.importorskip("transformers")

from graphprof.capture.checkpointing import RECOMPUTE_SCOPE  # noqa: E402
from tests.conformance.models import ARCHITECTURES, Architecture, build  # noqa: E402
from tests.helpers import assert_bitwise_against_eager  # noqa: E402

STEPS = 6
#: Architectures whose batches alternate between no padding and padding: two paths.
MASKED = {"llama", "bert", "t5", "gpt2-checkpointed"}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[a.name for a in ARCHITECTURES])
def test_training_steps_are_whole_step_and_bitwise(arch: Architecture) -> None:
    fn = assert_bitwise_against_eager(lambda: build(arch), arch.inputs, STEPS, profiling=True)
    assert fn.capture_mode == "whole-step"
    assert fn.captures == (2 if arch.name in MASKED else 1)
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
