"""Model and hardware FLOPs utilisation (MFU, HFU) per step and per phase, and throughput.

Definitions (those of PaLM, Megatron and torchtitan, computed from the
graph's counted FLOPs instead of a formula typed in by hand):

- **Model FLOPs** are the matmul, convolution and attention work that any
  implementation of the step must do: the forward pass's matmul-class FLOPs
  (every node of the forward phase, and of a no-grad step's ``other`` phase,
  whose op is a matmul, convolution or attention kernel) plus, when the
  step has a backward phase, twice those for the backward (its gradients
  with respect to inputs and to weights). For a transformer this is the
  familiar 6 x tokens x matmul weights + attention. Model FLOPs ignore what
  the implementation chose to do again: recomputation from activation
  checkpointing and kernels that recompute internally (flash attention's
  backward) do not raise them. Elementwise work and the optimizer count 0.
- **Hardware FLOPs** are every FLOP the step executed, as counted per node
  by the cost pass: all phases, all ops with a formula, recomputation
  included. ``hardware_matmul_flops`` is their matmul-class part.
- **MFU / HFU** = FLOPs / time / peak FLOP/s. The step's time is the
  median profiled step's wall time less its probes (``analysis.eager``),
  i.e. what an unprofiled replay takes; a phase's time is the sum of its
  nodes' times (device time where recorded). The peak is the profile's (by
  ``graphprof calibrate`` or ``trace(peaks=...)``) for the dtype carrying
  most model FLOPs, and/or one the user gives (``given_peak_flops_per_s``);
  every figure names the peak it was divided by.
- **Ranks**: a profile merged from several ranks (``graphprof merge``) is
  reported per device: FLOPs and phase times are averaged over its ranks,
  so MFU stays a fraction of one device's peak.
- **Throughput**: tokens and samples per second, when a workload says what
  one step processes (``profile/step_facts.py``), over the same step time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from graphprof.analysis.eager import replay_step_times_s
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.node_arrays import column_codes, column_mask, exact_sum, first_seen_codes, int_array, times_array
from graphprof.analysis.roofline import Peaks, peaks_from_meta
from graphprof.analysis.stats import stat_fn
from graphprof.profile.merge import graph_ranks
from graphprof.profile.model import GraphKind, Phase, Profile
from graphprof.profile.step_facts import Workload, workload as recorded_workload

#: Forward matmul-class ops: the work a model's FLOP count is made of.
MODEL_OP_TYPES = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "convolution", "_convolution",
    "cudnn_convolution", "mkldnn_convolution", "conv1d", "conv2d", "conv3d", "_flash_attention_forward",
    "_efficient_attention_forward",
})
#: Backward counterparts, counted in hardware matmul FLOPs only.
BACKWARD_OP_TYPES = frozenset({"convolution_backward", "_flash_attention_backward", "_efficient_attention_backward"})
#: Backward of the forward work: grad w.r.t. inputs and w.r.t. weights.
BACKWARD_FACTOR = 2
#: Phases in the order a report lists them.
PHASES = tuple(Phase)


@functools.lru_cache(maxsize=4096)
def _model_type(t: str) -> bool:
    """A forward matmul, convolution or attention kernel (judged once per op type: a profile has
    millions of nodes and a few hundred types)."""
    if t.startswith("_scaled_dot_product"):
        return not t.endswith("_backward")
    return t in MODEL_OP_TYPES


@functools.lru_cache(maxsize=4096)
def _matmul_type(t: str) -> bool:
    """A matmul, convolution or attention kernel, forward or backward."""
    return _model_type(t) or t in BACKWARD_OP_TYPES or (t.startswith("_scaled_dot_product") and t.endswith("_backward"))


@dataclass(frozen=True)
class PeakUsed:
    """A FLOP/s peak and where it came from (``calibrated`` profile peak or ``given`` by the user)."""

    flops_per_s: float
    source: str
    dtype: str | None = None


@dataclass(frozen=True)
class Utilisation:
    """MFU and HFU of one part of the step (the whole step or one phase) against one or more peaks."""

    label: str
    time_s: float
    model_flops: int
    hardware_flops: int
    hardware_matmul_flops: int

    @property
    def model_flop_per_s(self) -> float | None:
        return self.model_flops / self.time_s if self.time_s > 0 else None

    @property
    def hardware_flop_per_s(self) -> float | None:
        return self.hardware_flops / self.time_s if self.time_s > 0 else None

    def mfu(self, peak: PeakUsed) -> float | None:
        rate = self.model_flop_per_s
        return rate / peak.flops_per_s if rate is not None and peak.flops_per_s > 0 else None

    def hfu(self, peak: PeakUsed) -> float | None:
        rate = self.hardware_flop_per_s
        return rate / peak.flops_per_s if rate is not None and peak.flops_per_s > 0 else None


@dataclass(frozen=True)
class UtilisationReport:
    """The step, each phase with time, each profiled step, the peaks used and throughput."""

    step: Utilisation
    phases: tuple[Utilisation, ...]
    per_step: tuple[Utilisation, ...]
    peaks: tuple[PeakUsed, ...]
    model_dtype: str | None
    stat: str
    workload: Workload | None
    #: Ranks of a merged distributed profile (FLOPs and phase times are per-device averages); 1 otherwise.
    ranks: int = 1

    @property
    def tokens_per_s(self) -> float | None:
        w = self.workload
        if w is None or w.tokens_per_step is None or self.step.time_s <= 0:
            return None
        return w.tokens_per_step / self.step.time_s

    @property
    def samples_per_s(self) -> float | None:
        w = self.workload
        if w is None or w.samples_per_step is None or self.step.time_s <= 0:
            return None
        return w.samples_per_step / self.step.time_s


def _dtype_of_most(model_ops: Iterable[tuple[tuple[str | None, ...], int]]) -> str | None:
    """The input dtype carrying most FLOPs over (input dtypes, FLOPs) of model ops; the first of equals."""
    by_dtype: dict[str, int] = {}
    for in_dtypes, flops in model_ops:
        dtype = in_dtypes[0] if in_dtypes and in_dtypes[0] else "float32"
        by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
    return max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None


def _frame_dtype_of_most(frame: NodeFrame, flops: np.ndarray, model_ops: np.ndarray) -> str | None:
    """``_dtype_of_most`` of the frame's nodes ``model_ops`` (``flops``: every node's FLOPs), summed per
    distinct ``in_dtypes`` value (in order of its first node, so the first of equals is the same)
    instead of node by node."""
    dtype_codes, dtype_sets = column_codes(frame, "in_dtypes")
    group, keys = first_seen_codes(dtype_codes[model_ops], dtype_sets)
    chosen = flops[model_ops]
    return _dtype_of_most([(key, exact_sum(chosen[group == g])) for g, key in enumerate(keys)])


def peaks_used(profile: Profile, given_peak_flops_per_s: float | None, dtype: str | None) -> tuple[PeakUsed, ...]:
    """The profile's peak for ``dtype`` (when recorded), then the user's (when given)."""
    if given_peak_flops_per_s is not None and (not math.isfinite(given_peak_flops_per_s) or given_peak_flops_per_s <= 0):
        raise ValueError(f"the peak must be a positive number of FLOP/s, not {given_peak_flops_per_s!r}")
    peaks: list[PeakUsed] = []
    recorded = peaks_from_meta(profile)
    flops_only = profile.meta.peaks.get("flops_per_s")
    if recorded is not None:
        peaks.append(PeakUsed(recorded.flops_for(dtype), "calibrated", dtype))
    elif flops_only:
        peaks.append(PeakUsed(float(flops_only), "calibrated", None))
    if given_peak_flops_per_s is not None:
        peaks.append(PeakUsed(float(given_peak_flops_per_s), "given", None))
    return tuple(peaks)


@dataclass(frozen=True)
class _FlopSums:
    """The FLOP sums of one set of nodes: taken once, shared by every part with the same nodes."""

    forward_model: int  # model ops of the forward (and other) phase
    hardware: int
    hardware_matmul: int


@dataclass(frozen=True)
class _NodeFlops:
    """The columns utilisation reads, as arrays over the node frame: FLOPs (0 where unknown), whether
    each node is a model op or matmul-class, its phase, and whether its graph is timed by probes."""

    flops: np.ndarray
    model: np.ndarray
    matmul: np.ndarray
    phase: np.ndarray  # index into PHASES
    probed: np.ndarray  # not a host-time record

    @classmethod
    def of(cls, profile: Profile) -> "_NodeFlops":
        frame = node_frame(profile)
        try:
            flops, _ = int_array(frame, "flops")
        except ValueError:  # not all integers (a profile made by hand): Python's arithmetic, as the records'
            flops = np.array([f or 0 for f in frame.column("flops")], dtype=object)
        model = column_mask(frame, "type", _model_type)
        matmul = column_mask(frame, "type", _matmul_type)
        phase_codes, phases = column_codes(frame, "phase")
        phase = np.array([PHASES.index(Phase(p)) for p in phases], dtype=np.intp)[phase_codes] if phases \
            else np.zeros(0, np.intp)
        kinds = np.array([g.kind is not GraphKind.HOST for g in profile.graphs], dtype=bool)
        probed = kinds[np.asarray(frame.column("graph_index"), dtype=np.intp)] if len(kinds) else np.zeros(0, bool)
        return cls(flops, model, matmul, phase, probed)

    def sums(self, mask: np.ndarray) -> _FlopSums:
        """The FLOP sums of the nodes of ``mask``."""
        forward_like = (self.phase == PHASES.index(Phase.FORWARD)) | (self.phase == PHASES.index(Phase.OTHER))
        return _FlopSums(_int_sum(self.flops, mask & self.model & forward_like), _int_sum(self.flops, mask),
                         _int_sum(self.flops, mask & self.matmul))


def _int_sum(values: np.ndarray, mask: np.ndarray) -> int:
    return exact_sum(values[mask])


def _part(label: str, sums: _FlopSums, time_s: float, backward_model: int = 0, ranks: int = 1) -> Utilisation:
    """FLOPs of one set of nodes (divided by ``ranks``: one device's share) over ``time_s``."""
    return Utilisation(
        label=label, time_s=time_s, model_flops=(sums.forward_model + backward_model) // ranks,
        hardware_flops=sums.hardware // ranks, hardware_matmul_flops=sums.hardware_matmul // ranks,
    )


def utilisation(profile: Profile, given_peak_flops_per_s: float | None = None, stat: str = "median",
                workload: Workload | None = None) -> UtilisationReport | None:
    """MFU/HFU of ``profile``; None when it has no profiled step or no model FLOPs.

    ``workload`` (tokens/samples per step) overrides the one recorded in the profile.
    """
    fn = stat_fn(stat)
    cols = _NodeFlops.of(profile)
    steps = replay_step_times_s(profile)
    forward = cols.probed & (cols.phase == PHASES.index(Phase.FORWARD))
    grad_forward = _int_sum(cols.flops, forward & cols.model)
    has_backward = bool((cols.probed & (cols.phase == PHASES.index(Phase.BACKWARD))).any())
    backward_model = BACKWARD_FACTOR * grad_forward if has_backward else 0
    ranks = max(1, len(set(graph_ranks(profile).values())))
    whole = cols.sums(cols.probed)
    step = _part("step", whole, fn(steps) if steps else 0.0, backward_model, ranks)
    if not steps or step.model_flops <= 0:
        return None
    frame = node_frame(profile)
    dtype = _frame_dtype_of_most(frame, cols.flops, np.flatnonzero(cols.probed & cols.model & (cols.flops != 0)))
    phases = []
    times = times_array(frame, stat, "auto")  # node_time_s of every node, taken once per profile
    for code, phase in enumerate(PHASES):
        members = cols.probed & (cols.phase == code)
        if not members.any():
            continue
        time_s = math.fsum(times[members].tolist()) / ranks  # fsum is exact: the order of the terms does not matter
        phases.append(_part(phase.value, cols.sums(members), time_s,
                            backward_model if phase is Phase.BACKWARD else 0, ranks))
    per_step = tuple(_part(f"step {s.index}", whole, t, backward_model, ranks) for s, t in zip(profile.steps, steps))
    return UtilisationReport(
        step=step, phases=tuple(phases), per_step=per_step,
        peaks=peaks_used(profile, given_peak_flops_per_s, dtype), model_dtype=dtype, stat=stat,
        workload=workload if workload is not None and not workload.empty else recorded_workload(profile), ranks=ranks,
    )


def given_peaks(profile: Profile, flops_per_s: float | None, bytes_per_s: float | None) -> Peaks | None:
    """Roofline peaks from what the user gave: both figures, or a FLOP peak with the profile's bandwidth.

    A FLOP peak alone (a datasheet figure, for MFU) keeps the profile's
    calibrated bandwidth for the roofline; without one the roofline keeps
    the profile's own peaks and only MFU/HFU use the given figure (None).
    """
    for name, value in (("flops_per_s", flops_per_s), ("bytes_per_s", bytes_per_s)):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ValueError(f"peak {name} must be a positive number, not {value!r}")
    if flops_per_s is None:
        if bytes_per_s is not None:
            raise ValueError("a bandwidth peak needs a FLOP peak with it")
        return None
    if bytes_per_s is None:
        recorded = peaks_from_meta(profile)
        return Peaks(float(flops_per_s), recorded.bytes_per_s) if recorded is not None else None
    return Peaks(float(flops_per_s), float(bytes_per_s))
