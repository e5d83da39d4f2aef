"""Acceptance tests of issue 6 (submit and watch) against the local SLURM test cluster.

The deferrable path runs without Airflow's scheduler, the way the worker and the triggerer drive
it: ``SbatchSubmitOperator.execute()`` returns the job handle, ``SlurmJobSensor.execute()`` raises
``TaskDeferred``, the trigger's ``run()`` goes on an asyncio loop until its first event, and the
event goes to ``execute_complete()`` with the deferral's kwargs. Faults are real: a node is set
DOWN with the harness (it returns by itself ~3 s later, ``ReturnToService=2``), jobs are cancelled
with ``scancel`` over ssh.

Commands run on the host (the Pyxis stand-in does not containerise). Every test uses its own DAG
id, so every job name (``tao-<dag>.<task>-<digest>``) is unique to one test and one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from clusterkit import (
    POLL_S,
    SHOW_SECRET,
    conn,
    dag_id,
    digest,
    final_state,
    harness,
    image,
    job_names,
    record_of,
    remote_text,
    require_alone,
    secret_value,
    sensor_for,
    sidecar_mode,
    squeue_field,
    start_requeued_elsewhere,
    submit,
    submit_op,
)
from deferral import context, defer, first_event, full_event, resume, run_async, wait_until

from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import JobFailedError
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor
from airflow_provider_tao_slurm.triggers.poller import active_pollers
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

if TYPE_CHECKING:
    from airflow.triggers.base import TriggerEvent

    from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["conn", "dag_id", "image", "secret_value"]

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"}


# ---------------------------------------------------------------------- helpers


def scontrol_fields(ssh_run: SshRun, slurm_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (``JobState``, ``NodeList``, ``ExcNodeList``, ``Restarts`` ...)."""
    rc, out, err = ssh_run(join(["scontrol", "show", "job", slurm_id]))
    assert rc == 0, err
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def node_usable(ssh_run: SshRun, node: str) -> bool:
    """Whether ``sinfo`` shows the node in service (not down, drained or failing)."""
    _, out, _ = ssh_run(join(["sinfo", "-h", "-N", "-n", node, "-o", "%T"]))
    state = out.strip()
    return bool(state) and not state.startswith(("down", "drain", "fail", "unknown", "not_responding"))


def steps_running(slurm_id: str) -> bool:
    """Whether a ``slurmstepd`` of the job still runs (both test nodes' slurmd run on this machine)."""
    title = f"slurmstepd: [{slurm_id}.".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if cmdline.read_bytes().startswith(title):
                return True
    return False


@contextlib.contextmanager
def blocker_on(ssh_run: SshRun, node: str, name: str) -> Iterator[str]:
    """Hold ``node`` with an exclusive job so the job under test lands on the other node."""
    require_alone(f"{node} held by an exclusive job")
    rc, out, err = ssh_run(
        join(["sbatch", "--parsable", "-p", "polar", "-w", node, "--exclusive", "-J", name, "--wrap", "sleep 300"])
    )
    assert rc == 0, err
    slurm_id = out.strip().split(";")[0]
    try:
        wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", f"blocker on {node}", timeout=120)
        yield slurm_id
    finally:
        ssh_run(join(["scancel", slurm_id]))


def assert_no_secret(ssh_run: SshRun, handle: dict[str, Any], secret: str) -> None:
    """The ``secret`` value is in none of the staged files, the record, the logs or the handle."""
    assert secret not in json.dumps(handle)
    _, out, _ = ssh_run(
        f"grep -rlF -e {quote(secret)} -- {quote(handle['job_dir'])} {quote(handle['record_path'])} "
        f"{quote(handle['log_dir'])} | grep -vF .secrets.env || true"
    )
    assert out.strip() == "", f"secret value found in {out.strip()}"


# ---------------------------------------------------------------------- tests


