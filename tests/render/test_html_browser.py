"""The HTML report in a real browser: headless Chromium opens it from a file:// URL.

Driven through the DevTools protocol over a pipe (``tests/render/cdp.py``):
the page loads with no console error and no request beyond the file itself,
the table and plots are laid out, sorting works, injected markup does not
run, and a full-page screenshot is taken. Set ``GRAPHPROF_SHOTS_DIR`` to keep
the screenshots.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphprof.api import Profile
from graphprof.render.exporters import export_profile
from tests.render.cdp import Browser, find_chromium
from tests.render.export_profiles import make_profile, node

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Finding:
    severity: str
    title: str
    time_s: float
    hint: str
    sources: tuple[str, ...]


def _keep(shot: Path) -> None:
    target = os.environ.get("GRAPHPROF_SHOTS_DIR")
    if target:
        os.makedirs(target, exist_ok=True)
        shutil.copy(shot, os.path.join(target, shot.name))


def _box(browser: Browser, selector: str) -> dict:
    return browser.evaluate(
        f"(() => {{ const e = document.querySelector({selector!r}); if (!e) return null;"
        " const r = e.getBoundingClientRect(); return {width: r.width, height: r.height}; })()")


def test_report_opens_with_table_plots_and_no_errors(real: Profile, tmp_path: Path) -> None:
    page = tmp_path / "html.html"
    finding = Finding("medium", "Dispatch-bound optimizer loop", 4e-4, "Use a foreach optimizer", ("steps.py:74",))
    export_profile(real, page, findings=[finding])
    with Browser(CHROMIUM, str(tmp_path / "chromium-profile")) as browser:  # type: ignore[arg-type]
        browser.open(page.as_uri())
        assert browser.evaluate("document.documentElement.getAttribute('data-ready')") == "1"
        rows = browser.evaluate("document.querySelectorAll('#top-nodes tbody tr').length")
        assert rows == min(50, real.node_count)
        for selector in ("#top-nodes", "#by-op", "#breakdown table", "#summary .cards"):
            box = _box(browser, selector)
            assert box and box["width"] > 100 and box["height"] > 50, selector
        plotted = browser.evaluate("document.querySelectorAll('#roofline svg circle.pt').length")
        counted = sum(1 for _, n in real.iter_nodes() if n.flops and (n.bytes_read or n.bytes_written))
        assert plotted == min(counted, 5000)
        if counted:
            assert _box(browser, "#roofline svg")["height"] > 200
        if any(n.memory is not None for _, n in real.iter_nodes()):
            assert _box(browser, "#memory svg")["height"] > 100
        assert "Dispatch-bound optimizer loop" in browser.evaluate("document.querySelector('#findings').innerText")
        # sorting: click the time header twice
        times = ("Array.from(document.querySelectorAll('#top-nodes tbody tr'))"
                 ".map(r => Number(r.cells[6].getAttribute('data-v')))")
        browser.evaluate("document.querySelectorAll('#top-nodes thead th')[6].click()")
        descending = browser.evaluate(times)
        assert descending == sorted(descending, reverse=True)
        browser.evaluate("document.querySelectorAll('#top-nodes thead th')[6].click()")
        ascending = browser.evaluate(times)
        assert ascending == sorted(ascending) and ascending != descending
        browser.evaluate("document.querySelectorAll('#top-nodes thead th')[1].click()")  # text column
        ops = browser.evaluate("Array.from(document.querySelectorAll('#top-nodes tbody tr')).map(r => r.cells[1].textContent)")
        assert ops in (sorted(ops, reverse=True), sorted(ops))
        browser.evaluate("document.querySelectorAll('#top-nodes thead th')[6].click()")  # back to slowest first
        browser.evaluate("window.scrollTo(0, 0)")
        browser.drain()
        assert browser.console_errors() == []
        assert [u for u in browser.requested_urls() if not u.startswith(("file:", "data:", "about:"))] == []
        shot = tmp_path / "html.png"
        browser.screenshot(str(shot))
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    _keep(shot)


def test_injected_markup_does_not_run(tmp_path: Path) -> None:
    evil = "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\"></td></table><!--"
    p = make_profile([node(0, evil, module=evil, source=evil, flops=8, bytes_read=8, bytes_written=8, times=(1e-3,)),
                      node(1, "relu", (0,), module=evil, times=(2e-3,))])
    page = tmp_path / "evil.html"
    export_profile(p, page, findings=[Finding(evil, evil, 1e-3, evil, (evil,))])
    with Browser(CHROMIUM, str(tmp_path / "chromium-profile")) as browser:  # type: ignore[arg-type]
        browser.open(page.as_uri())
        assert browser.evaluate("document.documentElement.getAttribute('data-ready')") == "1"
        assert browser.evaluate("typeof window.pwned") == "undefined"
        assert browser.evaluate("document.querySelectorAll('img').length") == 0
        assert browser.evaluate("document.querySelectorAll('script').length") == 2
        assert evil in browser.evaluate("document.querySelector('#top-nodes').innerText")
        browser.drain()
        assert browser.console_errors() == []
        assert [u for u in browser.requested_urls() if not u.startswith(("file:", "data:", "about:"))] == []
