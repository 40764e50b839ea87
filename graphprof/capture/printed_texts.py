"""Formatted text of values a replay computes, where the text only goes to ``print`` or a logger.

Why: ``print(f"step {self.n} loss {loss.item():.4f}")`` on every call is the
most common logging in a training script (``logger.info(f"...")`` the
next). The loss is only known once the replay has run, so its text used to
refuse the capture, and the step ran as segments on every call; the count
changes every call, so its text, kept as a guard, sent every call to
another capture. Neither text is needed before the replay: ``print`` and
``Logger._log`` are host nodes that run in the replay, and can format the
replay's numbers themselves.

How: when a number the capture traces is formatted, the f-string is looked
up in the source (``only_printed``), or the ``"...".format(...)`` call of a
string written there (the PyTorch examples' form: ``str.format`` calls the
value's ``__format__`` from the call's instruction), or the ``str(...)`` call. If
the string reaches only arguments of calls of Python's own ``print``, or
messages of a ``logging.Logger``'s ``info`` (``debug``, ``warning``, ...) or
of ``logging.info``, in the user's code (straight, or through ``+``, a join
and local names: capture/text_flow.py), the number's text is a marker (``PrintedTexts.defer``): a NUL, a random tag of
this capture and the entry's index. The output calls' stand-ins
(``host_sources``) find the markers in their arguments and keep the string
as a ``FormattedText``: its constant parts and, for each marker, the
number's node and format spec. The replay's output node formats its own
numbers into it, as eager would.

Why this is safe: a string an f-string makes can only reach what the
source passes it to, and the source says: ``print``, resolved to the
builtin (not a global or local of that name, which ``rich`` provides), or a
logger found by name and attribute lookups alone (no property run), whose
method is logging's own; and in between only what keeps the text as it is
(``text_flow``: not ``.upper()``, a list the state keeps, ``len``, a
conditional). A spec that is computed (``f"{x:.{p}f}"``) or a conversion
with a spec (``f"{x!r:>8}"``, which would pad the marker) refuses as
before. As a last check, a marker that no output call took by the end of
the capture refuses it (``whole_step``): a logger whose level drops the
message never takes it. Python 3.10 has no column positions for its
instructions: there the text refuses as before.

``%``-formatting (``print("loss: %.4f" % loss.item())``) formats in C and
cannot take a marker: capture/percent_texts.py reads its string back.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import logging
import secrets
import string
import sys
from types import CodeType, FrameType
from typing import Any, Callable

import torch.utils._pytree as pytree

from graphprof.capture.formatted_text import Formatted, FormattedText
from graphprof.capture.percent_texts import (Percent, compiled_percent, is_percent, percent_node, percent_site,
                                             read_back)
from graphprof.capture.source_ast import holds, instruction_at, module_tree, spanning, spans
from graphprof.capture.sources import file_line, is_library
from graphprof.capture.text_flow import LOG_METHODS, a_str_call, a_time_text_call, output_calls

#: The instructions that call ``__format__``, ``__str__`` or ``__repr__`` of an f-string's value.
_FORMATTING = frozenset({"FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE"})


#: The capture's ``PrintedTexts`` while ``print`` is patched (one per nested capture).
PRINTED_TEXTS: list[PrintedTexts] = []


class PrintedTexts:
    """The markers one capture handed out, and which of them a ``print`` took."""

    def __init__(self) -> None:
        self.tag = f"\x00graphprof-{secrets.token_hex(6)}:"
        self.entries: list[Formatted] = []
        self.printed: set[int] = set()
        self.where: list[str] = []
        #: ``%``-formatted strings whose numbers were noted and that no output call has taken yet.
        self.percents: list[Percent] = []

    def defer(self, value: Any, op: Callable[..., str], spec: tuple[str, ...], where: str) -> str | None:
        """A marker for ``op(value, *spec)`` when the formatting frame's f-string only goes to ``print``."""
        if not printed_here():
            return None
        self.entries.append(Formatted(value, op, spec, op(value.value, *spec)))
        self.where.append(where)
        return f"{self.tag}{len(self.entries) - 1}\x00"

    def percent(self, value: Any, kind: str, named: str) -> bool:
        """Note ``value`` (``named``: where it was read) when the user's code is ``%``-formatting it
        (``kind``: what ``%`` asked of it: float, int, index, str or repr) into a string that only
        ``print`` or a logger takes; the caller then gives the capture call's number as it is. False
        when it is not."""
        frame = _user_frame()
        if frame is None:
            return False
        site = percent_site(frame.f_code, frame.f_lasti)
        if site is None or not only_printed(frame.f_code, frame.f_lasti, frame):
            return False
        key = (id(frame), frame.f_lasti)
        if not self.percents or self.percents[-1].key != key or self.percents[-1].closed:
            where = f"{file_line(frame.f_code.co_filename, frame.f_lineno)} ({named})"
            self.percents.append(Percent(key, site, where, []))
        self.percents[-1].values.append((value, kind))
        return True

    def expand(self, value: Any) -> Any:
        """``value`` (a print's arguments) with each string holding markers, or made by a noted
        ``%``-formatting, as a ``FormattedText``; ``value`` itself when none does."""
        if not self.holds_markers(value) and not self.percents:
            return value
        for record in self.percents:
            record.closed = True  # its string is made: a later evaluation of the same line is another
        leaves, spec = pytree.tree_flatten(value)
        read: dict[int, FormattedText] = {}
        while self.percents:  # each noted string, in order, where exactly one of the texts reads back as it
            found = {i: text for i, leaf in enumerate(leaves) if isinstance(leaf, str) and i not in read
                     and (text := read_back(self.percents[0], leaf)) is not None}
            if len(found) != 1:  # (two: ``print("5", "%d" % n)`` with n 5; which is n's is unknown)
                break
            read.update(found)
            self.percents.pop(0)
        leaves = [read[i] if i in read else self._text(leaf) if isinstance(leaf, str) and self.tag in leaf else leaf
                  for i, leaf in enumerate(leaves)]
        return pytree.tree_unflatten(leaves, spec)

    def holds_markers(self, value: Any) -> bool:
        """Whether ``value`` (a call's arguments) holds a string with one of this capture's markers."""
        return any(isinstance(leaf, str) and self.tag in leaf for leaf in pytree.tree_leaves(value))

    def _text(self, text: str) -> FormattedText:
        parts: list[str | Formatted] = []
        head, *rest = text.split(self.tag)
        parts.append(head)
        for piece in rest:
            index, _, tail = piece.partition("\x00")
            self.printed.add(int(index))
            parts += [self.entries[int(index)], tail]
        return FormattedText(tuple(p for p in parts if p != ""))

    def unprinted(self) -> str | None:
        """Where a value was formatted whose marker no ``print`` took, or whose ``%``-formatted string
        no output call took or could be read back (the capture then refuses, naming it), or None."""
        if self.percents:
            return self.percents[0].where
        return next((where for i, where in enumerate(self.where) if i not in self.printed), None)


