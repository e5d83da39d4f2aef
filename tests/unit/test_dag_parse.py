"""Parsing the example DAGs opens no network connection, loads no SSH library and no run-time module.

Each check runs in a fresh interpreter (a clean ``sys.modules``) whose socket creation and name
resolution are patched to raise before anything is imported. DAG files are parsed the way
Airflow's DAG processor does it: ``BundleDagBag`` over the file, then every DAG serialised.

A DAG file needs only the operator and sensor classes: the hook, the trigger, the job lifecycle,
the templates and the other domain modules load when a task runs (issue 18, DAG parse cost).
Airflow itself loads jinja2 and yaml while parsing, so for those the DAG-facing modules are read
instead: none imports them at module level.
"""

from __future__ import annotations

import ast
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
ROOT = "airflow_provider_tao_slurm"
#: The provider modules parsing a DAG file may load, besides every module of ``operators`` and ``sensors``.
PARSE_TIME_MODULES = {
    ROOT,
    f"{ROOT}.core",
    f"{ROOT}.core.defaults",
    f"{ROOT}.lifecycle",
    f"{ROOT}.lifecycle.links",
    f"{ROOT}.lifecycle.support",
}
#: Modules only a running task needs; named so a failure says what came back.
RUNTIME_MODULES = (
    f"{ROOT}.hooks.slurm",
    f"{ROOT}.triggers.slurm_job",
    f"{ROOT}.triggers.poller",
    f"{ROOT}.lifecycle.jobs",
    f"{ROOT}.lifecycle.events",
    f"{ROOT}.core.commands",
    f"{ROOT}.core.templates",
    f"{ROOT}.core.resources",
    *SSH_LIBRARIES,
)
#: Libraries Airflow loads anyway; DAG-facing modules import them only inside the methods that run a task.
LAZY_LIBRARIES = ("jinja2", "yaml", *SSH_LIBRARIES)

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

def _provider_loaded():
    return sorted(name for name in sys.modules if name.split(".")[0] == "airflow_provider_tao_slurm")
"""

PARSE = """
from airflow.dag_processing.dagbag import BundleDagBag
from airflow.serialization.serialized_objects import DagSerialization

bag = BundleDagBag(dag_folder=sys.argv[1], bundle_path=sys.argv[2], bundle_name="dags-folder", load_op_links=False)
for dag in bag.dags.values():
    DagSerialization.to_dict(dag)
print(json.dumps({
    "dags": sorted(bag.dags),
    "errors": bag.import_errors,
    "ssh": _ssh_loaded(),
    "provider": _provider_loaded(),
    "runtime": [name for name in sys.argv[3:] if name in sys.modules],
}))
"""

IMPORT = """
import importlib
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps({"ssh": _ssh_loaded(), "provider": _provider_loaded()}))
"""

#: The ``airflow_local_settings.py`` the docs recommend, to load the operator classes before the DAG
#: processor forks its parsing processes.
LOCAL_SETTINGS = REPO / "docs" / "airflow_local_settings.py"

START_AIRFLOW = """
sys.path.insert(0, sys.argv[1])
import airflow  # every Airflow process starts so; it imports airflow_local_settings
print(json.dumps({
    "settings": getattr(sys.modules.get("airflow_local_settings"), "__file__", None),
    "ssh": _ssh_loaded(),
    "provider": _provider_loaded(),
}))
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


def unexpected_at_parse_time(loaded: list[str]) -> list[str]:
    """The provider modules in ``loaded`` that parsing a DAG file should not have needed."""
    dag_facing = (f"{ROOT}.operators", f"{ROOT}.sensors")
    return [
        name
        for name in loaded
        if name not in PARSE_TIME_MODULES
        and not name.startswith(tuple(f"{package}." for package in dag_facing))
        and name not in dag_facing
    ]


def module_level_imports(source: str) -> list[str]:
    """Modules imported when ``source`` is imported: not inside a function, nor under ``if TYPE_CHECKING:``."""
    found: list[str] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append(node.module)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit([*node.body, *node.orelse, *node.finalbody])
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(ast.parse(source).body)
    return found


def dataclasses_built(source: str) -> list[str]:
    """The classes ``source`` builds with a code-generating decorator (``dataclass``, ``attrs``) at import."""
    generators = {"dataclass", "define", "frozen", "attrs", "s"}
    found: list[str] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.ClassDef):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                    if name in generators:
                        found.append(node.name)
                visit(node.body)

    visit(ast.parse(source).body)
    return found


