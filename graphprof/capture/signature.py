"""What a captured graph is specialised to: the call's input signature.

A graph holds the shapes, strides, dtypes, devices and ``requires_grad`` of
its tensor arguments, the structure of the arguments, the grad mode, and any other
argument by value (ints and floats are inputs read at run time, so only
their type counts). ``signature`` builds that key for a call; ``tracing``
keeps one set of graphs per key, like ``torch.compile``'s recompiles.

Every call needs its key, and on a step of tiny ops building and hashing it
is a visible share of the step. Most training loops call the step with the
same tensor shapes every time, so ``LastSignature`` keeps the key of the last
call of the common form ``step(x, y)`` (positional tensors only) and compares
this call's tensors with it field by field, with the comparisons the key's
own equality would make; only when one differs is the key built again.
"""

from __future__ import annotations

from typing import Any, Hashable

import torch
import torch.backends.mha
from torch.utils._device import DeviceContext

from graphprof.capture.autocast_regions import autocast_state
from graphprof.capture.batches import flatten_call
from graphprof.capture.whole_step import is_number_input


def signature(args: tuple, kwargs: dict) -> tuple[Hashable, list[Any]]:
    """What a captured graph is specialised to (tensor metadata, other values by
    equality), and the flattened inputs, so a replay flattens them only once."""
    spec: Hashable
    if not kwargs and all(type(a) in FLAT_LEAVES for a in args):
        # The common call, step(x, y): pytree's leaves are the arguments themselves.
        leaves, spec = list(args), len(args)
    else:
        leaves, spec = flatten_call(args, kwargs)
    # TreeSpec hashes by structure; factory ops without a dtype were traced with the default one.
    parts: list[Hashable] = [spec, torch.is_grad_enabled(), (torch.get_default_dtype(), autocast_state(),
                                                            ambient_state())]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            # Strides too: a graph traced on a contiguous tensor may view it where eager would copy.
            requires_grad: Any = leaf.requires_grad
            if requires_grad and leaf.grad is not None:  # a backward accumulates into it, or makes one
                requires_grad = WITH_GRAD
            parts.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, requires_grad))
        elif is_number_input(leaf):
            parts.append(type(leaf))  # type: ignore[arg-type]  # an input of the graph: its value is guarded only where a branch reads it
        else:
            try:
                hash(leaf)
                parts.append((type(leaf), leaf))
            except TypeError:
                parts.append((type(leaf), id(leaf)))
    return tuple(parts), leaves


#: The ``requires_grad`` field of an argument that requires grad and already has a ``.grad``: a
#: graph of its own (it accumulates into the gradient), never matched by the fast tests.
WITH_GRAD = "requires grad, with a .grad"

_any_autocast = torch._C._is_any_autocast_enabled
_inference_mode = torch.is_inference_mode_enabled
_SDPA_FLAGS = (torch._C._get_flash_sdp_enabled, torch._C._get_mem_efficient_sdp_enabled, torch._C._get_math_sdp_enabled,
               torch._C._get_cudnn_sdp_enabled)
_mha_fastpath = torch.backends.mha.get_fastpath_enabled


def ambient_state() -> tuple[bool, tuple[bool, ...], tuple[Any, ...], bool]:
    """Whether the call is made under ``torch.inference_mode()``, which scaled-dot-product attention
    backends are enabled (``sdpa_kernel(SDPBackend.MATH)`` around the call), the default devices
    set around it (``torch.set_default_device``, ``with torch.device(...)``: the device its factories
    make tensors on, which the graph holds), and whether the fused attention path is enabled
    (``torch.backends.mha.set_fastpath_enabled``).

    Why in the key: a graph captured under inference mode returns inference
    tensors, which a call under ``no_grad`` would get from it where eager gives
    plain ones (an in-place update of one then raised); and the attention
    kernel the graph was captured with is the one it replays, where eager
    picks by the flags of the call (other last bits): an eval-mode
    ``nn.MultiheadAttention`` or ``nn.TransformerEncoder`` takes its fused
    path only where it is enabled, and the graph holds the path it took
    (capture/fast_paths.py).
    """
    flash, efficient, math, cudnn = _SDPA_FLAGS
    return _inference_mode(), (flash(), efficient(), math(), cudnn()), _default_devices(), _mha_fastpath()


def _function_modes() -> list[Any]:
    return torch.overrides._get_current_function_mode_stack() if torch._C._len_torch_function_stack() else []


def _default_devices() -> tuple[Any, ...]:
    """The devices of the default-device modes around the call, innermost last (none: empty, no lookup)."""
    return tuple(mode.device for mode in _function_modes() if isinstance(mode, DeviceContext))


