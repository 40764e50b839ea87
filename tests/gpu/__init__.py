"""Tests that need an accelerator: marked ``gpu`` and skipped without a torch.accelerator device."""

from __future__ import annotations

import pytest
import torch

ON_AN_ACCELERATOR = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.accelerator.is_available(), reason="needs an accelerator (torch.accelerator)"),
]


def accelerator() -> torch.device:
    """The current accelerator device (``cuda:0`` on one NVIDIA GPU)."""
    return torch.accelerator.current_accelerator()
