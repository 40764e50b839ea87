"""A printed string as the replay makes it: constant text, and values formatted from the replay's numbers.

``printed_texts`` (f-strings, ``str.format``) and ``percent_texts``
(``%``-formatting) both make one; the output node's template holds it
(capture/host_nodes.py) and fills it on every replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable


@dataclass(frozen=True)
class Formatted:
    """One value's text in a printed string: ``op(value, *spec)``, and the capture call's text."""

    #: A TracedScalar in the capture; a slot of the output node's template after ``template_of``.
    value: Any
    op: Callable[..., str]
    spec: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class FormattedText:
    """A string passed to ``print`` whose parts are constant text and values formatted in the replay."""

    parts: tuple[str | Formatted, ...]

    def real(self) -> str:
        """The capture call's text."""
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    def mapped(self, fn: Callable[[Any], Any]) -> FormattedText:
        """The same text with each formatted value replaced by ``fn(value)``."""
        return FormattedText(tuple(p if isinstance(p, str) else replace(p, value=fn(p.value)) for p in self.parts))

    def filled(self, value_of: Callable[[Any], Any]) -> str:
        """The text with each value (``value_of`` of its slot) formatted as the capture call formatted it."""
        return "".join(p if isinstance(p, str) else p.op(value_of(p.value), *p.spec) for p in self.parts)
