"""How large a Chrome/Perfetto trace gets: bytes per node per profiled step, plain and gzip-compressed.

A trace holds one event per node per profiled step, so its size is about
nodes x steps x this figure. Measured on the synthetic transformer-shaped
profiles of ``analyze_scale`` (10,000 nodes by default) at 1 and at 10
profiled steps, and on a saved profile when one is given.

Usage: python -m benchmarks.trace_size [--nodes 10000] [--profile FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks.analyze_scale import synthetic_profile
from graphprof.profile.model import Profile
from graphprof.profile.model import load_profile
from graphprof.render.chrome_trace import bytes_per_node_step
from graphprof.render.exporters import export_profile


def _row(label: str, profile: Profile, directory: str) -> str:
    cells = []
    for suffix in (".trace.json", ".trace.json.gz"):
        path = os.path.join(directory, f"t{suffix}")
        start = time.perf_counter()
        export_profile(profile, path)
        took = time.perf_counter() - start
        size = os.path.getsize(path)
        cells.append(f"{size / 2**20:.2f} MiB, {bytes_per_node_step(profile, size):.0f} B | {took:.2f} s")
    return f"| {label} | {profile.node_count} | {len(profile.steps)} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--profile", help="also measure this saved profile")
    args = parser.parse_args(argv)
    print("| profile | nodes | steps | .trace.json: size, per node per step | export | "
          ".trace.json.gz: size, per node per step | export |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        for steps in (1, 10):
            print(_row("synthetic", synthetic_profile(args.nodes, steps), directory), flush=True)
        if args.profile:
            print(_row(os.path.basename(args.profile), load_profile(args.profile), directory))


if __name__ == "__main__":
    main()
