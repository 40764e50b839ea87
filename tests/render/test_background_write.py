"""Writes from a second thread: every text in order, and a failure on either side leaves no half file."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest

from graphprof.render import graph_stream
from graphprof.render.background_write import background_writes
from graphprof.render.exporters import export_profile
from tests.render.export_profiles import synthetic_profile


class _Failing:
    """A file whose ``fail_at``-th write fails as a full disk does."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.texts = fail_at, []  # type: ignore[var-annotated]

    def write(self, text: str) -> int:
        if len(self.texts) == self.fail_at:
            raise OSError(28, "No space left on device")
        self.texts.append(text)
        return len(text)


def test_every_text_arrives_in_order_from_another_thread() -> None:
    f = io.StringIO()
    writers: set[str] = set()

    class Named(io.StringIO):
        def write(self, text: str) -> int:
            writers.add(threading.current_thread().name)
            return f.write(text)

    with background_writes(Named()) as out:
        for i in range(1000):
            out.write(f"{i},")
    assert f.getvalue() == "".join(f"{i}," for i in range(1000))
    assert writers == {"graphprof-writer"}


def test_a_failed_write_is_raised_in_the_caller() -> None:
    with pytest.raises(OSError, match="No space left"):
        with background_writes(_Failing(fail_at=3)) as out:
            for i in range(100):
                out.write(str(i))


def test_a_failure_in_the_caller_stops_the_thread_and_is_raised() -> None:
    sink = _Failing(fail_at=10**9)
    with pytest.raises(RuntimeError, match="formatting broke"):
        with background_writes(sink) as out:
            out.write("a")
            raise RuntimeError("formatting broke")
    assert all(t.name != "graphprof-writer" for t in threading.enumerate())  # joined before the error left
    assert sink.texts in ([], ["a"])


@pytest.mark.parametrize("filename", ["g.graphml", "g.nodelink.json"])
def test_a_writer_failing_mid_document_leaves_the_old_file(filename: str, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """The first block of nodes reached the file's thread, the edges never came: the user's file stays."""
    target = tmp_path / filename
    target.write_text("old")

    def broken(*args: object) -> None:
        raise RuntimeError("edges broke")

    monkeypatch.setattr(graph_stream.GraphRows, "edge_columns", broken)
    with pytest.raises(RuntimeError, match="edges broke"):
        export_profile(synthetic_profile(), target)
    assert target.read_text() == "old" and os.listdir(tmp_path) == [filename]
