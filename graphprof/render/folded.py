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

from typing import cast

import numpy as np

from graphprof.analysis.frame import node_frame
from graphprof.analysis.node_arrays import codes, column_codes, times_array
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
#: A distinct stack: (root frames, phase, module path, op frame).
_StackKey = tuple[tuple[str, ...], str, str, str]


def _stack_table(profile: Profile, stat: str) -> tuple[list[_StackKey], list[str], list[float]]:
    """Distinct stacks in first-seen order, each one's folded text, and its self time in seconds.

    Read from the node frame's columns as codes: a node's stack is a tuple of
    four small integers (root, phase, module path, op frame), so Python only
    visits each distinct value and each distinct stack, never each node; a
    100,000-node profile has tens of thousands of stacks and a few thousand
    module paths. A stack's text is its module's text (made once per distinct
    module path prefix, from its parent's) plus its op frame. Times are summed
    with ``np.bincount``, which adds in node order as a walk over the nodes would,
    so the floating-point sums are those of that walk.
    """
    stat_fn(stat)
    frame = node_frame(profile)
    times = times_array(frame, stat, "auto")
    if not len(times):
        return [], [], []
    multi = len(profile.graphs) > 1
    root_of_graph, graph_roots = codes([(g.name or f"graph {g.id}",) if multi else () for g in profile.graphs])
    roots = cast("list[tuple[str, ...]]", graph_roots)
    root = np.zeros(len(times), np.intp)
    if multi:
        graph_at, graph_indices = column_codes(frame, "graph_index")
        root = root_of_graph[np.asarray(graph_indices, dtype=np.intp)][graph_at]
    phase, phases = column_codes(frame, "phase")
    module, modules = column_codes(frame, "module")
    path_of_module, paths = codes([_module_path(cast(str, m)) for m in modules])
    op_type, op_types = column_codes(frame, "type")
    op, ops = column_codes(frame, "op")
    pair, pairs = codes(list(zip(op_type.tolist(), op.tolist())))
    leaf_of_pair, leaves = codes([op_types[t] or ops[o] or "?" for t, o in cast("list[tuple[int, int]]", pairs)])
    stack, found = codes(list(zip(root.tolist(), phase.tolist(), path_of_module[module].tolist(),
                                  leaf_of_pair[pair].tolist())))
    stack_codes = cast("list[tuple[int, int, int, int]]", found)
    stacks: list[_StackKey] = [(roots[r], cast(str, phases[p]), cast(str, paths[m]), cast(str, leaves[f]))
                               for r, p, m, f in stack_codes]
    escaped: dict[str, str] = {}

    def frame_text(name: str) -> str:
        text = escaped.get(name)
        if text is None:
            text = escaped[name] = folded_frame(name)
        return text

    made = {"": ""}  # module path -> ";frame;frame..." of its prefixes

    def module_text(path: str) -> str:
        """The frames of module ``path``'s prefixes, each after a ``;``, from its nearest prefix already made.

        A path with no made prefix within ``_PREFIX_WALK`` levels is joined at
        once and only it is kept: a hostile path of thousands of parts would
        otherwise keep a text per prefix, each as long as the path's stack.
        """
        text = made.get(path)
        if text is not None:
            return text
        chain = [path]  # path and its ancestors not made yet, nearest first
        while len(chain) <= _PREFIX_WALK:
            text = made.get(chain[-1].rpartition(".")[0])
            if text is not None:
                break
            chain.append(chain[-1].rpartition(".")[0])
        if text is None:
            text = made[path] = "".join(";" + frame_text(f) for f in _module_frames(path))
            return text
        for prefix in reversed(chain):
            text = made[prefix] = text + ";" + frame_text(prefix)
        return text

    leads = {(r, p): ";".join(map(frame_text, (*roots[r], cast(str, phases[p]))))
             for r, p in {key[:2] for key in stack_codes}}
    module_texts = [module_text(cast(str, m)) for m in paths]
    leaf_texts = [frame_text(cast(str, f)) for f in leaves]
    texts = [leads[(r, p)] + module_texts[m] + ";" + leaf_texts[f] for r, p, m, f in stack_codes]
    sums = np.bincount(stack, weights=times, minlength=len(stacks)).tolist()
    return stacks, texts, sums


def folded_stacks(profile: Profile, stat: str = "median") -> str:
    """The folded-stacks text (empty for a profile without nodes)."""
    _, texts, sums = _stack_table(profile, stat)
    values_us = _rounded_increments_us(sums)
    return "".join(f"{texts[i]} {value_us}\n" for i, value_us in enumerate(values_us) if value_us > 0)


def _rounded_increments_us(sums_s: list[float]) -> list[int]:
    """Each stack's value: round(running total) minus the total already emitted, in integer µs.

    What a walk does (``running_s += time_s``; emit and advance when the
    rounded total moved past what was emitted) computed over arrays:
    ``np.cumsum`` adds in order as the walk does, ``np.rint`` rounds half to
    even as ``round`` does, and what was emitted before a line is the largest
    rounded total before it (at least 0). Totals that are not finite or
    beyond 2**53 µs take the walk itself, so they fail or round as it does.
    """
    rounded = np.rint(np.cumsum(np.asarray(sums_s, dtype=np.float64)) * 1e6)
    if len(rounded) and not (np.isfinite(rounded).all() and np.abs(rounded).max() < 2.0**53):
        out, running_s, emitted_us = [], 0.0, 0
        for time_s in sums_s:
            running_s += time_s
            value_us = round(running_s * 1e6) - emitted_us
            emitted_us += max(value_us, 0)
            out.append(value_us)
        return out
    totals = rounded.astype(np.int64)
    emitted = np.maximum.accumulate(np.concatenate(([0], totals[:-1]))) if len(totals) else totals
    return (totals - emitted).tolist()  # type: ignore[no-any-return]
