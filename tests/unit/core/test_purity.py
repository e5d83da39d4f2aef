"""``core/`` is pure: it imports no Airflow or SSH library and performs no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "airflow_provider_tao_slurm" / "core"
FORBIDDEN_MODULES = {
    "airflow",
    "paramiko",
    "asyncssh",
    "socket",
    "subprocess",
    "requests",
    "urllib.request",
    "http",
    "ftplib",
    "shutil",
    "tempfile",
    "pathlib",
    "glob",
    "io",
    "asyncio",
    "threading",
    "time",
}
FORBIDDEN_CALLS = {"open", "exec", "eval", "input", "print", "__import__"}
FORBIDDEN_ATTRS = {
    ("os", "system"),
    ("os", "popen"),
    ("os", "environ"),
    ("os", "getenv"),
    ("os", "remove"),
    ("os", "makedirs"),
    ("os", "listdir"),
    ("os", "stat"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
}
SOURCES = sorted(CORE.rglob("*.py"))  # core/commands/* too


def test_core_has_modules() -> None:
    assert len(SOURCES) >= 2


def _violations(tree: ast.AST) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN_MODULES):
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            found.append(f"line {node.lineno}: calls {node.func.id}()")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in FORBIDDEN_ATTRS
        ):
            found.append(f"line {node.lineno}: uses {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("source", SOURCES, ids=[str(p.relative_to(CORE)) for p in SOURCES])
def test_core_module_is_pure(source: Path) -> None:
    assert _violations(ast.parse(source.read_text(), filename=str(source))) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "import airflow",
        "from paramiko import SSHClient",
        "open('x')",
        "import os\nos.environ['A']",
        "from datetime import datetime\ndatetime.now()",
        "import subprocess",
    ],
)
def test_checker_catches_violations(snippet: str) -> None:
    assert _violations(ast.parse(snippet))
