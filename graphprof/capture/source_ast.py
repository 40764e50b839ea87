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


def instruction_at(code: CodeType, offset: int) -> dis.Instruction | None:
    """The instruction of ``code`` at ``offset`` (a frame's ``f_lasti``), or None."""
    for instruction in dis.get_instructions(code):
        if instruction.offset == offset:
            return instruction
    return None


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
