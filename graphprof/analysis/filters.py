"""Per-node times and the node filters of a profile table.

Filters act on single nodes before any aggregation, as in MegEngine's
profile_analyze (``--min-time`` drops single ops, not groups). Every filter
narrows the selection; an empty selection is a valid answer, reported with
the reason (and a suggestion when a ``--type`` names no op in the profile).
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Callable

from graphprof.analysis.frame import NodePairs, node_frame
from graphprof.analysis.options import TableOptionError, TableOptions, expand_type, normalize_dtype, normalize_type
from graphprof.analysis.node_time import node_times_s, profile_clock
from graphprof.profile.model import NodeRecord, Profile


def flat_nodes(profile: Profile) -> NodePairs:
    """Every (graph, node) in execution order, as a list (indexed by the table code); shared, do not modify."""
    return node_frame(profile).pairs


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
    packet = node.op.rsplit(".", 1)[0] if node.op.count(".") >= 2 else node.op
    return node.type, node.op, packet


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


def select(pairs: NodePairs, options: TableOptions, times: list[float]) -> list[int]:
    """Indices into ``pairs`` of the nodes that pass every filter, in execution order."""
    preds = _predicates(options)
    lo = options.min_time_s
    hi = options.max_time_s
    if not preds and lo is None and hi is None:
        return list(range(len(pairs)))
    out: list[int] = []
    for i, ((_, node), t) in enumerate(zip(pairs, times)):
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
    parts = []
    if options.types:
        known = {name for _, n in profile.iter_nodes() for name in op_names(n)}
        for t in options.types:
            if known.isdisjoint(expand_type(t)):
                close = similar_types(profile, normalize_type(t))
                hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
                parts.append(f"no node has type {t!r}{hint}")
    if options.input_dtype:
        dtype = normalize_dtype(options.input_dtype)
        if not any(dtype in n.in_dtypes for _, n in profile.iter_nodes()):
            parts.append(f"no node has an input of dtype {dtype!r}")
    reason = "; ".join(parts) if parts else f"no node matches {describe_filters(options)}"
    return reason


def similar_types(profile: Profile, wanted: str, n: int = 3) -> list[str]:
    """Op types of the profile that contain ``wanted`` (shortest first), else close spellings."""
    types = sorted({node.type for _, node in profile.iter_nodes()}, key=lambda t: (len(t), t))
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
