"""A replay that raises leaves the caller eager's error and eager's state, or says in one warning why not.

A loop that catches a bad batch's error and goes on (``except IndexError:
continue``) used to find the step's counter not counted, its logged loss
missing and its gradients gone after the replayed call that raised: a
replay applies the step's Python effects and gradients at its end.
"""

from __future__ import annotations

import traceback
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.recorder import CaptureRecorder
from graphprof.runtime.codegen import compile_graph
from graphprof.runtime.failed_replays import failing_node, first_change

Step = Callable[[torch.Tensor, torch.Tensor], Any]


def _step(zero_grad_first: bool = True, after_step: bool = False) -> tuple[Step, nn.Module, dict[str, Any]]:
    """A training step with dropout, a counter and a list of losses; its loss raises on a class out of
    range, its embedding on an id out of range (``after_step``: a second lookup after the update)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Dropout(0.3), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kept: dict[str, Any] = {"n": 0, "losses": [], "model": model, "opt": opt}

    def step(idx: torch.Tensor, target: torch.Tensor) -> Any:
        kept["n"] += 1
        if zero_grad_first:
            opt.zero_grad()
        out = model(idx[:, 0])
        if not zero_grad_first:
            opt.zero_grad()
        loss = F.cross_entropy(out, target)
        loss.backward()
        opt.step()
        kept["losses"].append(loss.detach())
        if after_step:
            model[0](idx[:, 1])  # an evaluation lookup after the update
        return loss.detach()
    return step, model, kept


def _batch(i: int, bad: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    idx, target = torch.randint(0, 10, (5, 2), generator=g), torch.randint(0, 3, (5,), generator=g)
    if i in (3, 5):  # two bad batches
        if bad == "id":
            idx[0, 0] = 12
        elif bad == "late id":
            idx[0, 1] = 12
        elif bad == "class":
            target[0] = 7
    return idx, target


def _state(kept: dict[str, Any]) -> list[Any]:
    model: nn.Module = kept["model"]
    return [kept["n"], [loss.tolist() for loss in kept["losses"]],
            [p.detach().clone() for p in model.parameters()],
            [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            kept["opt"].state_dict()["state"], torch.get_rng_state()]


def _assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for x, y in zip(a, b):
            _assert_same(x, y, where)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}: {k}")
    else:
        assert a == b, where


def _loop(step: Step, kept: dict[str, Any], bad: str, calls: int = 7) -> list[tuple[Any, list[Any]]]:
    """Each call's outcome (its loss, or its error's type, the last line of the step it names and the
    type of an error chained to it) and the state after it."""
    seen = []
    for i in range(calls):
        try:
            outcome: Any = step(*_batch(i, bad))
        except (IndexError, RuntimeError) as exc:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == __file__]
            chained = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
            outcome = (type(exc).__name__, frames[-1].line if frames else None, type(chained).__name__)
        seen.append((outcome, _state(kept)))
    return seen


@pytest.mark.parametrize("bad", ["id", "class"])
def test_an_error_before_any_write_leaves_eagers_error_and_state(bad: str) -> None:
    """The id raises in the forward, the class in the loss after dropout drew: the replay had written
    nothing the user holds, so the step runs again eagerly: eager's error, traceback and state."""
    step, _, kept = _step()
    expected = _loop(step, kept, bad)
    step, _, kept = _step()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _loop(traced, kept, bad)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert [outcome for outcome, _ in expected][3][0] == "IndexError"
    for i, (e, g) in enumerate(zip(expected, got)):
        _assert_same(e, g, f"call {i}")
    assert traced.capture_mode == "whole-step"  # the good batches after the bad ones replay the graph
    assert traced.runner is not None and traced.runner.recorded() >= 2


def test_gradients_dropped_after_the_forward_are_held_until_eager_drops_them() -> None:
    """``zero_grad()`` after the forward: an id out of range stops eager with the last step's gradients
    still held. The replay drops them where eager does (a node of the graph), so it still holds them
    too when the lookup raises, and the step runs again eagerly: eager's error and state."""
    step, _, kept = _step(zero_grad_first=False)
    expected = _loop(step, kept, "id")
    step, _, kept = _step(zero_grad_first=False)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _loop(traced, kept, "id")
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert expected[3][1][3][0] is not None  # eager held a gradient when the lookup raised
    for i, (e, g) in enumerate(zip(expected, got)):
        _assert_same(e, g, f"call {i}")
    assert traced.capture_mode == "whole-step"
    nodes = list(traced.runner.graph_module.graph.nodes)
    (drop,) = [n for n in nodes if getattr(n.target, "__name__", "") == "zero_grad"]
    first_embedding = next(n for n in nodes if n.target is torch.ops.aten.embedding.default)
    assert nodes.index(first_embedding) < nodes.index(drop)  # after the forward, where the step drops them
    profile = traced.get_profile()
    assert any(n.op == "host.zero_grad" for n in profile.graphs[0].nodes)  # timed as a node of its own


