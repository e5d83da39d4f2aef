"""``SlurmJobTrigger`` against the shared fake hook: serialisation, one event, grace windows, on_kill vs cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import subprocess
import time
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from airflow.sdk.module_loading import import_string
from fakes import FakeSlurmHook

from airflow_provider_tao_slurm.core.commands import EndMarker, end_markers, parse_end_markers
from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.logstream import TailChunk, TailRequest, parse_tail_output, tail_script
from airflow_provider_tao_slurm.core.records import from_json, mark, open_record, to_json
from airflow_provider_tao_slurm.core.states import JobState, TaoState, state_from_native
from airflow_provider_tao_slurm.exceptions import StatusQueryError
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW
from airflow_provider_tao_slurm.lifecycle import watch as watch_module
from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

T = TypeVar("T")
JOB = "4242"
NAME = "tao-dag.submit-0123456789abcdef"
SIDECAR = f"/lustre/u/jobs/{NAME}/.secrets.env"
RECORD = f"/lustre/u/records/{NAME}.json"
POLL = 0.02

Script = list["dict[str, JobState] | Exception"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))


def squeue(native: str, reason: str | None = None) -> dict[str, JobState]:
    return {JOB: state_from_native(JOB, native, source="squeue", reason=reason, node_list="n1")}


def sacct(
    native: str, exit_code: int = 0, signal: int = 0, end: str | None = "2026-12-04T05:08:30", run: int = 0
) -> dict[str, JobState]:
    """Accounting's newest row of the job, as ``sacct -D`` gives it (``run``: which run it is)."""
    state = state_from_native(JOB, native, source="sacct", exit_code=exit_code, signal=signal, node_list="n1", end=end)
    return {JOB: dataclasses.replace(state, run=run)}


