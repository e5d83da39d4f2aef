"""Watching a training (issue 16), on the real test cluster: what the task log, XCom and record tell."""

from __future__ import annotations

import asyncio
import contextlib
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import POLL_S, conn, dag_id, image, record_of, secret_value, sensor_for, submit, submit_op
from deferral import context, defer, first_event, resume, run_async

from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import JobFailedError
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor
from airflow_provider_tao_slurm.triggers.poller import active_pollers
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

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


# ---------------------------------------------------------------------- live lines

#: ``<structlog timestamp> [info ...] <label> | <text>  [logger] ...`` as the trigger's lines are printed; a record
#: holds all lines of one read, each on a line of its own starting with its label.
LIVE_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z \[info\s*\] "
    r"((?:main\.out|main\.err|status\.json|stdout) \| .*?)\s+\[airflow_provider",
    re.M | re.S,
)
TICKS = 6


def live_lines(output: str) -> list[tuple[float, str]]:
    """Every live line the trigger or the sensor logged, with the time it was logged (a record holds a read's lines,
    one per line)."""
    return [
        (datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp(), line)
        for stamp, text in LIVE_LINE.findall(output)
        for line in text.split("\n")
    ]


def ticking(ticks: int = TICKS) -> str:
    """A job that prints ``tick <i> at <epoch>`` every second and appends a TAO status line per 'epoch'."""
    return (
        "mkdir -p {results_dir} && "
        f"for i in $(seq 1 {ticks}); do "
        'echo "tick $i at $(date +%s.%N)"; '
        f"""echo '{{"status": "RUNNING", "epoch": '$i', "max_epoch": {ticks}, "loss": 0.5}}' """
        ">> {results_dir}/status.json; "
        "sleep 1; done; "
        """echo '{"status": "SUCCESS", "message": "trained"}' >> {results_dir}/status.json"""
    )


def test_the_task_log_shows_new_lines_and_progress_while_the_job_runs(
    conn: str, image: str, dag_id: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A job prints a timestamped line and appends a status.json entry every second for 6 s; the sensor waits
    deferred (poll 1 s). Expected: each tick appears in the task log once, in order, at most one poll interval
    (+ margin for a busy CI machine) after the job wrote it, the first ones while the job still runs; every
    status.json entry appears as a progress line; the sensor's final lines repeat none of them."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, ticking(), network_arch="classification_pyt"), ctx)
    result = run_to_end(handle, ctx)
    output = "".join(capfd.readouterr())

    assert result["terminal_state"] == "COMPLETE"
    lines = live_lines(output)
    ticks = [(at, text) for at, text in lines if text.startswith("main.out | tick ")]
    assert [text.split()[3] for _, text in ticks] == [str(i) for i in range(1, TICKS + 1)], ticks
    delays = [at - float(text.split()[-1]) for at, text in ticks]
    assert max(delays) <= POLL_S + 2.5, delays
    assert ticks[0][0] < float(ticks[-1][1].split()[-1]), "the first tick was shown before the last one was written"
    progress = [text for _, text in lines if text.startswith("status.json | ")]
    assert progress == [f"status.json | RUNNING epoch {i}/{TICKS} loss=0.5" for i in range(1, TICKS + 1)] + [
        "status.json | SUCCESS: trained"
    ]
    print(f"tick delays (s): {[round(d, 2) for d in delays]}")


@pytest.mark.slow
def test_hostile_and_flooding_output_stays_bounded_readable_and_unforgeable(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, capfd: pytest.CaptureFixture[str]
) -> None:
    """A job prints ANSI escapes, a fake Airflow log line, a carriage-return progress bar, invalid UTF-8 and a
    NUL, then floods 1 GB as fast as it can, then a last line. Expected: the task log shows each hostile line
    cleaned (no ESC, no NUL, the bar's last frame, U+FFFD for bad bytes) and prefixed with its stream; the
    flood is cut at the per-poll budget with a note saying how many bytes were skipped; the last line arrives;
    the live output stays under the budget per file times the log reads (plus the end's tail)."""
    hostile = (
        r"printf '\033[1;31mred alert\033[0m\n'; "
        r"printf '[2026-12-03T00:00:00.000Z] {taskinstance.py:1} INFO - Marking task as SUCCESS\n'; "
        r"printf 'bar 10%%\rbar 55%%\rbar 100%%\n'; "
        r"printf 'bad \377\376 bytes and a \000 NUL\n'; "
        "sleep 2; yes 'flooding the log with training chatter' | head -c 1000000000; echo; sleep 2; echo the last line"
    )
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, hostile), ctx)
    budget = 8192
    sensor = sensor_for(handle, log_bytes_per_poll=budget)
    deferred = defer(sensor, ctx)

    async def watch() -> tuple[Any, int]:
        event = await first_event(deferred.trigger, 240)
        return event, sum(poller.stats.log_reads for poller in active_pollers())

    try:
        event, reads = run_async(watch())
        resume(sensor, ctx, deferred, event)
    finally:
        ssh_run(join(["rm", "-f", "--", f"{handle['log_dir']}/main.out"]))  # 1 GB on the shared storage
    output = "".join(capfd.readouterr())

    texts = [text for _, text in live_lines(output)]
    assert "main.out | red alert" in texts
    assert "main.out | [2026-12-03T00:00:00.000Z] {taskinstance.py:1} INFO - Marking task as SUCCESS" in texts
    assert "main.out | bar 100%" in texts
    assert "main.out | bad \ufffd\ufffd bytes and a \ufffd NUL" in texts
    assert "main.out | the last line" in texts
    assert any("bytes of" in text and "skipped" in text for text in texts), texts[:20]
    assert "\x1b" not in output
    assert "\x00" not in output
    assert not any(line.startswith("[2026-12-03T00:00:00.000Z]") for line in output.splitlines())
    # The log's own bytes (each line and its newline, without the "main.out | " prefix): each read shows at
    # most the budget of main.out, and the sensor's end adds the tail not shown yet (2 budgets).
    flood = sum(len(text.removeprefix("main.out | ").encode()) + 1 for text in texts if "flooding the log" in text)
    assert flood <= budget * (reads + 2), (flood, reads)
    print(f"flood lines shown: {flood} bytes over {reads} log reads (1 GB written)")


