"""A tensor a step keeps in one of its dicts or lists and carries to its next call is read where it
is kept (capture/watched_state.py, ``_watch_items``, and capture/state_effects.py, ``_set_items``), as
one kept in an attribute is.

A GRU's hidden state (one tensor, in a dict or a list, or a closure
variable) and a running mean such as yolov5's ``mloss`` were constants of
the graph: the capture refused them and the step ran as segments.
"""

from __future__ import annotations

import types
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

Setup = tuple[Callable[..., Any], nn.Module, torch.optim.Optimizer, Callable[[], Any]]


def _running_mean(kept_as: str) -> Setup:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    state: dict[str, Any] = {"m": torch.zeros(1), "i": 0, "mloss": torch.zeros(3)}
    cell = [torch.zeros(1)]

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = model(x)
        loss = F.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        item = loss.detach().unsqueeze(0)
        if kept_as == "dict":
            state["m"] = state["m"] * 0.9 + item
        elif kept_as == "dict_in_place":
            state["m"].mul_(0.9).add_(item)
        elif kept_as == "list":
            cell[0] = cell[0] * 0.9 + item
        else:  # yolov5's ``mloss = (mloss * i + loss_items) / (i + 1)``
            items = torch.stack([loss.detach(), out.detach().abs().mean(), out.detach().max()])
            state["mloss"] = (state["mloss"] * state["i"] + items) / (state["i"] + 1)
            state["i"] += 1
        return loss.detach()

    def carried() -> Any:
        return [cell[0]] if kept_as == "list" else [state["m"], state["mloss"], state["i"]]

    return step, model, opt, carried


