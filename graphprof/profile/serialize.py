"""Versioned JSON (de)serialisation of a Profile, with validation.

Loading never runs code (no pickle) and turns every malformed input into one
``ProfileError`` sentence that the CLI prints as is. Node fields equal to their
default are left out of the document: that keeps files small (a profile of
100,000 nodes must stay a few tens of MB) without a second, packed format.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import fields
from typing import Any

from graphprof.profile.model import (
    SCHEMA_ID,
    GraphKind,
    GraphRecord,
    MemoryRecord,
    NodeRecord,
    Phase,
    Profile,
    ProfileMeta,
    StepRecord,
)

_NODE_DEFAULTS = {f.name: f.default for f in fields(NodeRecord) if f.name not in ("id", "name", "op", "type")}
_TIME_DIGITS = 10  # 0.1 ns: below any clock we read


class ProfileError(ValueError):
    """A profile file or document that graphprof cannot use; the message is one sentence."""


# -- writing --------------------------------------------------------------------
def _round_times(samples: tuple[float, ...]) -> list[float]:
    return [round(t, _TIME_DIGITS) for t in samples]


def _node_to_dict(node: NodeRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"id": node.id, "name": node.name, "op": node.op, "type": node.type}
    for name, default in _NODE_DEFAULTS.items():
        value = getattr(node, name)
        if value == default:
            continue
        if name in ("host_time_s", "device_time_s"):
            value = _round_times(value)
        elif name == "phase":
            value = value.value
        elif name == "memory":
            value = {
                "allocated_bytes": value.allocated_bytes,
                "freed_bytes": value.freed_bytes,
                "live_bytes": value.live_bytes,
                "live_by_category_bytes": dict(value.live_by_category_bytes),
            }
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        out[name] = value
    return out


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
        "graphs": [
            {"id": g.id, "name": g.name, "kind": g.kind.value, "nodes": [_node_to_dict(n) for n in g.nodes]}
            for g in profile.graphs
        ],
    }


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
        try:
            kind = GraphKind(g.get("kind", "step"))
        except ValueError:
            raise ProfileError(f"not a valid graphprof profile: graphs[{gi}].kind {g.get('kind')!r} is unknown") from None
        nodes_raw = g.get("nodes", [])
        _expect(isinstance(nodes_raw, list), f"graphs[{gi}].nodes must be a list")
        nodes = tuple(_node_from_dict(n, f"graphs[{gi}].nodes[{ni}]") for ni, n in enumerate(nodes_raw))
        graphs.append(GraphRecord(id=int(g.get("id", gi)), name=str(g.get("name", "")), kind=kind, nodes=nodes))
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
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if isinstance(exc, json.JSONDecodeError) and exc.pos >= len(data.rstrip()) - 1:
            raise ProfileError(f"{path} is truncated JSON (it ends in the middle of the document)") from None
        raise ProfileError(f"{path} is not JSON: {exc}") from None
    return profile_from_document(doc, cls)
