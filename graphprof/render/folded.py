"""Folded stacks for flame graphs (Brendan Gregg's ``flamegraph.pl``, speedscope).

One line per distinct stack, ``frame;frame;...;frame value``. A node's stack
is its phase, then every prefix of its module path, then its op type::

    backward;layer1;layer1.0;layer1.0.conv1;convolution_backward 812

Prefixes rather than bare path components, so a frame reads ``layer1.0``
and not ``0``. The value is self time in integer microseconds per step under
the chosen statistic (median by default). Rounding is cumulative (each line
gets round(running total) - round(previous running total)), so the lines
add up to the rounded total exactly instead of drifting by half a
microsecond per line; lines that round to zero are left out, as flame graphs
would not draw them. Graphs of a multi-graph profile get their name as an
extra root frame.
"""

from __future__ import annotations

from graphprof.analysis.frame import node_frame
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import NodeRecord, Profile
from graphprof.render.escape import folded_frame


def node_stack(node: NodeRecord) -> tuple[str, ...]:
    """Frames of a node, root first: phase, module path prefixes, op type."""
    frames = [node.phase.value]
    parts = [p for p in node.module.split(".") if p] if node.module else []
    frames += [".".join(parts[: i + 1]) for i in range(len(parts))]
    frames.append(node.type or node.op or "?")
    return tuple(frames)


def folded_times_s(profile: Profile, stat: str = "median") -> dict[tuple[str, ...], float]:
    """Self time in seconds per stack, summed over the nodes sharing it (first-seen order).

    Stacks are built once per distinct (phase, module, type): a 100,000-node
    profile has a few thousand of them.
    """
    stat_fn(stat)
    multi = len(profile.graphs) > 1
    stacks: dict[tuple[str, ...], float] = {}
    times = node_frame(profile).times(stat, "auto")
    position = 0
    for graph in profile.graphs:
        root = (graph.name or f"graph {graph.id}",) if multi else ()
        stack_of: dict[tuple[object, str, str, str], tuple[str, ...]] = {}
        for node in graph.nodes:
            key = (node.phase, node.module, node.type, node.op)
            stack = stack_of.get(key)
            if stack is None:
                stack = stack_of[key] = root + node_stack(node)
            stacks[stack] = stacks.get(stack, 0.0) + float(times[position] or 0.0)
            position += 1
    return stacks


def folded_stacks(profile: Profile, stat: str = "median") -> str:
    """The folded-stacks text (empty for a profile without nodes)."""
    lines = []
    running_s = 0.0
    emitted_us = 0
    frames: dict[str, str] = {}
    for stack, time_s in folded_times_s(profile, stat).items():
        running_s += time_s
        value_us = round(running_s * 1e6) - emitted_us
        if value_us <= 0:
            continue
        emitted_us += value_us
        names = []
        for frame in stack:
            name = frames.get(frame)
            if name is None:
                name = frames[frame] = folded_frame(frame)
            names.append(name)
        lines.append(";".join(names) + f" {value_us}")
    return "".join(line + "\n" for line in lines)
