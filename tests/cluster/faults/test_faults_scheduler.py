"""Fault suite (issue 10), the SLURM side: controller and accounting outages, accounting lag, failure states.

Jobs run through the provider as Airflow runs them (see ``tests/cluster/deferral.py``); daemons are
stopped and started with the harness, for real. The wall-time case (SLURM enforces limits in whole
minutes, checked every 30 s, so it takes 60-90 s) is submitted when the fault suite starts (see its
conftest) and settled by this module's last test, so it overlaps the other cases.

OUT_OF_MEMORY and PREEMPTED cannot happen on the test cluster (no cgroup memory enforcement, no
preemption configured). Those two cases run a real job that really ends (SIGKILLed like the OOM
killer does, or cancelled like preemption without requeue does) and rewrite only the state columns
of the scheduler's answer on its way into the provider; everything downstream is real.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import (
    final_state,
    harness,
    job_names,
    jobs_named,
    record_of,
    remote_text,
    sensor_for,
    sidecar_mode,
    squeue_field,
    submit,
    submit_op,
)
from deferral import context, defer, first_event, full_event, resume, run_async, wait_until

from airflow_provider_tao_slurm.core.shell import join
from airflow_provider_tao_slurm.exceptions import JobFailedError
from airflow_provider_tao_slurm.hooks.slurm import CommandResult, SlurmHook

if TYPE_CHECKING:
    from airflow.triggers.base import TriggerEvent

    from tests.cluster.conftest import SshRun

pytestmark = pytest.mark.cluster

RANK = {"PENDING": 0, "RUNNING": 1, "COMPLETE": 2}
#: Seconds the trigger keeps polling with accounting down once the job ended (about three polls).
POLLS_BEFORE_RESTART = 3.0


def no_requeue_pending(result: dict[str, Any]) -> bool:
    """Whether the record shows no PENDING after the job started (which would claim a requeue)."""
    states = [t["state"] for t in result["transitions"]]
    started = states.index("RUNNING") if "RUNNING" in states else len(states)
    return "PENDING" not in states[started + 1 :]


def step_running(ssh_run: SshRun, slurm_id: str) -> bool:
    """Whether squeue lists the job's first step (srun got it from slurmctld and launched it)."""
    _, out, _ = ssh_run(join(["squeue", "-h", "-s", "-j", slurm_id, "-o", "%i"]))
    return f"{slurm_id}.0" in out.split()


def watch_through(deferred: Any, ssh_run: SshRun, slurm_id: str, fault: Any, *, when: str = "RUNNING") -> TriggerEvent:
    """Run the trigger until its event; run ``fault()`` in a thread once squeue shows the job ``when``."""

    async def scenario() -> TriggerEvent:
        watch = asyncio.ensure_future(first_event(deferred.trigger, 150))
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == when, f"job {when}", 120)
        await asyncio.to_thread(fault)
        return await watch

    return run_async(scenario())


