"""Choosing a format by file name, atomic writes, clear errors, the CLI and Profile.export."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from graphprof.api import Profile
from graphprof.cli import main
from graphprof.render import exporters
from graphprof.render.exporters import FORMATS, ExportError, export_profile, exporter_for
from tests.render.export_profiles import empty_profile, synthetic_profile

HAS_DOT = shutil.which("dot") is not None
FILE_FOR = {"chrome": "p.trace.json", "chrome-gz": "p.trace.json.gz", "dot": "p.dot", "svg": "p.svg", "graphml": "p.graphml", "nodelink": "p.nodelink.json",
            "folded": "p.folded", "html": "p.html", "memory-svg": "step.memory.svg"}


@pytest.mark.parametrize("filename, name", [
    ("run.trace.json", "chrome"), ("run.json", "chrome"), ("g.dot", "dot"), ("g.gv", "dot"), ("g.svg", "svg"),
    ("G.SVG", "svg"), ("g.graphml", "graphml"), ("g.nodelink.json", "nodelink"), ("s.folded", "folded"),
    ("r.html", "html"), ("memory.svg", "memory-svg"), ("step.memory.svg", "memory-svg"), ("out/dir.v2/x.trace.json", "chrome"),
])
def test_the_longest_matching_ending_wins(filename: str, name: str) -> None:
    assert exporter_for(filename).name == name


def test_every_format_has_one_writer() -> None:
    """A format is rendered (``render``) or streamed (``streamed.STREAMED``), never both, never neither."""
    from graphprof.render.streamed import STREAMED

    for name, exporter in exporters.EXPORTERS.items():
        assert (exporter.render is None) == (name in STREAMED), name
    assert set(STREAMED) <= set(exporters.EXPORTERS)


def test_format_overrides_the_name_and_unknown_ones_are_named() -> None:
    assert exporter_for("report.txt", "html").name == "html"
    assert exporter_for("x.svg", "memory-svg").name == "memory-svg"
    with pytest.raises(ExportError, match="unknown export format 'pdf'; choose one of chrome, chrome-gz, dot"):
        exporter_for("x.pdf", "pdf")
    with pytest.raises(ExportError, match="cannot tell the format of x.pdf"):
        exporter_for("x.pdf")


def _render_cases() -> list:
    cases = []
    for fmt in FORMATS:
        marks = []
        if fmt == "svg" and not HAS_DOT:
            marks.append(pytest.mark.skip(reason="Graphviz's dot is not installed (apt-get install graphviz)"))
        cases.append(pytest.param(fmt, marks=marks))
    return cases


@pytest.mark.parametrize("fmt", _render_cases())
@pytest.mark.parametrize("which", ["empty", "real"])
def test_every_exporter_runs_on_an_empty_and_a_real_profile(fmt: str, which: str, real: Profile, tmp_path: Path) -> None:
    profile = empty_profile() if which == "empty" else real
    path = tmp_path / FILE_FOR[fmt]
    assert profile_export(profile, path) == fmt
    data = path.read_bytes()
    text = (gzip.decompress(data) if fmt == "chrome-gz" else data).decode("utf-8")
    assert text.strip() or (fmt == "folded" and which == "empty")  # no nodes, no stacks
    if fmt in ("chrome", "chrome-gz", "nodelink"):
        json.loads(text)
    if fmt in ("svg", "memory-svg", "graphml", "html"):
        assert text.lstrip().startswith("<")
    if which == "real" and fmt == "folded":
        assert len(text.splitlines()) > 10


def profile_export(profile: Profile, path: Path) -> str:
    return Profile.export(profile, path) if isinstance(profile, Profile) else export_profile(profile, path)


def test_memory_svg_suffix_reaches_the_memory_renderer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The wiring: the suffix and ``graph_id`` reach the memory renderer."""
    import types

    calls = []
    fake = types.ModuleType("graphprof.render.memory_svg")
    fake.memory_timeline_svg = lambda profile, graph_id=0: calls.append(graph_id) or "<svg/>"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "graphprof.render.memory_svg", fake)
    assert export_profile(synthetic_profile(), tmp_path / "m.memory.svg", graph_id=0) == "memory-svg"
    assert calls == [0] and (tmp_path / "m.memory.svg").read_text() == "<svg/>"