def test_gradients_dropped_where_the_capture_did_not_see_are_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the capture does not see the step drop its gradients, a replay drops them before it starts
    (as it did before it placed them): an error in the forward then leaves them dropped where eager
    still holds them, and one warning says so; later calls run as segments."""
    monkeypatch.setattr(CaptureRecorder, "_note_dropped_grads", lambda self: None)
    step, _, kept = _step(zero_grad_first=False)
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _loop(traced, kept, "id")
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "dropped the gradients" in messages[0], messages
    assert "IndexError" in messages[0] and "test_failed_replays.py" in messages[0]  # the user's line
    assert got[3][1][3][0] is None  # the difference the warning names
    assert traced.capture_mode == "segments"


def test_an_error_after_the_update_is_said_once_and_later_calls_run_as_segments() -> None:
    step, _, kept = _step(after_step=True)
    expected = _loop(step, kept, "late id")
    step, _, kept = _step(after_step=True)
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _loop(traced, kept, "late id")
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "after it had written" in messages[0], messages
    assert [outcome for outcome, _ in got] == [outcome for outcome, _ in expected][:3] + [
        outcome for outcome, _ in got][3:]
    assert got[3][0][0] == "IndexError"
    assert traced.capture_mode == "segments"
    assert got[5][0][0] == "IndexError" and got[5][1][0] - got[4][1][0] == 1  # counted, as eager counts


def test_a_replay_that_raises_where_eager_does_not_gives_eagers_result() -> None:
    """A fault of graphprof's own (here: an op made to raise) must not reach the user as an error."""
    step, _, kept = _step()
    expected = _loop(step, kept, "none", calls=5)
    step, _, kept = _step()
    traced = graphprof.trace(step, profiling=False)
    results = _loop(traced, kept, "none", calls=3)
    runner = traced.runner
    node = next(n for n in runner.graph_module.graph.nodes if n.target is torch.ops.aten.embedding.default)
    real = node.target

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a fault of the replay's own")
    node.target = broken
    runner._executables.clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results += [(traced(*_batch(i, "none")), _state(kept)) for i in (3, 4)]
    finally:
        node.target = real
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "where eager did not" in messages[0], messages
    for i, (e, g) in enumerate(zip(expected, results)):
        _assert_same(e, g, f"call {i}")
    assert traced.capture_mode == "segments"


def test_the_failing_node_is_read_from_the_generated_codes_traceback() -> None:
    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.embedding(x.exp(), i).sum()

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.ones(4, 2), torch.tensor([1]))
    code = compile_graph(gm)
    with pytest.raises(IndexError) as info:
        code(torch.ones(4, 2), torch.tensor([9]))
    node = failing_node(info.value, code)
    assert node is not None and node.target is torch.ops.aten.embedding.default
    assert first_change(gm.graph, node) is None  # exp made a new tensor: nothing the caller holds changed


def test_a_write_to_an_input_or_a_view_of_it_is_a_change_and_one_to_a_new_tensor_is_not() -> None:
    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        y.add_(1)  # the replay's own tensor
        x[0].mul_(2)  # a view of the caller's
        return torch.embedding(y, i)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.ones(4, 2), torch.tensor([1]))
    nodes = list(gm.graph.nodes)
    mul = next(n for n in nodes if n.target is torch.ops.aten.mul_.Tensor)
    embedding = next(n for n in nodes if n.target is torch.ops.aten.embedding.default)
    assert first_change(gm.graph, mul) is None
    change = first_change(gm.graph, embedding)
    assert change is not None and "mul_" in change


def test_a_bad_batch_met_by_the_capture_call_raises_eagers_error_and_the_next_call_captures() -> None:
    """The call that captures meets the bad batch: the capture stops and puts the state back, the step
    runs eagerly and raises eager's error; this is no reason to give up whole-step replay."""
    def batch(i: int, bad: str) -> tuple[torch.Tensor, torch.Tensor]:
        return _batch(3 if i == 1 else i + 10, bad)  # call 1 (the capture call) gets a bad batch

    step, _, kept = _step()
    expected = []
    for i in range(5):
        try:
            expected.append((step(*batch(i, "id")), _state(kept)))
        except IndexError as exc:
            expected.append((repr(exc.__context__), _state(kept)))
    step, _, kept = _step()
    traced = graphprof.trace(step)
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            try:
                got.append((traced(*batch(i, "id")), _state(kept)))
            except IndexError as exc:
                got.append((repr(exc.__context__), _state(kept)))  # no graphprof error chained to it
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert got[1][0] == "None"  # raised, with nothing chained
    for i, (e, g) in enumerate(zip(expected, got)):
        _assert_same(e, g, f"call {i}")
    assert traced.capture_mode == "whole-step"
