"""Chrome/Perfetto trace (Trace Event Format) of a profile.

Opens in ``chrome://tracing``, https://ui.perfetto.dev and speedscope. Layout:

- one process (pid 1) named after the traced function; a profile merged
  from several ranks (``graphprof merge``) gets one process per rank
  (pid = rank + 1, named "rank r"), each with its own step spans (the rank's
  own wall time) and graph tracks, steps starting together on every rank;
- track 0 holds one span per profiled step; every graph and phase gets its
  own track ("step · forward", "step · backward", "step · optimizer");
- a complete event (``"ph": "X"``) per node per profiled step, lasting the
  node's measured time. Nodes of a step are laid end to end in execution
  order from the step's start (on CPU ops run one at a time, so this is
  the real timeline up to probe cost). Steps are laid end to end too: step
  k starts where step k-1's span ends, the span lasting the step's wall
  time (or the sum of its nodes when larger, which only rounding causes);
- ``args`` of a node: op, name, module, source, shapes, dtypes, FLOPs,
  bytes, achieved FLOP/s and bandwidth, the roofline bound when known, and
  ``critical_path`` (the node lies on its graph's critical path under the
  chosen statistic; such events also get the reserved colour ``terrible``);
- a counter track (``"ph": "C"``) "live memory" with the modelled live bytes
  after each node, split by category, when the memory pass filled them
  (written where they change: a counter holds its value until the next
  sample, so a node that leaves them as they were adds nothing to the
  track, and a third of a transformer's nodes do; the first node of each
  graph in each step always writes them), and
  one "device memory" with the allocator's allocated and reserved bytes where
  it was sampled (on an accelerator).

Sample k of every graph belongs to step k (graphs of a step run in order).
Timestamps are microseconds, as the format requires. The events are made and
written by ``render.chrome_stream``, straight to the file on export.
"""

from __future__ import annotations

import io
import json
import operator
from itertools import compress
from typing import Any

from graphprof.analysis.frame import node_frame
from graphprof.profile.model import Profile
from graphprof.render.chrome_stream import PID, STEP_TID, write_chrome_trace
from graphprof.render.chrome_texts import CRITICAL_CNAME
from graphprof.render.export_options import Bounds
from graphprof.render.node_columns import sample_counts

__all__ = ["CRITICAL_CNAME", "PID", "STEP_TID", "bytes_per_node_step", "chrome_trace", "chrome_trace_json",
           "node_events"]


def chrome_trace_json(profile: Profile, stat: str = "median", bounds: Bounds | None = None) -> str:
    """The trace as JSON text (``chrome_stream.write_chrome_trace`` into a string)."""
    buffer = io.StringIO()
    write_chrome_trace(profile, buffer, stat=stat, bounds=bounds)
    return buffer.getvalue()


def chrome_trace(profile: Profile, stat: str = "median", bounds: Bounds | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents`` plus ``otherData``)."""
    return json.loads(chrome_trace_json(profile, stat=stat, bounds=bounds))


def node_events(profile: Profile) -> int:
    """How many node events a trace of ``profile`` holds: one per node per profiled step."""
    frame = node_frame(profile)  # columns: a loaded profile builds no record to count its events
    host, device = sample_counts(profile, frame)
    # A node's events follow its device samples where it has any, else its host samples (``d or h``),
    # summed without a Python step per node: a generator over 100,000 nodes was 3% of a trace export.
    return sum(device) + sum(compress(host, map(operator.not_, device)))


def bytes_per_node_step(profile: Profile, file_bytes: int) -> float | None:
    """A trace file's size per node per profiled step (None for a profile without samples).

    The figure to plan with: a trace of N nodes over S steps takes about
    N x S times this (steps, counters and metadata are included in it).
    """
    events = node_events(profile)
    return file_bytes / events if events else None
