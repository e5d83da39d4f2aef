"""The single-node example DAG, end to end on the local SLURM test cluster, the way ``make demo`` runs it.

One module fixture runs ``airflow dags test example_tao_singlenode`` three times in its own Airflow
home, with a per-run image tag (so the first run must convert it) and a random secret in
``DEMO_API_TOKEN``: twice as is (the second run must reuse the ``.sqsh``), then once with a spec
that makes the training program fail at epoch 2 with exit code 7. The tests check what Airflow
recorded and what happened on the cluster: conversion on the CPU partition, exactly once; the GPU
job's partition and GRES; the job record; ``status.json`` and checkpoints; no registry image at
the GPU step; the secret reaching the program and nowhere else.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import secrets
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from demo import REPO, TASKS, DemoRun, evidence_rows, prepare_airflow, run_demo, stage_assets

from airflow_provider_tao_slurm.core.images import parse_image
from airflow_provider_tao_slurm.core.shell import quote

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TOKEN = uuid.uuid4().hex[:8]
IMAGE = f"nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt-{TOKEN}"
SECRET = f"demo-{secrets.token_urlsafe(24)}"
FAIL_SPEC = {"epochs": 3, "batch_size": 4, "learning_rate": 0.001, "fail_at_epoch": 2, "fail_exit_code": 7}


@dataclass(frozen=True)
class Runs:
    """The three DAG runs of the module, and the Airflow home they used."""

    first: DemoRun
    second: DemoRun
    failing: DemoRun
    home: Path


@pytest.fixture(scope="module")
def runs(cluster: ClusterEnv) -> Iterator[Runs]:
    """Stage the demo assets, then run the DAG twice successfully and once failing on purpose.

    The Airflow home is a private temporary directory, not pytest's ``tmp_path``: concurrent pytest
    sessions prune each other's old base directories, which would delete the database mid-run.
    """
    info = dataclasses.asdict(cluster)
    stage_assets(info)
    with tempfile.TemporaryDirectory(prefix="tao-example-dags-") as tmp:
        home = Path(tmp)
        env = prepare_airflow(info, home, {"DEMO_API_TOKEN": SECRET})
        first = run_demo(info, env, {"image": IMAGE}, echo=False)
        second = run_demo(info, env, {"image": IMAGE}, echo=False)
        failing = run_demo(info, env, {"image": IMAGE, "spec": FAIL_SPEC}, echo=False)
        yield Runs(first=first, second=second, failing=failing, home=home)


def _successful(runs: Runs) -> list[tuple[str, DemoRun]]:
    return [("first", runs.first), ("second", runs.second)]


def test_dag_parses_without_touching_the_cluster() -> None:
    """Parsing builds the four tasks in order with native params and creates no SSH hook."""
    spec = importlib.util.spec_from_file_location("example_tao_singlenode", REPO / "dags" / "example_tao_singlenode.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert dag.dag_id == "example_tao_singlenode"
    assert dag.render_template_as_native_obj is True
    assert [sorted(dag.get_task(t).downstream_task_ids) for t in TASKS] == [
        ["import_image", "submit"],
        ["submit"],
        ["wait"],
        [],
    ]
    assert {name: dag.params[name] for name in ("image", "datasets", "spec")} == {
        "image": "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt",
        "datasets": {"train": "lustre:///srv/lustre/demo/data/train", "val": "lustre:///srv/lustre/demo/data/val"},
        "spec": {"epochs": 3, "batch_size": 4, "learning_rate": 0.001},
    }
    assert [t for t in TASKS if "hook" in vars(dag.get_task(t))] == []


@pytest.mark.parametrize("which", ["first", "second"])
def test_run_succeeds(runs: Runs, which: str) -> None:
    """Both plain runs succeed with every task successful and distinct run ids."""
    run = getattr(runs, which)
    assert run.rc == 0, run.output[-4000:]
    assert run.airflow["state"] == "success"
    assert run.airflow["tasks"] == dict.fromkeys(TASKS, "success")
    assert runs.first.airflow["run_id"] != runs.second.airflow["run_id"]


def test_image_is_converted_once_on_the_cpu_partition(runs: Runs, cluster: ClusterEnv) -> None:
    """The first run converts in a CPU-partition batch job; the second reuses the same .sqsh file."""
    uri = parse_image(IMAGE).enroot_uri
    assert [(c["uri"], c["partition"]) for c in runs.first.conversions] == [(uri, cluster.cpu_partition)]
    assert runs.first.conversions[0]["slurm_job_id"].isdigit()
    assert runs.second.conversions == []
    assert len([row for row in evidence_rows(cluster.enroot_imports_log) if row[3:4] == [uri]]) == 1
    sqsh = {run.airflow["xcom"]["import_image"] for _, run in _successful(runs)}
    assert len(sqsh) == 1
    assert sqsh.pop().endswith(f"+5.5.0-pyt-{TOKEN}.sqsh")


@pytest.mark.parametrize("which", ["first", "second"])
def test_gpu_job_ran_on_polar_with_one_gpu(runs: Runs, which: str, cluster: ClusterEnv) -> None:
    """sacct shows the GPU partition and the requested GRES for the training job."""
    sacct = getattr(runs, which).sacct
    assert (sacct["State"], sacct["ExitCode"], sacct["Partition"]) == ("COMPLETED", "0:0", cluster.gpu_partition)
    assert "gres/gpu=1" in sacct["AllocTRES"].split(",")


@pytest.mark.parametrize("which", ["first", "second"])
def test_record_and_results(runs: Runs, which: str) -> None:
    """Record PENDING -> RUNNING -> COMPLETE; status.json ends in SUCCESS; one checkpoint per epoch."""
    run = getattr(runs, which)
    states = [t["state"] for t in run.record["transitions"]]
    assert [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s] == ["PENDING", "RUNNING", "COMPLETE"]
    assert (run.record["terminal_state"], run.record["backend_ref"]) == ("COMPLETE", run.handle["slurm_job_id"])
    assert run.airflow["xcom"]["wait"]["terminal_state"] == "COMPLETE"
    assert [line["status"] for line in run.status_lines] == ["STARTED", "RUNNING", "RUNNING", "RUNNING", "SUCCESS"]
    assert run.checkpoints == ["epoch_1.ckpt", "epoch_2.ckpt", "epoch_3.ckpt"]


@pytest.mark.parametrize("which", ["first", "second"])
def test_gpu_step_used_only_the_sqsh(runs: Runs, which: str, cluster: ClusterEnv, ssh_run: SshRun) -> None:
    """The staged script names the .sqsh file, and the Pyxis stand-in saw no registry image for the job."""
    run = getattr(runs, which)
    rc, script, _ = ssh_run(f"cat {quote(run.handle['script_path'])}")
    assert rc == 0
    assert f"--container-image={run.airflow['xcom']['import_image']}" in script
    assert [row for row in evidence_rows(cluster.pyxis_registry_log) if row[1:2] == [run.handle["slurm_job_id"]]] == []


def _remote(path_of: Callable[[dict[str, Any]], str]) -> Callable[[Runs, SshRun], str]:
    def read(runs: Runs, ssh_run: SshRun) -> str:
        rc, text, err = ssh_run(f"cat {quote(path_of(runs.first.handle))}")
        assert rc == 0, err
        return text

    return read


def _task_logs(runs: Runs, ssh_run: SshRun) -> str:
    """The task logs: ``airflow dags test`` prints them, and any log files under ``AIRFLOW_HOME/logs``."""
    files = sorted(path for path in (runs.home / "logs").rglob("*") if path.is_file())
    return runs.first.output + "".join(path.read_text(errors="replace") for path in files)


#: Where the secret must never appear: name -> how to read that place after the first run.
SECRET_FREE_PLACES: dict[str, Callable[[Runs, SshRun], str]] = {
    "sbatch_script": _remote(lambda h: h["script_path"]),
    "job_record": _remote(lambda h: h["record_path"]),
    "staged_spec": _remote(lambda h: f"{h['job_dir']}/specs/spec.yaml"),
    "staged_env": _remote(lambda h: f"{h['job_dir']}/env"),
    "staged_meta": _remote(lambda h: f"{h['job_dir']}/meta"),
    "main_out": _remote(lambda h: f"{h['log_dir']}/main.out"),
    "xcom": lambda runs, _: json.dumps(runs.first.airflow["xcom"]),
    "rendered_fields": lambda runs, _: json.dumps(runs.first.airflow["rendered"]),
    "task_logs": _task_logs,
}


@pytest.mark.parametrize("place", list(SECRET_FREE_PLACES), ids=list(SECRET_FREE_PLACES))
def test_secret_is_absent(runs: Runs, ssh_run: SshRun, place: str) -> None:
    """The secret value appears nowhere Airflow or the provider wrote (each place is non-empty)."""
    text = SECRET_FREE_PLACES[place](runs, ssh_run)
    assert text.strip()
    assert SECRET not in text


def test_secret_reached_the_program_and_its_sidecar_is_gone(runs: Runs, ssh_run: SshRun) -> None:
    """The program saw the secret (its length, in the job log and the task log); the sidecar is removed."""
    handle = runs.first.handle
    seen = f"DEMO_API_TOKEN is set ({len(SECRET)} chars)"
    assert seen in _remote(lambda h: f"{h['log_dir']}/main.out")(runs, ssh_run)
    assert seen in _task_logs(runs, ssh_run)
    assert handle["sidecar_path"] == f"{handle['job_dir']}/.secrets.env"
    rc, _, _ = ssh_run(f"test -e {quote(handle['sidecar_path'])}")
    assert rc == 1


def test_program_failure_fails_the_run(runs: Runs, cluster: ClusterEnv) -> None:
    """fail_at_epoch=2, fail_exit_code=7: the sensor fails, sacct says FAILED 7:0, the record says ERR_PROGRAM."""
    run = runs.failing
    assert (run.rc, run.airflow["state"], run.succeeded) == (1, "failed", False)
    assert run.airflow["tasks"] == {**dict.fromkeys(TASKS, "success"), "wait": "failed"}
    assert (run.sacct["State"], run.sacct["ExitCode"], run.sacct["Partition"]) == (
        "FAILED",
        "7:0",
        cluster.gpu_partition,
    )
    assert (run.record["terminal_state"], run.record["err_class"]) == ("ERROR", "ERR_PROGRAM")
    assert [line["status"] for line in run.status_lines] == ["STARTED", "RUNNING", "FAILURE"]
    assert run.checkpoints == ["epoch_1.ckpt"]
    assert run.conversions == []
