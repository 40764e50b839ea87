"""Output size guards: names are clipped in exports, and a file far larger than its profile is refused."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.analyze_scale import synthetic_profile
from graphprof.cli import main
from graphprof.profile.model import Profile
from graphprof.render import streamed
from graphprof.render.export_options import ExportOptions
from graphprof.render.exporters import ExportError, export_profile, exporter_for
from graphprof.render.size_guard import EXPORT_TEXT_LIMIT, clip_profile_text, estimated_bytes, parse_size

#: Every format but SVG (Graphviz is slow and optional; DOT is its input).
FILES = ("t.trace.json", "t.trace.json.gz", "g.dot", "g.graphml", "g.nodelink.json", "s.folded", "r.html",
         "m.memory.svg")


def _with_nodes(profile: Profile, **fields: object) -> Profile:
    graph = profile.graphs[0]
    return replace(profile, graphs=(replace(graph, nodes=tuple(replace(n, **fields) for n in graph.nodes)),))


def test_a_huge_shared_name_and_a_huge_shape_stay_small_in_every_export(tmp_path: Path) -> None:
    """A 1 MB module name shared by every node and a 200,000-dimension shape: the issue's 5 GB trace."""
    huge = _with_nodes(synthetic_profile(200, 5), module="m" * 1_000_000)
    graph = huge.graphs[0]
    nodes = list(graph.nodes)
    nodes[3] = replace(nodes[3], in_shapes=((1,) * 200_000,), out_shapes=((2,) * 200_000,))
    huge = replace(huge, graphs=(replace(graph, nodes=tuple(nodes)),))
    source = tmp_path / "huge.json"
    huge.save(source)
    input_bytes = os.path.getsize(source)
    for name in FILES:
        out = tmp_path / name
        assert main(["export", str(source), "-o", str(out)]) == 0, name
        assert os.path.getsize(out) < 5 * input_bytes, name
    trace = json.loads((tmp_path / "t.trace.json").read_text())
    args = [e["args"] for e in trace["traceEvents"] if e.get("ph") == "X" and "module" in e.get("args", {})]
    assert args and all(len(a["module"]) == EXPORT_TEXT_LIMIT and "…" in a["module"] for a in args)
    assert any("(200000 dims)" in a["in_shapes"] for a in args)
    assert len(huge.graphs[0].nodes[0].module) == 1_000_000  # the profile itself is untouched


