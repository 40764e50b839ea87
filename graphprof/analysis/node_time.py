"""A node's time under a statistic and a clock: the one place seconds are made from samples.

Samples are integer nanoseconds (``NodeRecord.host_time_ns``/``device_time_ns``);
the statistic runs on them and the result is divided once by ``NS_PER_S``.
Table, report, dataflow, roofline, critical path, HTML and diff all read a
node's time through ``node_time_s`` (or ``node_times_s`` for many nodes),
so a node never shows two times for one statistic and clock.

Clocks:

* ``host``: host time (on an accelerator, only the time to dispatch the op);
* ``device``: device time (0 for a node without device samples);
* ``auto``: per node, device time where it was recorded, else host time. A
  profile with a host graph beside a device-timed graph shows each node on
  its own clock, everywhere.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import NS_PER_S, GraphRecord, NodeRecord, Profile, node_source
from graphprof.profile.node_columns import NodeColumns

CLOCKS = ("auto", "host", "device")
#: How a view names the clock its times are on.
CLOCK_LABELS = {"auto": "device clock where recorded, else host", "host": "host clock", "device": "device clock"}


def node_samples_ns(node: NodeRecord, clock: str = "auto") -> tuple[int, ...]:
    """The samples (ns, one per profiled step) a node's time on ``clock`` comes from."""
    if clock == "host":
        return node.host_time_ns
    if clock == "device":
        return node.device_time_ns
    return node.device_time_ns or node.host_time_ns


def node_time_s(node: NodeRecord, stat: str = "median", clock: str = "auto") -> float:
    """A node's time in seconds under ``stat`` (median, mean, min, max, stdev) on ``clock``."""
    return stat_fn(stat)(node_samples_ns(node, clock)) / NS_PER_S


def node_times_s(nodes: Iterable[NodeRecord], stat: str = "median", clock: str = "auto") -> list[float]:
    """``node_time_s`` of every node, in order (the statistic is looked up once)."""
    fn = stat_fn(stat)
    if clock == "host":
        return [fn(n.host_time_ns) / NS_PER_S for n in nodes]
    if clock == "device":
        return [fn(n.device_time_ns) / NS_PER_S for n in nodes]
    return [fn(n.device_time_ns or n.host_time_ns) / NS_PER_S for n in nodes]


#: Below this magnitude an int64 sample, and the sum of two, convert to float64 exactly.
_EXACT_NS = 2**52


def _array_times_s(samples: np.ndarray, stat: str) -> list[float] | None:
    """``node_times_s`` of nodes whose samples are the columns of ``samples`` (steps x nodes, int64),
    computed with whole-array operations; None where the result could differ in the last bit.

    Each step mirrors the Python statistic on the same integers: a median of an
    even count is the sum of the middle two (exact in int64) halved, a mean the
    exact integer sum rounded once to a float and divided by the count; both are
    exact below ``_EXACT_NS``, so the floats equal the Python path's bit for
    bit. stdev, and magnitudes beyond that bound, take the Python path.
    """
    steps, n = samples.shape
    if steps == 0:
        return [0.0] * n
    if n == 0:
        return []
    if stat not in ("median", "mean", "min", "max"):
        return None
    big = max(-int(samples.min()), int(samples.max()))
    if big >= _EXACT_NS or big * steps >= 2**62:
        return None
    if stat == "median":
        if steps % 2:
            values = np.sort(samples, axis=0)[steps // 2] if steps > 1 else samples[0]
            result = values.astype(np.float64)
        else:
            ordered = np.sort(samples, axis=0)
            result = (ordered[steps // 2 - 1] + ordered[steps // 2]).astype(np.float64) / 2
    elif stat == "mean":
        result = samples.sum(axis=0).astype(np.float64) / steps
    elif stat == "min":
        result = samples.min(axis=0).astype(np.float64)
    else:
        result = samples.max(axis=0).astype(np.float64)
    return (result / NS_PER_S).tolist()  # type: ignore[no-any-return]


def _columns_samples(columns: NodeColumns, clock: str) -> np.ndarray | None:
    """The sample array each node's time on ``clock`` comes from, or None when nodes differ (per-node files)."""
    if clock in ("host", "device"):
        return columns.samples_ns(f"{clock}_time_ns")
    device = columns.samples_ns("device_time_ns")
    if device is None:
        return None
    return device if device.shape[0] else columns.samples_ns("host_time_ns")


def graph_times_s(graph: GraphRecord, stat: str = "median", clock: str = "auto") -> list[float]:
    """``node_times_s`` of every node of ``graph``: from its loaded columns without records where it has them."""
    columns = node_source(graph)
    if not isinstance(columns, NodeColumns):
        return node_times_s(graph.nodes, stat, clock)
    samples = _columns_samples(columns, clock)
    if samples is not None:
        times = _array_times_s(samples, stat)
        if times is not None:
            return times
    fn = stat_fn(stat)
    if clock in ("host", "device"):
        return [fn(s) / NS_PER_S for s in columns.column(f"{clock}_time_ns")]
    return [fn(d or h) / NS_PER_S for d, h in zip(columns.column("device_time_ns"), columns.column("host_time_ns"))]


def _clock_flags(graph: GraphRecord) -> tuple[bool, bool]:
    """(some node has device samples, some node has host samples but no device ones)."""
    pairs: Iterable[tuple[tuple[int, ...], tuple[int, ...]]]
    columns = node_source(graph)
    if isinstance(columns, NodeColumns):
        device, host = columns.samples_ns("device_time_ns"), columns.samples_ns("host_time_ns")
        if device is not None and host is not None:
            some = columns.size > 0
            return some and device.shape[0] > 0, some and device.shape[0] == 0 and host.shape[0] > 0
        pairs = zip(columns.column("device_time_ns"), columns.column("host_time_ns"))
    else:
        pairs = ((n.device_time_ns, n.host_time_ns) for n in graph.nodes)
    has_device = mixed = False
    for device_ns, host_ns in pairs:
        if device_ns:
            has_device = True
        elif host_ns:
            mixed = True
    return has_device, mixed


def profile_clock(profile: Profile) -> str:
    """The clock ``auto`` amounts to for ``profile``: ``host`` when no node has device samples,
    ``device`` when every node with samples has them, else ``auto`` (each node on its own)."""
    has_device = mixed = False
    for graph in profile.graphs:
        graph_device, graph_mixed = _clock_flags(graph)
        has_device = has_device or graph_device
        mixed = mixed or graph_mixed
    if not has_device:
        return "host"
    return "auto" if mixed else "device"


def clock_label(clock: str) -> str:
    """``clock`` as a view names it (``auto`` says what it means)."""
    return CLOCK_LABELS.get(clock, f"{clock} clock")


def node_samples_s(node: NodeRecord, clock: str = "auto") -> tuple[float, ...]:
    """The samples of ``node_samples_ns`` in seconds, one per profiled step (for per-step views: traces)."""
    return tuple([t / NS_PER_S for t in node_samples_ns(node, clock)])
