"""Fixtures shared by the render tests."""

from __future__ import annotations

import pytest

from graphprof.api import Profile
from tests.render.export_profiles import real_profile


@pytest.fixture(scope="module")
def real() -> Profile:
    """A real profile of the demo ResNet step (built once per process, copied per module)."""
    return real_profile()
