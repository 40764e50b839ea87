"""The module-level picture's boxes and arrows, made from codes, against the op-level dataflow graph."""

from __future__ import annotations

import dataclasses

import pytest

from graphprof.analysis.aggregate import truncate_module
from graphprof.analysis.dataflow import EdgeKind, dataflow_graph
from graphprof.api import Profile
from graphprof.profile.model import Phase
from graphprof.render.graph_view import TOP_LEVEL, GraphView, build_view
from tests.render.export_profiles import make_profile, node


def _two_graphs() -> Profile:
    """Two graphs; boxes joined by data and ordering edges (an in-place write), modules of several depths,
    top-level ops, and a box whose ops are not contiguous."""
    modules = ["a.x", "a.y", "", "b.z.w", "a.x", "b", "a.y", "b.z"]
    nodes = [node(i, "mul_" if i == 5 else "add", (i - 1,) if i else (), (1e-6 * (i + 1),), module=m,
                  phase=Phase.BACKWARD if i >= 6 else Phase.FORWARD, flops=i or None)
             for i, m in enumerate(modules)]
    nodes[5] = dataclasses.replace(nodes[5], inputs=(3,))  # writes op 3's output in place after op 4 read it
    nodes[7] = dataclasses.replace(nodes[7], inputs=(6, 1, 3))
    first = make_profile(nodes)
    second = dataclasses.replace(first.graphs[0], id=1, name="second")
    return dataclasses.replace(first, graphs=(first.graphs[0], second))


def _expected_edges(profile: Profile, view: GraphView) -> list[tuple[str, str, EdgeKind]]:
    """Each op edge between different boxes, in the dataflow graph's order; a data edge wins over an ordering one."""
    key = {(n.cluster, n.title): n.key for n in view.nodes}
    out: dict[tuple[str, str], EdgeKind] = {}
    for graph in profile.graphs:
        box = {n.id: key[((graph.name, n.phase.value), truncate_module(n.module, view.depth) or TOP_LEVEL)]
               for n in graph.nodes}
        for a, b, kind in dataflow_graph(graph).edges(data="kind"):
            if box[a] != box[b] and out.get((box[a], box[b])) != EdgeKind.DATA:
                out[(box[a], box[b])] = kind
    return [(a, b, kind) for (a, b), kind in out.items()]


def test_arrows_between_boxes_follow_the_op_edges() -> None:
    profile = _two_graphs()
    for depth_nodes in (150, 4):  # deep enough for every module, and a shallower picture
        view = build_view(profile, module_level=True, max_nodes=depth_nodes)
        assert [(e.src, e.dst, e.kind) for e in view.edges] == _expected_edges(profile, view)
        assert any(e.kind is EdgeKind.ORDER for e in view.edges) or depth_nodes == 4  # boxes joined only by an order edge


def test_boxes_come_in_order_of_their_first_op_with_every_ops_time() -> None:
    profile = _two_graphs()
    view = build_view(profile, module_level=True)
    titles = [(n.cluster, n.title) for n in view.nodes]
    assert titles[:4] == [(("step", "forward"), "a.x"), (("step", "forward"), "a.y"), (("step", "forward"), TOP_LEVEL),
                          (("step", "forward"), "b.z.w")]
    assert len(titles) == len(set(titles)) == 2 * 7
    members = {t: n.members for t, n in zip(titles, view.nodes)}
    assert members[(("step", "forward"), "a.x")] == 2  # ops 0 and 4, apart
    assert sum(n.time_s for n in view.nodes) == pytest.approx(view.total_time_s)
    assert [n.flops for n in view.nodes[:2]] == [None, 1]  # op 0's FLOPs are unknown: so are its box's
