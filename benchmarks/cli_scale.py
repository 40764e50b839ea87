"""Every command that reads a saved profile, on large synthetic profiles: time and peak memory.

For each size it writes two synthetic profiles (``analyze_scale``'s
transformer-shaped generator, seeds 0 and 1: same graph, different times)
and runs, each as its own process with the interpreter start counted,

* ``graphprof analyze FILE -t 20``, ``graphprof report FILE`` and
  ``graphprof diff FILE FILE2``;
* ``graphprof export FILE -o OUT`` for every export format (unless
  ``--no-exports``);
* a reference: ``REFERENCE``, no graphprof code, to read the machine's speed by.

Per command: the median wall time, the median CPU time (user + sys, which a
loaded machine disturbs less than wall time) and the peak resident memory
(``ru_maxrss`` of that process, from ``os.wait4``; this process stays small,
since a child's peak counts its parent's resident memory at the fork). Targets: every command
at most 1.5 s at 100,000 nodes; analyze, report and diff at 1,000,000 nodes
at most 15 s and 4 GiB.

The commands take turns (each command's first run, then each one's second,
...), so that a burst of load on a shared machine slows one run of several
commands rather than every run of one.

Each export writes a new file (the last run's output is removed first, outside
the timing), as a first export does. ``--overwrite`` times replacing the
existing file instead: on ext4 the atomic writer's rename over an existing
file makes the kernel write the new file's data out first (``auto_da_alloc``),
which adds up to half a second at 100,000 nodes; that is the price of never
leaving a half-written file after a crash, and is reported apart.

Usage: python -m benchmarks.cli_scale [--nodes 10000 100000] [--repeat 3] [--no-exports] [--steps 5] [--overwrite]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


#: Export formats and the file name each is written to.
EXPORTS = (("chrome", "out.trace.json"), ("dot", "out.dot"), ("graphml", "out.graphml"),
           ("nodelink", "out.nodelink.json"), ("folded", "out.folded"), ("html", "out.html"),
           ("memory-svg", "out.memory.svg"))
#: Work that involves no graphprof code (the interpreter, numpy's import, JSON and list passes of
#: the kinds a load makes), timed in the same turns as the commands: this shared machine's speed
#: moves by more than half between days (``analyze`` of 100,000 nodes read 0.54 s in the sixth
#: round and 0.87 to 0.91 s in the twelfth, on code that reads profiles the same way), and the
#: reference row tells a slower machine apart from slower code.
REFERENCE = ("import json, numpy\n"
             "doc = json.dumps({'c': [list(range(i, i + 100_000)) for i in range(6)], 'n': ['x%d' % i for i in range(100_000)]})\n"
             "for _ in range(3): numpy.array(json.loads(doc)['c'], dtype=numpy.int64).sum()")
WALL_TARGET_100K_S = 1.5
WALL_TARGET_1M_S = 15.0
RSS_TARGET_1M_BYTES = 4 * 2**30


@dataclass(frozen=True)
class CommandResult:
    nodes: int
    command: str
    wall_median_s: float
    cpu_median_s: float
    peak_rss_bytes: int


def run_once(argv: list[str], fresh: str | None = None) -> tuple[float, float, int]:
    """Wall time, CPU time (user + sys) and peak RSS in bytes of one child process (``fresh``: a file
    removed before it starts, so that the command writes it anew)."""
    if fresh is not None and os.path.exists(fresh):
        os.remove(fresh)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode not in (0, 1):  # diff exits 1 only for a failed regression gate, never asked for here
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {err.strip()}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024  # ru_maxrss is KiB on Linux


def write_profiles(nodes: int, steps: int, paths: tuple[str, ...]) -> None:
    """Write synthetic profiles (seeds 0, 1, ...) to ``paths`` from a child process.

    Why not here: Linux carries a process's resident memory at ``fork`` into
    the child's peak RSS (the high-water mark survives ``exec``), so a parent
    that built a million-node profile would give every command it times that
    parent's size as a floor. This process stays small.
    """
    code = ("import sys; from benchmarks.analyze_scale import synthetic_profile\n"
            "for seed, path in enumerate(sys.argv[3:]): synthetic_profile(int(sys.argv[1]), int(sys.argv[2]), seed=seed).save(path)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where ``benchmarks`` imports from
    subprocess.run([sys.executable, "-c", code, str(nodes), str(steps), *paths], check=True, cwd=root)


def measure(nodes: int, directory: str, repeat: int, exports: bool = True, steps: int = 5,
            commands: tuple[str, ...] | None = None, overwrite: bool = False) -> list[CommandResult]:
    """Write the two profiles of ``nodes`` nodes and time each command ``repeat`` times."""
    first, second = os.path.join(directory, f"cli_{nodes}_a.json"), os.path.join(directory, f"cli_{nodes}_b.json")
    write_profiles(nodes, steps, (first, second))
    gp = [sys.executable, "-m", "graphprof"]
    plan: dict[str, list[str]] = {
        "analyze": [*gp, "analyze", first, "-t", "20"],
        "report": [*gp, "report", first],
        "diff": [*gp, "diff", first, second],
    }
    outputs: dict[str, str] = {}
    if exports:
        for name, filename in EXPORTS:
            outputs[f"export {name}"] = os.path.join(directory, filename)
            plan[f"export {name}"] = [*gp, "export", first, "-o", outputs[f"export {name}"]]
    plan["reference"] = [sys.executable, "-c", REFERENCE]
    chosen = {name: argv for name, argv in plan.items() if commands is None or name in commands}
    if overwrite:
        for name in chosen.keys() & outputs.keys():
            run_once(chosen[name])  # the file every timed run replaces
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in chosen}
    for _ in range(repeat):  # round robin: a burst of load on this shared machine slows one run of several commands
        for name, argv in chosen.items():
            runs[name].append(run_once(argv, None if overwrite else outputs.get(name)))
    results = [CommandResult(nodes, name, statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs),
                             max(r[2] for r in rs)) for name, rs in runs.items()]
    for path in (first, second):
        os.remove(path)
    return results


def target_note(r: CommandResult) -> str:
    """Whether a row meets its target ('-' where the issue sets none)."""
    if r.command == "reference":
        return "-"
    if r.nodes == 100_000:
        return "met" if r.wall_median_s <= WALL_TARGET_100K_S else "MISSED"
    if r.nodes == 1_000_000 and r.command in ("analyze", "report", "diff"):
        ok = r.wall_median_s <= WALL_TARGET_1M_S and r.peak_rss_bytes <= RSS_TARGET_1M_BYTES
        return "met" if ok else "MISSED"
    return "-"


def markdown(results: list[CommandResult]) -> str:
    lines = ["| nodes | command | wall (median) | CPU (median) | peak RSS | target |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.nodes} | {r.command} | {r.wall_median_s:.2f} s | {r.cpu_median_s:.2f} s | "
                     f"{r.peak_rss_bytes / 2**20:.0f} MiB | {target_note(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per profile (default 5)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command (default 3)")
    parser.add_argument("--no-exports", action="store_true", help="only analyze, report and diff")
    parser.add_argument("--only", nargs="+", metavar="COMMAND", help="only these commands ('export chrome' ...)")
    parser.add_argument("--overwrite", action="store_true", help="exports replace an existing file (see above)")
    args = parser.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    results: list[CommandResult] = []
    with tempfile.TemporaryDirectory() as directory:
        for nodes in args.nodes:
            rows = measure(nodes, directory, args.repeat, exports=not args.no_exports, steps=args.steps,
                           commands=tuple(args.only) if args.only else None, overwrite=args.overwrite)
            results += rows
            print(markdown(rows), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
