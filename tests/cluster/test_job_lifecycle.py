"""Exactly once on a cluster shared with others (issue 14), each promise proven on the real test cluster.

The job-lifecycle layer (:mod:`airflow_provider_tao_slurm.lifecycle`) owns a job's life; these tests
drive it through the operators and the sensor the way a worker and a triggerer do. The second Unix
user ``slurmother`` of the test cluster plays the other people on a shared cluster.
"""

from __future__ import annotations

import asyncio
import subprocess
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import (
    as_other,
    conn,
    dag_id,
    final_state,
    harness,
    image,
    jobs_named,
    record_of,
    remote_text,
    secret_value,
    sensor_for,
    sidecar_mode,
    squeue_field,
    submit,
    submit_and_sigkill,
    submit_as_other,
    submit_op,
)
from deferral import context, defer, first_event, resume, run_async, wait_until

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core import states as core_states
from airflow_provider_tao_slurm.core.continuation import slice_job_id
from airflow_provider_tao_slurm.core.failures import Classification
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import mint_job_id
from airflow_provider_tao_slurm.core.resubmission import remaining_nodes
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import (
    JobFailedError,
    JobLookupError,
    JobNotFoundError,
    StatusQueryError,
    UnknownStateError,
)
from airflow_provider_tao_slurm.lifecycle.events import JobHandle
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle, _retry_record
from airflow_provider_tao_slurm.lifecycle.submission import find_job

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["conn", "dag_id", "image", "secret_value"]

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def live_jobs(ssh_run: SshRun, *names: str) -> list[str]:
    """Ids of the live jobs (any user) carrying one of ``names``."""
    found = []
    for name in names:
        for slurm_id in jobs_named(ssh_run, name):
            if squeue_field(ssh_run, slurm_id, "%T") in LIVE:
                found.append(slurm_id)
    return found


# ---------------------------------------------------------------------- 1. any try adopts any earlier try


def test_try_3_adopts_the_job_of_sigkilled_try_2(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, record_property: Any
) -> None:
    """Try 1 of the submit task submitted a job that failed (its record ERROR). Try 2 submitted a fresh job and
    was SIGKILLed right after its sbatch (held, never released). Try 3 ran. Expected: try 3 submits nothing,
    adopts try 2's job (releasing it); try 2's record points to try 1's (retry_of); exactly one live job."""
    first_ctx = context(dag_id, "submit", "r1")
    first = submit(submit_op(image, "exit 3"), first_ctx)
    sensor = sensor_for(first)
    deferred = defer(sensor, first_ctx)
    with pytest.raises(JobFailedError):
        resume(sensor, first_ctx, deferred, run_async(first_event(deferred.trigger)))
    assert record_of(ssh_run, first["record_path"])["terminal_state"] == "ERROR"

    second_name = submit_and_sigkill(cluster, image, dag_id, try_number=2, command="sleep 3")
    assert second_name == mint_job_id(dag_id, "submit", "r1", try_number=2)
    (second_id,) = jobs_named(ssh_run, second_name)
    left = squeue_field(ssh_run, second_id, "%T|%r")
    assert left == "PENDING|JobHeldUser"

    third = submit(submit_op(image, "sleep 3"), context(dag_id, "submit", "r1", try_number=3))
    third_name = mint_job_id(dag_id, "submit", "r1", try_number=3)
    record_property("detail", f"try 2's job {second_id} was {left}; try 3 returned {third['slurm_job_id']}")

    assert (third["job_id"], third["slurm_job_id"]) == (second_name, second_id)
    assert third["retry_of"] == first["job_id"]
    assert record_of(ssh_run, third["record_path"])["retry_of"] == first["job_id"]
    assert jobs_named(ssh_run, third_name) == []
    assert live_jobs(ssh_run, first["job_id"], second_name, third_name) == [second_id]
    assert squeue_field(ssh_run, second_id, "%r") != "JobHeldUser"  # released by try 3
    ctx = context(dag_id, "submit", "r1", try_number=3)
    sensor = sensor_for(third)
    deferred = defer(sensor, ctx)
    assert resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger)))["terminal_state"] == "COMPLETE"


