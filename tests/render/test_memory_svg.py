"""The memory timeline SVG: well-formed, labelled, peak marked, names escaped, bounded in size."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from graphprof.api import Profile
from graphprof.demo.steps import mlp_sgd_step
from graphprof.profile.model import GraphKind, GraphRecord, MemoryPeak, MemoryRecord, NodeRecord, Phase, ProfileMeta
from graphprof.render.memory_svg import byte_ticks, memory_timeline_svg
from tests.helpers import run_traced

NS = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> list[str]:
    return ["".join(t.itertext()) for t in ET.fromstring(svg).iter(f"{NS}text")]


def _peak_label_bytes(texts: list[str]) -> float:
    """The bytes the peak label shows, e.g. ``peak 81.1 KiB``."""
    value, unit = next(t for t in texts if t.startswith("peak ")).split()[1:]
    return float(value) * 1024 ** ["B", "KiB", "MiB", "GiB"].index(unit)


@pytest.fixture(scope="module")
def mlp_profile() -> Profile:
    _, fn = run_traced(mlp_sgd_step(batch_size=4), 4)  # calls 3 and 4 are recorded
    return fn.get_profile()


def test_empty_profile_gives_a_well_formed_notice() -> None:
    svg = memory_timeline_svg(Profile())
    assert ET.fromstring(svg).tag == f"{NS}svg"
    assert any("No memory records" in t for t in _texts(svg))


def test_real_profile_has_axes_legend_and_peak(mlp_profile: Profile) -> None:
    svg = memory_timeline_svg(mlp_profile)
    root = ET.fromstring(svg)
    texts = _texts(svg)
    peak = mlp_profile.graphs[0].memory_peak
    assert peak is not None
    # y axis in binary units from 0, x axis numbered nodes, axis titles
    assert any(re.fullmatch(r"[\d.]+ KiB", t) for t in texts)
    assert "live bytes" in texts and "op nodes in execution order" in texts
    assert "0" in texts
    # one filled area per category present, each named in the legend
    areas = [p for p in root.iter(f"{NS}path")]
    names = ["".join(p.find(f"{NS}title").itertext()) for p in areas]
    assert {"parameters", "optimizer_state", "gradients", "activations"} <= set(names)
    assert {"optimizer state", "gradients", "activations", "peak", "freed when the op ends"} <= set(texts)
    # the peak is marked with its size and node
    peak_node = next(n for n in mlp_profile.graphs[0].nodes if n.id == peak.node_id)
    assert _peak_label_bytes(texts) == pytest.approx(peak.live_bytes, rel=5e-3)
    assert f"node {peak_node.id} {peak_node.name}" in texts
    assert {"forward", "backward", "optimizer"} <= {t.split()[0] for t in texts if t.endswith("nodes")}


def test_names_are_escaped() -> None:
    evil = "<script>alert('x')</script> & \"q\""
    nodes = tuple(
        NodeRecord(id=i, name=f"{evil}{i}", op=evil, type="t", module=evil, module_type=evil, source=evil,
                   phase=Phase.FORWARD, memory=MemoryRecord(8, 0, 8 * (i + 1), {"temporaries": 8 * (i + 1)}))
        for i in range(3)
    )
    peak = MemoryPeak(node_id=2, live_bytes=24, by_category_bytes={"temporaries": 24})
    graph = GraphRecord(id=0, name=evil, kind=GraphKind.STEP, nodes=nodes, memory_peak=peak)
    svg = memory_timeline_svg(Profile(meta=ProfileMeta(function=evil), graphs=(graph,)))
    assert "<script>" not in svg
    root = ET.fromstring(svg)  # parses: every name was escaped
    assert any(evil in t for t in _texts(svg))
    assert root.find(f"{NS}title") is not None


def test_large_graphs_are_drawn_per_pixel_column_and_keep_the_peak() -> None:
    n = 20_000
    live = [1000 + (i % 97) * 10 for i in range(n)]
    live[12_345] = 10**6  # one spike
    nodes = tuple(NodeRecord(id=i, name=f"n{i}", op="aten.x", type="x", phase=Phase.BACKWARD,
                             memory=MemoryRecord(0, 0, live[i], {"temporaries": live[i]})) for i in range(n))
    graph = GraphRecord(id=0, name="step", kind=GraphKind.STEP, nodes=nodes,
                        memory_peak=MemoryPeak(node_id=12_345, live_bytes=10**6, by_category_bytes={"temporaries": 10**6}))
    svg = memory_timeline_svg(Profile(graphs=(graph,)))
    assert len(svg) < 200_000  # not one path point per node
    texts = _texts(svg)
    assert _peak_label_bytes(texts) == pytest.approx(10**6, rel=5e-3) and "node 12345 n12345" in texts
    # the spike survives the per-column drawing: the area's highest point is the peak marker's height
    root = ET.fromstring(svg)
    area = next(p for p in root.iter(f"{NS}path"))
    top_y = min(float(pt.split(",")[1]) for pt in re.findall(r"[\d.]+,[\d.]+", area.get("d")))
    marker = next(c for c in root.iter(f"{NS}circle") if c.get("r") == "5")
    assert top_y == pytest.approx(float(marker.get("cy")), abs=0.11)


def test_byte_ticks_are_round_numbers_in_one_unit() -> None:
    values, labels, top = byte_ticks(7.3 * 2**20)
    assert labels[0] == "0" and labels[-1] == "8 MiB" and top == 8 * 2**20
    assert values == [i * 2 * 2**20 for i in range(5)]
    values, labels, top = byte_ticks(900)
    assert labels[-1] == "1000 B" and top == 1000


def test_summary_and_timeline_of_a_saved_profile_need_no_torch(mlp_profile: Profile, tmp_path) -> None:
    path = tmp_path / "step.json"
    mlp_profile.save(str(path))
    code = (
        "import sys, graphprof\n"
        "from graphprof.render.memory_svg import memory_timeline_svg\n"
        f"p = graphprof.load({str(path)!r})\n"
        "assert 'peak' in p.memory_summary() and '<svg' in memory_timeline_svg(p)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
