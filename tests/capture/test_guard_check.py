"""The compiled guard check: the same outcome, the same reads, in the same order, as the guards say."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from graphprof.capture.guard_check import GuardCheck
from graphprof.capture.scalars import Guard
from graphprof.capture.value_guards import VALUE_PREFIX, ValuePrefix


def _graph() -> tuple[torch.fx.Graph, torch.fx.Node, torch.fx.Node]:
    graph = torch.fx.Graph()
    return graph, graph.placeholder("n"), graph.placeholder("x")


def test_a_guard_on_an_argument_holds_only_for_the_captured_outcome_and_type() -> None:
    graph, n, _ = _graph()
    mod = graph.call_function(operator.mod, (n, 4))
    guard = Guard(operator.eq, (mod, 0), True, "step.py:3")
    check = GuardCheck([guard], {n: 0})
    assert check.broken([8]) is None
    assert check.broken([9]) is guard
    one = Guard(operator.mod, (n, 4), 1, "step.py:4")  # 1 == True, but the outcome's type must be the same too
    assert GuardCheck([one], {n: 0}).broken([5]) is None
    assert GuardCheck([Guard(operator.mod, (n, 4), True, "")], {n: 0}).broken([5]) is not None


def test_the_first_broken_guard_is_named_and_an_exception_breaks_its_guard() -> None:
    graph, n, _ = _graph()
    first = Guard(operator.gt, (n, 0), True, "a")
    second = Guard(operator.truediv, (1, n), 0.5, "b")
    check = GuardCheck([first, second], {n: 0})
    assert check.broken([2]) is None
    assert check.broken([-1]) is first
    assert check.broken([4]) is second
    second_fails = GuardCheck([Guard(operator.truediv, (1, n), 0.5, "b"), first], {n: 0})
    assert second_fails.broken([0]).where == "b"  # ZeroDivisionError: the guard is broken, not the caller


def test_reads_of_user_state_happen_on_every_check_in_operand_order() -> None:
    graph, _, _ = _graph()
    log: list[str] = []
    state = {"a": 3, "b": 4}

    def reader(name: str) -> Any:
        def read() -> Any:
            log.append(name)
            return state[name]
        return read

    a = graph.call_function(reader("a"), ())
    b = graph.call_function(reader("b"), ())
    total = graph.call_function(operator.add, (a, b))
    guards = [Guard(operator.lt, (total, 10), True, "x"), Guard(operator.ne, (a, 0), True, "y")]
    check = GuardCheck(guards, {})
    assert check.broken([]) is None and log == ["a", "b", "a"]
    state["a"] = 7
    log.clear()
    assert check.broken([]) is guards[0] and log == ["a", "b"]  # stops at the first broken guard


def test_a_value_prefix_is_recomputed_from_the_calls_own_tensors() -> None:
    graph, _, x = _graph()
    item = graph.call_function(torch.ops.aten._local_scalar_dense.default, (x,))

    def prefix(t: torch.Tensor) -> Any:
        return t.sum().item()

    prefix.placeholders = (x,)  # type: ignore[attr-defined]
    item.meta[VALUE_PREFIX] = prefix
    guard = Guard(operator.gt, (item, 0), True, "step.py:9")
    check = GuardCheck([guard], {x: 1})
    assert check.broken([None, torch.ones(3)]) is None
    assert check.broken([None, -torch.ones(3)]) is guard


def test_long_chains_of_arithmetic_compile_without_nesting_limits() -> None:
    graph, n, _ = _graph()
    value = n
    for _ in range(600):  # a counter incremented in a Python loop inside the step
        value = graph.call_function(operator.add, (value, 1))
    guard = Guard(operator.eq, (value, 600), True, "")
    check = GuardCheck([guard], {n: 0})
    assert check.broken([0]) is None and check.broken([1]) is guard


def test_constants_are_the_captured_objects_themselves() -> None:
    graph, n, _ = _graph()
    marker = object()
    guard = Guard(operator.is_, (n, marker), True, "")
    check = GuardCheck([guard], {n: 0})
    assert check.broken([marker]) is None and check.broken([object()]) is guard
    assert GuardCheck([], {}).broken([]) is None


def _counting_prefixes() -> tuple[torch.fx.Node, list[Guard], list[str]]:
    """Three guards on two values recomputed from ``x``, which share the node that sums it: a branch on
    the sum's ``.item()`` twice, and on a value computed from the sum (a ``ValuePrefix`` as the op)."""
    graph, _, x = _graph()
    runs: list[str] = []

    def summed(t: torch.Tensor) -> torch.Tensor:
        runs.append("sum")
        return t.sum()

    def doubled(t: torch.Tensor) -> torch.Tensor:
        runs.append("double")
        return t * 2

    total = graph.call_function(summed, (x,))
    twice = graph.call_function(doubled, (total,))
    item = graph.call_function(torch.ops.aten._local_scalar_dense.default, (total,))
    item.meta[VALUE_PREFIX] = ValuePrefix((x, total), (x,), (), _item, "sum")
    twice_prefix = ValuePrefix((x, total, twice), (x,), (), bool, "twice")
    guards = [Guard(operator.gt, (item, 0), True, "a"), Guard(operator.lt, (item, 10), True, "b"),
              Guard(twice_prefix, (x,), True, "c")]
    return x, guards, runs


def _item(t: torch.Tensor) -> Any:
    return t.item()


def test_the_values_recomputed_from_inputs_run_each_node_once_per_call() -> None:
    """A foreach RAdam step asks for each count three times in two guards; each prefix ran at every
    occurrence, ten times the eager step on a 200-parameter model. One pass runs each node once."""
    x, guards, runs = _counting_prefixes()
    check = GuardCheck(guards, {x: 0})
    assert check.broken([torch.ones(3)]) is None
    assert runs == ["sum", "double"]
    runs.clear()
    assert check.broken([torch.full((3,), 5.0)]) is guards[1]  # 15 < 10 breaks the second guard
    assert runs == ["sum"]  # the pass stopped where the broken guard's value was
    runs.clear()
    assert check.broken([-torch.ones(3)]) is guards[0]
    assert check.broken([torch.zeros(3)]) is guards[0]


def test_an_error_in_the_pass_breaks_the_guard_that_asked() -> None:
    x, guards, _ = _counting_prefixes()
    check = GuardCheck(guards, {x: 0})
    assert check.broken(["not a tensor"]) is guards[0]
