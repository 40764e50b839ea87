"""The graphs a traced function keeps per input signature, and which of them a call replays.

A step that branches in Python takes several paths; each captured path is a
graph with its guards and baked values (capture/replay_check.py). This module
keeps them, bounded by ``cache_size`` like ``torch.compile``'s recompiles,
chooses the one a call takes (or says why none fits, which is the reason the
next capture logs), and keeps the paths that refused capture after another
was captured, so that only their calls run as segments (capture/refused_paths.py).
It is apart from the call path (traced_function.py) because it is the one
place that answers "which graph", and tests ask it that question directly.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable, Hashable

from graphprof.capture.caller_warnings import warn_caller
from graphprof.capture.refused_paths import RefusedPath, refused_path
from graphprof.capture.replay_check import Path
from graphprof.capture.scalars import Guard
from graphprof.capture.signature import LastSignature, signature_change
from graphprof.capture.captured_step import NEVER_AGAIN
from graphprof.runtime.whole_step_runner import WholeStepRunner

log = logging.getLogger("graphprof")

#: Refused paths kept per input signature; one more refusal profiles every call as segments.
REFUSED_PATHS = 4


class CapturedPaths:
    """Per input signature, the captured paths taken so far and the paths refused after one was captured."""

    def __init__(self) -> None:
        #: Per input signature, the graphs of the paths taken so far, each with its baked values.
        self.graphs: OrderedDict[Hashable, list[Path[WholeStepRunner]]] = OrderedDict()
        #: Per input signature, the paths that refused capture after another path was captured: a call
        #: that would take one runs as segments, the others replay (capture/refused_paths.py).
        self.refused: dict[Hashable, list[RefusedPath]] = {}

    def clear(self) -> None:
        self.graphs.clear()
        self.refused.clear()

    def keep(self, key: Hashable, runner: WholeStepRunner, last: LastSignature | None, cache_size: int) -> None:
        """Keep the path ``runner`` captured under ``key``, dropping the oldest beyond ``cache_size``."""
        paths = self.graphs.setdefault(key, [])
        paths.append(Path.of(runner, runner.captured, last))  # the record of this call's key
        self.graphs.move_to_end(key)
        while len(paths) > cache_size:
            paths.pop(0)
        while len(self.graphs) > cache_size:
            self.graphs.popitem(last=False)

    def takes_refused(self, key: Hashable, leaves: list[Any]) -> bool:
        """Whether this call takes one of ``key``'s refused paths (it then runs as segments)."""
        return any(path.taken_by(leaves) for path in self.refused.get(key, ()))

    def refuse_text_path(self, key: Hashable, broken: Guard, last: LastSignature | None, name: str,
                         segments_note: Callable[[], str]) -> bool:
        """Turn the path whose formatted text ``broken`` changed into a refused path, when the step has
        another path to replay (``if n % 10 == 0: print(f"step {n}")``: the logging calls go to
        segments, the others keep their graph); False when it has none (then every call is segments).
        """
        paths = self.graphs.get(key) or []
        path = next((p for p in paths if any(g is broken for g in p.runner.captured.guards)), None)
        if path is None or len(paths) < 2:
            return False
        captured = path.runner.captured
        kept = refused_path(captured.guards, captured.scalar_positions)
        if kept is None or not self.keep_refused(
                key, kept, f"graphprof: {name} prints or formats a number that changed between calls "
                f"({broken.describe()}), whose text a static graph would keep; profiling the calls that take this "
                "path as torch.compile segments, and replaying the others' graphs", segments_note):
            return False
        paths.remove(path)
        if last is not None and last.replay is path:
            last.replay = None
        return True

    def keep_refused(self, key: Hashable, path: RefusedPath, message: str, segments_note: Callable[[], str]) -> bool:
        """Keep ``path`` among ``key``'s refused paths, unless ``REFUSED_PATHS`` are kept already (False).
        One warning for the step's first refused path; later ones (the same logging code met with and
        without padding, say) are logged, since they say nothing new."""
        refused = self.refused.setdefault(key, [])
        if len(refused) >= REFUSED_PATHS:
            return False
        refused.append(path)
        if sum(map(len, self.refused.values())) > 1:
            log.info(message)
        else:
            warn_caller(message + segments_note())
        return True

    def select(self, key: Hashable, leaves: list[Any],
               last: LastSignature | None) -> tuple[WholeStepRunner | None, str, Guard | None]:
        """The captured path this call takes, or why none fits (a new signature, a guard, a baked value)
        and, when the last path tried failed a guard, that guard.

        ``last`` is the record of this call's key when it has one: it keeps the
        key's paths between calls (``TracedFunction._capture`` and ``reset`` drop
        them), and the first path, once taken, for the next call to try by its
        check alone.
        """
        if last is not None and last.paths is not None:
            paths = last.paths
        else:
            paths = self.graphs.get(key)
            if last is not None:
                last.paths = paths
        if not paths:
            if not self.graphs:
                return None, "it runs for the first time", None
            return None, signature_change(next(reversed(self.graphs)), key), None
        reason = ""
        broken: Guard | None = None
        for path in list(paths):
            runner = path.runner
            changed = path.baked.changed()
            if changed is not None:  # kept: a loop that switches train/eval modes comes back to it
                reason, broken = changed, None
                continue
            mismatch = runner.captured.entry_mismatch()
            if mismatch is not None:
                reason, broken = mismatch, None
                if mismatch in NEVER_AGAIN:  # it never goes away: neither will this graph run
                    paths.remove(path)
                    if last is not None:
                        last.replay = None
                continue
            broken = runner.captured.broken_guard(leaves)
            if broken is None:
                if last is not None and path is paths[0] and path.check is not None:
                    last.replay = path  # the next call of this key tries its check first
                return runner, "", None
            reason = broken.broken_reason()
        return None, reason or "its input signature is new", broken
