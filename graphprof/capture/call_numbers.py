"""The numbers of one torch call the step makes: what it passed, and where.

``scalars.call_with_scalars`` records them for each call that is given a
traced number; ``linked_numbers`` reads them to tell the number the step
passed from a constant of the same value in the op node the call made.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch.utils._pytree as pytree

#: A number the call was given or holds: an int or float (a bool is a flag, never a computed number).
NUMBER_TYPES = (int, float)


class CallScalars(list):  # type: ignore[type-arg]
    """The traced numbers one torch call was given (the list, in the order met), with the called
    function and the numbers of its arguments in order (a traced number, or a constant)."""

    def __init__(self, func: Any, numbers: list[Any]) -> None:
        super().__init__()
        self.func = func
        self.numbers = numbers


def is_number(value: Any) -> bool:
    return type(value) in NUMBER_TYPES


def number_leaves(tree: Any, is_scalar: Callable[[Any], bool]) -> list[Any]:
    """The numbers (ints and floats) and traced numbers among ``tree``'s leaves (args, kwargs), in
    ``pytree`` order."""
    return [v for v in pytree.tree_leaves(tree) if is_scalar(v) or is_number(v)]


def replace_numbers(tree: Any, replacements: Iterator[Any]) -> Any:
    """``tree`` with its numbers (in ``number_leaves``' order) each replaced by the next of
    ``replacements``, where that is not None."""
    def replaced(leaf: Any) -> Any:
        if not is_number(leaf):
            return leaf
        new = next(replacements)
        return leaf if new is None else new

    return pytree.tree_map(replaced, tree)
