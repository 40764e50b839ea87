"""Console table rendering on an empty and a real profile."""

from __future__ import annotations

import graphprof
from graphprof.analysis.table import node_table
from graphprof.render.console import render_node_table
from graphprof.render.units import format_bytes, format_count, format_time
from tests.profile.test_serialize import small_profile


def test_units() -> None:
    assert format_time(1.5e-6) == "1.5 us" and format_time(0.25) == "250 ms" and format_time(3e-9) == "3 ns"
    assert format_count(2.5e9, "FLOP") == "2.5 GFLOP" and format_bytes(3 * 2**20) == "3 MiB"
    assert format_time(float("inf")) == "N/A" and format_count(None, "FLOP") == "N/A"


def test_render_real_and_empty() -> None:
    text = graphprof.Profile(meta=small_profile().meta, steps=small_profile().steps,
                             graphs=small_profile().graphs).table(top=5)
    assert "addmm" in text and "fc" in text and "model.py:3" in text and "[4, 3]" in text
    assert "71.4" in text  # addmm's share: 1.375 / 1.925
    empty = render_node_table(node_table(graphprof.Profile()))
    assert "total 0 ns" in empty