@pytest.mark.parametrize("path", ["infrastructure-resubmission", "next-slice", "next-slice-of-the-previous-release"])
def test_a_held_job_a_killed_sensor_left_is_released_by_its_retry_and_runs(
    path: str, conn: str, image: str, dag_id: str, ssh_run: SshRun, slurm_hook: SlurmHook, record_property: Any
) -> None:
    """A job ended (a NODE_FAIL to resubmit, a TIMEOUT slice to continue). The sensor's try opened the record of
    the job that follows it and was killed inside that job's submission: the job of the next name stands held
    (``sbatch --hold`` as the cluster user, as a killed worker leaves it), its log directory missing. The sensor's
    retry ran. Expected: it submits nothing, adopts that job (releasing it, creating its log directory, binding
    its record), and the job runs to COMPLETED, writing its log; one job of that name. The next slice is named
    after the training (``<first job>-s2``); the previous release named it after the sensor task, and a chain
    it left running across the upgrade is still adopted by that name."""
    slicing = {"max_continuations": 1} if path.startswith("next-slice") else {}
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "echo ran-$SLURM_JOB_ID", secret_env=None, requeue=False, **slicing), ctx)
    first_id = handle["slurm_job_id"]
    assert wait_until(lambda: final_state(ssh_run, first_id) == "COMPLETED", "the first job ended", timeout=120)
    _, node, _ = ssh_run(join(["sacct", "-X", "-n", "-P", "-j", first_id, "-o", "NodeList"]))

    sensor_ti = SimpleNamespace(dag_id=dag_id, task_id="wait", run_id="r1", map_index=-1, try_number=2)
    new_id = mint_job_id(dag_id, "wait", "r1", retry_of=handle["job_id"])
    if path == "next-slice":
        new_id = slice_job_id(handle["job_id"], 2)
    lifecycle = JobLifecycle(slurm_hook)
    record = lifecycle.require_record(JobHandle.from_dict(handle))
    new_path = JobLayout(handle["results_base"], new_id).record_path
    lifecycle.write_record(new_path, _retry_record(record, new_id))  # what the killed try wrote before its sbatch
    env = ["--export=ALL,TAO_SLURM_SLICE=2"] if slicing else ["--export=ALL"]
    rc, out, err = ssh_run(
        join(["sbatch", "--hold", "--parsable", f"--job-name={new_id}", *env, handle["script_path"]])
    )
    assert rc == 0, err
    held = out.strip().split(";")[0]
    try:
        assert squeue_field(ssh_run, held, "%T|%r") == "PENDING|JobHeldUser"

        if path.startswith("next-slice"):
            state = core_states.state_from_native(first_id, "TIMEOUT", source="sacct", exit_code=0, signal=0,
                                                  node_list=node.strip())  # fmt: skip
            new = lifecycle.continue_slice(sensor_ti, JobHandle.from_dict(handle), record, state, None)
        else:
            state = core_states.state_from_native(first_id, "NODE_FAIL", source="sacct", exit_code=0, signal=0,
                                                  node_list=node.strip())  # fmt: skip
            verdict = Classification(core_states.ErrClass.ERR_INFRA, "node failure", "State=NODE_FAIL", True)
            new = lifecycle.resubmit(sensor_ti, JobHandle.from_dict(handle), record, state, verdict)
        left = squeue_field(ssh_run, held, "%T|%r")
        record_property("detail", f"{path}: held job {held} was adopted; after the retry squeue says {left}")

        assert (new.job_id, new.slurm_job_id) == (new_id, held)
        assert not left.endswith("JobHeldUser"), left
        assert jobs_named(ssh_run, new_id) == [held]
        adopted = record_of(ssh_run, new_path)
        assert (adopted["backend_ref"], adopted["transitions"][-1]["state"]) == (held, "RUNNING")
        assert wait_until(lambda: final_state(ssh_run, held) == "COMPLETED", "the adopted job ran", timeout=120)
        assert f"ran-{held}" in remote_text(ssh_run, f"{new.log_dir}/main.out")
    finally:  # a job left held would wait forever
        ssh_run(join(["scancel", held]))


