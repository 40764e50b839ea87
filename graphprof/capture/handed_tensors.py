"""What a tensor the step hands out carries besides its value and its autograd record.

Eager's tensor is the object the step's code made, so what the step did to it
is still there after the call:

* ``h.retain_grad()`` makes it keep a ``.grad``, the gradient the step's
  backward gave it, with ``retains_grad`` True, so that a later backward
  through it adds to that ``.grad`` before it raises eager's "backward through
  the graph a second time" (saliency and adversarial-embedding code reads
  ``embeds.grad`` after the step; ``loss.retain_grad(); return loss``);
* ``out.n_tokens = n`` puts an attribute in its ``__dict__`` (token-weighted
  averaging in the caller, tags on returned logits).

A replay's tensor is a new object the graph made, with neither: the caller
read ``None`` (with torch's non-leaf ``.grad`` warning) or got an
``AttributeError``; and on the capture call an attribute computed from a
number the step read held graphprof's ``TracedScalar``.

``HandedTensors.note`` is told of every tensor a replay hands out, returned
or kept (``BackwardNodes.history_of``, which names the record a replay gives
it, is asked about each one). For one that carries something it puts a host
node into the graph, after the ops that make what it carries, that gives the
replay's tensor (the one ``with_history`` hands out) what eager's had: it
retains its gradient, its ``.grad`` is the graph's value of eager's (the
clone ``retain_grad``'s hook makes is a backward op like the others) or None
where eager's was (``retain_grad()`` called after the backward), and its
attributes hold the numbers the replay computed where the step computed them
(the constants the step set, as they were). On the capture call those numbers
become real ones, as in the user's other objects.

The tensors the step finds (its parameters, buffers and optimizer state, its
arguments) are eager's own objects on every call, but a step can set
attributes on them too (``self.head.weight.last_loss = loss.item()``,
``x.seen_at = step``): their ``__dict__`` is read when the capture begins and
when the step returns (``settle``), and what the step set is set again by a
host node on every replay, with the replay's numbers; a replay would have left
the capture call's number (graphprof's traced one) there. An attribute the step
deletes refuses the capture.

What a replay could not give as eager's refuses the capture: a ``.grad`` the
step set to a tensor from before the call, an attribute holding a list, a
dict or another object (eager's may be one the user's code shares and
changes, where a replay would hand out a copy) or a tensor with autograd's
record or attributes of its own, and attributes on an inference tensor (a
replay hands out a copy of it).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch

from graphprof.capture.host_nodes import effect_node, filled, real_values, template_of
from graphprof.capture.kept_history import with_history
from graphprof.capture.scalar_operands import contains_traced_scalar
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.state import StateIndex, state_tensors

#: The attribute values a replay gives as eager's: numbers (read or computed ones too), text, None.
_PLAIN = (bool, int, float, str, type(None), TracedScalar)


class HandedTensors:
    """The tensors the capture call hands out that retain their gradient or carry attributes, each
    given them again by a host node of the graph (``graph``, ``node_of``, ``made_here``: the
    recorder's; ``record``: the record of a node at the graph's end)."""

    def __init__(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                 made_here: Callable[[torch.Tensor], bool], record: Callable[[], Any],
                 before: Iterable[tuple[str, torch.Tensor, bool]] = ()) -> None:
        self._graph, self._node_of, self._made_here, self._record = graph, node_of, made_here, record
        #: id -> the tensors already noted (held, so that the ids stay theirs while the capture runs).
        self._noted: dict[int, torch.Tensor] = {}
        #: The tensors from before the call (``before``: what names each, it, and whether every call finds
        #: the same object: the state's do, arguments are new ones), with their attributes then: those the
        #: step sets are set again by every replay (``settle``).
        self._before = [(what, tensor, held, dict(tensor.__dict__)) for what, tensor, held in before]
        self._noted.update((id(tensor), tensor) for _, tensor, _, _ in self._before)  # ``settle``'s, not ``note``'s

    def settle(self) -> None:
        """After the step: give the tensors from before the call the attributes it set on them (``p.count
        = n`` on a parameter, ``x.seen = True`` on an argument) on every replay; refuses a deleted one."""
        for what, tensor, held, then in self._before:
            now = tensor.__dict__
            if now.keys() == then.keys() and all(now[k] is then[k] for k in now):
                continue
            if then.keys() - now.keys():
                raise DataDependentError(f"the step deletes an attribute of {what}, which a replayed graph "
                                         "would not delete")
            changed = {k: v for k, v in now.items() if k not in then or v is not then[k]}
            self._give(tensor, None, what, changed, retains=False, held=held)

    def note(self, tensor: torch.Tensor, history: str | None, where: str) -> None:
        """Give ``tensor`` (``where`` holds it; ``history``: the name of the record a replay gives it) on
        every replay what it carries now; refuses what a replay could not give as eager's."""
        if id(tensor) in self._noted or not self._made_here(tensor):
            return
        self._noted[id(tensor)] = tensor
        self._give(tensor, history, where, dict(tensor.__dict__), history is not None and tensor.retains_grad)

    def _give(self, tensor: torch.Tensor, history: str | None, where: str, fields: dict[str, Any],
              retains: bool, held: bool = False) -> None:
        """A host node that gives the replay's ``tensor`` its retained gradient (``retains``) and ``fields``;
        ``held``: ``tensor`` itself, every call's (a parameter, which the graph may hold as an alias)."""
        if not retains and not fields:
            return
        if fields and tensor.is_inference():  # a replay hands out a copy of it (whole_step._as_inference)
            raise DataDependentError(f"{where} holds a tensor made under inference_mode with attributes, which "
                                     "a replay would hand out without them")
        slots = [] if held else [self._node_of(tensor)]
        grad = tensor.grad if retains else None
        if grad is not None:
            if not self._made_here(grad):
                raise DataDependentError(f"{where} holds a tensor whose .grad the step set to a tensor from "
                                         "before the call, which a replayed graph would not hand out")
            slots.append(self._node_of(grad))
        for name, value in fields.items():
            _check_attribute(value, f"{where}'s attribute {name!r}", self._made_here)
            if contains_traced_scalar(value):  # the capture call's own tensor holds real numbers
                tensor.__dict__[name] = real_values(value)
        template, field_slots = template_of(fields, self._node_of, where, lambda what: "")
        first = len(slots)

        def give(values: tuple) -> None:
            handed = tensor if held else values[0] if history is None else with_history(values[0], history)
            if retains:
                handed.retain_grad()
                if grad is not None:
                    handed.grad = values[1]
            handed.__dict__.update(filled(template, values[first:]))

        effect_node(self._graph, "give the step's tensor its .grad and attributes", give,
                    [*slots, *field_slots], self._record())


