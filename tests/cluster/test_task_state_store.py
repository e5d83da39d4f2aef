"""The job handle in Airflow's task state store (issue 34, item 1), proven with the real Airflow services.

``airflow standalone`` runs ``tests/cluster/store_dags/tao_store_reattach.py``: its submit task's
first try is SIGKILLed right after its job was submitted and its handle stored (a worker lost after
submission); Airflow retries it. The retry must reattach through the store, not submit again and
not look the job up by name; the deferred sensor then watches the job to its end and stores the job
it watches. Airflow's own ``task_state_store`` table is read to prove what was stored.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as url_quote

import pytest
from airflow_stack import Stack, standalone
from clusterkit import image, jobs_named

from airflow_provider_tao_slurm.core.records import mint_job_id

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

__all__ = ["image"]

DAG_ID = "tao_store_reattach"
DAGS = Path(__file__).with_name("store_dags")
#: Seconds allowed for the run to end.
RUN_TIMEOUT_S = 150.0


@pytest.fixture(scope="module")
def stack(cluster: ClusterEnv) -> Iterator[Stack]:
    """``airflow standalone`` with this module's DAG only."""
    with standalone(cluster, env={"AIRFLOW__CORE__DAGS_FOLDER": str(DAGS)}, prefix="tao-store-") as running:
        yield running


def _run(stack: Stack, conf: dict[str, Any]) -> tuple[str, str]:
    """Trigger a run through the REST API and wait for its end; return its id and state."""
    run_id = stack.trigger(DAG_ID, conf)
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(run_id, safe='')}"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline and state not in ("success", "failed"):
        time.sleep(1)
        state = stack.get(path)["state"]
    return run_id, state


def _stored(stack: Stack, run_id: str) -> dict[tuple[str, str], Any]:
    """``{(task_id, key): value}`` of the run's rows in Airflow's ``task_state_store`` table."""
    with sqlite3.connect(stack.home / "airflow.db") as db:
        rows = db.execute(
            "SELECT task_id, key, value FROM task_state_store WHERE dag_id = ? AND run_id = ?", (DAG_ID, run_id)
        ).fetchall()
    return {(task_id, key): json.loads(value) for task_id, key, value in rows}


#: What ResumableJobMixin logs when it reuses the stored job instead of submitting: still active, or ended well.
MIXIN_REUSES = ("Reconnecting to existing job", "Job already completed successfully, skipping resubmission")


def _log(stack: Stack, run_id: str, task_id: str, attempt: int) -> str:
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(run_id, safe='')}/taskInstances/{task_id}/logs/{attempt}"
    return "\n".join(str(item.get("event", "")) for item in stack.get(path)["content"])


def test_a_worker_lost_after_submission_is_reattached_through_the_task_state_store(
    stack: Stack, image: str, ssh_run: SshRun, record_property: Any
) -> None:
    """Try 1 of the submit task was SIGKILLed after its sbatch and its store write. Expected: try 2 reattaches to
    that job through the store (no second submission, no lookup by name), the run succeeds with exactly one
    SLURM job of that name, and Airflow's table holds the submitted handle and the job the sensor watched."""
    run_id, state = _run(stack, {"image": image, "command": "sleep 4; echo trained"})

    submit_path = f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(run_id, safe='')}/taskInstances/submit"
    assert state == "success", stack.log.read_text()[-4000:]
    assert stack.get(submit_path)["try_number"] == 2
    stored = _stored(stack, run_id)
    handle = stored[("submit", "slurm_job")]
    job_name = mint_job_id(DAG_ID, "submit", run_id)
    assert handle["job_id"] == job_name
    assert jobs_named(ssh_run, job_name) == [handle["slurm_job_id"]]
    retry_log = _log(stack, run_id, "submit", 2)
    record_property("detail", f"try 2 reattached to SLURM job {handle['slurm_job_id']}; stored keys {sorted(stored)}")
    assert f"Reattached to SLURM job {handle['slurm_job_id']}" in retry_log
    # ResumableJobMixin's own decision: the stored job still runs, or it has already ended well by the time try 2
    # starts (the job takes seconds; Airflow's retry delay and scheduling decide which): both reuse it.
    decisions = [line for line in MIXIN_REUSES if line in retry_log]
    assert decisions, retry_log[-2000:]
    assert "submitted on" not in retry_log  # no second submission
    assert "Adopting SLURM job" not in retry_log  # and no lookup by name
    watched = stored[("watch", "watched_job")]
    assert watched["root"] == handle["slurm_job_id"]
    assert watched["handle"]["slurm_job_id"] == handle["slurm_job_id"]
