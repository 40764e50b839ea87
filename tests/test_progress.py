"""Status lines: on a terminal only, erased when the stage ends, quiet when asked."""

from __future__ import annotations

import io

import pytest

from graphprof import progress
from graphprof.cli import main
from tests.data.make_small_profile import build


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_stage_shows_one_line_on_a_terminal_and_erases_it(monkeypatch: pytest.MonkeyPatch) -> None:
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    monkeypatch.delenv("GRAPHPROF_PROGRESS", raising=False)
    progress.set_quiet(False)
    with progress.stage("capturing step"):
        assert term.getvalue() == "\rgraphprof: capturing step ..."
    assert term.getvalue().endswith("\r\033[K")


@pytest.mark.parametrize("how", ["pipe", "env", "quiet"])
def test_quiet_off_a_terminal_or_when_asked(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    stream = io.StringIO() if how == "pipe" else _Terminal()
    monkeypatch.setattr("sys.stderr", stream)
    if how == "env":
        monkeypatch.setenv("GRAPHPROF_PROGRESS", "0")
    progress.set_quiet(how == "quiet")
    try:
        with progress.stage("loading p.json"):
            pass
    finally:
        progress.set_quiet(False)
    assert stream.getvalue() == ""


def test_cli_quiet_flag_keeps_stderr_empty_on_a_terminal(monkeypatch, tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    build().save(str(path))
    monkeypatch.delenv("GRAPHPROF_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "enabled", lambda: not progress._quiet)  # pytest's stderr is no terminal
    assert main(["-q", "report", str(path)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["report", str(path)]) == 0
    assert "graphprof: loading" in capsys.readouterr().err
