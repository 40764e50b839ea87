"""How the ``graphprof`` process loads profiles: the allocator is tuned only where the process ends with the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphprof.cli import loading
from tests.profile.test_serialize import small_profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kept", [False, True])
def test_the_allocator_keeps_freed_memory_only_for_a_process_that_ends_with_its_command(
        tmp_path, monkeypatch, kept: bool) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    calls: list[None] = []
    monkeypatch.setattr(loading, "_keep_freed_memory", lambda: calls.append(None))
    monkeypatch.setattr(loading, "_held", [] if kept else None)
    try:
        profile = loading.load_frozen(str(path))
    finally:
        loading.thaw()
    assert profile == small_profile()
    assert len(calls) == (1 if kept else 0)  # a library caller's (a test's, a notebook's) allocator is left alone
    if kept:
        assert loading._held == [profile]


def test_a_command_run_as_the_process_loads_with_the_tuned_allocator(tmp_path) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    code = "import sys; from graphprof.cli import run; sys.argv = ['graphprof', 'analyze', sys.argv[1]]; run()"
    done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "profile" in done.stdout and not done.stderr


_THREADS_AFTER_IMPORT = """
import os, sys
import graphprof.__main__ as entry
entry.one_blas_thread()
import numpy
print(len(os.listdir("/proc/self/task")), os.environ.get(entry.BLAS_THREADS))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_the_command_imports_numpy_without_blas_threads_and_leaves_the_environment_as_it_was() -> None:
    """OpenBLAS starts a thread per core when numpy loads; the command's process has one thread only."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", _THREADS_AFTER_IMPORT], cwd=ROOT, capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "None"]  # one thread; the variable is gone for what runs later


def test_python_m_graphprof_is_the_graphprof_command(tmp_path) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    done = subprocess.run([sys.executable, "-m", "graphprof", "analyze", str(path)], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "profile" in done.stdout and not done.stderr
