"""Host nodes (capture/host_nodes.py): readers read Python values at replay, effects repeat what the
step did with the values of that replay, and a value no replay can rebuild is refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx

from graphprof.capture.host_nodes import effect_node, filled, input_scalar, real_values, template_of
from graphprof.capture.scalars import DataDependentError


def test_an_effect_gets_this_replays_reads_and_tensors_and_keeps_the_rest() -> None:
    state = {"lr": 0.1}
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    lr = input_scalar(graph, state["lr"], lambda: state["lr"], "lr", None, "test")
    made = torch.ones(2)  # stands for a tensor an op of the graph made
    weight = torch.zeros(3)  # a tensor from before the step: the same object on every replay
    value = {"lr": lr, "out": [made, "tag"], "weight": weight, "n": (1, None)}
    template, slots = template_of(value, lambda t: x if t is made else None, "history", lambda what: "")
    assert slots == [lr.node, x]
    seen: list[Any] = []
    effect_node(graph, "append history", lambda values: seen.append(filled(template, values)), slots, None)
    graph.output(None)
    replay = torch.fx.GraphModule(torch.nn.Module(), graph)

    state["lr"] = 0.05  # read when the replay reaches the reader, not the capture's number
    given = torch.full((2,), 7.0)
    replay(given)
    assert seen[0]["lr"] == 0.05 and seen[0]["out"][0] is given and seen[0]["out"][1] == "tag"
    assert seen[0]["weight"] is weight and seen[0]["n"] == (1, None)
    # What the user keeps from the capture call: numbers, not the capture's scalars.
    assert real_values(value)["lr"] == 0.1 and real_values([lr, (lr,)]) == [0.1, (0.1,)]


def test_a_value_no_replay_can_rebuild_is_refused_with_its_place() -> None:
    with pytest.raises(DataDependentError, match=r"the step stores a object in self\.log at step\.py:3"):
        template_of([object()], lambda t: None, "self.log", lambda what: " at step.py:3")


def test_an_opaque_value_is_kept_as_it_is() -> None:
    stream = object()
    template, slots = template_of((stream, 1), lambda t: None, "print", lambda what: "", opaque=lambda v: v is stream)
    assert slots == [] and filled(template, ()) == (stream, 1)