# ---------------------------------------------------------------------- 2. only our own jobs


def test_another_users_job_of_the_same_name_is_never_touched(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, slurm_hook: SlurmHook
) -> None:
    """Another user (slurmother) held a job carrying exactly the name our submit task mints. Our try 2 (which
    looks for an earlier try's job before submitting), the reconcile lookup and a cancel by name ran. Expected:
    the other user's job is never adopted, released or cancelled; our try submits its own job."""
    name = mint_job_id(dag_id, "submit", "r1")
    theirs = submit_as_other(cluster, name, "sleep 300", hold=True)
    try:
        assert squeue_field(ssh_run, theirs, "%u|%r") == f"{cluster.other_user}|JobHeldUser"
        assert slurm_hook.find_jobs_by_name(name, all_hosts=True) == []

        ours = submit(submit_op(image, "sleep 2"), context(dag_id, "submit", "r1", try_number=2))

        assert ours["job_id"] == name
        assert ours["slurm_job_id"] != theirs
        assert slurm_hook.find_jobs_by_name(name, all_hosts=True) == [ours["slurm_job_id"]]
        assert find_job(slurm_hook, name) == ours["slurm_job_id"]
        slurm_hook.cancel([theirs], job_name=name)
        JobLifecycle(slurm_hook).cancel(JobHandle.from_dict(ours), source="test")
        assert wait_until(lambda: final_state(ssh_run, ours["slurm_job_id"]) == "CANCELLED", "ours cancelled")
        assert squeue_field(ssh_run, theirs, "%u|%T|%r") == f"{cluster.other_user}|PENDING|JobHeldUser"
    finally:
        as_other(cluster, join(["scancel", theirs]))


# ---------------------------------------------------------------------- 3. a failed lookup is not an answer


@pytest.mark.alone
def test_failed_lookups_raise_and_nothing_is_submitted(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, slurm_hook: SlurmHook, record_property: Any
) -> None:
    """slurmctld was stopped (login host reachable, controller not). The submit task's try 2 (which must look
    for an earlier try's job first), a lookup by name and a status poll of an unknown job ran; then slurmdbd
    was stopped with the controller back. Expected: each lookup raises a typed error with the evidence, never
    "no such job"; no job is submitted; the poll reports the job unanswered, not gone."""
    name = mint_job_id(dag_id, "submit", "r1")
    harness("stop-slurmctld")
    try:
        with pytest.raises(JobLookupError, match="squeue exited") as lookup:
            slurm_hook.find_jobs_by_name(name)
        with pytest.raises(JobLookupError):
            submit(submit_op(image, "sleep 1"), context(dag_id, "submit", "r1", try_number=2))
        with pytest.raises(StatusQueryError) as poll:
            slurm_hook.get_states(["99999999"])
        assert poll.value.unanswered == ["99999999"]
    finally:
        harness("start-slurmctld", timeout=180)
    harness("stop-slurmdbd")
    try:
        with pytest.raises(JobLookupError, match="sacct exited"):
            slurm_hook.find_jobs_by_name(name)
    finally:
        harness("start-slurmdbd")
    record_property("detail", f"controller down: {lookup.value.evidence[:160]}")
    assert jobs_named(ssh_run, name) == []


# ---------------------------------------------------------------------- 4. cancel is recorded


