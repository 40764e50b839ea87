"""torch.distributions' checks of their arguments and samples, made by every replay when it gets there.

Why: a distribution validates by default (``Distribution._validate_args`` is
``__debug__``): ``Categorical(logits=policy(obs))`` checks its logits, and
``log_prob(action)`` checks the action is in the support, each with
``if not torch._is_all_true(valid): raise ValueError(...)``. That is a branch
on a tensor computed from the model: the capture refused it, and every
REINFORCE or PPO update, every VAE written with ``Normal(mu, std)``, ran as
segments.

How: while a step is captured, ``torch._is_all_true`` called from
``torch.distributions`` with a tensor of the graph decides on the capture
call's real values (untraced), as eager does: the check that fails raises
there (torch's message would format the values, which a capture cannot),
which stops the capture and runs the step eagerly, where eager raises its own.
The check that passes leaves a host node at its place in the graph, with
the ops that computed ``valid`` before it, as eager runs them: on every
replay it raises a ``ValueError`` when the replay's values fail. A replay
that raised there has changed nothing the user holds (it stops where eager
stops), so the step then runs eagerly and the caller gets eager's error
and message (runtime/failed_replays.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch.distributions import Distribution
from torch.utils._python_dispatch import _disable_current_modes

from graphprof.capture.held_values import HeldValue, Hold, Place
from graphprof.capture.host_nodes import SILENT_AGAIN, effect_node

_DISTRIBUTIONS_DIR = os.path.join(os.path.dirname(torch.__file__), "distributions") + os.sep
#: torch's own function, as a replay's check calls it.
_IS_ALL_TRUE = torch._is_all_true


class DistributionChecks:
    """Patches ``torch._is_all_true`` for the length of one capture (``patched``)."""

    def __init__(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any], record: Callable[[], Any],
                 source: Callable[[], str]) -> None:
        self.graph, self.node_of, self.record, self.source = graph, node_of, record, source
        self.used = False  # whether the step made a distribution

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        original, init = torch._is_all_true, Distribution.__init__
        checks = self

        @functools.wraps(init)
        def noted(dist: Any, *args: Any, **kwargs: Any) -> None:
            checks.used = True
            init(dist, *args, **kwargs)

        torch._is_all_true = self._is_all_true  # type: ignore[assignment]
        Distribution.__init__ = noted  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            torch._is_all_true = original
            Distribution.__init__ = init  # type: ignore[method-assign]

    def held(self) -> tuple[HeldValue, ...]:
        """The default ``validate_args`` (``Distribution.set_default_validate_args``) when the step made a
        distribution: a graph captured without checks would skip them once they are turned on again."""
        if not self.used:
            return ()
        return (HeldValue("torch.distributions' default validate_args", Place.ATTRIBUTE, Distribution,
                          "_validate_args", Hold.VALUE, Distribution._validate_args,
                          lambda: Distribution._validate_args),)

    def _is_all_true(self, valid: Any) -> Any:
        if not sys._getframe(1).f_code.co_filename.startswith(_DISTRIBUTIONS_DIR):
            return _IS_ALL_TRUE(valid)  # not a distribution's check
        node = self.node_of(valid) if isinstance(valid, torch.Tensor) else None
        if not isinstance(node, torch.fx.Node):
            return _IS_ALL_TRUE(valid)  # of values every call has alike (a constant)
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            holds = bool(_IS_ALL_TRUE(valid))
        where = self.source()
        if not holds:  # torch's message formats the values, which the capture cannot: eager's run says it
            raise _failed(where)
        check = effect_node(self.graph, "torch.distributions check", lambda values: _check(values[0], where),
                            [node], self.record())
        check.meta[SILENT_AGAIN] = _passed  # one that passed changed nothing: a failed replay may run eagerly
        return True


def _check(valid: torch.Tensor, where: str) -> None:
    """A replay's check: eager raises here, with its own message, when ``valid`` is not all true."""
    if not bool(_IS_ALL_TRUE(valid)):
        raise _failed(where)


def _passed() -> bool:
    return True


def _failed(where: str) -> ValueError:
    return ValueError(f"a torch.distributions argument or sample check failed at {where}: values out of the "
                      "distribution's constraint or support")
