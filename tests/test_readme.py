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


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_30_second_tour_runs_as_written(tmp_path) -> None:
    import subprocess
    import sys

    tour = _section("30-second tour")
    code = re.findall(r"```python\n(.*?)\n```", tour, flags=re.S)[0]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "self time" in proc.stdout and (tmp_path / "step.json").exists()


def test_the_command_line_starts_by_creating_the_profile_it_uses() -> None:
    tour = _section("30-second tour")
    blocks = re.findall(r"^```\n(graphprof .*?)\n```", tour, flags=re.S | re.M)
    commands = [line.split("#")[0].strip() for block in blocks
                for line in block.splitlines() if line.startswith("graphprof ")]
    assert commands[0] == "graphprof demo -o step.json"
    assert all("step.json" in c for c in commands[1:] if "calibrate" not in c)
    assert "examples/train_resnet.py" in tour and "examples/train_gpt.py" in tour
    assert (ROOT / "examples" / "train_resnet.py").exists() and (ROOT / "examples" / "train_gpt.py").exists()


def test_the_readme_points_to_nothing_outside_the_repository() -> None:
    assert "../" not in (ROOT / "README.md").read_text()
