"""DESIGN rule: the analysis side never imports torch."""

from __future__ import annotations

import subprocess
import sys


def test_profile_analysis_render_and_cli_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import graphprof, graphprof.profile, graphprof.analysis.table, graphprof.render.console, graphprof.cli\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_version_comes_from_the_package_metadata_and_reaches_profiles() -> None:
    from importlib.metadata import version

    import graphprof
    from graphprof.runtime.collect import profile_meta

    assert graphprof.__version__ == version("graphprof")
    assert profile_meta("step", "fx", 0.0).graphprof_version == graphprof.__version__
