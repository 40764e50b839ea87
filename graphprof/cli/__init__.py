"""The ``graphprof`` command: a thin argparse front over the library.

Commands that read a saved profile (``analyze``, ``report``, ``export``, ``diff``, ``merge``) never
import torch; ``demo`` and ``calibrate`` do. A user error (bad file, bad option value) prints one sentence to stderr
and exits with status 2, with no traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn, Sequence

from graphprof.cli.loading import keep_until_exit, load_for_analysis, load_frozen, thaw
from graphprof.cli.table_options import add_table_options, table_options_from_args
from graphprof.cli.targets import UsageError, refuse_overwriting_input, refuse_replacing_a_profile
from graphprof.profile.serialize import ProfileError
from graphprof.render.escape import terminal_line, terminal_text

if TYPE_CHECKING:
    from graphprof.analysis.roofline import Peaks
    from graphprof.profile.model import Profile


def emit(text: str) -> None:
    """Print command output: every name in it reached the terminal through ``terminal_text``."""
    print(terminal_text(text))


def note(text: str) -> None:
    """One line on stderr (``graphprof: ...``); a path or name in it cannot break the line."""
    print(terminal_line(text), file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit status 2, like every user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, terminal_line(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n")


def _cmd_demo(args: argparse.Namespace) -> int:
    from graphprof.demo.run import run_demo
    from graphprof.render.exporters import check_target

    if args.output is not None:
        check_target(args.output)  # one sentence now, not after the demo has run
    emit(run_demo(model=args.model, steps=args.steps, top=args.top, output=args.output))
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from graphprof.analysis.options import DATA_FORMATS
    from graphprof.analysis.table import build_table
    from graphprof.render.console import check_format, render_table

    options = table_options_from_args(args)
    check_format(options.format)
    profile = load_for_analysis(args.profile)
    result = build_table(profile, options)
    emit(render_table(result))
    if result.note and options.format in DATA_FORMATS:
        note(f"graphprof: note: {result.note}")  # keep stdout machine-readable
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from graphprof.progress import stage
    from graphprof.render.exporters import check_target, export_profile, exporter_for
    from graphprof.render.size_guard import parse_size

    # Every mistake in the command line is one sentence before the profile is read (seconds at a million nodes).
    max_bytes = None if args.max_size is None else parse_size(args.max_size)
    exporter_for(args.output, args.format)
    check_target(args.output)
    refuse_overwriting_input(args.output, [args.profile], "its export")
    refuse_replacing_a_profile(args.output, "an export")
    profile = load_frozen(args.profile)
    with stage(f"writing {terminal_line(args.output)}"):
        written = export_profile(profile, args.output, format=args.format, stat=args.stat,
                                 module_level=args.module_level, hide_views=args.hide_views,
                                 max_bytes=max_bytes)
    size = ""
    if written.startswith("chrome"):  # traces grow with nodes x steps: say by how much
        from graphprof.render.chrome_trace import bytes_per_node_step
        from graphprof.render.units import format_bytes

        nbytes = os.path.getsize(args.output)
        per = bytes_per_node_step(profile, nbytes)
        size = f", {format_bytes(nbytes)}" + (f", {per:.0f} bytes per node per step" if per is not None else "")
    note(f"graphprof: wrote {args.output} ({written}{size})")
    return 0


def _add_export_parser(sub: argparse._SubParsersAction, detailed: bool = True) -> None:
    """The ``export`` command; ``detailed=False``: its name and help line alone (see ``build_parser``)."""
    help = "write a saved profile as a trace, annotated graph, flame-graph stacks or HTML report"
    if not detailed:
        sub.add_parser("export", help=help)
        return
    from graphprof.render.exporters import EXPORTERS, FORMATS

    endings = "; ".join(f"{', '.join(e.suffixes)}: {e.description}" for e in EXPORTERS.values())
    export = sub.add_parser(
        "export", help=help,
        description=f"The format follows from the output file's name ({endings}); --format overrides it.")
    export.add_argument("profile", help="a profile JSON file")
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    export.add_argument("--format", choices=FORMATS, help="the format, whatever the file's name")
    level = export.add_mutually_exclusive_group()
    level.add_argument("--module-level", dest="module_level", action="store_const", const=True, default=None,
                       help="graph pictures: one box per module and phase (automatic above 600 ops)")
    level.add_argument("--node-level", dest="module_level", action="store_const", const=False,
                       help="graph pictures: one box per op, however large the graph")
    export.add_argument("--hide-views", action="store_true",
                        help="graph pictures: leave out views, tuple projections and constant factories")
    export.add_argument("--stat", default="median", choices=("median", "mean", "min", "max"),
                        help="statistic over profiled steps (default median)")
    export.add_argument("--max-size", metavar="SIZE",
                        help="refuse a file larger than SIZE (500M, 2G; 0 = no limit); default 50 times the "
                             "profile's size, at least 256M. Names are clipped to 1,000 characters in every export")
    export.set_defaults(func=_cmd_export)


def _cmd_diff(args: argparse.Namespace) -> int:
    from graphprof.analysis.diff import diff
    from graphprof.analysis.options import DATA_FORMATS
    from graphprof.analysis.regression import parse_percent
    from graphprof.render.console import check_format
    from graphprof.render.diff_text import render_diff

    # --order-by takes diff columns (checked by diff); the shared options are checked with the default.
    options = table_options_from_args(argparse.Namespace(**{**vars(args), "order_by": "time"}))
    check_format(options.format)
    threshold = None if args.fail_if_slower is None else parse_percent(args.fail_if_slower)
    before, after = load_for_analysis(args.before), load_for_analysis(args.after)
    result = diff(before, after, options, order_by=args.order_by, fail_if_slower=threshold)
    emit(render_diff(result))
    if result.gate is not None and options.format in DATA_FORMATS:  # keep stdout machine-readable
        note(f"graphprof: regression gate: {'FAIL' if result.gate.regressed else 'pass'}: {result.gate.reason}")
    return 1 if result.gate is not None and result.gate.regressed else 0


def _add_diff_parser(sub: argparse._SubParsersAction, detailed: bool = True) -> None:
    """The ``diff`` command; ``detailed=False``: its name and help line alone (see ``build_parser``)."""
    help = "compare two saved profiles node by node; --fail-if-slower gates regressions in CI"
    if not detailed:
        sub.add_parser("diff", help=help)
        return
    from graphprof.analysis.diff import ORDER_KEYS

    parser = sub.add_parser(
        "diff", help=help,
        description="Nodes are matched across the two profiles' graphs (same op, module and input shapes, in "
                    "order; then same op type and module); prints what changed, ordered by absolute time "
                    "change, and the changes by op type, module and phase. Exit status 1 when "
                    "--fail-if-slower fires, 2 on bad input.")
    parser.add_argument("before", help="the baseline profile JSON file")
    parser.add_argument("after", help="the profile to compare with it")
    parser.add_argument("--fail-if-slower", metavar="PCT",
                        help="exit with status 1 when the median step time grew by more than PCT percent "
                             "and by more than the noise of both profiles' steps")
    add_table_options(parser)
    for action in parser._actions:
        if action.dest == "order_by":
            action.help = (f"order by {', '.join(ORDER_KEYS)} (time and flops: absolute change); "
                           "+ = ascending (default time)")
    parser.set_defaults(func=_cmd_diff)


def _require_positive(*flags: tuple[str, float | None]) -> None:
    """UsageError naming the first flag given a value that is not a positive finite number (nan, inf, 0, -1)."""
    for flag, value in flags:
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"{flag} must be positive, not {value:g}")


def _peaks_from_args(args: argparse.Namespace, profile: "Profile") -> "Peaks | None":
    """Roofline peaks given on the command line (GFLOP/s, GB/s), or None for the profile's own.

    ``--peak-gflops`` alone (a datasheet figure, for MFU) keeps the profile's bandwidth.
    """
    from graphprof.analysis.utilisation import given_peaks

    if args.peak_gbs is not None and args.peak_gflops is None:
        raise UsageError("--peak-gbs needs --peak-gflops with it")
    _require_positive(("--peak-gflops", args.peak_gflops), ("--peak-gbs", args.peak_gbs))
    scale = lambda v: None if v is None else v * 1e9  # noqa: E731
    return given_peaks(profile, scale(args.peak_gflops), scale(args.peak_gbs))


def _cmd_report(args: argparse.Namespace) -> int:
    from graphprof.analysis.report import build_report
    from graphprof.profile.step_facts import Workload
    from graphprof.render.fit import resolve_width
    from graphprof.render.report_text import render_report

    if args.top < 1:
        raise UsageError("--top must be at least 1")
    width = resolve_width(args.width, args.wide)  # ValueError: one sentence
    from graphprof.progress import stage

    _require_positive(("--tokens-per-step", args.tokens_per_step), ("--samples-per-step", args.samples_per_step))
    workload = Workload(args.tokens_per_step, args.samples_per_step)
    profile = load_for_analysis(args.profile)
    peaks = _peaks_from_args(args, profile)
    with stage(f"analysing {profile.node_count} nodes"):
        text = render_report(build_report(profile, peaks, stat=args.stat, top=args.top,
                                          module_depth=args.module_depth,
                                          peak_flops_per_s=None if args.peak_gflops is None else args.peak_gflops * 1e9,
                                          workload=workload), width)
    emit(text)
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from graphprof.profile.merge import merge_profiles
    from graphprof.profile.model import load_profile

    refuse_overwriting_input(args.output, args.profiles, "the merged profile")
    merged = merge_profiles([load_profile(p) for p in args.profiles], labels=args.profiles)
    merged.save(args.output)
    ranks = len(merged.meta.distributed.ranks) if merged.meta.distributed is not None else 0
    note(f"graphprof: merged {ranks} rank(s), {len(merged.steps)} common step(s), into {args.output}")
    return 0


def _add_merge_parser(sub: argparse._SubParsersAction) -> None:
    merge = sub.add_parser(
        "merge", help="combine the per-rank profiles of a torch.distributed run into one profile",
        description="One profile file per rank in, one profile out: every rank's graphs (named rank<r>/...), the "
                    "steps all ranks profiled, and the rank layout in its meta's distributed section. "
                    "`graphprof report` on it compares the ranks (straggler, spread, bus bandwidth); "
                    "`graphprof export` to a Chrome trace shows one process per rank.")
    merge.add_argument("profiles", nargs="+", metavar="PROFILE", help="the profile of each rank (any order)")
    merge.add_argument("-o", "--output", required=True, metavar="FILE", help="the merged profile to write")
    merge.set_defaults(func=_cmd_merge)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from graphprof.runtime.calibrate import cache_path, calibrate, find_calibration

    for threads in args.threads or [None]:
        if args.show:
            found = find_calibration(args.device, threads)
            if found is None:
                raise UsageError(f"no calibration cached for {args.device}; run `graphprof calibrate` first")
            peaks, measured = found.peaks, found.threads
        else:
            peaks, measured = calibrate(args.device, threads=threads), threads
        if args.device == "cpu" and measured:
            emit(f"with {measured} thread(s):")
        for key, value in sorted(peaks.items()):
            unit = "B/s" if key.startswith("bytes") else "FLOP/s"
            emit(f"{key:24s} {value / 1e9:10.1f} G{unit}")
    emit(f"cached in {terminal_line(cache_path())}; profiles taken from now on record these peaks")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``graphprof`` parser; given the ``command`` about to run, only its own options are complete.

    Why: the options of ``analyze``, ``export`` and ``diff`` name the table's columns, the export
    formats and the diff's columns, and importing those modules was a good part of the start of
    every other command. The other commands' entries still list them in ``--help``.
    """
    parser = _Parser(prog="graphprof", description="Profile PyTorch programs as static graphs.")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (they appear only on a terminal anyway)")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="profile a built-in training step on CPU and print the report")
    demo.add_argument("--model", choices=("resnet", "gpt"), default="resnet")
    demo.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    demo.add_argument("-t", "--top", type=int, default=15, help="rows to show (0 = all)")
    demo.add_argument("-o", "--output", help="also save the profile to this JSON file")
    demo.set_defaults(func=_cmd_demo)

    analyze = sub.add_parser(
        "analyze", help="summary and table of a saved profile (like MegEngine's profile_analyze)",
        description="Summary and per-node or aggregated table of a saved profile. A filter that selects "
                    "nothing is not an error: it prints why and exits 0.")
    if command in (None, "analyze"):  # its table options import the table's columns (see above)
        analyze.add_argument("profile", help="a profile JSON file (Profile.save or json.dump of get_profile())")
        add_table_options(analyze)
    analyze.set_defaults(func=_cmd_analyze)

    report = sub.add_parser("report", help="bottleneck report: roofline, critical path, breakdowns, findings")
    report.add_argument("profile", help="a profile JSON file")
    report.add_argument("-t", "--top", type=int, default=10, help="rows per section (default 10)")
    report.add_argument("--stat", default="median", choices=("median", "mean", "min", "max"))
    report.add_argument("--module-depth", type=int, default=2, help="module tree depth of the breakdown")
    report.add_argument("--peak-gflops", type=float,
                        help="device peak GFLOP/s (a datasheet figure): MFU/HFU against it next to the calibrated "
                             "peak, and the roofline's compute roof")
    report.add_argument("--peak-gbs", type=float, help="device peak memory bandwidth in GB/s (with --peak-gflops)")
    report.add_argument("--tokens-per-step", type=float, metavar="N",
                        help="tokens one step processes (e.g. batch x sequence length): tokens/s in the report")
    report.add_argument("--samples-per-step", type=float, metavar="N",
                        help="samples one step processes (the batch size): samples/s in the report")
    report.add_argument("--wide", action="store_true", help="every column unclipped and no wrapping, whatever the width")
    report.add_argument("--width", type=int, metavar="N",
                        help="fit the report to N characters (default: COLUMNS, else the terminal, else 120)")
    report.set_defaults(func=_cmd_report)

    calibrate = sub.add_parser("calibrate", help="measure and cache this device's peak FLOP/s and bandwidth")
    calibrate.add_argument("--device", default="cpu",
                           help="device to measure: cpu (default) or this machine's accelerator (cuda, xpu, ...)")
    calibrate.add_argument("--show", action="store_true", help="print the cached figures, measure nothing")
    calibrate.add_argument("--threads", type=int, nargs="+", metavar="N",
                           help="CPU thread counts to measure with, each cached apart (default: torch's current "
                                "count); profiles use the entry of their own count, else the nearest")
    calibrate.set_defaults(func=_cmd_calibrate)
    _add_export_parser(sub, detailed=command in (None, "export"))
    _add_merge_parser(sub)
    _add_diff_parser(sub, detailed=command in (None, "diff"))
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top level's options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _closed_pipe() -> int:
    """Exit quietly after the reader of stdout went away (``graphprof analyze p.json | head -1``).

    Python would report the failed flush of stdout at exit; pointing stdout at
    /dev/null first makes that flush succeed silently.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests capture it)
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: 0 on success, 1 when ``diff``'s gate fires, 2 on bad input, 130 on Ctrl-C."""
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_in(words))
    args = parser.parse_args(words)
    from graphprof.progress import set_quiet

    set_quiet(args.quiet)
    try:
        return _run_command(args)
    finally:
        thaw()


