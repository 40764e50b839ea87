"""torch's global settings a step leaves changed: a replay would not change them again, so it refuses.

Why: ``torch.set_default_dtype(...)``, ``torch.set_grad_enabled(train)``
called as a function (not a ``with``), ``torch.set_printoptions``,
``torch.use_deterministic_algorithms`` or ``torch.set_num_threads`` inside
a step run once, in the capture call; every replay left the setting as the
last capture left it. A step that alternates them (an evaluation call that
turns grad off and leaves it off) then printed with other options, made
its tensors in another dtype, or left grad mode as eager does not.

The step's own calls of these setters refuse where they are made
(capture/host_sources.py): even put back, a replay would not set them
around the ops between. What this check adds is the rest: grad mode, whose
setter is also a ``with`` (one put back is captured), and settings code
the step calls (a library's) leaves changed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.backends.mha

from graphprof.capture.scalars import DataDependentError


def _print_options() -> tuple[Any, ...]:
    options = torch._tensor_str.PRINT_OPTS
    return (options.precision, options.threshold, options.edgeitems, options.linewidth, options.sci_mode)


def _set_print_options(values: tuple[Any, ...]) -> None:
    precision, threshold, edgeitems, linewidth, sci_mode = values
    torch.set_printoptions(precision=precision, threshold=threshold, edgeitems=edgeitems, linewidth=linewidth,
                           sci_mode=sci_mode)


def _set_deterministic(values: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(values[0], warn_only=values[1])


#: Each setting: what a sentence calls it, how to read it, and how to give it a value read before.
_SETTINGS: tuple[tuple[str, Callable[[], Any], Callable[[Any], Any]], ...] = (
    ("grad mode (torch.set_grad_enabled outside a with)", torch.is_grad_enabled, torch._C._set_grad_enabled),
    ("default dtype (torch.set_default_dtype)", torch.get_default_dtype, torch.set_default_dtype),
    ("print options (torch.set_printoptions)", _print_options, _set_print_options),
    ("deterministic algorithms (torch.use_deterministic_algorithms)",
     lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
     _set_deterministic),
    ("thread count (torch.set_num_threads)", torch.get_num_threads, torch.set_num_threads),
    ("float32 matmul precision (torch.set_float32_matmul_precision)", torch.get_float32_matmul_precision,
     torch.set_float32_matmul_precision),
    ("fused attention path (torch.backends.mha.set_fastpath_enabled)", torch.backends.mha.get_fastpath_enabled,
     torch.backends.mha.set_fastpath_enabled),
)


def torch_settings() -> tuple[Any, ...]:
    """The settings' values now."""
    return tuple(read() for _, read, _ in _SETTINGS)


def restore_settings(before: tuple[Any, ...]) -> list[str]:
    """Give each setting changed since ``before`` its value back; returns what the changed ones are called.

    Why: after a refused capture the step runs again, another way, and changes the setting again. A step
    that flips one from what it finds (``torch.set_grad_enabled(not torch.is_grad_enabled())``) flipped it
    twice in the call whose capture was refused, and grad mode after the call was not eager's."""
    changed = [(what, write, then) for (what, read, write), then in zip(_SETTINGS, before) if read() != then]
    for _, write, then in changed:
        write(then)
    return [what for what, _, _ in changed]


def refuse_changed_settings(before: tuple[Any, ...]) -> None:
    """Refuse a step that returns with one of the settings other than ``before`` (its values when it was called),
    each given its value back first (``restore_settings``)."""
    changed = restore_settings(before)
    if changed:
        raise DataDependentError(f"the step leaves torch's {changed[0]} changed when it returns, which a "
                                 "replayed graph would not change again")
