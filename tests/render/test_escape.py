"""Hostile names through every sink: terminal, XML (SVG, GraphML), DOT; one-line errors; pipes and Ctrl-C."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from graphprof.cli import main
from graphprof.render.escape import dot_string, strip_control, terminal_line, terminal_text
from tests.profile.test_serialize import small_profile

#: What a terminal must never receive raw (newline and tab are checked separately).
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
HOSTILE = "evil\x1b]0;owned\x07\x1b[2J\x9b31m\x7f\u202egnp.exe\ud800\ufffe\uffff\nsecond line"


def _hostile_profile(tmp_path, name: str = HOSTILE, slower: int = 1, file: str = "hostile.json"):
    """The small profile with ``name`` in every name; ``slower`` multiplies its node times (a diff then changes)."""
    profile = small_profile()
    graph = profile.graphs[0]
    nodes = tuple(replace(n, name=name + str(n.id), module=name, scope=name, source=name, type=name + n.type,
                          host_time_ns=tuple(t * slower for t in n.host_time_ns)) for n in graph.nodes)
    hostile = replace(profile, graphs=(replace(graph, name=name, nodes=nodes),),
                      meta=replace(profile.meta, function=name, device_name=name))
    path = tmp_path / file
    hostile.save(str(path))
    return path


def _fake_lines(text: str) -> list[str]:
    """Lines a name's newline would have started (HOSTILE ends in ``\\nsecond line``)."""
    return [line for line in text.splitlines() if line.lstrip(" |-+│").startswith("second line")]


def test_terminal_escapes_show_every_control_character() -> None:
    line = terminal_line(HOSTILE)
    assert not UNSAFE.search(line) and "\n" not in line
    assert "\\x1b]0;owned\\x07" in line and "\\x9b" in line and "\\x7f" in line and "\\u202e" in line
    assert "\\ud800" in line and line.endswith("\\nsecond line")
    text = terminal_text("a\tb\nc\x1b[31m")
    assert text == "a\tb\nc\\x1b[31m"  # multi-line output keeps its lines and tabs
    assert terminal_line("plain ünïcode 名前") == "plain ünïcode 名前"


def test_xml_text_holds_only_characters_xml_allows() -> None:
    cleaned = strip_control("a\x00b\x1bc\ud800d\ufffee\uffff\U0001f600\tf")
    assert cleaned == "a b c\ufffdd\ufffde\ufffd\U0001f600\tf"
    ET.fromstring(f"<a t='{cleaned}'>{cleaned}</a>")


def test_dot_labels_are_clipped_below_graphviz_limit() -> None:
    label = dot_string("m" * 100_000)
    assert len(label) < 5000 and "\u2026" in label


@pytest.mark.parametrize("command", [["analyze"], ["analyze", "--aggregate-by", "module"], ["analyze", "--format", "csv"],
                                     ["report"], ["diff", "SELF"]])
def test_commands_never_print_control_characters(tmp_path, capsys, command: list[str]) -> None:
    path = str(_hostile_profile(tmp_path))
    args = [command[0], *(path if a == "SELF" else a for a in command[1:]), path]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert not UNSAFE.search(captured.out + captured.err)
    assert "\\x1b" in captured.out or command[0] == "diff"  # the names are shown, escaped


@pytest.mark.parametrize("command", [["analyze", "--wide"], ["analyze", "--format", "github"], ["report"],
                                     ["report", "--wide"], ["diff", "SLOWER"], ["diff", "SLOWER", "--aggregate-by", "module"]])
def test_a_name_cannot_start_a_line_of_its_own(tmp_path, capsys, command: list[str]) -> None:
    """Names are escaped where they enter text (table cells, prose lines), not only for control characters:
    a name's newline shows as ``\\n`` in every table, summary and report line, however wide."""
    path = str(_hostile_profile(tmp_path))
    slower = str(_hostile_profile(tmp_path, slower=3, file="slower.json"))
    args = [command[0], path, *(slower if a == "SLOWER" else a for a in command[1:])]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "\\nsecond line" in out  # the names are shown, escaped
    assert not _fake_lines(out) and not UNSAFE.search(out)


def test_the_python_api_text_escapes_names_as_the_commands_do(tmp_path) -> None:
    import graphprof

    profile = graphprof.load(str(_hostile_profile(tmp_path)))
    slower = graphprof.load(str(_hostile_profile(tmp_path, slower=3, file="slower.json")))
    texts = {"report": profile.report(), "table": profile.table(wide=True), "diff": profile.diff(slower),
             "module diff": profile.diff(slower, aggregate_by="module")}
    for what, text in texts.items():
        assert "\\nsecond line" in text, what
        assert not _fake_lines(text) and not UNSAFE.search(text), what


def test_xml_exports_of_hostile_names_parse(tmp_path) -> None:
    path = str(_hostile_profile(tmp_path))
    for name in ("g.graphml", "m.memory.svg", "g.svg", "r.html", "t.trace.json", "n.nodelink.json"):
        out = tmp_path / name
        assert main(["export", path, "-o", str(out)]) == 0, name
        if name.endswith((".graphml", ".svg")):
            text = out.read_text(encoding="utf-8")
            assert "\ufffe" not in text and "\uffff" not in text
            ET.parse(out)
        elif name.endswith(".json"):
            json.loads(out.read_text(encoding="utf-8"))


