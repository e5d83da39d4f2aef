"""The layers import only downwards: core -> hooks -> lifecycle -> triggers -> operators/sensors.

No operator imports another operator (only the shared ``base`` and ``links`` modules), no sensor
imports an operator module, no trigger module imports an operator or a sensor, and operators and
sensors take nothing from ``triggers`` but the trigger class they defer to.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_tao_slurm"
ROOT = "airflow_provider_tao_slurm"
SHARED_OPERATOR_MODULES = {f"{ROOT}.operators.base", f"{ROOT}.operators.links"}
LAYERS = {"core": 0, "hooks": 1, "lifecycle": 2, "triggers": 3, "operators": 4, "sensors": 4}


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every ``import``/``from ... import`` in ``path`` (functions included)."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def modules(folder: str) -> list[Path]:
    return sorted(p for p in (PACKAGE / folder).glob("*.py") if p.name != "__init__.py")


def module_name(path: Path) -> str:
    return f"{ROOT}.{path.parent.name}.{path.stem}"


@pytest.mark.parametrize("path", [*modules("operators"), *modules("sensors"), *modules("triggers")], ids=module_name)
def test_no_sideways_imports(path: Path) -> None:
    me = module_name(path)
    layer = path.parent.name
    for module, names in imports(path):
        if not module.startswith(f"{ROOT}."):
            continue
        if layer == "operators" and module.startswith(f"{ROOT}.operators."):
            assert module in SHARED_OPERATOR_MODULES, f"{me} imports the operator module {module}"
        if layer == "sensors":
            assert not module.startswith(f"{ROOT}.operators"), f"{me} imports {module}"
        if layer == "triggers":
            assert not module.startswith((f"{ROOT}.operators", f"{ROOT}.sensors")), f"{me} imports {module}"
        if layer in ("operators", "sensors") and module.startswith(f"{ROOT}.triggers"):
            assert names == ["SlurmJobTrigger"], f"{me} takes {names} from {module}; only the trigger class"


@pytest.mark.parametrize("folder", ["core", "hooks", "lifecycle", "triggers"])
def test_lower_layers_never_import_higher_ones(folder: str) -> None:
    for path in modules(folder):
        for module, _ in imports(path):
            parts = module.split(".")
            if parts[0] != ROOT or len(parts) < 2 or parts[1] not in LAYERS:
                continue
            assert LAYERS[parts[1]] <= LAYERS[folder], f"{module_name(path)} imports the higher layer {module}"
