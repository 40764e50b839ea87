"""Every view of a loaded profile reads its columns: none builds the graphs' NodeRecords, and each
gives exactly what it gives for the profile built in memory (whose views read records).

Why it matters: building the records is most of a load's cost on a large profile, so one view
that reads ``graph.nodes`` makes every command that shows it slower by that much.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from graphprof import api
from graphprof.api import Profile
from graphprof.render.graphml import graphml_via_networkx

EXPORTS = ("out.trace.json", "out.trace.json.gz", "out.dot", "out.graphml", "out.nodelink.json", "out.folded",
           "out.html", "out.memory.svg")


def _no_records_built(profile: Profile) -> bool:
    return all(g.__dict__["nodes"] is None for g in profile.graphs)


@pytest.fixture()
def loaded(real: Profile, tmp_path: Path) -> Profile:
    path = tmp_path / "real.json"
    real.save(path)
    profile = Profile.load(path)
    assert _no_records_built(profile)
    return profile


def test_report_notebook_and_memory_views_build_no_records_and_equal_the_built_profile(real: Profile, loaded: Profile) -> None:
    assert api.report(loaded) == api.report(real)
    assert api.notebook(loaded) == api.notebook(real)
    assert api.memory_summary(loaded) == api.memory_summary(real)
    assert api.table(loaded, top=20, aggregate_by="module") == api.table(real, top=20, aggregate_by="module")
    assert _no_records_built(loaded)


def test_a_diff_of_two_loaded_profiles_builds_no_records(real: Profile, loaded: Profile, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    real.save(other)
    after = Profile.load(other)
    assert api.diff_text(loaded, after) == api.diff_text(real, real)
    assert _no_records_built(loaded) and _no_records_built(after)


@pytest.mark.parametrize("name", EXPORTS)
def test_every_export_of_a_loaded_profile_builds_no_records_and_writes_the_same_document(
        real: Profile, loaded: Profile, tmp_path: Path, name: str) -> None:
    (tmp_path / "built").mkdir()
    (tmp_path / "loaded").mkdir()
    api.export(real, tmp_path / "built" / name)
    api.export(loaded, tmp_path / "loaded" / name)
    built, from_file = (tmp_path / "built" / name).read_bytes(), (tmp_path / "loaded" / name).read_bytes()
    if name.endswith(".gz"):
        built, from_file = gzip.decompress(built), gzip.decompress(from_file)
    if name.endswith((".json", ".gz")):
        # The same document. A node's memory categories are in the file's (sorted) key order when
        # loaded and in the order the memory pass met them when built, so the bytes differ there.
        assert json.loads(from_file) == json.loads(built)
    elif not name.endswith(".graphml"):
        assert from_file == built
    # DOT draws a graph of at most 600 ops node by node from a networkx graph of its records (cheap
    # at that size); larger graphs get the module view, which reads columns.
    assert _no_records_built(loaded) or name == "out.dot"
    if name.endswith(".graphml"):  # against networkx's writer on the same loaded profile (it reads records)
        assert from_file.decode() == graphml_via_networkx(loaded)


@pytest.mark.parametrize("order_by", ["flops", "+name", "shape", "phase", "calls", "bandwidth", "graph"])
def test_a_table_ordered_by_a_column_other_than_time_builds_no_records(real: Profile, loaded: Profile,
                                                                      order_by: str) -> None:
    for options in ({"top": 15}, {"top": 15, "aggregate_by": "graph"}):
        assert api.table(loaded, order_by=order_by, **options) == api.table(real, order_by=order_by, **options)
    assert _no_records_built(loaded)


@pytest.mark.parametrize("options", [{"name": "add|conv"}, {"type": ["convolution", "add"]}, {"module": "layer1"},
                                     {"phase": "backward", "order_by": "+type"}, {"aggregate_by": "graph"}])
def test_a_filtered_diff_of_two_loaded_profiles_builds_no_records(real: Profile, loaded: Profile, tmp_path: Path,
                                                                  options: dict) -> None:
    other = tmp_path / "other.json"
    real.save(other)
    after = Profile.load(other)
    assert api.diff_text(loaded, after, top=20, **options) == api.diff_text(real, real, top=20, **options)
    assert _no_records_built(loaded) and _no_records_built(after)


def test_the_distributed_analysis_of_a_loaded_merged_profile_builds_no_records(tmp_path: Path) -> None:
    from graphprof.analysis.distributed import analyze_distributed
    from graphprof.profile.merge import merge_profiles
    from tests.distributed.synthetic import rank_profile

    merged = merge_profiles([rank_profile(0, comm_s=(0.004, 0.001)),
                             rank_profile(1, compute_s=0.013, comm_s=(0.005, 0.002))])
    merged.save(tmp_path / "merged.json")
    loaded = Profile.load(tmp_path / "merged.json")
    for stat in ("median", "mean"):
        assert analyze_distributed(loaded, stat=stat) == analyze_distributed(merged, stat=stat)
    assert _no_records_built(loaded)
    # The report's table shows all 8 nodes, so it makes their records (only the rows shown are made).
    assert api.report(loaded) == api.report(merged)
