"""``graphprof demo``: a real profile of a built-in training step on CPU, as a report."""

from __future__ import annotations

import graphprof
from graphprof.demo.steps import gpt_adamw_step, resnet_sgd_step
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
    demo = resnet_sgd_step() if model == "resnet" else gpt_adamw_step()
    step = graphprof.trace(demo.step_fn, profiling=True)
    for i in range(steps + 2):  # call 1 eager, call 2 captures (and measures kernel workspace), then profiled steps
        loss = step(*demo.make_inputs(i))
    profile = step.get_profile()
    if output:
        profile.save(output)
        notes.append(f"profile saved to {output}; try `graphprof analyze {output} -t 20` or "
                     f"`graphprof export {output} -o report.html`")
    header = (f"graphprof demo: {demo.name} training step on CPU, {profile.node_count} graph nodes, "
              f"{len(profile.steps)} profiled steps, last loss {float(loss):.4f}")
    return "\n".join([header, *notes, "", profile.report(top=top)])
