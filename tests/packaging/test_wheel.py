"""The wheel as users install it: built from the checkout, installed into a clean venv, seen by Airflow.

The wheel is built without network (``--no-build-isolation``, hatchling from the dev extras) and
installed with ``--no-deps`` into a fresh venv; the project's already-installed dependencies are
made visible through a ``.pth`` line naming the dev venv's site-packages (a plain path: the ``.pth``
files inside it, among them the editable install of this checkout, are not processed), so the
provider that loads is the wheel's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "airflow_provider_tao_slurm"


@dataclass(frozen=True)
class Installed:
    """The built wheel and the clean venv it is installed in."""

    wheel: Path
    python: Path
    bin_dir: Path
    home: Path


def _site_packages(python: Path | str) -> str:
    return subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = out.glob("airflow_provider_tao_slurm-*.whl")
    env_dir = tmp_path_factory.mktemp("clean-venv")
    venv.create(env_dir, with_pip=False)
    bin_dir = env_dir / "bin"
    python = bin_dir / "python"
    clean_site = Path(_site_packages(python))
    unpack = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(clean_site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert unpack.returncode == 0, unpack.stderr[-3000:]
    (clean_site / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    home = tmp_path_factory.mktemp("airflow-home")
    return Installed(wheel=wheel, python=python, bin_dir=bin_dir, home=home)


def _run(installed: Installed, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{installed.bin_dir}:/usr/bin:/bin",
        "AIRFLOW_HOME": str(installed.home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{installed.home}/airflow.db",
    }
    # From the Airflow home, not the checkout: ``python -c`` puts the working directory first on sys.path.
    return subprocess.run(argv, env=env, cwd=installed.home, capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_the_package_its_templates_and_py_typed(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert f"{PACKAGE}/py.typed" in names
    assert f"{PACKAGE}/probes/nccl_probe.py" in names
    templates = sorted(p.name for p in (REPO / "templates" / "slurm").iterdir() if p.is_file())
    assert templates, "the checkout has sbatch templates"
    for name in templates:
        assert f"{PACKAGE}/templates/slurm/{name}" in names
    sources = {str(p.relative_to(REPO)) for p in (REPO / PACKAGE).rglob("*.py")}
    assert sources <= names


def test_the_wheels_metadata_declares_its_dependencies_and_entry_point(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in wheel.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:") and "extra ==" not in line]  # fmt: skip
        (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entries = wheel.read(entry_points).decode()
    by_name = {requirement.split("<")[0].split(">")[0].split("=")[0].strip(): requirement for requirement in requires}
    assert set(by_name) == {
        "apache-airflow",
        "apache-airflow-providers-ssh",
        "jinja2",
        "pyyaml",
        "paramiko",
        "asyncssh",
        "asgiref",
    }
    assert all("<" in requirement for requirement in requires), "every dependency has an upper bound"
    assert "<8" in by_name["apache-airflow-providers-ssh"], "pinned below the next major: private SSHHook internals"
    assert "[apache_airflow_provider]" in entries
    assert f"provider_info = {PACKAGE}:get_provider_info" in entries


def test_the_clean_venv_loads_the_wheels_provider_not_the_checkout(installed: Installed) -> None:
    probe = (
        "import json, importlib.resources as r, airflow_provider_tao_slurm as p\n"
        "from airflow_provider_tao_slurm.core.templates import template_dir\n"
        "t = r.files('airflow_provider_tao_slurm').joinpath('templates/slurm')\n"
        "d = template_dir()\n"
        "print(json.dumps({'file': p.__file__, 'templates': sorted(x.name for x in t.iterdir()),"
        " 'template_dir': str(d), 'texts': {x.name: x.read_text(encoding='utf-8') for x in d.iterdir()},"
        " 'conn': p.get_provider_info()['connection-types'][0]['connection-type']}))\n"
    )
    proc = _run(installed, str(installed.python), "-c", probe)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    env_dir = str(installed.bin_dir.parent)
    assert not seen["file"].startswith(str(REPO)), seen["file"]
    assert seen["file"].startswith(env_dir), seen["file"]
    shipped = {p.name: p.read_text(encoding="utf-8") for p in (REPO / "templates" / "slurm").iterdir() if p.is_file()}
    assert seen["templates"] == sorted(shipped)
    # The provider's own lookup finds the packaged copies inside the clean venv, with the checkout's content.
    assert seen["template_dir"].startswith(env_dir), seen["template_dir"]
    assert seen["texts"] == shipped
    assert seen["conn"] == "tao_slurm"


def test_airflow_lists_the_installed_provider(installed: Installed) -> None:
    proc = _run(installed, str(installed.python), "-m", "airflow", "providers", "list", "--output", "json")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    start = proc.stdout.index("[")
    providers = {row["package_name"]: row for row in json.loads(proc.stdout[start:])}
    assert "airflow-provider-tao-slurm" in providers
    assert providers["airflow-provider-tao-slurm"]["version"] == "0.1.0"
