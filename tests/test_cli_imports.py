"""Each command imports what it uses: the start of ``graphprof report`` is not spent on the diff or the exporters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.profile.test_serialize import small_profile

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys
from graphprof.cli import main
main(sys.argv[1:])
print(json.dumps({name: name in sys.modules for name in NAMES}), file=sys.stderr)
"""


def _imported(*argv: str, names: list[str] | None = None) -> dict[str, bool]:
    names = names or ["graphprof.analysis.diff", "graphprof.render.exporters", "graphprof.version", "numpy.ma",
                      "graphprof.analysis.distributed", "torch", "tabulate"]
    code = f"NAMES = {names!r}\n" + _PROBE
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stderr.strip().splitlines()[-1])  # printed last


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_a_view_imports_neither_the_diff_nor_the_exporters_nor_tabulate(tmp_path, command: str) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    imported = _imported(command, str(path))
    assert not any(imported.values()), imported


def test_diff_and_export_import_their_own_modules(tmp_path) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    diff = _imported("diff", str(path), str(path))
    assert diff["graphprof.analysis.diff"] and not diff["tabulate"]  # its simple tables are made without tabulate
    assert _imported("export", str(path), "-o", str(tmp_path / "p.folded"))["graphprof.render.exporters"]


def test_export_does_not_import_the_tables_options(tmp_path) -> None:
    """``analyze``'s table options (and the column names they check, with difflib) are built only for ``analyze``."""
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    names = ["graphprof.analysis.options", "difflib"]
    assert not any(_imported("export", str(path), "-o", str(tmp_path / "p.trace.json"), names=names).values())
    assert all(_imported("analyze", str(path), names=names).values())


def test_help_still_lists_every_command() -> None:
    done = subprocess.run([sys.executable, "-m", "graphprof", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0
    for command in ("demo", "analyze", "report", "calibrate", "export", "merge", "diff"):
        assert command in done.stdout
