"""The ``graphprof`` command: a thin argparse front over the library.

Commands that read a saved profile (``analyze``) never import torch; ``demo``
does. A user error (bad file, bad option value) prints one sentence to stderr
and exits with status 2, with no traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from graphprof.profile.serialize import ProfileError


class UsageError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from graphprof.demo.run import run_demo

    print(run_demo(model=args.model, steps=args.steps, top=args.top, output=args.output))
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from graphprof.api import load

    profile = load(args.profile)
    print(profile.table(top=args.top, stat=args.stat))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphprof", description="Profile PyTorch programs as static graphs.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="profile a built-in training step on CPU and print the report")
    demo.add_argument("--model", choices=("resnet", "gpt"), default="resnet")
    demo.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    demo.add_argument("-t", "--top", type=int, default=15, help="rows to show (0 = all)")
    demo.add_argument("-o", "--output", help="also save the profile to this JSON file")
    demo.set_defaults(func=_cmd_demo)

    analyze = sub.add_parser("analyze", help="tables of a saved profile")
    analyze.add_argument("profile", help="a profile JSON file")
    analyze.add_argument("-t", "--top", type=int, default=10, help="rows to show (0 = all)")
    analyze.add_argument("--stat", default="median", choices=("median", "mean", "min", "max"))
    analyze.set_defaults(func=_cmd_analyze)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ProfileError, UsageError, ValueError, OSError) as exc:
        print(f"graphprof: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
