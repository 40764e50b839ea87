"""LastSignature: a call matches the last key only where its own key would be equal."""

from __future__ import annotations

import itertools

import torch

from graphprof.capture.signature import LastSignature, signature


def _last(*args: object, **kwargs: object) -> LastSignature:
    key, _ = signature(args, kwargs)
    last = LastSignature.of(key, args, kwargs)
    assert last is not None
    return last


def test_same_metadata_matches_and_any_field_that_differs_does_not() -> None:
    x, y = torch.zeros(4, 16), torch.zeros(4, dtype=torch.long)
    last = _last(x, y)
    assert last.matches((torch.ones(4, 16), torch.ones(4, dtype=torch.long)), {})
    assert last.matches((torch.nn.Parameter(torch.ones(4, 16), requires_grad=False), y), {})  # no tensor type in the key
    different = [
        (torch.zeros(5, 16), y),
        (torch.zeros(16, 4), y),
        (torch.zeros(4, 16, dtype=torch.float64), y),
        (torch.zeros(4, 16, requires_grad=True), y),
        (torch.zeros(4, 16, device="meta"), y),
        (x,),
        (x, y, y),
        (x, 3),
    ]
    for args in different:
        assert not last.matches(args, {}), args
        assert signature(args, {})[0] != last.key
    assert not last.matches((x, y), {"scale": 2.0})
    with torch.no_grad():
        assert not last.matches((x, y), {})


def test_matching_is_exactly_key_equality_over_many_calls() -> None:
    shapes, dtypes, grads = [(2, 3), (3, 2), (2, 3, 1)], [torch.float32, torch.float16], [False, True]
    tensors = [torch.zeros(s, dtype=d, requires_grad=g) for s, d, g in itertools.product(shapes, dtypes, grads)]
    for a, b in itertools.product(tensors, repeat=2):
        last = _last(a, b)
        for c, d in itertools.product(tensors[::3], repeat=2):
            assert last.matches((c, d), {}) == (signature((c, d), {})[0] == last.key)


def test_calls_of_other_forms_keep_no_record() -> None:
    x = torch.zeros(2)

    class Sub(torch.Tensor):
        pass

    for args, kwargs in [((x, 1), {}), ((x,), {"y": x}), (([x, x],), {}), ((x.as_subclass(Sub),), {})]:
        key, _ = signature(args, kwargs)
        assert LastSignature.of(key, args, kwargs) is None
    last = _last(x)
    assert not last.matches((x.as_subclass(Sub),), {})  # the full key decides for a subclass
