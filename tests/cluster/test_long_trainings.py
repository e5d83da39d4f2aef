"""Trainings longer than one allocation (issue 33), on the real test cluster.

The training stand-in (``dags/programs/tao_like_train.py``) checkpoints every epoch and resumes after
its last checkpoint, as TAO's trainers do. The partition ``polar_1m`` has a one-minute ``MaxTime``, so
a training of 12 epochs of 10 s needs several slices; SLURM ends each one TIMEOUT. The chains run at
the same time (one GPU each) to keep the module short.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from clusterkit import (
    SECRET_SOURCE,
    as_other,
    conn,
    dag_id,
    demo_program,
    image,
    record_of,
    remote_text,
    secret_value,
    sensor_for,
    squeue_field,
    submit,
    submit_op,
)
from deferral import context, defer, first_event, resume, run_async, run_deferrable, wait_until
from demo import DEMO_DIR, airflow_facts, prepare_airflow, run_dag

from airflow_provider_tao_slurm.core.shell import join
from airflow_provider_tao_slurm.exceptions import JobFailedError

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("demo_program")]

__all__ = ["conn", "dag_id", "demo_program", "image", "secret_value"]

PROGRAM = f"python3 {DEMO_DIR}/tao_like_train.py"
#: No timeout_hours: a chain's slice runs until SLURM's limit, a job that is not continued gets the derived 45 s.
SLICE = {"time_hours": 1 / 60, "timeout_hours": None}
#: sacct states of a job that has not ended yet
LIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED", "RESIZING"}


def training(image: str, partition: str, epochs: int, epoch_seconds: int = 10, **kwargs: Any) -> Any:
    """A TAO-like training of ``epochs`` epochs of ``epoch_seconds`` each."""
    kwargs.setdefault("secret_env", None)
    return submit_op(
        image,
        f"{PROGRAM} --spec {{config_path}} --results {{results_dir}} --epoch-seconds {epoch_seconds}",
        spec={"train": {"epochs": epochs}},
        partition=partition,
        network_arch="classification_pyt",
        **{**SLICE, **kwargs},
    )


def sacct_rows(ssh_run: SshRun, job_ids: list[str]) -> list[list[str]]:
    """``JobName|JobID|State`` of the SLURM jobs named ``job_ids`` (one row per job, its last run).

    Waits up to a minute for accounting to hold an ended row for every name: slurmdbd records a job
    after slurmctld ended it, and on a loaded machine (CI, 2 cores) that lags by seconds.
    """
    command = join(
        ["sacct", "-X", "-n", "-P", "-S", "now-1hours", f"--name={','.join(job_ids)}", "-o", "JobName,JobID,State"]
    )
    deadline = time.monotonic() + 60
    while True:
        rows = [line.split("|") for line in ssh_run(command)[1].splitlines() if line.strip()]
        ended = {row[0] for row in rows if row[2].split()[0] not in LIVE_STATES}
        if ended >= set(job_ids) or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def in_thread(work: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``work`` now in a thread; the returned call joins it and returns its result or raises its error."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join_() -> Any:
        thread.join(600)
        assert not thread.is_alive(), "the chain did not end within 10 minutes"
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return join_


@pytest.mark.slow
def test_trainings_over_several_slices(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """Four chains on the one-minute partition at once:

    - 12 epochs, ``max_continuations=4``: the sensor succeeds over at least two slices; every epoch runs
      exactly once; every slice but the last ended TIMEOUT, the last COMPLETED; one SLURM job per slice;
      the sensor's retry right after a slice ended adopts the next slice instead of starting another;
    - a program that writes no checkpoint: the sensor fails after the first slice naming the missing
      checkpoint, with exactly one job;
    - ``max_continuations=0``: TIMEOUT stays an ERROR (the seed's rule);
    - a user kill during slice 2 cancels that slice and records CANCELED.
    """
    long_ctx = context(dag_id, "train", "r1")
    long = submit(training(image, cluster.short_partition, 12, max_continuations=4), long_ctx)
    none_ctx = context(dag_id, "none", "r1")
    no_checkpoint = submit(
        submit_op(image, "sleep 200", partition=cluster.short_partition, secret_env=None, max_continuations=2, **SLICE),
        none_ctx,
    )
    seed_ctx = context(dag_id, "seed", "r1")
    # ignores the SIGTERM of its own timeout: SLURM's limit ends it, TIMEOUT
    seed_job = submit_op(image, "trap '' TERM; sleep 200", partition=cluster.short_partition, secret_env=None, **SLICE)
    seed = submit(seed_job, seed_ctx)
    kill_ctx = context(dag_id, "kill", "r1")
    killed = submit(training(image, cluster.short_partition, 30, max_continuations=4), kill_ctx)

    def chain_with_a_retry() -> Any:
        """The first slice's end is settled twice (a sensor retry): the second adopts the slice the first started."""
        sensor = sensor_for(long)
        first = defer(sensor, long_ctx)
        event = run_async(first_event(first.trigger, 200))
        started = []
        for _ in range(2):
            with pytest.raises(TaskDeferred) as next_slice:  # the next slice is watched
                resume(sensor_for(long), long_ctx, first, event)
            started.append(next_slice.value.trigger.slurm_job_id)
        assert len(set(started)) == 1, started
        return run_deferrable(sensor_for(next_slice.value.kwargs["job"]), long_ctx, timeout=200)

    def kill_in_slice_two() -> Any:
        """The user marks the task failed while slice 2 runs: the triggerer cancels run(), then on_kill()."""
        sensor = sensor_for(killed)
        deferred = defer(sensor, kill_ctx)
        event = run_async(first_event(deferred.trigger, 200))
        with pytest.raises(TaskDeferred) as watching:
            resume(sensor, kill_ctx, deferred, event)
        second = watching.value.kwargs["job"]
        wait_until(
            lambda: squeue_field(ssh_run, second["slurm_job_id"], "%T") == "RUNNING", "slice 2 running", timeout=120
        )
        run_async(watching.value.trigger.on_kill())
        return second

    results = {
        name: in_thread(work)
        for name, work in {
            "long": chain_with_a_retry,
            "none": lambda: run_deferrable(sensor_for(no_checkpoint), none_ctx, timeout=200),
            "seed": lambda: run_deferrable(sensor_for(seed), seed_ctx, timeout=200),
            "kill": kill_in_slice_two,
        }.items()
    }

    done = results["long"]()
    assert done["terminal_state"] == "COMPLETE"
    slices = done["slices"]
    assert len(slices) >= 2, slices
    assert [item["state"] for item in slices] == ["TIMEOUT"] * (len(slices) - 1) + ["COMPLETED"]
    assert done["totals"]["slices"] == len(slices)
    rows = sacct_rows(ssh_run, [item["job_id"] for item in slices])
    assert sorted(row[1] for row in rows) == sorted(item["slurm_job_id"] for item in slices), "one job per slice"
    epochs = re.findall(
        r"^Epoch (\d+)/12:",
        "".join(remote_text(ssh_run, f"{cluster.results_dir}/logs/{s['job_id']}-{s['slurm_job_id']}/main.out")
                for s in slices),
        re.M,
    )  # fmt: skip
    assert epochs == [str(n) for n in range(1, 13)], "every epoch ran exactly once, in order"

    with pytest.raises(JobFailedError, match=r"slice 1 ended TIMEOUT and wrote no checkpoint: lower the training"):
        results["none"]()
    assert [row[2] for row in sacct_rows(ssh_run, [no_checkpoint["job_id"]])] == ["TIMEOUT"]
    assert record_of(ssh_run, no_checkpoint["record_path"])["err_class"] == "ERR_PROGRAM"

    with pytest.raises(JobFailedError, match=r"wall-time limit reached \(TIMEOUT\)"):
        results["seed"]()
    assert record_of(ssh_run, seed["record_path"])["terminal_state"] == "ERROR"
    assert [row[2] for row in sacct_rows(ssh_run, [seed["job_id"]])] == ["TIMEOUT"]

    second = results["kill"]()
    assert record_of(ssh_run, second["record_path"])["terminal_state"] == "CANCELED"
    assert [row[2].split()[0] for row in sacct_rows(ssh_run, [second["job_id"]])] == ["CANCELLED"]


@pytest.mark.alone
def test_a_preempted_training_is_requeued_by_slurm_and_resumes(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, capfd: pytest.CaptureFixture[str]
) -> None:
    """A training on the default partition (requeue on, the seed's default) is preempted by another user's job
    on the higher-tier partition that needs every GPU of its node. Expected: SLURM requeues the same job id;
    the sensor says so and watches it to its real end; the rerun has its secret (the sidecar survived) and
    resumes from its checkpoints; the task succeeds with one submission."""
    ctx = context(dag_id, "train", "r1")
    handle = submit(
        training(image, cluster.gpu_partition, 6, epoch_seconds=5, time_hours=0.2, timeout_hours=0.15, secret_env={
            "RL_TOKEN": f"env:{SECRET_SOURCE}"}),
        ctx,
    )  # fmt: skip
    slurm_id = handle["slurm_job_id"]
    watching = in_thread(lambda: run_deferrable(sensor_for(handle), ctx, timeout=300))
    checkpoint = f"{handle['results_dir']}/checkpoints/epoch_1.ckpt"
    wait_until(lambda: ssh_run(join(["test", "-e", checkpoint]))[0] == 0, "the first checkpoint", timeout=120)
    node = squeue_field(ssh_run, slurm_id, "%N")
    rc, _, err = as_other(
        cluster,
        join([
            "sbatch", "--parsable", f"--partition={cluster.urgent_partition}", f"--nodelist={node}",
            f"--gres=gpu:{cluster.gpus_per_node}", "--time=5", f"--output={cluster.other_dir}/urgent-%j.out",
            "--wrap=sleep 10",
        ]),
    )  # fmt: skip
    assert rc == 0, err

    done = watching()

    assert done["terminal_state"] == "COMPLETE"
    runs = ssh_run(join(["sacct", "-D", "-X", "-n", "-P", "-j", slurm_id, "-o", "State"]))[1].split()
    assert runs[-1] == "COMPLETED", runs
    assert {"PREEMPTED", "REQUEUED"} & set(runs[:-1]), runs
    assert [row[1] for row in sacct_rows(ssh_run, [handle["job_id"]])] == [slurm_id], "one submission"
    assert "requeued by SLURM (restart 1)" in capfd.readouterr().out
    main_out = remote_text(ssh_run, f"{handle['log_dir']}/main.out")
    assert main_out.count("RL_TOKEN is set") == 2, "the rerun read the sidecar too"
    assert "resuming after epoch" in main_out


#: A continued training as a DAG (``airflow dags test`` runs it): a deferred sensor, then a task after it.
CHAIN_DAG = """from airflow.sdk import DAG, task

from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

with DAG(dag_id={dag_id!r}, schedule=None):
    submit = SbatchSubmitOperator(
        task_id="submit",
        image={image!r},
        command={command!r},
        spec={{"train": {{"epochs": {epochs}}}}},
        partition={partition!r},
        network_arch="classification_pyt",
        gpus_per_node=1,
        cpus_per_task=1,
        secret_env=None,
        time_hours=1 / 60,
        timeout_hours=None,
        max_continuations=1,
    )
    wait = SlurmJobSensor(task_id="wait", job=submit.output, poke_interval=1, deferrable=True)

    @task
    def evaluate(result):
        return [item["state"] for item in result["slices"]]

    evaluate(wait.output)
"""


@pytest.mark.slow
def test_a_continued_training_under_airflow_dags_test(
    image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """``airflow dags test`` (``dag.test()``) resumes a deferred task with the trigger's event alone, without the
    kwargs it deferred with (issue 41, item 6). A training of 8 epochs of 10 s on the one-minute partition with
    ``max_continuations=1``: slice 1 ends TIMEOUT, the sensor defers on slice 2, which completes; the sensor
    settles slice 2 (the job it last deferred on, from its task state store) and the task after it runs."""
    home = Path(tempfile.mkdtemp(prefix="tao-dags-test-"))
    try:
        dags = home / "dags"
        dags.mkdir()
        command = f"{PROGRAM} --spec {{config_path}} --results {{results_dir}} --epoch-seconds 10"
        (dags / "chain.py").write_text(
            CHAIN_DAG.format(dag_id=dag_id, image=image, command=command, epochs=8, partition=cluster.short_partition)
        )
        env = prepare_airflow(dataclasses.asdict(cluster), home, {"AIRFLOW__CORE__DAGS_FOLDER": str(dags)})
        rc, output = run_dag(env, dag_id=dag_id, echo=False)
        facts = airflow_facts(env, dag_id)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    assert "trigger event is for job" not in output
    assert (rc, facts["state"]) == (0, "success"), output[-6000:]
    assert facts["tasks"] == {"submit": "success", "wait": "success", "evaluate": "success"}, output[-6000:]
    done = facts["xcom"]["wait"]
    slices = done["slices"]
    assert [item["state"] for item in slices] == ["TIMEOUT", "COMPLETED"]
    assert facts["xcom"]["evaluate"] == ["TIMEOUT", "COMPLETED"]
    assert done["terminal_state"] == "COMPLETE"
    assert slices[0]["slurm_job_id"] == facts["xcom"]["submit"]["slurm_job_id"]
    assert "the job this sensor last deferred on (task state store)" in output
    rows = sacct_rows(ssh_run, [item["job_id"] for item in slices])
    assert sorted(row[1] for row in rows) == sorted(item["slurm_job_id"] for item in slices), "one job per slice"


def partition_state(name: str, state: str) -> None:
    """Set a partition's state as the site's admin would (the tests run as root on the head node)."""
    subprocess.run(["scontrol", "update", f"PartitionName={name}", f"State={state}"], check=True, timeout=30)


@pytest.mark.alone
def test_each_slice_starts_on_the_partition_that_takes_it(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """The earliest start: a training naming the one-minute partition and ``debug`` (30 min), slices of at most
    two minutes. Slice 1 starts on the one-minute partition (free, named first) and ends TIMEOUT after a minute;
    that partition is DOWN before slice 2, which starts on ``debug`` with the two minutes its batch shell lowered
    the partition's 30 to, and completes the training. The chain summary names each slice's partition and limit;
    each slice's warning fits the limit it got.
    """
    ctx = context(dag_id, "train", "r1")
    op = training(
        image, f"{cluster.short_partition},{cluster.debug_partition}", 10, max_continuations=2, time_hours=2 / 60
    )  # 100 s of epochs: more than the 90 s a one-minute job may run (slurmctld checks limits every 30 s)
    handle = submit(op, ctx)
    script = remote_text(ssh_run, handle["script_path"])
    assert "#SBATCH --time" not in script
    assert "TimeLimit=00:02:00" in script
    try:
        wait_until(
            lambda: squeue_field(ssh_run, handle["slurm_job_id"], "%T") == "RUNNING", "slice 1 running", timeout=60
        )
        partition_state(cluster.short_partition, "DOWN")  # a running job keeps running; slice 2 goes elsewhere
        done = run_deferrable(sensor_for(handle), ctx, timeout=200)
    finally:
        partition_state(cluster.short_partition, "UP")
    slices = done["slices"]
    assert [item["state"] for item in slices] == ["TIMEOUT", "COMPLETED"]
    assert [(item["partition"], item["time_limit_seconds"]) for item in slices] == [
        (cluster.short_partition, 60),
        (cluster.debug_partition, 120),
    ]
    logs = [
        remote_text(ssh_run, f"{cluster.results_dir}/logs/{item['job_id']}-{item['slurm_job_id']}/main.out")
        for item in slices
    ]
    assert f"slice partition and time limit: {cluster.debug_partition} 2:00" in logs[1]
    # which limit holds: the one-minute partition's (slurmctld refuses to raise it), then the one lowered to two
    kept = "TAO_SLURM: slice time limit kept: the partition's (60 s) is no longer than the slice; SLURM ends the slice"
    assert kept in logs[0].splitlines(), logs[0]
    assert "TAO_SLURM: slice time limit lowered to 00:02:00: SLURM ends the slice" in logs[1].splitlines(), logs[1]
    # each slice's warning fits the limit it got: a tenth of 1 min is below the 10 s floor, of 2 min 12 s
    assert "TAO_SLURM: slice 1 warned 10 s before its time limit" in logs[0], logs[0]
    assert "TAO_SLURM: slice 2 warned 12 s before its time limit" in logs[1], logs[1]


@pytest.mark.alone
def test_a_training_naming_a_busy_and_a_free_partition_starts_on_the_free_one(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, wide_partition: str
) -> None:
    """The earliest start on a busy site: another tenant's whole-node jobs hold every node of ``debug`` (the 4-GPU
    nodes, 30 min) for minutes; a continued training names ``debug`` first and the 16-GPU node's partition
    (4 h), slices of two minutes (both allow them: the script asks ``--time`` and a 12 s warning). Expected: its
    first slice starts at once on the free partition with its two minutes, and the training completes there
    while the other tenant's jobs still hold ``debug``."""
    theirs: list[str] = []
    try:
        for node in cluster.nodes:
            argv = [
                "sbatch", "--parsable", f"--partition={cluster.debug_partition}", f"--nodelist={node}", "--exclusive",
                "--time=5", f"--output={cluster.other_dir}/busy-%j.out", "--wrap=sleep 280",
            ]  # fmt: skip
            rc, out, err = as_other(cluster, join(argv))
            assert rc == 0, err
            theirs.append(out.strip().split(";")[0])
        wait_until(
            lambda: (
                ssh_run(join(["squeue", "-h", "-j", ",".join(theirs), "-o", "%T"]))[1].split()
                == ["RUNNING"] * len(theirs)
            ),
            "debug's nodes taken by the other tenant",
        )
        ctx = context(dag_id, "train", "r1")
        op = training(
            image, f"{cluster.debug_partition},{wide_partition}", 2, epoch_seconds=2, max_continuations=1,
            time_hours=2 / 60,
        )  # fmt: skip
        handle = submit(op, ctx)
        done = run_deferrable(sensor_for(handle), ctx, timeout=150)
        held = ssh_run(join(["squeue", "-h", "-j", ",".join(theirs), "-o", "%T"]))[1].split()
    finally:
        if theirs:
            as_other(cluster, join(["scancel", *theirs]))
    assert held == ["RUNNING"] * len(theirs), "the training ended while debug was still busy"
    (only,) = done["slices"]
    assert (only["state"], only["partition"], only["time_limit_seconds"]) == ("COMPLETED", wide_partition, 120)
    assert only["queue_seconds"] <= 30, only
    script = remote_text(ssh_run, handle["script_path"])  # both partitions allow two minutes: asked as such
    assert ("#SBATCH --time=00:02:00\n" in script, "#SBATCH --signal=B:USR1@12\n" in script) == (True, True)