def test_success_sidecar_and_retried_submit_adopts_its_job(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, secret_value: str
) -> None:
    ctx = context(dag_id, "submit", "r1")
    op = submit_op(image, f"{SHOW_SECRET}; sleep 4")
    handle = submit(op, ctx)
    slurm_id = handle["slurm_job_id"]
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "600"
    script = remote_text(ssh_run, handle["script_path"])
    assert "RL_TOKEN" in remote_text(ssh_run, handle["sidecar_path"])
    assert secret_value not in script
    assert_no_secret(ssh_run, handle, secret_value)

    retried = submit(submit_op(image, f"{SHOW_SECRET}; sleep 4"), context(dag_id, "submit", "r1", try_number=2))
    assert retried["slurm_job_id"] == slurm_id
    assert retried["job_id"] == handle["job_id"]
    assert list(job_names(ssh_run, handle["job_id"])) == [slurm_id]
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "600"

    sensor = sensor_for(retried)
    deferred = defer(sensor, ctx)
    event = run_async(first_event(deferred.trigger))
    assert event.payload["native"] == "COMPLETED"
    result = resume(sensor, ctx, deferred, event)

    assert result["terminal_state"] == "COMPLETE"
    assert result["backend_ref"] == slurm_id
    assert result["exit_codes"] == {"job": 0}
    assert record_of(ssh_run, handle["record_path"])["terminal_state"] == "COMPLETE"
    assert f"secret-digest={digest(secret_value)}" in remote_text(ssh_run, f"{handle['log_dir']}/main.out")
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"
    assert_no_secret(ssh_run, handle, secret_value)
    assert secret_value not in json.dumps(result)
    assert list(job_names(ssh_run, handle["job_id"])) == [slurm_id]


def test_program_failure_fails_the_task_without_resubmission(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "echo about to fail; exit 3"), ctx)
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    event = run_async(first_event(deferred.trigger))

    with pytest.raises(JobFailedError, match="ERR_PROGRAM") as failed:
        resume(sensor, ctx, deferred, event)

    assert failed.value.err_class == "ERR_PROGRAM"
    record = record_of(ssh_run, handle["record_path"])
    assert record["terminal_state"] == "ERROR"
    assert record["err_class"] == "ERR_PROGRAM"
    assert record["exit_codes"] == {"job": 3}
    assert "ExitCode=3" in record["transitions"][-1]["message"]
    prefix = handle["job_id"].rsplit("-", 1)[0] + "-"
    assert list(job_names(ssh_run, prefix)) == [handle["slurm_job_id"]]
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


def test_job_cancelled_outside_airflow_is_canceled(conn: str, image: str, dag_id: str, ssh_run: SshRun) -> None:
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 60"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)

    async def scenario() -> TriggerEvent:
        watch = asyncio.ensure_future(first_event(deferred.trigger))
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "job running")
        assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "600"
        rc, _, err = await asyncio.to_thread(ssh_run, join(["scancel", slurm_id]))
        assert rc == 0, err
        return await watch

    event = run_async(scenario())
    assert full_event(deferred.trigger, event)["state"]["tao_state"] == "CANCELED"
    with pytest.raises(JobFailedError, match="cancelled outside this task"):
        resume(sensor, ctx, deferred, event)

    record = record_of(ssh_run, handle["record_path"])
    assert record["terminal_state"] == "CANCELED"
    assert "CANCELLED" in record["transitions"][-1]["message"]
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


def test_user_kill_of_the_deferred_sensor_cancels_the_job(conn: str, image: str, dag_id: str, ssh_run: SshRun) -> None:
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 60"), ctx)
    slurm_id = handle["slurm_job_id"]
    trigger = defer(sensor_for(handle), ctx).trigger
    assert isinstance(trigger, SlurmJobTrigger)

    async def mark_failed() -> None:
        # The triggerer's order on a user action: cancel run(), then on_kill(), then cleanup().
        watch = asyncio.ensure_future(first_event(trigger))
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "job running")
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        await trigger.on_kill()
        await trigger.cleanup()

    run_async(mark_failed())
    assert wait_until(lambda: final_state(ssh_run, slurm_id) == "CANCELLED", "job cancelled in sacct", timeout=30)
    record = record_of(ssh_run, handle["record_path"])  # the kill is recorded, with who saw it
    assert (record["terminal_state"], record["transitions"][-1]["source"]) == ("CANCELED", "trigger on_kill")
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