def test_a_12k_character_2000_level_module_path_still_exports_and_analyses(tmp_path, capsys) -> None:
    path = str(_hostile_profile(tmp_path, name="block." * 2000))
    out = tmp_path / "g.svg"
    assert main(["export", path, "-o", str(out), "--node-level"]) == 0
    ET.parse(out)
    for name in ("m.svg", "r.html", "g.graphml", "s.folded", "t.trace.json"):
        assert main(["export", path, "-o", str(tmp_path / name)]) == 0, name
    assert main(["analyze", path, "--aggregate-by", "module"]) == 0
    assert main(["report", path]) == 0


def test_error_messages_are_one_line_whatever_the_path(tmp_path, capsys) -> None:
    bad = tmp_path / "two\nlines\x1b[2J.json"
    bad.write_text("not json")
    assert main(["analyze", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not UNSAFE.search(err) and "two\\nlines\\x1b[2J" in err


def test_ctrl_c_exits_130_quietly(tmp_path, capsys, monkeypatch) -> None:
    import graphprof.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda command=None: parser)
    for action in parser._subparsers._group_actions[0].choices.values():
        action.set_defaults(func=interrupted)
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    assert main(["analyze", str(path)]) == 130
    assert capsys.readouterr().err == ""


def test_a_closed_pipe_exits_0_quietly(tmp_path) -> None:
    from benchmarks.analyze_scale import synthetic_profile

    path = tmp_path / "p.json"
    synthetic_profile(3000, 2).save(str(path))  # a table far larger than a pipe's buffer
    proc = subprocess.run(f"{sys.executable} -m graphprof analyze {path} -t 0 | head -1", shell=True,
                          capture_output=True, text=True, executable="/bin/bash")
    status = subprocess.run(f"{sys.executable} -m graphprof analyze {path} -t 0 | head -1; exit ${{PIPESTATUS[0]}}",
                            shell=True, capture_output=True, text=True, executable="/bin/bash")
    assert proc.stdout.count("\n") == 1 and proc.stderr == ""
    assert status.returncode == 0 and status.stderr == ""


def test_export_or_merge_onto_an_input_is_refused_and_the_input_kept(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    original = path.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(path)
    for args in (["export", str(path), "-o", str(path)], ["export", str(path), "-o", str(link), "--format", "chrome"],
                 ["merge", str(path), "-o", str(path)]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "would replace it" in err
    assert path.read_bytes() == original


@pytest.mark.parametrize("spacing", ["compact", "json.dump"])
def test_an_export_never_replaces_another_profile(tmp_path, capsys, spacing: str) -> None:
    """``.json`` is a Chrome trace's ending too: ``export a.json -o b.json`` must not turn the profile b into a trace."""
    source, other = tmp_path / "a.json", tmp_path / "b.json"
    small_profile().save(str(source))
    if spacing == "compact":
        small_profile().save(str(other))
    else:
        other.write_text(json.dumps(small_profile(), indent=2))
    original = other.read_bytes()
    for args in (["export", str(source), "-o", str(other)], ["export", str(source), "-o", str(other), "--format", "html"]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "holds a graphprof profile" in err and "would replace it" in err
    assert other.read_bytes() == original
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')  # an earlier export is replaced as before
    assert main(["export", str(source), "-o", str(trace)]) == 0
    assert "graphprof.profile" not in trace.read_text()[:100] and json.loads(trace.read_text())["traceEvents"]


def test_writes_keep_links_and_get_ordinary_modes(tmp_path) -> None:
    import os
    import stat

    real = tmp_path / "real.folded"
    real.write_text("old")
    link = tmp_path / "link.folded"
    link.symlink_to(real)
    profile_path = tmp_path / "p.json"
    small_profile().save(str(profile_path))
    assert main(["export", str(profile_path), "-o", str(link)]) == 0
    assert link.is_symlink() and real.read_text() != "old"
    mask = os.umask(0o022)
    os.umask(mask)
    for written in (real, profile_path):
        assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~mask, written
    assert not list(tmp_path.glob(".graphprof-*.tmp"))


def test_a_pipe_or_device_at_the_output_is_never_replaced(tmp_path, capsys) -> None:
    """``-o /dev/null`` used to rename a regular file over the device (with the rights to /dev: the system's);
    a named pipe stands in for it here. Every writer refuses, in one sentence, and leaves it as it was."""
    import os
    import stat

    from graphprof.profile.atomic import atomic_file
    from graphprof.profile.serialize import ProfileError
    from graphprof.render.exporters import export_profile

    source = tmp_path / "p.json"
    small_profile().save(str(source))
    for name in ("out.html", "out.trace.json", "out.json"):
        os.mkfifo(tmp_path / name)
    for name in ("out.html", "out.trace.json"):  # a rendered and a streamed format
        assert main(["export", str(source), "-o", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "device, pipe or socket" in err, err
    with pytest.raises(ProfileError, match="device, pipe or socket"):
        small_profile().save(str(tmp_path / "out.json"))
    with pytest.raises(OSError, match="device, pipe or socket"), atomic_file(str(tmp_path / "out.html")) as f:
        f.write("never")
    with pytest.raises(ValueError, match="device, pipe or socket"):  # the library's export too
        export_profile(small_profile(), tmp_path / "out.json", format="chrome")
    for name in ("out.html", "out.trace.json", "out.json"):
        assert stat.S_ISFIFO(os.stat(tmp_path / name).st_mode), name
    assert not list(tmp_path.glob(".graphprof-*"))
