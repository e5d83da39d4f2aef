"""``core.defaults``: the values operator and sensor signatures name, importable for nothing."""

from __future__ import annotations

import ast
from pathlib import Path

from airflow_provider_tao_slurm.core import defaults
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

SOURCE = Path(defaults.__file__).read_text()


def test_defaults_module_imports_nothing() -> None:
    imported = [node for node in ast.walk(ast.parse(SOURCE)) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert [(node.module if isinstance(node, ast.ImportFrom) else None) for node in imported] == ["__future__"]


def test_hook_uses_the_single_definition() -> None:
    assert SlurmHook.default_conn_name is defaults.DEFAULT_CONN_ID
