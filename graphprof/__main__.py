"""``python -m graphprof`` is the ``graphprof`` command."""

from graphprof.cli import run

run()
