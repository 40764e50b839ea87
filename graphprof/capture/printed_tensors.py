"""Tensors a step prints, printed by its replay as eager prints them: with their autograd suffix.

``print(loss)`` in eager prints ``tensor(0.3040, grad_fn=<MeanBackward0>)``.
A replay prints the value its graph computed, which has no autograd history,
so it printed ``tensor(0.3040)``: the text differed from the second call on,
silently. The capture call knows what eager's text ends with (the tensor's
``grad_fn``, or ``requires_grad=True`` for a leaf that needs a gradient), so
the replay prints a stand-in whose text is torch's own text of the replayed
value with that suffix added, as torch adds it (``with_suffix``).

Only plain dense tensors get a stand-in: for a subclass, a nested or sparse
tensor, or one with a forward-mode tangent, torch's text has other parts
after the suffix or around it, and the print refuses the capture instead.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch._tensor_str import PRINT_OPTS

from graphprof.capture.scalars import DataDependentError

#: ``len("tensor(")``: how far torch indents a suffix it puts on a line of its own.
_INDENT = len("tensor(")
#: A last line made of suffixes only (``       dtype=torch.float16``): a data line never starts so.
_SUFFIX_LINE = re.compile(rf" {{{_INDENT}}}[a-z_]+=")


def autograd_suffix(tensor: torch.Tensor, where: str) -> str | None:
    """The suffix eager's text of ``tensor`` ends with (``grad_fn=<MeanBackward0>``), or None."""
    grad_fn = tensor.grad_fn
    if grad_fn is None and not tensor.requires_grad:
        return None
    if (type(tensor) is not torch.Tensor or tensor.layout != torch.strided or tensor.is_nested
            or torch.autograd.forward_ad.unpack_dual(tensor).tangent is not None):
        raise DataDependentError(f"the step prints a {type(tensor).__name__} with autograd history at {where}, "
                                 "whose text a replay cannot reproduce")
    if grad_fn is None:
        return "requires_grad=True"
    name = type(grad_fn).__name__
    if name == "CppFunction":  # as torch names a C++ function's node
        name = grad_fn.name().rsplit("::", 1)[-1]
    return f"grad_fn=<{name}>"


def with_suffix(text: str, suffix: str) -> str:
    """torch's ``text`` of a tensor with one more suffix at its end, placed as torch places one.

    torch appends each suffix after ``, `` unless the last line would pass
    ``PRINT_OPTS.linewidth``, in which case it goes on a line of its own,
    indented. The width it compares is the last line's length, plus 2 as
    long as no suffix has gone on a line of its own (its running count
    starts 2 over and is reset by such a line); such a line is one made of
    suffixes only.
    """
    body = text[:-1]
    last = body[body.rfind("\n") + 1:]
    wrapped = "\n" in body and _SUFFIX_LINE.match(last) is not None
    width = len(last) + (0 if wrapped else 2)
    if width + len(suffix) + 2 > PRINT_OPTS.linewidth:
        return f"{body},\n{' ' * _INDENT}{suffix})"
    return f"{body}, {suffix})"


class PrintedTensor:
    """A replayed tensor in a print: its text is eager's, autograd suffix included."""

    __slots__ = ("tensor", "suffix")

    def __init__(self, tensor: torch.Tensor, suffix: str) -> None:
        self.tensor, self.suffix = tensor, suffix

    def __repr__(self) -> str:
        if self.tensor.grad_fn is not None or self.tensor.requires_grad:  # its own history: its own text
            return repr(self.tensor)
        return with_suffix(repr(self.tensor), self.suffix)

    __str__ = __repr__

    # A logging call formats its arguments (``"%.4f" % loss``) and a handler may read them: the tensor's.
    def __format__(self, spec: str) -> str:
        return format(self.tensor, spec)

    def __float__(self) -> float:
        return float(self.tensor)

    def __int__(self) -> int:
        return int(self.tensor)

    def __index__(self) -> int:
        return self.tensor.__index__()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tensor, name)


def printed(values: tuple, suffixes: dict[int, str]) -> tuple:
    """A replay's slot ``values`` with the tensors that had a suffix (by slot) in stand-ins."""
    return tuple(PrintedTensor(v, suffixes[i]) if i in suffixes and isinstance(v, torch.Tensor) else v
                 for i, v in enumerate(values))
