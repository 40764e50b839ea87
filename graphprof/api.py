"""The views of a profile, as functions: ``table``, ``report``, ``export``, ``diff_text``, ``memory_summary``.

A ``Profile`` (``graphprof.profile.model``) is pure data; these functions read
it through analysis and rendering, and ``Profile``'s methods of the same names
call them. They live here, above render, so that the layering stays one way
(profile <- analysis <- render <- api); ``graphprof`` re-exports them.
``graphprof.diff`` is the comparison as data (``graphprof.analysis.diff``);
``diff_text`` is that comparison as ``graphprof diff`` prints it.
"""

from __future__ import annotations

import os

from typing import Any, Iterable

from graphprof.profile.model import Profile


def table(
    profile: Profile, top: int = 10, *, type: str | Iterable[str] | None = None, name: str | None = None,
    module: str | None = None, input_dtype: str | None = None, phase: str | Iterable[str] | None = None,
    aggregate: str | None = None, aggregate_by: str | None = None, order_by: str = "time",
    min_time: float | None = None, max_time: float | None = None, stat: str = "median",
    print_only: str | None = None, format: str = "simple", module_depth: int | None = None,
    clock: str = "auto", width: int | None = None, wide: bool = False,
    columns: str | Iterable[str] | None = None,
) -> str:
    """The summary and the ``top`` rows (0 = all) as text; the options of ``graphprof analyze``.

    Same names and meanings as the command's flags (``type`` and ``phase``
    take one value or a list; ``min_time``/``max_time`` are seconds), e.g.
    ``profile.table(5, aggregate_by="type")`` or
    ``profile.table(type="convolution", order_by="+flops", format="json")``. The text fits
    ``width`` characters (default: COLUMNS, the terminal, else 120); ``wide=True`` or
    ``columns="time,name,flops"`` (or "all") print more.
    A bad value raises ValueError with one sentence.
    """
    from graphprof.analysis.options import make_options
    from graphprof.analysis.table import build_table
    from graphprof.render.console import render_table

    options = make_options(
        top, type=type, name=name, module=module, input_dtype=input_dtype, phase=phase,
        aggregate=aggregate, aggregate_by=aggregate_by, order_by=order_by, min_time=min_time,
        max_time=max_time, stat=stat, print_only=print_only, format=format,
        module_depth=module_depth, clock=clock, width=width, wide=wide, columns=columns,
    )
    return render_table(build_table(profile, options))

def report(profile: Profile, top: int = 10, stat: str = "median", peaks: dict[str, float] | None = None,
           module_depth: int = 2, *, tokens_per_step: float | None = None,
           samples_per_step: float | None = None, width: int | None = None, wide: bool = False) -> str:
    """The bottleneck report as text: summary, utilisation, findings, roofline, critical path, breakdowns.

    ``peaks`` (``{"flops_per_s": ...}``, optionally ``"bytes_per_s"``)
    are the user's: MFU/HFU are shown against them next to the peaks
    recorded in the profile's meta by ``graphprof calibrate``, and they
    replace those in the roofline. ``tokens_per_step``/``samples_per_step``
    say what one step processes, for throughput (they override the
    ones recorded in the profile). Tables and prose fit ``width``
    characters (default: the terminal's, else 120) as ``table()``'s do;
    ``wide=True`` leaves every line whole.
    """
    from graphprof.analysis.report import build_report
    from graphprof.analysis.utilisation import given_peaks
    from graphprof.profile.step_facts import Workload
    from graphprof.render.fit import resolve_width
    from graphprof.render.report_text import render_report

    fit_to = resolve_width(width, wide)
    flops = peaks.get("flops_per_s") if peaks else None
    given = given_peaks(profile, flops, peaks.get("bytes_per_s") if peaks else None)
    return render_report(build_report(profile, given, stat=stat, top=top, module_depth=module_depth,
                                      peak_flops_per_s=flops,
                                      workload=Workload(tokens_per_step, samples_per_step)), fit_to)

def notebook(profile: Profile) -> str:
    """Jupyter's rich view: summary, MFU/HFU, findings and top nodes, from the HTML report's parts."""
    from graphprof.render.notebook import notebook_html

    return notebook_html(profile)

def memory_summary(profile: Profile, graph_id: int = 0, top: int = 10) -> str:
    """The modelled memory peak of graph ``graph_id`` as text.

    Peak bytes and the node, module and source line where it happens,
    bytes live before and after the step, the peak split by category
    (parameters, gradients, optimizer state, activations, ...) and the
    ``top`` largest tensors alive at the peak. On an accelerator with
    ``sample_rate`` set, the allocator's measured figures come next to it.
    """
    from graphprof.analysis.memory import memory_summary
    from graphprof.render.memory_text import render_memory_summary

    return render_memory_summary(memory_summary(profile, graph_id), top=top)

def export(profile: Profile, path: str | os.PathLike[str], format: str | None = None, **options: Any) -> str:
    """Write this profile to ``path`` in the format its name implies; returns the format's name.

    ``.trace.json``/``.json`` Chrome/Perfetto trace (``.trace.json.gz`` gzip-compressed), ``.dot``/``.svg`` annotated
    graph, ``.graphml``, ``.nodelink.json``, ``.folded`` flame-graph stacks,
    ``.html`` report, ``memory.svg`` memory timeline; ``format`` overrides the
    name. Options: ``stat``, ``module_level`` (None = automatic), ``hide_views``,
    ``max_nodes``, ``graph_id``, ``bounds``, ``findings`` (see
    ``graphprof.render.exporters.ExportOptions``). Writes atomically; a path or
    option that cannot work raises ``ExportError`` (a ValueError) with one sentence.
    """
    from graphprof.render.exporters import export_profile

    return export_profile(profile, path, format=format, **options)

def diff_text(profile: Profile, other: Profile | str | os.PathLike[str], top: int = 10, *, order_by: str = "time",
         fail_if_slower: float | None = None, **options: Any) -> str:
    """This profile (before) against ``other`` (after, a Profile or a file), as ``graphprof diff`` prints it.

    Changed node pairs by absolute time change, changes by op type, module
    and phase, totals; the table options of ``table`` as keywords.
    ``graphprof.diff(a, b)`` returns the same comparison as data.
    """
    from graphprof.analysis.diff import diff
    from graphprof.render.diff_text import render_diff

    return render_diff(diff(profile, other, top=top, order_by=order_by, fail_if_slower=fail_if_slower, **options))


def load(path: str | os.PathLike[str]) -> Profile:
    """Read a profile saved by ``Profile.save`` or ``json.dump``; validates it."""
    return Profile.load(path)