@pytest.mark.alone
def test_slurmctld_restarted_mid_job(conn: str, image: str, dag_id: str, ssh_run: SshRun, record_property: Any) -> None:
    """A job ran while its sensor was deferred; slurmctld was restarted (stopped and started by the harness)
    in the middle of it, while its step ran. Expected: the job survives the restart (no requeue, no restart
    count), the trigger keeps polling through the outage and sends one COMPLETED event with exit code 0, the
    task ends COMPLETE; one SLURM job."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 10; echo finished"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)

    def restart_under_the_step() -> None:
        # Once srun holds its step: a restart before it is a different case (srun cannot confirm the
        # allocation and the program never runs), classified as an infrastructure failure in the unit corpus.
        wait_until(lambda: step_running(ssh_run, slurm_id), "step 0 running", 60)
        harness("restart-slurmctld")

    event = watch_through(deferred, ssh_run, slurm_id, restart_under_the_step)
    result = resume(sensor, ctx, deferred, event)

    state = full_event(deferred.trigger, event)["state"]
    record_property("detail", f"event {event.payload['native']} from {state['source']}")
    assert (event.payload["native"], state["exit_code"]) == ("COMPLETED", 0)
    assert result["terminal_state"] == "COMPLETE"
    assert no_requeue_pending(result)
    assert squeue_field(ssh_run, slurm_id, "%T") in ("COMPLETED", "")
    _, shown, _ = ssh_run(join(["scontrol", "show", "job", slurm_id]))
    assert tuple(w for w in shown.split() if w.startswith(("JobState=", "Restarts="))) == (
        "JobState=COMPLETED",
        "Restarts=0",
    )
    assert "finished" in remote_text(ssh_run, f"{handle['log_dir']}/main.out")
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]


@pytest.mark.alone
def test_slurmdbd_down_then_back(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, slurm_hook: SlurmHook, record_property: Any
) -> None:
    """slurmdbd was stopped before the submit, so sacct failed while squeue kept working; the job was
    submitted and ran to its end with accounting down, then slurmdbd was started again. Expected: submit
    works, the poll falls back to squeue (no failed poll), the trigger does not settle on squeue's
    exit-code-less COMPLETED but waits for accounting, which answers once slurmdbd is back: one COMPLETED
    event with exit code 0 from sacct; the task ends COMPLETE; one SLURM job."""
    harness("stop-slurmdbd")
    try:
        rc, _, err = ssh_run(join(["sacct", "-X", "-n", "-j", "1"]), timeout=90)
        assert rc != 0, "sacct still answers with slurmdbd stopped"
        ctx = context(dag_id, "submit", "r1")
        handle = submit(submit_op(image, "sleep 3; echo finished"), ctx)
        slurm_id = handle["slurm_job_id"]
        sensor = sensor_for(handle)
        deferred = defer(sensor, ctx)

        def accounting_back() -> None:
            state = slurm_hook.get_states([slurm_id])[slurm_id]  # squeue answers, sacct fails: no error
            assert (state.native, state.source, state.exit_code) == ("COMPLETED", "squeue", None)
            time.sleep(POLLS_BEFORE_RESTART)
            harness("start-slurmdbd")

        event = watch_through(deferred, ssh_run, slurm_id, accounting_back, when="COMPLETED")
    finally:
        harness("start-slurmdbd")
    result = resume(sensor, ctx, deferred, event)

    record_property("detail", f"sacct with slurmdbd down: {err.strip()[:120]}")
    state = full_event(deferred.trigger, event)["state"]
    assert (state["native"], state["source"], state["exit_code"]) == ("COMPLETED", "sacct", 0)
    assert result["terminal_state"] == "COMPLETE"
    assert result["exit_codes"] == {"job": 0}
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]


def test_sacct_lag_right_after_submit(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, slurm_hook: SlurmHook
) -> None:
    """A one-second job was submitted and, from the moment sbatch answered, polled every 0.1 s with the
    provider's batched squeue+sacct query while its trigger watched it at 0.2 s. sacct knows a new job only
    seconds later and first shows a placeholder PENDING row. Expected: no poll loses the job, fails or
    goes backwards (PENDING -> RUNNING -> COMPLETE), the trigger sends one COMPLETED event with sacct's exit
    code 0, and the record claims no requeue."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 1"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle, poke_interval=0.2)
    deferred = defer(sensor, ctx)

    def poll_until_accounted() -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        while not seen or seen[-1] != ("COMPLETE", "sacct"):
            assert len(seen) < 600, f"no final sacct answer after 60 s: {seen[-5:]}"
            state = slurm_hook.get_states([slurm_id]).get(slurm_id)
            assert state is not None, f"job {slurm_id} unknown to both squeue and sacct after {seen}"
            seen.append((str(state.tao_state), state.source))
            time.sleep(0.1)
        return seen

    async def both() -> tuple[TriggerEvent, list[tuple[str, str]]]:
        return await asyncio.gather(first_event(deferred.trigger, 60), asyncio.to_thread(poll_until_accounted))

    event, seen = run_async(both())
    result = resume(sensor, ctx, deferred, event)

    ranks = [RANK[state] for state, _ in seen]
    assert ranks == sorted(ranks), seen
    state = full_event(deferred.trigger, event)["state"]
    assert (state["source"], state["exit_code"]) == ("sacct", 0)
    assert result["terminal_state"] == "COMPLETE"
    assert no_requeue_pending(result)
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]


