"""The memory pass: exact figures on programs small enough to count by hand,
and agreement with the storages a real run of the graph keeps alive."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.multiprocessing.reductions import StorageWeakRef

from graphprof.demo.steps import cnn_bn_dropout_step, gpt_adamw_step, mlp_sgd_step
from graphprof.passes.annotate import annotate, is_op_node
from graphprof.passes.memory import memory
from graphprof.passes.records import MEMORY, MEMORY_STEP, MemoryEffect, StepMemoryRecord
from tests.helpers import run_traced

F32 = 4  # bytes per float32 element
SMALL_GPT = dict(batch_size=2, seq_len=16, n_ctx=16, d_model=32, n_layer=1, n_head=2)


def _modelled(fn: Callable[..., Any], *inputs: torch.Tensor) -> tuple[torch.fx.GraphModule, dict[str, MemoryEffect], StepMemoryRecord]:
    gm = memory(annotate(make_fx(fn, tracing_mode="real")(*inputs)))
    effects = {n.name: n.meta[MEMORY] for n in gm.graph.nodes if is_op_node(n)}
    step = next(n for n in gm.graph.nodes if n.op == "output").meta[MEMORY_STEP]
    return gm, effects, step


def _triples(effects: dict[str, MemoryEffect]) -> dict[str, tuple[int, int, int]]:
    return {name: (e.allocated_bytes, e.freed_bytes, e.live_bytes) for name, e in effects.items()}


def test_chain_of_elementwise_ops_keeps_two_buffers_alive() -> None:
    x = torch.randn(1000)
    n = x.numel() * F32
    gm, effects, step = _modelled(lambda x: ((x * 2) + 1).relu().neg(), x)
    # each op allocates its output and frees its input (the graph input stays: the caller holds it)
    assert _triples(effects) == {
        "mul": (n, 0, 2 * n), "add": (n, n, 2 * n), "relu": (n, n, 2 * n), "neg": (n, n, 2 * n),
    }
    assert (step.start_bytes, step.end_bytes, step.allocated_bytes) == (n, 2 * n, 4 * n)
    # while add runs, the input, its own input (mul) and its output exist: the first 3-buffer moment
    assert (step.peak_bytes, step.peak_node) == (3 * n, "add")
    assert dict(step.peak_by_category_bytes) == {"inputs": n, "temporaries": 2 * n}
    assert dict(effects["neg"].live_by_category_bytes) == {"inputs": n, "outputs": n}


def test_a_view_keeps_its_whole_base_alive_until_its_own_last_use() -> None:
    x = torch.randn(4, 8)
    n = x.numel() * F32  # 128
    row2 = 2 * 8 * F32   # a 2x8 slice: 64

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        v = y[1:3]            # view: no allocation; y's name dies here, its storage does not
        t = x.t()             # view of the input: never freed by the step
        return (v.sin() * 2).sum() + t.sum()

    gm, effects, step = _modelled(fn, x)
    tr = _triples(effects)
    assert tr["exp"] == (n, 0, 2 * n)
    assert tr["slice_1"] == (0, 0, 2 * n)
    assert tr["t"] == (0, 0, 2 * n)
    assert tr["sin"] == (row2, n, n + row2)  # the last alias of exp's storage dies: all 128 bytes go
    assert step.peak_bytes == 2 * n + row2 and step.peak_node == "sin"
    assert step.end_bytes == n + F32  # the input and the scalar result
    assert sum(e.allocated_bytes for e in effects.values()) - sum(e.freed_bytes for e in effects.values()) == F32


def test_in_place_ops_allocate_nothing_and_extend_their_target_s_life() -> None:
    x = torch.randn(4, 8)
    n = x.numel() * F32

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        z = y.sin()
        y.mul_(2)             # in place on y, result unused: y's storage dies right after
        x.add_(1)             # in place on the input: no allocation, nothing freed
        return z.add_(y.numel())

    gm, effects, step = _modelled(fn, x)
    tr = _triples(effects)
    assert tr["exp"] == (n, 0, 2 * n)
    assert tr["sin"] == (n, 0, 3 * n)
    assert tr["mul_"] == (0, n, 2 * n)
    assert tr["add_"] == (0, 0, 2 * n)
    assert tr["add__1"] == (0, 0, 2 * n)  # the returned tensor is sin's storage, modified in place
    assert step.peak_bytes == 3 * n and step.end_bytes == 2 * n
    assert dict(effects["add__1"].live_by_category_bytes) == {"inputs": n, "outputs": n}


def test_tuple_outputs_unused_element_dies_with_the_tuple() -> None:
    x = torch.randn(16)
    values, indices = 16 * F32, 16 * 8  # float32 values, int64 indices

    def fn(x: torch.Tensor) -> torch.Tensor:
        v, _ = x.sort()
        return v * 2

    gm, effects, step = _modelled(fn, x)
    tr = _triples(effects)
    assert tr["sort"] == (values + indices, 0, 16 * F32 + values + indices)
    assert tr["getitem"] == (0, 0, 16 * F32 + values + indices)
    assert tr["getitem_1"] == (0, indices, 16 * F32 + values)  # last user of the tuple
    assert tr["mul"] == (values, values, 16 * F32 + values)


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_mlp_training_step_by_hand() -> None:
    batch, d_in, hidden, d_out = 4, 32, 64, 8
    demo = mlp_sgd_step(batch_size=batch)
    _, fn = run_traced(demo, 3, profiling=False)
    gm = fn.graph_module  # the pass already ran in the capture pipeline
    effects = [n.meta[MEMORY] for n in gm.graph.nodes if is_op_node(n)]
    step: StepMemoryRecord = next(n for n in gm.graph.nodes if n.op == "output").meta[MEMORY_STEP]

    params = _param_bytes(demo.model)
    assert params == F32 * (hidden * d_in + hidden + hidden * hidden + hidden + d_out * hidden + d_out)
    momentum = params  # one SGD momentum buffer per parameter
    inputs = F32 * batch * (d_in + d_out)
    act = F32 * batch * hidden  # one [batch, hidden] activation
    # the loss is a scalar, but mse_loss's kernel reduces into its [B, out]
    # elementwise buffer and the scalar keeps that storage
    loss = F32 * batch * d_out
    # forward: 2 x (addmm + relu) of [B, H], addmm [B, out], the loss
    forward = 4 * act + F32 * batch * d_out + loss
    # backward: ones_like (a scalar), mse_loss_backward [B, out], per layer the input-grad mm,
    # the weight-grad mm and the bias-grad sum, threshold_backward of both ReLUs
    weight_grads = F32 * (d_out * hidden + hidden * hidden + hidden * d_in)
    bias_grads = F32 * (d_out + hidden + hidden)
    backward = F32 + F32 * batch * d_out + 2 * act + weight_grads + bias_grads + 2 * act
    assert step.start_bytes == params + momentum + inputs
    assert step.allocated_bytes == sum(e.allocated_bytes for e in effects) == forward + backward
    # what survives the step: the new gradients and the returned loss
    assert step.end_bytes == step.start_bytes + params + loss
    assert sum(e.allocated_bytes - e.freed_bytes for e in effects) == params + loss
    # the optimizer updates in place: it allocates nothing
    # peak: all gradients exist, the last bias-gradient sum runs, its input (a [B, H] grad) is still alive
    assert step.peak_bytes == step.end_bytes + act
    assert step.peak_node.startswith("sum")
    assert dict(step.peak_by_category_bytes) == {
        "parameters": params, "optimizer_state": momentum, "inputs": inputs,
        "gradients": params, "temporaries": act, "outputs": loss,
    }
    # at the end of the forward pass the activations saved for backward are the two ReLU outputs
    # and the last Linear's output (read by mse_loss_backward)
    forward_end = next(n for n in gm.graph.nodes if n.name == "mse_loss").meta[MEMORY]
    assert forward_end.live_by_category_bytes["activations"] == 2 * act + F32 * batch * d_out
    largest = step.largest_at_peak[0]
    assert largest.nbytes == F32 * hidden * hidden and largest.category in ("parameters", "gradients", "optimizer_state")


# -- agreement with a real run -------------------------------------------------------
def _storages(value: Any) -> list[StorageWeakRef]:
    if isinstance(value, torch.Tensor):
        return [StorageWeakRef(value.untyped_storage())]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _storages(v)]
    return []


def _real_run(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Run ``gm`` node by node, dropping values where fx's generated code does, and watch
    which storages come into being and which die (weak references), per op node."""
    last_user: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in reversed(gm.graph.nodes):
        for inp in node.all_input_nodes:
            last_user.setdefault(inp, node)
    drop_after: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for value, user in last_user.items():
        if user.op != "output":
            drop_after.setdefault(user, []).append(value)
    env: dict[torch.fx.Node, Any] = {}
    tracked: dict[StorageWeakRef, int] = {}
    out: dict[str, tuple[int, int]] = {}
    feed = iter(inputs)
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(feed)
            elif node.op == "get_attr":
                env[node] = getattr(gm, node.target)
            elif node.op == "call_function":
                args, kwargs = torch.fx.map_arg((node.args, node.kwargs), lambda n: env[n])
                env[node] = node.target(*args, **kwargs)
                del args, kwargs
                allocated = 0
                for ref in _storages(env[node]):
                    if ref not in tracked:
                        tracked[ref] = _nbytes(env[node], ref)
                        allocated += tracked[ref]
                for value in drop_after.get(node, []) + ([node] if not node.users else []):
                    env.pop(value, None)
                freed = 0
                for ref in [r for r in tracked if r.expired()]:
                    freed += tracked.pop(ref)
                out[node.name] = (allocated, freed)
            if node.op in ("placeholder", "get_attr"):
                for ref in _storages(env[node]):
                    tracked.setdefault(ref, 0)  # state: present before, never counted
    return out


