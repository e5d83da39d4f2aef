"""Load a file as a module for the unit tests: an example DAG of ``dags/``, or a script of ``benchmarks/`` or
``tests/cluster/`` that is not on the import path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DAGS = Path(__file__).resolve().parents[2] / "dags"


def load_file(name: str, path: Path) -> ModuleType:
    """Import the file at ``path`` as the module ``name``, registered in ``sys.modules`` (dataclasses look their
    module up there while the class is made)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_example(name: str) -> ModuleType:
    """Import ``dags/<name>.py`` under the module name ``name``."""
    return load_file(name, DAGS / f"{name}.py")
