"""``%``-formatted strings the step only prints or logs: read back from the string, formatted by the replay.

``print("[%d] loss: %.3f" % (i, loss.item()))`` (the older tutorials' form)
cannot take a marker as an f-string's value does (``printed_texts``):
``str % x`` asks ``x`` for a float or an int and formats it in C. So the
capture call's numbers are given as they are, each noted with what ``%``
asked of it (``PrintedTexts.percent``), and when the string reaches the
output call it is read back (``read_back``): the format's constant text,
the noted numbers' texts at their conversions, and what the other operands
(not traced: constants of this graph) wrote between them. A string that
reads back in more than one way refuses.
"""

from __future__ import annotations

import ast
import dis
import functools
import itertools
import re
from dataclasses import dataclass
from types import CodeType
from typing import Any

from graphprof.capture.formatted_text import Formatted, FormattedText
from graphprof.capture.source_ast import instruction_at, module_tree, spanning, spans


#: What ``%`` asks of a value for each conversion (``float()``, ``int()``, ``operator.index``, ``str``, ``repr``).
_PERCENT_KINDS = {**dict.fromkeys("eEfFgG", "float"), **dict.fromkeys("diu", "int"), **dict.fromkeys("oxX", "index"),
                  "s": "str", "r": "repr", "a": "repr"}
#: One conversion: flags, width and precision written out (no ``*``, no mapping key), and its type.
_CONVERSION = re.compile(r"%([-+ #0]*\d*(?:\.\d*)?)([a-zA-Z%])")
#: Readings of a string tried before it refuses (the traced values' places among the conversions).
_MOST_READINGS = 64


@dataclass
class Percent:
    """One ``%``-formatting of noted numbers: where (frame and instruction), the format, the numbers."""

    key: tuple[int, int]
    #: The format as constant text and conversions (``"%.4f"``), in order.
    site: tuple[str | tuple[str, str], ...]
    where: str
    #: (TracedScalar, what ``%`` asked of it), in the order ``%`` asked.
    values: list[tuple[Any, str]]
    closed: bool = False


def percent_text(value: Any, conversion: str) -> str:
    """The text ``%`` writes for one value: the replay's output node formats its numbers with this."""
    return conversion % (value,)


def is_percent(instruction: dis.Instruction) -> bool:
    """A ``%`` of two values (``BINARY_OP``): formatting, when its left operand is a string."""
    return instruction.opname == "BINARY_OP" and instruction.argrepr == "%"


@functools.lru_cache(maxsize=512)
def percent_site(code: CodeType, offset: int) -> tuple[str | tuple[str, str], ...] | None:
    """The format of the ``"..." % operands`` at ``offset``, as constant text and ``(conversion, kind)``,
    when the format is written out and ``read_back`` can read it; else None. (Whether the string only
    goes to ``print`` or a logger is ``printed_texts.only_printed``'s to say.)"""
    instruction = instruction_at(code, offset)
    if instruction is None or not is_percent(instruction) or instruction.positions is None:
        return None
    span = instruction.positions
    tree = module_tree(code.co_filename)
    if tree is None or None in (span.lineno, span.end_lineno, span.col_offset, span.end_col_offset):
        return None
    found = percent_node(tree, (span.lineno, span.col_offset), (span.end_lineno, span.end_col_offset))  # type: ignore[arg-type]
    if found is None:
        return None
    node = found[0]
    assert isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)  # (``percent_node`` checked)
    return _parsed_format(node.left.value)


def _parsed_format(text: str) -> tuple[str | tuple[str, str], ...] | None:
    """A ``%`` format as constant text and ``(conversion, kind)``, or None for one this does not read
    (``*`` widths, mapping keys, ``%c``, a stray ``%``)."""
    parts: list[str | tuple[str, str]] = []
    at = 0
    for match in _CONVERSION.finditer(text):
        constant = text[at:match.start()]
        if "%" in constant:
            return None
        parts.append(constant)
        flags, kind = match.group(1), _PERCENT_KINDS.get(match.group(2))
        if match.group(2) == "%" and not flags:
            parts.append("%")
        elif kind is None:
            return None
        else:
            parts.append((match.group(0), kind))
        at = match.end()
    if "%" in text[at:]:
        return None
    parts.append(text[at:])
    return tuple(p for p in parts if p != "")


def percent_node(tree: ast.AST, start: tuple[int, int], end: tuple[int, int]) -> tuple[ast.BinOp, ast.AST] | None:
    """The ``"..." % operands`` spanning exactly ``[start, end]`` whose format is written out and read
    by ``_parsed_format``, and its parent node; else None."""
    found = spanning(tree, start, end, lambda node: isinstance(node, ast.BinOp) and spans(node, start, end))
    if found is None:
        return None
    node, parent = found
    assert isinstance(node, ast.BinOp)
    if not (isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
            and _parsed_format(node.left.value) is not None):
        return None
    return node, parent


def compiled_percent(tree: ast.AST, start: tuple[int, int], end: tuple[int, int]) -> tuple[ast.BinOp, ast.AST] | None:
    """The ``"..." % (a, b)`` one of whose operands spans exactly ``[start, end]``, and its parent node."""
    def takes(node: ast.AST) -> bool:
        return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, str) and isinstance(node.right, ast.Tuple)
                and any(spans(e, start, end) for e in node.right.elts))

    return spanning(tree, start, end, takes)  # type: ignore[return-value]  # a BinOp, as ``takes`` asks


def read_back(record: Percent, text: str) -> FormattedText | None:
    """``text`` read back as ``record``'s format with its noted numbers formatted in the replay: None
    unless exactly one placing of the numbers among the conversions (by what ``%`` asked of each) gives
    ``text``, the other conversions' texts each found in one way only."""
    conversions = [i for i, part in enumerate(record.site) if not isinstance(part, str)]
    values = record.values
    found: FormattedText | None = None
    readings = 0
    for places in itertools.combinations(conversions, len(values)):
        if any(record.site[i][1] != kind for i, (_, kind) in zip(places, values)):  # type: ignore[index]
            continue
        readings += 1
        if readings > _MOST_READINGS:
            return None
        texts = {i: percent_text(value.value, record.site[i][0]) for i, (value, _) in zip(places, values)}  # type: ignore[index]
        lazy, greedy = (_read(record.site, texts, text, quantifier) for quantifier in ("*?", "*"))
        if lazy is None:
            continue
        if greedy != lazy or found is not None:
            return None  # read in more than one way
        parts: list[str | Formatted] = []
        for i, part in enumerate(record.site):
            if i in texts:
                value = values[places.index(i)][0]
                parts.append(Formatted(value, percent_text, (record.site[i][0],), texts[i]))  # type: ignore[index]
            else:
                piece = part if isinstance(part, str) else lazy[i]
                if parts and isinstance(parts[-1], str):
                    parts[-1] += piece
                else:
                    parts.append(piece)
        found = FormattedText(tuple(p for p in parts if p != ""))
    return found


def _read(site: tuple[str | tuple[str, str], ...], texts: dict[int, str], text: str,
          quantifier: str) -> dict[int, str] | None:
    """The text each conversion not in ``texts`` wrote, where ``text`` is ``site`` with ``texts`` at theirs
    (lazy or greedy readings: both the same means one reading), or None when it is not."""
    pattern = "".join(re.escape(part) if isinstance(part, str) else re.escape(texts[i]) if i in texts
                      else f"(?P<c{i}>.{quantifier})" for i, part in enumerate(site))
    match = re.fullmatch(pattern, text, flags=re.DOTALL)
    if match is None:
        return None
    return {int(name[1:]): piece for name, piece in match.groupdict().items()}
