"""Load an example DAG file of ``dags/`` as a module, for the unit tests of its callables and structure."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DAGS = Path(__file__).resolve().parents[2] / "dags"


def load_example(name: str) -> ModuleType:
    """Import ``dags/<name>.py`` under the module name ``name``."""
    spec = importlib.util.spec_from_file_location(name, DAGS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
