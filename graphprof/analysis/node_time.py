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

from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import NS_PER_S, NodeRecord, Profile

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


def profile_clock(profile: Profile) -> str:
    """The clock ``auto`` amounts to for ``profile``: ``host`` when no node has device samples,
    ``device`` when every node with samples has them, else ``auto`` (each node on its own)."""
    has_device = mixed = False
    for graph in profile.graphs:
        for node in graph.nodes:
            if node.device_time_ns:
                has_device = True
            elif node.host_time_ns:
                mixed = True
    if not has_device:
        return "host"
    return "auto" if mixed else "device"


def clock_label(clock: str) -> str:
    """``clock`` as a view names it (``auto`` says what it means)."""
    return CLOCK_LABELS.get(clock, f"{clock} clock")


def node_samples_s(node: NodeRecord, clock: str = "auto") -> tuple[float, ...]:
    """The samples of ``node_samples_ns`` in seconds, one per profiled step (for per-step views: traces)."""
    return tuple([t / NS_PER_S for t in node_samples_ns(node, clock)])
