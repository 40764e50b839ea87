"""Per-node times and the node filters of a profile table.

Filters act on single nodes before any aggregation, as in MegEngine's
profile_analyze (``--min-time`` drops single ops, not groups). Every filter
narrows the selection; an empty selection is a valid answer, reported with
the reason (and a suggestion when a ``--type`` names no op in the profile).
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any, Callable, Sequence

from graphprof.analysis.frame import NodeFrame, NodePairs, node_frame
from graphprof.analysis.options import TableOptionError, TableOptions, expand_type, normalize_dtype, normalize_type
from graphprof.analysis.node_time import node_times_s, profile_clock
from graphprof.profile.model import NodeRecord, Profile


def resolve_clock(profile: Profile, clock: str) -> str:
    """The clock a view of ``profile`` shows: ``auto`` is each node's own clock (device time where
    recorded, else host time), named ``host`` or ``device`` when one clock covers every node."""
    resolved = node_frame(profile).memo("profile_clock", lambda: profile_clock(profile))  # a report asks 5 times
    if clock == "auto":
        return resolved
    if clock == "device" and resolved == "host":
        raise TableOptionError(
            f"--clock device: this profile has no device times (taken on {profile.meta.device_type or 'an unknown device'})")
    return clock


def node_times(pairs: NodePairs, stat: str, clock: str) -> list[float]:
    """Each node's time (seconds) under ``stat`` across profiled steps, in the order of ``pairs``."""
    return node_times_s((n for _, n in pairs), stat, clock)


def op_names(node: NodeRecord) -> tuple[str, ...]:
    """Every spelling ``--type`` accepts for a node: ``addmm``, ``aten.addmm``, ``aten.addmm.default``."""
    return type_op_names(node.type, node.op)


def type_op_names(node_type: str, op: str) -> tuple[str, ...]:
    """``op_names`` of a node of type ``node_type`` and op ``op``."""
    packet = op.rsplit(".", 1)[0] if op.count(".") >= 2 else op
    return node_type, op, packet


def type_matcher(types: tuple[str, ...]) -> Callable[[NodeRecord], bool]:
    """A predicate true for nodes whose type, op packet or op overload is one of ``types``."""
    wanted = {name for t in types for name in expand_type(t)}
    cache: dict[tuple[str, str], bool] = {}

    def match(node: NodeRecord) -> bool:
        key = (node.type, node.op)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = any(name in wanted for name in op_names(node))
        return hit

    return match


def _predicates(options: TableOptions) -> list[Callable[[NodeRecord], bool]]:
    preds: list[Callable[[NodeRecord], bool]] = []
    if options.types:
        preds.append(type_matcher(options.types))
    name_re = options.regex("name")
    if name_re is not None:
        preds.append(lambda n: name_re.search(n.name) is not None)
    module_re = options.regex("module")
    if module_re is not None:
        preds.append(lambda n: module_re.search(n.module) is not None)
    if options.input_dtype:
        dtype = normalize_dtype(options.input_dtype)
        preds.append(lambda n: dtype in n.in_dtypes)
    if options.phases:
        phases = set(options.phases)
        preds.append(lambda n: n.phase.value in phases)
    return preds


def _by_value(test: Callable[[Any], bool], column: list[Any]) -> list[bool]:
    """``test`` of every value of ``column``, run once per distinct value (columns repeat few values)."""
    cache: dict[Any, bool] = {}
    out = []
    for value in column:
        hit = cache.get(value)
        if hit is None:
            hit = cache[value] = test(value)
        out.append(hit)
    return out


