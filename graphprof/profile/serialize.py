"""Versioned JSON (de)serialisation of a profile's records, with validation.

This module knows the records (``graphprof.profile.records``), not the
Profile class: ``Profile.to_dict``/``save``/``load`` call it, so the import
runs one way (model -> serialize -> columns -> records).

Loading never runs code (no pickle) and turns every malformed input into one
``ProfileError`` sentence that the CLI prints as is.

Graphs are written in the compact column layout of ``graphprof.profile.columns``
(about 150 bytes per node plus 8 per node and profiled step). The reader also
accepts the readable layout, a graph whose ``"nodes"`` is a list of node
objects with fields named as in ``NodeRecord``: it is handy for hand-written
test documents and was the layout of the first files written.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import fields
from typing import Any

import orjson

from graphprof.profile.records import (
    SCHEMA_ID,
    DeviceMemorySample,
    GraphKind,
    GraphRecord,
    MemoryPeak,
    MemoryRecord,
    NodeRecord,
    PeakTensor,
    Phase,
    ProfileMeta,
    StepRecord,
    node_source,
    seconds_to_ns,
)
from graphprof.profile import schema
from graphprof.profile.atomic import atomic_file
from graphprof.profile.columns import graph_from_json, graph_to_json
from graphprof.profile.node_columns import gc_paused

from graphprof.profile.meta_sections import sections_from_extra, sections_to_extra
from graphprof.profile.schema import BYTES, COUNT, ID, SchemaError

#: ProfileMeta fields written inside ``meta.extra`` (``meta_sections``), not as meta keys of their own.
_SECTION_FIELDS = frozenset({"schedule", "device", "distributed", "peaks_note", "recompiles"})

#: What ``parts_from_document`` returns: the fields of a Profile, in order.
ProfileParts = tuple[ProfileMeta, tuple[StepRecord, ...], tuple[GraphRecord, ...]]


class ProfileError(ValueError):
    """A profile file or document that graphprof cannot use; the message is one sentence."""


# -- writing --------------------------------------------------------------------
def profile_to_document(profile: Any) -> dict[str, Any]:
    """The JSON-ready dict of a profile (anything with ``meta``, ``steps`` and ``graphs``), schema id first."""
    meta = {f.name: getattr(profile.meta, f.name) for f in fields(ProfileMeta) if f.name not in _SECTION_FIELDS}
    meta["peaks"] = dict(meta["peaks"])
    meta["extra"] = sections_to_extra(profile.meta)
    return {
        "schema": SCHEMA_ID,
        "meta": meta,
        "steps": [
            {"index": s.index, "wall_time_s": s.wall_time_s, "graph_time_s": s.graph_time_s}
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


def _graph_memory_from_json(raw: dict[str, Any], graph: GraphRecord, where: str) -> GraphRecord:
    """``graph`` with the memory peak and allocator samples its JSON object holds (SchemaError if malformed).

    A graph loaded from columns is rebuilt around the same NodeSource, so its records stay unbuilt.
    """
    peak = graph.memory_peak
    if raw.get("memory_peak") is not None:
        p = schema.mapping(raw["memory_peak"], f"{where}.memory_peak")
        cats = schema.count_map(p.get("by_category_bytes", {}), f"{where}.memory_peak.by_category_bytes")
        rows = p.get("largest_tensors", [])
        schema.check(isinstance(rows, list) and all(
            isinstance(r, list) and len(r) == 4 and type(r[0]) is str and type(r[1]) is int
            and schema.INT64_MIN <= r[1] <= schema.INT64_MAX and type(r[2]) is str and type(r[3]) is int
            and schema.INT64_MIN <= r[3] <= schema.INT64_MAX for r in rows),
            f"{where}.memory_peak.largest_tensors must hold [name, bytes, category, node id] rows")
        peak = MemoryPeak(
            node_id=schema.one_int(p.get("node_id"), ID, f"{where}.memory_peak.node_id"),
            live_bytes=schema.one_int(p.get("live_bytes"), BYTES, f"{where}.memory_peak.live_bytes"),
            by_category_bytes=dict(cats),
            largest_tensors=tuple(PeakTensor(*r) for r in rows),
            start_bytes=schema.one_int(p.get("start_bytes", 0), BYTES, f"{where}.memory_peak.start_bytes"),
            allocated_bytes=schema.one_int(p.get("allocated_bytes", 0), BYTES, f"{where}.memory_peak.allocated_bytes"),
        )
    samples = graph.device_memory
    if raw.get("device_memory") is not None:
        d = schema.mapping(raw["device_memory"], f"{where}.device_memory")
        columns = [schema.ints(d.get(f), ID if f in ("step", "node_id") else BYTES, f"{where}.device_memory.{f}")
                   for f in _DEVICE_MEMORY_FIELDS]
        schema.check(len(set(map(len, columns))) == 1, f"{where}.device_memory's lists must be equally long")
        samples = tuple(DeviceMemorySample(*row) for row in zip(*columns))
    if peak is graph.memory_peak and samples is graph.device_memory:
        return graph
    source = node_source(graph)
    nodes = source if source is not None else graph.nodes
    return GraphRecord(id=graph.id, name=graph.name, kind=graph.kind, nodes=nodes, memory_peak=peak,
                       device_memory=samples)


def write_document(document: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a profile's JSON document to ``path`` through ``atomic_file`` (no half file, no stray temporary file).

    A symbolic link at ``path`` stays a link (its target is replaced); the file
    gets the mode the umask gives an ordinary new file; an error names
    ``path``, never the temporary file.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(directory):
        raise ProfileError(f"cannot write {path}: directory {directory} does not exist")
    try:
        with atomic_file(path) as f:
            json.dump(document, f, separators=(",", ":"), allow_nan=False)
    except OSError as exc:
        raise ProfileError(f"cannot write {path}: {exc.strerror or exc}") from None


# -- reading --------------------------------------------------------------------
_META_SPECS: dict[str, Any] = {
    **{f.name: str for f in fields(ProfileMeta) if f.type in ("str", str) and f.name not in _SECTION_FIELDS},
    "probe_cost_s": schema.SECONDS,
    "peaks": schema.rate_map,
    "extra": schema.mapping,
}


def _shape_list(value: Any, what: str) -> tuple[tuple[int, ...] | None, ...]:
    schema.check(isinstance(value, list) and all(
        s is None or (isinstance(s, list) and all(type(d) is int and 0 <= d <= schema.INT64_MAX for d in s))
        for s in value), f"{what} must be a list of shapes (lists of non-negative integers)")
    return tuple(tuple(s) if s is not None else None for s in value)


def _node_from_dict(raw: Any, where: str) -> NodeRecord:
    """A node of the readable layout (one object per node); SchemaError names what is wrong."""
    schema.mapping(raw, where)
    for key in ("id", "name", "op", "type"):
        schema.check(key in raw, f"{where} has no '{key}'")
    kwargs: dict[str, Any] = {"id": schema.one_int(raw["id"], ID, f"{where}.id")}
    for key in ("name", "op", "type", "module", "module_type", "source", "scope"):
        if key in raw:
            kwargs[key] = schema.string(raw[key], f"{where}.{key}")
    if "inputs" in raw:
        kwargs["inputs"] = tuple(schema.ints(raw["inputs"], ID, f"{where}.inputs"))
    for key in ("in_shapes", "out_shapes"):
        if key in raw:
            kwargs[key] = _shape_list(raw[key], f"{where}.{key}")
    for key in ("in_dtypes", "out_dtypes"):
        if key in raw:
            schema.check(isinstance(raw[key], list) and all(d is None or type(d) is str for d in raw[key]),
                         f"{where}.{key} must be a list of strings")
            kwargs[key] = tuple(raw[key])
    if "phase" in raw:
        schema.check(type(raw["phase"]) is str and raw["phase"] in Phase._value2member_map_,
                     f"{where}.phase {raw['phase']!r:.40} is unknown")
        kwargs["phase"] = Phase(raw["phase"])
    if "is_view" in raw:
        schema.check(type(raw["is_view"]) is bool, f"{where}.is_view must be true or false")
        kwargs["is_view"] = raw["is_view"]
    if raw.get("is_inplace") is not None:
        schema.check(type(raw["is_inplace"]) is bool, f"{where}.is_inplace must be true or false")
        kwargs["is_inplace"] = raw["is_inplace"]
    for key in ("flops", "bytes_read", "bytes_written"):
        if raw.get(key) is not None:
            kwargs[key] = schema.one_int(raw[key], COUNT, f"{where}.{key}")
    if raw.get("memory") is not None:
        mem = schema.mapping(raw["memory"], f"{where}.memory")
        cats = schema.count_map(mem.get("live_by_category_bytes", {}), f"{where}.memory.live_by_category_bytes")
        kwargs["memory"] = MemoryRecord(
            **{f.name: schema.one_int(mem.get(f.name, 0), BYTES, f"{where}.memory.{f.name}")
               for f in fields(MemoryRecord) if f.name != "live_by_category_bytes"},
            live_by_category_bytes=dict(cats))
    for key in ("host_time", "device_time"):
        if f"{key}_s" in raw:  # seconds, as the first files and hand-written documents hold them
            kwargs[f"{key}_ns"] = seconds_to_ns(schema.floats(raw[f"{key}_s"], schema.SAMPLE_SECONDS, f"{where}.{key}_s"))
        if f"{key}_ns" in raw:
            kwargs[f"{key}_ns"] = tuple(schema.ints(raw[f"{key}_ns"], schema.SAMPLE_NS, f"{where}.{key}_ns"))
    if "attrs" in raw:
        kwargs["attrs"] = schema.pairs([raw["attrs"]], f"{where}.attrs", 1)[0]
    return NodeRecord(**kwargs)


def _graph_from_nodes(g: dict[str, Any], gi: int) -> GraphRecord:
    """A graph of the readable layout."""
    kind = g.get("kind", "step")
    schema.check(type(kind) is str and kind in GraphKind._value2member_map_, f"kind {kind!r:.40} is unknown")
    nodes_raw = g.get("nodes", [])
    schema.check(isinstance(nodes_raw, list), "nodes must be a list")
    nodes = tuple(_node_from_dict(n, f"nodes[{ni}]") for ni, n in enumerate(nodes_raw))
    schema.check(len({n.id for n in nodes}) == len(nodes), "nodes hold the same id twice")
    known = {n.id for n in nodes}
    schema.check(all(i in known for n in nodes for i in n.inputs), "a node's inputs refer to a node the graph does not have")
    return GraphRecord(id=schema.one_int(g.get("id", gi), ID, "id"), name=schema.string(g.get("name", ""), "name"),
                       kind=GraphKind(kind), nodes=nodes)


def _steps_from_json(raw: Any) -> tuple[StepRecord, ...]:
    schema.check(isinstance(raw, list), "steps must be a list")
    steps = []
    for i, s in enumerate(raw):
        schema.check(isinstance(s, dict), f"steps[{i}] must be an object")
        steps.append(StepRecord(
            index=schema.one_int(s.get("index"), ID, f"steps[{i}].index"),
            wall_time_s=schema.one_float(s.get("wall_time_s", 0.0), schema.SECONDS, f"steps[{i}].wall_time_s"),
            graph_time_s=schema.one_float(s.get("graph_time_s", 0.0), schema.SECONDS, f"steps[{i}].graph_time_s")))
    return tuple(steps)


def parts_from_document(doc: Any) -> ProfileParts:
    """Validate a parsed JSON document and build a Profile's meta, steps and graphs from it.

    Every check is in ``graphprof.profile.schema`` (bounds and types) or next to
    the code that decodes the value; any failure is one ProfileError sentence.
    """
    if isinstance(doc, list) or (isinstance(doc, dict) and "traceEvents" in doc):
        raise ProfileError("this looks like a Chrome trace, not a graphprof profile (no 'schema' field)")
    if not isinstance(doc, dict):
        raise ProfileError("not a valid graphprof profile: the top level must be a JSON object")
    version = doc.get("schema")
    if version is None:
        raise ProfileError("not a graphprof profile: it has no 'schema' field")
    if version != SCHEMA_ID:
        if isinstance(version, str) and version.startswith("graphprof.profile/"):
            raise ProfileError(f"unsupported profile schema version {version!r:.60}; this graphprof reads {SCHEMA_ID!r}")
        raise ProfileError(f"not a graphprof profile: schema is {version!r:.60}")
    where = ""
    try:
        meta_raw = schema.mapping(doc.get("meta", {}), "meta")
        known = schema.meta_fields(meta_raw, _META_SPECS)
        sections = sections_from_extra(known.pop("extra", {}))
        meta = ProfileMeta(**known, **sections)
        steps = _steps_from_json(doc.get("steps", []))
        graphs_raw = doc.get("graphs", [])
        schema.check(isinstance(graphs_raw, list), "graphs must be a list")
        graphs = []
        for gi, g in enumerate(graphs_raw):
            schema.mapping(g, f"graphs[{gi}]")
            where = f"graphs[{gi}]: "
            graph = graph_from_json(g, gi) if "columns" in g else _graph_from_nodes(g, gi)
            where = ""
            graphs.append(_graph_memory_from_json(g, graph, f"graphs[{gi}]"))
        schema.check(len({g.id for g in graphs}) == len(graphs), "two graphs have the same id")
    except SchemaError as exc:
        raise ProfileError(f"not a valid graphprof profile: {where}{exc}") from None
    return meta, steps, tuple(graphs)


def read_parts(path: str | os.PathLike[str]) -> ProfileParts:
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
    with gc_paused():
        try:
            doc = _parse(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if _ends_early(exc):
                raise ProfileError(f"{path} is truncated JSON (it ends in the middle of the document)") from None
            raise ProfileError(f"{path} is not JSON: {exc}") from None
        except RecursionError:
            raise ProfileError(f"{path} is nested too deeply to be a profile") from None
        try:
            return parts_from_document(doc)
        except ProfileError as exc:  # named: ``diff`` and ``merge`` read several files
            raise ProfileError(f"{path}: {exc}") from None


def _parse(data: bytes) -> Any:
    """The JSON document in ``data``: orjson's, which parses a profile in about 60% of the json
    module's time; what orjson refuses goes to the json module, so which files load and every
    sentence a refused one gets are the json module's (orjson refuses more: NaN and Infinity,
    integers beyond 64 bits, lone surrogates, nesting beyond 1024 levels; the schema then names
    such a value, as it always did)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


_PARTIAL_NUMBER = re.compile(r"-?[0-9]*\.?[0-9]*(?:[eE][-+]?[0-9]*)?")


def _ends_early(exc: ValueError) -> bool:
    """Whether a parse error says the document stops before it is complete (a cut-off copy or write).

    The parser reports most cuts at the end of the text, but a cut inside a
    string where the string starts ("Unterminated string"), one inside a
    literal or number where that token starts, and one inside a multi-byte
    UTF-8 character in the decoder.
    """
    if isinstance(exc, UnicodeDecodeError):
        return exc.reason == "unexpected end of data"
    assert isinstance(exc, json.JSONDecodeError)
    rest = exc.doc[exc.pos:].rstrip()
    return (len(rest) <= 1 or exc.msg.startswith("Unterminated string")
            or any(word.startswith(rest) for word in ("true", "false", "null"))
            or _PARTIAL_NUMBER.fullmatch(rest) is not None)