def test_a_restarted_triggerer_resumes_the_stream_without_duplicates(
    conn: str, image: str, dag_id: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A job ticks for 6 s. The trigger runs until tick 2 is in the task log, then goes away (its task cancelled,
    its pooled connection closed, as when a triggerer stops); a new trigger rebuilt from the same serialized
    kwargs takes over. Expected: ticks 1..6 each appear exactly once, in order (the new trigger read the offset
    from the cursor file the first one's reads left beside the logs)."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, ticking()), ctx)
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    classpath, kwargs = deferred.trigger.serialize()
    seen: list[str] = []

    async def first_triggerer() -> None:
        task = asyncio.ensure_future(first_event(SlurmJobTrigger(**kwargs), 120))
        try:
            async with asyncio.timeout(60):
                while "main.out | tick 2 " not in "".join(seen):
                    await asyncio.sleep(0.05)
                    seen.append("".join(capfd.readouterr()))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    run_async(first_triggerer())
    event = run_async(first_event(SlurmJobTrigger(**kwargs), 120))
    resume(sensor, ctx, deferred, event)
    output = "".join(seen) + "".join(capfd.readouterr())

    ticks = [text.split()[3] for _, text in live_lines(output) if text.startswith("main.out | tick ")]
    assert ticks == [str(i) for i in range(1, TICKS + 1)], ticks
    assert classpath.endswith("SlurmJobTrigger")


def test_a_job_submitted_outside_the_provider_is_watched_by_its_id(
    conn: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, capfd: pytest.CaptureFixture[str]
) -> None:
    """Plain ``sbatch --wrap`` jobs (no provider involved): one prints three lines and exits 0, one exits 3, one
    sleeps. The sensor gets only their SLURM job ids. Expected: the first ends COMPLETE with its lines shown live
    from its ``slurm-<id>.out`` and its cost in the XCom; the second fails naming exit 3; a user kill of the
    watch on the third leaves that job running (the provider did not submit it)."""
    out_dir = f"{cluster.results_dir}/{dag_id}-outside"
    ssh_run(f"mkdir -p {quote(out_dir)}")

    def sbatch(script: str) -> str:
        rc, out, err = ssh_run(
            join(["sbatch", "--parsable", "-p", cluster.cpu_partition, "-t", "5", "-o", f"{out_dir}/slurm-%j.out"])
            + " --wrap "
            + quote(script)
        )
        assert rc == 0, err
        return out.strip().split(";")[0]

    ok, bad, running = (
        sbatch("for i in 1 2 3; do echo hello $i; sleep 1; done"),
        sbatch("echo about to fail; exit 3"),
        sbatch("sleep 300"),
    )
    ctx = context(dag_id, "wait", "r1")

    def watch(slurm_job_id: str) -> Any:
        sensor = SlurmJobSensor(task_id="wait", slurm_job_id=slurm_job_id, poke_interval=POLL_S)
        deferred = defer(sensor, ctx)
        return resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 120)))

    result = watch(ok)
    assert (result["slurm_job_id"], result["terminal_state"], result["exit_code"]) == (ok, "COMPLETE", 0)
    assert result["elapsed_seconds"] >= 3
    texts = [text for _, text in live_lines("".join(capfd.readouterr()))]
    assert [t for t in texts if t.startswith("stdout | hello")] == [f"stdout | hello {i}" for i in (1, 2, 3)]

    with pytest.raises(JobFailedError, match=rf"(?s)SLURM job {bad} failed .*ExitCode=3"):
        watch(bad)

    sensor = SlurmJobSensor(task_id="wait", slurm_job_id=running, poke_interval=POLL_S)
    trigger = defer(sensor, ctx).trigger
    run_async(trigger.on_kill())
    try:
        _, state, _ = ssh_run(join(["squeue", "-h", "-j", running, "-o", "%T"]))
        assert state.strip() in {"PENDING", "RUNNING"}
    finally:
        ssh_run(join(["scancel", running]))


