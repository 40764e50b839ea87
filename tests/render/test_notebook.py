"""``Profile._repr_html_``: the report's parts in one scoped div; in headless Chromium with no console errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphprof.api import Profile
from graphprof.profile.model import ProfileMeta
from graphprof.profile.step_facts import with_eager_times, with_workload
from graphprof.render.notebook import ROOT_CLASS, notebook_html, scoped_css
from tests.render.cdp import Browser, find_chromium
from tests.render.export_profiles import HOSTILE, empty_profile, make_profile, node

CHROMIUM = find_chromium()
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
EVIL = "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\"></td></table></div><!--"


@pytest.fixture(scope="module")
def real(real: Profile) -> Profile:
    """The shared real profile (conftest.py) with eager times and a workload, so every card shows."""
    return with_workload(with_eager_times(real, [0.5, 0.2, 0.21], first_is_cold=True), samples_per_step=16)


def _notebook_page(tmp_path: Path, fragment: str, name: str = "nb.html") -> Path:
    """A host page standing in for a notebook: its own paragraph, then the output cell."""
    page = tmp_path / name
    page.write_text("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>notebook</title></head><body>"
                    f"<p id=\"host\">a notebook cell</p><div class=\"output\">{fragment}</div></body></html>",
                    encoding="utf-8")
    return page


def test_repr_html_has_summary_utilisation_findings_and_top_nodes(real: Profile) -> None:
    html = real._repr_html_()
    assert html.startswith(f'<div class="{ROOT_CLASS}">') and html.endswith("</div>")
    assert "<script" not in html and "<html" not in html
    for part in ('class="cards"', "time per step", "Advisor findings", 'id="top-nodes"', "samples/s",
                 "eager step vs graph"):
        assert part in html, part
    assert ("MFU (calibrated peak)" in html) == bool(real.meta.peaks)


def test_stylesheet_is_scoped_to_the_view() -> None:
    css = scoped_css()
    rules = [line for line in css.splitlines() if "{" in line]
    assert rules and all(r.lstrip().startswith(f".{ROOT_CLASS}") for r in rules)
    assert "body" not in css and "header" not in css and "nav " not in css


def test_empty_and_hostile_profiles_are_escaped() -> None:
    assert "No profiled step" in notebook_html(empty_profile())
    p = make_profile([node(0, HOSTILE, module=HOSTILE, source=HOSTILE, flops=8, bytes_read=8, bytes_written=8)],
                     meta=ProfileMeta(function=HOSTILE), wall_time_s=2e-3)
    html = Profile(meta=p.meta, steps=p.steps, graphs=p.graphs)._repr_html_()
    assert "</script><!--<b>" not in html and "x&lt;/script&gt;" in html


@needs_browser
def test_view_renders_in_chromium_without_errors_or_restyling_the_page(real: Profile, tmp_path: Path) -> None:
    page = _notebook_page(tmp_path, real._repr_html_())
    with Browser(CHROMIUM, str(tmp_path / "chromium-profile")) as browser:  # type: ignore[arg-type]
        browser.open(page.as_uri())
        assert browser.evaluate("document.querySelectorAll('#top-nodes tbody tr').length") == min(50, real.node_count)
        assert browser.evaluate("document.querySelectorAll('.graphprof-nb .card').length") >= 6
        width = browser.evaluate("document.querySelector('.graphprof-nb .cards').getBoundingClientRect().width")
        assert width > 300
        # the host page keeps its own look: the view's styles apply inside its div only
        assert browser.evaluate("getComputedStyle(document.body).margin") == "8px"
        assert browser.evaluate("getComputedStyle(document.getElementById('host')).fontStyle") == "normal"
        browser.drain()
        assert browser.console_errors() == []
        assert [u for u in browser.requested_urls() if not u.startswith(("file:", "data:", "about:"))] == []


@needs_browser
def test_injected_markup_does_not_run_in_the_view(tmp_path: Path) -> None:
    p = make_profile([node(0, EVIL, module=EVIL, source=EVIL, flops=8, bytes_read=8, bytes_written=8, times=(1e-3,)),
                      node(1, "relu", (0,), module=EVIL, times=(2e-3,))], meta=ProfileMeta(function=EVIL),
                     wall_time_s=3e-3)
    page = _notebook_page(tmp_path, Profile(meta=p.meta, steps=p.steps, graphs=p.graphs)._repr_html_(), "evil.html")
    with Browser(CHROMIUM, str(tmp_path / "chromium-profile")) as browser:  # type: ignore[arg-type]
        browser.open(page.as_uri())
        assert browser.evaluate("typeof window.pwned") == "undefined"
        assert browser.evaluate("document.querySelectorAll('img, script').length") == 0
        assert EVIL in browser.evaluate("document.querySelector('#top-nodes').innerText")
        assert browser.evaluate("document.querySelectorAll('.output > div').length") == 1  # the view's div closes itself
        browser.drain()
        assert browser.console_errors() == []
