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

from typing import Callable, cast

import numpy as np

from graphprof.analysis.frame import node_frame
from graphprof.analysis.node_arrays import codes, column_codes, times_array
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import Profile
from graphprof.render.escape import folded_frame


def _module_frames(module: str) -> tuple[str, ...]:
    """The frames of a module path: each of its prefixes (``a``, ``a.b``, ``a.b.c``), empty parts left out."""
    parts = [p for p in module.split(".") if p] if module else []
    return tuple(".".join(parts[: i + 1]) for i in range(len(parts)))


def _module_path(module: str) -> str:
    """``module`` without empty path parts: its last frame (``a..b`` and ``.a.b`` name ``a.b``)."""
    if module.startswith(".") or module.endswith(".") or ".." in module:
        return ".".join(p for p in module.split(".") if p)
    return module


#: How many module levels up a stack's text looks for a prefix already made.
_PREFIX_WALK = 32


def _first_seen_codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` of an int64 array, sort-based: each key's index among the distinct keys in first-seen
    order, and the position of each distinct key's first occurrence (so its parts can be read back)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    new = np.empty(len(keys), dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    first = order[new]  # stable sort: the first occurrence of each key
    by_first = np.argsort(first, kind="stable")
    code_of_group = np.empty(len(first), dtype=np.intp)
    code_of_group[by_first] = np.arange(len(first), dtype=np.intp)
    out = np.empty(len(keys), dtype=np.intp)
    out[order] = code_of_group[np.cumsum(new) - 1]
    return out, first[by_first]


def _combined_codes(parts: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """First-seen codes of the tuples of several code columns (each with how many codes it has), and
    each part's code per distinct tuple: ``codes(list(zip(...)))`` with one int64 key per node."""
    sizes = [max(size, 1) for _, size in parts]
    if float(np.prod(np.array(sizes, dtype=np.float64))) < 2.0**62:
        key = np.zeros(len(parts[0][0]), dtype=np.int64)
        for (column, _), size in zip(parts, sizes):
            key *= size
            key += column
        found, first = _first_seen_codes(key)
        return found, [column[first] for column, _ in parts]
    found, distinct = codes(list(zip(*(column.tolist() for column, _ in parts))))  # keys past int64
    columns = np.array(distinct, dtype=np.intp).reshape(len(distinct), len(parts))
    return found, [columns[:, k] for k in range(len(parts))]


def _clean(names: list[str]) -> bool:
    """Whether ``folded_frame`` leaves every dot-separated prefix of these names as it is: printable
    ASCII without ``;`` or spaces (so nothing to replace or strip), judged on one joined string."""
    joined = ".".join(names)
    return joined.isascii() and joined.isprintable() and ";" not in joined and " " not in joined


def _module_paths(modules: list[str]) -> tuple[np.ndarray, list[str]]:
    """``codes`` of each module's path (``_module_path``); a table with no empty part is its own paths.
    The check reads one joined text: a separator can only raise a false alarm (then each is looked at)."""
    joined = "\n" + "\n".join(modules) + "\n"
    if "\n." not in joined and ".\n" not in joined and ".." not in joined:
        return np.arange(len(modules), dtype=np.intp), modules
    found, paths = codes([_module_path(m) for m in modules])
    return found, cast("list[str]", paths)


def _stack_table(profile: Profile, stat: str) -> tuple[list[str], np.ndarray, list[str], list[str],
                                                          list[np.ndarray], list[float]]:
    """Distinct stacks in first-seen order, as the texts of their parts and each part's index per
    stack, and each stack's self time in seconds.

    Read from the node frame's columns as codes: a node's stack is four small
    integers (root and phase as one "lead", module path, op frame), made one
    int64 key per node and coded by sorting, so Python only visits each
    distinct value, never each node; a 100,000-node profile has tens of
    thousands of stacks and module paths. A module path's text is made once,
    from its parent's. Times are summed with ``np.bincount``, which adds in node
    order as a walk over the nodes would, so the floating-point sums are those of that walk.

    Returns (lead texts, lead per stack, module texts, leaf texts, [module, leaf] per stack, sums).
    """
    stat_fn(stat)
    frame = node_frame(profile)
    times = times_array(frame, stat, "auto")
    empty = np.zeros(0, dtype=np.intp)
    if not len(times):
        return [], empty, [], [], [empty, empty], []
    multi = len(profile.graphs) > 1
    root_of_graph, graph_roots = codes([(g.name or f"graph {g.id}",) if multi else () for g in profile.graphs])
    roots = cast("list[tuple[str, ...]]", graph_roots)
    root = np.zeros(len(times), np.intp)
    if multi:
        graph_at, graph_indices = column_codes(frame, "graph_index")
        root = root_of_graph[np.asarray(graph_indices, dtype=np.intp)][graph_at]
    phase, phases = column_codes(frame, "phase")
    module, modules = column_codes(frame, "module")
    path_of_module, paths = _module_paths(cast("list[str]", modules))
    op_type, op_types = column_codes(frame, "type")
    op, ops = column_codes(frame, "op")
    pair, (pair_types, pair_ops) = _combined_codes([(op_type, len(op_types)), (op, len(ops))])
    leaf_of_pair, leaves = codes([op_types[t] or ops[o] or "?" for t, o in zip(pair_types.tolist(), pair_ops.tolist())])
    lead = root * len(phases) + phase  # one code per (root, phase)
    stack, (stack_lead, stack_path, stack_leaf) = _combined_codes(
        [(lead, len(roots) * len(phases)), (path_of_module[module], len(paths)), (leaf_of_pair[pair], len(leaves))])
    escaped: dict[str, str] = {}

    def frame_text(name: str) -> str:
        text = escaped.get(name)
        if text is None:
            text = escaped[name] = folded_frame(name)
        return text

    lead_texts = [";".join(map(frame_text, (*roots[r], cast(str, phases[p]))))
                  for r in range(len(roots)) for p in range(len(phases))]
    module_texts = _module_texts(paths, frame_text)
    leaf_texts = [frame_text(cast(str, f)) for f in leaves]
    sums = np.bincount(stack, weights=times, minlength=len(stack_lead)).tolist()
    return lead_texts, stack_lead, module_texts, leaf_texts, [stack_path, stack_leaf], sums


def _module_texts(paths: list[str], frame_text: Callable[[str], str]) -> list[str]:
    """Each module path's frames (its prefixes, each after a ``;``), made from its nearest prefix already
    made. Names ``folded_frame`` leaves alone (most) are not escaped one by one."""
    made = {"": ""}  # module path -> ";frame;frame..." of its prefixes
    if _clean(paths):
        frame_text = str  # every prefix is a substring of the joined text, so it is clean too

    def module_text(path: str) -> str:
        """A path with no made prefix within ``_PREFIX_WALK`` levels is joined at once and only it is
        kept: a hostile path of thousands of parts would otherwise keep a text per prefix, each as
        long as the path's stack."""
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

    out = []
    get = made.get
    for path in paths:  # most paths' parent is made already: that case without a call
        text = get(path)
        if text is None:
            parent = get(path.rpartition(".")[0])
            text = module_text(path) if parent is None else made.setdefault(path, parent + ";" + frame_text(path))
        out.append(text)
    return out


def folded_stacks(profile: Profile, stat: str = "median") -> str:
    """The folded-stacks text (empty for a profile without nodes): only lines with a value are made."""
    lead_texts, stack_lead, module_texts, leaf_texts, (stack_path, stack_leaf), sums = _stack_table(profile, stat)
    values_us = np.array(_rounded_increments_us(sums), dtype=object)
    shown = np.flatnonzero(values_us > 0)
    return "".join([f"{lead_texts[a]}{module_texts[m]};{leaf_texts[f]} {v}\n" for a, m, f, v in zip(
        stack_lead[shown].tolist(), stack_path[shown].tolist(), stack_leaf[shown].tolist(), values_us[shown].tolist())])


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
