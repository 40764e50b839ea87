"""Modules whose eager forward takes torch's fused native path: captured as one op that takes it too.

Why: in eval mode without autograd, ``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` run one fused
kernel (``torch._native_multi_head_attention``,
``torch._transformer_encoder_layer_fwd``, nested tensors) instead of their
ops one by one. They leave that path whenever a torch function mode or
make_fx is active, which a capture always is (and so is torch.compile), so
the captured graph held the ops one by one, and every replay's result
differed from eager's in the last bits (6e-8 on a small attention),
silently.

How: while a capture runs, these modules' ``forward`` first asks torch's
own decision: it runs the forward once more outside the capture's modes,
with the fused entry points replaced by a function that stops it at once.
If the forward reaches one, the call is recorded as one op,
``graphprof::eager_forward``, whose kernel runs the module's own forward
outside every mode, in the capture call's grad mode: the fused path, as
eager takes it, in the capture call and in every replay. The op takes the
call's tensors; its other arguments (``need_weights=False``) are the
capture call's. Only a module in eval mode is asked (in training mode no
fast path exists), which costs one more forward of such a module, in the
capture call only. The stand-in ``forward`` is left out of the stack a
warning is blamed on (capture/step_warnings.py ``_STAND_INS``), as eager's
stack has torch's own there: a warning under it (torch's "mismatched
key_padding_mask and attn_mask") is the step's, issued by every replay.

The kernel runs the live module, in every replay, and a replay runs none of
the step's Python: what the forward reads besides its arguments is what the
step found there, not what the step set before the call. So the call keeps
what the step may set around it, and the kernel sets it for the call and
puts the live value back after it:

* the grad mode;
* the ``training`` flag of the module and of each of its modules. A step
  that trains, then evaluates (``model.eval()``, ``no_grad``) and calls
  ``model.train()`` ran its evaluation in training mode on every replay:
  dropout drew from the RNG, and the result differed, silently. The flags
  the step found are the replay check's (capture/baked_values.py), and
  those it leaves are set at the graph's end (capture/switched_flags.py);
* the autocast regions (capture/autocast_regions.py). The step's
  ``torch.autocast`` around the module is not entered by a replay, and a
  replay of a call made inside one runs with autocast off: the forward
  returned float32 where eager returns bfloat16;
* whether the fused path is enabled (``torch.backends.mha.
  set_fastpath_enabled``), which the step may switch around the call. The
  setting the call is made with is part of the graph's key
  (capture/signature.py ``ambient_state``): a graph that holds the ops one
  by one, captured with the path disabled, is not replayed once it is
  enabled; a step that leaves it changed refuses (capture/torch_settings.py).

Not pinned: the modules' other attributes (``batch_first``, ``norm_first``,
a layer's ``eps``), read live. The step's Python that decided anything from
them is held between calls as any module field (capture/held_values.py); a
step that sets one before the call and puts it back after it would have the
kernel read the value put back.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.backends.mha
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from graphprof.capture.autocast_regions import Regions, autocast_state, regions_entered
from graphprof.capture.step_warnings import quiet

#: The fused entry points the modules' fast paths call, as attributes of ``torch``.
_FUSED = ("_native_multi_head_attention", "_transformer_encoder_layer_fwd", "_nested_tensor_from_mask")
#: The modules that have such a path.
_MODULES: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


@dataclass
class _Call:
    """One recorded call: the forward to run, on which module, with which non-tensor arguments."""

    forward: Callable[..., Any]
    module: nn.Module
    spec: pytree.TreeSpec  # of (args, kwargs)
    leaves: list[Any]  # the non-tensor leaves; _TENSOR where a tensor goes
    grad_enabled: bool
    modes: list[tuple[nn.Module, bool]]  # each of the module's modules, and its ``training`` flag in the call
    autocast: Regions  # the autocast regions of the call
    fastpath: bool  # whether the fused path was enabled (``torch.backends.mha.set_fastpath_enabled``) in the call
    out_spec: pytree.TreeSpec | None = None
    out_leaves: list[Any] | None = None  # the output's non-tensor leaves (MHA's weights: None)

    def run(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        args, kwargs = _filled(self.leaves, tensors, self.spec)
        with self._as_in_the_call():
            out = self.forward(self.module, *args, **kwargs)
        flat, self.out_spec = pytree.tree_flatten(out)
        self.out_leaves = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in flat]
        return [leaf for leaf in flat if isinstance(leaf, torch.Tensor)]

    @contextlib.contextmanager
    def _as_in_the_call(self) -> Iterator[None]:
        """What the forward reads besides its arguments, set as the capture call had it (a replay runs none
        of the step's ``model.eval()``, ``torch.autocast``, ...), and the live values put back after it."""
        live_modes = [module.training for module, _ in self.modes]
        live_fastpath = torch.backends.mha.get_fastpath_enabled()
        try:
            for module, mode in self.modes:
                if module.training is not mode:
                    module.training = mode
            if live_fastpath is not self.fastpath:
                torch.backends.mha.set_fastpath_enabled(self.fastpath)
            autocast = contextlib.nullcontext() if autocast_state() == self.autocast else regions_entered(self.autocast)
            with torch.set_grad_enabled(self.grad_enabled), autocast:
                yield
        finally:
            for (module, mode), live in zip(self.modes, live_modes):
                if live is not mode:
                    module.training = live
            if live_fastpath is not self.fastpath:
                torch.backends.mha.set_fastpath_enabled(live_fastpath)


def _filled(leaves: list[Any], tensors: list[torch.Tensor], spec: pytree.TreeSpec) -> Any:
    """The tree of ``spec`` with ``tensors`` where ``leaves`` holds ``_TENSOR``."""
    given = iter(tensors)
    return pytree.tree_unflatten([next(given) if leaf is _TENSOR else leaf for leaf in leaves], spec)


_TENSOR = object()  # where a tensor goes among a call's leaves
_CALLS: dict[int, _Call] = {}
_HANDLES = itertools.count()
_LIBRARY = torch.library.Library("graphprof", "DEF")
_LIBRARY.define("eager_forward(int handle, Tensor[] tensors) -> Tensor[]")


#: Calls of ``_eager_forward`` running now: inside one, the modules run as they are (a fused
#: encoder's layers take nested tensors, which no op of graphprof's takes).
_INSIDE = [0]


def _eager_forward(handle: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    _INSIDE[0] += 1
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            return _CALLS[handle].run(tensors)
    finally:
        _INSIDE[0] -= 1


def _fake_forward(handle: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return _CALLS[handle].run(tensors)  # under the fake mode: shapes and dtypes only


_LIBRARY.impl("eager_forward", _eager_forward, "CompositeExplicitAutograd")
torch.library.register_fake("graphprof::eager_forward", _fake_forward, lib=_LIBRARY)


class _Fused(Exception):
    """Raised by a stand-in for a fused entry point: eager's forward would have called it."""


def _stop(*args: Any, **kwargs: Any) -> Any:
    raise _Fused


def takes_fused_path(forward: Callable[..., Any], module: nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether ``forward(module, *args, **kwargs)`` run eagerly (no capture modes) calls a fused kernel."""
    saved = {name: getattr(torch, name) for name in _FUSED if hasattr(torch, name)}
    try:
        for name in saved:
            setattr(torch, name, _stop)
        with _disable_current_modes(), torch._C.DisableTorchFunction(), quiet():
            forward(module, *args, **kwargs)
    except _Fused:
        return True
    except Exception:  # the real forward, run next, raises it for the user
        return False
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)
    return False


def _as_one_op(forward: Callable[..., Any], module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """The module's call recorded as one ``graphprof::eager_forward`` op (see the module's docstring)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    call = _Call(forward, module, spec, [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
                 torch.is_grad_enabled(), [(m, m.training) for m in module.modules()], autocast_state(),
                 torch.backends.mha.get_fastpath_enabled())
    handle = next(_HANDLES)
    _CALLS[handle] = call
    outputs = torch.ops.graphprof.eager_forward(handle, tensors)
    assert call.out_spec is not None and call.out_leaves is not None  # the kernel ran
    return _filled(call.out_leaves, list(outputs), call.out_spec)


@contextlib.contextmanager
def fused_fast_paths() -> Iterator[None]:
    """For the capture: the modules' ``forward`` records the fused path as one op where eager takes it."""
    originals = {cls: cls.forward for cls in _MODULES}

    def guarded(cls: type[nn.Module]) -> Callable[..., Any]:
        original = originals[cls]

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if not self.training and not _INSIDE[0] and takes_fused_path(original, self, args, kwargs):
                return _as_one_op(original, self, args, kwargs)
            return original(self, *args, **kwargs)

        return forward

    try:
        for cls in _MODULES:
            cls.forward = guarded(cls)  # type: ignore[method-assign]
        yield
    finally:
        for cls, forward in originals.items():
            cls.forward = forward  # type: ignore[method-assign]
