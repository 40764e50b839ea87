"""``graphprof demo``: a real profile of a built-in training step on CPU, as a report."""

from __future__ import annotations

import time

import graphprof
from graphprof.demo.steps import gpt_adamw_step, resnet_sgd_step
from graphprof.profile.step_facts import with_eager_times, with_workload
from graphprof.runtime.calibrate import calibrate, load_cached


def run_demo(model: str = "resnet", steps: int = 5, top: int = 15, output: str | None = None) -> str:
    """Profile ``steps`` steps of the demo model and return the printed report.

    The roofline needs this CPU's peaks: if ``graphprof calibrate`` never ran
    here, the demo measures them once (a few seconds) and caches them.
    """
    if steps < 1:
        raise ValueError("--steps must be at least 1")
    if top < 1:
        raise ValueError("--top must be at least 1")
    notes = []
    if load_cached("cpu") is None:
        calibrate("cpu")
        notes.append("measured this CPU's peaks once for the roofline (cached; see `graphprof calibrate`)")
    factory = resnet_sgd_step if model == "resnet" else gpt_adamw_step
    demo = factory()
    # An identical twin trains eagerly, one eager step right before each traced call, so both are
    # timed under the same machine load; the twin's first call is cold (creates optimizer state).
    twin = factory()
    eager_s = []
    step = graphprof.trace(demo.step_fn, profiling=True)
    for i in range(steps + 2):  # call 1 eager, call 2 captures (and measures kernel workspace), then profiled steps
        start = time.perf_counter()
        twin.step_fn(*twin.make_inputs(i))
        eager_s.append(time.perf_counter() - start)
        loss = step(*demo.make_inputs(i))
    x = demo.make_inputs(0)[0]
    tokens = x.numel() if model == "gpt" else None
    # The cold first call, then the eager calls beside profiled steps (not those beside capture).
    profile = with_workload(with_eager_times(step.get_profile(), eager_s[:1] + eager_s[2:], first_is_cold=True),
                            tokens_per_step=tokens, samples_per_step=x.shape[0])
    if output:
        profile.save(output)
        notes.append(f"profile saved to {output}; try `graphprof analyze {output} -t 20`")
        notes.append(f"  or `graphprof export {output} -o report.html`")
    header = (f"graphprof demo: {demo.name} training step on CPU, {profile.node_count} graph nodes, "
              f"{len(profile.steps)} profiled steps, last loss {float(loss):.4f}")
    return "\n".join([header, *notes, "", profile.report(top=top)])  # type: ignore[attr-defined]  # an api.Profile
