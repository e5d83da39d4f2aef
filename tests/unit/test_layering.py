"""The layers import only downwards: core -> hooks -> lifecycle -> triggers -> operators/sensors.

No operator imports another operator (only the shared ``base`` and ``links`` modules), no sensor
imports an operator module, no trigger module imports an operator or a sensor, and operators and
sensors take nothing from ``triggers`` but the trigger class they defer to.

Imports are read with :mod:`ast` (also those inside functions and ``TYPE_CHECKING`` blocks);
relative imports are resolved, and ``from package import module`` counts as importing the module.
The rules are checked on the package and, to show they bite, on made-up sources.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_tao_slurm"
ROOT = "airflow_provider_tao_slurm"
SHARED_OPERATOR_MODULES = {"base", "links"}
LAYERS = {"core": 0, "hooks": 1, "lifecycle": 2, "triggers": 3, "operators": 4, "sensors": 4}
#: Upward imports of the previous release's names, each inside its deprecated alias only, until the next release
#: removes them: ``SlurmHook.reconcile_by_name`` and ``submit(reconcile_timeout=...)`` call the lifecycle's submission.
DEPRECATED_UPWARD = {
    (f"{ROOT}.hooks.slurm", f"{ROOT}.lifecycle"),
    (f"{ROOT}.hooks.slurm", f"{ROOT}.lifecycle.submission"),
}


@dataclass(frozen=True)
class Imported:
    """One import statement: the absolute module and the names taken from it (empty for ``import x``)."""

    module: str
    names: tuple[str, ...]

    def targets(self) -> list[str]:
        """The module and, for ``from M import n``, ``M.n`` (which is a module when ``n`` is one)."""
        return [self.module, *(f"{self.module}.{name}" for name in self.names)]


def imports(source: str, me: str) -> list[Imported]:
    """Every import in ``source``, the source of module ``me``, with relative imports made absolute."""
    package = me.split(".")[:-1]
    found: list[Imported] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append(Imported(module, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Import):
            found.extend(Imported(alias.name, ()) for alias in node.names)
    return found


def violations(me: str, source: str) -> list[str]:
    """What module ``me`` (``ROOT.<layer>.<name>``) imports that its layer may not."""
    layer = me.split(".")[1]
    found: list[str] = []
    for imported in imports(source, me):
        for target in imported.targets():
            parts = target.split(".")
            if parts[0] != ROOT or len(parts) < 2 or parts[1] not in LAYERS:
                continue
            other = parts[1]
            if LAYERS[other] > LAYERS[layer] and (me, target) not in DEPRECATED_UPWARD:
                found.append(f"{me} imports the higher layer {target}")
            shared = len(parts) < 3 or parts[2] in SHARED_OPERATOR_MODULES
            if layer == "operators" and other == "operators" and not shared:
                found.append(f"{me} imports the operator module {target}")
            if layer == "sensors" and other == "operators":
                found.append(f"{me} imports {target}")
            if layer == "triggers" and other in ("operators", "sensors"):
                found.append(f"{me} imports {target}")
        from_triggers = imported.module.split(".")[:2] == [ROOT, "triggers"]
        only_the_class = imported.names == ("SlurmJobTrigger",) and len(imported.module.split(".")) >= 3
        if layer in ("operators", "sensors") and from_triggers and not only_the_class:
            found.append(f"{me} takes {list(imported.names)} from {imported.module}; only the trigger class")
        if layer in ("operators", "sensors") and imported.module == ROOT and "triggers" in imported.names:
            found.append(f"{me} imports the triggers package; only the trigger class")
    return list(dict.fromkeys(found))


def modules(folder: str) -> list[Path]:
    """Every module of a layer, in its subpackages too (``core/commands/*``), but the packages' ``__init__``."""
    return sorted(p for p in (PACKAGE / folder).rglob("*.py") if p.name != "__init__.py")


def module_name(path: Path) -> str:
    return ".".join([ROOT, *path.relative_to(PACKAGE).with_suffix("").parts])


def package_module_name(path: Path) -> str:
    """The module's dotted name; a package's ``__init__`` is the package itself."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ALL_MODULES = [path for folder in LAYERS for path in modules(folder)]


def test_every_layer_has_modules() -> None:
    assert all(modules(folder) for folder in LAYERS)


@pytest.mark.parametrize("path", ALL_MODULES, ids=module_name)
def test_no_sideways_or_upward_imports(path: Path) -> None:
    assert violations(module_name(path), path.read_text()) == []


OPERATOR = f"{ROOT}.operators.nccl_probe"
SENSOR = f"{ROOT}.sensors.slurm_job"
TRIGGER = f"{ROOT}.triggers.slurm_job"


@pytest.mark.parametrize(
    ("me", "source", "bad"),
    [
        pytest.param(OPERATOR, f"from {ROOT}.operators.sbatch_submit import SbatchSubmitOperator", True, id="op-op"),
        pytest.param(OPERATOR, f"from {ROOT}.operators import sbatch_submit", True, id="op-op-from-package"),
        pytest.param(OPERATOR, "from .enroot_import import EnrootImportOperator", True, id="op-op-relative"),
        pytest.param(OPERATOR, "from . import preflight", True, id="op-op-relative-package"),
        pytest.param(OPERATOR, f"import {ROOT}.operators.enroot_import", True, id="op-op-plain-import"),
        pytest.param(
            OPERATOR, f"def f():\n    from {ROOT}.operators.preflight import P\n", True, id="op-op-in-function"
        ),
        pytest.param(OPERATOR, f"from {ROOT}.operators.base import TaoBaseOperator", False, id="op-base-ok"),
        pytest.param(OPERATOR, "from .links import SlurmJobLink", False, id="op-links-relative-ok"),
        pytest.param(OPERATOR, f"from {ROOT}.operators import base, links", False, id="op-shared-from-package-ok"),
        pytest.param(SENSOR, f"from {ROOT}.operators.base import TaoBaseOperator", True, id="sensor-op-base"),
        pytest.param(SENSOR, "from ..operators import base", True, id="sensor-op-relative"),
        pytest.param(SENSOR, f"from {ROOT} import operators", True, id="sensor-op-package"),
        pytest.param(TRIGGER, f"from {ROOT}.sensors.slurm_job import SlurmJobSensor", True, id="trigger-sensor"),
        pytest.param(TRIGGER, "from ..operators.base import TaoBaseOperator", True, id="trigger-op-relative"),
        pytest.param(TRIGGER, f"from {ROOT}.lifecycle.jobs import JobLifecycle", False, id="trigger-lifecycle-ok"),
        pytest.param(OPERATOR, f"from {ROOT}.triggers.slurm_job import SlurmJobTrigger", False, id="op-trigger-ok"),
        pytest.param(SENSOR, "from ..triggers.slurm_job import SlurmJobTrigger", False, id="sensor-trigger-rel-ok"),
        pytest.param(
            OPERATOR,
            f"from {ROOT}.triggers.slurm_job import ACCOUNTING_SETTLE_S, SlurmJobTrigger",
            True,
            id="op-trigger-more-than-the-class",
        ),
        pytest.param(OPERATOR, f"from {ROOT}.triggers.poller import get_poller", True, id="op-poller"),
        pytest.param(SENSOR, f"import {ROOT}.triggers.slurm_job", True, id="sensor-trigger-module"),
        pytest.param(SENSOR, f"from {ROOT}.triggers import slurm_job", True, id="sensor-trigger-from-package"),
        pytest.param(SENSOR, f"from {ROOT} import triggers", True, id="sensor-triggers-package"),
        pytest.param(f"{ROOT}.core.states", f"from {ROOT}.hooks.slurm import SlurmHook", True, id="core-hooks"),
        pytest.param(f"{ROOT}.hooks.slurm", "from ..lifecycle.jobs import JobLifecycle", True, id="hooks-lifecycle"),
        pytest.param(
            f"{ROOT}.lifecycle.jobs", f"from {ROOT}.triggers.slurm_job import SlurmJobTrigger", True, id="lc-trigger"
        ),
        pytest.param(f"{ROOT}.lifecycle.jobs", "from ..hooks.slurm import SlurmHook", False, id="lifecycle-hooks-ok"),
        pytest.param(
            f"{ROOT}.lifecycle.jobs",
            f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {ROOT}.sensors.slurm_job import S\n",
            True,
            id="type-checking-counts",
        ),
        pytest.param(
            OPERATOR,
            f"import json\nfrom airflow.sdk import BaseOperator\nfrom {ROOT} import exceptions",
            False,
            id="other",
        ),
    ],
)
def test_the_rules_bite(me: str, source: str, bad: bool) -> None:
    assert bool(violations(me, source)) is bad, violations(me, source)


@pytest.mark.parametrize(
    ("me", "source", "expected"),
    [
        pytest.param(SENSOR, "from ..triggers.slurm_job import X", f"{ROOT}.triggers.slurm_job", id="two-levels"),
        pytest.param(OPERATOR, "from .base import X", f"{ROOT}.operators.base", id="one-level"),
        pytest.param(OPERATOR, "from . import base", f"{ROOT}.operators", id="package"),
        pytest.param(OPERATOR, "from ... import x", "", id="above-the-root"),
    ],
)
def test_relative_imports_are_resolved(me: str, source: str, expected: str) -> None:
    (imported,) = imports(source, me)
    assert imported.module == expected


# ---------------------------------------------------------------------- one path per promise

#: Hook verbs only the job-lifecycle layer calls: every submission goes through
#: ``lifecycle.submission.submit_job`` (reconciled when its outcome is unknown), every cancel through
#: ``JobLifecycle.cancel_job``/``a_cancel`` (record and sidecar with it).
LIFECYCLE_ONLY_VERBS = {"submit", "cancel", "a_cancel", "find_jobs_by_name"}
#: Where an ambiguous name is decided, and where a wait decides that a job vanished or is stuck.
ONLY_IN = {
    "AmbiguousSubmissionError": {f"{ROOT}.lifecycle.submission"},
    "EventStatus.VANISHED": {f"{ROOT}.lifecycle.watch"},
    "EventStatus.UNRECOGNISED": {f"{ROOT}.lifecycle.watch"},
}


def second_paths(me: str, source: str) -> list[str]:
    """Calls of lifecycle-only hook verbs outside the lifecycle, and decisions made outside their one module."""
    found: list[str] = []
    layer = me.split(".")[1]
    for node in ast.walk(ast.parse(source)):
        if (
            layer != "lifecycle"
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LIFECYCLE_ONLY_VERBS
            and re.fullmatch(r"(.*\.)?_?hook(\(\))?", ast.unparse(node.func.value))
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}() outside the lifecycle")
        if isinstance(node, ast.Call):
            made = ast.unparse(node.func)
            if made in ONLY_IN and me not in ONLY_IN[made]:
                found.append(f"line {node.lineno}: raises {made} outside {sorted(ONLY_IN[made])}")
        if isinstance(node, ast.Call) and node.args:
            first = ast.unparse(node.args[0])
            if ast.unparse(node.func).endswith("JobEvent") and first in ONLY_IN and me not in ONLY_IN[first]:
                found.append(f"line {node.lineno}: decides {first} outside {sorted(ONLY_IN[first])}")
    return found


@pytest.mark.parametrize("path", ALL_MODULES, ids=module_name)
def test_each_promise_has_one_path(path: Path) -> None:
    assert second_paths(module_name(path), path.read_text()) == []


@pytest.mark.parametrize(
    ("me", "source"),
    [
        pytest.param(OPERATOR, "self.hook.submit(script, name, log_dir=d)", id="operator-submits"),
        pytest.param(OPERATOR, "self.hook.cancel([job_id], job_name=name)", id="operator-cancels"),
        pytest.param(SENSOR, "hook.find_jobs_by_name(name)", id="sensor-looks-up"),
        pytest.param(f"{ROOT}.lifecycle.jobs", "raise AmbiguousSubmissionError('x')", id="ambiguous-elsewhere"),
        pytest.param(SENSOR, "JobEvent(EventStatus.VANISHED, '1', 'x')", id="sensor-decides-vanished"),
    ],
)
def test_the_one_path_rules_bite(me: str, source: str) -> None:
    assert second_paths(me, source)


def test_the_module_map_lists_every_module_once() -> None:
    """docs/module-map.md has one line per module of the package: none missing, none extra, none twice."""
    modules = {package_module_name(path) for path in PACKAGE.rglob("*.py")}
    text = (PACKAGE.parent / "docs" / "module-map.md").read_text()
    listed = re.findall(r"^\| `(airflow_provider_tao_slurm[\w.]*)` \| \S", text, flags=re.MULTILINE)
    assert sorted(listed) == sorted(set(listed)), "a module is listed twice"
    assert set(listed) == modules, f"missing: {sorted(modules - set(listed))}; gone: {sorted(set(listed) - modules)}"


# ---------------------------------------------------------------------- functions short enough to read whole

#: The most lines a function may take, its docstring and decorators counted (issue 43, item 5).
MAX_FUNCTION_LINES = 60
#: Functions that are tables of data, not steps to follow: ``get_provider_info`` is the provider's metadata
#: (connection type, hooks, operators, triggers...) as the literal dict Airflow reads, one key a line.
LONG_TABLES = {f"{ROOT}.get_provider_info"}


def long_functions(me: str, source: str) -> list[str]:
    """Every function (methods and nested ones too) of module ``me`` longer than :data:`MAX_FUNCTION_LINES`.

    :returns: ``<qualified name> (<n> lines, line <first>)`` each; the allowed tables left out.
    """
    found: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = (
                f"{prefix}.{child.name}"
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                else prefix
            )
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(decorator.lineno for decorator in child.decorator_list)])
                lines = (child.end_lineno or child.lineno) - first + 1
                if lines > MAX_FUNCTION_LINES and name not in LONG_TABLES:
                    found.append(f"{name} ({lines} lines, line {first})")
            visit(child, name)

    visit(ast.parse(source), me)
    return found


def test_every_function_reads_whole() -> None:
    """No function of the package is over 60 lines (tables of data aside, :data:`LONG_TABLES`)."""
    found = [
        item
        for path in sorted(PACKAGE.rglob("*.py"))
        for item in long_functions(package_module_name(path), path.read_text())
    ]
    assert found == [], f"split into helpers that read whole (one job each): {found}"


def test_the_length_rule_bites() -> None:
    body = [f"x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1)]
    decorated = ["class C:", "    @staticmethod", "    def long():", *(f"        {line}" for line in body)]
    plain = ["def short():", *(f"    {line}" for line in body)]
    source = "\n".join([*decorated, *plain]) + "\n"
    assert long_functions(f"{ROOT}.core.made_up", source) == [
        f"{ROOT}.core.made_up.C.long ({MAX_FUNCTION_LINES + 1} lines, line 2)"
    ]
    table = "\n".join(["def get_provider_info():", *(f"    {line}" for line in body * 2)])
    assert long_functions(ROOT, table) == []
