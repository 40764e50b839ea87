"""Versioned JSON (de)serialisation of a Profile, with validation.

Loading never runs code (no pickle) and turns every malformed input into one
``ProfileError`` sentence that the CLI prints as is.

Graphs are written in the compact column layout of ``graphprof.profile.columns``
(about 150 bytes per node plus 8 per node and profiled step). The reader also
accepts the readable layout, a graph whose ``"nodes"`` is a list of node
objects with fields named as in ``NodeRecord``: it is handy for hand-written
test documents and was the layout of the first files written.
"""

from __future__ import annotations

import gc
import json
import math
import os
import tempfile
from dataclasses import fields, replace
from typing import Any, Iterator
from contextlib import contextmanager

from graphprof.profile.model import (
    SCHEMA_ID,
    DeviceMemorySample,
    GraphKind,
    GraphRecord,
    MemoryPeak,
    MemoryRecord,
    NodeRecord,
    PeakTensor,
    Phase,
    Profile,
    ProfileMeta,
    StepRecord,
)
from graphprof.profile.columns import ColumnError, graph_from_json, graph_to_json

_TIME_DIGITS = 10  # 0.1 ns: below any clock we read


class ProfileError(ValueError):
    """A profile file or document that graphprof cannot use; the message is one sentence."""


# -- writing --------------------------------------------------------------------
def profile_to_document(profile: Profile) -> dict[str, Any]:
    """The JSON-ready dict of a profile (schema id first)."""
    meta = {f.name: getattr(profile.meta, f.name) for f in fields(ProfileMeta)}
    meta["peaks"] = dict(meta["peaks"])
    meta["extra"] = dict(meta["extra"])
    return {
        "schema": SCHEMA_ID,
        "meta": meta,
        "steps": [
            {"index": s.index, "wall_time_s": round(s.wall_time_s, _TIME_DIGITS),
             "graph_time_s": round(s.graph_time_s, _TIME_DIGITS)}
            for s in profile.steps
        ],
        "graphs": [_graph_memory_to_json(g, graph_to_json(g)) for g in profile.graphs],
    }


_DEVICE_MEMORY_FIELDS = tuple(f.name for f in fields(DeviceMemorySample))


def _graph_memory_to_json(graph: GraphRecord, out: dict[str, Any]) -> dict[str, Any]:
    """Add a graph's memory peak and allocator samples (when it has them) to its JSON object."""
    peak = graph.memory_peak
    if peak is not None:
        out["memory_peak"] = {
            "node_id": peak.node_id, "live_bytes": peak.live_bytes, "start_bytes": peak.start_bytes,
            "allocated_bytes": peak.allocated_bytes, "by_category_bytes": dict(peak.by_category_bytes),
            "largest_tensors": [[t.name, t.nbytes, t.category, t.node_id] for t in peak.largest_tensors],
        }
    if graph.device_memory:
        out["device_memory"] = {f: [getattr(s, f) for s in graph.device_memory] for f in _DEVICE_MEMORY_FIELDS}
    return out


def _int(value: Any, what: str) -> int:
    _expect(type(value) is int, f"{what} must be an integer")
    return value


