"""The HTML report's table pieces: the slowest rows found with numpy are those a full sort finds."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from graphprof.analysis.critical_path import critical_paths
from graphprof.analysis.frame import node_frame
from graphprof.render.html_tables import CRITICAL_ROWS, critical_section, path_positions, slowest_first
from tests.render.export_profiles import make_profile, node


def _by_sort(values: list[float], count: int) -> list[int]:
    return sorted(range(len(values)), key=values.__getitem__, reverse=True)[:count]


@pytest.mark.parametrize("count", [0, 1, 10, 5000])
def test_slowest_first_is_a_stable_descending_sort(count: int) -> None:
    rng = random.Random(count)
    for size in (0, 1, 9, 10, 11, 2000):
        values = [rng.choice((0.0, -0.0, 1e-6, 2e-6, 3.5e-3)) if rng.random() < 0.5 else rng.random()
                  for _ in range(size)]  # many ties, equal zeros of both signs
        assert slowest_first(np.array(values), count) == _by_sort(values, count)


def test_slowest_first_with_nan_keeps_what_sorted_gives() -> None:
    values = [1.0, float("nan"), 3.0, 2.0, float("nan"), 3.0]
    assert slowest_first(np.array(values), 4) == _by_sort(values, 4)


def test_a_chain_longer_than_the_table_shows_its_first_rows_and_its_slowest() -> None:
    size = CRITICAL_ROWS + 200
    times = [1e-3 * (1 + (i * 7919) % 97) for i in range(size)]
    profile = make_profile([node(i, "mm" if i % 2 else "relu", inputs=(i - 1,) if i else (), times=(t,),
                                 module=f"m{i % 5}") for i, t in enumerate(times)])
    frame = node_frame(profile)
    paths = critical_paths(profile)
    assert [p.tolist() for p in path_positions(frame, paths)] == [list(range(size))]
    html = critical_section(paths, frame, frame.times("median", "auto"), sum(times))
    assert f"all {size} nodes on the path (the first {CRITICAL_ROWS}), in order" in html
    slowest_table, every_table = html.split("critical-path-slowest")[1].split("critical-path-nodes")
    assert every_table.count("<tr>") == CRITICAL_ROWS + 1  # and its header
    shown = [int(n) for n in re.findall(r'<td class="num" data-v="(\d+)">', slowest_table)]
    assert shown == _by_sort(times, 10)