def _user_frame() -> FrameType | None:
    """The innermost frame of the user's code."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and is_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def printed_here() -> bool:
    """Whether the innermost frame of the user's code is formatting a value of an f-string that only
    ``print`` or a logger takes (``only_printed``), not ``%``-formatting one (``PrintedTexts.percent``)."""
    frame = _user_frame()
    return frame is not None and percent_site(frame.f_code, frame.f_lasti) is None and only_printed(
        frame.f_code, frame.f_lasti, frame)


def only_printed(code: CodeType, offset: int, frame: FrameType) -> bool:
    """Whether the instruction at ``offset`` formats a value of an f-string that is an argument of
    Python's own ``print``, or the message of a ``logging`` call, and nothing else, with constant specs."""
    if sys.version_info < (3, 11):
        return False
    found = _printing_call(code, offset)
    if found is None:
        return False
    calls, by_str = found
    if by_str and not _names_builtin("str", code, frame):
        return False
    return all(_a_logging_call(call.func, frame) if isinstance(call.func, ast.Attribute)
               else _names_builtin("print", code, frame) for call in calls)


def _names_builtin(name: str, code: CodeType, frame: FrameType) -> bool:
    """``name`` (``print``, ``str``) in this frame is the builtin one, not a name of the user's."""
    if name in code.co_varnames or name in code.co_cellvars or name in code.co_freevars:
        return False
    if name in frame.f_globals:
        return False
    if not code.co_flags & inspect.CO_OPTIMIZED and name in frame.f_locals:  # a class body's or exec's names
        return False
    return frame.f_builtins.get(name) is getattr(builtins, name)




def _a_logging_call(func: ast.Attribute, frame: FrameType) -> bool:
    """``log.info(...)``, ``self.logger.warning(...)`` or ``logging.info(...)``, where the object is a
    ``logging.Logger`` whose method is logging's own, or the ``logging`` module, found without running
    any of the user's code (no property is called): anything else could keep the marker."""
    owner = _static_value(func.value, frame)
    if owner is logging:
        return getattr(logging, func.attr) is _LOGGING_FUNCTIONS[func.attr]
    return isinstance(owner, logging.Logger) and inspect.getattr_static(owner, func.attr, None) is getattr(
        logging.Logger, func.attr)


#: The ``logging`` module's own functions, as it defines them (a test or a library may replace them).
_LOGGING_FUNCTIONS = {name: getattr(logging, name) for name in LOG_METHODS}
_MISSING = object()


def _static_value(node: ast.expr, frame: FrameType) -> Any:
    """The object a name or a chain of attributes names in ``frame``, looked up in dicts alone, or
    ``_MISSING`` (a property, a ``__getattr__``, a name not found)."""
    if isinstance(node, ast.Name):
        for names in _namespaces(frame):
            if node.id in names:
                return names[node.id]
        return _MISSING
    if isinstance(node, ast.Attribute):
        owner = _static_value(node.value, frame)
        if owner is _MISSING:
            return _MISSING
        value = inspect.getattr_static(owner, node.attr, _MISSING)
        return _MISSING if hasattr(type(value), "__get__") else value  # a property: code of the user's
    return _MISSING


