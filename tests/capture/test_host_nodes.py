"""Host nodes (capture/host_nodes.py): readers read Python values at replay, effects repeat what the
step did with the values of that replay, and a value no replay can rebuild is refused."""

from __future__ import annotations

import collections
import enum
import warnings
from typing import Any, Callable, NamedTuple

import pytest
import torch
import torch.fx
from torch import nn

import graphprof

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


class _Stats(NamedTuple):
    step: int
    loss: torch.Tensor


_PlainStats = collections.namedtuple("_PlainStats", ["step", "loss"])


class _Phase(enum.Enum):
    WARMUP = 0
    TRAIN = 1


def _state_step(kind: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any], nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: dict[str, Any] = {"i": 0, "phase": _Phase.WARMUP,
                            "st": (_Stats if kind == "typing" else _PlainStats)(0, torch.zeros(()))}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if kind == "enum":
            kept["phase"] = _Phase.TRAIN if kept["i"] >= 1 else _Phase.WARMUP  # changes on the capture call
        else:
            kept["st"] = kept["st"]._replace(loss=loss.detach())
        kept["i"] += 1
        return loss.detach()

    return step, kept, model


@pytest.mark.parametrize("kind", ["typing", "collections", "enum"])
def test_a_named_tuple_or_an_enum_member_the_step_stores_replays_as_one_graph(kind: str) -> None:
    """``S["st"] = S["st"]._replace(loss=...)`` fell back with graphprof's own TypeError as the reason (a
    named tuple was rebuilt from one iterable, which its ``__new__`` does not take), and ``S["phase"] =
    Phase.TRAIN`` was refused, though an Enum member never changes."""
    eager_step, eager_kept, eager_model = _state_step(kind)
    step, kept, model = _state_step(kind)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            x = torch.full((3, 4), float(i))
            assert torch.equal(traced(x), eager_step(x))
            assert kept["i"] == eager_kept["i"] and kept["phase"] is eager_kept["phase"]
            assert type(kept["st"]) is type(eager_kept["st"]) and kept["st"].step == eager_kept["st"].step
            assert torch.equal(kept["st"].loss, eager_kept["st"].loss)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(p, q)
