"""The annotated graph: DOT that Graphviz lays out, heatmap, critical path, hiding, module-level collapse."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from graphprof.analysis.critical_path import critical_paths
from graphprof.api import Profile
from graphprof.profile.model import Phase
from graphprof.render import dot as dot_module
from graphprof.render.dot import HEAT_BINS, HEAT_COLOURS, dot_to_svg, heat_bin, profile_dot
from graphprof.render.exporters import ExportError, ExportOptions
from graphprof.render.graph_view import MODULE_LEVEL_BOXES, build_view, is_hideable
from tests.render.export_profiles import HOSTILE, empty_profile, hostile_profile, make_profile, node, synthetic_profile

SVG = "{http://www.w3.org/2000/svg}"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")


def _svg_tree(dot_text: str) -> ET.Element:
    """Lay out with the real dot binary and parse the SVG (it must be well-formed XML)."""
    done = subprocess.run(["dot", "-Tsvg"], input=dot_text.encode(), capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"Warning" not in done.stderr and b"Error" not in done.stderr, done.stderr.decode()
    return ET.fromstring(done.stdout)


def _boxes(svg: ET.Element) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if g.get("class") == "node" and g.findtext(f"{SVG}title") != "legend"]


def _texts(element: ET.Element) -> list[str]:
    return [t.text or "" for t in element.iter(f"{SVG}text")]


def transformer_like(blocks: int = 40, ops_per_module: int = 19) -> Profile:
    """About 5,000 op nodes in a chain: blocks.i.{attn,mlp,norm} in forward, backward and optimizer."""
    nodes, i = [], 0
    for phase in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER):
        for b in range(blocks):
            for sub in ("norm", "attn", "mlp"):
                for _ in range(ops_per_module if phase != Phase.OPTIMIZER else 4):
                    nodes.append(node(i, "mm" if i % 5 == 0 else "add", (i - 1,) if i else (), (1e-6 * (1 + i % 7),),
                                      module=f"blocks.{b}.{sub}", module_type="Linear", phase=phase))
                    i += 1
    return make_profile(nodes)


def test_heat_bins_are_ordered_and_cover_every_share() -> None:
    assert len(HEAT_BINS) == len(HEAT_COLOURS) and list(HEAT_BINS) == sorted(HEAT_BINS)
    assert heat_bin(0.0) == 0 and heat_bin(0.0015) == 1 and heat_bin(0.5) == len(HEAT_BINS) - 1
    assert heat_bin(1.0) == len(HEAT_BINS) - 1


@needs_dot
def test_real_graph_renders_with_one_box_per_op(real: Profile) -> None:
    svg = _svg_tree(profile_dot(real, ExportOptions(module_level=False)))
    assert len(_boxes(svg)) == real.node_count
    legend = [g for g in svg.iter(f"{SVG}g") if g.findtext(f"{SVG}title") == "legend"]
    assert legend and any("share of step time" in t for t in _texts(legend[0]))


def test_heatmap_colours_critical_path_and_labels() -> None:
    p = synthetic_profile()
    text = profile_dot(p, ExportOptions(bounds={(0, 3): "compute"}))
    (cp,) = critical_paths(p)
    lines = {line.strip().split(" ", 1)[0]: line for line in text.splitlines() if line.strip().startswith("n0_") and "->" not in line}
    slowest = lines["n0_3"]  # backward mm, 4 ms of ~9 ms: the top bin
    assert f'fillcolor="{HEAT_COLOURS[-1]}"' in slowest and "compute" in slowest and "16.4 KFLOP" in slowest
    for nid in range(6):
        assert ("penwidth=3" in lines[f"n0_{nid}"]) is (nid in cp.node_set)
    edges = [line for line in text.splitlines() if "->" in line and "style=invis" not in line]
    bold = [line for line in edges if "penwidth=3" in line]
    assert len(bold) == len(cp.nodes) - 1
    assert "compute" not in lines["n0_0"]  # no bound known: omitted, not "None"


def test_hiding_views_keeps_dependencies() -> None:
    p = make_profile([node(0, "mm"), node(1, "t", (0,), is_view=True), node(2, "relu", (1,)),
                      node(3, "empty"), node(4, "add", (2, 3)), node(5, "getitem", (4,)), node(6, "neg", (5,))])
    assert [is_hideable(n) for n in p.graphs[0].nodes] == [False, True, False, True, False, True, False]
    view = build_view(p, hide_views=True)
    assert {n.key for n in view.nodes} == {"n0_0", "n0_2", "n0_4", "n0_6"} and view.hidden == 3
    shown = {(e.src, e.dst) for e in view.edges if not e.layout_only}
    assert shown == {("n0_0", "n0_2"), ("n0_2", "n0_4"), ("n0_4", "n0_6")}


@needs_dot
def test_5000_node_graph_collapses_to_a_readable_module_level_picture() -> None:
    p = transformer_like()
    assert p.node_count >= 5000
    text = profile_dot(p, ExportOptions())  # automatic: above the node threshold
    svg = _svg_tree(text)
    boxes = _boxes(svg)
    assert 0 < len(boxes) <= MODULE_LEVEL_BOXES
    labels = [" ".join(_texts(b)) for b in boxes]
    assert any("blocks.0" in label for label in labels)
    assert all(" ops" in label or " op" in label for label in labels)
    assert any("module level" in t for t in _texts(svg))
    forced = build_view(p, module_level=False, max_nodes=10)
    assert len(forced.nodes) == p.node_count  # --node-level wins over the threshold


def test_module_level_sums_time_and_flops_per_module() -> None:
    p = synthetic_profile()
    view = build_view(p, module_level=True)
    by_title = {(n.cluster[-1], n.title): n for n in view.nodes}
    fc1_fwd = by_title[("forward", "fc1")]
    assert fc1_fwd.time_s == pytest.approx(2.5e-3) and fc1_fwd.flops == 8192 and fc1_fwd.members == 1
    opt = by_title[("optimizer", "fc1")]
    assert opt.members == 2 and opt.time_s == pytest.approx(5e-5) and opt.flops == 2048
    assert sum(n.time_s for n in view.nodes) == pytest.approx(view.total_time_s)


@needs_dot
def test_hostile_names_render_literally() -> None:
    text = profile_dot(hostile_profile(), ExportOptions())
    for line in text.splitlines():
        assert line.count('"') % 2 == 0 or '\\"' in line  # no unbalanced quotes
    svg = _svg_tree(text)
    texts = _texts(svg)
    first_line = HOSTILE.split("\n")[0]
    assert first_line in texts  # '&amp;' stayed literal, '<' and quotes too
    assert any(t.startswith(";ev il\\") for t in texts)  # the newline became a line break, the backslash stayed
    svg_module = ET.fromstring(dot_to_svg(profile_dot(hostile_profile(), ExportOptions(module_level=True))))
    assert first_line in _texts(svg_module)


@needs_dot
def test_empty_profile_renders() -> None:
    svg = _svg_tree(profile_dot(empty_profile(), ExportOptions()))
    assert _boxes(svg) == []


def test_missing_dot_is_one_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dot_module.shutil, "which", lambda name: None)
    with pytest.raises(ExportError, match="Graphviz's dot program") as info:
        dot_to_svg("digraph {}")
    assert "\n" not in str(info.value)


def test_tooltip_bytes_follow_the_bytes_moved_rule() -> None:
    """Read plus written, either alone when the other is unknown, as the tables and the HTML report count them."""
    nodes = [node(0, "fill_", bytes_read=None, bytes_written=128), node(1, "sum", (0,), bytes_read=256, bytes_written=None),
             node(2, "mul", (1,), bytes_read=64, bytes_written=32), node(3, "relu", (2,))]
    view = build_view(make_profile(nodes), module_level=False)
    tooltips = {n.key: n.tooltip.splitlines()[-1] for n in view.nodes}
    assert tooltips == {"n0_0": "bytes: 128 B", "n0_1": "bytes: 256 B", "n0_2": "bytes: 96 B", "n0_3": "bytes: N/A"}
