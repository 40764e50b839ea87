"""The HTML report: self-contained, escaped, with every section (checked without a browser)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html.parser import HTMLParser


from graphprof.api import Profile
from graphprof.render.exporters import ExportOptions
from graphprof.render.html import html_report
from tests.render.export_profiles import HOSTILE, empty_profile, hostile_profile, synthetic_profile


class _Collector(HTMLParser):
    """Elements, attributes, script bodies and visible text of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)


def _parse(page: str) -> _Collector:
    c = _Collector()
    c.feed(page)
    c.close()
    return c


@dataclass(frozen=True)
class Finding:
    severity: str
    title: str
    time_s: float
    hint: str
    sources: tuple[str, ...]


def test_report_has_every_section_and_needs_no_network(real: Profile) -> None:
    page = html_report(real, ExportOptions())
    doc = _parse(page)
    ids = {a.get("id") for _, a in doc.tags}
    for section in ("summary", "findings", "top-ops", "breakdown", "roofline", "memory", "critical-path", "top-nodes", "by-op"):
        assert section in ids, section
    # nothing is fetched: no external src/href, a CSP that forbids every load, inline style and script only
    for tag, attrs in doc.tags:
        for key in ("src", "href", "xlink:href"):
            value = attrs.get(key)
            assert value is None or value.startswith("#"), (tag, key, value)
        assert not (tag == "link" and attrs.get("rel") == "stylesheet")
    csp = next(a["content"] for t, a in doc.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp
    rows = page.count("<tr") - page.count("<thead><tr")
    assert rows > 50
    assert len(doc.scripts) == 2  # the summary JSON and the sorting script


def test_summary_json_is_parseable(real: Profile) -> None:
    doc = _parse(html_report(real, ExportOptions()))
    summary = json.loads(doc.scripts[0])
    assert summary["ops"] == real.node_count and summary["steps"] == len(real.steps)
    assert summary["critical_path_s"] <= summary["time_per_step_s"] + 1e-12


def test_hostile_names_are_escaped_everywhere() -> None:
    page = html_report(hostile_profile(), ExportOptions(findings=[Finding("high", HOSTILE, 1e-3, HOSTILE, (HOSTILE,))],
                                                        bounds={0: HOSTILE}))
    doc = _parse(page)
    assert [t for t, _ in doc.tags].count("script") == 2  # no injected script element
    assert "<b>" not in "".join(doc.text) or HOSTILE.split("\n")[0] in "".join(doc.text)
    assert "</script><!--<b>" not in page.replace("&lt;", "")  # the raw markup never appears
    assert not re.search(r"<!--(?!\s*$)", page)  # no comment opened by a name
    assert "x&lt;/script&gt;&lt;!--&lt;b&gt;&amp;amp;&quot;&#x27;" in page
    summary = json.loads(doc.scripts[0])
    assert summary["function"] == HOSTILE and summary["top"][0]["module"] == HOSTILE  # exact, after JSON decoding
    assert "<" not in doc.scripts[0] and ">" not in doc.scripts[0]


def test_findings_are_rendered_or_none_reported() -> None:
    none = _parse(html_report(synthetic_profile(), ExportOptions()))
    assert "No advisor findings." in "".join(none.text)
    finding = Finding("high", "Slow convolution path", 2.5e-3, "Enable mkldnn", ("model.py:10", "model.py:11"))
    page = html_report(synthetic_profile(), ExportOptions(findings=[finding]))
    text = "".join(_parse(page).text)
    assert "Slow convolution path" in text and "Enable mkldnn" in text and "model.py:10, model.py:11" in text
    assert "2.5 ms" in text and 'class="finding sev-high"' in page


def test_roofline_plots_every_counted_node_and_the_roofs() -> None:
    p = synthetic_profile()
    page = html_report(p, ExportOptions())
    roofline = page.split('id="roofline"', 1)[1].split("</section>", 1)[0]
    assert roofline.count('class="pt"') == 5  # the view has no FLOPs: 5 of 6 nodes have FLOPs and bytes
    assert roofline.count('class="roof"') == 1 and "compute roof" in roofline and "bandwidth roof" in roofline
    empty = html_report(empty_profile(), ExportOptions())
    assert "nothing to place on a roofline" in empty


def test_breakdowns_and_critical_path() -> None:
    page = html_report(synthetic_profile(), ExportOptions())
    text = "".join(_parse(page).text)
    for label in ("By phase", "By top-level module", "By module (depth 2)", "By source line", "nodes on the path", "Slowest ops on the path"):
        assert label in text
    crit = page.split('id="critical-path-nodes"', 1)[1].split("</table>", 1)[0]
    # every node depends on the one before: mm, relu, t, mm, mul_, add_ (the header row too)
    assert crit.count("<tr>") == 1 + 6
    assert "(<b>100%</b>)" in page


def test_empty_profile_renders_a_whole_page() -> None:
    page = html_report(empty_profile(), ExportOptions())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "No advisor findings." in page


def test_roofs_are_labelled_by_dtype_and_drawn_once() -> None:
    from graphprof.render.html_plots import compute_roof_labels

    peaks = {"flops_per_s": 1.7e11, "flops_per_s_float32": 1.7e11, "flops_per_s_bfloat16": 8.3e11, "bytes_per_s": 4e10}
    assert compute_roof_labels(peaks) == {"float32 roof": 1.7e11, "bfloat16 roof": 8.3e11}
    assert compute_roof_labels({"flops_per_s": 1e11, "bytes_per_s": 1e10}) == {"compute roof": 1e11}


def test_summary_shows_utilisation_throughput_and_eager_cards(real: Profile) -> None:
    from graphprof.profile.step_facts import with_eager_times, with_workload

    profile = with_workload(with_eager_times(real, [0.5, 0.2, 0.21], first_is_cold=True), samples_per_step=16)
    page = html_report(profile, ExportOptions())
    summary = page.split('id="summary"', 1)[1].split("</section>", 1)[0]
    for card in ("samples/s", "eager step vs graph"):
        assert card in summary
    assert ("MFU (calibrated peak)" in summary) == bool(profile.meta.peaks)
    assert "model FLOP/s" in summary or "MFU" in summary


def test_op_type_and_module_groups_are_the_analysis_groups() -> None:
    """The HTML report shows the analysis's groups (analysis.aggregate), not a regrouping of its own:
    an op type with one node of unknown FLOPs shows the FLOPs the table's type group shows."""
    from tests.analysis.conftest import node, one_graph_profile

    profile = one_graph_profile([node(0, "mm", times=(2e-3,), flops=1000, module="enc.lin"),
                                 node(1, "mm", times=(1e-3,), flops=None, module="enc.lin"),
                                 node(2, "relu", times=(1e-3,), flops=10, module="head")], walls_s=(5e-3,))
    table = json.loads(profile.table(0, aggregate_by="type", format="json"))
    mm = next(r for r in table["table"]["rows"] if r["label"] == "mm")
    assert mm["flops"] == 1000 and mm["calls"] == 2
    page = html_report(profile, ExportOptions(findings=()))
    by_op = page[page.index('id="by-op"'):]
    row = by_op[by_op.index(">mm</td>"):by_op.index("</tr>", by_op.index(">mm</td>"))]
    assert f'data-v="{mm["flops"]:.9g}"' in row and 'data-v="2"' in row  # FLOPs and the group's two ops
