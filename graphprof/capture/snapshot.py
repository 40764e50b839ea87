"""Undo a failed capture: the step must not leave the user's state half-updated.

A capture runs the step for real. If it fails part way (say at a ``print``
after ``opt.step()``), parameters, optimizer state and gradients may already
be written. The write log is copy-on-write: just before an op writes in place
to a tensor that existed before the capture, that tensor is copied once; the
``.grad`` of every parameter the step touches, the CPU RNG state and the
state of every ``torch.Generator`` an op draws from are remembered too. ``restore`` puts all of it back. Only state the step really
writes is copied, once per capture, never per step.

Python the capture runs for real outside the trace (an LR scheduler's
``step``, capture/host_calls.py) writes tensors too: torch's schedulers
``fill_`` a tensor learning rate in the optimizer's groups, a user's
scheduler may count in a tensor. Its ops pass no mode of the capture's, so
``HostWrites`` gives them to the log: without it, a capture refused after
the scheduler stepped left those tensors advanced, and the step run again
another way stepped them twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes


#: Ops that write arguments their schema does not mark as written (no ``Tensor(a!)``), by
#: schema name (every overload): the written arguments, and the boolean argument that says
#: whether they are written (None: always). ``benchmarks/undeclared_writes.py`` finds them by
#: running the ops the cost table knows on sample inputs and comparing every argument before
#: and after. In training mode the
#: batch-norm family updates the running statistics in place; without this entry a failed
#: capture left them updated and ``capture="auto"``'s fallback updated them again.
UNDECLARED_WRITES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "aten::native_batch_norm": (("running_mean", "running_var"), "training"),
    "aten::batch_norm": (("running_mean", "running_var"), "training"),
    "aten::_batch_norm_impl_index": (("running_mean", "running_var"), "training"),
    "aten::cudnn_batch_norm": (("running_mean", "running_var"), "training"),
    "aten::miopen_batch_norm": (("running_mean", "running_var"), "training"),
    "aten::instance_norm": (("running_mean", "running_var"), "use_input_stats"),
    "aten::batch_norm_update_stats": (("running_mean", "running_var"), None),
    # oneDNN's RNN backward reuses its forward workspace as scratch: a tensor of the step
    # itself, never user state, but listed so the log's knowledge matches what the op does.
    "aten::mkldnn_rnn_layer_backward": (("workspace",), None),
}


def arguments_by_name(schema: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's argument values by schema name (positional or keyword; defaults not filled in)."""
    values = dict(kwargs)
    for argument, value in zip((a for a in schema.arguments if not a.kwarg_only), args):
        values[argument.name] = value
    return values


def written_arguments(schema: Any, values: dict[str, Any]) -> list[str]:
    """The names of the arguments a call writes (its values by name): those the schema marks as
    written, and those ``UNDECLARED_WRITES`` knows it writes."""
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    undeclared = UNDECLARED_WRITES.get(schema.name)
    if undeclared is not None:
        names, condition = undeclared
        if condition is None or values.get(condition, False):
            written.extend(names)
    return written


