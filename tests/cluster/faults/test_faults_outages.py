"""Fault suite (issue 10): long outages of the head node's services while jobs end.

Jobs run through the provider as Airflow runs them (see ``tests/cluster/deferral.py``); the faults are
real: slurmdbd is stopped for longer than the trigger's accounting settle window (30 s) and for longer
than slurmctld's ``MinJobAge`` (after which squeue forgets a finished job): lowered to 30 s in the normal
suite, and for 6 minutes with SLURM's default 300 s in the ``long_outage`` case (deselected by default;
``make reliability`` runs it); and a login host loses slurmctld (and slurmdbd) while its sshd stays up
(the harness's "cut" login sshd, whose SLURM tools read a slurm.conf naming a port nothing listens on;
slurmd and slurmctld keep talking).

What the provider promises through such outages: a failed query is "unanswered", never "gone"; squeue's
terminal state decides the outcome, sacct only adds the exit code, so a task settles on squeue's state
once :data:`ACCOUNTING_SETTLE_S` has passed without accounting, with the exit code left unknown (never
invented); a job nobody can speak for is waited for; nothing is cancelled or submitted twice.
Every check of the cluster's side goes over real OpenSSH to the normal login sshd, which is not cut.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as url_quote

import pytest
from airflow.sdk.exceptions import TaskDeferred
from airflow_stack import Stack, standalone
from clusterkit import (
    SECRET_SOURCE,
    LogCapture,
    connection_json,
    final_state,
    harness,
    job_names,
    jobs_named,
    login_cut_held,
    record_of,
    remote_text,
    sensor_for,
    sidecar_mode,
    squeue_field,
    submit,
    submit_op,
)
from deferral import context, defer, first_event, full_event, resume, run_async, wait_until

from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import mint_job_id
from airflow_provider_tao_slurm.core.shell import join
from airflow_provider_tao_slurm.core.states import ACCOUNTING_SETTLE_S, NATIVE_TO_TAO
from airflow_provider_tao_slurm.exceptions import JobFailedError, RemoteCommandError
from airflow_provider_tao_slurm.lifecycle.events import JobHandle

if TYPE_CHECKING:
    from airflow.triggers.base import BaseTrigger, TriggerEvent

    from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

#: The poll warning of the trigger (the poller's own warning says "left N of M job(s) unanswered").
POLL_FAILED = "SLURM status poll failed, still waiting"
NO_CONTROLLER = "Unable to contact slurm controller"
#: squeue's states of a job that has ended (for waiting on the cluster's side).
ENDED = ("COMPLETED", "FAILED")
#: The two jobs of the slurmdbd cases: their program's exit code, and what SLURM says at the end.
EXPECTED = {"ok": (0, "COMPLETED"), "fails": (3, "FAILED")}
#: The late sensors poll this long with slurmdbd still down before it is started again.
LATE_POLLS_S = 6.0
#: slurmctld's MinJobAge in the fast case of the long outage (the harness's ``min-job-age``).
MIN_JOB_AGE_S = 30
#: SLURM's default MinJobAge (the harness's, unless a test lowers it): the real long outage's.
DEFAULT_MIN_JOB_AGE_S = 300
#: slurmctld purges jobs older than MinJobAge once a minute: the MinJobAge cases wait at most MinJobAge and
#: this long after the jobs ended for squeue to forget them.
PURGE_SLACK_S = 120
#: squeue shows a job ended at most this long after its end time (the ``ended`` wait's polls over SSH).
ENDED_SEEN_SLACK_S = 10
#: The real long outage: slurmdbd down at least this long (6 minutes), and the test's own time limit.
LONG_OUTAGE_S = 360.0
LONG_OUTAGE_TIMEOUT_S = 900
#: How long the cut login host stays cut after the job ended (several failed polls of the trigger).
CUT_AFTER_END_S = 20.0


@dataclass
class Watched:
    """One submitted job and its sensor (deferred once ``deferred`` is set)."""

    ctx: dict[str, Any]
    handle: dict[str, Any]
    sensor: SlurmJobSensor
    deferred: TaskDeferred | None = None

    @property
    def slurm_id(self) -> str:
        return str(self.handle["slurm_job_id"])

    @property
    def trigger(self) -> BaseTrigger:
        assert self.deferred is not None, "the sensor has not deferred yet"
        return self.deferred.trigger


def submit_pair(image: str, dag_id: str, seconds: int) -> dict[str, Watched]:
    """Submit a job that succeeds and one that exits 3, each after ``seconds``; sensors made, not started."""
    jobs = {}
    for name, (code, _) in EXPECTED.items():
        ending = "echo finished" if code == 0 else f"echo failing on purpose >&2; exit {code}"
        ctx = context(dag_id, name, "r1")
        handle = submit(submit_op(image, f"sleep {seconds}; {ending}", task_id=name), ctx)
        jobs[name] = Watched(ctx, handle, sensor_for(handle))
    return jobs


async def all_events(trigger: BaseTrigger, timeout: float) -> list[tuple[float, TriggerEvent]]:
    """Every event ``trigger`` yields until it returns by itself (``time.monotonic()`` of each)."""
    seen: list[tuple[float, TriggerEvent]] = []
    async with asyncio.timeout(timeout):
        async for event in trigger.run():
            seen.append((time.monotonic(), event))
    return seen


def running(ssh_run: SshRun, jobs: dict[str, Watched]) -> bool:
    """Whether every job is RUNNING (squeue)."""
    return all(squeue_field(ssh_run, job.slurm_id, "%T") == "RUNNING" for job in jobs.values())


def sacct_row(ssh_run: SshRun, slurm_id: str) -> tuple[str, str, float | None]:
    """sacct's State (first word), ExitCode and End (epoch) of a job; ``("", "", None)`` when it has none."""
    command = join(["sacct", "-X", "-n", "-P", "-j", slurm_id, "-o", "State,ExitCode,End", "--starttime=now-1days"])
    rc, out, _ = ssh_run(command)
    fields = out.strip().split("|")
    if rc != 0 or len(fields) != 3:
        return "", "", None
    try:
        end = time.mktime(time.strptime(fields[2], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        end = None
    return fields[0].split()[0] if fields[0] else "", fields[1], end


def accounting_answers(ssh_run: SshRun) -> bool:
    """Whether sacct answers on the login host (slurmdbd is up and reachable)."""
    rc, _, _ = ssh_run(join(["sacct", "-X", "-n", "-j", "1"]), timeout=90)
    return rc == 0


def settled_in_accounting(ssh_run: SshRun, jobs: dict[str, Watched]) -> bool:
    """Whether sacct has every job's final state and end time (slurmctld may send the end record a moment
    after the state, once slurmdbd is back)."""
    rows = {name: sacct_row(ssh_run, job.slurm_id) for name, job in jobs.items()}
    return all(row[0] == EXPECTED[name][1] and row[2] is not None for name, row in rows.items())


def check_agreement(ssh_run: SshRun, dag_id: str, jobs: dict[str, Watched], stopped_at: float) -> list[str]:
    """Compare each record with sacct (slurmdbd back); return one figure per job.

    The record's terminal state must be sacct's state mapped to TAO, any exit code it holds must be
    sacct's, nothing UNKNOWN or CANCELED on the way; one SLURM job per submission (none resubmitted),
    the job ended after slurmdbd was stopped, the secret sidecar is gone.
    """
    figures = []
    for name, job in jobs.items():
        native, exit_code, ended = sacct_row(ssh_run, job.slurm_id)
        record = record_of(ssh_run, job.handle["record_path"])
        states = [row["state"] for row in record["transitions"]]
        assert native == EXPECTED[name][1], f"{name}: sacct says {native}"
        assert exit_code == f"{EXPECTED[name][0]}:0", f"{name}: sacct exit code {exit_code}"
        assert record["terminal_state"] == str(NATIVE_TO_TAO[native]), (name, record["terminal_state"], native)
        assert record["exit_codes"].get("job", EXPECTED[name][0]) == EXPECTED[name][0], (name, record["exit_codes"])
        assert not {"UNKNOWN", "CANCELED"} & set(states), (name, states)
        assert ended is not None, f"{name}: sacct has no end time"
        assert ended >= stopped_at - 1, f"{name} ended before slurmdbd was stopped"
        assert jobs_named(ssh_run, job.handle["job_id"]) == [job.slurm_id]
        assert sidecar_mode(ssh_run, job.handle["sidecar_path"]) == "gone"
        figures.append(
            f"{name}: record {record['terminal_state']} exit_codes={record['exit_codes']}, sacct {native} {exit_code}"
        )
    assert job_names(ssh_run, f"tao-{dag_id}") == {job.slurm_id: job.handle["job_id"] for job in jobs.values()}
    return figures


def settle(jobs: dict[str, Watched], events: dict[str, TriggerEvent]) -> tuple[dict[str, Any], JobFailedError]:
    """``execute_complete`` of both sensors: the successful job's result, the failing job's error."""
    ok = jobs["ok"]
    fails = jobs["fails"]
    assert ok.deferred is not None
    assert fails.deferred is not None
    result = resume(ok.sensor, ok.ctx, ok.deferred, events["ok"])
    with pytest.raises(JobFailedError) as failed:
        resume(fails.sensor, fails.ctx, fails.deferred, events["fails"])
    return result, failed.value


def only_event(name: str, seen: list[tuple[float, TriggerEvent]]) -> tuple[float, TriggerEvent]:
    """The one event a trigger sent (it must be one, and terminal: never "vanished" or "unrecognised")."""
    assert len(seen) == 1, f"{name}: {len(seen)} events: {[e.payload for _, e in seen]}"
    at, event = seen[0]
    assert event.payload["status"] == "terminal", f"{name}: {event.payload}"
    return at, event


@pytest.mark.alone
def test_slurmdbd_down_past_the_settle_window(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, record_property: Any
) -> None:
    """Two jobs (one succeeds, one exits 3) ran with their sensors deferred on one triggerer loop; slurmdbd
    was stopped while both ran, they ended with accounting down, and slurmdbd was started again only after
    both triggers had fired and both sensors had settled (an outage longer than the 30 s settle window).
    Expected (the provider's contract): squeue's terminal state decides, sacct only adds the exit code, so
    each trigger waits the settle window for sacct, then sends one event with squeue's state and no exit
    code (none is invented); the tasks end COMPLETE and ERROR/ERR_PROGRAM; nothing is reported gone or
    UNKNOWN, cancelled or resubmitted. Once slurmdbd is back, sacct (COMPLETED 0:0, FAILED 3:0) agrees with
    both records."""
    jobs = submit_pair(image, dag_id, seconds=6)
    for job in jobs.values():
        job.deferred = defer(job.sensor, job.ctx)
    marks: dict[str, float] = {}

    async def scenario() -> dict[str, list[tuple[float, TriggerEvent]]]:
        watches = {name: asyncio.ensure_future(all_events(job.trigger, 180)) for name, job in jobs.items()}
        await asyncio.to_thread(wait_until, lambda: running(ssh_run, jobs), "both jobs RUNNING", 120)
        await asyncio.to_thread(harness, "stop-slurmdbd")
        marks["stopped"], marks["stopped_epoch"] = time.monotonic(), time.time()
        return {name: await watch for name, watch in watches.items()}

    try:
        seen = run_async(scenario())
        events = {name: only_event(name, seen[name]) for name in jobs}
        result, failed = settle(jobs, {name: event for name, (_, event) in events.items()})
        still_down = not accounting_answers(ssh_run)  # the sensors settled while accounting was still down
    finally:
        harness("start-slurmdbd")
    outage = time.monotonic() - marks["stopped"]
    started = time.monotonic()
    wait_until(lambda: settled_in_accounting(ssh_run, jobs), "both jobs final in sacct", 120, every=1)
    catch_up = time.monotonic() - started

    figures = check_agreement(ssh_run, dag_id, jobs, marks["stopped_epoch"])
    waited = {name: at - marks["stopped"] for name, (at, _) in events.items()}
    record_property(
        "detail",
        f"slurmdbd down {outage:.0f} s; events {', '.join(f'{n} {w:.0f} s' for n, w in waited.items())} after the "
        f"stop, from squeue; sacct had both {catch_up:.0f} s after the restart; " + "; ".join(figures),
    )
    assert still_down, "slurmdbd came back before the sensors settled: the outage was not what this case needs"
    for name, (_, event) in events.items():
        state = full_event(jobs[name].trigger, event)["state"]
        assert (state["native"], state["source"], state["exit_code"]) == (EXPECTED[name][1], "squeue", None), name
        assert waited[name] >= ACCOUNTING_SETTLE_S, f"{name} settled {waited[name]:.0f} s after the stop"
    assert result["terminal_state"] == "COMPLETE"
    assert result["exit_codes"] == {"job": 0}  # COMPLETED means every exit code was 0
    assert failed.err_class == "ERR_PROGRAM"
    record = record_of(ssh_run, jobs["fails"].handle["record_path"])
    assert (record["terminal_state"], record["err_class"], record["exit_codes"]) == ("ERROR", "ERR_PROGRAM", {})
    assert "finished" in remote_text(ssh_run, f"{jobs['ok'].handle['log_dir']}/main.out")


def min_job_age(ssh_run: SshRun) -> int | None:
    """slurmctld's ``MinJobAge`` in seconds, as ``scontrol show config`` reports it (None when it does not)."""
    _, out, _ = ssh_run(join(["scontrol", "show", "config"]))
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MinJobAge" and value.split()[:1] and value.split()[0].isdigit():
            return int(value.split()[0])
    return None


@pytest.fixture
def short_min_job_age() -> Iterator[int]:
    """slurmctld's MinJobAge set to :data:`MIN_JOB_AGE_S` for one test, SLURM's default again afterwards."""
    harness("min-job-age", str(MIN_JOB_AGE_S))
    try:
        yield MIN_JOB_AGE_S
    finally:
        harness("min-job-age", "default")


@pytest.fixture
def default_min_job_age(ssh_run: SshRun) -> int:
    """SLURM's default MinJobAge, checked on slurmctld (changing it would disturb the tests beside this one)."""
    shown = min_job_age(ssh_run)
    if shown != DEFAULT_MIN_JOB_AGE_S:
        pytest.fail(
            f"slurmctld's MinJobAge is {shown} s, not SLURM's default {DEFAULT_MIN_JOB_AGE_S} s: run "
            "`python3 tests/cluster/harness.py min-job-age default` once no test lowers it",
            pytrace=False,
        )
    return DEFAULT_MIN_JOB_AGE_S


def accounting_down_past_min_job_age(
    image: str, dag_id: str, ssh_run: SshRun, record_property: Any, age: int, down_at_least: float
) -> None:
    """The story of both MinJobAge cases (their docstrings tell it), with slurmctld's MinJobAge ``age``.

    Two jobs (one succeeds, one exits 3) end with slurmdbd stopped; it stays down until squeue has forgotten
    them (it keeps a finished job ``age`` s, then purges it at its next once-a-minute pass) and at least
    ``down_at_least`` s in all. Checks what the jobs' files show, that late triggers wait through the outage
    and settle on sacct once it is back, and that the records agree with sacct.
    """
    jobs = submit_pair(image, dag_id, seconds=6)
    wait_until(lambda: running(ssh_run, jobs), "both jobs RUNNING", 120)
    marks: dict[str, float] = {}

    def forgotten() -> bool:
        return all(squeue_field(ssh_run, job.slurm_id, "%T") == "" for job in jobs.values())

    def named_once() -> bool:
        return all(jobs_named(ssh_run, job.handle["job_id"]) == [job.slurm_id] for job in jobs.values())

    async def late_watch() -> dict[str, list[tuple[float, TriggerEvent]]]:
        watches = {name: asyncio.ensure_future(all_events(job.trigger, 180)) for name, job in jobs.items()}
        await asyncio.sleep(LATE_POLLS_S)
        marks["fired_while_down"] = float(sum(watch.done() for watch in watches.values()))
        marks["still_down"] = float(not await asyncio.to_thread(accounting_answers, ssh_run))
        await asyncio.to_thread(harness, "start-slurmdbd")
        marks["restarted"] = time.monotonic()
        return {name: await watch for name, watch in watches.items()}

    try:
        harness("stop-slurmdbd")
        stopped, stopped_epoch = time.monotonic(), time.time()
        wait_until(lambda: all(squeue_field(ssh_run, j.slurm_id, "%T") in ENDED for j in jobs.values()), "ended", 60)
        ended = time.monotonic()
        while not forgotten() and time.monotonic() - ended < age + PURGE_SLACK_S:
            time.sleep(2)
        purged = forgotten()
        kept = time.monotonic() - ended
        # What settles a job both squeue and sacct do not know (slurmdbd lagging past the grace): its own files.
        evidence = {
            name: job.sensor.lifecycle.end_evidence(JobHandle.from_dict(job.handle)) for name, job in jobs.items()
        }
        time.sleep(max(0.0, stopped + down_at_least - LATE_POLLS_S - time.monotonic()))
        for job in jobs.values():
            job.deferred = defer(job.sensor, job.ctx)
        with LogCapture() as logs:
            seen = run_async(late_watch())
    finally:
        harness("start-slurmdbd")
    outage = marks["restarted"] - stopped
    events = {name: only_event(name, seen[name]) for name in jobs}
    result, failed = settle(jobs, {name: event for name, (_, event) in events.items()})
    warnings = [line for line in logs.lines if POLL_FAILED in line]
    # After minutes of queued accounting, sacct finds a job by id before it finds it by name.
    wait_until(named_once, "each job found once by name in sacct", 120)
    named = time.monotonic() - marks["restarted"]

    figures = check_agreement(ssh_run, dag_id, jobs, stopped_epoch)
    after = {name: at - marks["restarted"] for name, (at, _) in events.items()}
    record_property(
        "detail",
        f"MinJobAge {age} s; slurmdbd down {outage:.0f} s; squeue "
        f"{'forgot the jobs' if purged else 'still knew the jobs'} {kept:.0f} s after they ended; late triggers: "
        f"{len(warnings)} poll warnings, events {', '.join(f'{n} {a:.1f} s' for n, a in after.items())} after the "
        f"restart, from sacct; sacct found both by name {named:.0f} s after the restart; " + "; ".join(figures),
    )
    record_property("purged", purged)
    assert marks["still_down"], "sacct answered before slurmdbd was started again: the outage was cut short"
    assert purged, f"squeue still knew the jobs {kept:.0f} s after they ended (MinJobAge {age} s)"
    assert kept >= age - ENDED_SEEN_SLACK_S, f"squeue forgot the jobs {kept:.0f} s after they ended (MinJobAge {age} s)"
    assert outage > age, f"the outage lasted only {outage:.0f} s"
    assert outage >= down_at_least, f"the outage lasted only {outage:.0f} s, not {down_at_least:.0f} s"
    assert marks["fired_while_down"] == 0, "a trigger fired while neither squeue nor sacct could answer"
    for name, state in evidence.items():
        assert state is not None, f"{name}: its end marker and exit-code file were not evidence of its end"
        assert (state.native, state.exit_code, state.source) == (EXPECTED[name][1], EXPECTED[name][0], "end marker")
    assert warnings, "no poll warning while squeue had forgotten the jobs and sacct could not answer"
    assert all("sacct exited" in line for line in warnings), warnings[:3]
    for name, (_, event) in events.items():
        state = full_event(jobs[name].trigger, event)["state"]
        expected = (EXPECTED[name][1], "sacct", EXPECTED[name][0])
        assert (state["native"], state["source"], state["exit_code"]) == expected, (name, state)
    assert result["terminal_state"] == "COMPLETE"
    assert result["exit_codes"] == {"job": 0}
    assert failed.err_class == "ERR_PROGRAM"
    record = record_of(ssh_run, jobs["fails"].handle["record_path"])
    assert (record["terminal_state"], record["err_class"], record["exit_codes"]) == ("ERROR", "ERR_PROGRAM", {"job": 3})


@pytest.mark.alone
def test_slurmdbd_down_past_a_lowered_min_job_age(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, record_property: Any, short_min_job_age: int
) -> None:
    """The long accounting outage made short: MinJobAge lowered to 30 s, so slurmctld forgets a finished job
    within 30-90 s instead of SLURM's default 5-6 minutes. Two jobs (one succeeds, one exits 3) ran; slurmdbd
    was stopped while both ran and stayed down past MinJobAge: both ended with accounting down, and
    slurmctld forgot them (it purges once a minute), so squeue no longer knew them and sacct could not
    answer. Then what each job's own end marker and exit-code file show was read (what the sensor settles a
    job on that neither knows any more, as when slurmdbd lags past the vanished-job grace). Only then did
    their sensors start and defer (a busy scheduler, or a triggerer restarted during the outage); their
    triggers polled for 6 s with slurmdbd still down, then it was started again. Expected: squeue kept the
    ended jobs at least MinJobAge, then forgot them; the jobs' files show COMPLETED 0 and FAILED 3; while
    nobody can speak for the jobs the triggers warn and wait (never "gone", never UNKNOWN); once accounting
    is back each sends one event with sacct's state and exit code (COMPLETED 0, FAILED 3); the tasks end
    COMPLETE and ERROR/ERR_PROGRAM with exit code 3; the records agree with sacct; one SLURM job each,
    nothing cancelled or resubmitted. MinJobAge is SLURM's default again afterwards."""
    accounting_down_past_min_job_age(image, dag_id, ssh_run, record_property, short_min_job_age, down_at_least=0)


@pytest.mark.long_outage
@pytest.mark.timeout(LONG_OUTAGE_TIMEOUT_S)
@pytest.mark.alone
def test_slurmdbd_down_six_minutes_past_the_default_min_job_age(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, record_property: Any, default_min_job_age: int
) -> None:
    """The long accounting outage as it happens (about 7 minutes, so only ``make reliability`` runs it):
    slurmdbd down 6 minutes with SLURM's default MinJobAge (300 s, checked on slurmctld, left as found).
    Two jobs (one succeeds, one exits 3) ran; slurmdbd was stopped while both ran; both ended with
    accounting down, squeue kept their terminal states for the 5 minutes of MinJobAge, then slurmctld forgot
    them (at its next once-a-minute purge), so squeue no longer knew them and sacct could not answer. Then
    what each job's own end marker and exit-code file show was read. Only then, 6 minutes into the outage,
    did their sensors start and defer (a triggerer restarted during a long accounting outage); their
    triggers polled for 6 s with slurmdbd still down, then it was started again. Expected: squeue kept the
    ended jobs at least 300 s, then forgot them; the outage lasted at least 6 minutes; the jobs' files show
    COMPLETED 0 and FAILED 3; while nobody can speak for the jobs the triggers warn and wait (never "gone",
    never UNKNOWN); once accounting is back, with 6 minutes of slurmctld's queued accounting messages to
    take in, each sends one event with sacct's state and exit code (COMPLETED 0, FAILED 3); the tasks end
    COMPLETE and ERROR/ERR_PROGRAM with exit code 3; the records agree with sacct; one SLURM job each,
    nothing cancelled or resubmitted."""
    accounting_down_past_min_job_age(
        image, dag_id, ssh_run, record_property, default_min_job_age, down_at_least=LONG_OUTAGE_S
    )


@pytest.fixture
def login_cut() -> Iterator[None]:
    """The harness's cut login sshd, held for this test (:func:`clusterkit.login_cut_held`)."""
    with login_cut_held():
        yield


def cut_port(cluster: ClusterEnv) -> int:
    """The port of the harness's cut login sshd (``cut_port`` in cluster.json)."""
    data = json.loads((Path(cluster.state_dir) / "cluster.json").read_text())
    if "cut_port" not in data:
        pytest.fail("cluster.json has no cut_port: run `python3 tests/cluster/harness.py up`", pytrace=False)
    return int(data["cut_port"])


#: Seconds the login host stays cut off from slurmctld after the user kill: longer than the triggerer's on_kill
#: budget (``[triggerer] on_kill_timeout``, 30 s by default).
KILL_CUT_S = 40.0


@pytest.mark.usefixtures("login_cut")
def test_a_user_kill_while_the_login_host_cannot_reach_slurmctld_goes_through_once_it_can(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's case (issue 41): everything went through the harness's cut login sshd; a job ran while its sensor
    was deferred; the login host lost slurmctld (its scancel fails at once), the user marked the task failed (run()
    cancelled, then on_kill), and the login host reached slurmctld again 40 s later, after Airflow's on_kill budget.
    Expected: on_kill hands the cancel to the login host and ends within the budget; the record says CANCELED
    (trigger on_kill) and where the login host's log is, the sidecar is gone; once the cut ends the login host's
    scancel goes through (its log says so) and sacct says CANCELLED; one SLURM job. Before, on_kill tried scancel
    for 20 s and gave up: the job ran on to COMPLETED and its record stayed open."""
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, port=cut_port(cluster)))
    ctx = context(dag_id, "train", "r1")
    handle = submit(submit_op(image, "sleep 300", task_id="train"), ctx)
    slurm_id = handle["slurm_job_id"]
    trigger = defer(sensor_for(handle), ctx).trigger

    async def mark_failed_during_the_cut() -> float:
        watch = asyncio.ensure_future(first_event(trigger))
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "RUNNING", 120)
        await asyncio.to_thread(harness, "cut-login-ctld")
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        started = time.monotonic()
        await asyncio.wait_for(trigger.on_kill(), 30)  # Airflow's default [triggerer] on_kill_timeout
        took = time.monotonic() - started
        await trigger.cleanup()
        return took

    cut_at = time.monotonic()
    try:
        took = run_async(mark_failed_during_the_cut())
        record = record_of(ssh_run, handle["record_path"])
        sidecar = sidecar_mode(ssh_run, handle["sidecar_path"])
        during = squeue_field(ssh_run, slurm_id, "%T")
        time.sleep(max(0.0, KILL_CUT_S - (time.monotonic() - cut_at)))
    finally:
        harness("restore-login")
    assert took < 30, f"on_kill took {took:.1f} s: past Airflow's budget"
    assert during == "RUNNING", f"the job was {during!r} during the cut: the cut did not hold"
    assert (record["terminal_state"], record["transitions"][-1]["source"]) == ("CANCELED", "trigger on_kill")
    log = handle["record_path"].removesuffix(".json") + ".cancel.log"
    assert (
        f"the login host tries again every 5 s for up to 60 min; its log: {log}" in record["transitions"][-1]["message"]
    )
    assert sidecar == "gone"
    assert wait_until(lambda: final_state(ssh_run, slurm_id) == "CANCELLED", "job cancelled in sacct", timeout=60)
    assert wait_until(lambda: "scancel went through" in remote_text(ssh_run, log), "the login host's log", timeout=10)
    assert "scancel failed" in remote_text(ssh_run, log)
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]


#: A deferred sensor's DAG for the real triggerer (submit, then watch), in the test's own DAGs folder.
KILL_DAG = """from __future__ import annotations

from airflow.sdk import DAG

from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

with DAG(dag_id={dag_id!r}, schedule=None):
    submit = SbatchSubmitOperator(task_id="submit", image={image!r}, command="sleep 300", gpus_per_node=1,
                                  cpus_per_task=1, time_hours=0.1, secret_env={{"RL_TOKEN": "env:{source}"}})
    SlurmJobSensor(task_id="wait", job=submit.output, poke_interval=2, deferrable=True)
"""
#: Seconds for the run to submit its job and defer its sensor, and for its task log to show a line.
KILL_RUN_S = 180.0


def _handle_and_deferred(stack: Stack, path: str, ssh_run: SshRun) -> dict[str, Any]:
    """The submit task's job handle, once its job runs and the sensor is deferred (in the real triggerer)."""
    deadline = time.monotonic() + KILL_RUN_S
    while time.monotonic() < deadline:
        answer = stack.client.get(f"{path}/taskInstances/submit/xcomEntries/return_value", params={"deserialize": True})
        wait = stack.get(f"{path}/taskInstances/wait")
        if answer.status_code == 200 and wait["state"] == "deferred":
            value = answer.json()["value"]
            handle = dict(json.loads(value) if isinstance(value, str) else value)
            if squeue_field(ssh_run, handle["slurm_job_id"], "%T") == "RUNNING":
                return handle
        time.sleep(1)
    pytest.fail(f"no running job with a deferred sensor within {KILL_RUN_S:.0f} s: {stack.get(path)}")


@pytest.mark.usefixtures("login_cut")
def test_a_sensor_marked_failed_in_airflow_during_a_login_head_cut_cancels_its_job_once_the_cut_lifts(
    image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, tmp_path: Path, record_property: Any
) -> None:
    """The soak's case, through the real Airflow services (``airflow standalone``: its triggerer runs the trigger and
    its on_kill): a DAG submitted a job through the cut login sshd and its sensor deferred; while the job ran, the
    login host lost slurmctld and slurmdbd (``cut-login-head``), and 3 s later the user marked the sensor failed
    (REST API, as the UI does); 40 s later the cut lifted. Airflow 3.3's triggerer cancels a trigger that is running
    on_kill again at its next sync (about a second later: the trigger stays among the ones to cancel until it ends).
    Expected: the cancel is handed to the login host in spite of that, a log says so (the task's, or the triggerer's
    where Python 3.11's ``wait_for`` stopped waiting for on_kill at the second cancel), and once the cut lifts
    the job ends CANCELLED in sacct; the record says CANCELED (trigger on_kill), the sidecar is gone; one SLURM job.
    Before, on_kill was cancelled a second into its scancel: nothing was handed over and the job ran to its end."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "kill_dag.py").write_text(KILL_DAG.format(dag_id=dag_id, image=image, source=SECRET_SOURCE))
    settings = {
        "AIRFLOW_CONN_SLURM_DEFAULT": connection_json(cluster, port=cut_port(cluster)),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        SECRET_SOURCE: f"kill-{dag_id}",
    }
    slurm_id = ""
    with standalone(cluster, env=settings, prefix="tao-kill-in-cut-") as stack:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{url_quote(stack.trigger(dag_id, {}), safe='')}"
        try:
            handle = _handle_and_deferred(stack, path, ssh_run)
            slurm_id = handle["slurm_job_id"]
            harness("cut-login-head")
            cut_at = time.monotonic()
            try:
                time.sleep(3)
                answer = stack.client.patch(f"{path}/taskInstances/wait", json={"new_state": "failed"})
                assert answer.status_code == 200, answer.text
                time.sleep(max(0.0, KILL_CUT_S - (time.monotonic() - cut_at)))
                during = squeue_field(ssh_run, slurm_id, "%T")
            finally:
                harness("restore-login")
            lifted = time.monotonic()
            while (ended := final_state(ssh_run, slurm_id)) != "CANCELLED" and time.monotonic() - lifted < 60:
                time.sleep(1)
            events = stack.get(f"{path}/taskInstances/wait/logs/1")["content"]
            log = "\n".join(str(item.get("event", "")) for item in events)
            triggerer_log = stack.log.read_text(errors="replace")
        finally:
            if slurm_id:
                ssh_run(join(["scancel", slurm_id]))
    record = record_of(ssh_run, handle["record_path"])
    handed = "the login host tries again every 5 s"
    where = "the task log" if handed in log else "the triggerer's log" if handed in triggerer_log else "no log"
    record_property("detail", f"job {slurm_id}: {ended} after the cut; the hand-off said in {where}")
    assert during == "RUNNING", f"the job was {during!r} during the cut: the cut did not hold"
    assert ended == "CANCELLED", f"job {slurm_id} {ended or 'RUNNING'} after the cut; the trigger's log:\n{log[-3000:]}"
    assert where != "no log", f"no hand-off said; the trigger's log:\n{log[-3000:]}"
    assert (record["terminal_state"], record["transitions"][-1]["source"]) == ("CANCELED", "trigger on_kill")
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]


@pytest.mark.usefixtures("login_cut")
def test_slurmctld_unreachable_from_the_login_host(
    conn: str,
    image: str,
    dag_id: str,
    ssh_run: SshRun,
    cluster: ClusterEnv,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    """Everything went through the harness's cut login sshd (its SSH stays up). A 30 s job was submitted and
    its sensor deferred; while it ran, that login host lost slurmctld (its SLURM tools read a slurm.conf
    naming a dead port; slurmd and slurmctld kept talking), and a second submit was tried there; then it
    lost slurmdbd too, the job ended, and 20 s later both were reachable again; the second submit's next try
    ran then. Expected: the submit fails at once with a typed error naming the controller, leaving no SLURM
    job (not even a held one) and its record unbound, so the next try submits it exactly once under the same
    name; the deferred trigger keeps waiting through both cuts (warnings naming the failure once sacct fails
    too; no "gone", no UNKNOWN, no cancel) and reports the job's real end (COMPLETED, exit 0 from sacct)
    exactly once, after the login host can reach the scheduler again."""
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, port=cut_port(cluster)))
    ctx = context(dag_id, "train", "r1")
    handle = submit(submit_op(image, "sleep 30; echo finished", task_id="train"), ctx)
    slurm_id = handle["slurm_job_id"]
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    blocked = mint_job_id(dag_id, "blocked", "r1", -1)
    blocked_record = JobLayout(cluster.results_dir, blocked).record_path
    marks: dict[str, float] = {}
    errors: list[Exception] = []

    def failed_submit() -> None:
        started = time.monotonic()
        with pytest.raises(RemoteCommandError) as refused:
            submit(submit_op(image, "echo first try", task_id="blocked"), context(dag_id, "blocked", "r1"))
        marks["submit_s"] = time.monotonic() - started
        errors.append(refused.value)

    async def scenario(logs: LogCapture) -> list[tuple[float, TriggerEvent]]:
        watch = asyncio.ensure_future(all_events(deferred.trigger, 240))
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "RUNNING", 120)
        await asyncio.to_thread(harness, "cut-login-ctld")
        marks["cut"] = time.monotonic()
        await asyncio.to_thread(failed_submit)
        marks["ctld_lines"] = len(logs.lines)
        await asyncio.to_thread(harness, "cut-login-head")
        await asyncio.to_thread(wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") in ENDED, "ended", 120)
        marks["ended"] = time.monotonic()
        await asyncio.sleep(CUT_AFTER_END_S)
        marks["fired_while_cut"] = float(watch.done())
        marks["head_lines"] = len(logs.lines)
        await asyncio.to_thread(harness, "restore-login")
        marks["restored"] = time.monotonic()
        return await watch

    try:
        with LogCapture() as logs:
            seen = run_async(scenario(logs))
    finally:
        harness("restore-login")
    at, event = only_event("train", seen)
    result = resume(sensor, ctx, deferred, event)
    state = full_event(deferred.trigger, event)["state"]
    warned = [line for line in logs.lines[: int(marks["head_lines"])] if POLL_FAILED in line]
    ctld_only = [line for line in logs.lines[: int(marks["ctld_lines"])] if POLL_FAILED in line]
    left_jobs = jobs_named(ssh_run, blocked)
    left_record = remote_text(ssh_run, blocked_record)  # staged before sbatch (none when sinfo failed first)
    left_sidecar = sidecar_mode(ssh_run, JobLayout(cluster.results_dir, blocked).sidecar_path)
    retry = submit(submit_op(image, "echo second try", task_id="blocked"), context(dag_id, "blocked", "r1", 2))
    wait_until(lambda: squeue_field(ssh_run, retry["slurm_job_id"], "%T") in ("COMPLETED", ""), "retry done", 120)

    error = errors[0]
    record_property(
        "detail",
        f"submit failed in {marks['submit_s']:.0f} s with {type(error).__name__}; "
        f"cut {marks['restored'] - marks['cut']:.0f} s "
        f"({len(ctld_only)} poll warnings with slurmctld only cut, sacct answering; {len(warned) - len(ctld_only)} "
        f"with both cut); event {at - marks['restored']:.1f} s after the restore, "
        f"{event.payload['native']} exit {state['exit_code']} "
        f"from {state['source']}; the failed try left its record "
        f"({'opened' if left_record else 'none'}) "
        f"and secret sidecar ({left_sidecar}) for the next try, which submitted {retry['slurm_job_id']} once",
    )
    assert NO_CONTROLLER in str(error), str(error)
    assert left_jobs == [], f"the failed submit left SLURM job(s) {left_jobs}"
    if left_record:
        opened = json.loads(left_record)
        assert (opened["backend_ref"], opened["terminal_state"]) == (None, None), opened
        assert [row["state"] for row in opened["transitions"]] == ["PENDING"], opened["transitions"]
    assert retry["job_id"] == blocked
    assert jobs_named(ssh_run, blocked) == [retry["slurm_job_id"]]
    assert job_names(ssh_run, f"tao-{dag_id}") == {slurm_id: handle["job_id"], retry["slurm_job_id"]: blocked}

    assert marks["fired_while_cut"] == 0, "the trigger fired while the login host could not reach the scheduler"
    assert warned, "no poll warning while neither squeue nor sacct could answer"
    assert any(NO_CONTROLLER in line for line in warned), warned[:3]
    assert (state["native"], state["source"], state["exit_code"]) == ("COMPLETED", "sacct", 0)
    assert at > marks["restored"]
    assert result["terminal_state"] == "COMPLETE"
    assert result["exit_codes"] == {"job": 0}
    record = record_of(ssh_run, handle["record_path"])
    assert not {"UNKNOWN", "CANCELED"} & {row["state"] for row in record["transitions"]}
    assert "finished" in remote_text(ssh_run, f"{handle['log_dir']}/main.out")
    assert sacct_row(ssh_run, slurm_id)[:2] == ("COMPLETED", "0:0")
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]


#: The training stand-in (``dags/programs/tao_like_train.py``): an epoch of 10 s, a checkpoint after each.
TRAIN = "python3 /srv/lustre/demo/tao_like_train.py --spec {config_path} --results {results_dir} --epoch-seconds 10"


@pytest.mark.usefixtures("login_cut", "demo_program")
def test_a_slice_whose_limit_slurmctld_did_not_lower_still_ends_at_its_length(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 51 item 3. A continued training names ``debug`` (30 min) first and the one-minute partition, slices
    of two minutes: its script asks no ``--time`` and its batch shell lowers the limit it gets. It went through
    the harness's cut login sshd, whose SLURM tools its batch shell inherits (``--export=ALL``), and it started
    (``begin`` 15 s after the submit) while that login host was cut off from slurmctld: its ``scontrol update``
    failed. The cut lifted once the job log said so. Expected: slice 1 ends at its two minutes all the same,
    FAILED with exit 124 (this shell's own warning, then the program's timeout), not at debug's 30 minutes; the
    job log says which limit held; the sensor goes on as after a TIMEOUT and submits slice 2 (cancelled here:
    the rest of a chain is the long-training tests'). Before, the update's failure was ignored: slice 1 ran on
    to 30 minutes."""
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, port=cut_port(cluster)))
    ctx = context(dag_id, "train", "r1")
    op = submit_op(
        image, TRAIN, task_id="train", spec={"train": {"epochs": 30}}, network_arch="classification_pyt",
        partition=f"{cluster.debug_partition},{cluster.short_partition}", time_hours=2 / 60, timeout_hours=None,
        max_continuations=1, secret_env=None, sbatch_options={"begin": "now+15"},
    )  # fmt: skip
    try:
        handle = submit(op, ctx)
        harness("cut-login-ctld")
        log = f"{handle['log_dir']}/main.out"
        wait_until(lambda: "slice partition and time limit" in remote_text(ssh_run, log), "slice 1's cap", 90)
    finally:
        harness("restore-login")
    assert "#SBATCH --time" not in remote_text(ssh_run, handle["script_path"])
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    event = run_async(first_event(deferred.trigger, 240))
    try:
        with pytest.raises(TaskDeferred):  # the next slice, watched
            resume(sensor, ctx, deferred, event)
        following = jobs_named(ssh_run, f"{handle['job_id']}-s2")
    finally:
        ssh_run(join(["scancel", f"--name={handle['job_id']}-s2"]))
    out = remote_text(ssh_run, log)
    state, exit_code, end = sacct_row(ssh_run, handle["slurm_job_id"])
    rc, started, _ = ssh_run(join(["sacct", "-X", "-n", "-j", handle["slurm_job_id"], "-o", "Start", "-P"]))
    assert rc == 0
    assert (state, exit_code) == ("FAILED", "124:0")
    ran = (end or 0.0) - time.mktime(time.strptime(started.strip(), "%Y-%m-%dT%H:%M:%S"))
    assert ran <= 125, f"slice 1 ran {ran:.0f} s, past its two minutes"
    assert "TAO_SLURM: slice time limit not lowered to 00:02:00 (scontrol: " in out, out[-3000:]
    assert "this shell ends the slice after 120 s" in out
    assert "TAO_SLURM: slice 1 ends in about 12 s (time limit)" in out, out[-3000:]
    assert "TAO_SLURM: program stopped by timeout after " in out
    assert len(following) == 1, "the chain went on with slice 2"
