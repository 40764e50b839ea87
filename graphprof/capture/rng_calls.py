"""Reads and writes of torch's RNG state inside a captured step, replayed in place.

``torch.get_rng_state()``, ``torch.set_rng_state()`` and ``torch.manual_seed()``
act on the default generator outside any aten op, so make_fx records nothing
for them, yet they decide every later random op. Activation checkpointing with
``preserve_rng_state=True`` depends on them: the forward saves the state, the
recomputation in the backward sets it back (so dropout draws the forward's
mask again) and ``fork_rng`` restores the surrounding state afterwards. A
replay without them draws a different mask in the recomputation: wrong
gradients, silently.

During the capture call each of these runs for real and leaves a host node at
its position in the graph: a read returns the state the replay has reached,
a write sets the state it is given (a node's value, or a tensor that existed
before the step). The accelerator forms (``torch.cuda.get_rng_state`` and
``set_rng_state``) are replayed the same way where they exist.

A ``torch.Generator``'s own methods are recorded the same way (patched in its
type's dict: capture/type_methods.py): ``g.manual_seed(seed)`` (a constant or a
seed computed from a counter), ``g.set_state(st)``, ``g.set_offset(n)`` and
``g.get_state()``. Without them a generator made in the step
(``torch.Generator().manual_seed(0)`` for the same noise every call), or a
kept one re-seeded or restored there, was the graph's constant and replays
kept drawing from one stream: different noise from eager's, silently. The
replay seeds or restores the generator object the graph's ops draw from, at
the same place. ``g.seed()`` (a fresh random seed, returned to the step)
and copies of a generator (``clone_state()``, ``copy.deepcopy``) refuse the
capture, as does a draw from a generator never seeded (``_first_seen``). Calls by torch (``torch.manual_seed`` seeding the
default generator) and by graphprof itself are left alone.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator

import torch
import torch.fx

from graphprof.capture.host_nodes import effect_node, host_function
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.snapshot import WriteLog
from graphprof.capture.sources import is_machinery
from graphprof.capture.type_methods import patched_methods

#: (owner, name) of the functions patched: the ``torch`` names and their home modules.
_READS = (("torch", "get_rng_state"), ("torch.random", "get_rng_state"),
          ("torch.cuda", "get_rng_state"), ("torch.cuda.random", "get_rng_state"))
_WRITES = (("torch", "set_rng_state"), ("torch.random", "set_rng_state"),
           ("torch.cuda", "set_rng_state"), ("torch.cuda.random", "set_rng_state"),
           ("torch", "manual_seed"), ("torch.random", "manual_seed"))
#: ``torch.Generator`` methods that read or set its state, and the one that cannot be replayed.
_GENERATOR_READS = ("get_state",)
_GENERATOR_WRITES = ("set_state", "manual_seed", "set_offset")
#: (method, what the refusal says it does): a fresh random seed, or a copy a replay would not make again.
_GENERATOR_REFUSED = (("seed", "seeds a torch.Generator with a fresh random seed (seed())"),
                      ("clone_state", "copies a torch.Generator's state (clone_state())"),
                      ("__reduce__", "copies or pickles a torch.Generator"),
                      ("graphsafe_set_state", "sets a torch.Generator's state (graphsafe_set_state())"))
#: The writes after which the generator's state is the step's own, whatever it was before.
_GENERATOR_SETS = ("set_state", "manual_seed")


def _owner(path: str) -> Any:
    import importlib

    try:
        return importlib.import_module(path)
    except ImportError:
        return None


class RngStateCalls:
    """Patches torch's RNG state functions for the length of one capture."""

    def __init__(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                 record: Callable[[], Any], write_log: WriteLog | None = None) -> None:
        self.graph = graph
        #: Told of a generator before the step changes its state, so that an undone capture puts it back.
        self.write_log = write_log or WriteLog()
        self.write_log.first_seen = self._first_seen
        #: ids of the generators the step seeded or set before it drew from them or read their state.
        self._set: set[int] = set()
        self._fresh_states: dict[str, torch.Tensor] = {}
        self.node_of = node_of
        self.record = record
        #: id of a state tensor a read returned -> (the tensor, kept alive; its node).
        self._reads: dict[int, tuple[torch.Tensor, torch.fx.Node]] = {}
        self._depth = 0

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        undo: list[Callable[[], None]] = []
        try:
            for names, wrap in ((_READS, self._read), (_WRITES, self._write)):
                for path, name in names:
                    owner = _owner(path)
                    original = getattr(owner, name, None) if owner is not None else None
                    if original is None:
                        continue
                    setattr(owner, name, wrap(original, f"{path}.{name}"))
                    undo.append(lambda o=owner, n=name, f=original: setattr(o, n, f))  # type: ignore[misc]
            methods = {name: self._method(self._read, name) for name in _GENERATOR_READS}
            methods.update({name: self._method(self._write, name) for name in _GENERATOR_WRITES})
            methods.update({name: self._refused(doing) for name, doing in _GENERATOR_REFUSED})
            with patched_methods(torch.Generator, methods):
                yield
        finally:
            for step in reversed(undo):
                step()
            self._reads.clear()
            self._set.clear()

    def _read(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        calls = self

        @functools.wraps(original)
        def read(*args: Any, **kwargs: Any) -> Any:
            if calls._depth:  # torch.random.get_rng_state called by torch.get_rng_state's alias
                return original(*args, **kwargs)
            calls._depth += 1
            try:
                state = original(*args, **kwargs)
            finally:
                calls._depth -= 1
            node = calls.graph.call_function(host_function(lambda: original(*args, **kwargs), name), ())
            node.meta["graphprof.capture"] = calls.record()
            calls._reads[id(state)] = (state, node)
            return state

        return read

    def _write(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        calls = self

        @functools.wraps(original)
        def write(value: Any, *args: Any, **kwargs: Any) -> Any:
            if calls._depth:
                return original(value, *args, **kwargs)
            slots: list[Any] = []
            if isinstance(value, TracedScalar):  # a seed the step computes from its inputs (a counter)
                slots.append(value.node)
                value = value.value
            calls._depth += 1
            try:
                result = original(value, *args, **kwargs)
            finally:
                calls._depth -= 1
            if isinstance(value, torch.Tensor):
                read = calls._reads.get(id(value))
                node = read[1] if read is not None and read[0] is value else calls.node_of(value)
                if isinstance(node, torch.fx.Node):
                    slots.append(node)
            if slots:
                def apply(values: tuple) -> None:
                    original(values[0], *args, **kwargs)
            else:  # a number (a seed) or a state tensor from before the step: the same every call
                def apply(values: tuple) -> None:
                    original(value, *args, **kwargs)
            effect_node(calls.graph, name, apply, slots, calls.record())
            return result

        return write

    def _method(self, wrap: Callable[[Callable[..., Any], str], Callable[..., Any]],
                name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """``wrap`` (``_read`` or ``_write``) for the ``torch.Generator`` method ``name``, bound per call."""
        calls = self

        def patch(original: Callable[..., Any]) -> Callable[..., Any]:
            def method(generator: torch.Generator, *args: Any, **kwargs: Any) -> Any:
                if calls._depth or is_machinery(sys._getframe(1).f_code.co_filename):
                    return original(generator, *args, **kwargs)
                if name in _GENERATOR_SETS:
                    calls._set.add(id(generator))
                calls.write_log.note_generators((generator,), {})
                bound = functools.partial(original, generator)
                return wrap(bound, f"Generator.{name}")(*args, **kwargs)

            return method

        return patch

    def _refused(self, doing: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A method whose effect a replay cannot repeat: refuses the capture when the step calls it."""
        calls = self

        def patch(original: Callable[..., Any]) -> Callable[..., Any]:
            def method(generator: torch.Generator, *args: Any, **kwargs: Any) -> Any:
                if calls._depth or is_machinery(sys._getframe(1).f_code.co_filename):
                    return original(generator, *args, **kwargs)
                where = getattr(calls.record(), "source", "")
                raise DataDependentError(f"the step {doing} at {where}, which a replayed graph would not repeat")

            return method

        return patch

    def _first_seen(self, generator: torch.Generator) -> None:
        """Refuse a generator first seen in the state every ``torch.Generator(device)`` is made in.

        Eager code that makes one in the step and draws from it unseeded draws the same numbers on every
        call; a replay would go on drawing from the capture call's object. A generator made in the step
        cannot be told from a kept one that never drew (its type is C's, its making is not seen), so both
        refuse: one warning, never different numbers.
        """
        if id(generator) in self._set:
            return
        device = str(generator.device)
        if device not in self._fresh_states:
            self._fresh_states[device] = torch.Generator(device=generator.device).get_state()
        state = generator.get_state()
        fresh = self._fresh_states[device]
        if state.shape == fresh.shape and torch.equal(state, fresh):
            where = getattr(self.record(), "source", "")
            raise DataDependentError(f"the step draws from a torch.Generator that was never seeded at {where} "
                                     "(one made in the step draws the same numbers every call, which a replayed "
                                     "graph would not); seed it with manual_seed in the step")
