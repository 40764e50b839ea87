"""Suite-wide fixtures, and the type check started when the suite starts."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The test that reads the type check's result (tests/test_lint.py).
MYPY_TEST = "tests/test_lint.py::test_mypy_finds_nothing"


class BackgroundRun:
    """A command started before the first test and read by the test that asks for it.

    Why: mypy over the package takes a minute and a core; started when
    collection ends, it runs beside the tests (which keep torch on one core
    most of the time), and the suite is that minute shorter.
    """

    def __init__(self, *args: str) -> None:
        self.args = args
        self.output = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=self.output,
                                        stderr=subprocess.STDOUT, text=True)

    def result(self) -> tuple[int, str]:
        """The exit status and the output, once the command is done."""
        status = self.process.wait()
        self.output.seek(0)
        return status, self.output.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.output.close()


RUNS: dict[str, BackgroundRun] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.option.collectonly and any(item.nodeid == MYPY_TEST for item in items):
        RUNS["mypy"] = BackgroundRun("mypy")


def pytest_unconfigure(config: pytest.Config) -> None:
    for run in RUNS.values():
        run.stop()
    RUNS.clear()


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never read or write the developer's graphprof cache (calibrated peaks)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    yield
    mp.undo()
