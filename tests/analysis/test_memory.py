"""Memory summary and timeline: on a hand-made profile, on a real one, and after save/load."""

from __future__ import annotations

import pytest

import graphprof
from graphprof.analysis.memory import memory_summary, memory_timeline
from graphprof.api import Profile
from graphprof.demo.steps import mlp_sgd_step
from graphprof.profile.model import (
    DeviceMemorySample, GraphKind, GraphRecord, MemoryPeak, MemoryRecord, NodeRecord, PeakTensor, Phase,
)
from tests.analysis.conftest import node, one_graph_profile
from tests.helpers import run_traced


def _node(i: int, name: str, phase: Phase, alloc: int, freed: int, live: dict[str, int], **kw) -> NodeRecord:
    return node(i, name, name=name, times=(), phase=phase,
                memory=MemoryRecord(alloc, freed, sum(live.values()), live), **kw)


def _hand_profile(device: tuple[DeviceMemorySample, ...] = ()) -> Profile:
    """Parameters 100 B; forward makes a 40 B activation and a 10 B temporary; backward a 100 B gradient."""
    nodes = (
        _node(0, "mm", Phase.FORWARD, 40, 0, {"parameters": 100, "activations": 40},
              module="fc", module_type="Linear", source="model.py:3"),
        _node(1, "relu", Phase.FORWARD, 10, 0, {"parameters": 100, "activations": 40, "temporaries": 10}),
        _node(2, "mm_1", Phase.BACKWARD, 100, 50, {"parameters": 100, "gradients": 100},
              module="fc", module_type="Linear", source="model.py:3"),
    )
    peak = MemoryPeak(node_id=2, live_bytes=250, by_category_bytes={"parameters": 100, "gradients": 100,
                                                                   "activations": 40, "temporaries": 10},
                      largest_tensors=(PeakTensor("fc.weight", 100, "parameters"),
                                       PeakTensor("mm_1", 100, "gradients", 2),
                                       PeakTensor("mm", 40, "activations", 0)),
                      start_bytes=100, allocated_bytes=150)
    return one_graph_profile(nodes, memory_peak=peak, device_memory=device)


def test_summary_of_a_hand_made_profile() -> None:
    s = memory_summary(_hand_profile())
    assert s.has_model and s.peak_bytes == 250
    assert (s.start_bytes, s.end_bytes, s.allocated_bytes, s.freed_bytes) == (100, 200, 150, 50)
    assert s.peak_node is not None and (s.peak_node.name, s.peak_node.module, s.peak_node.source) == ("mm_1", "fc", "model.py:3")
    assert s.by_category_bytes == (("gradients", 100), ("parameters", 100), ("activations", 40), ("temporaries", 10))
    assert [t.made_by.name if t.made_by else None for t in s.largest] == [None, "mm_1", "mm"]
    assert s.device is None


def test_timeline_of_a_hand_made_profile() -> None:
    t = memory_timeline(_hand_profile())
    assert t.categories == ("parameters", "gradients", "activations", "temporaries")  # stacking order
    assert t.live_bytes == (140, 150, 200)
    assert t.during_bytes == (140, 150, 250)  # mm_1's outputs exist next to what it frees
    assert t.live_by_category[t.categories.index("activations")] == (40, 40, 0)
    assert (t.start_bytes, t.peak_index, t.peak_bytes) == (100, 2, 250)
    assert t.phases == ("forward", "forward", "backward")


def test_device_samples_are_summarised_next_to_the_model() -> None:
    samples = (DeviceMemorySample(3, 1, 512, 1024, 2048), DeviceMemorySample(3, 2, 1024, 1536, 2048),
               DeviceMemorySample(4, 1, 512, 1024, 2048), DeviceMemorySample(4, 2, 1536, 2048, 4096))
    profile = _hand_profile(samples)
    s = memory_summary(profile)
    assert s.device is not None
    assert (s.device.samples, s.device.steps, s.device.max_allocated_bytes, s.device.max_peak_bytes,
            s.device.max_reserved_bytes) == (4, 2, 1536, 2048, 4096)
    assert memory_timeline(profile).device_allocated == ((1, 512), (2, 1280))  # median over the steps
    assert "allocator reads over 2 steps" in profile.memory_summary()