class WriteLog:
    """Originals of everything a capture overwrote, restorable in place.

    A write through an alias made during the step (``ema.weight.data.mul_()``,
    ``p.detach().add_()``, ``w[:, :2].add_(1)``) writes a tensor from before
    the capture although the written tensor is new: the tensor of the step's
    state that shares its storage (``state_tensors``) is copied then. Without
    that, a capture refused after such a write left it done, and the fallback
    did it again.
    """

    def __init__(self, state_tensors: Callable[[], Iterable[torch.Tensor]] = tuple) -> None:
        self._tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._grads: dict[int, tuple[torch.nn.Parameter, torch.Tensor | None]] = {}
        self._rng_state = torch.get_rng_state()
        self._generators: dict[int, tuple[torch.Generator, torch.Tensor]] = {}
        #: Told of each generator when first seen (capture/rng_calls.py checks where its draws start).
        self.first_seen: Callable[[torch.Generator], None] = lambda g: None
        self._state_tensors = state_tensors
        self._by_storage: dict[int, torch.Tensor] | None = None  # made at the first write through an alias

    def note_grad(self, param: torch.nn.Parameter) -> None:
        """Remember ``param.grad`` as it is now (first sighting wins)."""
        if id(param) not in self._grads:
            self._grads[id(param)] = (param, param.grad)

    def note_generators(self, args: tuple, kwargs: dict) -> None:
        """Remember the state of each ``torch.Generator`` an op draws from (``randn(..., generator=g)``),
        once: like the global generator's, it is put back when the capture is undone."""
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Generator) and id(value) not in self._generators:
                self._generators[id(value)] = (value, value.get_state())
                self.first_seen(value)

    def before_write(self, func: Any, args: tuple, kwargs: dict, is_preexisting: Any) -> None:
        """Copy every pre-existing tensor argument ``func`` writes to, once."""
        self.note_generators(args, kwargs)
        schema = getattr(func, "_schema", None)
        if schema is None:
            return
        undeclared = UNDECLARED_WRITES.get(schema.name)
        if not schema.is_mutable and undeclared is None:
            return
        values = arguments_by_name(schema, args, kwargs)
        for name in written_arguments(schema, values):
            value = values.get(name)
            targets = value if isinstance(value, (list, tuple)) else [value]
            for t in targets:
                if not isinstance(t, torch.Tensor):
                    continue
                target = t if is_preexisting(t) else self._aliased(t)
                if target is not None and id(target) not in self._tensors:
                    with _disable_current_modes(), torch.no_grad():
                        self._tensors[id(target)] = (target, target.detach().clone())

    def _aliased(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The state tensor whose storage ``tensor`` (made during the step) shares, or None."""
        if self._by_storage is None:
            self._by_storage = {}
            for t in self._state_tensors():
                if t.layout is torch.strided and t.device.type != "meta":
                    self._by_storage.setdefault(t.untyped_storage().data_ptr(), t)
        if not self._by_storage or tensor.layout is not torch.strided or tensor.device.type == "meta":
            return None
        return self._by_storage.get(tensor.untyped_storage().data_ptr())

    def restore(self) -> None:
        """Write every original back, in place; the first copied last, so that where two targets share
        memory (a tensor and a view of it, each written) the older copy wins."""
        with torch.no_grad():
            for target, original in reversed(self._tensors.values()):
                target.copy_(original)
        for param, grad in self._grads.values():
            param.grad = grad
        torch.set_rng_state(self._rng_state)
        for generator, state in self._generators.values():
            generator.set_state(state)


class HostWrites(TorchDispatchMode):
    """Gives ``log`` every tensor written by the Python run under it: code the capture runs for real
    with its own modes off (see the module's docstring). Every written tensor is copied, those made
    under it too: which tensor the user keeps cannot be told here, and such code writes few."""

    def __init__(self, log: WriteLog) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        self.log.before_write(func, args, kwargs, _every_tensor)
        return func(*args, **kwargs)


def _every_tensor(tensor: torch.Tensor) -> bool:
    return True


def written_small_tensors(func: Any, args: tuple, kwargs: dict, is_preexisting: Any) -> list[torch.Tensor]:
    """Every tensor ``func`` writes to, when a pre-existing one has a single element; else none.

    make_fx's tracer propagates "constants" (tensors of at most one element)
    by running the op on them once more: an in-place op on such a tensor from
    before the step (Adam's step count, a one-unit bias) would be applied
    twice during the capture call, and a foreach op with it to its whole list.

    Never those of a random op (``uniform_``, ``normal_``, ``bernoulli_``:
    torch tags them ``nondeterministic_seeded``): make_fx does not propagate
    constants through them, so they ran once, and running one again to undo
    a second run that never happened drew from the generator a second time. A
    one-unit bias re-initialized in the step (``Linear(8, 1).reset_parameters()``)
    got another value than eager's, and every later draw was shifted.
    """
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable or torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
        return []
    found: list[torch.Tensor] = []
    for i, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not argument.kwarg_only else kwargs.get(argument.name)
        found += [t for t in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(t, torch.Tensor)]
    # The op's other written tensors come too, those the step made included: the op runs once more on
    # all of them. A fused optimizer given a gradient scaler's scale (``_fused_adam_(grads=...,
    # grad_scale=...)``) unscales the step's new gradients in place, and they were divided twice.
    return found if any(t.numel() <= 1 and is_preexisting(t) for t in found) else []
