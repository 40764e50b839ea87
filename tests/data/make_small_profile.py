"""Build tests/data/small_profile.json, the hand-made profile of the analyzer's golden tests.

A two-layer MLP with LayerNorm, a cross-entropy loss and SGD, captured as two
graphs (forward; backward with the optimizer update), profiled for 3 steps.
Chosen to reach every corner of the analyzer: ops without a FLOP formula
(layer norm, log-softmax, nll loss), a zero-duration view, a float16 input,
all four phases, scopes, nested modules, memory records, and per-step times
that differ so median, mean, min and max all differ.

Run ``python tests/data/make_small_profile.py`` to rewrite the file; the
tests check that the checked-in file equals what this script builds.
"""

from __future__ import annotations

import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from graphprof.profile.records import seconds_to_ns
from graphprof.profile.model import (  # noqa: E402
    GraphKind, GraphRecord, MemoryRecord, NodeRecord, Phase, Profile, ProfileMeta, StepRecord,
)

PATH = os.path.join(HERE, "small_profile.json")
F, B, O, X = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER
OPT_SCOPE = "Optimizer.step#SGD.step"


class _Builder:
    """Adds nodes with consecutive ids and a running live-memory figure."""

    def __init__(self, live_bytes: int) -> None:
        self.nodes: list[NodeRecord] = []
        self.live = live_bytes

    def add(self, name: str, op: str, times_us: tuple[float, float, float], *, phase: Phase = F,
            module: str = "", module_type: str = "", source: str = "", scope: str = "",
            inputs: tuple[int, ...] = (), in_shapes: tuple[Any, ...] = (), out_shapes: tuple[Any, ...] = (),
            in_dtypes: tuple[str, ...] | None = None, out_dtypes: tuple[str, ...] | None = None,
            flops: int | None = None, bytes_read: int | None = None, bytes_written: int | None = None,
            alloc: int = 0, freed: int = 0, is_view: bool = False) -> int:
        self.live += alloc - freed
        node_id = len(self.nodes)
        self.nodes.append(NodeRecord(
            id=node_id, name=name, op=op, type=op.split(".")[1], inputs=inputs, in_shapes=in_shapes,
            in_dtypes=in_dtypes if in_dtypes is not None else ("float32",) * len(in_shapes),
            out_shapes=out_shapes,
            out_dtypes=out_dtypes if out_dtypes is not None else ("float32",) * len(out_shapes),
            module=module, module_type=module_type, source=source, phase=phase, scope=scope, is_view=is_view,
            flops=flops, bytes_read=bytes_read, bytes_written=bytes_written,
            memory=MemoryRecord(allocated_bytes=alloc, freed_bytes=freed, live_bytes=self.live,
                                live_by_category_bytes={"parameters": 6248, "activations": self.live - 6248}),
            host_time_ns=seconds_to_ns(tuple(t / 1e6 for t in times_us)),  # t / 1e6 is exact to the decimal; t * 1e-6 is not
        ))
        return node_id


def _forward() -> GraphRecord:
    g = _Builder(live_bytes=6248 + 256)
    g.add("_to_copy", "aten._to_copy.default", (4.0, 3.0, 5.0), scope="data", source="train.py:20",
          in_shapes=((8, 16),), in_dtypes=("float16",), out_shapes=((8, 16),), flops=0,
          bytes_read=256, bytes_written=512, alloc=512)
    g.add("addmm", "aten.addmm.default", (12.0, 10.0, 11.0), module="encoder.fc1", module_type="Linear",
          source="model.py:11", inputs=(0,), in_shapes=((32,), (8, 16), (16, 32)), out_shapes=((8, 32),),
          flops=8192, bytes_read=2688, bytes_written=1024, alloc=1024)
    g.add("relu", "aten.relu.default", (3.0, 3.5, 2.5), module="encoder.act", module_type="ReLU",
          source="model.py:12", inputs=(1,), in_shapes=((8, 32),), out_shapes=((8, 32),),
          flops=256, bytes_read=1024, bytes_written=1024, alloc=1024)
    g.add("view", "aten.view.default", (0.0, 0.0, 0.0), module="encoder.act", module_type="ReLU",
          source="model.py:12", inputs=(2,), in_shapes=((8, 32),), out_shapes=((8, 32),),
          flops=0, bytes_read=0, bytes_written=0, is_view=True)
    g.add("addmm_1", "aten.addmm.default", (20.0, 18.0, 30.0), module="encoder.fc2", module_type="Linear",
          source="model.py:13", inputs=(3,), in_shapes=((32,), (8, 32), (32, 32)), out_shapes=((8, 32),),
          flops=16384, bytes_read=5248, bytes_written=1024, alloc=1024)
    g.add("native_layer_norm", "aten.native_layer_norm.default", (9.0, 8.0, 8.5), module="norm",
          module_type="LayerNorm", source="model.py:14", inputs=(4,), in_shapes=((8, 32), (32,), (32,)),
          out_shapes=((8, 32), (8, 1), (8, 1)), alloc=1088)
    g.add("addmm_2", "aten.addmm.default", (7.0, 6.0, 6.5), module="head", module_type="Linear",
          source="model.py:15", inputs=(5,), in_shapes=((10,), (8, 32), (32, 10)), out_shapes=((8, 10),),
          flops=5120, bytes_read=2344, bytes_written=320, alloc=320)
    g.add("_log_softmax", "aten._log_softmax.default", (5.0, 4.0, 4.5), module="loss",
          module_type="CrossEntropyLoss", source="train.py:22", inputs=(6,), in_shapes=((8, 10),),
          out_shapes=((8, 10),), alloc=320)
    g.add("nll_loss_forward", "aten.nll_loss_forward.default", (3.0, 2.0, 2.5), module="loss",
          module_type="CrossEntropyLoss", source="train.py:22", inputs=(7,), in_shapes=((8, 10), (8,)),
          in_dtypes=("float32", "int64"), out_shapes=((), ()), alloc=8)
    return GraphRecord(id=0, name="forward", kind=GraphKind.FORWARD, nodes=tuple(g.nodes))


