"""Watching a training (issue 16), on the real test cluster: what the task log, XCom and record tell."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import conn, dag_id, image, record_of, secret_value, sensor_for, submit, submit_op
from deferral import context, defer, first_event, resume, run_async

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["conn", "dag_id", "image", "secret_value"]


def run_to_end(handle: dict[str, Any], ctx: dict[str, Any]) -> Any:
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    return resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 180)))


def test_a_finished_jobs_cost_and_timing_come_from_accounting(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """A 4-second job on one node with two GPUs. Expected: the sensor's XCom and the job record carry its queue
    time, run time (at least the 4 s), the two allocated GPUs and their GPU hours, its node and exit code 0."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 4", gpus_per_node=2, nccl_env={}), ctx)
    result = run_to_end(handle, ctx)
    assert result["terminal_state"] == "COMPLETE"
    assert result["queue_seconds"] is not None
    assert 0 <= result["queue_seconds"] < 120
    assert 4 <= result["elapsed_seconds"] < 120
    assert result["gpus"] == 2
    assert result["gpu_hours"] == round(2 * result["elapsed_seconds"] / 3600, 4)
    assert result["node_list"] in cluster.nodes
    assert result["exit_code"] == 0
    record = record_of(ssh_run, handle["record_path"])
    assert record["extra"]["usage"] == {key: result[key] for key in record["extra"]["usage"]}
