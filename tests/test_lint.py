"""The linter and the type checker run with the tests, so CI fails on what they find.

Their configuration is in pyproject.toml (``[tool.ruff]``, ``[tool.mypy]``):
ruff's bug rules over the package and the tests, mypy over the package. Both
come with the test extra (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} exited with {done.returncode}:\n{done.stdout}{done.stderr}"


def test_ruff_finds_nothing() -> None:
    _run("ruff", "check", "--no-cache", "graphprof", "tests")


@pytest.mark.slow
def test_mypy_finds_nothing() -> None:
    """Read from the run conftest.py started when collection ended (run here when it did not)."""
    from tests.conftest import RUNS

    if "mypy" not in RUNS:
        _run("mypy")
        return
    status, output = RUNS["mypy"].result()
    assert status == 0, f"mypy exited with {status}:\n{output}"
