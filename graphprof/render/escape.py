"""Escaping for every text format graphprof writes.

Op, module and scope names come from user code and can hold anything: ``<``,
``&``, quotes, newlines, ``</script>``. Each format has its own rules, so each
has one function here and renderers never build markup from raw names.
"""

from __future__ import annotations

import html
import json
from typing import Any

_CONTROL = {i: " " for i in range(32) if chr(i) not in "\t\n"}


def strip_control(text: str) -> str:
    """Control characters other than tab and newline become spaces (XML 1.0 forbids most)."""
    return str(text).translate(_CONTROL)


def html_text(text: Any) -> str:
    """Text for HTML/SVG/XML element content or a double- or single-quoted attribute."""
    return html.escape(strip_control(str(text)), quote=True).replace("\n", "&#10;")


def dot_string(text: Any) -> str:
    """A quoted DOT string whose label text shows ``text`` literally.

    Graphviz reads ``\\`` escapes (``\\n``, ``\\l``, ``\\N``) and HTML entities
    in labels, so backslashes are doubled, ``&`` becomes ``&amp;``, quotes are
    escaped and a newline becomes a ``\\n`` line break.
    """
    s = strip_control(str(text)).replace("\\", "\\\\").replace("&", "&amp;").replace('"', '\\"')
    s = s.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")
    return f'"{s}"'


def dot_html(text: Any) -> str:
    """Text for inside a Graphviz HTML-like label (``<...>``): XML escaping, newlines as breaks."""
    return html.escape(strip_control(str(text)), quote=True).replace("\n", "<BR/>")


def json_for_script(value: Any) -> str:
    """JSON that is safe inside an HTML ``<script>`` element.

    ``<``, ``>`` and ``&`` are written as ``\\u003c``-style escapes, so no
    string can close the element (``</script>``) or open a comment
    (``<!--``); U+2028/U+2029 are escaped for old JavaScript parsers.
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def folded_frame(text: Any) -> str:
    """A frame name for folded stacks: no ``;`` (frame separator) and no line breaks."""
    s = strip_control(str(text)).replace("\n", " ").replace(";", ":")
    return s.strip() or "?"