def _check_attribute(value: Any, what: str, made_here: Callable[[torch.Tensor], bool]) -> None:
    """Refuse an attribute value a replay could not give as eager's."""
    if type(value) in (tuple, torch.Size):
        for item in value:
            _check_attribute(item, what, made_here)
    elif isinstance(value, torch.Tensor):
        if made_here(value) and (value.requires_grad or value.__dict__):
            raise DataDependentError(f"{what} holds a tensor with autograd's record or attributes of its own, "
                                     "which a replayed graph would not give it")
    elif not isinstance(value, _PLAIN):
        raise DataDependentError(f"{what} holds a {type(value).__name__}, which a replay would not give the "
                                 "tensor it hands out as eager's (the same object, its contents)")


def tensors_before(state: StateIndex,
                   arguments: Iterable[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(what names it, it, whether every call finds it) of the tensors the step finds: its state's
    (parameters, buffers, optimizer state), and its arguments."""
    seen: set[int] = set()
    for tensor in state_tensors(state):
        if id(tensor) in seen:  # a parameter is its module's too
            continue
        seen.add(id(tensor))
        record = state.describe(tensor)
        yield (f"the step's tensor {record.name}" if record is not None else "a tensor of the step's state",
               tensor, True)
    for i, tensor in enumerate(arguments):
        if id(tensor) not in seen:
            yield f"the step's tensor argument {i}", tensor, False
