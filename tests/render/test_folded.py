"""Folded stacks: flamegraph.pl/speedscope grammar, values that sum to the self times."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import numpy as np


from graphprof.analysis.node_time import node_time_s
from graphprof.api import Profile
from graphprof.profile.model import NodeRecord, Phase
from graphprof.analysis.node_arrays import codes
from graphprof.render.escape import folded_frame
from graphprof.render.folded import _combined_codes, _first_seen_codes, folded_stacks
from tests.render.export_profiles import empty_profile, hostile_profile, make_profile, node, synthetic_profile

def node_stack(n: NodeRecord) -> tuple[str, ...]:
    """The stack rule of the module docstring, node by node, as the reference ``folded_stacks`` must agree with:
    phase, every prefix of the module path (empty parts left out), then the op type (else the op, else ``?``)."""
    parts = [p for p in n.module.split(".") if p]
    return (n.phase.value, *(".".join(parts[:i + 1]) for i in range(len(parts))), n.type or n.op or "?")


# flamegraph.pl's stackcollapse input: everything up to the last space is the stack, then an integer.
LINE = re.compile(r"^(?P<stack>[^\n]+) (?P<value>\d+)$")


def _parse(text: str) -> list[tuple[list[str], int]]:
    assert text == "" or text.endswith("\n")
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        assert m, line
        frames = m["stack"].split(";")
        assert all(f.strip() for f in frames), line
        out.append((frames, int(m["value"])))
    return out


def test_real_stacks_sum_to_the_self_times(real: Profile) -> None:
    lines = _parse(folded_stacks(real))
    total_us = sum(node_time_s(n) for _, n in real.iter_nodes()) * 1e6
    # cumulative rounding: within half a microsecond of the total however many lines (no drift)
    assert abs(sum(v for _, v in lines) - total_us) <= 0.5 + 1e-6
    if len(real.graphs) > 1:  # several graphs (the step and its host work): each stack starts with its graph
        assert {frames[0] for frames, _ in lines} <= {g.name for g in real.graphs}
        lines = [(frames[1:], v) for frames, v in lines]
    assert all(frames[0] in ("forward", "backward", "optimizer", "other") for frames, _ in lines)
    conv = [frames for frames, _ in lines if frames[-1] == "convolution" and "layer1.0.conv1" in frames]
    assert conv and conv[0][1:] == ["layer1", "layer1.0", "layer1.0.conv1", "convolution"]


def test_stacks_are_phase_module_prefixes_then_op() -> None:
    n = node(0, "addmm", module="encoder.layers.0.fc", phase=Phase.BACKWARD)
    assert node_stack(n) == ("backward", "encoder", "encoder.layers", "encoder.layers.0", "encoder.layers.0.fc", "addmm")
    assert node_stack(node(1, "add")) == ("forward", "add")


def test_values_are_integer_microseconds_under_the_statistic() -> None:
    p = synthetic_profile()
    lines = dict((";".join(f), v) for f, v in _parse(folded_stacks(p)))
    assert lines["forward;fc1;mm"] == 2500 and lines["backward;fc1;mm"] == 4000
    assert dict((";".join(f), v) for f, v in _parse(folded_stacks(p, stat="max")))["backward;fc1;mm"] == 5000


def test_nodes_sharing_a_stack_are_summed_and_tiny_ones_not_lost() -> None:
    # 3000 nodes of 0.4 us: each rounds to 0, but together they are 1200 us.
    p = make_profile([node(i, "add", module="m", times=(0.4e-6,)) for i in range(3000)])
    assert _parse(folded_stacks(p)) == [(["forward", "m", "add"], 1200)]
    q = make_profile([node(i, f"op{i % 7}", times=(0.4e-6,)) for i in range(3000)])
    assert sum(v for _, v in _parse(folded_stacks(q))) == 1200


def test_hostile_names_cannot_add_frames_or_lines() -> None:
    lines = _parse(folded_stacks(hostile_profile()))
    assert len(lines) == 2
    for frames, _ in lines:
        assert len(frames) == 3  # phase, module, op: the name's ';' and newline did not split anything


def test_empty_profile_is_an_empty_file() -> None:
    assert folded_stacks(empty_profile()) == ""


def test_stacks_of_nested_and_odd_module_paths_are_each_nodes_frames() -> None:
    """Stack texts are made from the nearest module prefix already made; each must still be exactly
    its node's frames (``node_stack``), also for deep paths, empty parts and paths sharing prefixes."""
    deep = [".".join(f"m{i}" for i in range(depth)) for depth in (40, 75, 20, 1, 0, 300)]
    modules = [*deep, ".a..b.", "a.b", "a", "."]
    nodes = [node(i, op_type, times=(1e-3 * (i + 1),), module=m) for i, (m, op_type) in
             enumerate((m, t) for m in modules for t in ("mm", "relu"))]
    lines = _parse(folded_stacks(make_profile(nodes)))
    expected = {}
    for n in nodes:
        expected.setdefault(node_stack(n), 0)
    assert [tuple(frames) for frames, _ in lines] == list(expected)


