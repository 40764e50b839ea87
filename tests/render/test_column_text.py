"""Node text made a column at a time: combining coded columns never changes the text."""

from __future__ import annotations

import io
import random

import pytest

from graphprof.render import column_text
from graphprof.render.column_text import Coded, NodeText, combined, encoded, joined


def _node_text(size: int, seed: int) -> tuple[NodeText, list[str]]:
    """Constants, per-node lists and coded columns of a few to many distinct values, and each node's text."""
    rng = random.Random(seed)
    text, expected = NodeText(), [""] * size
    for j in range(12):
        kind = rng.choice(["constant", "list", "small", "large"])
        if kind == "constant":
            part = f"<{j}>"
            text.text(part)
            expected = [e + part for e in expected]
            continue
        distinct = {"list": size, "small": 3, "large": 50}[kind]
        values = [f"{j}:{rng.randrange(distinct)}" for _ in range(size)]
        text.column(values if kind == "list" else encoded(values, lambda v: f"[{v}]"))
        expected = [e + (v if kind == "list" else f"[{v}]") for e, v in zip(expected, values)]
    return text, expected


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("limits", [(4096, 1 << 20), (10, 100), (1, 1)])
def test_combined_columns_give_each_nodes_text(seed: int, limits: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the runs of coded columns are cut into (table and product limits), each node's text is the same."""
    monkeypatch.setattr(column_text, "SMALL_TABLE", limits[0])
    monkeypatch.setattr(column_text, "COMBINED_LIMIT", limits[1])
    monkeypatch.setattr(column_text, "CHUNK_NODES", 7)
    text, expected = _node_text(40, seed)
    out = io.StringIO()
    text.write(out, 40, skip=2)
    assert out.getvalue() == "".join(expected)[2:]


def test_a_run_of_small_coded_columns_becomes_one_column_of_its_combinations() -> None:
    flags = encoded([True, False, True, True], lambda v: f"<f>{v}</f>")
    counts = encoded([1, 2, 1, 1], str)
    parts = combined(["<n>", flags, "|", counts, "</n>"], 4)
    assert len(parts) == 1 and isinstance(parts[0], Coded)
    assert len(parts[0].table) == 2  # (True, 1) and (False, 2): made once each
    assert parts[0].texts() == ["<n><f>True</f>|1</n>", "<n><f>False</f>|2</n>", "<n><f>True</f>|1</n>",
                                "<n><f>True</f>|1</n>"]


@pytest.mark.parametrize("seed", range(4))
def test_joined_columns_are_each_nodes_text(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Laid as columns (constants, shared table entries, per-node texts) and joined, each node's text is the same."""
    monkeypatch.setattr(column_text, "SMALL_TABLE", 10)
    text, expected = _node_text(40, seed)
    assert joined(text.columns(40), 40) == expected