def _namespaces(frame: FrameType) -> list[dict[str, Any]]:
    """Where a name is looked up: the frame's locals (a snapshot for a function's frame, only read),
    globals and builtins. The object was loaded already, before the f-string's values were."""
    return [frame.f_locals, frame.f_globals, frame.f_builtins]


@functools.lru_cache(maxsize=512)
def _printing_call(code: CodeType, offset: int) -> tuple[tuple[ast.Call, ...], bool] | None:
    """The output calls the text formatted at ``offset`` reaches and nothing else (``text_flow``: a
    ``%``-formatted string only as their own argument, since it is read back from it), when its specs
    are all written out; and whether the text is ``str(...)``'s. Else None."""
    instruction = instruction_at(code, offset)
    if instruction is None or instruction.positions is None or (
            instruction.opname not in _FORMATTING and instruction.opname != "CALL" and not is_percent(instruction)):
        return None
    span = instruction.positions
    line, end_line, column, end_column = span.lineno, span.end_lineno, span.col_offset, span.end_col_offset
    tree = module_tree(code.co_filename)
    if tree is None or line is None or end_line is None or column is None or end_column is None:
        return None
    fstring: ast.expr
    direct = False
    if instruction.opname == "CALL":  # ``"loss {:.4f}".format(v)``: str.format calls the value's __format__
        found = _format_call(tree, (line, column), (end_line, end_column))
        if found is None:
            return None
        fstring = found
    elif is_percent(instruction):  # ``"loss %.4f" % v``: str's ``%`` asks the value for a number
        found_percent = percent_node(tree, (line, column), (end_line, end_column))
        if found_percent is None:
            return None
        fstring, direct = found_percent[0], True
    else:
        found_fstring = _innermost_fstring(tree, (line, column), (end_line, end_column))
        if found_fstring is not None:
            fstring = found_fstring[0]
            if not all(_constant_spec(value) for value in fstring.values if isinstance(value, ast.FormattedValue)):
                return None
        else:  # ``"%s=%s" % (k, v)``: Python compiles a tuple's ``%s``, ``%r`` and ``%a`` as an f-string
            found_operand = compiled_percent(tree, (line, column), (end_line, end_column))
            if found_operand is None or "with format" in instruction.argrepr:  # (a width would pad the marker)
                return None
            fstring, direct = found_operand[0], True
    calls = output_calls(tree, fstring, code, direct)
    return None if calls is None else (calls, a_str_call(fstring))


def _constant_spec(value: ast.FormattedValue) -> bool:
    """A spec the source spells out (not ``{x:.{p}f}``), and no conversion beside a spec: ``!r`` then a
    width would pad the marker, not the text."""
    spec = value.format_spec
    if spec is None:
        return True
    if value.conversion != -1:
        return False
    return isinstance(spec, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in spec.values)


def _innermost_fstring(tree: ast.AST, start: tuple[int, int], end: tuple[int, int]
                       ) -> tuple[ast.JoinedStr, ast.AST] | None:
    """The innermost f-string whose source span holds ``[start, end]``, and its parent node."""
    best: tuple[ast.JoinedStr, ast.AST] | None = None
    stack: list[tuple[ast.AST, ast.AST | None]] = [(tree, None)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, ast.expr) or isinstance(node, ast.stmt):
            if not holds(node, start, end):
                continue
            if isinstance(node, ast.JoinedStr) and parent is not None:
                best = (node, parent)  # a deeper one, found later, is inside this one
        # Not into a spec: Python 3.11 gives a spec's f-string the span of the f-string it is in.
        children = [node.value] if isinstance(node, ast.FormattedValue) else ast.iter_child_nodes(node)
        stack.extend((child, node) for child in children)
    return best


def _format_call(tree: ast.AST, start: tuple[int, int], end: tuple[int, int]) -> ast.Call | None:
    """The ``"...".format(...)`` call spanning exactly ``[start, end]`` when the format string is written
    out and its specs are constant (no ``{:{width}}``, no conversion beside a spec, as for an f-string),
    or the ``str(...)`` or ``time.ctime()`` call spanning it; else None."""
    found = spanning(tree, start, end, lambda node: isinstance(node, ast.Call) and spans(node, start, end))
    if found is None:
        return None
    node = found[0]
    assert isinstance(node, ast.Call)
    if a_str_call(node) or a_time_text_call(node):  # ``"L: " + str(round(l, 4))``, ``time.ctime()``
        return node
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == "format" and isinstance(func.value, ast.Constant)
            and isinstance(func.value.value, str)):
        return None
    try:
        fields = list(string.Formatter().parse(func.value.value))
    except ValueError:
        return None
    if any(spec and ("{" in spec or conversion) for _, _, spec, conversion in fields):
        return None
    return node
