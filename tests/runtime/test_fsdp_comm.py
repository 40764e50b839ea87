"""Overlap of communication with computation, from intervals (runtime/fsdp_comm.py)."""

from __future__ import annotations

from graphprof.runtime.fsdp_comm import overlap_ns, union_ns


def test_union_merges_touching_and_nested_intervals_and_drops_empty_ones() -> None:
    assert union_ns([(5, 9), (0, 2), (2, 3), (6, 7), (4, 4)]) == [(0, 3), (5, 9)]


def test_blocking_collectives_between_graph_runs_are_all_exposed() -> None:
    # gloo: the thread that computes waits in each collective, so the intervals only touch.
    comm, hidden = overlap_ns([(10, 20), (30, 35)], [(0, 10), (20, 30), (35, 50)])
    assert (comm, hidden) == (15, 0)


def test_collectives_beside_graph_runs_are_hidden_where_they_overlap() -> None:
    # A stream (or a gloo worker thread) runs the collectives while graphs run: [5, 15) is hidden
    # behind the first run, [40, 45) behind the second; overlapping collectives count once.
    comm, hidden = overlap_ns([(5, 25), (20, 30), (40, 60)], [(0, 15), (35, 45)])
    assert comm == 25 + 20 and hidden == 10 + 5
    assert 0 <= hidden <= comm


def test_no_collectives_means_no_communication() -> None:
    assert overlap_ns([], [(0, 10)]) == (0, 0)
