"""The MLOps pipeline example (train -> evaluate -> KPI gate -> export), end to end on the local SLURM test cluster.

``airflow dags test example_tao_pipeline`` runs in its own Airflow home, as ``make demo`` runs the
single-node example. Expected: every task succeeds; three GPU jobs, three COMPLETE records; the
evaluate and export jobs read the newest checkpoint of the training job, found through the train
task's handle, and wrote their own results; the evaluate sensor returns the KPIs the evaluation wrote
to its status.json (XCom ``kpis``, and on its Asset event), and the gate let export run.

A second run in the same Airflow home (one epoch, ``min_accuracy`` 0.9, above the stand-in's
accuracy) trains and evaluates, and the gate skips export: no export job, the run still succeeds.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import record_of, remote_text
from demo import airflow_facts, prepare_airflow, run_dag, stage_assets

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DAG_ID = "example_tao_pipeline"
ACTIONS = ("train", "evaluate", "export")
#: The second run: one epoch (a shorter training) and a threshold above what the stand-in reaches.
GATED_CONF: dict[str, Any] = {"spec": {"epochs": 1, "batch_size": 4, "learning_rate": 0.001}, "min_accuracy": 0.9}


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    rc: int
    output: str
    facts: dict[str, Any]


@pytest.fixture(scope="module")
def airflow_env(cluster: ClusterEnv) -> Iterator[dict[str, str]]:
    info = dataclasses.asdict(cluster)
    stage_assets(info)
    with tempfile.TemporaryDirectory(prefix="tao-pipeline-") as tmp:
        yield prepare_airflow(info, Path(tmp))


def run_pipeline(env: dict[str, str], conf: dict[str, Any] | None = None) -> PipelineRun:
    rc, output = run_dag(env, conf, echo=False, dag_id=DAG_ID)
    return PipelineRun(rc=rc, output=output, facts=airflow_facts(env, DAG_ID))


@pytest.fixture(scope="module")
def pipeline(airflow_env: dict[str, str]) -> PipelineRun:
    return run_pipeline(airflow_env)


@pytest.fixture(scope="module")
def gated(airflow_env: dict[str, str]) -> PipelineRun:
    """The run whose threshold is above the accuracy (each run's facts are read right after it)."""
    return run_pipeline(airflow_env, GATED_CONF)


def test_every_task_of_the_pipeline_succeeds(pipeline: PipelineRun) -> None:
    assert (pipeline.rc, pipeline.facts["state"]) == (0, "success"), pipeline.output[-6000:]
    assert set(pipeline.facts["tasks"].values()) == {"success"}, pipeline.facts["tasks"]
    assert len(pipeline.facts["tasks"]) == 9


def test_three_jobs_three_complete_records(pipeline: PipelineRun, ssh_run: SshRun) -> None:
    handles = [pipeline.facts["xcom"][action] for action in ACTIONS]
    assert len({handle["slurm_job_id"] for handle in handles}) == 3
    for action, handle in zip(ACTIONS, handles, strict=True):
        record = record_of(ssh_run, handle["record_path"])
        assert (record["terminal_state"], record["action"]) == ("COMPLETE", action)
        assert pipeline.facts["xcom"][f"wait_{action}"]["terminal_state"] == "COMPLETE"


def test_evaluate_and_export_read_the_training_jobs_checkpoint(pipeline: PipelineRun, ssh_run: SshRun) -> None:
    train, evaluate, export = (pipeline.facts["xcom"][action] for action in ACTIONS)
    newest = f"{train['results_dir']}/checkpoints/epoch_3.ckpt"
    assert remote_text(ssh_run, newest), "the training wrote its last checkpoint"
    kpis = json.loads(remote_text(ssh_run, f"{evaluate['results_dir']}/evaluation.json"))
    assert (kpis["checkpoint"], kpis["epoch"]) == (newest, 3)
    model = json.loads(remote_text(ssh_run, f"{export['results_dir']}/export/model.onnx"))
    assert (model["checkpoint"], model["epoch"]) == (newest, 3)
    rendered = pipeline.facts["rendered"]["evaluate"]["command"]
    assert f"--checkpoint {train['results_dir']}/checkpoints " in rendered
    assert len({train["results_dir"], evaluate["results_dir"], export["results_dir"]}) == 3


def test_the_finished_training_is_announced_as_an_asset(pipeline: PipelineRun) -> None:
    """``wait_train`` has the Asset ``tao://example_tao_pipeline/train`` as outlet: its event carries the
    training job's results_dir and ids, so a DAG scheduled on the Asset finds the checkpoints."""
    train = pipeline.facts["xcom"]["train"]
    (event,) = [e for e in pipeline.facts["asset_events"] if e["uri"] == "tao://example_tao_pipeline/train"]
    assert event["task_id"] == "wait_train"
    assert {key: event["extra"][key] for key in ("results_dir", "job_id", "slurm_job_id")} == {
        key: train[key] for key in ("results_dir", "job_id", "slurm_job_id")
    }
    assert event["extra"]["gpu_hours"] >= 0


def test_the_evaluate_sensor_returns_the_kpis_and_the_gate_lets_export_run(
    pipeline: PipelineRun, ssh_run: SshRun
) -> None:
    """The stand-in's evaluate writes its KPIs to status.json as TAO's does; nobody parses evaluation.json."""
    evaluate = pipeline.facts["xcom"]["evaluate"]
    written = json.loads(remote_text(ssh_run, f"{evaluate['results_dir']}/evaluation.json"))
    kpis = pipeline.facts["xcom"]["wait_evaluate"]["kpis"]
    assert kpis["accuracy"] == written["accuracy"] >= 0.5
    assert set(kpis) == {"accuracy", "loss"}
    (event,) = [e for e in pipeline.facts["asset_events"] if e["uri"] == "tao://example_tao_pipeline/evaluate"]
    assert (event["task_id"], event["extra"]["kpis"]) == ("wait_evaluate", kpis)
    assert pipeline.facts["xcom"]["accuracy_gate"] is True
    assert "kpis" not in pipeline.facts["xcom"]["wait_export"], "export writes no KPIs"


def test_an_accuracy_below_the_threshold_skips_export(gated: PipelineRun, ssh_run: SshRun) -> None:
    assert (gated.rc, gated.facts["state"]) == (0, "success"), gated.output[-6000:]
    skipped = {task for task, state in gated.facts["tasks"].items() if state == "skipped"}
    assert skipped == {"export", "wait_export"}, gated.facts["tasks"]
    assert {state for task, state in gated.facts["tasks"].items() if task not in skipped} == {"success"}
    kpis = gated.facts["xcom"]["wait_evaluate"]["kpis"]
    assert kpis["accuracy"] < GATED_CONF["min_accuracy"]
    record = record_of(ssh_run, gated.facts["xcom"]["train"]["record_path"])
    assert record["terminal_state"] == "COMPLETE"
    assert "export" not in gated.facts["xcom"], "no export job was submitted"
    assert "missed, skipping what follows" in gated.output
