"""The overhead the static graph removes: real eager calls against the replayed graph.

A replayed graph runs the same aten ops as the user's eager code, without
the Python of the step, module ``__call__`` hooks, autograd's graph building
and the optimizer's Python loop. The difference between an eager step and a
replayed one is therefore the bookkeeping that torch.compile (and, on an
accelerator, CUDA graphs) would remove: no estimate, two measured times.

- Eager time: the warm eager calls recorded in ``meta.extra["eager"]``
  (``profile/step_facts.py``); the function's first call is cold (it creates
  optimizer state, warms the allocator) and is left out when it is marked so.
- Replay time: each profiled step's wall time less its probes
  (``replay_step_times_s``): every op node of a step graph carries one probe
  whose measured cost is ``meta.probe_cost_s``, and an unprofiled replay
  does not pay it.

The comparison is called significant only when the median gap is at least
``MIN_OVERHEAD_SHARE`` of the eager step *and* every warm eager call was
slower than the median replay, so run-to-run noise on a busy machine does
not produce a finding.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import GraphKind, Profile, graph_size
from graphprof.profile.step_facts import eager_calls

#: Below this share of an eager step, the bookkeeping is not worth a finding.
MIN_OVERHEAD_SHARE = 0.05


def probe_count(profile: Profile) -> int:
    """Probes a profiled step runs: one per op node of its graphs (host-time records carry none)."""
    return sum(graph_size(g) for g in profile.graphs if g.kind is not GraphKind.HOST)


def replay_step_times_s(profile: Profile) -> tuple[float, ...]:
    """Each profiled step's wall time without its probes: the time an unprofiled replay takes.

    The probe allowance never takes a step below the time its graphs' ops
    were measured to take (``graph_time_s``), so an overstated probe cost
    cannot make a step look faster than its ops.
    """
    allowance = probe_count(profile) * max(profile.meta.probe_cost_s, 0.0)
    return tuple(max(s.wall_time_s - allowance, min(s.graph_time_s, s.wall_time_s)) for s in profile.steps)


@dataclass(frozen=True)
class EagerOverhead:
    """Eager step time against the replayed graph's, both measured, per step.

    ``overhead_s`` = ``eager_s`` - ``replay_s`` (statistic ``stat`` of each);
    ``significant`` says it passed the noise test of this module's docstring.
    """

    eager_s: float
    replay_s: float
    overhead_s: float
    eager_calls: int
    replay_steps: int
    first_call_s: float | None
    stat: str
    significant: bool

    @property
    def share(self) -> float:
        """The overhead as a share of the eager step."""
        return self.overhead_s / self.eager_s if self.eager_s > 0 else 0.0

    @property
    def speedup(self) -> float:
        """Eager step time over replay step time."""
        return self.eager_s / self.replay_s if self.replay_s > 0 else 0.0


def eager_overhead(profile: Profile, stat: str = "median") -> EagerOverhead | None:
    """The comparison, or None when the profile has no warm eager call or no profiled step."""
    calls = eager_calls(profile)
    replay = replay_step_times_s(profile)
    if calls is None or not calls.warm_time_s or not replay:
        return None
    fn = stat_fn(stat)
    eager_s, replay_s = fn(calls.warm_time_s), fn(replay)
    overhead = eager_s - replay_s
    typical_replay = stat_fn("median")(replay)
    significant = (eager_s > 0 and overhead >= MIN_OVERHEAD_SHARE * eager_s
                   and min(calls.warm_time_s) > typical_replay)
    return EagerOverhead(
        eager_s=eager_s, replay_s=replay_s, overhead_s=overhead, eager_calls=len(calls.warm_time_s),
        replay_steps=len(replay), first_call_s=calls.wall_time_s[0] if calls.first_is_cold else None,
        stat=stat, significant=significant,
    )
