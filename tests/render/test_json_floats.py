"""The array formatter of the trace's numbers writes exactly what ``repr`` (and so ``json.dumps``) writes."""

from __future__ import annotations

import numpy as np

from graphprof.render.json_floats import float_texts


def test_every_float_is_its_repr_in_both_notations_and_at_their_edges() -> None:
    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, 1e-4, 9.999999999999999e-05, 1e-5, 1.5e-7, 5e-324, 1e16, 9999999999999998.0, 1e22,
             0.1, 123.0, 2.5e20, -3.25, float("inf"), float("-inf"), float("nan")]
    values = np.concatenate([
        np.array(edges),
        rng.integers(0, 2**63, size=20_000, dtype=np.uint64).view(np.float64),  # any bit pattern
        10.0 ** rng.uniform(-12, 25, size=20_000),  # every decade the trace's numbers span
        rng.integers(0, 10**6, size=2_000) / 1000.0,  # durations in µs of integer ns
    ])
    assert float_texts(values) == [repr(v) for v in values.tolist()]
    assert float_texts(np.array([])) == []
