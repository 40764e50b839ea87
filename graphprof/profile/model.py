"""The Profile: meta, profiled steps and graphs, saved and loaded as versioned JSON.

There is one Profile class. It is pure data (the records of
``graphprof.profile.records``) with ``to_dict()``, ``save()`` and ``load()``;
its views (``table``, ``report``, ``export``, ``diff``, ...) are functions of
``graphprof.api`` that the methods below call, imported when called so that
this package stays below analysis and rendering.

Why a Profile is also a ``dict``: MegEngine users write
``json.dump(fn.get_profile(), f)``, and both of json's encoders (the C one
and the Python one) serialise a ``dict`` or a subclass of it and nothing
else; no method of an object makes json encode it. So Profile subclasses
``dict`` and its dict content is its JSON document, ``to_dict()``. The
document is built the first time the dict is read and kept: building it costs
about twice a load, most profiles are never dumped, and a loaded 1,000,000-node
profile with its document beside it would no longer fit the memory target.
Every dict read method therefore goes through ``_document()``, and every dict
write raises (a Profile is frozen). The dict's own storage holds the schema id
from construction, because the C encoder writes ``{}`` for a dict whose
storage is empty without asking for its items.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from graphprof.profile import serialize
from graphprof.profile.records import (  # noqa: F401  (re-exported: the data model's one import point)
    MEMORY_CATEGORIES, NS_PER_S, OVERHEAD_NODE, OVERHEAD_OP, SCHEMA_ID, AttrValue, DeviceInfo, DeviceMemorySample,
    DistributedInfo, GraphKind, GraphRecord, MemoryPeak, MemoryRecord, NodeRecord, PeakTensor, Phase, ProfileMeta,
    Recompile, ScheduleInfo, StepRecord, graph_size, node_source, ns_to_s, seconds_to_ns,
)
from graphprof.profile.serialize import ProfileError


@dataclass(frozen=True, eq=False)
class Profile(dict):
    """A whole profile: meta, profiled steps and graphs (see the module docstring for the dict part)."""

    meta: ProfileMeta = field(default_factory=ProfileMeta)
    steps: tuple[StepRecord, ...] = ()
    graphs: tuple[GraphRecord, ...] = ()

    def __post_init__(self) -> None:
        dict.__setitem__(self, "schema", SCHEMA_ID)

    # -- data -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON document of this profile (schema id first); ``save`` writes exactly this."""
        return serialize.profile_to_document(self)

    @classmethod
    def from_dict(cls, document: Any) -> Profile:
        """Validate a parsed JSON document; a malformed one raises ProfileError with one sentence."""
        return cls(*serialize.parts_from_document(document))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as JSON, atomically (a crash leaves no half file)."""
        serialize.write_document(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        """Read and validate a profile file; every failure is one ProfileError sentence."""
        return cls(*serialize.read_parts(path))

    def iter_nodes(self) -> Iterator[tuple[GraphRecord, NodeRecord]]:
        """Every node of every graph, with its graph, in execution order."""
        for graph in self.graphs:
            for node in graph.nodes:
                yield graph, node

    @property
    def node_count(self) -> int:
        return sum(map(graph_size, self.graphs))  # without building a loaded graph's records

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        return (self.meta, self.steps, self.graphs) == (other.meta, other.steps, other.graphs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Profile(function={self.meta.function!r}, graphs={len(self.graphs)}, "
                f"nodes={self.node_count}, steps={len(self.steps)})")

    # -- the dict view of the JSON document (see the module docstring) ---------------
    def _document(self) -> dict[str, Any]:
        cached = self.__dict__.get("_json_document")
        if cached is None:
            cached = self.to_dict()
            object.__setattr__(self, "_json_document", cached)
        return cached

    def __getitem__(self, key: str) -> Any:
        return self._document()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._document())

    def __len__(self) -> int:
        return len(self._document())

    def __contains__(self, key: object) -> bool:
        return key in self._document()

    def keys(self):  # type: ignore[override]
        return self._document().keys()

    def items(self):  # type: ignore[override]
        return self._document().items()

    def values(self):  # type: ignore[override]
        return self._document().values()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return self._document().get(key, default)

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a Profile is read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _readonly  # type: ignore[assignment]

    # -- thin views: the functions of graphprof.api --------------------------------
    def table(self, top: int = 10, **options: Any) -> str:
        """The summary and the ``top`` rows as text; see ``graphprof.api.table`` for the options."""
        from graphprof import api

        return api.table(self, top, **options)

    def report(self, top: int = 10, stat: str = "median", peaks: dict[str, float] | None = None,
               module_depth: int = 2, **options: Any) -> str:
        """The bottleneck report as text; see ``graphprof.api.report``."""
        from graphprof import api

        return api.report(self, top, stat, peaks, module_depth, **options)

    def export(self, path: str | os.PathLike[str], format: str | None = None, **options: Any) -> str:
        """Write this profile in the format ``path`` implies; see ``graphprof.api.export``."""
        from graphprof import api

        return api.export(self, path, format, **options)

    def diff(self, other: Profile | str | os.PathLike[str], top: int = 10, **options: Any) -> str:
        """This profile (before) against ``other`` (after) as text; see ``graphprof.api.diff_text``."""
        from graphprof import api

        return api.diff_text(self, other, top, **options)

    def memory_summary(self, graph_id: int = 0, top: int = 10) -> str:
        """The modelled memory peak of graph ``graph_id`` as text; see ``graphprof.api.memory_summary``."""
        from graphprof import api

        return api.memory_summary(self, graph_id, top)

    def _repr_html_(self) -> str:
        """Jupyter's rich view: summary, MFU/HFU, findings and top nodes, from the HTML report's parts."""
        from graphprof import api

        return api.notebook(self)


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile file (``Profile.load``)."""
    return Profile.load(path)


def profile_from_document(document: Any) -> Profile:
    """Validate a parsed JSON document and build its Profile (``Profile.from_dict``)."""
    return Profile.from_dict(document)


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` to ``path`` atomically (``Profile.save``)."""
    profile.save(path)


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


__all__ = [
    "Profile", "ProfileError", "load_profile", "profile_from_document", "save_profile", "require_samples",
    "MEMORY_CATEGORIES", "NS_PER_S", "OVERHEAD_NODE", "OVERHEAD_OP", "SCHEMA_ID", "AttrValue", "DeviceInfo",
    "DeviceMemorySample", "DistributedInfo", "GraphKind", "GraphRecord", "MemoryPeak", "MemoryRecord", "NodeRecord",
    "PeakTensor", "Phase", "ProfileMeta", "Recompile", "ScheduleInfo", "StepRecord", "graph_size", "node_source",
    "ns_to_s", "seconds_to_ns",
]
