"""The one error capture raises, with a message a user can act on."""

from __future__ import annotations

from graphprof.capture.scalars import DataDependentError


class CaptureError(RuntimeError):
    """The function could not be captured as a static graph; its state was restored."""

    @classmethod
    def from_exception(cls, function: str, exc: BaseException) -> "CaptureError":
        if isinstance(exc, DataDependentError):
            reason = str(exc)
        else:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            reason = f"{type(exc).__name__}: {first_line}"
        return cls(f"cannot capture {function} as one static graph: {reason} "
                   "(parameters and optimizer state were restored to before the call)")
