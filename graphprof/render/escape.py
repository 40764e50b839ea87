"""Escaping for every text format graphprof writes, and for the terminal.

Op, module and scope names come from user code and can hold anything: ``<``,
``&``, quotes, newlines, ``</script>``, escape sequences, bidi overrides, lone
surrogates. Each sink has its own rules, so each has one function here and
renderers never build markup or terminal output from raw names: XML, SVG and
HTML text (``html_text``, ``strip_control``), GraphML element text
(``xml_text``), DOT (``dot_string``,
``dot_html``), script JSON (``json_for_script``), folded stacks
(``folded_frame``) and the terminal (``terminal_text`` for printed output,
``terminal_line`` for one-line messages and cells).
"""

from __future__ import annotations

import html
import json
from typing import Any

from graphprof.render.units import clip_middle

# XML 1.0 allows tab, newline, carriage return, U+0020-U+D7FF, U+E000-U+FFFD and above U+FFFF:
# other C0 controls become spaces (as a reader would see them), and lone surrogates, U+FFFE and
# U+FFFF (not characters at all; a lone surrogate cannot even be written as UTF-8) become U+FFFD.
_CONTROL = {i: " " for i in range(32) if chr(i) not in "\t\n"}
_XML = {**_CONTROL, **{i: "\ufffd" for i in (*range(0xD800, 0xE000), 0xFFFE, 0xFFFF)}}

# What a terminal must not receive raw: C0 controls (ESC starts every escape sequence, BEL ends
# OSC ones), DEL, C1 controls (0x9b is an 8-bit CSI), the bidirectional controls that reorder
# what is shown (U+202E), and lone surrogates (a UTF-8 terminal stream cannot encode them).
# Each is shown as its Python escape, so the name stays readable and unambiguous.
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_TERMINAL_LINE = {i: f"\\x{i:02x}" for i in (*range(0x20), *range(0x7F, 0xA0))}
_TERMINAL_LINE.update({i: f"\\u{i:04x}" for i in (*_BIDI, *range(0xD800, 0xE000))})
_TERMINAL_LINE.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
_TERMINAL_TEXT = {k: v for k, v in _TERMINAL_LINE.items() if k not in (ord("\n"), ord("\t"))}

#: Graphviz refuses a string longer than 65,535 characters; labels are clipped well below that.
DOT_LABEL_LIMIT = 2000


def strip_control(text: str) -> str:
    """``text`` with only characters XML 1.0 allows: the one rule for XML, SVG, HTML and DOT text."""
    return str(text).translate(_XML)


def terminal_line(text: Any) -> str:
    """``text`` for one line of a terminal (an error message, a path, a table cell).

    Every control character, newline included, and every bidi control is
    shown as an escape (``\\x1b``, ``\\n``, ``\\u202e``), so a name cannot
    move the cursor, retitle the window or fake a second line.
    """
    return str(text).translate(_TERMINAL_LINE)


def terminal_text(text: Any) -> str:
    """Multi-line terminal output (a rendered table or report): as ``terminal_line``, but keeps newlines and tabs."""
    return str(text).translate(_TERMINAL_TEXT)


def html_text(text: Any) -> str:
    """Text for HTML/SVG/XML element content or a double- or single-quoted attribute."""
    return html.escape(strip_control(str(text)), quote=True).replace("\n", "&#10;")


def xml_text(text: str) -> str:
    """Element text as ElementTree writes it (GraphML): ``& < >`` escaped, quotes and newlines kept,
    after the XML character rule (``strip_control``)."""
    return strip_control(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def dot_string(text: Any) -> str:
    """A quoted DOT string whose label text shows ``text`` literally.

    Graphviz reads ``\\`` escapes (``\\n``, ``\\l``, ``\\N``) and HTML entities
    in labels, so backslashes are doubled, ``&`` becomes ``&amp;``, quotes are
    escaped and a newline becomes a ``\\n`` line break. Text longer than
    ``DOT_LABEL_LIMIT`` is clipped in the middle.
    """
    s = clip_middle(strip_control(str(text)), DOT_LABEL_LIMIT).replace("\\", "\\\\").replace("&", "&amp;").replace('"', '\\"')
    s = s.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")
    return f'"{s}"'


def dot_html(text: Any) -> str:
    """Text for inside a Graphviz HTML-like label (``<...>``): XML escaping, newlines as breaks."""
    return html.escape(clip_middle(strip_control(str(text)), DOT_LABEL_LIMIT), quote=True).replace("\n", "<BR/>")


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