def _backward() -> GraphRecord:
    g = _Builder(live_bytes=6248 + 4600)
    g.add("nll_loss_backward", "aten.nll_loss_backward.default", (4.0, 3.0, 3.5), phase=B, module="loss",
          module_type="CrossEntropyLoss", source="train.py:22", in_shapes=((), (8, 10), (8,)),
          in_dtypes=("float32", "float32", "int64"), out_shapes=((8, 10),), alloc=320)
    g.add("_log_softmax_backward_data", "aten._log_softmax_backward_data.default", (4.0, 5.0, 4.0), phase=B,
          module="loss", module_type="CrossEntropyLoss", source="train.py:22", inputs=(0,),
          in_shapes=((8, 10), (8, 10)), out_shapes=((8, 10),), flops=240, bytes_read=640,
          bytes_written=320, alloc=320, freed=320)
    g.add("mm", "aten.mm.default", (6.0, 5.0, 5.5), phase=B, module="head", module_type="Linear",
          source="model.py:15", inputs=(1,), in_shapes=((8, 10), (10, 32)), out_shapes=((8, 32),),
          flops=5120, bytes_read=1600, bytes_written=1024, alloc=1024)
    g.add("mm_1", "aten.mm.default", (6.0, 7.0, 6.0), phase=B, module="head", module_type="Linear",
          source="model.py:15", inputs=(1,), in_shapes=((10, 8), (8, 32)), out_shapes=((10, 32),),
          flops=5120, bytes_read=1344, bytes_written=1280, alloc=1280, freed=320)
    g.add("native_layer_norm_backward", "aten.native_layer_norm_backward.default", (15.0, 14.0, 16.0),
          phase=B, module="norm", module_type="LayerNorm", source="model.py:14", inputs=(2,),
          in_shapes=((8, 32), (8, 32), (8, 1), (8, 1), (32,), (32,)), out_shapes=((8, 32), (32,), (32,)),
          alloc=1280, freed=1024)
    g.add("mm_2", "aten.mm.default", (9.0, 8.0, 10.0), phase=B, module="encoder.fc2", module_type="Linear",
          source="model.py:13", inputs=(4,), in_shapes=((8, 32), (32, 32)), out_shapes=((8, 32),),
          flops=16384, bytes_read=5120, bytes_written=1024, alloc=1024)
    g.add("mm_3", "aten.mm.default", (10.0, 9.0, 9.5), phase=B, module="encoder.fc2", module_type="Linear",
          source="model.py:13", inputs=(4,), in_shapes=((32, 8), (8, 32)), out_shapes=((32, 32),),
          flops=16384, bytes_read=2048, bytes_written=4096, alloc=4096, freed=1024)
    g.add("threshold_backward", "aten.threshold_backward.default", (3.0, 2.0, 2.5), phase=B,
          module="encoder.act", module_type="ReLU", source="model.py:12", inputs=(5,),
          in_shapes=((8, 32), (8, 32)), out_shapes=((8, 32),), flops=256, bytes_read=2048,
          bytes_written=1024, alloc=1024, freed=1024)
    g.add("mm_4", "aten.mm.default", (8.0, 8.0, 9.0), phase=B, module="encoder.fc1", module_type="Linear",
          source="model.py:11", inputs=(7,), in_shapes=((32, 8), (8, 16)), out_shapes=((32, 16),),
          flops=8192, bytes_read=1536, bytes_written=2048, alloc=2048, freed=1024)
    for i, (module, size) in enumerate((("encoder.fc1", 2048), ("encoder.fc2", 4096), ("head", 1280))):
        g.add(f"add__{i}", "aten.add_.Tensor", (2.0 + i, 2.5 + i, 2.0 + i), phase=O, module=module,
              module_type="Linear", source="train.py:25", scope=OPT_SCOPE, inputs=(8,),
              in_shapes=((size // 4,), (size // 4,)), out_shapes=((size // 4,),), flops=size // 4,
              bytes_read=2 * size, bytes_written=size, freed=size)
    g.add("copy_", "aten.copy_.default", (1.0, 1.5, 1.0), phase=X, source="train.py:27", scope="metrics",
          in_shapes=((), ()), out_shapes=((),), flops=None, bytes_read=8, bytes_written=4)
    return GraphRecord(id=1, name="backward", kind=GraphKind.BACKWARD, nodes=tuple(g.nodes))


def build() -> Profile:
    """The small profile, built from scratch (no torch)."""
    meta = ProfileMeta(function="train_step", capture="dynamo", device_type="cpu", device_name="test-cpu",
                       created_at="2026-01-01T00:00:00+0000", graphprof_version="0.1.0",
                       torch_version="2.13.0+cpu", python_version="3.11.7", probe_cost_s=5e-8)
    steps = (StepRecord(index=2, wall_time_s=215e-6, graph_time_s=205e-6),
             StepRecord(index=3, wall_time_s=198e-6, graph_time_s=190e-6),
             StepRecord(index=4, wall_time_s=221e-6, graph_time_s=210e-6))
    return Profile(meta=meta, steps=steps, graphs=(_forward(), _backward()))


if __name__ == "__main__":
    build().save(PATH)
    print(f"wrote {PATH}")