def _gru(kept_as: str) -> Setup:
    """word_language_model with a GRU: ``hidden = repackage_hidden(hidden)`` at each batch's start."""
    torch.manual_seed(0)
    rnn, head = nn.GRU(4, 8), nn.Linear(8, 4)
    model = nn.ModuleList([rnn, head])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hidden = torch.zeros(1, 3, 8)
    state = {"hidden": torch.zeros(1, 3, 8)}
    cell = [torch.zeros(1, 3, 8)]

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal hidden
        if kept_as == "dict":
            out, state["hidden"] = rnn(x, state["hidden"].detach())
        elif kept_as == "list":
            out, cell[0] = rnn(x, cell[0].detach())
        else:
            out, hidden = rnn(x, hidden.detach())
        loss = (head(out) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        return loss.detach()

    def carried() -> Any:
        return [state["hidden"] if kept_as == "dict" else cell[0] if kept_as == "list" else hidden]

    return step, model, opt, carried


def _same(a: Any, b: Any, where: str) -> None:
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    else:
        assert a == b, where


def _assert_twins(make: Callable[[], Setup], calls: int = 7,
                  between: Callable[[int, Setup], None] = lambda i, setup: None) -> Any:
    """Run an eager and a traced twin ``calls`` times; after every call the results, the carried
    values, the parameters, their gradients and the optimizer state are bitwise equal."""
    eager, twin = make(), make()
    traced = graphprof.trace(twin[0], profiling=True)
    for i in range(calls):
        between(i, eager)
        between(i, twin)
        g = torch.Generator().manual_seed(i)
        if isinstance(eager[1], nn.ModuleList):
            x, y = torch.randn(5, 3, 4, generator=g), torch.randn(5, 3, 4, generator=g)
        else:
            x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
        where = f"call {i}"
        _same(eager[0](x, y), traced(x, y), where)
        for a, b in zip(eager[3](), twin[3](), strict=True):
            _same(a, b, f"carried value, {where}")
        for a, b in zip(eager[1].parameters(), twin[1].parameters(), strict=True):
            _same(a.detach(), b.detach(), f"parameter, {where}")
            _same(a.grad, b.grad, f"gradient, {where}")
        for a, b in zip(eager[2].state.values(), twin[2].state.values(), strict=True):
            for key in a:
                _same(a[key], b[key], f"optimizer state {key}, {where}")
    return traced


@pytest.mark.parametrize("kept_as", ["dict", "dict_in_place", "list", "mean_of_items"])
def test_a_running_mean_kept_in_a_dict_or_list_replays_whole_step(kept_as: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traced = _assert_twins(lambda: _running_mean(kept_as))
    assert traced.capture_mode == "whole-step" and traced.captures == 1


@pytest.mark.parametrize("kept_as", ["dict", "list", "closure"])
def test_a_gru_hidden_state_carried_between_calls_replays_whole_step(kept_as: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traced = _assert_twins(lambda: _gru(kept_as))
    # Two graphs: the first call's hidden state does not require grad, later ones do (the GRU's output).
    assert traced.capture_mode == "whole-step" and traced.captures <= 2


@pytest.mark.parametrize("kept_as", ["dict", "list"])
def test_a_kept_tensor_replaced_by_another_shape_or_dtype_between_calls_equals_eager(kept_as: str) -> None:
    def replace(i: int, setup: Setup) -> None:
        kept = setup[0].__closure__  # the dict or the list the step keeps its mean in
        assert kept is not None
        holder = next(c.cell_contents for c in kept
                      if isinstance(c.cell_contents, (dict, list)) and (kept_as == "dict") == isinstance(
                          c.cell_contents, dict))
        key: Any = "m" if kept_as == "dict" else 0
        if i == 3:
            holder[key] = torch.ones(4)  # another shape: the mean broadcasts to it
        elif i == 5:
            holder[key] = torch.ones(4, dtype=torch.float64)

    traced = _assert_twins(lambda: _running_mean(kept_as), calls=8, between=replace)
    assert traced.capture_mode == "whole-step" and traced.captures == 3


def test_one_tensor_kept_in_two_places_and_replaced_in_one_is_refused() -> None:
    """The graph holds one constant for both places; after a replay they hold two tensors."""
    def make() -> Setup:
        torch.manual_seed(0)
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = {"avg": torch.zeros(1), "best": torch.zeros(1)}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state["avg"] = state["avg"] * 0.5 + loss.detach()
            return state["avg"] + state["best"]

        return step, model, opt, lambda: [state["avg"], state["best"]]

    def share(i: int, setup: Setup) -> None:
        if i == 1:  # the call the step is captured on finds one tensor in both places
            closure = setup[0].__closure__
            assert closure is not None
            state = next(c.cell_contents for c in closure if isinstance(c.cell_contents, dict))
            state["avg"] = state["best"] = torch.full((1,), 2.0)

    with pytest.warns(UserWarning, match="kept both in"):
        traced = _assert_twins(make, between=share)
    assert traced.capture_mode != "whole-step"


@pytest.mark.parametrize("where", ["dict", "attribute"])
def test_a_kept_tensor_the_user_makes_require_grad_refuses_and_gets_eagers_grad(where: str) -> None:
    """``d["w"] = torch.ones(4, requires_grad=True)`` between calls, not a parameter of the model or the
    optimizer: eager's backward accumulates into its ``.grad`` on every call. A replay did not (the
    graph writes the gradients of the parameters it knows): refused before the step runs, so the
    fallback accumulates once."""
    results = []
    for traced in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kept: dict[str, torch.Tensor] = {"w": torch.ones(4)}
        holder = types.SimpleNamespace(w=torch.ones(4))

        def step(x: torch.Tensor, model: nn.Module = model, opt: torch.optim.Optimizer = opt,
                 kept: dict[str, torch.Tensor] = kept, holder: Any = holder) -> torch.Tensor:
            opt.zero_grad()
            w = kept["w"] if where == "dict" else holder.w
            loss = (model(x) * w).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        fn = graphprof.trace(step, profiling=False) if traced else step
        seen = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(6):
                if i == 3:
                    kept["w"] = torch.ones(4, requires_grad=True)
                    holder.w = torch.ones(4, requires_grad=True)
                loss = fn(torch.randn(4, 4, generator=torch.Generator().manual_seed(i)))
                w = kept["w"] if where == "dict" else holder.w
                seen.append((loss, None if w.grad is None else w.grad.clone(),
                             [p.detach().clone() for p in model.parameters()]))
        if traced:
            messages = [str(m.message) for m in caught if "graphprof" in str(m.message)]
            assert len(messages) == 1 and "requires grad and is not a parameter" in messages[0]
        results.append(seen)
    for i, (e, g) in enumerate(zip(*results)):
        assert torch.equal(e[0], g[0]) and all(torch.equal(a, b) for a, b in zip(e[2], g[2])), f"call {i}"
        assert (e[1] is None) == (g[1] is None) and (e[1] is None or torch.equal(e[1], g[1])), f"call {i}"


@pytest.mark.parametrize("places", ["dict and attribute", "two attributes", "list and attribute"])
def test_one_tensor_kept_in_two_places_and_rebound_at_one_by_the_user_is_read_anew(places: str) -> None:
    """``h.w = d["w"]``, both read by the step, then ``h.w = new`` between calls: the graph read both
    places from one, so every replay used the old tensor at both, silently. Both places are now held
    as one object, and the rebinding captures again."""
    def run(traced: bool) -> list[float]:
        d = {"w": torch.ones(3)}
        h = types.SimpleNamespace(w=d["w"])
        g = types.SimpleNamespace(v=d["w"])
        lst = [d["w"]]
        other = {"dict and attribute": lambda: d["w"], "two attributes": lambda: g.v,
                 "list and attribute": lambda: lst[0]}[places]

        def step(x: torch.Tensor) -> torch.Tensor:
            return (x * other() + h.w).sum()
        fn = graphprof.trace(step, profiling=False) if traced else step
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(6):
                if i == 3:
                    h.w = torch.full((3,), 5.0)
                seen.append(fn(torch.full((3,), float(i))).item())
        return seen

    assert run(traced=False) == run(traced=True)