def _column_masks(frame: NodeFrame, options: TableOptions) -> list[list[bool]]:
    """One list of booleans per active filter of ``_predicates``, read from the frame's columns (no records)."""
    masks: list[list[bool]] = []
    if options.types:
        wanted = {name for t in options.types for name in expand_type(t)}
        pairs = list(zip(frame.column("type"), frame.column("op")))
        masks.append(_by_value(lambda key: any(name in wanted for name in type_op_names(*key)), pairs))
    name_re = options.regex("name")
    if name_re is not None:
        masks.append([name_re.search(v) is not None for v in frame.column("name")])
    module_re = options.regex("module")
    if module_re is not None:
        masks.append(_by_value(lambda v: module_re.search(v) is not None, frame.column("module")))
    if options.input_dtype:
        dtype = normalize_dtype(options.input_dtype)
        masks.append(_by_value(lambda v: dtype in v, frame.column("in_dtypes")))
    if options.phases:
        phases = set(options.phases)
        masks.append(_by_value(phases.__contains__, frame.column("phase")))
    return masks


def select(nodes: NodeFrame | NodePairs, options: TableOptions, times: Sequence[float]) -> Sequence[int]:
    """Indices into ``nodes`` (a frame, or its pairs) of the nodes that pass every filter, in execution order.

    Given the frame, the filters read its columns and no NodeRecord is built;
    without filters its indices are ``range(len(frame))``, which the
    aggregation recognises as every node (no array of the indices is made).
    """
    lo = options.min_time_s
    hi = options.max_time_s
    if isinstance(nodes, NodeFrame):
        masks = _column_masks(nodes, options)
        if not masks and lo is None and hi is None:
            return range(len(nodes))
        keep = [all(flags) for flags in zip(*masks)] if masks else None
        out: list[int] = []
        for i, t in enumerate(times):
            if lo is not None and t < lo:
                continue
            if hi is not None and t > hi:
                continue
            if keep is not None and not keep[i]:
                continue
            out.append(i)
        return out
    preds = _predicates(options)
    if not preds and lo is None and hi is None:
        return list(range(len(nodes)))
    out = []
    for i, ((_, node), t) in enumerate(zip(nodes, times)):
        if lo is not None and t < lo:
            continue
        if hi is not None and t > hi:
            continue
        if preds and not all(p(node) for p in preds):
            continue
        out.append(i)
    return out


def why_empty(profile: Profile, options: TableOptions) -> str:
    """One sentence on why no node was selected, naming the filters (and close op names)."""
    frame = node_frame(profile)
    parts = []
    if options.types:
        known = {name for key in set(zip(frame.column("type"), frame.column("op"))) for name in type_op_names(*key)}
        for t in options.types:
            if known.isdisjoint(expand_type(t)):
                close = similar_types(profile, normalize_type(t))
                hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
                parts.append(f"no node has type {t!r}{hint}")
    if options.input_dtype:
        dtype = normalize_dtype(options.input_dtype)
        if not any(dtype in v for v in set(frame.column("in_dtypes"))):
            parts.append(f"no node has an input of dtype {dtype!r}")
    reason = "; ".join(parts) if parts else f"no node matches {describe_filters(options)}"
    return reason


def similar_types(profile: Profile, wanted: str, n: int = 3) -> list[str]:
    """Op types of the profile that contain ``wanted`` (shortest first), else close spellings."""
    types = sorted(set(node_frame(profile).column("type")), key=lambda t: (len(t), t))
    key = wanted.rsplit(".", 1)[-1] if wanted.count(".") == 1 else wanted.split(".")[-2] if "." in wanted else wanted
    containing = [t for t in types if key.lower() in t.lower()]
    return containing[:n] if containing else get_close_matches(key, types, n=n)


def describe_filters(options: TableOptions) -> str:
    """The active filters as command-line flags, e.g. ``--type convolution --min-time 0.0001``."""
    flags = [f"--type {t}" for t in options.types]
    for flag, value in (("--name", options.name), ("--module", options.module), ("--input-dtype", options.input_dtype)):
        if value is not None:
            flags.append(f"{flag} {value}")
    flags += [f"--phase {p}" for p in options.phases]
    if options.min_time_s is not None:
        flags.append(f"--min-time {options.min_time_s:g}")
    if options.max_time_s is not None:
        flags.append(f"--max-time {options.max_time_s:g}")
    return " ".join(flags) if flags else "no filter"
