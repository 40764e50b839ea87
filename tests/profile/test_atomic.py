"""The one atomic writer: no stray temporary file on any path, signals included, and stale ones cleaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphprof.profile.atomic import STALE_AFTER_S, TEMP_PREFIX, atomic_file, remove_stale_temporaries
from tests.distributed.synthetic import rank_profile
from tests.profile.test_serialize import small_profile

REPO = Path(__file__).resolve().parents[2]

#: A child that runs one write and stops inside it: os.replace says "ready" and waits for a signal,
#: so the signal lands while the complete temporary file exists and the target is still the old one.
CHILD = """
import os, sys, time
real_replace = os.replace
def paused_replace(src, dst):
    print("ready", flush=True)
    time.sleep(60)
    real_replace(src, dst)
os.replace = paused_replace
what, args = sys.argv[1], sys.argv[2:]
if what == "save":
    import graphprof
    graphprof.load(args[0]).save(args[1])
else:
    from graphprof.cli import main
    sys.exit(main([what, *args]))
"""


def _temporaries(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(TEMP_PREFIX)]


def _stop_during_write(args: list[str], signum: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line == "ready\n", child.communicate()[1]
    child.send_signal(signum)
    child.communicate(timeout=60)
    return child.returncode


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    paths = {"profile": tmp_path / "p.json", "rank0": tmp_path / "r0.json", "rank1": tmp_path / "r1.json"}
    small_profile().save(paths["profile"])
    rank_profile(0).save(paths["rank0"])
    rank_profile(1).save(paths["rank1"])
    return paths


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("what", ["save", "merge", "export"])
def test_a_signal_during_a_write_leaves_the_old_file_and_no_temporary(
        what: str, signum: int, inputs: dict[str, Path], tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / ("t.trace.json" if what == "export" else "out.json")
    target.write_text("old")
    args = {"save": [str(inputs["profile"]), str(target)],
            "merge": [str(inputs["rank0"]), str(inputs["rank1"]), "-o", str(target)],
            "export": [str(inputs["profile"]), "-o", str(target)]}[what]
    rc = _stop_during_write([what, *args], signum)
    assert target.read_text() == "old" and _temporaries(out_dir) == []
    if signum == signal.SIGINT:
        assert rc == (-signum if what == "save" else 130)  # save: Python's own end on Ctrl-C; the CLI: 128 + 2
    else:
        assert rc == -signum  # ended by the signal, as without graphprof, after cleaning up


def test_a_write_that_fails_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as f:
            f.write("half")
            raise RuntimeError("renderer crashed")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["t.txt"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporaries_of_killed_writes_are_removed_by_the_next_write(tmp_path: Path) -> None:
    """SIGKILL cannot be caught: the next write in the directory removes what is clearly ours and dead."""
    old = time.time() - STALE_AFTER_S - 60
    dead, alive = _dead_pid(), os.getpid()
    files = {
        f"{TEMP_PREFIX}{dead}-abc123.tmp": (old, False),  # ours, old, its process gone: removed
        f"{TEMP_PREFIX}{dead}-recent.tmp": (time.time(), True),  # may still be written (another host): kept
        f"{TEMP_PREFIX}{alive}-abc123.tmp": (old, True),  # its process runs: kept
        f"{TEMP_PREFIX}abc123.tmp": (old, True),  # not our name pattern: kept
        "notes.tmp": (old, True),
    }
    for name, (mtime, _) in files.items():
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (mtime, mtime))
    small_profile().save(tmp_path / "p.json")
    kept = {name for name, (_, keep) in files.items() if keep}
    assert set(os.listdir(tmp_path)) == kept | {"p.json"}
    assert remove_stale_temporaries(str(tmp_path)) == []


def test_a_link_stays_a_link_and_files_get_the_umask_mode(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    mask = os.umask(0o027)
    try:
        small_profile().save(link)
    finally:
        os.umask(mask)
    assert link.is_symlink() and real.read_text().startswith('{"schema"')
    assert os.stat(real).st_mode & 0o777 == 0o640


def test_a_new_profile_file_gets_the_umask_mode_not_mkstemps(tmp_path: Path) -> None:
    # The temporary file is made by mkstemp (0600); the saved profile must have the mode of any new file.
    target = tmp_path / "new.json"
    mask = os.umask(0o022)
    try:
        small_profile().save(target)
    finally:
        os.umask(mask)
    assert os.stat(target).st_mode & 0o777 == 0o644
