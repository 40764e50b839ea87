"""A replay that raises leaves the caller eager's error and eager's state, or says in one warning why not.

A loop that catches a bad batch's error and goes on (``except IndexError:
continue``) used to find the step's counter not counted, its logged loss
missing and its gradients gone after the replayed call that raised: a
replay applies the step's Python effects and gradients at its end.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.dropped_grads import DroppedGrads
from graphprof.runtime.codegen import compile_graph
from graphprof.runtime.failed_replays import failing_node, first_change

Step = Callable[[torch.Tensor, torch.Tensor], Any]


def _step(zero_grad_first: bool = True, after_step: bool = False,
          counter_first: bool = True) -> tuple[Step, nn.Module, dict[str, Any]]:
    """A training step with dropout, a counter and a list of losses; its loss raises on a class out of
    range, its embedding on an id out of range (``after_step``: a second lookup after the update)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Dropout(0.3), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kept: dict[str, Any] = {"n": 0, "losses": [], "model": model, "opt": opt}

    def step(idx: torch.Tensor, target: torch.Tensor) -> Any:
        if counter_first:
            kept["n"] += 1
        if zero_grad_first:
            opt.zero_grad()
        if not counter_first:
            kept["n"] += 1
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
@pytest.mark.parametrize("counter_first", [True, False], ids=["counter first", "zero_grad first"])
def test_an_error_before_any_write_leaves_eagers_error_and_state(bad: str, counter_first: bool) -> None:
    """The id raises in the forward, the class in the loss after dropout drew: the replay had written
    nothing the user holds, so the step runs again eagerly: eager's error, traceback and state. With
    ``zero_grad()`` the step's first line (the usual step), the gradients dropped before the graph
    runs are dropped where eager drops them."""
    step, _, kept = _step(counter_first=counter_first)
    expected = _loop(step, kept, bad)
    step, _, kept = _step(counter_first=counter_first)
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
    monkeypatch.setattr(DroppedGrads, "note", lambda self, context: None)
    step, _, kept = _step(zero_grad_first=False)
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _loop(traced, kept, "id")
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "where the capture did not see" in messages[0], messages
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
    add = next(n for n in nodes if n.target is torch.ops.aten.add_.Tensor)
    embedding = next(n for n in nodes if n.target is torch.ops.aten.embedding.default)
    assert first_change(gm.graph, add) is None  # up to and with the write to the replay's own tensor
    change = first_change(gm.graph, embedding)
    assert change is not None and "mul_" in change


def test_a_write_through_a_view_of_a_kept_tensor_is_no_change_and_one_to_another_tensor_is() -> None:
    """Buffers a replay copies and puts back (runtime/kept_buffers.py): written through any view of them,
    they are reported as used, not as changed; a write to another tensor is still a change."""
    def f(x: torch.Tensor, kept: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        kept.view(-1)[1:].add_(1)
        kept[0].mul_(2)
        x[0].mul_(2)
        return torch.embedding(x, i)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.ones(4, 2), torch.ones(2, 2), torch.tensor([1]))
    nodes = list(gm.graph.nodes)
    x, kept = nodes[0], nodes[1]
    writes = [n for n in nodes if n.target in (torch.ops.aten.add_.Tensor, torch.ops.aten.mul_.Tensor)]
    used: set[torch.fx.Node] = set()
    assert first_change(gm.graph, writes[1], frozenset({kept}), used) is None and used == {kept}
    change = first_change(gm.graph, writes[2], frozenset({kept}))
    assert change is not None and "mul_" in change and writes[2].args[0].args[0] is x
    assert first_change(gm.graph, writes[0]) is not None  # not kept: a change


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