def test_an_export_over_the_limit_is_refused_with_the_flag_to_write_it(tmp_path: Path, capsys) -> None:
    source = tmp_path / "p.json"
    synthetic_profile(50, 5).save(source)
    out = tmp_path / "t.trace.json"
    assert main(["export", str(source), "-o", str(out), "--max-size", "10K"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-size" in err and "limit" in err and not out.exists()
    assert main(["export", str(source), "-o", str(out), "--max-size", "0"]) == 0 and out.exists()
    assert main(["export", str(source), "-o", str(tmp_path / "s.folded"), "--max-size", "1K"]) == 2  # after rendering
    assert not (tmp_path / "s.folded").exists()
    assert main(["export", str(source), "-o", str(out), "--max-size", "lots"]) == 2
    assert "--max-size takes a size" in capsys.readouterr().err


def test_the_default_limit_refuses_a_hostile_trace_before_rendering_it(tmp_path: Path, monkeypatch) -> None:
    """Long (clipped) names repeated over many steps: hundreds of MB from a profile of 400 KB."""
    long = "x" * 5000
    hostile = _with_nodes(synthetic_profile(200, 250), name=long, op=long, module=long, module_type=long,
                          source=long, scope=long)

    def never(profile: object, options: object, f: object) -> None:
        raise AssertionError("written although the estimate was over the limit")

    monkeypatch.setitem(streamed.STREAMED, "chrome", never)  # the trace is streamed: its writer is never called
    with pytest.raises(ExportError, match=r"the chrome export would be about .* over the 256 MiB limit"):
        export_profile(hostile, tmp_path / "t.trace.json")
    assert os.listdir(tmp_path) == []


def test_size_estimates_are_within_a_factor_of_two(tmp_path: Path) -> None:
    profile = synthetic_profile(400, 6)
    for fmt, name in (("chrome", "t.trace.json"), ("graphml", "g.graphml"), ("nodelink", "g.nodelink.json")):
        export_profile(profile, tmp_path / name)
        estimate, actual = estimated_bytes(profile, fmt), os.path.getsize(tmp_path / name)
        assert estimate is not None and actual / 2 < estimate < actual * 2, (fmt, estimate, actual)


@pytest.mark.parametrize("text, size", [("0", 0), ("500M", 500 * 2**20), ("2G", 2 * 2**30), ("1.5GiB", 3 * 2**29),
                                        ("123456", 123456), ("10k", 10240), ("64MB", 64 * 2**20),
                                        ("0.5", 1), ("0.1k", 103)])  # rounded up: never 0, "no limit"
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1", "G", "1X", "nan", "inf", "1e300"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="--max-size takes a size"):
        parse_size(text)


def _export_within(profile: Profile, out: Path, limit: int) -> None:
    """Export with a size limit; a streamed format is called past the size estimate, so the limit
    is checked on the bytes counted as they are written."""
    fmt = exporter_for(out.name).name
    write = streamed.STREAMED.get(fmt)
    if write is None:
        export_profile(profile, out, max_bytes=limit)
    else:
        streamed.write_streamed(str(out), fmt, write, profile, ExportOptions(), limit, limit)


@pytest.mark.parametrize("name", ["t.trace.json.gz", "g.graphml", "g.nodelink.json", "s.folded", "r.html"])
def test_the_limit_is_on_the_files_bytes_not_its_characters(name: str, tmp_path: Path) -> None:
    """Names of three-byte characters: one byte over the limit refuses, streamed or rendered whole
    (the trace is left out: it writes names as ASCII JSON escapes, so its characters are its bytes)."""
    profile = _with_nodes(synthetic_profile(40, 3), module="模块" * 30, name="节点")
    whole = tmp_path / f"whole.{name}"
    export_profile(profile, whole, max_bytes=0)
    size = os.path.getsize(whole)
    if not name.endswith(".gz"):
        assert len(whole.read_bytes().decode()) < size - 1  # counting characters would let it through
    out = tmp_path / name
    with pytest.raises(ExportError, match="over the"):
        _export_within(profile, out, size - 1)
    assert not out.exists()
    _export_within(profile, out, size)
    assert out.read_bytes() == whole.read_bytes()


def test_typed_attributes_are_clipped_as_text_and_kept_as_numbers(tmp_path: Path) -> None:
    """Op attributes hold counts and flags beside text: only the text is clipped, every export still writes."""
    from graphprof.render.size_guard import clip_profile_text

    long = "d" * (EXPORT_TEXT_LIMIT * 4)
    typed = _with_nodes(synthetic_profile(20, 2), attrs=(("blocking", True), ("bytes", 4096), ("devices", long),
                                                         ("ratio", 0.5)))
    clipped = dict(clip_profile_text(typed).graphs[0].nodes[0].attrs)
    assert len(clipped["devices"]) == EXPORT_TEXT_LIMIT and "…" in clipped["devices"]
    assert (clipped["blocking"], clipped["bytes"], clipped["ratio"]) == (True, 4096, 0.5)
    source = tmp_path / "typed.json"
    typed.save(source)
    for name in FILES:
        assert main(["export", str(source), "-o", str(tmp_path / name)]) == 0, name


def test_long_names_are_found_from_a_files_tables_and_unused_ones_clip_nothing(tmp_path: Path) -> None:
    """A loaded file's names are measured in its string tables: a long text there that no node uses
    clips nothing, one a node uses is clipped."""
    path = tmp_path / "p.json"
    synthetic_profile(200, 2).save(str(path))
    doc = json.loads(path.read_text())
    doc["graphs"][0]["strings"].append("u" * (EXPORT_TEXT_LIMIT + 1))
    path.write_text(json.dumps(doc))
    loaded = Profile.load(str(path))
    assert clip_profile_text(loaded) is loaded
    _with_nodes(synthetic_profile(200, 2), module="m" * (EXPORT_TEXT_LIMIT + 5)).save(str(path))
    loaded = Profile.load(str(path))
    assert {len(n.module) for n in clip_profile_text(loaded).graphs[0].nodes} == {EXPORT_TEXT_LIMIT}


@pytest.mark.parametrize("long_in_second", [False, True])
def test_a_loaded_profile_is_estimated_and_checked_from_its_tables_as_the_saved_one(
        long_in_second: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two graphs (the second's names long or not), sampled with a stride across them: the stored
    tables give the estimate and the long-name decision the node records give."""
    from graphprof.render import size_guard
    from graphprof.render.size_guard import clip_profile_text

    monkeypatch.setattr(size_guard, "ESTIMATE_SAMPLE_NODES", 7)

    base = synthetic_profile(300, 2, seed=0)
    graph = base.graphs[0]
    second = replace(graph, id=1, name="second", nodes=tuple(
        replace(n, module="m" * (EXPORT_TEXT_LIMIT + 5) if long_in_second and i == 7 else n.module)
        for i, n in enumerate(graph.nodes)))
    built = replace(base, graphs=(graph, second))
    built.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    for fmt in ("chrome", "graphml", "nodelink"):
        assert estimated_bytes(loaded, fmt) == estimated_bytes(built, fmt)
    assert (clip_profile_text(loaded) is loaded) == (clip_profile_text(built) is built) == (not long_in_second)
