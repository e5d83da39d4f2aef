"""Print the package's shape (issue 50): run it before and after a refactor, and compare.

``make shape`` (or ``.venv/bin/python tests/shape.py``) prints, for ``airflow_provider_tao_slurm``:

- its files and lines (every line of every ``.py`` file, blank and docstring lines included);
- the ten largest modules, classes and functions (a definition's lines from its ``def``/``class`` line to its
  last, docstring included);
- the modules, classes and functions over the limits of issue 50 (600, 400 and 50 lines);
- the import cycles among its modules (module-level imports only, ``TYPE_CHECKING`` blocks left out) and
  the number of imports inside functions;
- three paths as a reader follows them: the files that settling a finished job, submitting a job and an
  NCCL probe run through, in order, and how often execution comes back to a file it had already left
  (``returns``). Each path is one unit test run under :func:`sys.setprofile`: every call into and return to
  a frame of the package counts, the tests' own frames (their fakes) do not.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "airflow_provider_tao_slurm"
#: Issue 50's limits: lines of a module, a class, a function.
LIMITS = {"module": 600, "class": 400, "function": 50}
#: The paths followed, each by one unit test that runs it end to end against the unit fakes.
PATHS = {
    "settle": "tests/unit/sensors/test_slurm_job_sensor.py::"
    "test_completed_job_settles_complete_and_removes_the_sidecar",
    "submit": "tests/unit/operators/test_sbatch_submit.py::"
    "test_site_options_reach_the_script_and_the_default_partition_is_the_clusters",
    "nccl": "tests/unit/operators/test_nccl_probe.py::"
    "test_candidates_until_one_passes[triggerer-hang-then-p2p-disable]",
}


@dataclass(frozen=True)
class Definition:
    """A module, class or function of the package, and its length in lines."""

    kind: str
    name: str
    lines: int


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def definitions() -> list[Definition]:
    """Every module, class and function (methods and nested functions included) of the package."""
    found = []
    for name, path in _modules():
        text = path.read_text()
        found.append(Definition("module", name, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append(Definition(kind, f"{name}:{node.name}:{node.lineno}", lines))
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str, known: set[str]) -> set[str]:
    """The package modules an import statement of ``module`` names."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        parent = module.split(".")[: len(module.split(".")) - node.level + (1 if _is_package(module) else 0)]
        base = ".".join([*parent, base] if base else parent)
    targets = {f"{base}.{alias.name}" for alias in node.names} & known
    return targets or ({base} & known)


def _is_package(module: str) -> bool:
    return (REPO / Path(*module.split(".")) / "__init__.py").exists()


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: not in functions, not under ``if TYPE_CHECKING``."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    stack.append(child)
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    stack.extend(handler.body)


def imports() -> tuple[list[list[str]], list[list[str]], int]:
    """The import cycles of module-level imports, those of every import (in functions and ``TYPE_CHECKING`` blocks
    too; strongly connected modules, each sorted), and the number of imports inside functions."""
    modules = dict(_modules())
    known = set(modules)
    loaded: dict[str, set[str]] = {}
    named: dict[str, set[str]] = {}
    inside = 0
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        loaded[name] = set()
        for node in _module_level_imports(tree):
            loaded[name] |= _imported(node, name, known) - {name}
        named[name] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                named[name] |= _imported(node, name, known) - {name}
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside += sum(isinstance(node, (ast.Import, ast.ImportFrom)) for node in ast.walk(function))
    return _cycles(loaded), _cycles(named), inside


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


@dataclass
class PathTracer:
    """A pytest plugin that notes each call from one function of the package to another, once, in order."""

    edges: list[tuple[str, str]] = field(default_factory=list)
    _seen: set[tuple[Any, Any]] = field(default_factory=set)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        caller = frame.f_back
        if event != "call" or caller is None:
            return
        edge = (caller.f_code, frame.f_code)
        if edge in self._seen:
            return
        self._seen.add(edge)
        inside = str(PACKAGE)
        if frame.f_code.co_filename.startswith(inside):
            origin = caller.f_code.co_filename
            self.edges.append((origin if origin.startswith(inside) else "", frame.f_code.co_filename))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        sys.setprofile(self._profile)
        try:
            return (yield)
        finally:
            sys.setprofile(None)


def follow(test: str) -> tuple[list[str], int]:
    """The package files ``test`` runs through, in first-visit order, and the returns to a file already left.

    A return is a call, first made here, from a function of one file into a function of another file that the
    path had already visited: what a reader following the path does when they go back to a file.
    """
    tracer = PathTracer()
    options = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts="]
    code = pytest.main([str(REPO / test), *options], plugins=[tracer])
    if code != 0:
        raise SystemExit(f"{test} failed (pytest exit {code}): the path is not followed")
    seen: list[str] = []
    returns = 0
    for origin, target in tracer.edges:
        if target in seen:
            returns += origin != target
        else:
            seen.append(target)
    return [str(Path(name).relative_to(PACKAGE)) for name in seen], returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-paths", action="store_true", help="skip the three followed paths (no test runs)")
    args = parser.parse_args()
    found = definitions()
    modules = [item for item in found if item.kind == "module"]
    print(f"package: {len(modules)} files, {sum(item.lines for item in modules)} lines")
    for kind in ("module", "class", "function"):
        ranked = sorted((item for item in found if item.kind == kind), key=lambda item: (-item.lines, item.name))
        over = [item for item in ranked if item.lines > LIMITS[kind]]
        print(f"\nten largest {kind.replace('class', 'classe')}s ({len(over)} over {LIMITS[kind]} lines):")
        for item in ranked[:10]:
            print(f"  {item.lines:5d}  {item.name}")
    cycles, any_cycles, inside = imports()
    print(f"\nimport cycles at import time: {len(cycles)}")
    for cycle in cycles:
        print("  " + " <-> ".join(cycle))
    print(f"import cycles counting every import (in functions and TYPE_CHECKING blocks too): {len(any_cycles)}")
    for cycle in any_cycles:
        print("  " + " <-> ".join(cycle))
    print(f"imports inside functions: {inside}")
    if args.no_paths:
        return
    results = {name: follow(test) for name, test in PATHS.items()}
    for name, (files, returns) in results.items():
        print(f"\n{name} path ({PATHS[name]}): {len(files)} files, {returns} returns to a file already left")
        print("  " + " > ".join(files))


if __name__ == "__main__":
    main()
