"""Hostile profiles through every command: no traceback, one-line errors, clean terminal output.

Each case takes a valid profile document (``tests/data/small_profile.json``'s
profile with a memory peak, allocator samples and op attributes added, so
every section of the format is present; every other case in the readable
layout of one object per node, whose times are floats, not ticks), applies one to three random
mutations (a value replaced by a hostile one: integers past 64 bits, 1e308,
NaN, wrong types, control and bidi characters, U+FFFE, lone surrogates; a key
deleted; a list shortened or grown) and runs every profile command on it in
process: ``analyze`` (table, json, aggregated), ``report``, ``diff`` both ways
against the original with the regression gate, ``merge``, and ``export`` to
every format but SVG (Graphviz is slow; ``--svg`` adds it).

A case passes when every command
* returns (no exception escapes ``graphprof.cli.main``: that is a traceback),
* exits 0, 2, or 1 for a diff whose gate fired,
* on exit 2 prints exactly one line, ``graphprof: error: ...``, and no stdout,
  that is not Python's own text for an internal failure (``INTERNAL_TEXT``),
* prints no control character but newline (and tab) on stdout or stderr,
* and writes a file that parses (JSON, XML) when it exits 0.

Usage: python -m benchmarks.fuzz_cli [--cases 4000] [--seed 0] [--svg]
Prints the number of cases, command runs, exit codes and failures by kind.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import random
import re
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable

HOSTILE: tuple[Any, ...] = (
    10**400, -10**400, 2**64, 2**63, -1, 0, 1e308, -1e308, 1e-320, float("nan"), float("inf"),
    None, True, False, 1.5, "", "x", "\x1b]0;pwned\x07\x1b[2J", "a\u202eb", "\ufffe\uffff", "\ud800",
    "\x9b31m", "line\nbreak", "x" * 5000, [], {}, [[]], [None], {"a": 1}, [10**30], ["\x1b[31m"],
)
#: Values that keep a profile valid but reach the edges: hostile names, extreme but legal numbers.
HOSTILE_STRINGS: tuple[str, ...] = (
    "\x1b]0;pwned\x07\x1b[2J", "a\u202eb\u2066c", "\ufffe\uffff", "\ud800x\udfff", "\x9b31m\x7f", "line\nbreak\r",
    "<script>alert(1)</script>", "a;b\\c\"d'e&f", "x" * 10000, "", "\t\x00\x08",
)
EDGE_INTS: tuple[int, ...] = (0, 1, 2**63 - 1, 2**62, 10**15)
EDGE_FLOATS: tuple[float, ...] = (0.0, 1e-300, 5e-324, 1e9, 123456.789)
#: Terminal output may hold newlines and tabs; anything else below U+0020, DEL, C1 or a bidi control is an escape.
UNSAFE_TERMINAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: Python's messages for a bug, not a sentence about the input: an error that reads like this leaked.
INTERNAL_TEXT = re.compile(
    "JSON compliant|object has no attribute|unsupported operand|not subscriptable|invalid literal|math domain"
    "|cannot convert|too large to convert|division by zero|out of range|object is not|unhashable"
    "|positional argument|required argument|unexpected keyword|not supported between|NoneType|recursion")


def base_document() -> dict[str, Any]:
    """The valid profile every case mutates, as a JSON document."""
    from graphprof.profile.model import DeviceMemorySample, MemoryPeak, PeakTensor
    from tests.data.make_small_profile import build

    profile = build()
    graphs = list(profile.graphs)
    g0 = graphs[0]
    nodes = list(g0.nodes)
    nodes[1] = replace(nodes[1], attrs=(("backend", "mkldnn"), ("device", "cpu")))
    graphs[0] = replace(
        g0, nodes=tuple(nodes),
        memory_peak=MemoryPeak(node_id=nodes[-1].id, live_bytes=4096, by_category_bytes={"activations": 1024},
                               largest_tensors=(PeakTensor("fc1.weight", 2048, "parameters", -1),),
                               start_bytes=512, allocated_bytes=8192),
        device_memory=(DeviceMemorySample(0, nodes[0].id, 100, 200, 300),))
    meta = replace(profile.meta, peaks={"flops_per_s": 1e11, "bytes_per_s": 2e10})
    return json.loads(json.dumps(replace(profile, meta=meta, graphs=tuple(graphs))))


def readable_document(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with each graph in the readable layout: one object per node, times as floats."""
    from dataclasses import asdict

    from graphprof.profile.model import profile_from_document

    profile = profile_from_document(doc)
    out = copy.deepcopy(doc)
    for raw, graph in zip(out["graphs"], profile.graphs):
        raw.pop("columns", None)
        raw["nodes"] = json.loads(json.dumps([asdict(n) for n in graph.nodes]))
    return out


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every (container path, key) in ``doc``: the places a mutation can hit."""
    out: list[tuple] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def mutate(doc: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``doc`` with one to three random mutations, and their descriptions."""
    doc = copy.deepcopy(doc)
    said = []
    for _ in range(rng.randint(1, 3)):
        paths = _paths(doc)
        if not paths:
            break
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        roll = rng.random()
        current = parent[key]
        if roll < 0.4 and type(current) in (str, int, float):
            pool = {str: HOSTILE_STRINGS, int: EDGE_INTS, float: EDGE_FLOATS}[type(current)]
            parent[key] = rng.choice(pool)
            said.append(f"{'/'.join(map(str, path))} = {parent[key]!r:.40}")
        elif roll < 0.75:
            value = rng.choice(HOSTILE)
            parent[key] = value
            said.append(f"{'/'.join(map(str, path))} = {value!r:.40}")
        elif roll < 0.85:
            del parent[key]
            said.append(f"del {'/'.join(map(str, path))}")
        elif isinstance(parent[key], list) and parent[key]:
            if rng.random() < 0.5:
                parent[key] = parent[key][:-1]
                said.append(f"shorten {'/'.join(map(str, path))}")
            else:
                parent[key] = parent[key] + parent[key][-1:]
                said.append(f"grow {'/'.join(map(str, path))}")
        else:
            parent[key] = copy.deepcopy(rng.choice(HOSTILE))
            said.append(f"{'/'.join(map(str, path))} = hostile")
    return doc, said


