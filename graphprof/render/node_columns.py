"""What the export writers share to read a profile's nodes by column: each graph's slice of the
node frame, and an encoder that runs once per distinct value.

Why: an export of a 100,000-node profile used to walk every ``NodeRecord``
(and through them the records' memory and sample tuples). The node frame's
columns are plain lists in execution order over all graphs, shared with
every other view of the profile and, where the loader provides them, made
without any record; a writer reads node ``i``'s fields as ``column[i]``.
Names, shapes and dtypes repeat across thousands of nodes, so their text is
made once per distinct value (``Encoded``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphprof.analysis.dataflow import EdgeIndex
from graphprof.analysis.frame import NodeFrame
from graphprof.profile.model import GraphRecord, Profile, node_source
from graphprof.profile.node_columns import NodeColumns


class Encoded(dict):
    """``encoded[value]`` is ``encode(value)``, computed once per distinct value.

    ``encoded.column(values)`` maps a whole column through it at C speed.
    """

    def __init__(self, encode: Callable[[Any], Any]) -> None:
        super().__init__()
        self._encode = encode

    def __missing__(self, value: Any) -> Any:
        text = self[value] = self._encode(value)
        return text

    def column(self, values: Sequence[Any]) -> list[Any]:
        return list(map(self.__getitem__, values))


def graph_spans(profile: Profile, frame: NodeFrame) -> list[tuple[GraphRecord, int, int]]:
    """Each graph with the [start, end) range of its nodes in ``frame``'s columns."""
    return [(g, start, end) for g, (start, end) in zip(profile.graphs, frame.spans())]


def adjacency_arrays(edges: EdgeIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sources, destinations and whether each is an ordering edge, in the dataflow graph's adjacency
    order (by source position; each source's data edges, then its ordering edges, each in edge order),
    which is the order networkx lists a ``dataflow_graph``'s edges in."""
    src = np.concatenate((edges.data_src, edges.order_src))
    by_src = np.argsort(src, kind="stable")
    dst = np.concatenate((edges.data_dst, edges.order_dst))[by_src]
    return src[by_src], dst, by_src >= len(edges.data_src)


def adjacency(edges: EdgeIndex) -> tuple[list[int], list[int], list[bool]]:
    """``adjacency_arrays`` as lists."""
    src, dst, order = adjacency_arrays(edges)
    return src.tolist(), dst.tolist(), order.tolist()


def sample_counts(profile: Profile, frame: NodeFrame) -> tuple[list[int], list[int]]:
    """How many host and how many device samples each node has (index = the frame's).

    Why not ``len`` of the time columns: a loaded graph keeps its samples as
    one array of steps x nodes, and making its time columns builds a tuple
    per node (a fifth of a 100,000-node trace export) only to count them.
    """
    host: list[int] = []
    device: list[int] = []
    for graph, lo, hi in graph_spans(profile, frame):
        source = node_source(graph)
        if isinstance(source, NodeColumns):
            host_ns, device_ns = source.samples_ns("host_time_ns"), source.samples_ns("device_time_ns")
            if host_ns is not None and device_ns is not None:
                host += [host_ns.shape[0]] * (hi - lo)
                device += [device_ns.shape[0]] * (hi - lo)
                continue
        host += map(len, frame.column("host_time_ns")[lo:hi])
        device += map(len, frame.column("device_time_ns")[lo:hi])
    return host, device
