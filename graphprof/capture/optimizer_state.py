"""The values in an optimizer's per-parameter state that a graph holds: the same ones on every call.

A captured graph holds an optimizer's state tensors (``exp_avg``,
``momentum_buffer``, ``step``) as constants and updates them in place, as
torch's optimizers do. Two things break that, and each was silent:

* a **step that replaces a value** (a custom optimizer's ``st["buf"] =
  st["buf"] * 0.9 + grad``, or ``st["n"] += 1`` on a Python int): the
  replay updated nothing where eager put a new value on every call. The
  capture compares each per-parameter dict that existed when the step
  began with what it holds after, and refuses on any change
  (``refuse_replaced``), so the step is profiled another way, with one warning;
* **user code that replaces one between calls** (``st["step"] =
  torch.tensor(0.)`` to restart a schedule of moments, a value moved to
  another dtype): the graph went on updating the old tensor. Every call
  checks that each optimizer's per-parameter dicts, and the values in them,
  are the very objects the graph was captured with (``OptimizerStateEntries``),
  with C-level ``map``s and no Python frame per parameter.

State created by the step itself (the first ``Adam.step``) is new at its
end: ``CapturedStep.entry_mismatch`` captures again once it exists.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from graphprof.capture.held_values import same_value
from graphprof.capture.scalars import DataDependentError

#: Per optimizer, its per-parameter dicts and their items (key, value) as the step begins.
StateSnapshot = list[tuple[torch.optim.Optimizer, list[tuple[Any, dict, list[tuple[Any, Any]]]]]]


def snapshot(optimizers: Sequence[torch.optim.Optimizer]) -> StateSnapshot:
    """Each optimizer's per-parameter dicts and their items, before the step."""
    return [(o, [(p, d, list(d.items())) for p, d in o.state.items() if isinstance(d, dict)]) for o in optimizers]


def refuse_replaced(before: StateSnapshot) -> None:
    """Refuse the capture where the step put a new value (or dict) in per-parameter state it had."""
    for optimizer, entries in before:
        name = type(optimizer).__name__
        for i, (param, d, items) in enumerate(entries):
            where = f"{name}.state[param {i}]"
            if optimizer.state.get(param) is not d:
                raise DataDependentError(f"the optimizer's step replaces {where}, which a replayed graph "
                                         "would not repeat")
            was = dict(items)
            for key, value in d.items():
                if key not in was or not same_value(value, was[key]):
                    error = DataDependentError(
                        f"the optimizer's step puts a new value in {where}[{key!r}] (not written in place), "
                        "which a replayed graph would not repeat")
                    # A value made where there was none (timm's Lookahead makes its slow weights on the
                    # k-th call): this call runs eagerly, and the next one on this path finds it made.
                    error.this_call_only = key not in was
                    raise error


@dataclass(frozen=True)
class OptimizerStateEntries:
    """The per-parameter dicts (in ``optimizer.state`` order) and their values a graph was captured with."""

    #: Per optimizer, its per-parameter dicts.
    dicts: tuple[tuple[dict, ...], ...]
    #: Every value of every dict, with the dict it is in and its key (three tuples of one length).
    holders: tuple[dict, ...]
    keys: tuple[Any, ...]
    values: tuple[Any, ...]

    @property
    def every(self) -> tuple[dict, ...]:
        """Every per-parameter dict, of every optimizer."""
        return tuple(d for per in self.dicts for d in per if isinstance(d, dict))

    @classmethod
    def of(cls, optimizers: Sequence[torch.optim.Optimizer]) -> "OptimizerStateEntries":
        dicts = tuple(tuple(o.state.values()) for o in optimizers)
        triples = [(d, k, v) for per in dicts for d in per if isinstance(d, dict) for k, v in d.items()]
        return cls(dicts, tuple(t[0] for t in triples), tuple(t[1] for t in triples), tuple(t[2] for t in triples))

    def replaced(self, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        """Whether a per-parameter dict, or a value in one, is not the object captured with.

        The slow, exact test; ``holds`` is the replay check's fast one.
        """
        if len(optimizers) != len(self.dicts):
            return True
        for o, dicts in zip(optimizers, self.dicts):
            if len(o.state) != len(dicts) or not all(map(operator.is_, o.state.values(), dicts)):
                return True
        if sum(map(len, self.every)) != len(self.values):
            return True
        return not all(map(same_value, map(_get, self.holders, self.keys), self.values))


def _get(d: dict, key: Any) -> Any:
    return d.get(key, _MISSING)


_MISSING = object()
