"""``sys.stdout`` and ``sys.stderr`` while a step is captured: the user's writes to them become host nodes.

Why a module of its own: the stand-in streams are one of the host sources
(capture/host_sources.py), which gives them its graph, pending output and
idea of whose code is calling; what a stream does with a write is here.
"""

from __future__ import annotations

import sys
from typing import Any

from graphprof.capture.host_nodes import effect_node
from graphprof.capture.sources import from_user


class EchoStream:
    """``sys.stdout`` or ``sys.stderr`` while a step is captured: the user's code's writes are made
    now and left as host nodes that make them again on every replay (to the ``sys`` stream of then,
    as eager's ``sys.stderr.write`` finds it). Anything else is the stream's own."""

    def __init__(self, stream: Any, name: str, sources: Any) -> None:
        self._stream, self._name, self._sources = stream, name, sources
        self.capturing = True

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._stream, attr)

    def _echo(self, method: str, *args: Any) -> Any:
        # Frames: _from_user, this one, write/flush, the caller (print's own echo is graphprof's).
        if not self.capturing:  # kept by a replayed ``print(..., file=sys.stderr)``: eager's reads ``sys`` anew
            current = getattr(sys, self._name)
            return getattr(self._stream if current is self else current, method)(*args)
        if not from_user((), self._sources.library, depth=3):
            return getattr(self._stream, method)(*args)
        name, stream = self._name, self._stream
        self._sources.pending.append(lambda: getattr(stream, method)(*args))
        effect_node(self._sources.graph, f"sys.{name}.{method}",
                    lambda values: getattr(getattr(sys, name), method)(*args), [], self._sources.record())
        return len(args[0]) if method == "write" else None

    def write(self, text: str) -> int:
        return self._echo("write", text)  # type: ignore[no-any-return]

    def writelines(self, lines: Any) -> None:
        self._echo("writelines", list(lines))

    def flush(self) -> None:
        self._echo("flush")


def put_stream(name: str, stream: Any, stand_in: EchoStream) -> None:
    """Give ``sys`` its stream back (unless the step replaced it meanwhile, which is the user's)."""
    stand_in.capturing = False  # a print traced with ``file=sys.stderr`` keeps the stand-in: it forwards
    if getattr(sys, name) is stand_in:
        setattr(sys, name, stream)
