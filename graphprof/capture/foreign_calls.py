"""Numbers read from tensors handed to another package's code: refused, since a replay never calls it.

``writer.add_scalar("loss", loss.item(), step)``, ``wandb.log({"loss":
loss.item()})``, ``pbar.set_postfix(loss=loss.item())``: the capture call
runs such a call once, and a replayed graph, which runs no Python, never
again. graphprof repeats what it knows (``print`` and ``logging`` are host
nodes, the step's own lists and objects are effects); a third-party
package's own state and files it cannot see, and the README used to say so
as the only warning. The trace the capture call already runs over the
user's frames (capture/name_reads.py) sees every Python call: where one
into an installed package's code (TensorBoard's writer in torch, anything
in site-packages but torch itself) receives a number read from a tensor
during the step, directly or one container down, the capture is refused
with one warning naming the function (raised into that call, before its
body runs, so that the package sees nothing of the refused capture), and
the step is profiled as segments, which run it.

Numbers known before the step (its arguments, the optimizer's learning
rate) are inputs, not read from a tensor; handing them on is fine.
"""

from __future__ import annotations

import os
import types
from typing import Any

from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.sources import installed

#: Installed code graphprof's replay covers: torch's own ops and modules, and graphprof.
_COVERED = (f"{os.sep}torch{os.sep}", f"{os.sep}graphprof{os.sep}", f"{os.sep}functorch{os.sep}")
#: Torch code that writes elsewhere (event files).
_WRITER = f"{os.sep}torch{os.sep}utils{os.sep}tensorboard{os.sep}"


class ForeignCalls:
    """Notes the first call into foreign code that is given a number read from a tensor."""

    def __init__(self) -> None:
        self._foreign: dict[types.CodeType, bool] = {}
        self.first: str | None = None  # "module.function"

    def on_call(self, frame: types.FrameType) -> None:
        """Called for each new frame of code that is not the user's (``NameReads``)."""
        if self.first is not None:
            return
        code = frame.f_code
        foreign = self._foreign.get(code)
        if foreign is None:
            foreign = self._foreign[code] = _foreign(code.co_filename)
        if not foreign:
            return
        count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
        names = code.co_varnames[:count]
        local = frame.f_locals
        if any(_read_from_tensor(local.get(name)) for name in names):
            module = frame.f_globals.get("__name__", "?")
            self.first = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
            self.refuse()  # raised into the call, before its body runs: nothing of it to undo

    def refuse(self) -> None:
        """Raise the refusal, once a call was noted (also after the step: it may have caught it)."""
        if self.first is not None:
            raise DataDependentError(
                f"the step hands a number read from a tensor to {self.first}, another package's code that a "
                "replayed graph would not call again (its writes and state would stop at the capture call)")


def _foreign(filename: str) -> bool:
    """Installed code whose effects a replay does not cover."""
    return installed(filename) and (_WRITER in filename or not any(part in filename for part in _COVERED))


def _read_from_tensor(value: Any) -> bool:
    """A TracedScalar that is not an input, here or one list, tuple or dict down."""
    if type(value) is TracedScalar:
        return not value.is_input
    if type(value) in (list, tuple):
        return any(type(v) is TracedScalar and not v.is_input for v in value[:64])
    if type(value) is dict:
        return any(type(v) is TracedScalar and not v.is_input for v in list(value.values())[:64])
    return False
