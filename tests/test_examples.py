"""The example scripts run as a user runs them (they are copied, so they must keep working).

Each runs in a fresh interpreter in a temporary folder; the distributed ones spawn two
gloo ranks on loopback and merge their profiles, which is what the README shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphprof
from graphprof.profile.merge import graph_ranks, is_merged

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("script, saved", [("train_resnet.py", "resnet_profile.json"),
                                           ("train_gpt.py", "gpt_profile.json")])
def test_single_process_examples_save_a_profile(tmp_path: Path, script: str, saved: str) -> None:
    _run(script, cwd=tmp_path)
    assert graphprof.load(str(tmp_path / saved)).node_count > 0


@pytest.mark.slow
@pytest.mark.parametrize("script, folder", [("ddp_train.py", "ddp_profiles"), ("fsdp_train.py", "fsdp_profiles")])
def test_distributed_examples_merge_their_ranks(tmp_path: Path, script: str, folder: str) -> None:
    out = _run(script, "--nproc", "2", "--steps", "4", cwd=tmp_path)
    merged = graphprof.load(str(tmp_path / folder / "merged.json"))
    assert is_merged(merged) and set(graph_ranks(merged).values()) == {0, 1}
    assert "merged.json" in out
