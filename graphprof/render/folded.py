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
    return (node.phase.value, *_module_frames(node.module), node.type or node.op or "?")


def _module_frames(module: str) -> tuple[str, ...]:
    parts = [p for p in module.split(".") if p] if module else []
    return tuple(".".join(parts[: i + 1]) for i in range(len(parts)))


def _stack_table(profile: Profile, stat: str) -> tuple[list[tuple[str, ...]], list[str], list[float]]:
    """Distinct stacks in first-seen order, each one's folded text, and its self time in seconds.

    Read from the node frame's columns; a stack is built (and escaped) once per
    distinct (graph, phase, module, type, op): a 100,000-node profile has a few
    thousand of them. Times are summed node by node in execution order, so the
    floating-point sums are those of a walk over the nodes.
    """
    stat_fn(stat)
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    col = frame.column
    multi = len(profile.graphs) > 1
    roots = [(g.name or f"graph {g.id}",) if multi else () for g in profile.graphs]
    graph_index = col("graph_index") if multi else [0] * len(frame)
    escaped: dict[str, str] = {}
    heads: dict[tuple[int, str, str], tuple[tuple[str, ...], str]] = {}

    def frame_text(name: str) -> str:
        text = escaped.get(name)
        if text is None:
            text = escaped[name] = folded_frame(name)
        return text

    stack_at: dict[tuple[str, ...], int] = {}
    key_at: dict[tuple[int, str, str, str, str], int] = {}
    stacks: list[tuple[str, ...]] = []
    texts: list[str] = []
    sums: list[float] = []
    for key, t in zip(zip(graph_index, col("phase"), col("module"), col("type"), col("op")), times):
        at = key_at.get(key)
        if at is None:
            gi, phase, module, op_type, op = key
            head = heads.get(key[:3])
            if head is None:
                frames = (*roots[gi], phase, *_module_frames(module))
                head = heads[key[:3]] = (frames, ";".join(map(frame_text, frames)))
            last = op_type or op or "?"
            stack = (*head[0], last)
            at = stack_at.get(stack)
            if at is None:
                at = stack_at[stack] = len(stacks)
                stacks.append(stack)
                texts.append(head[1] + ";" + frame_text(last))
                sums.append(0.0)
            key_at[key] = at
        sums[at] += float(t or 0.0)
    return stacks, texts, sums


def folded_times_s(profile: Profile, stat: str = "median") -> dict[tuple[str, ...], float]:
    """Self time in seconds per stack, summed over the nodes sharing it (first-seen order)."""
    stacks, _, sums = _stack_table(profile, stat)
    return dict(zip(stacks, sums))


def folded_stacks(profile: Profile, stat: str = "median") -> str:
    """The folded-stacks text (empty for a profile without nodes)."""
    lines = []
    running_s = 0.0
    emitted_us = 0
    _, texts, sums = _stack_table(profile, stat)
    for text, time_s in zip(texts, sums):
        running_s += time_s
        value_us = round(running_s * 1e6) - emitted_us
        if value_us <= 0:
            continue
        emitted_us += value_us
        lines.append(f"{text} {value_us}\n")
    return "".join(lines)