def test_graphs_that_share_a_name_share_their_stacks_and_an_empty_graph_shifts_nothing() -> None:
    """Stacks are keyed by the graph's name (its root frame), not its position: an empty first graph
    and two graphs of one name must give the lines a walk over every node gives, summed per stack."""
    nodes = [node(i, t, times=(1e-3 * (i + 1),), module=m, phase=p) for i, (t, m, p) in enumerate(
        [("mm", "a.b", Phase.FORWARD), ("relu", "a", Phase.FORWARD), ("mm", "a.b", Phase.BACKWARD)])]
    one = make_profile(nodes).graphs[0]
    profile = replace(make_profile(nodes), graphs=(replace(one, id=0, name="g", nodes=()), replace(one, id=1, name="g"),
                                                   replace(one, id=2, name="h", nodes=one.nodes[:1]), replace(one, id=3, name="g")))
    expected: dict[tuple[str, ...], int] = {}
    for graph in profile.graphs:
        for n in graph.nodes:
            stack = (graph.name, *node_stack(n))
            expected[stack] = expected.get(stack, 0) + round(node_time_s(n) * 1e6)
    assert [(tuple(frames), v) for frames, v in _parse(folded_stacks(profile))] == list(expected.items())


def test_sorted_codes_are_first_seen_codes() -> None:
    """Stacks are coded by sorting one int64 key per node: the codes and order a dict pass gives."""
    rng = random.Random(5)
    for size in (1, 2, 50, 3000):
        parts = [np.array([rng.randrange(k) for _ in range(size)], dtype=np.intp) for k in (3, 40, 7)]
        expected, distinct = codes(list(zip(*(p.tolist() for p in parts))))
        for sizes in ((3, 40, 7), (2**40, 2**40, 7)):  # the second is past int64: the dict pass itself
            found, per_part = _combined_codes(list(zip(parts, sizes)))
            assert found.tolist() == expected.tolist()
            assert list(zip(*(p.tolist() for p in per_part))) == distinct
        keys = np.array([rng.randrange(-5, 5) for _ in range(size)], dtype=np.int64)
        found, first = _first_seen_codes(keys)
        assert found.tolist() == codes(keys.tolist())[0].tolist()
        assert keys[first].tolist() == codes(keys.tolist())[1]


def test_names_that_folding_changes_are_escaped_in_every_prefix() -> None:
    """Module paths of plain text are used as they are; one with a space, ';' or a control character
    anywhere makes every path go through ``folded_frame``."""
    for odd in ("a b.c", "x;y.z", "t\tu", "é.f", " lead.x"):
        nodes = [node(0, "mm", module="plain.path"), node(1, "mm", module=odd), node(2, "relu", module="plain")]
        lines = _parse(folded_stacks(make_profile(nodes)))
        assert [tuple(frames) for frames, _ in lines] == [
            tuple(folded_frame(f) for f in node_stack(n)) for n in nodes]
