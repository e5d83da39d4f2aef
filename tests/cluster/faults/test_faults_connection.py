"""Fault suite (issue 10), the SSH side: sshd restarts, connection cuts, a dead first login host, a killed worker.

Each case runs the provider the way Airflow does (``execute`` -> ``TaskDeferred`` -> the trigger on an
event loop -> ``execute_complete``, see ``tests/cluster/deferral.py``) against the real test cluster,
injects one fault for real, and then checks what matters: the task ends correctly, exactly one SLURM
job exists per logical submission (asked independently over OpenSSH), and nothing is left running.
Connection cuts reset only this test's own connection (``ss -K`` on its local port), so other suites
running at the same time keep theirs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import (
    connection_json,
    cut_connection,
    fault_listed,
    final_state,
    harness,
    jobs_named,
    pooled_port,
    record_of,
    sensor_for,
    squeue_field,
    submit,
    submit_and_sigkill,
    submit_op,
)
from deferral import context, defer, first_event, resume, run_async, wait_until
from demo import load_cluster

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.shell import join
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook, async_pool
from airflow_provider_tao_slurm.triggers.poller import active_pollers

if TYPE_CHECKING:
    from airflow.triggers.base import TriggerEvent

    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

REFUSING_HOST = "127.0.0.2"  # loopback answers for all of 127/8, but the login sshd listens on 127.0.0.1 only
HERE = Path(__file__).resolve().parent


def running(ssh_run: SshRun, *slurm_ids: str) -> bool:
    """Whether every job is RUNNING."""
    return all(squeue_field(ssh_run, slurm_id, "%T") == "RUNNING" for slurm_id in slurm_ids)


@pytest.mark.alone
def test_sshd_restart_while_three_triggers_are_deferred(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, record_property: Any
) -> None:
    """Three jobs were submitted and their sensors deferred onto one triggerer event loop (one shared
    poller, one pooled SSH connection). While all three ran, the login sshd was restarted and the pooled
    connection reset on the server side (a login-host reboot). Expected: the pool reconnects once, each
    trigger sends exactly one COMPLETED event, every sensor settles COMPLETE, one SLURM job per submission."""
    ctxs = [context(dag_id, f"train{i}", "r1") for i in range(3)]
    handles = [submit(submit_op(image, "sleep 8", task_id=f"train{i}"), ctx) for i, ctx in enumerate(ctxs)]
    sensors = [sensor_for(handle) for handle in handles]
    deferrals = [defer(sensor, ctx) for sensor, ctx in zip(sensors, ctxs, strict=True)]
    ids = [handle["slurm_job_id"] for handle in handles]

    async def scenario() -> tuple[list[TriggerEvent], int]:
        watches = [asyncio.ensure_future(first_event(d.trigger, 120)) for d in deferrals]
        await asyncio.to_thread(wait_until, lambda: running(ssh_run, *ids), "all three jobs running", 90)
        port = await pooled_port(await SlurmHook(conn).a_settings())
        opened = async_pool().opened
        await asyncio.to_thread(harness, "restart-sshd")
        await asyncio.to_thread(cut_connection, cluster, port)
        events = list(await asyncio.gather(*watches))
        return events, async_pool().opened - opened

    events, reconnects = run_async(scenario())
    results = [resume(s, c, d, e) for s, c, d, e in zip(sensors, ctxs, deferrals, events, strict=True)]

    record_property("detail", f"reconnects={reconnects}; states={[e.payload['native'] for e in events]}")
    assert reconnects == 1
    assert [e.payload["native"] for e in events] == ["COMPLETED"] * 3
    assert [r["terminal_state"] for r in results] == ["COMPLETE"] * 3
    for handle in handles:
        assert jobs_named(ssh_run, handle["job_id"]) == [handle["slurm_job_id"]]
        assert final_state(ssh_run, handle["slurm_job_id"]) == "COMPLETED"


def test_poller_connection_dropped_mid_query(
    conn: str,
    image: str,
    dag_id: str,
    ssh_run: SshRun,
    cluster: ClusterEnv,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    """A deferred sensor's trigger was polling a running job. One poll's squeue was made to take 3 s on the
    login host (``sleep 3;`` prepended) and the pooled connection was reset 1 s into it, so the batched
    query was cut while in flight. Expected: that poll fails (the query is never replayed on the dead
    connection), the poller backs off and reconnects, the trigger keeps waiting and sends one COMPLETED
    event, the task ends COMPLETE with one SLURM job, nothing cancelled."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 8"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    original = commands.squeue_states
    slow: dict[str, Any] = {"armed": False, "sent": None}

    def squeue_states(job_ids: Any, user: str | None = None) -> str:
        if slow["armed"]:
            slow["armed"] = False
            slow["sent"].set()
            return "sleep 3; " + original(job_ids, user)
        return original(job_ids, user)

    monkeypatch.setattr(commands, "squeue_states", squeue_states)

    async def scenario() -> tuple[TriggerEvent, int, int]:
        watch = asyncio.ensure_future(first_event(deferred.trigger, 120))
        await asyncio.to_thread(wait_until, lambda: running(ssh_run, slurm_id), "job running", 90)
        port = await pooled_port(await SlurmHook(conn).a_settings())
        (poller,) = active_pollers()
        failures, opened = poller.stats.failures, async_pool().opened
        slow["sent"] = asyncio.Event()
        slow["armed"] = True
        await asyncio.wait_for(slow["sent"].wait(), 30)
        await asyncio.sleep(1)
        await asyncio.to_thread(cut_connection, cluster, port)
        event = await watch
        return event, poller.stats.failures - failures, async_pool().opened - opened

    event, failed_polls, reconnects = run_async(scenario())
    result = resume(sensor, ctx, deferred, event)

    record_property("detail", f"failed polls={failed_polls}; reconnects={reconnects}")
    assert failed_polls == 1
    assert reconnects == 1
    assert event.payload["native"] == "COMPLETED"
    assert result["terminal_state"] == "COMPLETE"
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]
    assert final_state(ssh_run, slurm_id) == "COMPLETED"