def lazily_imported(source: str) -> list[str]:
    """The :data:`LAZY_LIBRARIES` that ``source`` imports at module level."""
    return sorted({name for name in module_level_imports(source) if name.split(".")[0] in LAZY_LIBRARIES})


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
def test_dag_file_parses_without_network_ssh_or_runtime_modules(dag_file: Path) -> None:
    result = run_guarded(PARSE, str(dag_file), str(DAGS), *RUNTIME_MODULES)
    assert result["errors"] == {}
    assert result["ssh"] == []
    assert result["runtime"] == []
    assert unexpected_at_parse_time(result["provider"]) == []
    if dag_file.parent == DAGS:
        assert result["dags"], f"{dag_file.name} defines no DAG"


def test_dag_facing_modules_import_no_ssh_library() -> None:
    modules = dag_facing_modules()
    assert "airflow_provider_tao_slurm.operators.sbatch_submit" in modules
    assert run_guarded(IMPORT, *modules)["ssh"] == []


def test_recommended_local_settings_load_every_operator_class_and_nothing_a_task_needs(tmp_path: Path) -> None:
    (tmp_path / "airflow_local_settings.py").write_text(LOCAL_SETTINGS.read_text())
    result = run_guarded(START_AIRFLOW, str(tmp_path))
    assert result["settings"] == str(tmp_path / "airflow_local_settings.py")
    public = {
        f"{ROOT}.{path.parent.name}.{path.stem}"
        for path in [*(PACKAGE / "operators").glob("*.py"), *(PACKAGE / "sensors").glob("*.py")]
        if path.stem not in ("__init__", "base", "links")
    }
    assert f"{ROOT}.operators.sbatch_submit" in public
    assert sorted(public - set(result["provider"])) == []
    assert result["ssh"] == []
    assert unexpected_at_parse_time(result["provider"]) == []


def test_ssh_check_sees_ssh_libraries() -> None:
    assert run_guarded(IMPORT, *SSH_LIBRARIES)["ssh"] == list(SSH_LIBRARIES)


def test_parse_time_check_sees_runtime_modules() -> None:
    loaded = run_guarded(IMPORT, f"{ROOT}.operators.base", f"{ROOT}.lifecycle.jobs", f"{ROOT}.hooks.slurm")["provider"]
    unexpected = unexpected_at_parse_time(loaded)
    assert {f"{ROOT}.lifecycle.jobs", f"{ROOT}.hooks.slurm", f"{ROOT}.core.commands"} <= set(unexpected)
    assert {f"{ROOT}.operators.base", f"{ROOT}.lifecycle.support"}.isdisjoint(unexpected)


DAG_FACING_SOURCES = sorted(
    [
        *(PACKAGE / "operators").glob("*.py"),
        *(PACKAGE / "sensors").glob("*.py"),
        PACKAGE / "__init__.py",
        PACKAGE / "core" / "defaults.py",
        *(PACKAGE / "lifecycle" / f"{name}.py" for name in ("__init__", "links", "support")),
    ]
)


@pytest.mark.parametrize("path", DAG_FACING_SOURCES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_dag_facing_modules_import_runtime_libraries_lazily(path: Path) -> None:
    assert lazily_imported(path.read_text()) == []


@pytest.mark.parametrize("path", DAG_FACING_SOURCES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_dag_facing_modules_build_no_dataclass(path: Path) -> None:
    # Building a dataclass generates and compiles its methods: about a millisecond of every DAG parse.
    # Plans and other run-time records live in the core modules, which load when a task runs.
    assert dataclasses_built(path.read_text()) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        pytest.param("@dataclass\nclass A:\n    x: int", ["A"], id="bare"),
        pytest.param("@dataclass(frozen=True)\nclass A:\n    x: int", ["A"], id="call"),
        pytest.param("@dataclasses.dataclass\nclass A:\n    x: int", ["A"], id="attribute"),
        pytest.param("@attrs.define\nclass A:\n    x: int", ["A"], id="attrs"),
        pytest.param("class A:\n    @dataclass\n    class B:\n        x: int", ["B"], id="class-body"),
        pytest.param("def f():\n    @dataclass\n    class A:\n        x: int", [], id="in-function"),
        pytest.param("@staticmethod\ndef f(): ...\nclass A:\n    x: int = 1", [], id="plain"),
    ],
)
def test_dataclass_check_bites(source: str, found: list[str]) -> None:
    assert dataclasses_built(source) == found


@pytest.mark.parametrize(
    ("source", "found"),
    [
        pytest.param("import yaml", ["yaml"], id="import"),
        pytest.param("from jinja2 import Environment", ["jinja2"], id="from"),
        pytest.param("try:\n    import paramiko\nexcept ImportError:\n    pass", ["paramiko"], id="try"),
        pytest.param("class A:\n    import yaml", ["yaml"], id="class-body"),
        pytest.param("def f():\n    import yaml", [], id="in-function"),
        pytest.param("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import jinja2", [], id="type-checking"),
        pytest.param("import json", [], id="other"),
    ],
)
def test_lazy_library_check_bites(source: str, found: list[str]) -> None:
    assert lazily_imported(source) == found
