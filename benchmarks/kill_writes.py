"""Kill graphprof in the middle of its writes: is any target ever corrupt, is any temporary file left?

Each trial starts one writing command on a profile large enough that its write
takes a while (``Profile.save`` from Python, ``graphprof merge -o`` and
``graphprof export`` to a Chrome trace, each over an existing target), waits a
random time within the command's measured duration and sends SIGTERM,
SIGINT, SIGHUP or SIGKILL. After each trial the target must be either the old
file, byte for byte, or a complete new one that parses; temporary files
(``.graphprof-*.tmp``) are counted. SIGKILL cannot be caught, so its
temporary files are expected: they are then aged past
``atomic.STALE_AFTER_S`` and one more write in the directory must remove
every one of them.

Usage: python -m benchmarks.kill_writes [--trials 60] [--nodes 40000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

from benchmarks.analyze_scale import synthetic_profile
from graphprof.profile.atomic import STALE_AFTER_S, TEMP_PREFIX

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)
SAVE = "import graphprof, sys; graphprof.load(sys.argv[1]).save(sys.argv[2])"


def _commands(work: str) -> dict[str, tuple[list[str], str]]:
    py = [sys.executable]
    return {
        "save": ([*py, "-c", SAVE, os.path.join(work, "p.json"), os.path.join(work, "out", "saved.json")],
                 os.path.join(work, "out", "saved.json")),
        "merge": ([*py, "-m", "graphprof", "merge", os.path.join(work, "r0.json"), os.path.join(work, "r1.json"),
                   "-o", os.path.join(work, "out", "merged.json")], os.path.join(work, "out", "merged.json")),
        "export": ([*py, "-m", "graphprof", "export", os.path.join(work, "p.json"), "-o",
                    os.path.join(work, "out", "t.trace.json")], os.path.join(work, "out", "t.trace.json")),
    }


def _rank(profile, rank: int):
    from dataclasses import replace

    from graphprof.profile.records import DistributedInfo

    info = DistributedInfo(rank=rank, world_size=2, backend="gloo")
    return replace(profile, meta=replace(profile.meta, distributed=info))


def _intact(path: str, old: bytes) -> bool:
    with open(path, "rb") as f:
        data = f.read()
    if data == old:
        return True
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def run(trials: int, nodes: int, seed: int) -> Counter:
    rng = random.Random(seed)
    tally: Counter = Counter({"corrupt target": 0, "traceback": 0})
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    with tempfile.TemporaryDirectory() as work:
        os.mkdir(os.path.join(work, "out"))
        profile = synthetic_profile(nodes, 5)
        profile.save(os.path.join(work, "p.json"))
        _rank(profile, 0).save(os.path.join(work, "r0.json"))
        _rank(profile, 1).save(os.path.join(work, "r1.json"))
        commands = _commands(work)
        durations = {}
        for name, (argv, target) in commands.items():  # how long each takes, uninterrupted
            start = time.perf_counter()
            subprocess.run(argv, env=env, check=True, capture_output=True)
            durations[name] = time.perf_counter() - start
        for i in range(trials):
            name = rng.choice(sorted(commands))
            argv, target = commands[name]
            with open(target, "wb") as f:
                f.write(b"old")
            signum = rng.choice(SIGNALS)
            child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(rng.uniform(0.3, 1.0) * durations[name])
            child.send_signal(signum)
            err = child.communicate()[1].decode(errors="replace")
            tally["trials"] += 1
            tally[f"{name} {signal.Signals(signum).name}"] += 1
            if not _intact(target, b"old"):
                tally["corrupt target"] += 1
            if "Traceback" in err and signum != signal.SIGINT and name != "save":
                tally["traceback"] += 1
            strays = [n for n in os.listdir(os.path.dirname(target)) if n.startswith(TEMP_PREFIX)]
            key = "temporary files left by SIGKILL" if signum == signal.SIGKILL else "temporary files left"
            tally[key] += len(strays) - tally["_known"]
            tally["_known"] = len(strays)
        out = os.path.join(work, "out")
        old = time.time() - STALE_AFTER_S - 1
        for n in os.listdir(out):
            if n.startswith(TEMP_PREFIX):
                os.utime(os.path.join(out, n), (old, old))
        profile.save(os.path.join(out, "last.json"))
        tally["temporary files after the next write"] = sum(n.startswith(TEMP_PREFIX) for n in os.listdir(out))
    del tally["_known"]
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--nodes", type=int, default=40_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tally = run(args.trials, args.nodes, args.seed)
    for key, count in sorted(tally.items(), key=lambda kv: kv[0]):
        print(f"{count:6d}  {key}")
    bad = tally["corrupt target"] + tally["temporary files left"] + tally["temporary files after the next write"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