def _run_command(args: argparse.Namespace) -> int:
    """``args.func(args)``, its user errors as one line and an exit status."""
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
        return status
    except BrokenPipeError:  # Python raises this for every EPIPE, so OSError below is never one
        return _closed_pipe()
    except OSError as exc:
        note(f"graphprof: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return 2
    except (ProfileError, UsageError, ValueError) as exc:
        note(f"graphprof: error: {exc}")
        return 2
    except KeyboardInterrupt:
        # Files are written through a temporary file and a rename, so nothing is half-written;
        # 128 + SIGINT is what a shell reports for a command stopped by Ctrl-C.
        return 128 + signal.SIGINT


def run() -> NoReturn:
    """The ``graphprof`` command: ``main()``, then the process ends without freeing what it loaded.

    Why: freeing a loaded profile object by object takes a tenth of the time
    it took to load (more than a second on a million nodes), and the system
    takes the memory back at once. Nothing is lost: files are written and
    closed before ``main`` returns, and the output is flushed here. Under a
    profiler or a tracer (``python -m cProfile -m graphprof``, coverage) the
    process ends as usual, so that they can write what they measured.
    """
    if sys.getprofile() is not None or sys.gettrace() is not None:
        raise SystemExit(main())
    keep_until_exit()
    status = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # the reader went away: main already said all it could
        pass
    os._exit(status)


if __name__ == "__main__":
    run()
