"""Numbers autograd saves for a backward: linked where the backward uses them as they are, not guarded.

Why: DeiT's soft distillation anneals its temperature (``criterion.tau =
f(step)``, then ``outputs_kd / T`` and ``* (T * T)``), and DALL-E's Gumbel
quantizer anneals ``self.temperature``, which ``F.gumbel_softmax(logits,
tau=...)`` divides by. The forward op takes the step's number (linked to
its node: capture/linked_numbers.py), but autograd keeps the number in C++
and the backward op it runs holds it as a literal (``div(grad, 2.875)``).
The recorder therefore guarded the number's value: one capture per value,
and after five the step ran as segments, with one warning.

How: for the ops whose derivative uses a number operand as it is, with no
branch on it (``mul`` and ``div`` by a number: ``grad * s``, ``grad / s``;
``add`` and ``sub``: not at all), the forward op does not guard the number.
When autograd runs that op's backward node (told by its sequence number),
the one op recorded there must be the one the formula gives, ``mul`` or
``div`` of a tensor and the number's value, and that literal is linked to
the number's node. A replay then hands the replay's number to the very
same aten op as autograd hands it the saved one: the same Python float,
wrapped the same way, so it promotes and rounds the same in every dtype
(bfloat16 and float16 compute with it in float, as eager does). The number
is never made a 0-dim tensor, which promotes and rounds otherwise.

Where it cannot be told, the number's value is guarded as before: another
op in that backward node, or more than one in a run of it (a hook on the
gradient runs as part of the node, ``y.register_hook(lambda g: g * 2.0)``,
and may hold an equal constant); a backward the capture call never ran;
and a number torch's C++ did not take from the step itself (a Python
function given it as a plain number may have used it anywhere).

``F.gumbel_softmax`` is Python that torch's function handling runs with
its numbers unwrapped (capture/scalars.py, ``call_with_scalars``): every op
of its body that does not take ``tau`` (its noise) then guarded it, since
Python may have used the plain number anywhere. Its body uses ``tau`` only
as the divisor of one tensor op, so it is given the traced number itself
(``PASSED_THROUGH``), and that division is linked like any other.
"""

from __future__ import annotations

import inspect
import operator
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
import torch.nn.functional as F

from graphprof.capture.scalars import Guard, TracedScalar

aten = torch.ops.aten

#: Forward ops whose backward, of the tensor operand, is one op with the number as it is: that op.
_USED_AS_IS = {aten.mul.Tensor: aten.mul.Tensor, aten.mul_.Tensor: aten.mul.Tensor,
               aten.div.Tensor: aten.div.Tensor, aten.div_.Tensor: aten.div.Tensor}
#: Forward ops whose backward does not use a number operand (``grad`` itself).
_UNUSED = frozenset({aten.add.Tensor, aten.add_.Tensor, aten.sub.Tensor, aten.sub_.Tensor})

#: Python functions of torch given the step's traced numbers as they are: each uses them only as an
#: operand of one tensor op (read with the torch version graphprof pins).
PASSED_THROUGH = frozenset({F.gumbel_softmax})


@dataclass
class _Saved:
    """One number a forward op gave autograd, waiting for that op's backward."""

    scalar: TracedScalar
    #: The op the backward runs with it (None: the backward does not use it).
    backward_op: Any
    source: str
    linked: bool = False
    #: The backward ran an op the formula does not give: the number's value is guarded.
    broken: bool = False
    #: Ops recorded in the run of the backward node now going on.
    ops_in_run: int = 0


def _same_number(literal: Any, value: Any) -> bool:
    """A literal of a node that is ``value``: a number of its kind (float or int) and equal."""
    if isinstance(literal, bool) or not isinstance(literal, (int, float)):
        return False
    return isinstance(literal, float) == isinstance(value, float) and literal == value


class SavedNumbers:
    """The numbers forward ops gave autograd, per backward node (sequence number), until it runs."""

    def __init__(self, guards: list[Guard]) -> None:
        self._guards = guards
        self._waiting: dict[int, list[_Saved]] = {}
        #: The backward node whose ops were recorded last (None: none, or an op outside the backward).
        self._running: int | None = None

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def defer(self, func: Any, nodes: list[torch.fx.Node], scalar: TracedScalar, seq: int, source: str,
              called: Any) -> bool:
        """Whether the number the op ``func`` (which made ``nodes``, its backward node ``seq``) was given by
        the step's call of ``called`` is one its backward uses as it is or not at all: then noted, to be
        linked there, not guarded now."""
        backward_op = _USED_AS_IS.get(func)
        if backward_op is None and func not in _UNUSED:
            return False
        if called is None or isinstance(inspect.unwrap(called), types.FunctionType):
            return False  # Python given the plain number: it may have used it beside the op
        made = [n for n in nodes if n.op == "call_function"]
        if len(made) != 1 or made[0].kwargs or len(made[0].args) != 2:
            return False
        first, second = made[0].args
        tensor = first if second is scalar.node else second if first is scalar.node else None
        value = tensor.meta.get("val") if isinstance(tensor, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return False
        self._waiting.setdefault(seq, []).append(_Saved(scalar, backward_op, source))
        return True

    def op_ran(self, seq: int | None, nodes: list[torch.fx.Node]) -> None:
        """An op running in autograd's node ``seq`` (None: outside the backward) made ``nodes``: link the
        number where the formula's op holds it; any other op there breaks the link (the number is then
        guarded)."""
        waiting = self._waiting.get(seq, ()) if seq is not None else ()
        for saved in waiting:
            if seq != self._running:
                saved.ops_in_run = 0  # another run of the node
            for node in nodes:
                if node.op != "call_function":
                    continue
                saved.ops_in_run += 1
                if saved.ops_in_run > 1 and saved.backward_op is not None:
                    saved.broken = True  # (what the first was linked to is then guarded: the same number)
                elif (saved.backward_op is not None and node.target is saved.backward_op and not node.kwargs
                        and len(node.args) == 2 and isinstance(node.args[0], torch.fx.Node)
                        and _same_number(node.args[1], saved.scalar.value)):
                    node.args = (node.args[0], saved.scalar.node)
                    saved.linked = True
                elif saved.backward_op is not None or _holds(node, saved.scalar.value):
                    saved.broken = True
        self._running = seq

    def settle(self) -> None:
        """The step is done: a number whose backward did not run as its formula says is guarded."""
        for waiting in self._waiting.values():
            for saved in waiting:
                if saved.broken or (saved.backward_op is not None and not saved.linked):
                    self._guards.append(Guard(operator.eq, (saved.scalar.node, saved.scalar.value), True,
                                              saved.source))
        self._waiting.clear()


def _holds(node: torch.fx.Node, value: Any) -> bool:
    """Whether a node holds ``value`` as a literal among its arguments."""
    found: list[Any] = []
    torch.fx.node.map_aggregate((node.args, node.kwargs), found.append)
    return any(_same_number(v, value) for v in found)


def passed_through(func: Callable[..., Any]) -> bool:
    """Whether ``func`` is given the step's traced numbers as they are (``PASSED_THROUGH``)."""
    return func in PASSED_THROUGH