def test_user_kill_of_a_poking_sensor_is_recorded(conn: str, image: str, dag_id: str, ssh_run: SshRun) -> None:
    """The same kill of a sensor waiting in a worker (deferrable=False). Expected: cancelled, record CANCELED
    with source "sensor on_kill", sidecar gone."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 60"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle, deferrable=False)
    wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "running")
    assert sensor.poke(ctx) is False  # one real status query: the job runs
    sensor._current = JobHandle.from_dict(handle)  # what execute() keeps while poking in the worker
    sensor.on_kill()
    sensor.hook.close()
    assert wait_until(lambda: final_state(ssh_run, slurm_id) == "CANCELLED", "job cancelled in sacct", timeout=30)
    record = record_of(ssh_run, handle["record_path"])
    assert (record["terminal_state"], record["transitions"][-1]["source"]) == ("CANCELED", "sensor on_kill")
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


# ---------------------------------------------------------------------- 5. a vanished job


def test_vanished_job_is_recorded_unknown_and_its_sidecar_removed(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    """The sensor watched a job id that neither squeue nor sacct knows (as after accounting lost a job), with a
    3-second grace window. Expected: the task fails (JobNotFoundError), the record's last state is UNKNOWN,
    the secret sidecar is removed."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 1"), ctx)
    ghost = {**handle, "slurm_job_id": "99999999", "submitted_at": None}
    sensor = sensor_for(ghost, not_found_grace_seconds=3)
    deferred = defer(sensor, ctx)
    event = run_async(first_event(deferred.trigger, 60))
    assert event.payload["status"] == "vanished"

    with pytest.raises(JobNotFoundError, match="unknown to squeue and sacct"):
        resume(sensor, ctx, deferred, event)

    record = record_of(ssh_run, handle["record_path"])
    assert record["transitions"][-1]["state"] == "UNKNOWN"
    assert record["terminal_state"] is None
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


# ---------------------------------------------------------------------- 6. unrecognised states


def test_unrecognised_state_fails_after_the_grace_naming_it(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running job was suspended by an admin (scontrol suspend, as root) while this provider was made not to
    know SUSPENDED (as it would not know a state a newer SLURM adds), with a 3-second grace. Expected: the
    trigger stops polling with an "unrecognised" event, the task fails naming the raw state, the record is
    UNKNOWN; the job itself is left alone."""
    monkeypatch.delitem(core_states._NATIVE, "SUSPENDED")
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 60"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle, unrecognised_grace_seconds=3)
    deferred = defer(sensor, ctx)
    try:
        wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "running")
        proc = subprocess.run(["scontrol", "suspend", slurm_id], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        event = run_async(first_event(deferred.trigger, 60))
        assert event.payload["status"] == "unrecognised"
        with pytest.raises(UnknownStateError, match="'SUSPENDED'"):
            resume(sensor, ctx, deferred, event)
        record = record_of(ssh_run, handle["record_path"])
        assert record["transitions"][-1]["state"] == "UNKNOWN"
        assert "SUSPENDED" in record["transitions"][-1]["message"]
        assert squeue_field(ssh_run, slurm_id, "%T") == "SUSPENDED"
    finally:
        subprocess.run(["scancel", slurm_id], check=False)
        wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T") not in LIVE, "suspended job gone", timeout=90)


# ---------------------------------------------------------------------- 7. resubmission fits the partition


@pytest.mark.alone
def test_node_failure_of_a_job_the_partition_could_not_fit_again_is_not_resubmitted(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """A 2-node job (both nodes of the GPU partition) without requeue ran when n2 went DOWN (NODE_FAIL).
    Excluding the failed node leaves one node for a 2-node job, which could never start. Expected: no
    resubmission (no retry record, no second job), the task fails with the evidence and the node count, the
    record is ERROR/ERR_INFRA, the sidecar is gone."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 60", num_nodes=2, nccl_env={}, requeue=False), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)

    async def watch_and_fail() -> Any:
        watch = asyncio.ensure_future(first_event(deferred.trigger))
        await asyncio.to_thread(
            wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "running on both nodes", 180
        )
        await asyncio.sleep(2)
        await asyncio.to_thread(harness, "node-down", "n2")
        return await watch

    try:
        event = run_async(watch_and_fail())
    finally:
        wait_until(lambda: "down" not in squeue_node_state(ssh_run, "n2"), "n2 back", timeout=90)
    assert event.payload["native"] == "NODE_FAIL"
    with pytest.raises(JobFailedError, match="could never start") as failed:
        resume(sensor, ctx, deferred, event)

    assert failed.value.err_class == "ERR_INFRA"
    assert "n2" in str(failed.value)
    retry_name = mint_job_id(dag_id, "wait", "r1", retry_of=handle["job_id"])
    assert jobs_named(ssh_run, retry_name) == []
    rc, _, _ = ssh_run(f"test -e {quote(handle['record_path'].rsplit('/', 1)[0])}/{quote(retry_name)}.json")
    assert rc != 0
    record = record_of(ssh_run, handle["record_path"])
    assert (record["terminal_state"], record["err_class"]) == ("ERROR", "ERR_INFRA")
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


