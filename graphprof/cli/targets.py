"""What a command may write over: never one of its own inputs, never a profile it would turn into an export.

Why here and not in the writers: ``Profile.save`` and ``export_profile`` are
told a path by a caller who means it; a command line is typed, and ``-o``
with the wrong name is a slip whose cost is a profile that may have taken a
long run to record. Both checks read at most the start of the file named,
and say in one sentence what to do instead.
"""

from __future__ import annotations

import os
import re
from typing import Sequence


class UsageError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


#: How a saved profile begins (``Profile.save`` writes the schema first; ``json.dump`` may add spaces).
_PROFILE_START = re.compile(rb'^\s*\{\s*"schema"\s*:\s*"graphprof\.profile/')
#: Enough of a file to see its first key, whatever the spacing.
_SNIFF_BYTES = 256


def refuse_overwriting_input(output: str, inputs: Sequence[str], what: str) -> None:
    """UsageError when ``output`` is (a link to) one of ``inputs``: the command would replace its own input."""
    for path in inputs:
        try:
            same = os.path.samefile(path, output)
        except OSError:  # either does not exist (yet): they cannot be the same file
            continue
        if same:
            raise UsageError(f"{output} is the input profile {path}; writing {what} there would replace it, "
                             "so choose another output file")


def refuse_replacing_a_profile(output: str, what: str) -> None:
    """UsageError when ``output`` holds a graphprof profile: ``.json`` is also a Chrome trace's ending, so
    ``graphprof export a.json -o b.json`` would otherwise turn the profile ``b.json`` into a trace."""
    if not os.path.isfile(output):  # absent, a directory, or a pipe (whose open would wait for a writer)
        return
    try:
        with open(output, "rb") as f:
            start = f.read(_SNIFF_BYTES)
    except OSError:  # unreadable: the writer says what is wrong with it
        return
    if _PROFILE_START.match(start):
        raise UsageError(f"{output} holds a graphprof profile; writing {what} there would replace it, "
                         "so choose another output file (or remove that one first)")
