"""The gzip-compressed trace: the same events as the plain one, reproducible bytes, its size stated."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from graphprof.api import Profile
from graphprof.cli import main
from graphprof.render.chrome_trace import bytes_per_node_step, chrome_trace, node_events
from graphprof.render.exporters import export_profile
from tests.render.export_profiles import HOSTILE, empty_profile, make_profile, node


def test_gzip_trace_loads_back_as_the_same_events(real: Profile, tmp_path: Path) -> None:
    plain, packed = tmp_path / "p.trace.json", tmp_path / "p.trace.json.gz"
    assert export_profile(real, plain) == "chrome" and export_profile(real, packed) == "chrome-gz"
    data = packed.read_bytes()
    assert data[:2] == b"\x1f\x8b"  # gzip magic: Perfetto and chrome://tracing sniff it
    with gzip.open(packed, "rt", encoding="utf-8") as f:
        loaded = json.load(f)
    assert loaded == json.loads(plain.read_text(encoding="utf-8"))
    assert sum(1 for e in loaded["traceEvents"] if e["ph"] == "X" and e.get("cat") != "step") == node_events(real)
    assert len(data) < plain.stat().st_size / 5
    assert data == gzip.compress(plain.read_bytes(), 6, mtime=0)  # streamed, yet one deflate of the whole text


def test_same_profile_same_bytes_and_hostile_names_survive(tmp_path: Path) -> None:
    p = make_profile([node(0, HOSTILE, module=HOSTILE, times=(1e-3, 2e-3))])
    a, b = tmp_path / "a.json.gz", tmp_path / "b.trace.json.gz"
    export_profile(p, a)
    export_profile(p, b)
    assert a.read_bytes() == b.read_bytes()
    events = json.loads(gzip.decompress(a.read_bytes()))["traceEvents"]
    assert [e["args"]["module"] for e in events if e.get("cat") == "forward"] == [HOSTILE, HOSTILE]


def test_size_per_node_per_step(real: Profile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bytes_per_node_step(empty_profile(), 100) is None
    saved, out = tmp_path / "real.json", tmp_path / "real.trace.json.gz"
    real.save(str(saved))
    assert main(["export", str(saved), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    per = out.stat().st_size / node_events(real)
    assert "(chrome-gz, " in err and f"{per:.0f} bytes per node per step" in err


def test_node_events_count_device_samples_where_a_node_has_them_else_host_samples() -> None:
    nodes = [node(0, "mm", times=(1e-3, 2e-3, 3e-3)), node(1, "add", times=(1e-3,), device_time_ns=(5, 6)),
             node(2, "relu", times=(1e-3, 1e-3), device_time_ns=()), node(3, "view", times=())]
    profile = make_profile(nodes, steps=3)
    assert node_events(profile) == 3 + 2 + 2 + 0
    events = chrome_trace(profile)["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e.get("cat") != "step") == node_events(profile)
