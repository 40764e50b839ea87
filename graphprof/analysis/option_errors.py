"""The error a bad table, diff or report option raises.

It sits below ``options`` and ``columns`` (both raise it, and ``options``
checks column names with ``columns``), so neither has to import the other
lazily to share it.
"""

from __future__ import annotations


class TableOptionError(ValueError):
    """An option value the user can fix; the message is one sentence."""
