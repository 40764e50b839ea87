"""The README opens with the two set-up commands, and CI runs the test one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    head = text.split("\n## ", 1)[0]
    return re.findall(r"```(?:bash|sh)\n(.*?)\n```", head, flags=re.S)


def test_two_setup_commands_pin_torch() -> None:
    commands = _setup_commands()
    assert len(commands) == 2
    demo, tests = commands
    assert "graphprof demo" in demo and "pytest" in tests
    for command in commands:
        assert "torch==2.13.0" in command  # never an unpinned torch


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _setup_commands()[1] in ci
