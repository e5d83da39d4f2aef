"""The one watch (:mod:`airflow_provider_tao_slurm.lifecycle.watch`) and the worker-side wait built on it.

The rules are checked on the pure :func:`observe` with scripted polls; then
:meth:`JobLifecycle.wait_until_ended` (the Enroot and NCCL operators' ``deferrable=False`` path) is run
through the same scripts against a scripted hook and must end the way the trigger does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import pytest
from fakes import FakeSlurmHook

from airflow_provider_tao_slurm.core.states import JobState, TaoState, state_from_native
from airflow_provider_tao_slurm.exceptions import JobLookupError
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW
from airflow_provider_tao_slurm.lifecycle import jobs as jobs_module
from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
from airflow_provider_tao_slurm.lifecycle.watch import Watch, WatchRules, observe

JOB = "77"
RULES = WatchRules(not_found_grace_seconds=10, unrecognised_grace_seconds=20, accounting_settle_seconds=30)
FAILED = JobLookupError("1 of 1 job(s) unanswered")


def squeue(native: str, reason: str | None = None) -> JobState:
    return state_from_native(JOB, native, source="squeue", reason=reason)


def sacct(native: str, exit_code: int = 0) -> JobState:
    return state_from_native(JOB, native, source="sacct", exit_code=exit_code, signal=0, end="2026-12-05T10:00:00")


def run(script: list[tuple[float, Any]], watch: Watch | None = None) -> tuple[JobEvent | None, Watch, list[str]]:
    """Feed ``(time, answer)`` polls (a state, None, or an exception) to observe; stop at the first event."""
    watch = watch or Watch.start(JOB, "tao-x", submitted_at=0.0)
    said: list[str] = []
    for polled_at, answer in script:
        error = str(answer) if isinstance(answer, Exception) else None
        step = observe(watch, RULES, polled_at=polled_at, state=None if error else answer, error=error)
        watch = step.watch
        said.extend(note.message for note in step.notes)
        if step.event is not None:
            return step.event, watch, said
    return None, watch, said


@pytest.mark.parametrize(
    ("script", "status", "native"),
    [
        pytest.param([(1, squeue("RUNNING")), (2, sacct("COMPLETED"))], EventStatus.TERMINAL, "COMPLETED", id="done"),
        pytest.param([(5, None), (11, None)], EventStatus.VANISHED, None, id="missing-since-submission"),
        pytest.param([(5, None), (10, None)], None, None, id="missing-within-grace"),
        pytest.param([(5, None), (8, FAILED), (17, None)], None, None, id="failed-poll-restarts-not-found-clock"),
        pytest.param([(5, None), (8, FAILED), (19, None)], EventStatus.VANISHED, None, id="then-vanishes"),
        pytest.param([(1, FAILED), (500, FAILED)], None, None, id="failed-polls-are-no-evidence"),
        pytest.param([(1, squeue("RUNNING")), (9, None), (12, None)], EventStatus.VANISHED, None, id="from-last-seen"),
        pytest.param([(1, squeue("WEIRD")), (20, squeue("WEIRD"))], None, None, id="unknown-within-grace"),
        pytest.param(
            [(1, squeue("WEIRD")), (21, squeue("WEIRD"))], EventStatus.UNRECOGNISED, "WEIRD", id="unknown-too-long"
        ),
        pytest.param(
            [(1, squeue("WEIRD")), (15, squeue("RUNNING")), (30, squeue("WEIRD"))], None, None, id="unknown-reset"
        ),
        pytest.param([(1, squeue("COMPLETED")), (30, squeue("COMPLETED"))], None, None, id="awaits-accounting"),
        pytest.param(
            [(1, squeue("COMPLETED")), (31, squeue("COMPLETED"))],
            EventStatus.TERMINAL,
            "COMPLETED",
            id="accounting-never-answers",
        ),
        pytest.param(
            [(1, squeue("COMPLETED")), (5, sacct("FAILED", 3))], EventStatus.TERMINAL, "FAILED", id="accounting-wins"
        ),
    ],
)
def test_observe_ends_the_wait_by_the_rules(
    script: list[tuple[float, Any]], status: EventStatus | None, native: str | None
) -> None:
    event, _, _ = run(script)

    assert (event.status if event else None) == status
    assert (event.state.native if event and event.state else None) == native


def test_a_requeue_is_counted_and_said_once_and_every_change_is_an_observation() -> None:
    event, watch, said = run(
        [
            (1, squeue("PENDING", "Priority")),
            (2, squeue("RUNNING")),
            (3, squeue("RUNNING")),
            (4, squeue("PENDING", "BeginTime")),
            (5, squeue("PENDING", "BeginTime")),
            (6, squeue("RUNNING")),
            (7, sacct("COMPLETED")),
        ]
    )

    assert event is not None
    assert watch.restarts == 1
    assert [line for line in said if "requeued by SLURM" in line] == [
        "SLURM job 77 (tao-x) went back to the queue: preempted (or a node failed); requeued by SLURM (restart 1), "
        "the same job runs again and is watched to its end"
    ]
    assert [(t.ts, t.state, t.reason) for t in event.transitions] == [
        (1, TaoState.PENDING, "Priority"),
        (2, TaoState.RUNNING, None),
        (4, TaoState.PENDING, "BeginTime"),
        (6, TaoState.RUNNING, None),
        (7, TaoState.COMPLETE, None),
    ]


def test_the_watch_round_trips_through_its_dict() -> None:
    _, watch, _ = run([(1, squeue("RUNNING")), (2, squeue("WEIRD")), (3, squeue("COMPLETED"))])

    assert Watch.from_dict(watch.to_dict()) == watch
    assert watch.strange_since is None
    assert watch.ended_at == 3


class ScriptedHook(FakeSlurmHook):
    """Answers ``get_states`` from a script: a state, None (unknown to SLURM) or an exception, one per poll."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__()
        self.answers = list(answers)

    def get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        ids = list(job_ids)
        self.polls.append(ids)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {} if answer is None else {ids[0]: answer}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("answers", "status", "polls"),
    [
        pytest.param(
            [squeue("WEIRD")] * 3 + [sacct("COMPLETED")], EventStatus.TERMINAL, 4, id="unknown-briefly-then-done"
        ),
        pytest.param([squeue("WEIRD")] * 6, EventStatus.UNRECOGNISED, 5, id="unknown-too-long"),
        pytest.param([squeue("COMPLETED"), squeue("COMPLETED"), sacct("FAILED", 2)], EventStatus.TERMINAL, 3, id="lag"),
        pytest.param([None, FAILED, None, None, None], EventStatus.VANISHED, 5, id="vanished-after-a-failed-query"),
    ],
)
def test_the_worker_side_wait_ends_as_the_trigger_does(
    monkeypatch: pytest.MonkeyPatch, answers: list[Any], status: EventStatus, polls: int
) -> None:
    """Every 5 s: 20 s of an unknown state is UNRECOGNISED, accounting is awaited, a failed query is no evidence."""
    clock = Clock()
    monkeypatch.setattr(jobs_module, "time", clock)
    hook = ScriptedHook(answers)
    lifecycle = JobLifecycle(hook, logging.getLogger("test"))  # type: ignore[arg-type]

    payload = lifecycle.wait_until_ended(JOB, "tao-x", submitted_at=0.0, poll_interval=5, rules=RULES)

    event = JobEvent.from_dict(payload)
    assert event.status is status
    assert len(answers) - len(hook.answers) == polls
    if status is EventStatus.TERMINAL and answers[-1].source == "sacct":
        assert event.state is not None
        assert (event.state.native, event.state.exit_code) == (answers[-1].native, answers[-1].exit_code)