def _nbytes(value: Any, ref: StorageWeakRef) -> int:
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes() if StorageWeakRef(value.untyped_storage()) == ref else 0
    if isinstance(value, (list, tuple)):
        return max((_nbytes(v, ref) for v in value), default=0)
    return 0


@pytest.mark.parametrize("factory", [mlp_sgd_step, cnn_bn_dropout_step, lambda: gpt_adamw_step(**SMALL_GPT)],
                         ids=["mlp", "cnn-bn-dropout", "gpt"])
def test_model_matches_the_storages_a_real_run_allocates_and_frees(factory) -> None:
    demo = factory()
    _, fn = run_traced(demo, 3, profiling=False)
    gm = fn.graph_module
    demo.optimizer.zero_grad(set_to_none=True)  # as the replay does before the graph runs
    real = _real_run(gm, list(demo.make_inputs(7)))
    modelled = {n.name: (n.meta[MEMORY].allocated_bytes, n.meta[MEMORY].freed_bytes)
                for n in gm.graph.nodes if is_op_node(n)}
    mismatches = {k: (modelled[k], real[k]) for k in modelled if modelled[k] != real[k]}
    assert not mismatches
    assert sum(a for a, _ in real.values()) > 0


def test_pass_leaves_the_graph_unchanged_outputs_unchanged() -> None:
    x = torch.randn(8, 8)
    fn = lambda x: (x @ x).relu().sum(0)  # noqa: E731
    gm = make_fx(fn, tracing_mode="real")(x)
    before = gm.code
    expected = gm(x)
    memory(annotate(gm))
    assert gm.code == before
    assert torch.equal(gm(x), expected)


def test_a_sparse_constant_holds_its_indices_and_values() -> None:
    """A sparse adjacency the step holds (pygcn's ``torch.spmm(adj, x)``) has no storage of its own: the
    pass asked for one and raised, which refused the capture of a step holding it as a module buffer."""
    torch.manual_seed(0)
    adj = ((torch.rand(8, 8) > 0.6).float() + torch.eye(8)).to_sparse()
    x = torch.randn(8, 3)
    _, effects, step = _modelled(lambda x: torch.spmm(adj, x), x)
    held = adj._indices().numel() * 8 + adj._nnz() * F32
    assert dict(step.peak_by_category_bytes) == {"inputs": held + x.numel() * F32, "outputs": 8 * 3 * F32}
    assert _triples(effects) == {"mm": (8 * 3 * F32, 0, held + x.numel() * F32 + 8 * 3 * F32)}
