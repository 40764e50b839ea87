"""The user-facing Profile: the data model plus its views.

``graphprof.profile.Profile`` is pure data and imports nothing above it.
This subclass adds the views users call on a profile (``table``, and later
``report`` and ``export``), which need analysis and rendering; keeping them
here keeps the layering one-way (profile ← analysis ← render ← api).
"""

from __future__ import annotations

import os

from graphprof.analysis.table import node_table
from graphprof.profile import model
from graphprof.profile.serialize import load_profile
from graphprof.render.console import render_node_table


class Profile(model.Profile):
    """A profile with its views. See ``graphprof.profile.model.Profile`` for the data."""

    def table(self, top: int = 10, stat: str = "median", fmt: str = "simple") -> str:
        """The ``top`` slowest nodes (0 = all) as a text table."""
        return render_node_table(node_table(self, top=top, stat=stat), fmt=fmt)


def load(path: str | os.PathLike[str]) -> Profile:
    """Read a profile saved by ``Profile.save`` or ``json.dump``; validates it."""
    return load_profile(path, cls=Profile)  # type: ignore[return-value]