def test_writes_are_atomic_and_files_are_ordinary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    target.write_text("old report")

    def broken(profile: object, options: object) -> str:
        raise RuntimeError("renderer crashed")

    monkeypatch.setitem(exporters.EXPORTERS, "html", replace(exporters.EXPORTERS["html"], render=broken))
    with pytest.raises(RuntimeError):
        export_profile(synthetic_profile(), target)
    assert target.read_text() == "old report" and os.listdir(tmp_path) == ["r.html"]
    monkeypatch.undo()
    export_profile(synthetic_profile(), target)
    assert target.read_text().startswith("<!DOCTYPE html>") and os.listdir(tmp_path) == ["r.html"]
    mode = stat.S_IMODE(os.stat(target).st_mode)
    assert mode & stat.S_IRGRP or os.umask(0o022) & 0o040  # readable like any file the user writes


@pytest.mark.parametrize("relative, message", [
    ("missing/r.html", "directory .* does not exist"), (".", "it is a directory"),
])
def test_bad_paths_are_one_sentence(relative: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=message) as info:
        export_profile(synthetic_profile(), tmp_path / relative)
    assert "\n" not in str(info.value)


def test_unknown_options_and_statistics_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="unknown export option"):
        export_profile(synthetic_profile(), tmp_path / "a.dot", colour="red")
    with pytest.raises(ValueError, match="unknown statistic"):
        export_profile(synthetic_profile(), tmp_path / "a.dot", stat="p99")


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "prof.json"
    synthetic_profile().save(saved)
    out = tmp_path / "g.dot"
    assert main(["export", str(saved), "-o", str(out), "--module-level", "--stat", "max"]) == 0
    assert "module level" in out.read_text() and "(max of 3 steps)" in out.read_text()
    assert main(["export", str(saved), "-o", str(tmp_path / "whatever.txt"), "--format", "folded"]) == 0
    assert (tmp_path / "whatever.txt").read_text().startswith("forward;fc1;mm")
    assert main(["export", str(saved), "-o", str(tmp_path / "h.dot"), "--hide-views", "--node-level"]) == 0
    assert "t_2" not in (tmp_path / "h.dot").read_text() and "n0_2 " not in (tmp_path / "h.dot").read_text()
    capsys.readouterr()
    for args in (["-o", str(tmp_path / "nope" / "x.html")], ["-o", str(tmp_path / "x.pdf")]):
        assert main(["export", str(saved), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("graphprof: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert main(["export", str(tmp_path / "absent.json"), "-o", str(tmp_path / "x.html")]) == 2
    assert "no such profile file" in capsys.readouterr().err


def test_cli_export_never_imports_torch(tmp_path: Path) -> None:
    saved = tmp_path / "prof.json"
    synthetic_profile().save(saved)
    code = (
        "import sys\nfrom graphprof.cli import main\n"
        f"for name in ('r.html', 'r.trace.json', 'r.graphml', 'r.folded', 'r.dot'):\n"
        f"    assert main(['export', {str(saved)!r}, '-o', {str(tmp_path)!r} + '/' + name]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_bounds_and_findings_are_those_of_the_roofline_points(real: Profile) -> None:
    """``with_analysis`` reads the roofline's arrays, not a point per node: the same bounds and findings."""
    from graphprof.analysis.advisor import advise
    from graphprof.analysis.roofline import Bound, roofline

    peaks = {"flops_per_s": 1e11, "bytes_per_s": 2e10}
    for profile in (synthetic_profile(), real, replace(real, meta=replace(real.meta, peaks=peaks))):
        for stat_name in ("median", "max"):
            points = roofline(profile, stat=stat_name)
            options = exporters.with_analysis(profile, exporters.ExportOptions(stat=stat_name))
            assert options.bounds == ({(p.graph_id, p.node_id): p.bound.value for p in points
                                       if p.bound is not Bound.UNKNOWN} or None)
            assert options.findings == tuple(advise(profile, stat=stat_name, points=points))
    given = exporters.ExportOptions(bounds={(0, 1): "memory"}, findings=[])
    assert exporters.with_analysis(synthetic_profile(), given) == replace(given, findings=())
