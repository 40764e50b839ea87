"""The dataflow graph as GraphML and as networkx node-link JSON.

Both carry every node attribute of ``analysis.dataflow`` (the record's fields,
its samples, ``time_s`` under the chosen statistic, ``critical_path``) and
an edge ``kind`` (``data`` or ``order``). All graphs of a profile go in one
file; node keys are ``"<graph id>:<node id>"`` so they never collide, and
``graph_id``/``node_id`` attributes give the parts back.

GraphML holds only scalars, so there tuples, lists and dicts (shapes,
dtypes, samples, inputs, memory by category) become their JSON text, the
memory record is flattened into ``memory_*`` keys, ``None`` is left out (an
absent key reads back as "unknown"), and control characters XML cannot hold
become spaces. Node-link JSON keeps native lists, dicts and nulls.
"""

from __future__ import annotations

import io
import json
from typing import IO, TYPE_CHECKING, Any

from graphprof.analysis.critical_path import critical_path
from graphprof.analysis.dataflow import EdgeKind, dataflow_graph
from graphprof.profile.model import Profile
from graphprof.render.escape import strip_control
from graphprof.render.graph_stream import model_typed, write_graphml
from graphprof.render.node_link_stream import write_node_link

if TYPE_CHECKING:  # only the networkx fallback and profile_graph build a graph: the streamed writers need no import
    import networkx as nx


def node_key(graph_id: int, node_id: int) -> str:
    """The key of a node in exported graphs."""
    return f"{graph_id}:{node_id}"


def profile_graph(profile: Profile, stat: str = "median") -> nx.DiGraph:
    """All graphs of a profile in one DiGraph, keyed by ``node_key``, with ``critical_path`` flags."""
    import networkx as nx

    meta = profile.meta
    combined = nx.DiGraph(function=meta.function, device_type=meta.device_type, device_name=meta.device_name,
                          torch_version=meta.torch_version, stat=stat, steps=len(profile.steps),
                          graph_names=[g.name for g in profile.graphs])
    for graph in profile.graphs:
        dag = dataflow_graph(graph, stat=stat)
        on_path = critical_path(dag, stat=stat).node_set
        for n, attrs in dag.nodes(data=True):
            combined.add_node(node_key(graph.id, n), **attrs, graph_name=graph.name, critical_path=n in on_path)
        for a, b, kind in dag.edges(data="kind"):
            combined.add_edge(node_key(graph.id, a), node_key(graph.id, b),
                              kind=kind.value if isinstance(kind, EdgeKind) else str(kind))
    return combined


def _flat_value(value: Any) -> Any:
    if isinstance(value, str):
        return strip_control(value)
    if isinstance(value, (list, tuple, dict)):
        return strip_control(json.dumps(value, ensure_ascii=False))
    return value


def graphml_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """Node attributes as GraphML scalars (the rules in the module docstring)."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if key == "memory" and isinstance(value, dict):
            for mkey, mvalue in value.items():
                out[f"memory_{mkey}"] = _flat_value(mvalue)
            continue
        if value is None:
            continue
        out[key] = _flat_value(value)
    return out


def graphml_via_networkx(profile: Profile, stat: str = "median") -> str:
    """GraphML through networkx's writer: for profiles whose fields hold other types than the model's
    (``graph_stream.model_typed``), whose keys networkx types per value."""
    import networkx as nx

    combined = profile_graph(profile, stat)
    flat = nx.DiGraph(**graphml_attributes(dict(combined.graph)))
    for n, attrs in combined.nodes(data=True):
        flat.add_node(n, **graphml_attributes(attrs))
    flat.add_edges_from(combined.edges(data=True))
    buffer = io.BytesIO()
    nx.write_graphml(flat, buffer, encoding="utf-8", prettyprint=True)
    return buffer.getvalue().decode("utf-8")


def write_graphml_file(profile: Profile, f: IO[str], stat: str = "median") -> None:
    """GraphML of the profile's dataflow graphs into ``f``: streamed, or through networkx
    for a hand-built profile whose fields hold other types than the model's."""
    if model_typed(profile):
        write_graphml(profile, f, stat)
    else:
        f.write(graphml_via_networkx(profile, stat))


def graphml_text(profile: Profile, stat: str = "median") -> str:
    """GraphML of the profile's dataflow graphs as a string (``write_graphml_file``)."""
    buffer = io.StringIO()
    write_graphml_file(profile, buffer, stat)
    return buffer.getvalue()


def node_link_json(profile: Profile, stat: str = "median") -> str:
    """networkx node-link JSON (``nx.node_link_graph(json.load(f), edges="edges")`` reads it back)."""
    buffer = io.StringIO()
    write_node_link(profile, buffer, stat)
    return buffer.getvalue()
