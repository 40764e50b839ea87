"""Graph modules that write their fx code only when it is read or the module is called."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphprof.passes.graph_modules import code_when_asked, graph_module


def _written(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    written: list[int] = []
    python_code = torch.fx.Graph.python_code

    def counted(self: torch.fx.Graph, *args: object, **kwargs: object) -> object:
        written.append(1)
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counted)
    return written


def test_a_graph_module_writes_its_code_when_first_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(operator.mul, (x, 3)))
    written = _written(monkeypatch)
    gm = graph_module(torch.nn.Module(), graph, class_name="Step")
    gm.recompile()
    assert written == []  # made and recompiled: nothing written yet
    assert "mul" in gm.code and len(written) == 1
    assert torch.equal(gm(torch.ones(2)), torch.full((2,), 3.0)) and len(written) == 1


def test_make_fx_s_module_waits_too_and_runs_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.relu(a) * 2

    a = torch.randn(4)
    written = _written(monkeypatch)
    with code_when_asked():
        gm = make_fx(f, tracing_mode="real")(a)
    assert written == []
    assert torch.equal(gm(a), f(a))
    assert len(written) == 1