def foreign_context() -> str | None:
    """What the caller runs the call inside that a replayed graph would not pass the step's ops through:
    a torch function or dispatch mode (``FlopCounterMode``, a ``TorchFunctionMode`` of the user's) or
    ``saved_tensors_hooks``, named; None for none. A default device (``torch.set_default_device``,
    itself such a mode) only decides where factories make tensors, which the graph holds: it is part
    of the key (``ambient_state``) instead.

    Why not a key: such a context runs Python of its own on every op (counting,
    swapping, packing what autograd saves), which a graph runs none of.
    """
    others = [mode for mode in _function_modes() if not isinstance(mode, DeviceContext)]  # (that one: a key)
    if others:
        return type(others[-1]).__name__
    if torch._C._len_torch_dispatch_stack():
        return type(torch.utils._python_dispatch._get_current_dispatch_mode_stack()[-1]).__name__
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        return "saved_tensors_hooks"
    return None


#: Argument types pytree treats as leaves, for which flattening a flat call is the identity.
FLAT_LEAVES = frozenset({torch.Tensor, torch.nn.Parameter, int, float, bool, str})
_TENSORS = (torch.Tensor, torch.nn.Parameter)


class LastSignature:
    """The key of a call of positional tensors, and an exact test that a later call's key equals it.

    The key's tensor part is ``(tuple(shape), stride, dtype, device, requires_grad)``;
    ``matches`` compares each field with what the tuples' equality compares
    it with: the shape as a tuple (``torch.Size`` is one), the dtype and the
    bools by identity (a dtype has no other equality, the bools are
    singletons), the device with ``==``. Equal fields give an equal key, so
    the call finds the same graphs the key would.
    """

    __slots__ = ("key", "paths", "replay", "count", "grad_enabled", "default_dtype", "autocast", "ambient", "tensors")

    def __init__(self, key: tuple, count: int) -> None:
        self.key = key
        #: The graphs captured for ``key`` (tracing keeps them here between calls, and drops them
        #: whenever its graphs change).
        self.paths: Any = None
        #: The path a call of this key replays without asking ``CapturedPaths.select`` (set by tracing,
        #: dropped whenever the graphs change): it holds its own exact test (capture/replay_check.py).
        self.replay: Any = None
        #: The key's parts: how many positional tensors, the grad mode, each tensor's fields.
        self.count = count
        self.grad_enabled = key[1]
        self.default_dtype, self.autocast, self.ambient = key[2]
        self.tensors = key[3:]

    @classmethod
    def of(cls, key: Hashable, args: tuple, kwargs: dict) -> "LastSignature | None":
        """The last-call record of ``key`` (built by ``signature(args, kwargs)``), or None when the
        call is not one of positional tensors only."""
        if kwargs or not isinstance(key, tuple) or not all(type(a) in _TENSORS for a in args):
            return None
        return cls(key, len(args))

    def matches(self, args: tuple, kwargs: dict) -> bool:
        """Whether ``signature(args, kwargs)`` would equal ``key`` (never True where it would not)."""
        if kwargs or len(args) != self.count or torch.is_grad_enabled() is not self.grad_enabled:
            return False
        if torch.get_default_dtype() is not self.default_dtype:
            return False
        if (_any_autocast() if self.autocast is None else autocast_state() != self.autocast):
            return False
        if ambient_state() != self.ambient:
            return False
        for arg, (shape, stride, dtype, device, requires_grad) in zip(args, self.tensors):
            kind = type(arg)
            if kind is not torch.Tensor and kind is not torch.nn.Parameter:
                return False
            if (arg.shape != shape or arg.stride() != stride or arg.dtype is not dtype
                    or arg.requires_grad is not requires_grad or arg.device != device):
                return False
            if requires_grad is True and arg.grad is not None:  # the key says WITH_GRAD
                return False
        return True


def signature_change(old: Hashable, new: Hashable) -> str:
    """One phrase naming the first argument whose shape, type or value differs from the last signature."""
    if isinstance(old, tuple) and isinstance(new, tuple) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            if a == b:
                continue
            if i == 1:
                return f"grad mode changed to {'enabled' if b else 'disabled'}"
            if i == 2:
                return (f"the default dtype, the autocast regions, inference mode or the attention backends changed "
                        f"from {_short(a)} to {_short(b)}")
            if i > 2:
                return f"argument {i - 3} (flattened) changed from {_short(a)} to {_short(b)}"
            break
    return "the arguments' structure changed"


def _short(part: Any) -> str:
    text = repr(part)
    return text if len(text) <= 60 else text[:57] + "..."
