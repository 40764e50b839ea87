"""The typed meta sections to and from the ``extra`` object of a profile file.

Files have always kept the schedule, the device timing, the distributed layout,
the peaks note and the recompiles under ``meta.extra`` keys; ``ProfileMeta`` now has typed
fields for them, and this module maps one to the other so that the file layout
is unchanged: new files read in older graphprof versions, old files here.

Reading is lenient by design: a key whose value has the wrong type (a
hand-edited or foreign file) stays in ``extra`` (or in
``DistributedInfo.details``) exactly as it was, so loading never fails where
it did not before, and the code that needs the value refuses with its own
sentence (``merge``: "has no rank").
"""

from __future__ import annotations

from typing import Any, Mapping

from graphprof.profile.records import DeviceInfo, DistributedInfo, ProfileMeta, Recompile, ScheduleInfo

_SCHEDULE_FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")
#: DeviceInfo field → its ``extra`` key.
_DEVICE_KEYS = {"timing": "timing", "device": "device", "capability": "device_capability",
                "mark_cost_s": "device_mark_cost_s"}
#: Every ``extra`` key a typed section owns.
SECTION_KEYS = frozenset({"schedule", "cycle", "distributed", "peaks_note", "recompiles", *_DEVICE_KEYS.values()})
_RECOMPILE_TYPES = {"call": (int,), "graphs": (str,), "reason": (str,), "compile_time_s": (int, float)}


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


# -- writing --------------------------------------------------------------------
def distributed_to_json(info: DistributedInfo) -> dict[str, Any]:
    """The ``extra["distributed"]`` object of ``info``: only what it holds, details last."""
    out: dict[str, Any] = {}
    if info.merged:
        out["merged"] = True
    if info.rank is not None:
        out["rank"] = info.rank
    if info.world_size is not None:
        out["world_size"] = info.world_size
    if info.backend:
        out["backend"] = info.backend
    if info.host:
        out["host"] = info.host
    if info.merged:
        out["ranks"] = [dict(r) for r in info.ranks]
        out["missing_ranks"] = list(info.missing_ranks)
    if info.fsdp is not None:
        out["fsdp"] = dict(info.fsdp)
    out.update(info.details)
    return out


def sections_to_extra(meta: ProfileMeta) -> dict[str, Any]:
    """``meta.extra`` with the typed sections written back under their keys."""
    out: dict[str, Any] = dict(meta.extra)
    if meta.schedule is not None:
        out["schedule"] = {f: getattr(meta.schedule, f) for f in _SCHEDULE_FIELDS}
        out["cycle"] = meta.schedule.cycle
    if meta.device is not None:
        for name, key in _DEVICE_KEYS.items():
            value = getattr(meta.device, name)
            if value not in ("", None) or name == "timing":
                out[key] = value
    if meta.distributed is not None:
        out["distributed"] = distributed_to_json(meta.distributed)
    if meta.peaks_note:
        out["peaks_note"] = meta.peaks_note
    if meta.recompiles is not None:
        out["recompiles"] = [{"call": r.call, "graphs": r.graphs, "reason": r.reason,
                              "compile_time_s": r.compile_time_s} for r in meta.recompiles]
    return out


# -- reading --------------------------------------------------------------------
def _schedule(extra: dict[str, Any]) -> ScheduleInfo | None:
    raw = extra.get("schedule")
    if not (isinstance(raw, Mapping) and set(raw) == set(_SCHEDULE_FIELDS) and all(map(_is_int, raw.values()))):
        return None
    cycle = extra.get("cycle")
    if cycle is not None and not _is_int(cycle):
        return None
    extra.pop("schedule")
    extra.pop("cycle", None)
    return ScheduleInfo(**{f: raw[f] for f in _SCHEDULE_FIELDS}, cycle=cycle)


def _device(extra: dict[str, Any]) -> DeviceInfo | None:
    if not isinstance(extra.get("timing"), str):
        return None
    fields: dict[str, Any] = {"timing": extra.pop("timing")}
    for name in ("device", "capability"):
        if isinstance(extra.get(_DEVICE_KEYS[name]), str):
            fields[name] = extra.pop(_DEVICE_KEYS[name])
    cost = extra.get("device_mark_cost_s")
    if _is_number(cost):
        fields["mark_cost_s"] = float(extra.pop("device_mark_cost_s"))
    return DeviceInfo(**fields)


def _recompiles(extra: dict[str, Any]) -> tuple[Recompile, ...] | None:
    raw = extra.get("recompiles")
    if not (isinstance(raw, list) and all(
            isinstance(r, Mapping) and set(r) == set(_RECOMPILE_TYPES)
            and all(type(r[k]) in types for k, types in _RECOMPILE_TYPES.items()) for r in raw)):
        return None
    extra.pop("recompiles")
    return tuple(Recompile(r["call"], r["graphs"], r["reason"], float(r["compile_time_s"])) for r in raw)


def distributed_from_json(raw: Mapping[str, Any]) -> DistributedInfo:
    """The DistributedInfo of an ``extra["distributed"]`` object; entries of the wrong type go to ``details``."""
    details = dict(raw)
    fields: dict[str, Any] = {}

    def take(key: str, ok: bool, value: Any = None) -> None:
        if key in details and ok:
            fields[key] = details.pop(key) if value is None else value
            details.pop(key, None)

    take("rank", _is_int(raw.get("rank")))
    take("world_size", _is_int(raw.get("world_size")))
    take("backend", isinstance(raw.get("backend"), str))
    take("host", isinstance(raw.get("host"), str))
    ranks, missing = raw.get("ranks"), raw.get("missing_ranks", [])
    if (raw.get("merged") is True and isinstance(ranks, list) and all(isinstance(r, Mapping) for r in ranks)
            and isinstance(missing, list) and all(map(_is_int, missing))):
        take("merged", True)
        take("ranks", True, tuple(dict(r) for r in ranks))
        fields.setdefault("missing_ranks", tuple(missing))
        details.pop("missing_ranks", None)
    take("fsdp", isinstance(raw.get("fsdp"), Mapping), dict(raw.get("fsdp") or {}))
    return DistributedInfo(**fields, details=details)


def sections_from_extra(raw_extra: Mapping[str, Any]) -> dict[str, Any]:
    """ProfileMeta keyword arguments of a file's ``extra``: the typed sections and what is left in ``extra``."""
    extra = dict(raw_extra)
    out: dict[str, Any] = {"schedule": _schedule(extra), "device": _device(extra), "recompiles": _recompiles(extra)}
    if isinstance(extra.get("distributed"), Mapping):
        out["distributed"] = distributed_from_json(extra.pop("distributed"))
    if isinstance(extra.get("peaks_note"), str):
        out["peaks_note"] = extra.pop("peaks_note")
    out["extra"] = extra
    return out
