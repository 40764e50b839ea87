"""Profiles the export tests share: empty, synthetic (known numbers), hostile names, the real ResNet step.

Synthetic profiles are built from records directly (torch-free); the real one
runs the demo ResNet training step under ``graphprof.trace`` once per test
session (``real_profile`` is cached) and is handed to module-scoped fixtures.
"""

from __future__ import annotations

import functools
from typing import Any

from graphprof.profile.records import seconds_to_ns
from graphprof.api import Profile
from graphprof.profile.model import (
    GraphKind,
    GraphRecord,
    MemoryRecord,
    NodeRecord,
    Phase,
    ProfileMeta,
    StepRecord,
)

#: A name that breaks every text format that does not escape: markup, entities,
#: quotes, a newline, a frame separator, a backslash and a control character.
HOSTILE = 'x</script><!--<b>&amp;"\'\n;ev il\\ \x01end'


def node(i: int, op_type: str, inputs: tuple[int, ...] = (), times: tuple[float, ...] = (1e-3,), **kw: Any) -> NodeRecord:
    """A NodeRecord with sensible defaults (op ``aten.<type>.default``)."""
    kw.setdefault("op", f"aten.{op_type}.default")
    kw.setdefault("phase", Phase.FORWARD)
    return NodeRecord(id=i, name=kw.pop("name", f"{op_type}_{i}"), type=op_type, inputs=inputs,
                      host_time_ns=seconds_to_ns(times), **kw)


def make_profile(nodes: list[NodeRecord] | tuple[NodeRecord, ...], steps: int | None = None,
                 meta: ProfileMeta | None = None, graph_name: str = "step", wall_time_s: float = 0.0) -> Profile:
    """One graph of ``nodes``; ``steps`` StepRecords (default: as many as the samples)."""
    n_steps = max((len(n.host_time_s) for n in nodes), default=0) if steps is None else steps
    return Profile(meta=meta or ProfileMeta(function="synthetic"),
                   steps=tuple(StepRecord(index=2 + k, wall_time_s=wall_time_s) for k in range(n_steps)),
                   graphs=(GraphRecord(id=0, name=graph_name, kind=GraphKind.STEP, nodes=tuple(nodes)),))


def empty_profile() -> Profile:
    """No graphs, no steps: what a trace that never ran its graph yields."""
    return Profile(meta=ProfileMeta(function="empty"))


def synthetic_profile() -> Profile:
    """Six nodes, three steps, FLOPs, bytes and modelled memory, with an in-place write and a view.

    Forward: mm (0) → relu (1) → t view (2); backward: mm (3) reads 1 and 2;
    optimizer: mul_ (4) writes in place the tensor mm (3) produced, add_ (5)
    reads the result.
    """
    mem = lambda live, act: MemoryRecord(allocated_bytes=64, freed_bytes=0, live_bytes=live,  # noqa: E731
                                         live_by_category_bytes={"activations": act, "parameters": live - act})
    nodes = [
        node(0, "mm", (), (2e-3, 3e-3, 2.5e-3), module="fc1", module_type="Linear", source="model.py:10",
             in_shapes=((8, 16), (16, 32)), out_shapes=((8, 32),), flops=2 * 8 * 16 * 32, bytes_read=2560,
             bytes_written=1024, memory=mem(5000, 1000), in_dtypes=("float32", "float32"), out_dtypes=("float32",)),
        node(1, "relu", (0,), (1e-4, 2e-4, 1.5e-4), module="act", module_type="ReLU", source="model.py:11",
             in_shapes=((8, 32),), out_shapes=((8, 32),), flops=256, bytes_read=1024, bytes_written=1024,
             memory=mem(6000, 2000)),
        node(2, "t", (1,), (1e-6, 1e-6, 1e-6), module="act", is_view=True, memory=mem(6000, 2000)),
        node(3, "mm", (1, 2), (4e-3, 4e-3, 5e-3), module="fc1", module_type="Linear", source="model.py:10",
             phase=Phase.BACKWARD, flops=2 * 8 * 32 * 32, bytes_read=2048, bytes_written=4096, memory=mem(7000, 1000)),
        node(4, "mul_", (3,), (3e-5, 3e-5, 3e-5), module="fc1", phase=Phase.OPTIMIZER, flops=1024,
             bytes_read=4096, bytes_written=4096, memory=mem(7000, 1000)),
        node(5, "add_", (4,), (2e-5, 2e-5, 4e-5), module="fc1", phase=Phase.OPTIMIZER, flops=1024,
             bytes_read=8192, bytes_written=4096, memory=mem(7000, 1000)),
    ]
    return make_profile(nodes, wall_time_s=0.01,
                        meta=ProfileMeta(function="synthetic_step", peaks={"flops_per_s": 1e11, "bytes_per_s": 2e10}))


def hostile_profile() -> Profile:
    """Every name a renderer shows is ``HOSTILE``."""
    names = dict(module=HOSTILE, module_type=HOSTILE, source=HOSTILE, scope=HOSTILE, op=HOSTILE, name=HOSTILE)
    nodes = [
        node(0, HOSTILE, (), (1e-3, 2e-3), flops=10, bytes_read=10, bytes_written=10,
             memory=MemoryRecord(live_bytes=10, live_by_category_bytes={HOSTILE: 10}), **names),
        node(1, HOSTILE + "2", (0,), (2e-3, 1e-3), flops=10, bytes_read=10, bytes_written=10, **names),
    ]
    return make_profile(nodes, meta=ProfileMeta(function=HOSTILE, device_name=HOSTILE), graph_name=HOSTILE)


@functools.lru_cache(maxsize=1)
def real_profile() -> Profile:
    """Two profiled steps of the demo ResNet SGD step (batch 2, 16x16 images), without device peaks.

    Why without: a profile records the peaks ``graphprof calibrate`` cached,
    and an earlier test of the session may have calibrated; a test that wants
    peaks puts them in itself, so no result depends on the order tests ran in.
    """
    import dataclasses

    import graphprof
    from graphprof.demo.steps import resnet_sgd_step

    demo = resnet_sgd_step(batch_size=2, image_size=16)
    fn = graphprof.trace(demo.step_fn)
    for i in range(4):
        fn(*demo.make_inputs(i))
    profile = fn.get_profile()
    return dataclasses.replace(profile, meta=dataclasses.replace(profile.meta, peaks={}, peaks_note=""))
