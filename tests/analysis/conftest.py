"""Profile builders shared by the analysis tests.

Hand-built records keep a test's numbers visible in the test; these functions
fill in everything else the same way in every file: a node is ``aten.<type>.default``
named ``<type>_<id>``, a graph is one step graph, a profile has one graph.
Import them (``from tests.analysis.conftest import node, graph, one_graph_profile``).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Sequence

import graphprof
from graphprof.profile.records import seconds_to_ns
from graphprof.api import Profile
from graphprof.profile.model import GraphKind, GraphRecord, NodeRecord, ProfileMeta, StepRecord


def node(i: int, op_type: str = "op", inputs: Iterable[int] = (), times: Iterable[float] = (1.0,),
         **fields: Any) -> NodeRecord:
    """Node ``i``: op ``aten.<op_type>.default``, name ``<op_type>_<i>``, host times ``times`` (s)."""
    fields.setdefault("op", f"aten.{op_type}.default")
    fields.setdefault("name", f"{op_type}_{i}")
    return NodeRecord(id=i, type=op_type, inputs=tuple(inputs), host_time_ns=seconds_to_ns(tuple(times)), **fields)


def graph(*nodes: NodeRecord, graph_id: int = 0, name: str = "g", kind: GraphKind = GraphKind.STEP,
          **fields: Any) -> GraphRecord:
    """A graph of ``nodes``; ``fields`` are GraphRecord's others (``memory_peak``, ``device_memory``)."""
    return GraphRecord(id=graph_id, name=name, kind=kind, nodes=tuple(nodes), **fields)


def one_graph_profile(nodes: Iterable[NodeRecord], walls_s: Sequence[float] = (), first_step: int = 0,
                      meta: ProfileMeta | None = None, **graph_fields: Any) -> Profile:
    """One step graph named ``step`` holding ``nodes``; a StepRecord per wall time, numbered from ``first_step``."""
    graph_fields.setdefault("name", "step")
    steps = tuple(StepRecord(index=first_step + k, wall_time_s=w) for k, w in enumerate(walls_s))
    return Profile(meta=meta or ProfileMeta(), steps=steps, graphs=(graph(*nodes, **graph_fields),))


def traced_profile(step: Callable[..., Any], inputs: Callable[[int], tuple], steps: int = 6,
                   **options: Any) -> Any:
    """Trace ``step``, call it on ``inputs(0)`` .. ``inputs(steps - 1)`` (warnings silenced), return its profile."""
    fn = graphprof.trace(step, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(steps):
            fn(*inputs(i))
    return fn.get_profile()