class TriggerHook(FakeSlurmHook):
    """Answers each poll with the next scripted result (the last one repeats), accounting likewise; logs and end
    markers are files on this machine, read by the hook's own scripts. ``seen_at``: when a poll last found the job.
    """

    def __init__(self, script: Script) -> None:
        super().__init__(
            settings=ClusterSettings(hosts=("login",), user="u", cluster_name=f"unit-{uuid.uuid4().hex[:8]}")
        )
        self.script = list(script)
        self.seen_at: float | None = None
        self.tail_calls = 0
        self.marker_reads = 0
        self.accounting: Script = [{}]
        self.accounting_asked: list[list[str]] = []

    async def a_get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        ids = list(job_ids)
        self.polls.append(ids)
        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(answer, Exception):
            raise answer
        if answer:
            self.seen_at = time.time()
        return answer

    async def a_tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk[bytes]]:
        """The real batched log read, run by this machine's ``sh`` on local files."""
        self.tail_calls += 1
        script, nonce = tail_script(requests)
        done = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True, check=True)
        return parse_tail_output(done.stdout, len(requests), nonce)

    async def a_end_markers(self, since: Mapping[str, float]) -> list[EndMarker]:
        """The real end-marker listing, run by this machine's ``sh`` on local directories."""
        self.marker_reads += 1
        done = subprocess.run(["sh", "-c", end_markers(since)], capture_output=True, text=True, check=True)
        return parse_end_markers(done.stdout, list(since))

    async def a_accounting_states(
        self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW
    ) -> dict[str, JobState]:
        """Accounting's scripted answers (the last one repeats; an exception is raised)."""
        ids = list(job_ids)
        self.accounting_asked.append(ids)
        answer = self.accounting.pop(0) if len(self.accounting) > 1 else self.accounting[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> TriggerHook:
    fake = TriggerHook([{}])
    monkeypatch.setattr(SlurmJobTrigger, "_hook", lambda self: fake)
    return fake


def make(**kwargs: Any) -> SlurmJobTrigger:
    kwargs.setdefault("poll_interval", POLL)
    return SlurmJobTrigger(slurm_conn_id="slurm_default", slurm_job_id=JOB, job_name=NAME, **kwargs)


async def all_events(trigger: SlurmJobTrigger) -> list[dict[str, Any]]:
    return [event.payload async for event in trigger.run()]


def test_serialize_round_trip() -> None:
    trigger = make(
        submitted_at=1700000000.5, not_found_grace=60, last_state="RUNNING", last_reason="None", sidecar_path=SIDECAR
    )
    classpath, kwargs = trigger.serialize()

    assert classpath == "airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger"
    assert kwargs == {
        "slurm_conn_id": "slurm_default",
        "slurm_job_id": JOB,
        "job_name": NAME,
        "poll_interval": POLL,
        "submitted_at": 1700000000.5,
        "not_found_grace": 60.0,
        "last_state": "RUNNING",
        "last_reason": "None",
        "sidecar_path": SIDECAR,
        "record_path": None,
        "unrecognised_grace": 600.0,
        "log_streams": [],
        "log_bytes_per_poll": 16384,
        "secret_refs": {},
        "cancel_on_kill": True,
        "end_marker_dir": None,
        "event_path": None,
    }
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


def test_submitted_at_is_fixed_at_construction_and_survives_serialization() -> None:
    before = time.time()
    _, kwargs = make().serialize()
    assert before <= kwargs["submitted_at"] <= time.time()
    assert SlurmJobTrigger(**kwargs).submitted_at == kwargs["submitted_at"]


def test_exactly_one_terminal_event_then_return(hook: TriggerHook) -> None:
    hook.script = [squeue("PENDING", "Priority"), squeue("RUNNING"), squeue("RUNNING"), sacct("COMPLETED")]

    events = run(all_events(make()))

    assert len(events) == 1
    (event,) = events
    assert event["status"] == "terminal"
    assert (event["slurm_job_id"], event["job_name"]) == (JOB, NAME)
    assert event["state"]["native"] == "COMPLETED"
    assert event["state"]["tao_state"] == "COMPLETE"
    assert [(t["state"], t["reason"]) for t in event["transitions"]] == [
        ("PENDING", "Priority"),
        ("RUNNING", None),
        ("COMPLETE", None),
    ]
    assert json.loads(json.dumps(event)) == event
    assert hook.polls == [[JOB]] * 4


def test_last_state_from_kwargs_is_not_reported_again(hook: TriggerHook) -> None:
    hook.script = [squeue("RUNNING"), sacct("FAILED", exit_code=3)]

    (event,) = run(all_events(make(last_state="RUNNING", last_reason=None)))

    assert [t["state"] for t in event["transitions"]] == ["ERROR"]


def test_a_requeue_is_watched_to_the_real_end_and_said_once_per_restart(
    hook: TriggerHook, capsys: pytest.CaptureFixture[str]
) -> None:
    """Preempted (or its node failed) and requeued by SLURM twice: the job goes back to PENDING after RUNNING;
    the trigger says so with the restart count and keeps watching the same job id to COMPLETED."""
    hook.script = [
        squeue("RUNNING"),
        squeue("PENDING", "BeginTime"),
        squeue("RUNNING"),
        squeue("PENDING", "BeginTime"),
        squeue("PENDING", "Priority"),
        squeue("RUNNING"),
        sacct("COMPLETED"),
    ]

    (event,) = run(all_events(make()))

    assert event["state"]["native"] == "COMPLETED"
    output = capsys.readouterr().out
    said = re.findall(
        r"went back to the queue: preempted \(or a node failed\); requeued by SLURM \(restart (\d)\)", output
    )
    assert said == ["1", "2"]


def test_terminal_state_from_squeue_waits_for_sacct_exit_code(hook: TriggerHook) -> None:
    hook.script = [squeue("RUNNING"), squeue("FAILED", "NonZeroExitCode"), squeue("FAILED"), sacct("FAILED", 3)]

    (event,) = run(all_events(make()))

    assert event["state"]["source"] == "sacct"
    assert (event["state"]["exit_code"], event["state"]["signal"]) == (3, 0)
    assert [t["state"] for t in event["transitions"]] == ["RUNNING", "ERROR"]


def test_a_final_state_without_its_end_record_waits_for_the_full_row(hook: TriggerHook) -> None:
    """slurmdbd back after an outage: the row shows FAILED before slurmctld's end record (exit 0:0, no End)."""
    hook.script = [squeue("RUNNING"), sacct("FAILED", 0, end=None), sacct("FAILED", 0, end=None), sacct("FAILED", 3)]

    (event,) = run(all_events(make()))

    assert (event["state"]["native"], event["state"]["exit_code"], event["state"]["end"]) == (
        "FAILED",
        3,
        "2026-12-04T05:08:30",
    )


def test_terminal_state_from_squeue_is_used_when_accounting_never_answers(
    hook: TriggerHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_module, "ACCOUNTING_SETTLE_S", 0.2)
    hook.script = [squeue("RUNNING"), squeue("CANCELLED")]
    started = time.monotonic()

    (event,) = run(all_events(make()))

    assert time.monotonic() - started >= 0.2
    assert event["state"]["source"] == "squeue"
    assert event["state"]["tao_state"] == "CANCELED"


def test_not_found_is_tolerated_then_reported_as_vanished(hook: TriggerHook) -> None:
    hook.script = [{}]
    started = time.time()

    events = run(all_events(make(submitted_at=started, not_found_grace=0.3)))

    assert time.time() - started >= 0.3
    assert len(events) == 1
    (event,) = events
    assert event["status"] == "vanished"
    assert event["state"] is None
    assert JOB in event["message"]
    assert NAME in event["message"]
    assert f"sacct -j {JOB}" in event["message"]
    assert len(hook.polls) >= 3


def test_not_found_right_after_submit_is_not_an_error(hook: TriggerHook) -> None:
    hook.script = [{}, {}, {}, squeue("RUNNING"), {}, sacct("COMPLETED")]

    (event,) = run(all_events(make(not_found_grace=5)))

    assert event["status"] == "terminal"
    assert event["state"]["native"] == "COMPLETED"


def test_grace_counts_from_when_the_job_was_last_seen(hook: TriggerHook) -> None:
    """Ten polls see the job running (only the first is sent to the trigger: nothing new after it), then it
    is missing: the grace runs from the tenth poll, not from the one the trigger last heard."""
    hook.script = [squeue("RUNNING")] * 10 + [{}]
    started = time.time()

    (event,) = run(all_events(make(submitted_at=started - 3600, not_found_grace=0.3)))

    assert event["status"] == "vanished"
    assert len(hook.polls) > 11
    assert hook.seen_at is not None
    assert time.time() - hook.seen_at >= 0.3


def test_failed_polls_keep_the_trigger_waiting(hook: TriggerHook) -> None:
    hook.script = [OSError("connection reset"), squeue("RUNNING"), sacct("COMPLETED")]

    events = run(all_events(make()))

    assert [e["status"] for e in events] == ["terminal"]
    assert len(hook.polls) == 3


def test_on_kill_cancels_the_job_by_id_and_exact_name(hook: TriggerHook) -> None:
    run(make().on_kill())

    assert hook.cancels == [([JOB], NAME)]
    assert hook.commands == []


def test_on_kill_removes_the_secret_sidecar_after_cancelling(hook: TriggerHook) -> None:
    run(make(sidecar_path=SIDECAR).on_kill())

    assert hook.cancels == [([JOB], NAME)]
    assert hook.commands == [f"rm -f -- {SIDECAR}"]


async def cancel_after_two_polls(trigger: SlurmJobTrigger, hook: TriggerHook) -> None:
    """Run ``trigger`` until it polled twice, then cancel its run as a triggerer (or Ctrl-C) does."""
    task = asyncio.ensure_future(all_events(trigger))
    while len(hook.polls) < 2:
        await asyncio.sleep(POLL / 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_triggerer_restart_cancels_run_and_cleanup_does_not_cancel_the_job(hook: TriggerHook) -> None:
    hook.script = [squeue("RUNNING")]
    trigger = make()

    async def restart() -> int:
        await cancel_after_two_polls(trigger, hook)
        await trigger.cleanup()
        polls = len(hook.polls)
        await asyncio.sleep(POLL * 5)
        return len(hook.polls) - polls

    assert run(restart()) == 0
    assert hook.cancels == []


def test_a_trigger_run_inline_by_dags_test_and_stopped_cancels_its_job(
    hook: TriggerHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dag.test()`` runs the trigger in its own process; Ctrl-C cancels the run: nobody else will watch the job."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object.__new__(InProcessSupervisorComms), raising=False)
    hook.script = [squeue("PENDING")]

    run(cancel_after_two_polls(make(sidecar_path=SIDECAR), hook))

    assert hook.cancels == [([JOB], NAME)]
    assert hook.commands == [f"rm -f -- {SIDECAR}"]


def test_an_unrecognised_state_ends_the_wait_after_its_grace(hook: TriggerHook) -> None:
    hook.script = [squeue("RUNNING"), squeue("WEIRD_STATE")]
    started = time.time()

    (event,) = run(all_events(make(unrecognised_grace=0.2)))

    assert time.time() - started >= 0.2
    assert event["status"] == "unrecognised"
    assert "'WEIRD_STATE'" in event["message"]
    assert event["state"]["raw_state"] == "WEIRD_STATE"


def test_an_unrecognised_state_that_goes_away_resets_its_clock(hook: TriggerHook) -> None:
    hook.script = [squeue("WEIRD_STATE"), squeue("RUNNING")] * 10 + [sacct("COMPLETED")]

    (event,) = run(all_events(make(unrecognised_grace=POLL * 1.5)))

    assert event["status"] == "terminal"


def test_a_failed_poll_restarts_the_not_found_clock(hook: TriggerHook) -> None:
    hook.script = [OSError("controller down")] * 2 + [{}] + [sacct("COMPLETED")]
    started = time.time()

    (event,) = run(all_events(make(submitted_at=started - 3600, not_found_grace=0.5)))

    assert event["status"] == "terminal"  # the first "not found" after the failures did not vanish the job


def test_on_kill_records_canceled_with_its_source(hook: TriggerHook) -> None:
    hook.files["/lustre/u/records/r.json"] = running_record()

    run(make(sidecar_path=SIDECAR, record_path="/lustre/u/records/r.json").on_kill())

    stored = from_json(hook.files["/lustre/u/records/r.json"])
    assert stored.terminal_state is TaoState.CANCELED
    assert stored.transitions[-1].source == "trigger on_kill"
    assert hook.cancels == [([JOB], NAME)]
    assert hook.commands == [f"rm -f -- {SIDECAR}"]


# ---------------------------------------------------------------------- typed events, unknown states, failed polls


def running_record() -> str:
    """The JSON of a job record that is RUNNING as SLURM job ``JOB``."""
    record = open_record(
        job_id=NAME,
        cluster="c",
        image="/x.sqsh",
        network_arch="custom",
        action="train",
        results_dir="/lustre/u/results/x",
        job_dir="/lustre/u/jobs/x",
        log_dir="/lustre/u/logs",
        job_name=NAME,
        now="2026-01-01T00:00:00Z",
    )
    return to_json(
        mark(
            record, TaoState.RUNNING, now="2026-01-01T00:00:01Z", message="submitted", source="submit", backend_ref=JOB
        )
    )


@pytest.mark.parametrize(
    ("script", "status", "tao_state"),
    [
        pytest.param([squeue("RUNNING"), sacct("COMPLETED")], EventStatus.TERMINAL, TaoState.COMPLETE, id="terminal"),
        pytest.param([sacct("FAILED", 2)], EventStatus.TERMINAL, TaoState.ERROR, id="terminal-error"),
        pytest.param([squeue("WEIRD_STATE")], EventStatus.UNRECOGNISED, TaoState.UNKNOWN, id="unrecognised"),
        pytest.param([{}], EventStatus.VANISHED, None, id="vanished"),
    ],
)
def test_every_event_reads_back_as_a_job_event(
    hook: TriggerHook, script: Script, status: EventStatus, tao_state: TaoState | None
) -> None:
    hook.script = script

    (payload,) = run(all_events(make(submitted_at=time.time(), not_found_grace=0.1, unrecognised_grace=0.1)))

    event = JobEvent.from_dict(json.loads(json.dumps(payload)))
    assert (event.status, event.slurm_job_id, event.job_name) == (status, JOB, NAME)
    assert (event.state.tao_state if event.state is not None else None) == tao_state
    assert bool(event.message) == (status is not EventStatus.TERMINAL)


@pytest.mark.parametrize("native", ["WEIRD_STATE", "SOMETHING_NEW", "RESV_DEL_HOLD_X"])
def test_an_unknown_native_state_lasting_its_grace_is_unrecognised(hook: TriggerHook, native: str) -> None:
    hook.script = [squeue("PENDING"), squeue(native)]
    started = time.time()

    (event,) = run(all_events(make(unrecognised_grace=0.15)))

    assert time.time() - started >= 0.15
    assert event["status"] == "unrecognised"
    assert f"{native!r}" in event["message"]
    assert f"scontrol show job {JOB}" in event["message"]
    assert event["state"]["tao_state"] == "UNKNOWN"


@pytest.mark.parametrize(
    "script",
    [
        pytest.param([squeue("WEIRD_STATE")] * 3 + [squeue("RUNNING")] + [squeue("WEIRD_STATE")] * 3, id="short-runs"),
        pytest.param([squeue("WEIRD_STATE")] * 3 + [sacct("COMPLETED")], id="ends-before-grace"),
    ],
)
def test_an_unknown_state_that_goes_away_resets(hook: TriggerHook, script: Script) -> None:
    hook.script = [*script, sacct("COMPLETED")]

    (event,) = run(all_events(make(unrecognised_grace=POLL * 20)))

    assert event["status"] == "terminal"
    assert event["state"]["native"] == "COMPLETED"


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(OSError("controller down"), id="failed-poll"),
        pytest.param(StatusQueryError("1 of 1 job(s) unanswered", {}, [JOB], "squeue exited 1"), id="unanswered"),
    ],
)
@pytest.mark.parametrize("failures", [1, 3])
def test_an_error_update_restarts_the_not_found_clock(hook: TriggerHook, failure: Exception, failures: int) -> None:
    # Last seen an hour ago, grace 0.5 s: without the restart the first "not found" would vanish the job.
    hook.script = [failure] * failures + [{}] + [sacct("COMPLETED")]
    started = time.time()

    (event,) = run(all_events(make(submitted_at=started - 3600, not_found_grace=0.5)))

    assert event["status"] == "terminal"
    assert len(hook.polls) == failures + 2


def test_not_found_after_errors_still_vanishes_once_the_grace_has_passed(hook: TriggerHook) -> None:
    hook.script = [OSError("controller down"), {}]
    started = time.time()

    (event,) = run(all_events(make(submitted_at=started - 3600, not_found_grace=0.2)))

    assert event["status"] == "vanished"
    assert time.time() - started >= 0.2


@pytest.mark.parametrize(
    ("record_path", "stored", "sidecar", "canceled", "commands"),
    [
        pytest.param(RECORD, "running", SIDECAR, True, [f"rm -f -- {SIDECAR}"], id="record-and-sidecar"),
        pytest.param(RECORD, "running", None, True, [], id="record-no-sidecar"),
        pytest.param(RECORD, None, SIDECAR, False, [f"rm -f -- {SIDECAR}"], id="record-missing"),
        pytest.param(None, "running", SIDECAR, False, [f"rm -f -- {SIDECAR}"], id="no-record-path-older-trigger"),
        pytest.param(RECORD, "complete", None, False, [], id="terminal-record-keeps-its-verdict"),
    ],
)
def test_on_kill_records_canceled_via_the_async_file_api(
    hook: TriggerHook,
    record_path: str | None,
    stored: str | None,
    sidecar: str | None,
    canceled: bool,
    commands: list[str],
) -> None:
    if stored == "running":
        hook.files[RECORD] = running_record()
    elif stored == "complete":
        done = mark(
            from_json(running_record()), TaoState.COMPLETE, now="2026-01-01T00:00:02Z", message="ok", source="s"
        )
        hook.files[RECORD] = to_json(done)
    before = hook.files.get(RECORD)

    run(make(sidecar_path=sidecar, record_path=record_path).on_kill())

    assert hook.cancels == [([JOB], NAME)]
    assert hook.commands == commands
    if canceled:
        record = from_json(hook.files[RECORD])
        assert record.terminal_state is TaoState.CANCELED
        assert record.transitions[-1].source == "trigger on_kill"
        assert JOB in record.transitions[-1].message
    else:
        assert hook.files.get(RECORD) == before


# ---------------------------------------------------------------------- live logs


class WritingHook(TriggerHook):
    """Each poll, the 'job' appends the next scripted bytes to its log before the state is answered."""

    def __init__(self, script: Script, log: Any, writes: list[bytes]) -> None:
        super().__init__(script)
        self.log_path = log
        self.writes = list(writes)

    async def a_get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        if self.writes:
            with self.log_path.open("ab") as out:
                out.write(self.writes.pop(0))
        return await super().a_get_states(job_ids, since=since)


def live_lines(output: str) -> list[str]:
    """The live lines in the trigger's log output (structlog's console rendering; a record holds a poll's lines)."""
    records = re.finditer(r"\] (main\.out \| .*?)\s+\[airflow_provider", output, re.DOTALL)
    return [line.rstrip() for match in records for line in match.group(1).split("\n")]


def test_live_lines_reach_the_task_log_in_order_once_redacted(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job writes between polls (a secret, ANSI, a fake Airflow line among them): every line is logged once,
    in order, cleaned; nothing is read while it is pending; the event says how far the log was shown."""
    secret = "s3cr3t-value-0123456789"
    monkeypatch.setenv("TRAIN_TOKEN", secret)
    log = tmp_path / "main.out"
    writes = [
        b"",
        b"epoch 1\n",
        b"\x1b[31mepoch 2\x1b[0m token " + secret.encode() + b"\n",
        b"[2026] INFO - Task exited",
        b"\n",
    ]
    fake = WritingHook(
        [squeue("PENDING", "Priority"), squeue("RUNNING"), squeue("RUNNING"), squeue("RUNNING"), sacct("COMPLETED")],
        log,
        writes,
    )
    monkeypatch.setattr(SlurmJobTrigger, "_hook", lambda self: fake)
    trigger = make(
        log_streams=[{"label": "main.out", "path": str(log), "cursor_path": str(tmp_path / ".cursor")}],
        secret_refs={"TRAIN_TOKEN": "env:TRAIN_TOKEN"},
    )

    (event,) = run(all_events(trigger))

    output = capsys.readouterr().out
    assert live_lines(output) == [
        "main.out | epoch 1",
        "main.out | epoch 2 token ${REDACTED}",
        "main.out | [2026] INFO - Task exited",
    ]
    assert secret not in output
    assert fake.tail_calls == 4  # the pending poll read nothing
    assert event["log_offsets"] == {"main.out": log.stat().st_size}
    assert JobEvent.from_dict(event).log_offsets == {"main.out": log.stat().st_size}


def restart_after_two_polls(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], first: WritingHook, second: WritingHook
) -> None:
    """A triggerer restart: a trigger built from ``kwargs`` runs on ``first`` until it tailed its logs twice and
    is cancelled; one rebuilt from the same kwargs then runs on ``second`` to its end."""

    async def until_two_polls() -> None:
        events = SlurmJobTrigger(**kwargs).run()
        task = asyncio.ensure_future(anext(events))
        while first.tail_calls < 2:
            await asyncio.sleep(POLL / 4)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(until_two_polls())
    monkeypatch.setattr(SlurmJobTrigger, "_hook", lambda self: second)
    run(all_events(SlurmJobTrigger(**kwargs)))


def test_a_secret_the_triggerer_cannot_resolve_withholds_the_jobs_lines(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An env: secret the triggerer lacks: the trigger says so once, logs no line of the job (not even the ones
    that look harmless) and reads none of its files; the event shows nothing as shown (the sensor decides)."""
    secret = "only-the-worker-knows-0123456789"
    monkeypatch.delenv("WORKER_ONLY_TOKEN", raising=False)
    log = tmp_path / "main.out"
    writes = [b"epoch 1\n", b"token " + secret.encode() + b"\n", b"epoch 2\n"]
    fake = WritingHook([squeue("RUNNING"), squeue("RUNNING"), squeue("RUNNING"), sacct("COMPLETED")], log, writes)
    monkeypatch.setattr(SlurmJobTrigger, "_hook", lambda self: fake)
    trigger = make(
        log_streams=[{"label": "main.out", "path": str(log), "cursor_path": str(tmp_path / ".cursor")}],
        secret_refs={"HF_TOKEN": "env:WORKER_ONLY_TOKEN", "OTHER_TOKEN": "env:WORKER_ONLY_TOKEN"},
    )

    (event,) = run(all_events(trigger))

    output = capsys.readouterr().out
    assert live_lines(output) == []
    assert "epoch" not in output
    assert secret not in output
    assert output.count("Cannot resolve") == 1
    assert "secret_env[HF_TOKEN], secret_env[OTHER_TOKEN]" in output
    assert "withheld" in output
    assert str(log) in output
    assert fake.tail_calls == 0
    assert event["log_offsets"] == {}
    assert not (tmp_path / ".cursor").exists()


def test_a_restarted_trigger_resumes_the_stream_from_the_cursor(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trigger rebuilt from the same kwargs (triggerer restart) logs only what the first one did not."""
    log = tmp_path / "main.out"
    streams = [{"label": "main.out", "path": str(log), "cursor_path": str(tmp_path / ".cursor")}]
    first = WritingHook([squeue("RUNNING")], log, [b"a\nb\n"])
    monkeypatch.setattr(SlurmJobTrigger, "_hook", lambda self: first)
    _, kwargs = make(log_streams=streams).serialize()

    second = WritingHook([squeue("RUNNING"), sacct("COMPLETED")], log, [b"c d\n"])  # not a base64-only word
    restart_after_two_polls(monkeypatch, kwargs, first, second)

    assert live_lines(capsys.readouterr().out) == ["main.out | a", "main.out | b", "main.out | c d"]


@pytest.mark.parametrize("cut", ["in-a-row", "in-the-begin-line", "between-rows"])
def test_a_trigger_rebuilt_in_the_middle_of_a_key_block_shows_none_of_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cut: str
) -> None:
    """A triggerer restart while the job prints a private key: the rebuilt trigger has only what serialize() gave
    (the cursor's path, no key state), resumes in the middle of the block, and shows none of its rows."""
    rows = [("MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunV" + str(n))[-64:] for n in range(4)]
    text = "\n".join(["epoch 1", "-----BEGIN " + "PRIVATE KEY-----", *rows, "Zm9v", "-----END " + "PRIVATE KEY-----"])
    text += "\nepoch 2\n"
    at = {
        "in-a-row": text.index(rows[1]) + 20,
        "in-the-begin-line": text.index("PRIVATE KEY"),
        "between-rows": text.index(rows[2]),
    }[cut]
    log = tmp_path / "main.out"
    streams = [{"label": "main.out", "path": str(log), "cursor_path": str(tmp_path / ".cursor")}]
    first = WritingHook([squeue("RUNNING")], log, [text[:at].encode()])
    monkeypatch.setattr(SlurmJobTrigger, "_hook", lambda self: first)
    _, kwargs = make(log_streams=streams).serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # what the triggerer stores: no in-memory state rides along

    second = WritingHook([squeue("RUNNING"), sacct("COMPLETED")], log, [text[at:].encode()])
    restart_after_two_polls(monkeypatch, kwargs, first, second)

    lines = live_lines(capsys.readouterr().out)
    shown = [line.split(" | ", 1)[1] for line in lines]
    assert not [line for line in shown if line and any(line in row + "Zm9v" for row in rows)]
    assert shown[0] == "epoch 1"
    assert shown[-1] == "epoch 2"
    assert any("withheld" in line for line in shown)


# ------------------------------------------------------------------ end markers


@pytest.fixture
def fast_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_tao_slurm.triggers import poller

    monkeypatch.setattr(poller, "END_MARKER_INTERVAL_S", 0.05)


@pytest.mark.usefixtures("fast_markers")
@pytest.mark.parametrize(("code", "native"), [(0, "COMPLETED"), (3, "FAILED")])
def test_the_end_marker_ends_the_wait_long_before_the_next_scheduler_query(
    hook: TriggerHook, tmp_path: Any, code: int, native: str
) -> None:
    ends = tmp_path / "ends $(x)"
    ends.mkdir()
    hook.script = [squeue("RUNNING")]
    hook.accounting = [sacct("RUNNING"), sacct(native, code)]  # slurmdbd learns of the end a moment later
    trigger = make(poll_interval=3600, end_marker_dir=str(ends))

    async def scenario() -> list[dict[str, Any]]:
        task = asyncio.ensure_future(all_events(trigger))
        await asyncio.sleep(0.2)
        (ends / f"{JOB}-0-{code}.end").touch()
        (ends / f"999{JOB}-0-0.end").touch()  # another job's marker
        return await task

    started = time.monotonic()
    events = run(scenario())
    assert time.monotonic() - started < 3, "the marker, not the hourly scheduler query, ended the wait"
    assert len(hook.polls) == 1
    assert hook.marker_reads >= 2
    assert hook.accounting_asked == [[JOB], [JOB]]  # only the marked job, until accounting shows its end
    event = JobEvent.from_dict(events[0])
    assert len(events) == 1
    assert event.state is not None
    assert (event.status, event.state.native, event.state.exit_code) == (EventStatus.TERMINAL, native, code)
    assert event.state.source == "sacct"  # the record settles on accounting's word


@pytest.mark.usefixtures("fast_markers")
def test_a_marker_accounting_does_not_confirm_leaves_the_job_to_the_scheduler_queries(
    hook: TriggerHook, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeued run's marker (accounting shows the job pending again) is dropped; the next run's marker ends
    the wait; another results base's marker of the same id is never read as this job's."""
    from airflow_provider_tao_slurm.triggers import poller

    monkeypatch.setattr(poller, "END_MARKER_CONFIRM_S", 0.3)
    ends, other = tmp_path / "ends", tmp_path / "other"
    ends.mkdir()
    other.mkdir()
    (ends / f"{JOB}-0-0.end").touch()  # the run SLURM requeued
    (other / f"{JOB}-1-0.end").touch()  # same id, another results base
    hook.script = [squeue("RUNNING")]
    hook.accounting = [{JOB: state_from_native(JOB, "PENDING", source="sacct", reason="BeginTime")}]
    trigger = make(poll_interval=3600, end_marker_dir=str(ends))

    async def scenario() -> list[dict[str, Any]]:
        task = asyncio.ensure_future(all_events(trigger))
        await asyncio.sleep(0.8)
        assert not task.done()
        asked = len(hook.accounting_asked)
        await asyncio.sleep(0.3)
        assert len(hook.accounting_asked) == asked, "the dropped run's marker is not asked about again"
        hook.accounting = [sacct("FAILED", 2, run=1)]
        (ends / f"{JOB}-1-2.end").touch()
        return await task

    event = JobEvent.from_dict(run(scenario())[0])
    assert event.state is not None
    assert (event.state.exit_code, event.state.native, event.state.source) == (2, "FAILED", "sacct")


def test_with_accounting_down_a_marker_ends_nothing(
    hook: TriggerHook, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_tao_slurm.triggers import poller

    monkeypatch.setattr(poller, "END_MARKER_INTERVAL_S", 0.25)
    monkeypatch.setattr(poller, "END_MARKER_RECHECK_S", 0.01)
    monkeypatch.setattr(poller, "END_MARKER_BATCH_S", 0.01)
    ends = tmp_path / "ends"
    ends.mkdir()
    (ends / f"{JOB}-0-0.end").touch()
    hook.script = [squeue("RUNNING")]
    hook.accounting = [RuntimeError("sacct: error: Problem talking to the database: Connection refused")]

    async def scenario() -> int:
        task = asyncio.ensure_future(all_events(make(poll_interval=3600, end_marker_dir=str(ends))))
        await asyncio.sleep(1.0)
        assert not task.done(), "no event without accounting's word"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return len(hook.accounting_asked)

    asked = run(scenario())
    assert 2 <= asked <= 6, f"a failing sacct is asked again every marker interval, not every recheck ({asked})"


def test_without_an_ends_directory_no_marker_is_read(hook: TriggerHook) -> None:
    hook.script = [squeue("RUNNING"), sacct("COMPLETED")]
    events = run(all_events(make()))
    assert JobEvent.from_dict(events[0]).state.source == "sacct"  # type: ignore[union-attr]
    assert hook.marker_reads == 0


# ---------------------------------------------------------------------- a compact event, the full one in a file

#: The longest job name a job id may be, and an event file deep in a long results directory.
LONG_NAME = "t" * 128
LONG_EVENT_PATH = f"/lustre/{'project-' * 20}/jobs/{LONG_NAME}/events/{JOB}-0123456789ab.json"


@pytest.mark.parametrize(
    ("script", "compact"),
    [
        pytest.param(
            [squeue("RUNNING"), sacct("COMPLETED")],
            {"status": "terminal", "slurm_job_id": JOB, "native": "COMPLETED"},
            id="completed",
        ),
        pytest.param(
            [sacct("OUT_OF_MEMORY", 0, 9)],
            {"status": "terminal", "slurm_job_id": JOB, "native": "OUT_OF_MEMORY"},
            id="failed",
        ),
        pytest.param(
            [squeue("WEIRD_STATE")],
            {"status": "unrecognised", "slurm_job_id": JOB, "native": "WEIRD_STATE"},
            id="unrecognised",
        ),
        pytest.param([{}], {"status": "vanished", "slurm_job_id": JOB}, id="vanished"),
    ],
)
def test_the_event_is_compact_and_the_file_holds_the_full_one(
    hook: TriggerHook, script: Script, compact: dict[str, Any]
) -> None:
    """The triggerer logs each event whole on one task-log line: it says only how the wait ended and names the file
    (mode 600, written in the one round trip that creates its directory) that holds everything else."""
    from airflow.triggers.base import TriggerEvent

    hook.script = script
    trigger = SlurmJobTrigger(
        slurm_conn_id="slurm_default",
        slurm_job_id=JOB,
        job_name=LONG_NAME,
        poll_interval=POLL,
        submitted_at=time.time(),
        not_found_grace=0.1,
        unrecognised_grace=0.1,
        event_path=LONG_EVENT_PATH,
    )

    (payload,) = run(all_events(trigger))

    assert payload == {**compact, "ref": f"{JOB}-0123456789ab.json"}
    assert len(repr(TriggerEvent(payload))) <= 150
    assert hook.modes == {LONG_EVENT_PATH: "600"}
    full = json.loads(hook.files[LONG_EVENT_PATH])
    assert (full["status"], full["slurm_job_id"], full["job_name"]) == (compact["status"], JOB, LONG_NAME)
    assert JobEvent.reference(payload) == payload["ref"]
    assert JobEvent.from_file(hook.files[LONG_EVENT_PATH], payload, LONG_EVENT_PATH) == JobEvent.from_dict(full)


def test_a_failed_event_write_yields_the_full_event_and_says_so(
    hook: TriggerHook, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing is lost when the file cannot be written: the event carries all of it, as an older provider's did."""
    hook.script = [squeue("RUNNING"), sacct("FAILED", 3)]
    hook.unwritable.add(LONG_EVENT_PATH)

    (payload,) = run(all_events(make(event_path=LONG_EVENT_PATH)))

    assert JobEvent.reference(payload) is None
    event = JobEvent.from_dict(payload)
    assert (event.status, event.state.native if event.state else None) == (EventStatus.TERMINAL, "FAILED")
    assert [t.native for t in event.transitions] == ["RUNNING", "FAILED"]
    assert LONG_EVENT_PATH not in hook.files
    output = capsys.readouterr().out
    assert f"Could not write the end of SLURM job {JOB} ({NAME}) to {LONG_EVENT_PATH}" in output
    assert "No space left on device" in output
