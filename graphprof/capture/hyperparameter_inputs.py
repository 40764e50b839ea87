"""Optimizer hyperparameters a replayed step reads: inputs read where the groups hold them.

Why a module of its own: the groups' numbers are read at fixed points of the
step (its start, each ``Optimizer.step``, after each scheduler step), not
found by walking the step's reachable state as capture/inputs.py does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx

from graphprof.capture.host_nodes import input_scalar, read_after
from graphprof.capture.scalars import TracedScalar


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_hyperparameter_number(value: Any) -> bool:
    """A number or a tuple of numbers (``betas``): what a group holds that is made an input."""
    return _is_number(value) or (isinstance(value, tuple) and bool(value) and all(_is_number(v) for v in value))


class HyperparameterInputs:
    """While ``Optimizer.step`` runs under capture, float hyperparameters are input scalars.

    So are they while the user's code runs (``watch_groups``): a step that
    logs or returns ``opt.param_groups[0]["lr"]`` read the capture call's
    number, and a replay logged or returned it forever after a scheduler
    outside the step had changed the rate. The groups hold input scalars
    read at the step's start and again after each optimizer and scheduler
    step (which run on the real numbers); readers nobody used are dropped
    from the graph (``unused_readers``). A number read after a scheduler step
    of the call that may have written it (``written``, capture/host_calls.py)
    carries ``READ_DURING_STEP``: no guard may be taken on it.

    A value the step writes itself (``g["lr"] = 0.05`` before ``opt.step()``,
    Lookahead's ``group["counter"] = 0`` inside its step) is the step's own
    from then on (``_written``): never made an input again, so the optimizer
    computes with this call's value, as eager's does, and ``GroupWrites``
    (capture/optimizer_groups.py) sees the write and replays it as an effect.
    Made an input, it was read from the group at each replay, where the
    other path had left its own constant.
    """

    def __init__(self, graph: torch.fx.Graph, record: Callable[[], Any],
                 written: Callable[[torch.optim.Optimizer, str], str | None] = lambda optimizer, key: None) -> None:
        self.graph = graph
        self.record = record
        self.written = written
        #: Per ``Optimizer.step`` entered: (group, key, real value, what ``enter`` put there).
        self._saved: list[list[tuple[dict, str, Any, Any]]] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        #: (group, key, real value, the scalar put there) while the user's code reads the groups.
        self._wrapped: list[tuple[dict, str, Any, Any]] = []
        self._readers: list[torch.fx.Node] = []
        #: (id of a group, key) the step wrote over what this class put there.
        self._written: set[tuple[int, str]] = set()

    def watch_groups(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """From now on, the user's code reads the groups' numbers as inputs (until ``unwrap_groups``)."""
        self._optimizers = list({id(o): o for o in optimizers}.values())
        self.wrap_groups()

    def wrap_groups(self) -> None:
        """Put input scalars, read at this point of the graph, where the groups hold numbers."""
        for opt in self._optimizers:
            for g, group in enumerate(opt.param_groups):
                label = f"{type(opt).__name__}.param_groups[{g}].{{}}"  # apart from the step's own reads
                for key, value in list(group.items()):
                    if key == "params" or (id(group), key) in self._written:
                        continue
                    if _is_number(value):
                        scalar: Any = self._scalar(opt, group, key, None, value, label.format(key))
                        self._readers.append(scalar.node)
                    elif isinstance(value, tuple) and value and all(_is_number(v) for v in value):
                        scalar = tuple(self._scalar(opt, group, key, i, v, label.format(f"{key}[{i}]"))
                                       for i, v in enumerate(value))
                        self._readers += [s.node for s in scalar]
                    else:
                        continue
                    group[key] = scalar
                    self._wrapped.append((group, key, value, scalar))

    def unwrap_groups(self) -> None:
        """Give the groups their real numbers back where they still hold the scalars put there; where
        they do not, the step wrote its own."""
        for group, key, value, scalar in self._wrapped:
            if group.get(key) is scalar:
                group[key] = value
            else:
                self._written.add((id(group), key))
        self._wrapped.clear()

    def holds_own(self, group: dict, key: str, value: Any) -> bool:
        """Whether ``value`` in ``group[key]`` is a scalar ``wrap_groups`` put there (not a write)."""
        return any(g is group and k == key and s is value for g, k, _, s in self._wrapped)

    def unused_readers(self) -> list[torch.fx.Node]:
        """The readers ``wrap_groups`` made that nothing in the graph uses."""
        return [node for node in self._readers if not node.users]

    def enter(self, optimizer: torch.optim.Optimizer) -> None:
        self.unwrap_groups()  # the optimizer reads its numbers when its step starts, as below
        saved: list[tuple[dict, str, Any, Any]] = []
        for g, group in enumerate(optimizer.param_groups):
            for key, value in list(group.items()):
                if key == "params" or (id(group), key) in self._written:
                    continue  # one the step wrote: the optimizer reads that value, as eager's does
                if _is_number(value):
                    group[key] = self._scalar(optimizer, group, key, None, value, f"param_groups[{g}].{key}")
                elif isinstance(value, tuple) and value and all(_is_number(v) for v in value):
                    group[key] = tuple(self._scalar(optimizer, group, key, i, v, f"param_groups[{g}].{key}[{i}]")
                                       for i, v in enumerate(value))
                else:
                    continue
                saved.append((group, key, value, group[key]))
        self._saved.append(saved)

    def _scalar(self, optimizer: torch.optim.Optimizer, group: dict, key: str, index: int | None, value: Any,
                name: str) -> TracedScalar:
        if index is None:
            def read() -> Any:
                return group[key]
        else:
            def read() -> Any:
                return group[key][index]
        return input_scalar(self.graph, value, read, name, self.record(), name,
                            read_after(name, self.written(optimizer, key)))

    def exit(self, keep_writes: bool = True) -> None:
        """The optimizer's step is done: its groups get their real numbers back, except where the step
        wrote its own (``group["step"] += 1`` in a custom optimizer): that write stays, a traced number
        the capture turns into an effect (``GroupWrites``) or refuses, never silently undone."""
        for group, key, value, put in self._saved.pop() if self._saved else ():
            if not keep_writes or group.get(key) is put:
                group[key] = value
            else:
                self._written.add((id(group), key))
        if self._optimizers and not self._saved:
            self.wrap_groups()  # read again after the step, by code that reads them afterwards

    def restore(self) -> None:
        """Put back every value still replaced: a capture that failed inside ``Optimizer.step`` never
        reached its exit, and an eager fallback must read the user's numbers, not the capture's scalars."""
        self._optimizers = []
        while self._saved:
            self.exit(keep_writes=False)
        self.unwrap_groups()
        self._written.clear()
