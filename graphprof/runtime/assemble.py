"""A Profile from a runner's recorded steps and the policy's settings.

Kept apart from both runners so that meta (device, peaks, schedule, probe
cost, distributed) is assembled one way whatever ran the step.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import torch

from graphprof.profile.model import Profile, ScheduleInfo
from graphprof.passes.instrument import Clock, probe_cost_ns
from graphprof.runtime.calibrate import find_calibration
from graphprof.runtime.collect import build_profile, profile_meta
from graphprof.runtime.device_clock import profile_device
from graphprof.runtime.runner import RecordedSteps
from graphprof.runtime.schedule import Schedule


@functools.lru_cache(maxsize=None)
def _probe_cost_s() -> float:
    return probe_cost_ns() * 1e-9


def assemble_profile(name: str, recorded: RecordedSteps, *, clock: Clock, peaks: dict[str, float] | None,
                     schedule: Schedule | None, cycle: int | None) -> Profile:
    """The Profile of ``recorded``; ``peaks`` given by hand win over the cached calibration."""
    schedule_info = None
    if schedule is not None:
        schedule_info = ScheduleInfo(skip_first=schedule.skip_first, wait=schedule.wait, warmup=schedule.warmup,
                                     active=schedule.active, repeat=schedule.repeat, cycle=cycle)
    device_type, device_name, device = profile_device(recorded.timeline, recorded.graph_modules)
    peaks_note = ""
    if peaks is None:
        calibration = find_calibration(device_type)
        peaks = calibration.peaks if calibration is not None else None
        threads = torch.get_num_threads()
        if device_type == "cpu" and calibration is not None and calibration.threads != threads:
            peaks_note = (f"peaks measured with {calibration.threads} threads, the step ran with {threads} "
                                   f"(run `graphprof calibrate --threads {threads}`)")
    # Probe cost is that of the real host clock; a fake clock (tests) costs nothing.
    probe_cost_s = _probe_cost_s() if clock is time.perf_counter_ns else 0.0
    meta = profile_meta(name, recorded.mode, probe_cost_s, peaks=peaks, device_type=device_type,
                        device_name=device_name, **recorded.notes)
    meta = replace(meta, schedule=schedule_info, device=device, distributed=recorded.distributed,
                   peaks_note=peaks_note, recompiles=recorded.recompiles)
    return build_profile(recorded.graphs, recorded.steps, meta)
