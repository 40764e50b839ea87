"""Host nodes: graph nodes that run Python when a replay reaches them.

A replayed graph does not run the step's Python, so what the step's Python
did is put into the graph as calls of its own (the op ``host.<name>``):

* a **reader** reads a Python value (an input: a hyperparameter, a counter,
  a clock) when the replay reaches it, as eager code reads it then;
* an **effect** repeats what the step did to Python state or outside it (an
  assignment, ``history.append(loss.item())``, a scheduler's ``step()``, a
  print, a seed) with the values of this replay. Its arguments are a
  *template*: the values the step passed, with every graph value (a tensor
  an op made, an input scalar) replaced by a slot that the replay fills.

Why a module of its own: Python state (capture/inputs.py), schedulers
(host_calls.py), clocks and prints (host_sources.py) and RNG calls
(rng_calls.py) all make these nodes, one way.
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.fx

from graphprof.capture.formatted_text import FormattedText
from graphprof.capture.kept_history import with_history
from graphprof.capture.scalars import READ_DURING_STEP, DataDependentError, TracedScalar

_SCALAR = "graphprof_scalar"
_READER = "graphprof_input_reader"


def host_function(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Name a host callable for the profile: op ``host.<name>``."""
    if not isinstance(fn, types.FunctionType):  # a builtin (time.perf_counter): names are read-only
        fn = (lambda call: lambda *args: call(*args))(fn)
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = "host"
    return fn


def reader_node(graph: torch.fx.Graph, read: Callable[[], Any], name: str, record: Any,
                scalar: bool = True) -> torch.fx.Node:
    """A graph node (at the graph's insert point) that reads a Python value when the replay reaches it."""
    node = graph.call_function(host_function(read, f"read {name}"), ())
    if scalar:
        node.meta[_SCALAR] = True
    node.meta[_READER] = True
    if record is not None:
        node.meta["graphprof.capture"] = record
    return node


def mark_reader(node: torch.fx.Node) -> None:
    """Mark ``node`` a reader (``is_reader``): made elsewhere (arithmetic on a number, reading an array at
    the number's index), it reads Python state and changes none."""
    node.meta[_READER] = True


