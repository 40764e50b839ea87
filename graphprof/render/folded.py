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


def _module_path(module: str) -> str:
    """``module`` without empty path parts: its last frame (``a..b`` and ``.a.b`` name ``a.b``)."""
    if module.startswith(".") or module.endswith(".") or ".." in module:
        return ".".join(p for p in module.split(".") if p)
    return module


#: How many module levels up a stack's text looks for a prefix already made.
_PREFIX_WALK = 32
#: A distinct stack: (root frames, phase, module path, op frame); its frames are ``_frames_of(key)``.
_StackKey = tuple[tuple[str, ...], str, str, str]


def _frames_of(key: _StackKey) -> tuple[str, ...]:
    roots, phase, path, last = key
    return (*roots, phase, *_module_frames(path), last)


def _stack_table(profile: Profile, stat: str) -> tuple[list[_StackKey], list[str], list[float]]:
    """Distinct stacks in first-seen order, each one's folded text, and its self time in seconds.

    Read from the node frame's columns. A stack's text is its module's text
    (made once per distinct module path prefix, from its parent's) plus its op
    frame; a 100,000-node profile has a few thousand stacks. Times are summed
    node by node in execution order, so the floating-point sums are those of
    a walk over the nodes.
    """
    stat_fn(stat)
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    col = frame.column
    multi = len(profile.graphs) > 1
    roots = [(g.name or f"graph {g.id}",) if multi else () for g in profile.graphs]
    graph_index = col("graph_index") if multi else [0] * len(frame)
    escaped: dict[str, str] = {}
    heads: dict[tuple[tuple[str, ...], str, str], str] = {}

    def frame_text(name: str) -> str:
        text = escaped.get(name)
        if text is None:
            text = escaped[name] = folded_frame(name)
        return text

    def head_text(roots: tuple[str, ...], phase: str, path: str) -> str:
        """The text of the frames down to module ``path``, from its nearest prefix already made.

        A path with no made prefix within ``_PREFIX_WALK`` levels is joined at
        once and only it is kept: a hostile path of thousands of parts would
        otherwise keep a text per prefix, each as long as the path's stack.
        """
        text = heads.get((roots, phase, path))
        if text is not None:
            return text
        chain = [path]  # path and its ancestors not made yet, nearest first
        while chain[-1] and len(chain) <= _PREFIX_WALK:
            parent = chain[-1].rpartition(".")[0]
            text = heads.get((roots, phase, parent))
            if text is not None:
                break
            chain.append(parent)
        if text is None and chain[-1]:
            text = heads[(roots, phase, path)] = ";".join(map(frame_text, (*roots, phase, *_module_frames(path))))
            return text
        for prefix in reversed(chain):
            text = (";".join(map(frame_text, (*roots, phase))) if text is None
                    else text + ";" + frame_text(prefix))
            heads[(roots, phase, prefix)] = text
        return text  # type: ignore[return-value]

    stack_at: dict[_StackKey, int] = {}
    node_key_at: dict[tuple[int, str, str, str, str], int] = {}
    stacks: list[_StackKey] = []
    texts: list[str] = []
    sums: list[float] = []
    for node_key, t in zip(zip(graph_index, col("phase"), col("module"), col("type"), col("op")), times):
        at = node_key_at.get(node_key)
        if at is None:
            gi, phase, module, op_type, op = node_key
            key = (roots[gi], phase, _module_path(module), op_type or op or "?")
            at = stack_at.get(key)
            if at is None:
                at = stack_at[key] = len(stacks)
                stacks.append(key)
                texts.append(head_text(*key[:3]) + ";" + frame_text(key[3]))
                sums.append(0.0)
            node_key_at[node_key] = at
        sums[at] += float(t or 0.0)
    return stacks, texts, sums


def folded_times_s(profile: Profile, stat: str = "median") -> dict[tuple[str, ...], float]:
    """Self time in seconds per stack, summed over the nodes sharing it (first-seen order)."""
    stacks, _, sums = _stack_table(profile, stat)
    return {_frames_of(key): time_s for key, time_s in zip(stacks, sums)}


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
