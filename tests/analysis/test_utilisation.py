"""MFU and HFU: the GPT step's counted FLOPs equal the analytic 6TW + attention; checkpointing raises HFU only."""

from __future__ import annotations

import statistics
import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

import graphprof
from graphprof.analysis.eager import replay_step_times_s
from graphprof.analysis.utilisation import given_peaks, utilisation
from graphprof.demo.steps import gpt_adamw_step
from graphprof.profile.model import Phase, ProfileMeta
from graphprof.profile.step_facts import Workload, with_workload
from tests.render.export_profiles import make_profile, node

PEAKS = {"flops_per_s": 1e11, "bytes_per_s": 2e10}
B, T = 4, 32


def _gpt(checkpointed: bool):
    demo = gpt_adamw_step(batch_size=B, seq_len=T)
    if checkpointed:
        for block in demo.model.blocks:
            forward = block.forward
            block.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(forward)

    def step(x, y):
        with set_checkpoint_early_stop(False):  # recompute whole blocks: the analytic count below
            return demo.step_fn(x, y)

    traced = graphprof.trace(step, peaks=PEAKS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(5):
            traced(*demo.make_inputs(i))
    return demo.model, traced.get_profile()


@pytest.fixture(scope="module")
def plain():
    return _gpt(False)


@pytest.fixture(scope="module")
def checkpointed():
    return _gpt(True)


def _attention_forward_flops(model) -> int:
    # q @ k^T and att @ v per layer: 2 matmuls of 2 * B * T * T * d FLOPs (all heads together).
    return model.n_layer * 2 * 2 * B * T * T * model.d_model


def test_model_flops_are_6TW_plus_attention(plain) -> None:
    model, profile = plain
    u = utilisation(profile)
    tokens, weights = B * T, model.matmul_weight_count()
    assert u.step.model_flops == 6 * tokens * weights + 3 * _attention_forward_flops(model)
    by_phase = {p.label: p for p in u.phases}
    assert by_phase["forward"].model_flops == 2 * tokens * weights + _attention_forward_flops(model)
    assert by_phase["backward"].model_flops == 2 * by_phase["forward"].model_flops
    assert by_phase["optimizer"].model_flops == 0 and by_phase["optimizer"].hardware_flops > 0
    # executed: every counted FLOP of the step, elementwise and optimizer included
    assert u.step.hardware_flops == sum(n.flops or 0 for _, n in profile.iter_nodes())


def test_mfu_and_hfu_divide_by_the_peak_they_name(plain) -> None:
    _, profile = plain
    u = utilisation(profile, given_peak_flops_per_s=5e11)
    calibrated, given = u.peaks
    assert (calibrated.source, calibrated.flops_per_s, calibrated.dtype) == ("calibrated", 1e11, "float32")
    assert (given.source, given.flops_per_s) == ("given", 5e11)
    step_s = statistics.median(replay_step_times_s(profile))
    assert u.step.time_s == pytest.approx(step_s)
    assert u.step.mfu(calibrated) == pytest.approx(u.step.model_flops / step_s / 1e11)
    assert u.step.mfu(given) == pytest.approx(u.step.mfu(calibrated) / 5)
    assert u.step.hfu(given) == pytest.approx(u.step.hardware_flops / step_s / 5e11)
    assert [s.time_s for s in u.per_step] == pytest.approx(list(replay_step_times_s(profile)))


def test_checkpointing_raises_hfu_by_the_recomputation_not_mfu(plain, checkpointed) -> None:
    model, before = plain
    _, after = checkpointed
    u0, u1 = utilisation(before), utilisation(after)
    assert u1.step.model_flops == u0.step.model_flops
    d = model.d_model
    block_forward = model.n_layer * 2 * B * T * (3 * d * d + d * d + 4 * d * d + 4 * d * d) + _attention_forward_flops(model)
    assert u1.step.hardware_matmul_flops - u0.step.hardware_matmul_flops == block_forward
    assert u1.step.hardware_flops - u0.step.hardware_flops > block_forward  # layer norms, softmax, gelu again
    recomputed = sum(n.flops or 0 for _, n in after.iter_nodes() if n.phase is Phase.BACKWARD) - \
        sum(n.flops or 0 for _, n in before.iter_nodes() if n.phase is Phase.BACKWARD)
    assert u1.step.hardware_flops - u1.step.model_flops == pytest.approx(
        u0.step.hardware_flops - u0.step.model_flops + recomputed)


def test_throughput_from_the_workload_given_or_recorded(plain) -> None:
    _, profile = plain
    assert utilisation(profile).tokens_per_s is None
    recorded = with_workload(profile, tokens_per_step=B * T)
    u = utilisation(recorded)
    assert u.tokens_per_s == pytest.approx(B * T / u.step.time_s) and u.samples_per_s is None
    given = utilisation(recorded, workload=Workload(samples_per_step=B))
    assert given.samples_per_s == pytest.approx(B / given.step.time_s) and given.tokens_per_s is None


def test_synthetic_inference_step_has_no_backward_factor() -> None:
    nodes = [node(0, "addmm", flops=1000, phase=Phase.OTHER, in_dtypes=("bfloat16",)),
             node(1, "relu", (0,), flops=10, phase=Phase.OTHER)]
    meta = ProfileMeta(function="infer", peaks={"flops_per_s": 1e6, "bytes_per_s": 1e6, "flops_per_s_bfloat16": 4e6})
    u = utilisation(make_profile(nodes, steps=1, meta=meta, wall_time_s=1e-3))
    assert (u.step.model_flops, u.step.hardware_flops) == (1000, 1010)
    assert u.model_dtype == "bfloat16" and u.peaks[0].flops_per_s == 4e6
    assert u.step.mfu(u.peaks[0]) == pytest.approx(1000 / 1e-3 / 4e6)
    no_peak = utilisation(make_profile(nodes, steps=1, wall_time_s=1e-3))
    assert no_peak.peaks == () and no_peak.step.model_flop_per_s == pytest.approx(1e6)


def test_no_model_flops_or_bad_peaks() -> None:
    assert utilisation(make_profile([node(0, "relu", flops=5)], steps=1, wall_time_s=1e-3)) is None
    p = make_profile([node(0, "mm", flops=5)], steps=1, wall_time_s=1e-3)
    with pytest.raises(ValueError, match="positive"):
        utilisation(p, given_peak_flops_per_s=-1.0)
    with pytest.raises(ValueError, match="positive"):
        Workload(tokens_per_step=0)
    with pytest.raises(ValueError, match="needs a FLOP peak"):
        given_peaks(p, None, 1e9)
    assert given_peaks(p, 1e9, None) is None  # no bandwidth to pair it with: MFU only
    calibrated = make_profile([node(0, "mm", flops=5)], steps=1, meta=ProfileMeta(peaks=PEAKS))
    assert given_peaks(calibrated, 1e9, None).bytes_per_s == PEAKS["bytes_per_s"]


def test_report_prints_the_peak_used_and_throughput(plain) -> None:
    _, profile = plain
    text = profile.report(peaks={"flops_per_s": 5e11}, tokens_per_step=B * T)
    assert "utilisation against peak 100 GFLOP/s float32 (calibrated); 500 GFLOP/s (given)" in text
    assert "MFU (given)" in text and "HFU (calibrated)" in text and "tokens/s (128 tokens per step)" in text
    assert torch.__version__  # the report ran on a real traced profile


def test_merged_ranks_are_reported_per_device() -> None:
    from graphprof.profile.merge import merge_profiles
    from tests.distributed.synthetic import rank_profile

    merged = merge_profiles([rank_profile(0), rank_profile(1)])
    u = utilisation(merged)
    assert u.ranks == 2
    assert u.step.model_flops == 2_000_000  # one device's matmul, not both ranks' together
    (forward,) = [p for p in u.phases if p.label == "forward"]
    assert forward.time_s == pytest.approx(0.010) and forward.model_flops == 2_000_000