def is_reader(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a reader (``reader_node``): it reads Python state and changes none."""
    return bool(node.meta.get(_READER))


def input_scalar(graph: torch.fx.Graph, value: Any, read: Callable[[], Any], name: str, record: Any,
                 where: str, during_step: str | None = None) -> TracedScalar:
    """``value`` as an input scalar of the capture, read by a reader node on every replay.

    ``during_step``: why a check before the replay cannot read it (a clock, a rate read after the
    step's own scheduler step), kept as ``READ_DURING_STEP``: no guard may be taken on it.
    """
    node = reader_node(graph, read, name, record)
    if during_step is not None:
        node.meta[READ_DURING_STEP] = during_step
    return TracedScalar(value, node, graph, where, is_input=True)


def read_after(name: str, step: str | None) -> str | None:
    """The ``during_step`` phrase of ``name`` read after the scheduler step ``step`` (None: before any)."""
    return None if step is None else f"{name}, read after {step}"


def refusal(what: str, verb: str, source: Callable[[str], str]) -> DataDependentError:
    """The error for a change to Python state that a replay would not repeat."""
    return DataDependentError(f"the step {verb} {what}{source(what)}, which a replayed graph would not repeat")


@dataclass(frozen=True)
class _Slot:
    index: int
    #: Eager's ``grad_fn`` name of a tensor the step keeps (capture/kept_history.py): filled with a
    #: tensor that has autograd's record, as eager's had.
    history: str | None = None


@dataclass(frozen=True)
class _Kept:
    """A container an earlier effect of the replay already put in place: read there, one object in both."""
    read: Callable[[], Any]


def template_of(value: Any, node_of: Callable[[torch.Tensor], Any], what: str,
                source: Callable[[str], str], opaque: Callable[[Any], bool] = lambda v: False,
                note: Callable[[int, Any], None] = lambda index, v: None,
                history: Callable[[torch.Tensor, str], str | None] | None = None,
                placed: Mapping[int, tuple[str, Callable[[], Any], Any]] | None = None) -> tuple[Any, list[Any]]:
    """``value`` with graph values replaced by slots, and the slots' nodes; refuses the unreproducible.

    ``opaque`` values (a logger, a stream) are kept as they are: the same object on every replay.
    ``note`` is told each slot's index and the capture call's value in it. ``history`` (for what the
    step keeps) names eager's ``grad_fn`` of a tensor the step made (``BackwardNodes.history_of``).
    ``placed`` (id -> (where, read, it)) are the containers earlier effects put in place: the same object
    kept twice (``self.last = stats; self.history.append(stats)``) is one object in a replay too.
    """
    slots: list[Any] = []

    def walk(v: Any) -> Any:
        if opaque(v):
            return v
        if isinstance(v, TracedScalar):
            slots.append(v.node)
            return _Slot(len(slots) - 1)
        if isinstance(v, FormattedText):  # ``print(f"loss {loss.item():.4f}")``: formatted in the replay
            return v.mapped(walk)
        if isinstance(v, torch.Tensor):
            node = node_of(v)
            if isinstance(node, torch.fx.Node):
                slots.append(node)
                note(len(slots) - 1, v)
                return _Slot(len(slots) - 1, history(v, what) if history is not None else None)
            return v  # a tensor from before the step (a parameter): the same object every call
        if placed is not None and id(v) in placed and isinstance(v, (list, tuple, dict)):
            return _Kept(placed[id(v)][1])
        if isinstance(v, (list, tuple)):
            return rebuilt(v, [walk(x) for x in v])
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if v is None or isinstance(v, (bool, str, int, float, enum.Enum)):  # (an Enum member never changes)
            return v
        raise refusal(what, f"stores a {type(v).__name__} in", source)

    return walk(value), slots


def rebuilt(like: list | tuple, items: list[Any]) -> Any:
    """A list or tuple of ``like``'s type holding ``items``: a named tuple (``S["st"]._replace(...)``)
    takes its fields one by one, not as one iterable."""
    make = getattr(type(like), "_make", None) if isinstance(like, tuple) else None
    return make(items) if make is not None else type(like)(items)


def filled(template: Any, values: tuple) -> Any:
    """A ``template_of`` template with its slots filled by one replay's ``values``."""
    if isinstance(template, _Slot):
        if template.history is not None:
            return with_history(values[template.index], template.history)
        return values[template.index]
    if isinstance(template, _Kept):
        return template.read()
    if isinstance(template, FormattedText):
        return template.filled(lambda slot: filled(slot, values))
    if isinstance(template, (list, tuple)):
        return rebuilt(template, [filled(x, values) for x in template])
    if isinstance(template, dict):
        return {k: filled(x, values) for k, x in template.items()}
    return template


def real_values(value: Any, made: dict[int, Any] | None = None) -> Any:
    """``value`` with TracedScalars replaced by their numbers (what the user keeps). ``made`` (id of a
    container -> it and its copy, held so that the id stays its own) makes one container kept in two
    places one copy in both."""
    if isinstance(value, TracedScalar):
        return value.value
    if isinstance(value, FormattedText):
        return value.real()
    if isinstance(value, (list, tuple, dict)):
        if made is not None and id(value) in made:
            return made[id(value)][1]
        if isinstance(value, dict):
            copy: Any = {k: real_values(x, made) for k, x in value.items()}
        else:
            copy = rebuilt(value, [real_values(x, made) for x in value])
        if made is not None:
            made[id(value)] = (value, copy)
        return copy
    return value


def effect_node(graph: torch.fx.Graph, name: str, apply: Callable[[tuple], None], slots: list[Any],
                record: Any) -> torch.fx.Node:
    """A host node (at the graph's insert point) that calls ``apply`` with the values of ``slots``."""
    def effect(*values: Any) -> None:
        apply(values)
    node = graph.call_function(host_function(effect, name), tuple(slots))
    node.meta["graphprof.capture"] = record
    node.meta[_SCALAR] = True
    return node


#: The meta key of an effect that may tell, after it ran, that running it again would show nothing
#: (a callable: a warning the filters show once per line, shown already): a failed replay that ran it
#: can still run the step again eagerly (runtime/failed_replays.py).
SILENT_AGAIN = "graphprof_silent_again"
