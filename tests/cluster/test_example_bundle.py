"""The spec-bundle example DAG runs end to end: pre -> primary -> post (leader), exit codes recorded."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from demo import airflow_facts, prepare_airflow, run_dag, stage_assets

from airflow_provider_tao_slurm.core.shell import join

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DAG_ID = "example_tao_bundle"


def test_bundle_example_runs_in_the_model_owned_order(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    info = dataclasses.asdict(cluster)
    stage_assets(info)
    with tempfile.TemporaryDirectory(prefix="tao-example-bundle-") as tmp:
        env = prepare_airflow(info, Path(tmp))
        rc, output = run_dag(env, dag_id=DAG_ID, echo=False)
        facts = airflow_facts(env, DAG_ID)
    assert rc == 0, output[-3000:]
    assert facts["state"] == "success"
    handle = facts["xcom"]["submit"]
    _, order, _ = ssh_run(join(["cat", f"{handle['results_dir']}/order.txt"]))
    assert order.split() == ["pre", "primary", "post", "leader"]
    _, manifest, _ = ssh_run(join(["cat", f"{handle['job_dir']}/inputs/action-helpers/manifest.json"]))
    assert [entry["destination"] for entry in json.loads(manifest)["files"]] == ["inputs/action-helpers/prepare.py"]
    record = facts["xcom"]["wait"]
    assert record["terminal_state"] == "COMPLETE"
    assert record["exit_codes"]["children"] == {"task 0": {"pre_0": 0, "primary": 0, "post_0": 0, "post_1": 0}}
    assert len(record["bundle_sha256"]) == 64
    assert len(record["config_sha256"]) == 64
