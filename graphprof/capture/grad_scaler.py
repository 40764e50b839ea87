"""A gradient scaler handing an optimizer its scale and overflow count: refused.

An optimizer that unscales and skips inside its own kernel (``fused=True``:
``_step_supports_amp_scaling``) has no branch; ``torch.amp.GradScaler.step``
hands it its scale and count as ``optimizer.grad_scale`` and
``optimizer.found_inf``. Captured whole, such a step left other gradients
than eager's in the capture call itself, for a reason not yet understood: it
is refused (``refuse_scaled_kernel``), and runs as segments, equal to eager.
"""

from __future__ import annotations

import torch


def refuse_scaled_kernel(optimizer: torch.optim.Optimizer) -> str | None:
    """Why the capture of ``optimizer``'s step, starting now, is refused: a gradient scaler handed it its
    scale and overflow count to apply in its kernel (``fused=True``); None otherwise."""
    if getattr(optimizer, "found_inf", None) is None and getattr(optimizer, "grad_scale", None) is None:
        return None
    return (f"a gradient scaler steps {type(optimizer).__name__} with fused=True, which unscales the gradients and "
            "skips overflowed steps in its kernel; such a step is not captured as one static graph yet")
