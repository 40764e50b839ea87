"""The source behind an instruction: a function's code at an offset, its file parsed, spans of its nodes.

Why here: formatted numbers are taken by what the source does with them
(``printed_texts``, ``percent_texts``), found from the instruction that asks
for the text and the AST node its positions span.
"""

from __future__ import annotations

import ast
import dis
import functools
import linecache
from types import CodeType
from typing import Callable


def instruction_at(code: CodeType, offset: int) -> dis.Instruction | None:
    """The instruction of ``code`` at ``offset`` (a frame's ``f_lasti``), or None. A frame that called a
    Python function (the capture's stand-in for ``time.ctime``) is at its ``CALL``'s last inline cache
    entry (Python 3.11), which belongs to the ``CALL``."""
    found = None
    for instruction in dis.get_instructions(code):
        if instruction.offset > offset:
            break
        found = instruction
    return found


def module_tree(filename: str) -> ast.Module | None:
    """The parsed source of ``filename`` as ``linecache`` holds it (None where it has none)."""
    lines = linecache.getlines(filename)
    if not lines:
        return None
    return _parsed("".join(lines))


@functools.lru_cache(maxsize=64)
def _parsed(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def holds(node: ast.AST, start: tuple[int, int], end: tuple[int, int]) -> bool:
    """Whether ``node``'s source span holds ``[start, end]`` (line, column pairs)."""
    first = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
    last = (node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
    return None not in (*first, *last) and first <= start and end <= last  # type: ignore[operator]


def spans(node: ast.AST, start: tuple[int, int], end: tuple[int, int]) -> bool:
    """Whether ``node``'s source span is exactly ``[start, end]``."""
    return ((getattr(node, "lineno", None), getattr(node, "col_offset", None)) == start
            and (getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)) == end)


def spanning(tree: ast.AST, start: tuple[int, int], end: tuple[int, int],
             accept: Callable[[ast.AST], bool]) -> tuple[ast.AST, ast.AST] | None:
    """The first node ``accept`` takes, outermost first, among the nodes whose span holds ``[start,
    end]``, and its parent (the tree itself is never taken); None when there is none."""
    stack: list[tuple[ast.AST, ast.AST | None]] = [(tree, None)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, (ast.expr, ast.stmt)) and not holds(node, start, end):
            continue
        if parent is not None and accept(node):
            return node, parent
        stack.extend((child, node) for child in ast.iter_child_nodes(node))
    return None

