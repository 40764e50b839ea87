"""A step that differentiates a gradient again: its forwards are not compiled when it runs as segments.

An R1 or gradient penalty (StyleGAN2, WGAN-GP: ``torch.autograd.grad(...,
create_graph=True)``, then a backward through that gradient) needs the
forward's autograd graph to be differentiable twice. AOTAutograd's compiled
forward is one autograd node whose backward is not: the second backward
raised "torch.compile with aot_autograd does not currently support double
backward" into the step, which eager does not (the whole-step capture
traces such a step as eager runs it; its fallback to segments crashed).

Which graph a ``create_graph=True`` backward goes through is known only when
it runs, after the forward it differentiates ran compiled, and a lazy
penalty (every 16th call) runs long after the first call compiled. So the
user's code the step can run (capture/reachable.py's walk: the step, the
helpers it names, the methods of its objects' classes) is read before
anything is compiled: a call that passes ``create_graph`` (other than a
literal false) keeps every forward of the step eager.
"""

from __future__ import annotations

import dis
import functools
import types
from typing import Any, Callable

from graphprof.capture.reachable import reachable_locations
from graphprof.capture.sources import file_line

_KEYWORD = "create_graph"
#: Instructions that push exactly one value: a keyword argument's value when its call's last ones are these.
_ONE_VALUE = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_NAME", "LOAD_FAST_BORROW"})


def double_backward_site(fn: Callable[..., Any]) -> str | None:
    """``file:line`` of the first place in the user's code the step can run that asks for a
    differentiable gradient (``create_graph=...``), or None."""
    walked: list[types.FunctionType] = []
    for _ in reachable_locations(fn, walked=walked):
        pass
    for function in walked:
        site = _site(function.__code__)
        if site is not None:
            return site
    return None


@functools.lru_cache(maxsize=1024)
def _site(code: types.CodeType) -> str | None:
    """The first ``create_graph`` in ``code`` or the functions defined in it, as ``file:line``."""
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions):
        line = instruction.positions.lineno if instruction.positions else None
        if _asks(code, instructions, i):
            return file_line(code.co_filename, line or code.co_firstlineno)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            site = _site(constant)
            if site is not None:
                return site
    return None


def _asks(code: types.CodeType, instructions: list[dis.Instruction], i: int) -> bool:
    """Whether instruction ``i`` names ``create_graph`` other than as a keyword given a literal false
    (``create_graph=False``, ``create_graph=None``)."""
    instruction = instructions[i]
    names: Any = None
    if instruction.opname == "KW_NAMES":  # Python 3.11, 3.12: the keyword names of the next call
        names = code.co_consts[instruction.arg] if instruction.arg is not None else None
    elif instruction.opname == "LOAD_CONST":
        names = instruction.argval
        following = instructions[i + 1].opname if i + 1 < len(instructions) else ""
        if following != "CALL_KW":  # a string or a dict's keys: counted, whatever its value
            return names == _KEYWORD or (isinstance(names, tuple) and _KEYWORD in names)
    if not isinstance(names, tuple) or _KEYWORD not in names:
        return False
    values = instructions[i - len(names):i]
    if len(values) != len(names) or any(v.opname not in _ONE_VALUE or v.is_jump_target for v in values):
        return True  # the values are expressions: the keyword may be given a true one
    value = values[names.index(_KEYWORD)]
    return not (value.opname == "LOAD_CONST" and not value.argval)
