"""Activation checkpointing's recomputation, marked as its own scope during capture.

``torch.utils.checkpoint`` runs a block's forward again inside the backward
pass. In a whole-step graph those ops sit in the backward, and autograd would
attribute them to whatever backward node triggered them; users want to see
what checkpointing costs. For the length of the recomputation the recorder
attributes ops to the module that runs them (as in the forward), in phase
``backward`` (when it runs) under the scope ``checkpoint recompute``. Both
flavours are covered: the reentrant one recomputes in
``CheckpointFunction.backward`` (``ctx.run_function``), the non-reentrant one
in its saved-tensor unpack hook (``_run_fn_with_dynamo_disabled``).

The RNG state the recomputation restores is replayed by ``rng_calls.py``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

from torch.utils import checkpoint as torch_checkpoint

#: The scope label of recomputed ops.
RECOMPUTE_SCOPE = "checkpoint recompute"


class CheckpointRecompute:
    """Calls ``enter``/``exit`` around every recomputation while patched."""

    def __init__(self, enter: Callable[[], None], exit: Callable[[], None]) -> None:
        self.enter = enter
        self.exit = exit

    def _scoped(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        recompute = self

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            recompute.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                recompute.exit()

        return run

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        function = torch_checkpoint.CheckpointFunction
        backward = function.__dict__["backward"]
        run_disabled = getattr(torch_checkpoint, "_run_fn_with_dynamo_disabled", None)
        recompute = self

        def reentrant_backward(ctx: Any, *grads: Any) -> Any:
            run_function = ctx.run_function
            ctx.run_function = recompute._scoped(run_function)
            try:
                return backward.__func__(ctx, *grads)
            finally:
                ctx.run_function = run_function

        function.backward = staticmethod(reentrant_backward)  # type: ignore[method-assign]
        if run_disabled is not None:
            torch_checkpoint._run_fn_with_dynamo_disabled = self._scoped(run_disabled)
        try:
            yield
        finally:
            function.backward = backward  # type: ignore[method-assign]
            if run_disabled is not None:
                torch_checkpoint._run_fn_with_dynamo_disabled = run_disabled