def _written_then_raised(write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> list[Any]:
    """Eager's and the replay's state of ``counts`` after a call whose op raised, with the warnings."""
    outcomes = []
    for wrap in (lambda f: f, lambda f: graphprof.trace(f, profiling=False)):
        counts = torch.zeros(3)
        running = torch.zeros(2)
        emb = nn.Embedding(4, 2)

        def step(idx: torch.Tensor, target: torch.Tensor, counts: torch.Tensor = counts,
                 running: torch.Tensor = running, emb: nn.Module = emb) -> torch.Tensor:
            write(counts, running, idx)
            return F.cross_entropy(emb(idx), target).detach()
        fn = wrap(step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(5):
                bad = i == 3
                try:
                    fn(torch.tensor([0, 2 if bad else 1, 1]), torch.tensor([0, 1, 5 if bad else 1]))
                except IndexError:
                    pass
        outcomes.append((counts.clone(), running.clone(),
                         [str(w.message) for w in caught if "graphprof" in str(w.message)]))
    return outcomes


@pytest.mark.parametrize("write", ["index_add_", "batch_norm"])
def test_an_op_that_wrote_before_the_error_is_said_once_and_not_run_twice(write: str) -> None:
    """``index_add_`` on the caller's counts before a loss that raises, or ``F.batch_norm`` in training
    mode on running statistics (a write its schema does not declare): running the step again eagerly
    would apply them twice, so the replay's error is raised after one warning."""
    def counted(counts: torch.Tensor, running: torch.Tensor, idx: torch.Tensor) -> None:
        counts.index_add_(0, idx, torch.ones(3))

    def normed(counts: torch.Tensor, running: torch.Tensor, idx: torch.Tensor) -> None:
        F.batch_norm(idx.float().view(3, 1).expand(3, 2), running, torch.ones(2), training=True)

    (e_counts, e_running, e_warned), (t_counts, t_running, t_warned) = _written_then_raised(
        counted if write == "index_add_" else normed)
    assert torch.equal(e_counts, t_counts) and torch.equal(e_running, t_running)
    assert e_warned == [] and len(t_warned) == 1 and "after it had written" in t_warned[0], t_warned


def test_an_op_that_raised_part_way_through_its_own_write_is_a_change() -> None:
    """``index_add_`` writes the rows before the first bad index, then raises: running the step again
    would write them twice."""
    def f(counts: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return counts.index_add_(0, idx, torch.ones(len(idx)))

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.zeros(3), torch.tensor([1]))
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.index_add_.default)
    change = first_change(gm.graph, node)
    assert change is not None and "part of it" in change


def test_gradients_the_step_reads_before_dropping_them_are_checked_before_each_replay() -> None:
    """``sum(p.grad is not None ...)`` before ``zero_grad()`` is a Python test the graph keeps: a call
    after the loop dropped the gradients itself (``opt.zero_grad()`` between calls) gets another graph,
    and a replay that raised after the drop cannot run the step again (one warning)."""
    def make() -> tuple[Step, list[int], torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        log: list[int] = []

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = model(x)
            log.append(sum(p.grad is not None for p in model.parameters()))
            opt.zero_grad()
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            return loss.detach()
        return step, log, opt

    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    logs, messages = [], []
    for wrap in (lambda f: f, lambda f: graphprof.trace(f, profiling=False)):
        step, log, opt = make()
        fn = wrap(step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(7):
                if i == 3:
                    opt.zero_grad()  # outside the step
                try:
                    fn(x, torch.tensor([0, 1, 7, 0, 1]) if i == 5 else y)
                except IndexError:
                    pass
        logs.append(log)
        messages.append([str(w.message) for w in caught if "graphprof" in str(w.message)])
    assert logs[0][:5] == logs[1][:5]  # the calls before the bad batch's
    assert logs[0][3] == 0  # the call after the loop dropped them saw none
    assert logs[1][5:] == logs[0][6:]  # the bad batch's count is the difference the warning names
    assert messages[0] == [] and len(messages[1]) == 1 and "reads before it drops" in messages[1][0]


def test_the_usual_step_stays_whole_step_after_a_bad_batch() -> None:
    """``opt.zero_grad()`` first, plain SGD: the drop was placed after a node a later pass removed (an
    unused hyperparameter's reader), so it was not found, and a bad batch warned and gave up replay."""
    def make() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)

        def step(idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(emb(idx), target)
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    traced = graphprof.trace(make(), profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            with contextlib.suppress(IndexError):
                traced(torch.tensor([1, 12 if i == 3 else 2]), torch.tensor([0, 1]))
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"


def test_a_bad_batch_at_capture_with_a_logger_in_the_step_and_the_root_at_debug() -> None:
    """The step's ``log.debug`` reaches ``logging``'s manager, whose ``disable`` level the capture reads
    as the step's number. While the failed capture unwound, a library's logger compared it after the
    capture stopped recording, and that refusal replaced the step's own error: segments for good."""
    import logging

    log = logging.getLogger("test_failed_replays.train")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)

        def step(idx: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = emb(idx).sum()
            loss.backward()
            opt.step()
            log.debug("stepped")
            return loss.detach()

        traced = graphprof.trace(step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcomes = []
            for ids in [[1, 2], [1, 12], [1, 2], [3, 4], [3, 4]]:
                try:
                    traced(torch.tensor(ids))
                    outcomes.append("ok")
                except IndexError:
                    outcomes.append("IndexError")
    finally:
        root.setLevel(level)
    assert outcomes == ["ok", "IndexError", "ok", "ok", "ok"]
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"