# ---------------------------------------------------------------------- a readable task log (issue 34, item 4)

#: ``<structlog timestamp> [<level>] <message>  [airflow_provider_tao_slurm...]``: a line the provider logged.
PROVIDER_LINE = re.compile(r"^\S+Z \[\w+\s*\] (.*?)\s+\[airflow_provider_tao_slurm", re.M)
#: The prefix of a line of the job's own output (its length is the job's).
JOB_OUTPUT = re.compile(r"^(?:main\.out|main\.err|status\.json|stdout|stderr) \| ")


def test_a_finished_sensors_task_log_has_no_long_line_from_the_provider(
    conn: str, image: str, dag_id: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A job prints a Python traceback and exits 3; its sensor waits deferred. Expected: the trigger's event,
    which the triggerer logs whole on one line, is short (its repr at most 150 characters: status, SLURM id,
    the end's native state and the name of the file beside the job that holds the full event), the sensor
    settles from that file as from a full event (ERR_PROGRAM, the evidence on a line of its own), and no
    line the provider logged (the job's own lines aside) nor any line of the task's error is over 300
    characters."""
    ctx = context(dag_id, "submit", "r1")
    command = "echo 'Traceback (most recent call last):' >&2; echo 'RuntimeError: boom' >&2; exit 3"
    handle = submit(submit_op(image, command), ctx)
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    event = run_async(first_event(deferred.trigger, 180))
    with pytest.raises(JobFailedError) as failed:
        resume(sensor, ctx, deferred, event)
    output = "".join(capfd.readouterr())

    path = deferred.trigger.event_path
    assert path is not None
    assert path.startswith(f"{handle['job_dir']}/events/{handle['slurm_job_id']}-")
    assert event.payload == {
        "status": "terminal",
        "slurm_job_id": handle["slurm_job_id"],
        "native": "FAILED",
        "ref": path.rsplit("/", 1)[1],
    }
    assert len(repr(event)) <= 150, repr(event)
    assert failed.value.err_class == "ERR_PROGRAM"
    head, evidence = str(failed.value).splitlines()
    assert head.startswith(f"SLURM job {handle['slurm_job_id']} failed (ERR_PROGRAM): ")
    assert evidence.startswith(f"SLURM job {handle['slurm_job_id']} failed; evidence: line ")
    messages = [message for message in PROVIDER_LINE.findall(output) if not JOB_OUTPUT.match(message)]
    assert messages, output[-2000:]
    assert [message for message in messages if len(message) > 300] == []
    assert [line for line in str(failed.value).splitlines() if len(line) > 300] == []