def test_first_login_host_down_the_task_runs_through_the_next(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection listed a dead first login host (127.0.0.2, nothing listens there) before the real one.
    Submit (paramiko, sync), the deferred trigger (asyncssh pool) and the sensor's settling all failed over
    to the second host. Expected: the task ends COMPLETE with one SLURM job (the job-name lookups that guard
    against double submission skip the dead host instead of failing)."""
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, host=f"{REFUSING_HOST},{cluster.host}"))
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 2"), ctx)
    retried = submit(submit_op(image, "sleep 2"), context(dag_id, "submit", "r1", try_number=2))
    sensor = sensor_for(retried)
    deferred = defer(sensor, ctx)
    result = resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 120)))

    assert retried["slurm_job_id"] == handle["slurm_job_id"]
    assert result["terminal_state"] == "COMPLETE"
    assert jobs_named(ssh_run, handle["job_id"]) == [handle["slurm_job_id"]]


def test_an_sbatch_slower_than_the_command_timeout_is_reconciled_and_watched_to_its_end(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The login host's sbatch answered after 8 s while the connection's command timeout was 3 s (the fault
    sshd's sbatch while the harness's fault switch lists ``sbatch_slow``): the task gave up on the reply,
    and the remote shell went on to submit and release the job. Expected: the task looks the job up by its
    exact name before anything else and adopts it (no second sbatch); the sensor watches it to COMPLETE and
    its secret sidecar is gone; one SLURM job."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_SLURM_DEFAULT",
        connection_json(cluster, port=cluster.fault_port, extra={"cmd_timeout": 3}),
    )
    ctx = context(dag_id, "submit", "r1")
    with fault_listed(Path(load_cluster()["fault_switch"]), "sbatch_slow"):
        started = time.monotonic()
        handle = submit(submit_op(image, "sleep 2"), ctx)
        took = time.monotonic() - started
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    result = resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 120)))

    assert took > 8, "the submission waited for the slow sbatch's job to appear"
    assert result["terminal_state"] == "COMPLETE"
    assert jobs_named(ssh_run, handle["job_id"]) == [handle["slurm_job_id"]]
    assert record_of(ssh_run, handle["record_path"])["backend_ref"] == handle["slurm_job_id"]
    assert ssh_run(join(["test", "-e", handle["sidecar_path"]]))[0] == 1, "the secret sidecar is gone"


def test_submit_task_sigkilled_after_sbatch_then_retried_adopts_the_job(
    conn: str,
    image: str,
    dag_id: str,
    ssh_run: SshRun,
    cluster: ClusterEnv,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    """Try 1 of the submit task ran in its own process against the fault login sshd, whose sbatch submits
    the (held) job and then cuts the session before the reply; the process was SIGKILLed right then, before
    it could reconcile or release the job (a worker killed mid-submit). Try 2 ran normally. Expected: try 2
    submits nothing, adopts that job, releases it, and the task chain ends COMPLETE; one SLURM job."""
    job_name = submit_and_sigkill(cluster, image, dag_id, try_number=1, command="sleep 2")
    (slurm_id,) = jobs_named(ssh_run, job_name)
    left = squeue_field(ssh_run, slurm_id, "%T|%r")
    record_property("detail", f"after SIGKILL the job was {left}")
    assert left == "PENDING|JobHeldUser"  # submitted held, never released: the kill came in between

    ctx = context(dag_id, "submit", "r1", try_number=2)
    handle = submit(submit_op(image, "sleep 2"), ctx)
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    result = resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 120)))

    assert (handle["job_id"], handle["slurm_job_id"]) == (job_name, slurm_id)
    assert result["terminal_state"] == "COMPLETE"
    assert jobs_named(ssh_run, job_name) == [slurm_id]
    assert record_of(ssh_run, handle["record_path"])["backend_ref"] == slurm_id
