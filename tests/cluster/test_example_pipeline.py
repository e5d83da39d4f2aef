"""The MLOps pipeline example (train -> evaluate, export), end to end on the local SLURM test cluster.

``airflow dags test example_tao_pipeline`` runs in its own Airflow home, as ``make demo`` runs the
single-node example. Expected: every task succeeds; three GPU jobs, three COMPLETE records; the
evaluate and export jobs read the newest checkpoint of the training job, found through the train
task's handle, and wrote their own results.
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

pytestmark = pytest.mark.cluster

DAG_ID = "example_tao_pipeline"
ACTIONS = ("train", "evaluate", "export")


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    rc: int
    output: str
    facts: dict[str, Any]


@pytest.fixture(scope="module")
def pipeline(cluster: ClusterEnv) -> Iterator[PipelineRun]:
    info = dataclasses.asdict(cluster)
    stage_assets(info)
    with tempfile.TemporaryDirectory(prefix="tao-pipeline-") as tmp:
        env = prepare_airflow(info, Path(tmp))
        rc, output = run_dag(env, None, echo=False, dag_id=DAG_ID)
        yield PipelineRun(rc=rc, output=output, facts=airflow_facts(env, DAG_ID))


def test_every_task_of_the_pipeline_succeeds(pipeline: PipelineRun) -> None:
    assert (pipeline.rc, pipeline.facts["state"]) == (0, "success"), pipeline.output[-6000:]
    assert set(pipeline.facts["tasks"].values()) == {"success"}, pipeline.facts["tasks"]
    assert len(pipeline.facts["tasks"]) == 8


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
