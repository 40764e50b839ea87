"""Annotations on real captured training steps: module, source, phase, scope; backward attribution."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import record_function

import graphprof
from graphprof.demo.steps import cnn_bn_dropout_step, gpt_adamw_step, mlp_sgd_step
from graphprof.passes.annotate import is_op_node
from graphprof.passes.records import ANNOTATION
from graphprof.profile.model import Phase
from tests.helpers import run_traced

SMALL_GPT = dict(batch_size=2, seq_len=16, n_ctx=16, d_model=32, n_layer=1, n_head=2)


def _annotations(demo):
    _, fn = run_traced(demo, 3)
    return [n.meta[ANNOTATION] for n in fn.graph_module.graph.nodes if is_op_node(n)]


@pytest.mark.parametrize("factory", [mlp_sgd_step, cnn_bn_dropout_step, lambda: gpt_adamw_step(**SMALL_GPT)])
def test_every_op_node_is_annotated(factory) -> None:
    anns = _annotations(factory())
    assert anns and [a.index for a in anns] == list(range(len(anns)))
    phases = {a.phase for a in anns}
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= phases
    for a in anns:
        assert a.source and ":" in a.source, f"{a.op} has no source line"
        assert a.op.startswith(("aten.", "operator.", "host.")) and a.type  # host.: values read at run time
    # every forward op of the model runs inside a module: the only forward ops
    # without one are the loss lines of the step functions; optimizer ops each update one
    orphans = {a.source for a in anns if a.phase is Phase.FORWARD and not a.module_type}
    assert all(src.startswith("graphprof/demo/steps.py") for src in orphans), orphans
    assert any(a.module_type for a in anns if a.phase is Phase.FORWARD)
    assert all(a.module for a in anns if a.phase is Phase.OPTIMIZER and a.op.startswith("aten."))


def test_backward_nodes_carry_the_forward_module() -> None:
    anns = _annotations(cnn_bn_dropout_step())
    by_type = {}
    for a in anns:
        if a.phase is Phase.BACKWARD:
            by_type.setdefault(a.type, set()).add(a.module_type)
    assert by_type["convolution_backward"] == {"Conv2d"}
    assert by_type["native_batch_norm_backward"] == {"BatchNorm2d"}
    assert by_type["threshold_backward"] == {"ReLU"}
    assert by_type["max_pool2d_with_indices_backward"] == {"MaxPool2d"}
    conv_fwd = {a.module for a in anns if a.type == "convolution" and a.phase is Phase.FORWARD}
    conv_bwd = {a.module for a in anns if a.type == "convolution_backward"}
    assert conv_fwd == conv_bwd
    # and the backward op points at the forward op's source line
    src_fwd = {a.module: a.source for a in anns if a.type == "convolution"}
    assert all(a.source == src_fwd[a.module] for a in anns if a.type == "convolution_backward")


def test_shapes_and_producers() -> None:
    anns = _annotations(mlp_sgd_step(batch_size=32))
    names = {a.index: a for a in anns}
    addmm = next(a for a in anns if a.type == "addmm")
    assert [t.shape for t in addmm.in_tensors] == [(64,), (32, 32), (32, 64)]
    assert addmm.out_tensors[0].shape == (32, 64) and addmm.out_tensors[0].dtype == "float32"
    assert addmm.inputs  # produced by the transpose of the weight
    assert all(isinstance(i, str) for i in addmm.inputs)
    assert any(a.is_inplace for a in anns if a.phase is Phase.OPTIMIZER)
    assert any(a.is_view for a in anns if a.type == "t")
    assert names


def test_record_function_labels_become_scopes_and_leave_the_graph() -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @graphprof.trace
    def step(x):
        opt.zero_grad()
        with record_function("my_forward"):
            loss = model(x).square().mean()
        with record_function("my_backward"):
            loss.backward()
        opt.step()
        return loss

    for _ in range(3):  # eager, capture, one profiled step
        step(torch.randn(2, 4))
    anns = [n.meta[ANNOTATION] for n in step.graph_module.graph.nodes if is_op_node(n)]
    scopes = {a.scope for a in anns}
    assert "my_forward" in scopes and "my_backward" in scopes
    assert all(a.phase is Phase.FORWARD for a in anns if a.scope == "my_forward")
    assert all(a.phase is Phase.BACKWARD for a in anns if a.scope == "my_backward")
    assert any(s.startswith("Optimizer.step") for s in scopes)
    assert not any("record_function" in str(n.target) for n in step.graph_module.graph.nodes)
    profile = step.get_profile()
    assert {"my_forward", "my_backward"} <= {n.scope for _, n in profile.iter_nodes()}