def test_profiles_without_memory_records() -> None:
    empty = Profile()
    assert not memory_summary(empty).has_model and memory_timeline(empty).empty
    bare = Profile(graphs=(GraphRecord(0, "step", GraphKind.STEP, (NodeRecord(0, "a", "aten.a", "a"),)),))
    assert not memory_summary(bare).has_model and memory_timeline(bare).empty
    assert "no memory records" in bare.memory_summary()
    assert memory_timeline(bare, graph_id=7).empty


@pytest.fixture(scope="module")
def mlp_profile() -> Profile:
    _, fn = run_traced(mlp_sgd_step(batch_size=4), 4)
    return fn.get_profile()


def test_summary_of_a_real_training_step(mlp_profile: Profile) -> None:
    s = memory_summary(mlp_profile)
    graph = mlp_profile.graphs[0]
    live_after = [n.memory.live_bytes for n in graph.nodes]
    # the peak is the largest in-use figure of any node, and the summary names that node
    during = [n.memory.live_bytes + n.memory.freed_bytes for n in graph.nodes]
    assert s.peak_bytes == max(during) and s.peak_node is not None
    assert during[[n.id for n in graph.nodes].index(s.peak_node.id)] == s.peak_bytes
    assert s.end_bytes == live_after[-1]
    assert s.end_bytes - s.start_bytes == s.allocated_bytes - s.freed_bytes
    assert sum(b for _, b in s.by_category_bytes) == s.peak_bytes
    assert {"parameters", "optimizer_state", "gradients"} <= {c for c, _ in s.by_category_bytes}
    text = mlp_profile.memory_summary()
    assert s.peak_node.name in text and "gradients" in text and ("KiB" in text or "MiB" in text)


def test_memory_survives_save_and_load(mlp_profile: Profile, tmp_path) -> None:
    path = tmp_path / "p.json"
    mlp_profile.save(str(path))
    loaded = graphprof.load(str(path))
    assert loaded.graphs[0].memory_peak == mlp_profile.graphs[0].memory_peak
    def figures(profile: Profile) -> list[tuple]:  # a file may spell absent categories as explicit zeros
        return [(m.allocated_bytes, m.freed_bytes, m.live_bytes, {c: b for c, b in m.live_by_category_bytes.items() if b})
                for m in (n.memory for n in profile.graphs[0].nodes)]

    assert figures(loaded) == figures(mlp_profile)
    assert memory_summary(loaded) == memory_summary(mlp_profile)
    with_samples = _hand_profile((DeviceMemorySample(3, 1, 512, 1024, 2048),))
    with_samples.save(str(path))
    assert graphprof.load(str(path)).graphs[0].device_memory == with_samples.graphs[0].device_memory


def test_summary_text_shows_names_escaped() -> None:
    """Node, op, module, source and tensor names reach the memory summary's text as the terminal shows them."""
    from dataclasses import replace

    from graphprof.render.memory_text import render_memory_summary

    bad = "\x1b[2J\nsecond line"
    profile = _hand_profile()
    graph = profile.graphs[0]
    assert graph.memory_peak is not None
    nodes = tuple(replace(n, name=n.name + bad, op=n.op + bad, module=n.module + bad, source=n.source + bad)
                  for n in graph.nodes)
    tensors = tuple(replace(t, name=t.name + bad) for t in graph.memory_peak.largest_tensors)
    peak = replace(graph.memory_peak, largest_tensors=tensors)
    text = render_memory_summary(memory_summary(replace(profile, graphs=(replace(graph, nodes=nodes, memory_peak=peak),))))
    assert "\\nsecond line" in text and "\x1b" not in text
    assert not [line for line in text.splitlines() if line.lstrip().startswith("second line")]
