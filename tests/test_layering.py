"""DESIGN rules on imports: they point one way, the analysis side never imports torch, no cycles.

The direction is written as import-linter contracts in pyproject.toml
(``[tool.importlinter]``) and checked here, so ``pytest`` is the one command
that enforces it. import-linter sees function-level imports too; the few
upward ones the design allows are named in the contracts' ``ignore_imports``,
and ``test_allowed_upward_imports_stay_inside_functions`` keeps them lazy.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Cycles still being removed elsewhere: each entry names its modules; remove the entry
#: when the cycle goes (the test says so), never add one.
KNOWN_CYCLES: tuple[frozenset[str], ...] = ()


def test_import_contracts_hold() -> None:
    code = "import sys\nfrom importlinter.cli import lint_imports\nsys.exit(lint_imports(no_cache=True, no_logo=True))\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _ignored_imports() -> list[tuple[str, str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    pairs = set()
    for contract in config["contracts"]:
        for expression in contract.get("ignore_imports", ()):
            importer, imported = (part.strip() for part in expression.split("->"))
            pairs.add((importer, imported))
    return sorted(pairs)


def _module_file(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _top_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import outside a function body (module level, classes, ifs)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.lineno, child.module))
                found.extend((child.lineno, f"{child.module}.{alias.name}") for alias in child.names)
            visit(child)

    visit(tree)
    return found


def test_allowed_upward_imports_stay_inside_functions() -> None:
    """An allowed upward import is a thin method's or a command's own; loading its module loads nothing above."""
    pairs = _ignored_imports()
    assert pairs, "pyproject.toml lost its import-linter contracts"
    for importer, imported in pairs:
        pattern = imported.replace(".**", ".*")
        tree = ast.parse(_module_file(importer).read_text())
        eager = [(line, name) for line, name in _top_level_imports(tree)
                 if name == imported or fnmatch.fnmatchcase(name, pattern)]
        assert not eager, f"{importer} imports {eager} at module level; the contract allows it only inside functions"


def _module_graph() -> dict[str, set[str]]:
    import grimp  # installed with import-linter

    graph = grimp.build_graph("graphprof", cache_dir=None)
    allowed = _ignored_imports()

    def counted(importer: str, imported: str) -> bool:
        # The contracts' named upward imports (a thin method calling the layer above when called)
        # are the design's front doors, not cycles; everything else counts.
        return not any(importer == a and (imported == b or fnmatch.fnmatchcase(imported, b.replace(".**", ".*")))
                       for a, b in allowed)

    return {m: {i for i in graph.find_modules_directly_imported_by(m) if counted(m, i)} for m in graph.modules}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]


def test_no_import_cycles() -> None:
    """Every import counts, function-level and TYPE_CHECKING ones too: a cycle is a cycle in the design."""
    cycles = set(_cycles(_module_graph()))
    new = [sorted(c) for c in cycles - set(KNOWN_CYCLES)]
    gone = [sorted(c) for c in set(KNOWN_CYCLES) - cycles]
    assert not new, f"import cycles: {new}; move what both sides share down a layer"
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES in {Path(__file__).name}: {gone}"


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
