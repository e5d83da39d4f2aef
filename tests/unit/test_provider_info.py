"""The provider registers itself correctly; a broken registration breaks every airflow command."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from airflow_provider_tao_slurm import get_provider_info

INFO = get_provider_info()


def test_entry_point_points_at_get_provider_info() -> None:
    eps = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_provider_")]
    assert [ep.value for ep in eps] == ["airflow_provider_tao_slurm:get_provider_info"]
    assert eps[0].load() is get_provider_info


def test_package_name_matches_distribution() -> None:
    assert INFO["package-name"] == canonicalize_name("airflow_provider_tao_slurm")
    assert INFO["name"]
    assert INFO["description"]


@pytest.mark.parametrize("section", ["hooks", "operators", "sensors", "triggers"])
def test_every_listed_module_imports(section: str) -> None:
    modules = [m for entry in INFO[section] for m in entry["python-modules"]]
    assert modules
    for module in modules:
        importlib.import_module(module)


def test_connection_type_and_fields() -> None:
    (conn,) = INFO["connection-types"]
    assert conn["connection-type"] == "tao_slurm"
    module, _, cls = conn["hook-class-name"].rpartition(".")
    hook_cls = getattr(importlib.import_module(module), cls)
    assert hook_cls.conn_type == "tao_slurm"
    assert hook_cls.default_conn_name == "slurm_default"
    expected = {
        "partition",
        "account",
        "results_dir",
        "container_mounts",
        "conversion_partition",
        "max_time_hours",
        "cluster_name",
        "key_file",
        "private_key",
        "host_key",
        "no_host_key_check",
    }
    assert expected <= set(conn["conn-fields"])
    assert conn["conn-fields"]["private_key"]["schema"]["format"] == "password"


def _airflow(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIRFLOW_HOME": str(home)}
    airflow = Path(sys.executable).with_name("airflow")
    return subprocess.run([str(airflow), *args], env=env, capture_output=True, text=True, timeout=180)


def test_airflow_cli_lists_provider_and_connection_fields(tmp_path: Path) -> None:
    listing = _airflow("providers", "list", "-o", "plain", home=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "airflow-provider-tao-slurm" in listing.stdout
    widgets = _airflow("providers", "widgets", "-o", "plain", home=tmp_path)
    assert widgets.returncode == 0, widgets.stderr
    for field in ("extra__tao_slurm__partition", "extra__tao_slurm__results_dir", "extra__tao_slurm__account"):
        assert field in widgets.stdout


def test_the_form_has_exactly_the_extras_the_provider_reads() -> None:
    """Every ``extra.get("<key>")`` in the connection parser (and the links' URL template) is a form field,
    and the form offers nothing the provider ignores; the unused password field is hidden."""
    import ast
    import inspect

    from airflow_provider_tao_slurm.core import config
    from airflow_provider_tao_slurm.lifecycle.links import URL_TEMPLATE_EXTRA

    read = {URL_TEMPLATE_EXTRA}
    tree = ast.parse(inspect.getsource(config))
    looped: dict[str, set[str]] = {}  # `for key, default in (("name", ...), ...)`: the names each loop variable takes
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) and isinstance(node.iter, ast.Tuple):
            first = node.target.elts[0]
            if isinstance(first, ast.Name):
                looped[first.id] = {
                    item.elts[0].value
                    for item in node.iter.elts
                    if isinstance(item, ast.Tuple) and isinstance(item.elts[0], ast.Constant)
                }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "extra"
        ):
            argument = node.args[0]
            if isinstance(argument, ast.Constant):
                read.add(argument.value)
            elif isinstance(argument, ast.Name):
                read |= looped[argument.id]
    (conn,) = get_provider_info()["connection-types"]
    assert set(conn["conn-fields"]) == read
    assert "password" in conn["ui-field-behaviour"]["hidden-fields"]
    assert conn["conn-fields"]["private_key_passphrase"]["schema"]["format"] == "password"
