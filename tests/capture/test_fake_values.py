"""make_fx's output metadata made in one fake mode per capture: the same metadata, one mode."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.proxy_tensor import make_fx

from graphprof.capture.fake_values import one_fake_mode


def _step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.relu(x @ w)
    return (y.t().contiguous() * 2).sum(dim=0)


def _metadata(gm: torch.fx.GraphModule) -> list[Any]:
    return [(n.name, tuple(v.shape), v.stride(), v.dtype) for n in gm.graph.nodes
            if isinstance(v := n.meta.get("val"), torch.Tensor)]


def _count_modes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    init = FakeTensorMode.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(FakeTensorMode, "__init__", counted)
    return made


def test_a_real_trace_makes_its_metadata_in_one_mode_with_the_same_results(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    made = _count_modes(monkeypatch)
    plain = make_fx(_step, tracing_mode="real")(x, w)
    per_op = len(made)
    made.clear()
    with one_fake_mode():
        shared = make_fx(_step, tracing_mode="real")(x, w)
    assert per_op >= 5 and len(made) == 1  # one mode for every op, not one per op
    assert _metadata(shared) == _metadata(plain) and len(_metadata(plain)) >= 5
    assert torch.equal(shared(x, w), plain(x, w))


def test_torch_s_class_is_given_back_and_other_uses_get_modes_of_their_own() -> None:
    with one_fake_mode():
        swapped = proxy_tensor.FakeTensorMode
        a = swapped(allow_fallback_kernels=True)
        assert swapped(allow_fallback_kernels=True) is a
        other = swapped(allow_non_fake_inputs=True)
        assert other is not a and type(other) is FakeTensorMode
    assert proxy_tensor.FakeTensorMode is FakeTensorMode
    with pytest.raises(RuntimeError), one_fake_mode():
        raise RuntimeError("a capture that fails")
    assert proxy_tensor.FakeTensorMode is FakeTensorMode