def _graph_memory_from_json(raw: dict[str, Any], graph: GraphRecord, where: str) -> GraphRecord:
    """``graph`` with the memory peak and allocator samples its JSON object holds."""
    peak = graph.memory_peak
    if raw.get("memory_peak") is not None:
        p = raw["memory_peak"]
        _expect(isinstance(p, dict), f"{where}.memory_peak must be an object")
        cats = p.get("by_category_bytes", {})
        _expect(isinstance(cats, dict), f"{where}.memory_peak.by_category_bytes must be an object")
        rows = p.get("largest_tensors", [])
        _expect(isinstance(rows, list) and all(
            isinstance(r, list) and len(r) == 4 and isinstance(r[0], str) and type(r[1]) is int
            and isinstance(r[2], str) and type(r[3]) is int for r in rows),
            f"{where}.memory_peak.largest_tensors must hold [name, bytes, category, node id] rows")
        peak = MemoryPeak(
            node_id=_int(p.get("node_id"), f"{where}.memory_peak.node_id"),
            live_bytes=_int(p.get("live_bytes"), f"{where}.memory_peak.live_bytes"),
            by_category_bytes={str(k): _int(v, f"{where}.memory_peak.by_category_bytes") for k, v in cats.items()},
            largest_tensors=tuple(PeakTensor(*r) for r in rows),
            start_bytes=_int(p.get("start_bytes", 0), f"{where}.memory_peak.start_bytes"),
            allocated_bytes=_int(p.get("allocated_bytes", 0), f"{where}.memory_peak.allocated_bytes"),
        )
    samples = graph.device_memory
    if raw.get("device_memory") is not None:
        d = raw["device_memory"]
        _expect(isinstance(d, dict) and all(isinstance(d.get(f), list) for f in _DEVICE_MEMORY_FIELDS)
                and len({len(d[f]) for f in _DEVICE_MEMORY_FIELDS}) == 1
                and all(type(v) is int for f in _DEVICE_MEMORY_FIELDS for v in d[f]),
                f"{where}.device_memory must hold equally long integer lists {', '.join(_DEVICE_MEMORY_FIELDS)}")
        samples = tuple(DeviceMemorySample(*row) for row in zip(*(d[f] for f in _DEVICE_MEMORY_FIELDS)))
    if peak is graph.memory_peak and samples is graph.device_memory:
        return graph
    return replace(graph, memory_peak=peak, device_memory=samples)


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` to ``path`` atomically: a temporary file, then a rename."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ProfileError(f"cannot write {path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".graphprof-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(profile_to_document(profile), f, separators=(",", ":"), allow_nan=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- reading --------------------------------------------------------------------
def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise ProfileError(f"not a valid graphprof profile: {what}")


def _number(value: Any, what: str) -> float:
    _expect(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
            f"{what} must be a finite number")
    return float(value)


def _shape_list(value: Any, what: str) -> tuple[tuple[int, ...] | None, ...]:
    _expect(isinstance(value, list), f"{what} must be a list")
    out: list[tuple[int, ...] | None] = []
    for shape in value:
        if shape is None:
            out.append(None)
            continue
        _expect(isinstance(shape, list) and all(isinstance(d, int) for d in shape), f"{what} must hold lists of ints")
        out.append(tuple(shape))
    return tuple(out)


def _node_from_dict(raw: Any, where: str) -> NodeRecord:
    _expect(isinstance(raw, dict), f"{where} must be an object")
    for key in ("id", "name", "op", "type"):
        _expect(key in raw, f"{where} has no '{key}'")
    _expect(isinstance(raw["id"], int), f"{where}.id must be an integer")
    for key in ("name", "op", "type", "module", "module_type", "source", "scope"):
        if key in raw:
            _expect(isinstance(raw[key], str), f"{where}.{key} must be a string")
    kwargs: dict[str, Any] = {k: raw[k] for k in ("id", "name", "op", "type", "module", "module_type", "source", "scope") if k in raw}
    if "inputs" in raw:
        _expect(isinstance(raw["inputs"], list) and all(isinstance(i, int) for i in raw["inputs"]), f"{where}.inputs must be a list of ints")
        kwargs["inputs"] = tuple(raw["inputs"])
    for key in ("in_shapes", "out_shapes"):
        if key in raw:
            kwargs[key] = _shape_list(raw[key], f"{where}.{key}")
    for key in ("in_dtypes", "out_dtypes"):
        if key in raw:
            _expect(isinstance(raw[key], list) and all(d is None or isinstance(d, str) for d in raw[key]), f"{where}.{key} must be a list of strings")
            kwargs[key] = tuple(raw[key])
    if "phase" in raw:
        try:
            kwargs["phase"] = Phase(raw["phase"])
        except ValueError:
            raise ProfileError(f"not a valid graphprof profile: {where}.phase {raw['phase']!r} is unknown") from None
    if "is_view" in raw:
        _expect(isinstance(raw["is_view"], bool), f"{where}.is_view must be true or false")
        kwargs["is_view"] = raw["is_view"]
    for key in ("flops", "bytes_read", "bytes_written"):
        if key in raw and raw[key] is not None:
            _expect(isinstance(raw[key], int) and not isinstance(raw[key], bool), f"{where}.{key} must be an integer or null")
            kwargs[key] = raw[key]
    if raw.get("memory") is not None:
        mem = raw["memory"]
        _expect(isinstance(mem, dict), f"{where}.memory must be an object")
        cats = mem.get("live_by_category_bytes", {})
        _expect(isinstance(cats, dict), f"{where}.memory.live_by_category_bytes must be an object")
        kwargs["memory"] = MemoryRecord(
            allocated_bytes=int(_number(mem.get("allocated_bytes", 0), f"{where}.memory.allocated_bytes")),
            freed_bytes=int(_number(mem.get("freed_bytes", 0), f"{where}.memory.freed_bytes")),
            live_bytes=int(_number(mem.get("live_bytes", 0), f"{where}.memory.live_bytes")),
            live_by_category_bytes={str(k): int(_number(v, f"{where}.memory")) for k, v in cats.items()},
        )
    for key in ("host_time_s", "device_time_s"):
        if key in raw:
            _expect(isinstance(raw[key], list), f"{where}.{key} must be a list")
            kwargs[key] = tuple(_number(t, f"{where}.{key}") for t in raw[key])
    return NodeRecord(**kwargs)


def profile_from_document(doc: Any, cls: type[Profile] = Profile) -> Profile:
    """Validate a parsed JSON document and build a Profile (or subclass) from it."""
    if isinstance(doc, list) or (isinstance(doc, dict) and "traceEvents" in doc):
        raise ProfileError("this looks like a Chrome trace, not a graphprof profile (no 'schema' field)")
    _expect(isinstance(doc, dict), "the top level must be a JSON object")
    schema = doc.get("schema")
    if schema is None:
        raise ProfileError("not a graphprof profile: it has no 'schema' field")
    if schema != SCHEMA_ID:
        if isinstance(schema, str) and schema.startswith("graphprof.profile/"):
            raise ProfileError(f"unsupported profile schema version {schema!r}; this graphprof reads {SCHEMA_ID!r}")
        raise ProfileError(f"not a graphprof profile: schema is {schema!r}")
    meta_raw = doc.get("meta", {})
    _expect(isinstance(meta_raw, dict), "meta must be an object")
    known = {f.name for f in fields(ProfileMeta)}
    meta_kwargs = {k: v for k, v in meta_raw.items() if k in known}
    for key in ("peaks", "extra"):
        if key in meta_kwargs:
            _expect(isinstance(meta_kwargs[key], dict), f"meta.{key} must be an object")
    meta = ProfileMeta(**meta_kwargs)
    steps_raw = doc.get("steps", [])
    _expect(isinstance(steps_raw, list), "steps must be a list")
    steps = []
    for i, s in enumerate(steps_raw):
        _expect(isinstance(s, dict) and isinstance(s.get("index"), int), f"steps[{i}] must have an integer index")
        steps.append(StepRecord(index=s["index"], wall_time_s=_number(s.get("wall_time_s", 0.0), f"steps[{i}].wall_time_s"),
                                graph_time_s=_number(s.get("graph_time_s", 0.0), f"steps[{i}].graph_time_s")))
    graphs_raw = doc.get("graphs", [])
    _expect(isinstance(graphs_raw, list), "graphs must be a list")
    graphs = []
    for gi, g in enumerate(graphs_raw):
        _expect(isinstance(g, dict), f"graphs[{gi}] must be an object")
        if "columns" in g:
            try:
                graphs.append(_graph_memory_from_json(g, graph_from_json(g, gi), f"graphs[{gi}]"))
            except ColumnError as exc:
                raise ProfileError(f"not a valid graphprof profile: graphs[{gi}]: {exc}") from None
            continue
        try:
            kind = GraphKind(g.get("kind", "step"))
        except ValueError:
            raise ProfileError(f"not a valid graphprof profile: graphs[{gi}].kind {g.get('kind')!r} is unknown") from None
        nodes_raw = g.get("nodes", [])
        _expect(isinstance(nodes_raw, list), f"graphs[{gi}].nodes must be a list")
        nodes = tuple(_node_from_dict(n, f"graphs[{gi}].nodes[{ni}]") for ni, n in enumerate(nodes_raw))
        graphs.append(_graph_memory_from_json(
            g, GraphRecord(id=int(g.get("id", gi)), name=str(g.get("name", "")), kind=kind, nodes=nodes), f"graphs[{gi}]"))
    return cls(meta=meta, steps=tuple(steps), graphs=tuple(graphs))


def load_profile(path: str | os.PathLike[str], cls: type[Profile] = Profile) -> Profile:
    """Read and validate a profile file; every failure is one ProfileError sentence."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ProfileError(f"no such profile file: {path}") from None
    except IsADirectoryError:
        raise ProfileError(f"{path} is a directory, not a profile file") from None
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror}") from None
    if not data.strip():
        raise ProfileError(f"{path} is empty, not a profile")
    with _gc_paused():
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if isinstance(exc, json.JSONDecodeError) and exc.pos >= len(data.rstrip()) - 1:
                raise ProfileError(f"{path} is truncated JSON (it ends in the middle of the document)") from None
            raise ProfileError(f"{path} is not JSON: {exc}") from None
        except RecursionError:
            raise ProfileError(f"{path} is nested too deeply to be a profile") from None
        return profile_from_document(doc, cls)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a profile is built.

    Why: parsing and building a 100,000-node profile allocates millions of
    objects and none of them form cycles, yet each allocation burst triggers a
    full collection; pausing it makes loading about twice as fast.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def require_samples(profile: Profile, source: str = "the profile") -> None:
    """Raise ProfileError when ``profile`` has nothing to analyse (no steps or no nodes).

    Loading accepts such a profile (it is a valid document, and every view
    renders it); commands that analyse timings call this to say why there is
    nothing to show instead of printing an empty table.
    """
    if not profile.graphs or profile.node_count == 0:
        raise ProfileError(f"{source} has no graph nodes, so there is nothing to analyse")
    if not profile.steps:
        raise ProfileError(f"{source} has no profiled steps (a traced function profiles from its fourth call on)")