def test_node_states_read_for_a_resubmission_see_the_hidden_partition(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, slurm_hook: SlurmHook
) -> None:
    """A 1-node job ran on the hidden partition (``Hidden=YES``: plain sinfo lists none of its nodes) and ended
    NODE_FAIL on its node. Expected: the node states a resubmission reads list the hidden partition's nodes, the
    failed node's hostlist expands, and the exclusions leave the other node: the job is resubmittable
    (before, "leaves 0 node(s)" failed it)."""
    _, plain, _ = ssh_run(join(["sinfo", "-h", "-N", "-o", "%N|%P|%t"]))
    assert f"|{cluster.hidden_partition}|" not in plain, "the test cluster hides the partition from plain sinfo"
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 1", secret_env=None, partition=cluster.hidden_partition), ctx)
    assert wait_until(lambda: final_state(ssh_run, handle["slurm_job_id"]) == "COMPLETED", "job ended", timeout=120)
    _, node, _ = ssh_run(join(["sacct", "-X", "-n", "-P", "-j", handle["slurm_job_id"], "-o", "NodeList"]))
    node = node.strip()

    rows = commands.parse_node_states(slurm_hook.run(commands.node_states(), check=True).stdout)
    listed = slurm_hook.run(commands.existing_nodes(node), check=True).stdout.split()
    lifecycle = JobLifecycle(slurm_hook)
    state = core_states.state_from_native(handle["slurm_job_id"], "NODE_FAIL", source="sacct", exit_code=0, signal=0,
                                          node_list=node)  # fmt: skip
    verdict = Classification(core_states.ErrClass.ERR_INFRA, "node failure", "State=NODE_FAIL", True)
    job = JobHandle.from_dict(handle)
    excluded = lifecycle._exclusions(job, lifecycle.require_record(job), state, verdict, check_fit=True)

    hidden = sorted(row.name for row in rows if row.partition == cluster.hidden_partition)
    assert hidden == ["n1", "n2"]
    assert set(listed) == {node}  # once per partition of the node, the hidden one included
    assert lifecycle._expand(node) == [node]
    assert excluded == [node]
    assert remaining_nodes([cluster.hidden_partition], excluded, rows) == [n for n in hidden if n != node]
    assert record_of(ssh_run, handle["record_path"])["terminal_state"] is None  # nothing settled: it fits


def squeue_node_state(ssh_run: SshRun, node: str) -> str:
    """sinfo's long state of ``node``."""
    _, out, _ = ssh_run(join(["sinfo", "-h", "-N", "-n", node, "-o", "%T"]))
    return out.strip()


def test_deferral_kwargs_carry_the_typed_handle(conn: str, image: str, dag_id: str) -> None:
    """The sensor's deferral carries the handle's public keys (the XCom contract), typed and round-tripped;
    its trigger knows the record and the sidecar (a user kill records CANCELED and removes it)."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 1"), ctx)
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    kept = deferred.kwargs["job"]
    for key in ("job_id", "slurm_job_id", "job_dir", "results_dir", "log_dir", "record_path", "cluster"):
        assert kept[key] == handle[key]
    trigger = deferred.trigger
    assert (trigger.record_path, trigger.sidecar_path) == (handle["record_path"], handle["sidecar_path"])
    result = resume(sensor, ctx, deferred, run_async(first_event(trigger)))
    assert result["terminal_state"] == "COMPLETE"
