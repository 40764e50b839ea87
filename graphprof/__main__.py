"""``python -m graphprof`` is the ``graphprof`` command."""

from graphprof.cli import main

raise SystemExit(main())
