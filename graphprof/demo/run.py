"""``graphprof demo``: a real profile of a built-in training step on CPU."""

from __future__ import annotations

import graphprof
from graphprof.demo.steps import gpt_adamw_step, resnet_sgd_step


def run_demo(model: str = "resnet", steps: int = 5, top: int = 15, output: str | None = None) -> str:
    """Profile ``steps`` steps of the demo model and return the printed report."""
    if steps < 1:
        raise ValueError("--steps must be at least 1")
    demo = resnet_sgd_step() if model == "resnet" else gpt_adamw_step()
    step = graphprof.trace(demo.step_fn, profiling=True)
    for i in range(steps + 2):  # call 1 eager, call 2 captures, then profiled steps
        loss = step(*demo.make_inputs(i))
    profile = step.get_profile()
    if output:
        profile.save(output)
    nodes = profile.node_count
    wall = sorted(s.wall_time_s for s in profile.steps)[len(profile.steps) // 2]
    header = (
        f"graphprof demo: {demo.name} training step on CPU, {nodes} graph nodes, "
        f"{len(profile.steps)} profiled steps, median step {wall * 1e3:.2f} ms, last loss {float(loss):.4f}"
    )
    saved = f"\nprofile saved to {output}" if output else ""
    return header + "\n\n" + profile.table(top=top) + saved
