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
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
import torch.fx

from graphprof.capture.host_nodes import effect_node, host_function
from graphprof.capture.scalars import TracedScalar

#: (owner, name) of the functions patched: the ``torch`` names and their home modules.
_READS = (("torch", "get_rng_state"), ("torch.random", "get_rng_state"),
          ("torch.cuda", "get_rng_state"), ("torch.cuda.random", "get_rng_state"))
_WRITES = (("torch", "set_rng_state"), ("torch.random", "set_rng_state"),
           ("torch.cuda", "set_rng_state"), ("torch.cuda.random", "set_rng_state"),
           ("torch", "manual_seed"), ("torch.random", "manual_seed"))


def _owner(path: str) -> Any:
    import importlib

    try:
        return importlib.import_module(path)
    except ImportError:
        return None


class RngStateCalls:
    """Patches torch's RNG state functions for the length of one capture."""

    def __init__(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                 record: Callable[[], Any]) -> None:
        self.graph = graph
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
            yield
        finally:
            for step in reversed(undo):
                step()
            self._reads.clear()

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
