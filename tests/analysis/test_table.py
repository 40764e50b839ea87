"""The node table: ordering, shares, statistics."""

from __future__ import annotations

import pytest

from graphprof.analysis.table import node_table
from graphprof.profile import Profile
from tests.profile.test_serialize import small_profile


def test_rows_sorted_with_percentages() -> None:
    table = node_table(small_profile(), top=0, stat="median")
    assert [r.name for r in table.rows] == ["addmm", "relu"]
    assert table.total_time_s == pytest.approx(1.375e-6 + 5.5e-7)
    assert table.rows[0].percent == pytest.approx(100 * 1.375e-6 / table.total_time_s)
    assert table.rows[-1].cumulative_percent == pytest.approx(100.0)


def test_stat_choice_and_top() -> None:
    table = node_table(small_profile(), top=1, stat="max")
    assert len(table.rows) == 1 and table.rows[0].time_s == 1.5e-6
    with pytest.raises(ValueError, match="unknown statistic"):
        node_table(small_profile(), stat="p99")


def test_empty_profile() -> None:
    table = node_table(Profile(), top=10)
    assert table.rows == () and table.total_time_s == 0