def test_triggerer_restart_keeps_the_job_and_a_new_trigger_finishes_it(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 6"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    classpath, kwargs = deferred.trigger.serialize()

    async def restart() -> list[bool]:
        watch = asyncio.ensure_future(first_event(deferred.trigger))
        await asyncio.sleep(2.5)
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        await deferred.trigger.cleanup()
        return [poller.running for poller in active_pollers()]

    assert run_async(restart()) == [False]
    assert squeue_field(ssh_run, slurm_id, "%T") in LIVE

    assert classpath == "airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger"
    reborn = SlurmJobTrigger(**json.loads(json.dumps(kwargs)))
    event = run_async(first_event(reborn))
    result = resume(sensor, ctx, deferred, event)

    assert result["terminal_state"] == "COMPLETE"
    assert result["backend_ref"] == slurm_id
    assert list(job_names(ssh_run, handle["job_id"].rsplit("-", 1)[0] + "-")) == [slurm_id]


@dataclass
class NodeFailure:
    """A job that ran on n2 when n2 went DOWN, and what the trigger reported."""

    handle: dict[str, Any]
    sensor: SlurmJobSensor
    deferred: TaskDeferred
    event: TriggerEvent


def through_node_failure(
    ssh_run: SshRun, op: SbatchSubmitOperator, ctx: dict[str, Any], then: Callable[[str], None] | None = None
) -> NodeFailure:
    """Submit with n1 held by a blocker (so the job runs on n2), set n2 DOWN while the trigger watches.

    ``then(slurm_id)`` runs (in a thread) after the node went down, while the trigger keeps watching.
    Returns once the trigger fired; n2 is back in service and the blocker gone by then.
    """
    with blocker_on(ssh_run, "n1", f"{ctx['ti'].dag_id}-blocker"):
        handle = submit(op, ctx)
        slurm_id = handle["slurm_job_id"]
        sensor = sensor_for(handle)
        deferred = defer(sensor, ctx)

        def on_n2() -> bool:
            return squeue_field(ssh_run, slurm_id, "%T|%N") == "RUNNING|n2"

        async def watch_and_fail() -> TriggerEvent:
            watch = asyncio.ensure_future(first_event(deferred.trigger))
            await asyncio.to_thread(wait_until, on_n2, "job running on n2")
            await asyncio.sleep(2 * POLL_S)  # let the trigger's poll see RUNNING before the node fails
            await asyncio.to_thread(harness, "node-down", "n2")
            if then is not None:
                await asyncio.to_thread(then, slurm_id)
            return await watch

        try:
            event = run_async(watch_and_fail())
        finally:
            wait_until(lambda: node_usable(ssh_run, "n2"), "n2 back in service", timeout=90)
    return NodeFailure(handle, sensor, deferred, event)


def resubmission(ssh_run: SshRun, failure: NodeFailure, ctx: dict[str, Any]) -> tuple[TaskDeferred, Any]:
    """Resume on the NODE_FAIL event (must re-defer on the resubmitted job), then run that job to the end."""
    with pytest.raises(TaskDeferred) as again:
        resume(failure.sensor, ctx, failure.deferred, failure.event)
    event = run_async(first_event(again.value.trigger))
    return again.value, resume(failure.sensor, ctx, again.value, event)


@pytest.mark.parametrize("hidden", [False, True], ids=["default-partition", "hidden-partition"])
@pytest.mark.alone
def test_node_failure_without_requeue_is_resubmitted_once_avoiding_the_node(
    hidden: bool, conn: str, image: str, dag_id: str, ssh_run: SshRun, secret_value: str, cluster: ClusterEnv
) -> None:
    """On the hidden partition too (``Hidden=YES``): the node states the resubmission reads list its nodes (plain
    sinfo lists none, and the job failed "leaves 0 node(s)")."""
    ctx = context(dag_id, "submit", "r1")
    on = {"partition": cluster.hidden_partition} if hidden else {}
    failure = through_node_failure(ssh_run, submit_op(image, "sleep 8", requeue=False, **on), ctx)
    handle, first_id = failure.handle, failure.handle["slurm_job_id"]
    assert failure.event.payload["native"] == "NODE_FAIL"

    deferred, result = resubmission(ssh_run, failure, ctx)

    retry = deferred.kwargs["job"]
    second_id = retry["slurm_job_id"]
    assert second_id != first_id
    assert retry["retry_of"] == handle["job_id"]
    assert retry["exclude_nodes"] == ["n2"]
    job = scontrol_fields(ssh_run, second_id)
    assert (job["ExcNodeList"], job["NodeList"]) == ("n2", "n1")
    first = record_of(ssh_run, handle["record_path"])
    assert (first["terminal_state"], first["err_class"]) == ("ERROR", "ERR_INFRA")
    assert "NODE_FAIL" in first["transitions"][-1]["message"]
    assert result["terminal_state"] == "COMPLETE"
    assert result["job_id"] == retry["job_id"]
    assert result["retry_of"] == handle["job_id"]
    assert result["backend_ref"] == second_id
    assert record_of(ssh_run, retry["record_path"])["terminal_state"] == "COMPLETE"
    prefix = handle["job_id"].rsplit("-", 1)[0] + "-"
    assert sorted(job_names(ssh_run, prefix), key=int) == [first_id, second_id]
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"
    assert_no_secret(ssh_run, retry, secret_value)


@pytest.mark.alone
def test_secret_env_survives_a_node_failure_resubmission(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, secret_value: str
) -> None:
    ctx = context(dag_id, "submit", "r1")
    failure = through_node_failure(ssh_run, submit_op(image, f"{SHOW_SECRET}; sleep 8", requeue=False), ctx)
    sidecar_after_failure = sidecar_mode(ssh_run, failure.handle["sidecar_path"])

    deferred, result = resubmission(ssh_run, failure, ctx)

    assert result["terminal_state"] == "COMPLETE"
    assert sidecar_mode(ssh_run, failure.handle["sidecar_path"]) == "gone"
    out = remote_text(ssh_run, f"{deferred.kwargs['job']['log_dir']}/main.out")
    assert (sidecar_after_failure, f"secret-digest={digest(secret_value)}" in out) == ("600", True)


@pytest.mark.alone
def test_node_failure_with_requeue_continues_the_same_job(conn: str, image: str, dag_id: str, ssh_run: SshRun) -> None:
    ctx = context(dag_id, "submit", "r1")
    rerun_fast = 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then echo rerun; exit 0; fi; sleep 60'

    def release_requeued(slurm_id: str) -> None:
        wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T|%r") == "PENDING|BeginTime", "job requeued")
        # Released while the first run's slurmstepd still winds down on n2, SLURM would start the job
        # there again, and slurmd would refuse it ("Duplicate jobid") and drain n2 for good.
        wait_until(lambda: not steps_running(slurm_id), "the first run's steps gone", timeout=90)
        # SLURM holds a requeued job for two minutes (BeginTime); its owner may end that wait.
        rc, _, err = ssh_run(f"scontrol update jobid={quote(slurm_id)} StartTime=now")
        assert rc == 0, err

    failure = through_node_failure(ssh_run, submit_op(image, rerun_fast, requeue=True), ctx, then=release_requeued)
    handle, slurm_id = failure.handle, failure.handle["slurm_job_id"]
    assert failure.event.payload["native"] == "COMPLETED"

    result = resume(failure.sensor, ctx, failure.deferred, failure.event)

    assert result["terminal_state"] == "COMPLETE"
    assert result["backend_ref"] == slurm_id
    states = [(t["state"], t["source"]) for t in result["transitions"]]
    running = states.index(("RUNNING", "trigger"))
    assert ("PENDING", "trigger") in states[running:], states
    assert scontrol_fields(ssh_run, slurm_id)["Restarts"] == "1"
    assert "rerun" in remote_text(ssh_run, f"{handle['log_dir']}/main.out")
    assert list(job_names(ssh_run, handle["job_id"].rsplit("-", 1)[0] + "-")) == [slurm_id]
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


# ---------------------------------------------------------------------- end markers


def ends_listing(ssh_run: SshRun, handle: dict[str, Any]) -> dict[str, float]:
    """``{marker name: mtime}`` of this job's end markers."""
    ends = f"{handle['results_base']}/ends"
    _, out, _ = ssh_run(
        join(["find", ends, "-maxdepth", "1", "-name", f"{handle['slurm_job_id']}-*.end", "-printf", "%f %T@\\n"])
    )
    return {name: float(mtime) for name, mtime in (line.split() for line in out.splitlines())}


def watched_rerun(
    image: str, ctx: dict[str, Any], first_run: str
) -> tuple[dict[str, Any], SlurmJobSensor, TaskDeferred]:
    """Submit a requeueable job whose first run does ``first_run`` and whose later runs echo ``rerun``;
    defer its sensor at a 30 s scheduler interval (the end markers decide)."""
    rerun = f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then echo rerun; exit 0; fi; {first_run}'
    handle = submit(submit_op(image, rerun, requeue=True), ctx)
    sensor = SlurmJobSensor(task_id="wait", job=handle, poke_interval=30)
    return handle, sensor, defer(sensor, ctx)


def test_the_end_marker_ends_the_watch_within_seconds_at_a_30_s_scheduler_interval(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 2; exit 3"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = SlurmJobSensor(task_id="wait", job=handle, poke_interval=30)
    deferred = defer(sensor, ctx)

    async def watch() -> tuple[TriggerEvent, float, int]:
        event = await first_event(deferred.trigger)
        seen = time.time()  # this machine is the login host: one clock
        return event, seen, sum(p.stats.polls for p in active_pollers())

    event, seen, polls = run_async(watch())
    marker = ends_listing(ssh_run, handle)
    assert list(marker) == [f"{slurm_id}-0-3.end"]
    latency = seen - marker[f"{slurm_id}-0-3.end"]
    # The marker made the poller ask accounting at once: the event carries accounting's word.
    state = full_event(deferred.trigger, event)["state"]
    assert (state["source"], state["exit_code"]) == ("sacct", 3)
    assert 0 <= latency < 4, f"the end reached the trigger {latency:.1f} s after the marker"
    assert polls == 1, "one scheduler query (the first answer); the marker did the rest"

    with pytest.raises(JobFailedError, match="ERR_PROGRAM"):
        resume(sensor, ctx, deferred, event)
    record = record_of(ssh_run, handle["record_path"])
    assert (record["terminal_state"], record["exit_codes"]) == ("ERROR", {"job": 3})
    assert final_state(ssh_run, slurm_id) == "FAILED", "the record agrees with accounting"
    assert ends_listing(ssh_run, handle) == {}, "the settled job's marker is removed"


def test_a_marker_accounting_does_not_confirm_does_not_end_the_watch(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    """A run's marker lies beside a job accounting still shows running (as when the node is lost while the
    job completes and SLURM requeues it): the watch goes on; SLURM requeues the job; the next run's end,
    confirmed by accounting, ends the watch once, and the record agrees with accounting."""
    ctx = context(dag_id, "submit", "r1")
    handle, sensor, deferred = watched_rerun(image, ctx, "sleep 300")
    slurm_id = handle["slurm_job_id"]
    planted = f"{handle['results_base']}/ends/{slurm_id}-0-0.end"

    async def scenario() -> TriggerEvent:
        watch = asyncio.ensure_future(first_event(deferred.trigger))
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "running")
        ran_on = await asyncio.to_thread(squeue_field, ssh_run, slurm_id, "%N")
        rc, _, err = await asyncio.to_thread(ssh_run, join(["touch", planted]))
        assert rc == 0, err
        await asyncio.sleep(8)  # several marker reads and accounting checks
        assert not watch.done(), "a marker accounting does not confirm ended the watch"
        rc, _, err = await asyncio.to_thread(ssh_run, join(["scontrol", "requeue", slurm_id]))
        assert rc == 0, err
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "PENDING", "requeued")
        await asyncio.to_thread(start_requeued_elsewhere, ssh_run, slurm_id, ran_on)
        return await watch

    event = run_async(scenario())
    assert (event.payload["native"], full_event(deferred.trigger, event)["state"]["source"]) == ("COMPLETED", "sacct")
    result = resume(sensor, ctx, deferred, event)
    assert result["terminal_state"] == "COMPLETE"
    assert scontrol_fields(ssh_run, slurm_id)["Restarts"] == "1"
    assert final_state(ssh_run, slurm_id) == "COMPLETED", "the record agrees with accounting"
    assert "rerun" in remote_text(ssh_run, f"{handle['log_dir']}/main.out")
    assert ends_listing(ssh_run, handle) == {}, "the settled job's markers are removed"


#: The requeue stress case: jobs, requeues of each while it runs, and the seed of the moments.
STRESS_JOBS, STRESS_REQUEUES, STRESS_SEED = 10, 2, 4111


@pytest.mark.slow
def test_requeues_at_random_moments_end_each_watch_once_on_its_true_end(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    """20 requeues at seeded random moments: 10 jobs, each requeued twice while it runs (1-8 s into a run),
    all watched at once by their deferred sensors' triggers on the shared poller, end markers on. Expected:
    each watch ends once, when the job's last run ends (accounting's COMPLETED of that run, its restart
    count the requeues made), one job per name, and each record agrees with accounting."""
    rng = random.Random(STRESS_SEED)
    moments = [[rng.uniform(1, 8) for _ in range(STRESS_REQUEUES)] for _ in range(STRESS_JOBS)]
    command = 'echo "run ${SLURM_RESTART_COUNT:-0}"; sleep 12'
    watched = []
    for k in range(STRESS_JOBS):
        ctx = context(dag_id, f"submit{k}", "r1")
        handle = submit(submit_op(image, command, task_id=f"submit{k}", requeue=True), ctx)
        sensor = SlurmJobSensor(task_id=f"wait{k}", job=handle, poke_interval=30)
        watched.append((ctx, handle, sensor, defer(sensor, ctx)))

    def restarts(slurm_id: str) -> tuple[str, int]:
        fields = scontrol_fields(ssh_run, slurm_id)
        return fields["JobState"], int(fields["Restarts"])

    async def requeue_while_running(slurm_id: str, at: list[float]) -> int:
        done = 0
        for run_index, delay in enumerate(at):
            running = ("RUNNING", run_index)
            await asyncio.to_thread(
                wait_until, lambda want=running: restarts(slurm_id) == want, f"{slurm_id} run {run_index}", 240
            )
            ran_on = await asyncio.to_thread(squeue_field, ssh_run, slurm_id, "%N")
            await asyncio.sleep(delay)
            rc, _, err = await asyncio.to_thread(ssh_run, join(["scontrol", "requeue", slurm_id]))
            assert rc == 0, err
            done += 1
            await asyncio.to_thread(wait_until, lambda: restarts(slurm_id)[0] == "PENDING", f"{slurm_id} requeued")
            if run_index == 0:  # the next run may start on the other GPU node at once; after that, SLURM's wait
                await asyncio.to_thread(start_requeued_elsewhere, ssh_run, slurm_id, ran_on)
        return done

    async def every_event(trigger: SlurmJobTrigger) -> list[TriggerEvent]:
        async with asyncio.timeout(600):
            return [event async for event in trigger.run()]

    async def scenario() -> tuple[list[list[TriggerEvent]], list[int]]:
        watches = [asyncio.ensure_future(every_event(deferred.trigger)) for *_, deferred in watched]
        requeued = await asyncio.gather(
            *(
                requeue_while_running(handle["slurm_job_id"], at)
                for (_, handle, _, _), at in zip(watched, moments, strict=True)
            )
        )
        return await asyncio.gather(*watches), list(requeued)

    events, requeued = run_async(scenario())
    assert requeued == [STRESS_REQUEUES] * STRESS_JOBS
    for (ctx, handle, sensor, deferred), job_events, done in zip(watched, events, requeued, strict=True):
        slurm_id = handle["slurm_job_id"]
        assert len(job_events) == 1, f"job {slurm_id}: the watch ended {len(job_events)} times"
        (event,) = job_events
        assert event.payload["native"] == "COMPLETED", (slurm_id, event.payload)
        assert scontrol_fields(ssh_run, slurm_id)["Restarts"] == str(done), "the event came after the last requeue"
        assert final_state(ssh_run, slurm_id) == "COMPLETED", "the event agrees with accounting"
        assert resume(sensor, ctx, deferred, event)["terminal_state"] == "COMPLETE"
        runs = [
            line
            for line in remote_text(ssh_run, f"{handle['log_dir']}/main.out").splitlines()
            if line.startswith("run ")
        ]
        assert runs[-1] == f"run {done}", runs
    names = job_names(ssh_run, f"tao-{dag_id}.")
    assert sorted(names) == sorted(handle["slurm_job_id"] for _, handle, _, _ in watched), "one job per name"
    assert len(set(names.values())) == STRESS_JOBS, names


def test_a_run_cancelled_or_requeued_by_sigterm_leaves_no_marker(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    ctx = context(dag_id, "submit", "r1")
    handle, sensor, deferred = watched_rerun(image, ctx, "sleep 60")
    slurm_id = handle["slurm_job_id"]

    async def scenario() -> tuple[TriggerEvent, dict[str, float]]:
        watch = asyncio.ensure_future(first_event(deferred.trigger))
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "running")
        ran_on = await asyncio.to_thread(squeue_field, ssh_run, slurm_id, "%N")
        rc, _, err = await asyncio.to_thread(ssh_run, join(["scontrol", "requeue", slurm_id]))
        assert rc == 0, err
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "PENDING", "requeued")
        left = await asyncio.to_thread(ends_listing, ssh_run, handle)
        assert not watch.done(), "the requeue did not end the watch"
        await asyncio.to_thread(start_requeued_elsewhere, ssh_run, slurm_id, ran_on)
        return await watch, left

    event, left = run_async(scenario())
    assert left == {}, "the run SLURM signalled left no marker"
    assert (event.payload["native"], full_event(deferred.trigger, event)["state"]["source"]) == ("COMPLETED", "sacct")
    assert resume(sensor, ctx, deferred, event)["terminal_state"] == "COMPLETE"
    assert final_state(ssh_run, slurm_id) == "COMPLETED"
