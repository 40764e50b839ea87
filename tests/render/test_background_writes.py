"""Streamed exports write from a second thread: the same bytes, and failures on either side stop both cleanly."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from graphprof.api import Profile
from graphprof.render import chrome_stream, streamed
from graphprof.render.chrome_trace import chrome_trace_json
from graphprof.render.exporters import ExportError, export_profile, node_bounds
from graphprof.render.graphml import graphml_text, node_link_json
from tests.render.export_profiles import hostile_profile, synthetic_profile

FORMATS = {"t.trace.json": "chrome", "t.trace.json.gz": "chrome-gz", "g.graphml": "graphml",
           "g.nodelink.json": "nodelink"}


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "graphprof-writer"]


class _FullDisk:
    """A file whose writes fail with ENOSPC from the ``fail_at``-th on, recording which thread wrote."""

    def __init__(self, f: IO[Any], fail_at: int) -> None:
        self.f, self.fail_at, self.calls, self.threads = f, fail_at, 0, set()

    def write(self, data: Any) -> int:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.calls >= self.fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(data)  # type: ignore[no-any-return]


@pytest.mark.parametrize("filename", list(FORMATS))
def test_a_write_failing_in_the_writing_thread_leaves_the_old_file_and_says_why(
        filename: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(chrome_stream, "CHUNK_EVENTS", 2)  # many writes, so the failure comes mid-document
    files: list[_FullDisk] = []
    real_atomic_file = streamed.atomic_file

    @contextmanager
    def failing_atomic_file(path: str, binary: bool = False) -> Iterator[_FullDisk]:
        with real_atomic_file(path, binary=binary) as f:
            files.append(_FullDisk(f, fail_at=2))
            yield files[-1]

    monkeypatch.setattr(streamed, "atomic_file", failing_atomic_file)
    target = tmp_path / filename
    target.write_bytes(b"old")
    with pytest.raises(ExportError) as caught:
        export_profile(synthetic_profile(), target, format=FORMATS[filename])
    assert str(caught.value) == f"cannot write {target}: {os.strerror(errno.ENOSPC)}"
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == [filename]
    assert files[0].threads == {"graphprof-writer"}  # the file was written from the second thread
    assert files[0].calls == 2  # nothing was written after the failed write
    assert not _writer_threads()


@pytest.mark.parametrize("error", [RuntimeError("formatting failed"), KeyboardInterrupt()])
def test_a_failure_while_making_the_text_stops_the_writing_thread_first(
        error: BaseException, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    original = streamed.STREAMED["chrome"]
    seen: list[bool] = []

    def write_then_fail(profile: Profile, options: object, f: Any) -> None:
        original(profile, options, f)  # type: ignore[arg-type]
        seen.append(bool(_writer_threads()))
        raise error

    monkeypatch.setitem(streamed.STREAMED, "chrome", write_then_fail)
    target = tmp_path / "t.trace.json"
    target.write_text("old")
    with pytest.raises(type(error)):
        export_profile(synthetic_profile(), target)
    assert seen == [True] and not _writer_threads()  # the thread ran, and was gone before the file was removed
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["t.trace.json"]


def test_blocks_queued_behind_a_slow_write_are_all_written_in_order(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    profile = synthetic_profile()
    export_profile(profile, tmp_path / "whole.trace.json")
    monkeypatch.setattr(streamed, "QUEUE_BLOCKS", 1)  # the caller waits on the thread at every block
    monkeypatch.setattr(chrome_stream, "CHUNK_EVENTS", 3)
    export_profile(profile, tmp_path / "blocks.trace.json")
    assert (tmp_path / "blocks.trace.json").read_text() == (tmp_path / "whole.trace.json").read_text()
    assert not _writer_threads()


@pytest.mark.parametrize("filename", ["g.graphml", "g.nodelink.json", "t.trace.json"])
def test_the_file_holds_the_text_as_a_utf8_text_file_would(filename: str, tmp_path: Path) -> None:
    """Non-ASCII names as UTF-8 and a lone surrogate as its backslash escape: what the text-mode atomic
    file wrote before the text was encoded for the writing thread."""
    profile = hostile_profile()
    graph = profile.graphs[0]
    odd = "caf\u00e9 \u2603 \udc80"
    profile = dataclasses.replace(profile, graphs=(dataclasses.replace(graph, nodes=tuple(
        dataclasses.replace(n, name=odd + n.name, module=odd) for n in graph.nodes)),))
    text = {"g.graphml": graphml_text, "g.nodelink.json": node_link_json,
            "t.trace.json": lambda p: chrome_trace_json(p, bounds=node_bounds(p, "median"))}[filename](profile)
    export_profile(profile, tmp_path / filename)
    assert (tmp_path / filename).read_bytes() == text.encode("utf-8", "backslashreplace")


def test_abandoning_with_a_full_queue_waits_for_the_write_under_way_and_drops_the_rest() -> None:
    """The caller fails while the thread is stuck in a slow write and the queue is full: ``abandon`` neither
    deadlocks nor lets the queued blocks reach the file."""
    release, written = threading.Event(), []

    def slow_write(data: bytes) -> None:
        release.wait(10)
        written.append(data)

    sink = streamed._Background(slow_write)
    for i in range(streamed.QUEUE_BLOCKS + 1):  # one in the slow write, the queue full behind it
        sink.write(f"block {i}")
    threading.Timer(0.2, release.set).start()
    sink.abandon()
    assert written == [b"block 0"] and not _writer_threads()


@pytest.mark.parametrize("filename", ["g.graphml", "g.nodelink.json"])
def test_a_writer_failing_mid_document_leaves_the_old_file(filename: str, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """The first block of nodes reached the writing thread, the edges never came: the user's file stays."""
    from graphprof.render import graph_stream

    target = tmp_path / filename
    target.write_text("old")

    def broken(*args: object) -> None:
        raise RuntimeError("edges broke")

    monkeypatch.setattr(graph_stream.GraphRows, "edge_columns", broken)
    with pytest.raises(RuntimeError, match="edges broke"):
        export_profile(synthetic_profile(), target)
    assert target.read_text() == "old" and os.listdir(tmp_path) == [filename]
    assert not _writer_threads()
