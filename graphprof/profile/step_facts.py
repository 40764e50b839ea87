"""Facts about a traced step that are not in its graph: eager call times, and what a step processes.

Both live in ``ProfileMeta.extra`` under one documented key each, so a saved
profile keeps them and old readers ignore them:

- ``extra["eager"]`` (``EagerCalls``): host wall time of real eager calls of
  the user's function, in call order. The first call of a traced function
  runs eagerly anyway (lazily created state such as optimizer moments comes
  into existence), but that call is cold: it allocates that state, warms the
  allocator and creates kernels, so it is slower than a steady eager step.
  ``first_is_cold`` says the first time is such a call; analyses compare the
  warm ones (``warm_time_s``) with the replayed graph.
- ``extra["workload"]`` (``Workload``): how many tokens and/or samples one
  call of the step processes, from which throughput is reported.

Writers are the runtime (``eager_note``) and integrations; analyses read
with ``eager_calls`` and ``workload``. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from graphprof.profile.model import Profile

EAGER_KEY = "eager"
WORKLOAD_KEY = "workload"


@dataclass(frozen=True)
class EagerCalls:
    """Wall times (seconds) of real eager calls of the traced function, in call order."""

    wall_time_s: tuple[float, ...]
    first_is_cold: bool = True

    @property
    def warm_time_s(self) -> tuple[float, ...]:
        """The calls that were not the function's first (cold) call."""
        return self.wall_time_s[1:] if self.first_is_cold else self.wall_time_s


@dataclass(frozen=True)
class Workload:
    """What one call of the step processes: tokens and/or samples (None = not said)."""

    tokens_per_step: float | None = None
    samples_per_step: float | None = None

    def __post_init__(self) -> None:
        for name in ("tokens_per_step", "samples_per_step"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number, not {value!r}")

    @property
    def empty(self) -> bool:
        return self.tokens_per_step is None and self.samples_per_step is None


def eager_note(wall_time_s: Sequence[float], first_is_cold: bool = True) -> dict[str, Any]:
    """The ``extra`` entry for eager call times (empty when there are none), for ``assemble_profile``."""
    times = [float(t) for t in wall_time_s]
    if not times:
        return {}
    return {EAGER_KEY: {"wall_time_s": times, "first_is_cold": bool(first_is_cold)}}


def workload_note(workload: Workload) -> dict[str, Any]:
    """The ``extra`` entry for a workload (empty when it says nothing)."""
    if workload.empty:
        return {}
    return {WORKLOAD_KEY: {k: v for k, v in dataclasses.asdict(workload).items() if v is not None}}


def _with_extra(profile: Profile, note: Mapping[str, Any]) -> Profile:
    meta = dataclasses.replace(profile.meta, extra={**profile.meta.extra, **note})
    return dataclasses.replace(profile, meta=meta)


def with_eager_times(profile: Profile, wall_time_s: Sequence[float], first_is_cold: bool = False) -> Profile:
    """A copy of ``profile`` that records eager call times measured by the caller.

    For callers that time eager steps themselves (an integration, a script
    that warms up eagerly before tracing); by default none of the given
    calls counts as cold.
    """
    return _with_extra(profile, eager_note(wall_time_s, first_is_cold))


def with_workload(profile: Profile, tokens_per_step: float | None = None,
                  samples_per_step: float | None = None) -> Profile:
    """A copy of ``profile`` that records how many tokens/samples a step processes (saved with it)."""
    return _with_extra(profile, workload_note(Workload(tokens_per_step, samples_per_step)))


def eager_calls(profile: Profile) -> EagerCalls | None:
    """The eager call times recorded in ``profile``, or None (a malformed entry counts as none)."""
    raw = profile.meta.extra.get(EAGER_KEY)
    if not isinstance(raw, Mapping):
        return None
    times = raw.get("wall_time_s")
    if not isinstance(times, (list, tuple)) or not times:
        return None
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in times):
        return None
    return EagerCalls(tuple(float(t) for t in times), bool(raw.get("first_is_cold", True)))


def workload(profile: Profile) -> Workload | None:
    """The workload recorded in ``profile``, or None (a malformed entry counts as none)."""
    raw = profile.meta.extra.get(WORKLOAD_KEY)
    if not isinstance(raw, Mapping):
        return None
    try:
        found = Workload(raw.get("tokens_per_step"), raw.get("samples_per_step"))
    except ValueError:
        return None
    return None if found.empty else found