def rewrite_state(monkeypatch: pytest.MonkeyPatch, slurm_id: str, native: str, exit_code: str) -> None:
    """Rewrite the state (and sacct's exit code) of ``slurm_id``'s terminal rows in every squeue/sacct answer."""
    original = SlurmHook.a_run

    def rewrite(line: str, sacct: bool) -> str:
        fields = line.split("|")
        if fields[0] != slurm_id or fields[2].split()[0].rstrip("+") not in ("COMPLETED", "FAILED", "CANCELLED"):
            return line
        fields[2] = native
        if sacct:
            fields[3] = exit_code
        return "|".join(fields)

    async def a_run(self: SlurmHook, command: str, **kwargs: Any) -> CommandResult:
        result = await original(self, command, **kwargs)
        if command.startswith(("squeue ", "sacct ")):
            lines = [rewrite(line, command.startswith("sacct ")) for line in result.stdout.split("\n")]
            result = dataclasses.replace(result, stdout="\n".join(lines))
        return result

    monkeypatch.setattr(SlurmHook, "a_run", a_run)


@pytest.mark.parametrize(
    ("native", "exit_code", "command", "ending", "terminal", "err_class"),
    [
        pytest.param(
            "OUT_OF_MEMORY", "0:125", "echo allocating; kill -9 $$", None, "ERROR", "ERR_PROGRAM", id="out-of-memory"
        ),
        pytest.param("PREEMPTED", "0:15", "sleep 60", "scancel", "CANCELED", None, id="preempted"),
    ],
)
def test_failure_state_ends_the_task_once(
    conn: str,
    image: str,
    dag_id: str,
    ssh_run: SshRun,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
    native: str,
    exit_code: str,
    command: str,
    ending: str | None,
    terminal: str,
    err_class: str | None,
) -> None:
    """A real job ended for real (its program SIGKILLed as the OOM killer does, or the job cancelled while
    running as preemption without requeue does); the scheduler's answer was rewritten to OUT_OF_MEMORY /
    PREEMPTED on its way into the provider (the test cluster has no cgroup memory limits and no preemption).
    Expected: one terminal event, the task fails with the state in its message, the record is terminal
    (OUT_OF_MEMORY: ERROR, ERR_PROGRAM, not resubmitted; PREEMPTED: CANCELED), the sidecar is gone, one
    SLURM job and nothing left running."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, command), ctx)
    slurm_id = handle["slurm_job_id"]
    rewrite_state(monkeypatch, slurm_id, native, exit_code)
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    if ending == "scancel":
        event = watch_through(deferred, ssh_run, slurm_id, lambda: ssh_run(join(["scancel", slurm_id])))
    else:
        event = run_async(first_event(deferred.trigger, 120))

    with pytest.raises(JobFailedError) as failed:
        resume(sensor, ctx, deferred, event)

    record = record_of(ssh_run, handle["record_path"])
    record_property("detail", f"task failed ({failed.value.err_class}); record {record['terminal_state']}")
    assert event.payload["native"] == native
    assert native in str(failed.value)
    assert (record["terminal_state"], record.get("err_class")) == (terminal, err_class)
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"
    assert list(job_names(ssh_run, handle["job_id"].rsplit("-", 1)[0] + "-")) == [slurm_id]  # not resubmitted
    assert final_state(ssh_run, slurm_id) in ("FAILED", "CANCELLED")


def test_timeout_at_the_wall_limit(
    conn: str, wall_limit_job: tuple[dict[str, Any], str], ssh_run: SshRun, record_property: Any
) -> None:
    """The fault suite's first act submitted a job whose program ignores SIGTERM, with a one-minute wall limit
    (program timeout 48 s). ``timeout`` cannot stop it, so SLURM ended it at the wall limit. Expected: one
    TIMEOUT event, the task fails as a program error (not resubmitted: more time would not be an
    infrastructure fix), record ERROR/ERR_PROGRAM, sidecar gone, one SLURM job."""
    handle, dag = wall_limit_job
    ctx = context(dag, "submit", "r1")
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    event = run_async(first_event(deferred.trigger, 150))

    with pytest.raises(JobFailedError, match="TIMEOUT") as failed:
        resume(sensor, ctx, deferred, event)

    record = record_of(ssh_run, handle["record_path"])
    record_property("detail", f"task failed ({failed.value.err_class}); record {record['terminal_state']}")
    assert event.payload["native"] == "TIMEOUT"
    assert failed.value.err_class == "ERR_PROGRAM"
    assert (record["terminal_state"], record["err_class"]) == ("ERROR", "ERR_PROGRAM")
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"
    assert jobs_named(ssh_run, handle["job_id"]) == [handle["slurm_job_id"]]
