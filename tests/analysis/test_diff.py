"""graphprof.diff: node matching, deltas, aggregates and the regression gate.

Hand-built profiles pin down the rules exactly; real profiles of two small
MLP training steps show the behaviour users rely on (a changed layer width,
an inserted op).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import pytest

import graphprof
from graphprof.analysis.diff import diff, parse_diff_order
from graphprof.analysis.match import MatchKind, match_graphs
from graphprof.analysis.regression import compare_steps, parse_percent, regression_gate
from graphprof.profile.model import GraphKind, GraphRecord, NodeRecord, Phase, Profile, ProfileMeta, StepRecord
from tests.analysis.conftest import node, one_graph_profile

Spec = tuple  # (type, module, phase, in_shapes, flops, time_s)


def _nodes(specs: Sequence[Spec], steps: int = 3) -> tuple[NodeRecord, ...]:
    """A chain of nodes, one per spec, each taking the same time in every step."""
    return tuple(node(i, type_, (i - 1,) if i else (), (time_s,) * steps, in_shapes=shapes, module=module,
                      phase=phase, flops=flops)
                 for i, (type_, module, phase, shapes, flops, time_s) in enumerate(specs))


def _profile(specs: Sequence[Spec], walls: Sequence[float] = (1e-3, 1e-3, 1e-3), name: str = "step",
             kind: GraphKind = GraphKind.STEP) -> Profile:
    return one_graph_profile(_nodes(specs, len(walls)), walls, meta=ProfileMeta(function="step"), name=name,
                             kind=kind)


F, B, O = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER
BASE: list[Spec] = [
    ("addmm", "fc1", F, ((8,), (4, 16), (16, 8)), 1024, 4e-6),
    ("relu", "act", F, ((4, 8),), 32, 1e-6),
    ("addmm", "fc2", F, ((2,), (4, 8), (8, 2)), 128, 2e-6),
    ("mm", "fc2", B, ((2, 4), (4, 8)), 128, 2e-6),
    ("threshold_backward", "act", B, ((4, 8), (4, 8)), 32, 1e-6),
    ("mm", "fc1", B, ((8, 4), (4, 16)), 1024, 4e-6),
    ("add_", "fc1", O, ((8, 16), (8, 16)), 128, 1e-6),
]


def test_identical_profiles_give_an_empty_diff_with_every_delta_exactly_zero() -> None:
    a, b = _profile(BASE), _profile(BASE)
    result = diff(a, b)
    assert result.changed == ()
    assert result.mode == "nodes"
    assert dict(result.counts) == {"matched": len(BASE), "modified": 0, "added": 0, "removed": 0}
    assert len(result.nodes) == len(BASE)
    assert all(n.delta_time_s == 0 and n.delta_flops == 0 and n.ratio == 1.0 for n in result.nodes)
    for by in ("type", "module", "phase"):
        assert all(g.delta_time_s == 0 and g.delta_flops == 0 and g.before_nodes == g.after_nodes
                   for g in result.aggregates[by])
    assert result.delta_time_s == 0 and result.delta_flops == 0 and result.steps.delta_s == 0


def test_a_slower_node_is_the_only_change_and_its_delta_and_ratio_are_exact() -> None:
    after = list(BASE)
    after[3] = ("mm", "fc2", B, ((2, 4), (4, 8)), 128, 5e-6)
    result = diff(_profile(BASE), _profile(after))
    (changed,) = result.changed
    assert changed.status is MatchKind.MATCHED and changed.node.type == "mm" and changed.node.module == "fc2"
    assert changed.delta_time_s == pytest.approx(3e-6) and changed.ratio == pytest.approx(2.5)
    assert changed.delta_flops == 0
    by_phase = {g.key: g for g in result.aggregates["phase"]}
    assert by_phase["backward"].delta_time_s == pytest.approx(3e-6) and by_phase["forward"].delta_time_s == 0
    assert result.nodes[0] is changed  # ordered by absolute time change


def test_an_inserted_op_is_added_and_every_other_node_keeps_its_partner() -> None:
    after = BASE[:2] + [("mul", "act", F, ((4, 8),), 32, 3e-6)] + BASE[2:]
    result = diff(_profile(BASE), _profile(after))
    assert dict(result.counts) == {"matched": len(BASE), "modified": 0, "added": 1, "removed": 0}
    (added,) = result.changed
    assert added.status is MatchKind.ADDED and added.node.type == "mul" and added.before is None
    assert added.delta_time_s == pytest.approx(3e-6) and added.delta_flops == 32
    removed = diff(_profile(after), _profile(BASE))
    assert [(n.status, n.node.type) for n in removed.changed] == [(MatchKind.REMOVED, "mul")]
    by_type = {g.key: g for g in result.aggregates["type"]}
    assert (by_type["mul"].before_nodes, by_type["mul"].after_nodes, by_type["mul"].delta_flops) == (0, 1, 32)


def test_changed_shapes_pair_by_op_type_and_module_and_renamed_modules_by_shapes() -> None:
    wider = [("addmm", "fc1", F, ((16,), (4, 16), (16, 16)), 2048, 4e-6), BASE[1],
             ("addmm", "fc2", F, ((2,), (4, 16), (16, 2)), 256, 2e-6)] + BASE[3:]
    result = diff(_profile(BASE), _profile(wider))
    modified = [n for n in result.nodes if n.status is MatchKind.MODIFIED]
    assert [(n.node.module, n.delta_flops) for n in modified] == [("fc1", 1024), ("fc2", 128)]
    renamed = [(t, "head" if m == "fc2" else m, p, s, f, ts) for t, m, p, s, f, ts in BASE]
    result = diff(_profile(BASE), _profile(renamed))
    pairs = {(n.before.module, n.after.module) for n in result.nodes if n.status is MatchKind.MODIFIED}
    assert pairs == {("fc2", "head")} and result.counts["added"] == result.counts["removed"] == 0


def test_profiles_without_shared_graphs_fall_back_to_op_type_and_module() -> None:
    a = _profile(BASE)
    b = _profile(BASE, name="segment_0", kind=GraphKind.FORWARD)
    result = diff(a, b)
    assert result.mode == "aggregate" and result.nodes == ()
    assert result.graph_pairs == (("step", None), (None, "segment_0"))
    assert {g.key for g in result.aggregates["type"]} == {"addmm", "relu", "mm", "threshold_backward", "add_"}
    assert all(g.delta_time_s == 0 for g in result.aggregates["module"])
    # A shared host-time graph (zero_grad, gaps between segments) is not shared structure.
    host = GraphRecord(id=1, name="host", kind=GraphKind.HOST,
                       nodes=_nodes([("zero_grad", "", Phase.OTHER, (), None, 1e-6)]))
    a, b = (dataclasses.replace(p, graphs=(*p.graphs, host)) for p in (a, b))
    assert diff(a, b).mode == "aggregate"


def test_graphs_pair_by_name_and_kind_then_by_kind() -> None:
    def graph(gid: int, name: str, kind: GraphKind) -> GraphRecord:
        return GraphRecord(id=gid, name=name, kind=kind)

    fwd, bwd, seg = GraphKind.FORWARD, GraphKind.BACKWARD, GraphKind.SEGMENT
    before = [graph(0, "fwd_a", fwd), graph(1, "bwd", bwd), graph(2, "host", seg)]
    after = [graph(0, "host", seg), graph(1, "bwd", bwd), graph(2, "fwd_b", fwd), graph(3, "extra", bwd)]
    assert match_graphs(before, after) == [(0, 2), (1, 1), (2, 0), (None, 3)]


def test_filters_order_and_aggregation_options() -> None:
    after = [(t, m, p, s, f, ts * 2) for t, m, p, s, f, ts in BASE]
    result = diff(_profile(BASE), _profile(after), type="mm", phase="backward")
    assert {n.node.type for n in result.nodes} == {"mm"} and len(result.nodes) == 2
    result = diff(_profile(BASE), _profile(after), order_by="+delta_time")
    deltas = [n.delta_time_s for n in result.nodes]
    assert deltas == sorted(deltas)
    result = diff(_profile(BASE), _profile(after), aggregate_by="module", aggregate="max")
    assert {g.key: g.after_time_s for g in result.aggregates["module"]}["fc1"] == pytest.approx(8e-6)
    empty = diff(_profile(BASE), _profile(after), type="conv")
    assert empty.nodes == () and "no node has type 'conv'" in (empty.note or "")
    with pytest.raises(ValueError, match="not a diff column"):
        parse_diff_order("bandwidth")
    with pytest.raises(ValueError, match="no device times"):
        diff(_profile(BASE), _profile(after), clock="device")


def test_renderers_run_on_empty_profiles() -> None:
    from graphprof.render.diff_text import render_diff

    empty = diff(Profile(), Profile(), fail_if_slower=5)
    assert empty.mode == "aggregate" and not empty.gate.regressed
    assert "no graph" in render_diff(empty)
    assert json.loads(render_diff(diff(Profile(), Profile(), format="json")))["nodes"]["rows"] == []
    assert render_diff(diff(Profile(), Profile(), format="csv")).startswith("by,key,")


# -- the regression gate -------------------------------------------------------------------------------------


def _walls(walls: Sequence[float]) -> Profile:
    return _profile(BASE, walls=walls)


def test_gate_fires_when_clearly_slower_beyond_noise() -> None:
    before = _walls([1.00e-3, 1.01e-3, 0.99e-3, 1.02e-3, 0.98e-3])
    after = _walls([1.20e-3, 1.21e-3, 1.19e-3, 1.22e-3, 1.18e-3])
    gate = diff(before, after, fail_if_slower=5).gate
    assert gate is not None and gate.regressed
    assert gate.steps.change_pct == pytest.approx(20.0) and gate.steps.noise_margin_s < gate.steps.delta_s
    assert "beyond the noise margin" in gate.reason


def test_gate_stays_quiet_when_slower_but_within_noise() -> None:
    before = _walls([1.0e-3, 1.3e-3, 0.7e-3, 1.2e-3, 0.8e-3])
    after = _walls([1.1e-3, 1.4e-3, 0.8e-3, 1.3e-3, 0.9e-3])
    gate = diff(before, after, fail_if_slower=5).gate
    assert gate is not None and not gate.regressed
    assert gate.steps.change_pct == pytest.approx(10.0) and gate.steps.delta_s < gate.steps.noise_margin_s
    assert "within the noise margin" in gate.reason


def test_gate_stays_quiet_when_faster_or_below_the_threshold() -> None:
    before = _walls([1.00e-3, 1.01e-3, 0.99e-3])
    faster = _walls([0.50e-3, 0.51e-3, 0.49e-3])
    assert not diff(before, faster, fail_if_slower=0).gate.regressed
    steady = _walls([1.000e-3, 1.001e-3, 0.999e-3])
    slightly = _walls([1.030e-3, 1.031e-3, 1.029e-3])  # beyond noise, under the threshold
    gate = diff(steady, slightly, fail_if_slower=5).gate
    assert not gate.regressed and gate.steps.beyond_noise and "within the threshold" in gate.reason


def test_gate_noise_margin_is_a_student_t_bound_on_the_pooled_noise() -> None:
    before = _walls([1.0, 1.1, 0.9])  # deviations from the median 0.1, 0.1 (the median's own 0 left out)
    after = _walls([2.0, 2.2, 1.8])   # deviations 0.2, 0.2
    steps = compare_steps(before, after)
    sigma = 1.4826 * 0.15  # MAD of the pooled deviations 0.1, 0.1, 0.2, 0.2
    t_999_df4 = 7.173
    assert steps.noise_margin_s == pytest.approx(t_999_df4 * 1.2533 * sigma * (1 / 3 + 1 / 3) ** 0.5, rel=1e-4)


def test_gate_with_a_single_step_compares_medians_and_says_noise_is_unknown() -> None:
    gate = diff(_walls([1e-3]), _walls([1.2e-3, 1.2e-3]), fail_if_slower=10).gate
    assert gate.regressed and gate.steps.noise_margin_s is None
    assert "single profiled step" in gate.reason and "noise cannot be estimated" in gate.reason
    assert not diff(_walls([1e-3]), _walls([1.05e-3]), fail_if_slower=10).gate.regressed


def test_gate_uses_node_samples_when_steps_have_no_wall_time() -> None:
    before = _walls([0.0, 0.0, 0.0])
    slower = [(t, m, p, s, f, ts * 3) for t, m, p, s, f, ts in BASE]
    after = _profile(slower, walls=[0.0, 0.0, 0.0])
    steps = compare_steps(before, after)
    assert steps.before_median_s == pytest.approx(sum(spec[-1] for spec in BASE))
    assert steps.change_pct == pytest.approx(200.0)


def test_gate_threshold_values() -> None:
    assert parse_percent("5") == 5.0 and parse_percent("2.5%") == 2.5
    for bad in ("-1", "fast", "nan", ""):
        with pytest.raises(ValueError, match="percentage"):
            parse_percent(bad)
    with pytest.raises(ValueError, match="percentage"):
        regression_gate(compare_steps(_walls([1.0]), _walls([1.0])), -3)


# -- real profiles -------------------------------------------------------------------------------------------


def _mlp_profile(width: int, extra_relu: bool = False) -> graphprof.Profile:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = [nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, width), nn.ReLU()]
    if extra_relu:
        layers.append(nn.ReLU())
    model = nn.Sequential(*layers, nn.Linear(width, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    fn = graphprof.trace(step)
    for _ in range(5):
        fn(x, y)
    return fn.get_profile()


@pytest.fixture(scope="module")
def mlps() -> dict[str, graphprof.Profile]:
    return {"base": _mlp_profile(32), "wide": _mlp_profile(64), "extra": _mlp_profile(32, extra_relu=True)}


def test_real_profile_against_itself_and_its_saved_copy_is_empty(mlps, tmp_path) -> None:
    path = tmp_path / "base.json"
    mlps["base"].save(str(path))
    # The file stores times in units of 0.1 ns, so a loaded copy is compared with the file, not the original.
    for before, after in ((mlps["base"], mlps["base"]), (graphprof.load(path), path)):
        result = diff(before, after)
        assert result.changed == () and result.counts["matched"] == mlps["base"].node_count
        assert all(n.delta_time_s == 0 and n.delta_flops in (0, None) for n in result.nodes)


def test_a_wider_layer_shows_on_that_layers_forward_and_backward_nodes(mlps) -> None:
    result = diff(mlps["base"], mlps["wide"])
    assert result.mode == "nodes" and result.counts["added"] == result.counts["removed"] == 0
    by_module: dict[str, list] = {}
    for n in result.nodes:
        by_module.setdefault(n.node.module, []).append(n)
    layer = [n for n in by_module["2"] if n.delta_flops]
    assert {n.node.phase for n in layer} >= {Phase.FORWARD, Phase.BACKWARD}
    assert all(n.status is MatchKind.MODIFIED and n.delta_flops > 0 for n in layer)
    assert {n.node.type for n in layer if n.node.phase is Phase.FORWARD} == {"addmm"}
    assert {n.node.type for n in layer if n.node.phase is Phase.BACKWARD} >= {"mm"}
    for module in ("0", "1", ""):  # layers before the change, and the loss
        assert all(n.status is MatchKind.MATCHED and n.delta_flops in (0, None) for n in by_module[module])
    by_module_flops = {g.key: g.delta_flops for g in result.aggregates["module"]}
    assert by_module_flops["0"] == by_module_flops["1"] == 0 and by_module_flops["2"] > 0
    assert result.delta_flops == sum(n.delta_flops for n in result.nodes if n.delta_flops)


def test_an_inserted_relu_is_reported_as_added(mlps) -> None:
    result = diff(mlps["base"], mlps["extra"])
    added = [n for n in result.nodes if n.status is MatchKind.ADDED]
    assert {n.node.type for n in added} >= {"relu", "threshold_backward"}
    assert {n.node.module for n in added} == {"4"}  # the new nn.ReLU
    assert result.counts["removed"] == 0
    # The last Linear was renumbered from "4" to "5": its nodes keep their partners.
    renamed = {(n.before.module, n.after.module) for n in result.nodes if n.status is MatchKind.MODIFIED}
    assert renamed == {("4", "5")}
    assert all(n.delta_flops in (0, None) for n in result.nodes if n.status is not MatchKind.ADDED)


def test_profile_diff_text_names_the_change(mlps) -> None:
    text = mlps["base"].diff(mlps["extra"], 0)
    assert "added" in text and "relu" in text and "by op type" in text and "by phase" in text
    same = mlps["base"].diff(mlps["base"])
    assert "no changed nodes" in same and "by op type: no change" in same


def test_segment_like_profiles_match_graph_by_graph() -> None:
    fwd, bwd = BASE[:3], BASE[3:6]

    def segmented(fwd_specs: Sequence[Spec]) -> Profile:
        graphs = (GraphRecord(0, "seg0", GraphKind.FORWARD, _nodes(fwd_specs)),
                  GraphRecord(1, "seg0_bw", GraphKind.BACKWARD, _nodes(bwd)),
                  GraphRecord(2, "host", GraphKind.SEGMENT, _nodes([("host_gap", "", Phase.OTHER, (), None, 1e-6)])))
        return Profile(meta=ProfileMeta(), steps=(StepRecord(0, 1e-3),) * 3, graphs=graphs)

    slower = list(fwd[:2]) + [(*fwd[2][:5], 9e-6)]
    result = diff(segmented(fwd), segmented(slower))
    (changed,) = result.changed
    assert changed.graph == "seg0" and changed.node.module == "fc2" and changed.delta_time_s == pytest.approx(7e-6)
    assert result.graph_pairs == (("seg0", "seg0"), ("seg0_bw", "seg0_bw"), ("host", "host"))


def test_gate_false_positive_rate_on_identical_code_is_below_one_percent() -> None:
    """Simulated identical runs (benchmarks/gate_false_positives.py): the gate almost never cries wolf."""
    from benchmarks.gate_false_positives import false_positive_rate

    for n, sigma, heavy in ((3, 0.05, False), (5, 0.05, False), (5, 0.03, True), (10, 0.10, False)):
        assert false_positive_rate(3000, n, sigma, heavy, seed=7) < 0.01, (n, sigma, heavy)


def test_gate_still_catches_a_real_regression() -> None:
    import random

    from benchmarks.gate_false_positives import steps
    from graphprof.analysis.regression import compare_step_times

    rng = random.Random(3)
    caught = sum(regression_gate(compare_step_times(steps(rng, 5, 0.02, False),
                                                    [1.2 * t for t in steps(rng, 5, 0.02, False)]), 5).regressed
                 for _ in range(500))
    assert caught / 500 > 0.95  # 20% slower, 2% noise, 5 steps a side