@dataclass(frozen=True)
class Command:
    """One command line; ``output`` names the file it writes and ``parse`` checks it."""

    args: tuple[str, ...]
    output: str | None = None
    parse: Callable[[str], Any] | None = None
    gate: bool = False  # exit 1 is a verdict, not a failure


def _parse_xml(path: str) -> None:
    ET.parse(path)


def _parse_json(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        json.load(f, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} in output")))


def _parse_text(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        f.read()


def commands(case: str, original: str, out_dir: str, svg: bool = False) -> list[Command]:
    """Every command run on one case file."""
    def out(name: str) -> str:
        return os.path.join(out_dir, name)

    cmds = [
        Command(("analyze", case)),
        Command(("analyze", case, "--format", "json", "-t", "0")),
        Command(("analyze", case, "--aggregate-by", "module", "--module-depth", "1")),
        Command(("report", case)),
        Command(("diff", original, case, "--fail-if-slower", "5"), gate=True),
        Command(("diff", case, original, "--format", "csv"), gate=True),
        Command(("merge", case, original, "-o", out("merged.json")), out("merged.json"), _parse_json),
    ]
    for name, parse in (("t.trace.json", _parse_json), ("g.dot", _parse_text), ("g.graphml", _parse_xml),
                        ("g.nodelink.json", _parse_json), ("s.folded", _parse_text), ("r.html", _parse_text),
                        ("m.memory.svg", _parse_xml)) + ((("g.svg", _parse_xml),) if svg else ()):
        cmds.append(Command(("export", case, "-o", out(name)), out(name), parse))
    return cmds


@dataclass
class Tally:
    cases: int = 0
    runs: int = 0
    exits: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def fail(self, kind: str, example: str) -> None:
        self.failures[kind] += 1
        self.examples.setdefault(kind, example)


def run_command(cmd: Command) -> tuple[int | None, str, str, BaseException | None]:
    """Run ``graphprof ARGS`` in process; the exit status, stdout, stderr and any escaped exception."""
    from graphprof.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            rc: int | None = main(list(cmd.args))
            error = None
        except SystemExit as exc:
            rc, error = (exc.code if isinstance(exc.code, int) else 2), None
        except BaseException as exc:  # noqa: BLE001 - that is what the fuzz looks for
            rc, error = None, exc
    return rc, stdout.getvalue(), stderr.getvalue(), error


def check_case(doc: dict[str, Any], original: str, work: str, tally: Tally, label: str, svg: bool = False) -> None:
    """Write one case and run every command on it, counting what fails."""
    case = os.path.join(work, "case.json")
    with open(case, "w", encoding="utf-8") as f:
        json.dump(doc, f)  # ASCII with escapes: lone surrogates, NaN and Infinity reach the loader as written
    tally.cases += 1
    for cmd in commands(case, original, work, svg):
        if cmd.output and os.path.exists(cmd.output):
            os.unlink(cmd.output)
        rc, out, err, error = run_command(cmd)
        tally.runs += 1
        tally.exits[rc] += 1
        where = f"{label}: graphprof {' '.join(cmd.args[:1])}"
        if error is not None:
            tally.fail(f"traceback {type(error).__name__} in {cmd.args[0]}", f"{where}: {error!r:.300}")
            continue
        if rc not in (0, 2) and not (rc == 1 and cmd.gate):
            tally.fail(f"exit {rc}", where)
        if rc == 2 and (out or err.count("\n") != 1 or not err.startswith("graphprof: error: ")):
            tally.fail("error not one line", f"{where}: {err!r:.300}")
        if rc == 2 and INTERNAL_TEXT.search(err):
            tally.fail(f"internal error text in {cmd.args[0]}", f"{where}: {err!r:.300}")
        bad = UNSAFE_TERMINAL.search(out + err)
        if bad:
            tally.fail(f"control character on the terminal in {cmd.args[0]}", f"{where}: {bad.group()!r}")
        if rc == 0 and cmd.output and cmd.parse:
            try:
                cmd.parse(cmd.output)
            except Exception as exc:  # noqa: BLE001
                tally.fail(f"unparseable {os.path.basename(cmd.output)}", f"{where}: {exc!r:.200}")


def fuzz(cases: int, seed: int = 0, svg: bool = False, deadline_s: float | None = None) -> Tally:
    """Run ``cases`` mutated profiles through every command (stops early at ``deadline_s``)."""
    rng = random.Random(seed)
    bases = (base_document(),)
    bases += (readable_document(bases[0]),)
    tally = Tally()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        original = os.path.join(work, "original.json")
        with open(original, "w", encoding="utf-8") as f:
            json.dump(bases[0], f)
        for i in range(cases):
            doc, said = mutate(bases[i % 2], rng)
            check_case(doc, original, work, tally, f"case {i} ({'; '.join(said)})", svg)
            if deadline_s is not None and time.perf_counter() - start > deadline_s:
                break
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--svg", action="store_true", help="also export SVG through Graphviz (slow)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    tally = fuzz(args.cases, args.seed, args.svg)
    print(f"{tally.cases} cases, {tally.runs} command runs in {time.perf_counter() - start:.0f} s; "
          f"exit codes {dict(sorted(tally.exits.items(), key=str))}")
    print(f"failures: {sum(tally.failures.values())}")
    for kind, count in tally.failures.most_common():
        print(f"  {count:6d}  {kind}\n          e.g. {tally.examples[kind]}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
