"""Numbers torch's argument parsing reads from a tensor the step passes where an op takes a number.

Why: Adam and SGD given a tensor learning rate (``lr=torch.tensor(1e-3)``,
torch's recipe for compiling an optimizer with a scheduler) compute the
step as a tensor and pass it where the op takes a number:
``param.addcdiv_(exp_avg, denom, value=-step_size)``,
``param.add_(grad, alpha=-lr)``. torch's argument parser reads such a 0-dim
tensor as a number (``_local_scalar_dense``) before the op runs; under
make_fx that read refused the capture (a value read on the host), and a
read of a tensor from before the step would have been baked.

How: a call given a 0-dim tensor among its arguments is watched. A read of
exactly such a tensor before the call has recorded any op is the parser's
(a tensor made from constants alone is still read as its constant, as
before: capture/value_guards.py ``constant_number``):
it becomes a number read from a tensor (capture/scalars.py, as ``.item()``
is), a node that reads the tensor at replay, and the op the call records
next takes that node where it holds the number, as a number passed to the
call would be linked (capture/linked_numbers.py). The replay hands the op
the very number eager's parser hands it: the tensor's value as a double (or
an int). A read after an op of the call is the op's own (a composite op
reading a value to decide something), and refuses as before; so does a
read number no op node took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from graphprof.capture.call_numbers import CallScalars
from graphprof.capture.scalars import LINKED_SINKS, PENDING_SINKS, DataDependentError, TracedScalar
from graphprof.capture.sources import user_source


#: Schema types of the arguments the parser fills with a number read from a tensor: a ``Scalar``, a
#: ``float`` (batch norm's momentum), an ``int`` of the op the step called (as ``.item()`` may reach one).
_NUMBER_TYPES = (torch._C.NumberType, torch._C.FloatType, torch._C.IntType)


@dataclass
class _Call:
    """A watched call: its 0-dim tensor arguments, the numbers read from them, and the graph's last node
    before it recorded an op (it moves past each read's own node)."""

    tensors: tuple[torch.Tensor, ...]
    numbers: CallScalars
    last: torch.fx.Node | None


def scalar_tensors(args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
    """The 0-dim tensors among a call's own arguments (not inside lists): those the parser may read."""
    return tuple(v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim() == 0)


class ParsedNumbers:
    """The watched calls now running, innermost last (one capture's)."""

    def __init__(self, traced_item: Callable[[torch.Tensor], TracedScalar],
                 last_node: Callable[[], torch.fx.Node | None]) -> None:
        self._traced_item = traced_item
        self._last_node = last_node
        self._calls: list[_Call] = []

    def call(self, func: Any, args: tuple, kwargs: dict, tensors: tuple[torch.Tensor, ...]) -> Any:
        """``func(*args, **kwargs)``, watched for the parser's reads of ``tensors`` (``scalar_tensors``)."""
        call = _Call(tensors, CallScalars(func, []), self._last_node())
        linked: set[int] = set()
        self._calls.append(call)
        PENDING_SINKS[-1].append(call.numbers)
        LINKED_SINKS.append(linked)
        try:
            out = func(*args, **kwargs)
        finally:
            PENDING_SINKS[-1].pop()
            LINKED_SINKS.pop()
            self._calls.pop()
        if any(id(number) not in linked or not _taken_as_number(number.node, func) for number in call.numbers):
            raise DataDependentError(
                f"the step reads a tensor's value on the host (aten._local_scalar_dense.default) at "
                f"{user_source(3)}: a tensor it passes to {getattr(func, '__name__', func)}, which torch uses "
                "otherwise than as a number argument of the op called, and a static graph would keep")
        return out

    def read(self, tensor: torch.Tensor) -> Any:
        """The number the parser reads from ``tensor`` (a node for the replay), or None when the read is not
        the innermost watched call's parsing of one of its arguments."""
        call = self._calls[-1] if self._calls else None
        if call is None or not any(t is tensor for t in call.tensors) or self._last_node() is not call.last:
            return None
        number = self._traced_item(tensor)
        call.numbers.append(number)
        call.last = number.node
        return number.value


def _taken_as_number(read: torch.fx.Node, func: Any) -> bool:
    """Whether every node taking the number ``read`` is the op ``func`` names (``addcdiv_`` for
    ``Tensor.addcdiv_``) and takes it only as a number argument (``_NUMBER_TYPES``): eager's parser gave
    it there, not the op's own code, which may have computed other numbers from it."""
    name = str(getattr(func, "__name__", "")).rstrip("_")
    for user in read.users:
        target = user.target
        if not isinstance(target, torch._ops.OpOverload) or target._schema.name.split("::")[-1].rstrip("_") != name:
            return False
        arguments = target._schema.arguments
        by_name = {a.name: a for a in arguments}
        places = [arguments[i] if i < len(arguments) else None for i, a in enumerate(user.args) if a is read]
        places += [by_name.get(k) for k, v in user.kwargs.items() if v is read]
        held: list[torch.fx.Node] = []
        torch.fx.node.map_arg((user.args, user.kwargs), held.append)
        if held.count(read) != len(places) or not all(
                p is not None and isinstance(p.type, _NUMBER_TYPES) for p in places):
            return False
    return True
