"""Parsing the example DAGs opens no network connection and loads no SSH library.

Each check runs in a fresh interpreter (a clean ``sys.modules``) whose socket creation and name
resolution are patched to raise before anything is imported. DAG files are parsed the way
Airflow's DAG processor does it: ``BundleDagBag`` over the file, then every DAG serialised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
DAG_FILES = sorted(DAGS.rglob("*.py"))
PACKAGE = REPO / "airflow_provider_tao_slurm"
DAG_FACING = ("operators", "sensors", "triggers", "hooks")
SSH_LIBRARIES = ("paramiko", "asyncssh")

GUARD = """
import json, socket, sys

def _refuse(*args, **kwargs):
    raise OSError("NETWORK AT PARSE TIME")

class _NoNewSockets(socket.socket):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None:
            _refuse()
        super().__init__(family, type, proto, fileno)

socket.socket = _NoNewSockets
socket.socketpair = _refuse
socket.create_connection = _refuse
socket.getaddrinfo = _refuse

def _ssh_loaded():
    return [name for name in ("paramiko", "asyncssh") if name in sys.modules]
"""

PARSE = """
from airflow.dag_processing.dagbag import BundleDagBag
from airflow.serialization.serialized_objects import DagSerialization

bag = BundleDagBag(dag_folder=sys.argv[1], bundle_path=sys.argv[2], bundle_name="dags-folder", load_op_links=False)
for dag in bag.dags.values():
    DagSerialization.to_dict(dag)
print(json.dumps({"dags": sorted(bag.dags), "errors": bag.import_errors, "ssh": _ssh_loaded()}))
"""

IMPORT = """
import importlib
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps({"ssh": _ssh_loaded()}))
"""


def run_guarded(code: str, *args: str) -> dict[str, Any]:
    """Run ``GUARD + code`` in a fresh interpreter; return the JSON it printed last."""
    proc = subprocess.run(
        [sys.executable, "-c", GUARD + code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def dag_facing_modules() -> list[str]:
    """Every module of the packages DAG files import from, found on disk."""
    modules = []
    for package in DAG_FACING:
        modules.append(f"airflow_provider_tao_slurm.{package}")
        modules += sorted(
            f"airflow_provider_tao_slurm.{package}.{path.stem}"
            for path in (PACKAGE / package).glob("*.py")
            if path.stem != "__init__"
        )
    return modules


@pytest.mark.parametrize(
    "attempt",
    [
        "socket.socket(socket.AF_INET, socket.SOCK_STREAM)",
        "socket.create_connection(('127.0.0.1', 22))",
        "socket.getaddrinfo('localhost', 22)",
        "__import__('asyncio').run(__import__('asyncio').open_connection('127.0.0.1', 22))",
    ],
    ids=["socket", "create_connection", "getaddrinfo", "asyncio"],
)
def test_guard_refuses_network(attempt: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", GUARD + attempt], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1
    assert "NETWORK AT PARSE TIME" in proc.stderr


def test_dags_folder_has_example_dags() -> None:
    assert [path.name for path in DAGS.glob("*.py")], f"no example DAG in {DAGS}"


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=[str(path.relative_to(DAGS)) for path in DAG_FILES])
def test_dag_file_parses_without_network_or_ssh(dag_file: Path) -> None:
    result = run_guarded(PARSE, str(dag_file), str(DAGS))
    assert result["errors"] == {}
    assert result["ssh"] == []
    if dag_file.parent == DAGS:
        assert result["dags"], f"{dag_file.name} defines no DAG"


def test_dag_facing_modules_import_no_ssh_library() -> None:
    modules = dag_facing_modules()
    assert "airflow_provider_tao_slurm.operators.sbatch_submit" in modules
    assert run_guarded(IMPORT, *modules) == {"ssh": []}


def test_ssh_check_sees_ssh_libraries() -> None:
    assert run_guarded(IMPORT, *SSH_LIBRARIES) == {"ssh": list(SSH_LIBRARIES)}
