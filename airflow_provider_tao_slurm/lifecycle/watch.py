"""One watch: the pure state machine behind every wait for a SLURM job.

The trigger (deferred), the sensor's poke (in a worker) and the worker-side waits of the Enroot
and NCCL operators (``deferrable=False``) all feed each poll's answer to :func:`observe` and act
on what it returns, so they share one set of rules:

- a failed poll is no evidence that the job is gone: the not-found clock restarts;
- a job unknown to squeue and sacct for longer than ``not_found_grace_seconds`` since it was last
  seen (or submitted) has VANISHED;
- a state this provider does not know, reported for ``unrecognised_grace_seconds``, is UNRECOGNISED;
- a terminal state without accounting's full row waits up to :data:`ACCOUNTING_SETTLE_S` for it;
- a job that ran and is PENDING again was requeued by SLURM (counted, said once);
- every change of state or reason is an :class:`Observation` (recorded by the sensor).

:class:`Watch` is a small frozen value that serialises to a dict, so it can live in a trigger's
coroutine, on a sensor instance, or in a loop. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_tao_slurm.core.defaults import DEFAULT_NOT_FOUND_GRACE_S, DEFAULT_UNRECOGNISED_GRACE_S
from airflow_provider_tao_slurm.core.states import ACCOUNTING_SETTLE_S, JobState, TaoState, pending_hint
from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent, Observation


@dataclass(frozen=True)
class WatchRules:
    """How long a wait tolerates a missing job, an unknown state and accounting lag.

    :param not_found_grace_seconds: a job unknown to squeue and sacct this long is VANISHED.
    :param unrecognised_grace_seconds: a state this provider does not know, this long, is UNRECOGNISED.
    :param accounting_settle_seconds: a terminal state waits this long for accounting's exit code
        (default :data:`ACCOUNTING_SETTLE_S`).
    """

    not_found_grace_seconds: float = DEFAULT_NOT_FOUND_GRACE_S
    unrecognised_grace_seconds: float = DEFAULT_UNRECOGNISED_GRACE_S
    accounting_settle_seconds: float | None = None

    @property
    def settle_seconds(self) -> float:
        """How long a terminal state waits for accounting."""
        return ACCOUNTING_SETTLE_S if self.accounting_settle_seconds is None else self.accounting_settle_seconds


@dataclass(frozen=True)
class Note:
    """A line the caller logs: ``level`` is a :mod:`logging` level."""

    level: int
    message: str


@dataclass(frozen=True)
class Watch:
    """What a wait remembers between polls.

    :param slurm_job_id: the watched job.
    :param job_name: its exact SLURM name (empty for a job submitted outside the provider).
    :param last_seen: epoch seconds the job was last known to the scheduler (its submission at first).
    :param strange_since: since when its state is one this provider does not know.
    :param ended_at: since when it is terminal without accounting's full row.
    :param ran: whether it was seen RUNNING since it last queued.
    :param restarts: how many times SLURM requeued it while watched.
    :param last: the last (TAO state, reason) reported.
    :param transitions: every change seen, oldest first.
    """

    slurm_job_id: str
    job_name: str
    last_seen: float
    strange_since: float | None = None
    ended_at: float | None = None
    ran: bool = False
    restarts: int = 0
    last: tuple[str, str | None] | None = None
    transitions: tuple[Observation, ...] = field(default=())

    @classmethod
    def start(
        cls,
        slurm_job_id: str,
        job_name: str,
        *,
        submitted_at: float,
        last_state: str | None = None,
        last_reason: str | None = None,
    ) -> Watch:
        """Start watching a job submitted at ``submitted_at`` (``last_state``: already reported by an earlier wait)."""
        last = (last_state, last_reason) if last_state is not None else None
        return cls(str(slurm_job_id), job_name, submitted_at, ran=last_state == str(TaoState.RUNNING), last=last)

    @property
    def label(self) -> str:
        """The job as messages name it: its id, and its name when the provider submitted it."""
        return f"{self.slurm_job_id} ({self.job_name})" if self.job_name else self.slurm_job_id

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict; :meth:`from_dict` rebuilds the watch."""
        return {
            "slurm_job_id": self.slurm_job_id,
            "job_name": self.job_name,
            "last_seen": self.last_seen,
            "strange_since": self.strange_since,
            "ended_at": self.ended_at,
            "ran": self.ran,
            "restarts": self.restarts,
            "last": list(self.last) if self.last is not None else None,
            "transitions": [item.to_dict() for item in self.transitions],
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Watch:
        last = value.get("last")
        return cls(
            str(value["slurm_job_id"]),
            str(value.get("job_name") or ""),
            float(value["last_seen"]),
            value.get("strange_since"),
            value.get("ended_at"),
            bool(value.get("ran")),
            int(value.get("restarts") or 0),
            (str(last[0]), last[1]) if last else None,
            tuple(Observation.from_dict(item) for item in value.get("transitions") or ()),
        )


@dataclass(frozen=True)
class Step:
    """What one poll changed: the new watch, what to log, and the event when the wait is over."""

    watch: Watch
    notes: tuple[Note, ...] = ()
    event: JobEvent | None = None


def observe(
    watch: Watch,
    rules: WatchRules,
    *,
    polled_at: float,
    state: JobState | None,
    error: str | None = None,
    last_seen: float | None = None,
) -> Step:
    """Take one poll's answer about the watched job.

    :param polled_at: epoch seconds of the poll.
    :param state: what the scheduler said (None: neither squeue nor sacct knows the job).
    :param error: the poll failed (``state`` is then ignored): why.
    :param last_seen: when a poll last answered with the job's state, if the poller knows better
        than this watch (it sends nothing for polls that changed nothing).
    :returns: the next watch, lines to log and, once the wait is over, its :class:`JobEvent`.
    """
    if error is not None:
        return Step(
            replace(watch, last_seen=max(watch.last_seen, polled_at)),
            (Note(logging.WARNING, f"SLURM status poll failed, still waiting: {error}"),),
        )
    if state is None:
        return _missing(watch, rules, polled_at, last_seen)
    watch = replace(watch, last_seen=polled_at)
    if state.tao_state is TaoState.UNKNOWN:
        strange_since = polled_at if watch.strange_since is None else watch.strange_since
        watch = replace(watch, strange_since=strange_since)
        if polled_at - strange_since >= rules.unrecognised_grace_seconds:
            message = (
                f"SLURM reports job {watch.label} in state {state.raw_state.strip()!r}, which this provider does "
                f"not know, for {polled_at - strange_since:.0f} s; check `scontrol show job "
                f"{watch.slurm_job_id}`, cancel it if it should not run, and report the state to the provider "
                "maintainers"
            )
            return Step(watch, event=_event(watch, EventStatus.UNRECOGNISED, message, state))
    else:
        watch = replace(watch, strange_since=None)
    notes: list[Note] = []
    if state.is_terminal and not state.accounted:
        if watch.ended_at is None:
            notes.append(Note(logging.INFO, f"SLURM job {watch.label} ended {state.native}; waiting for accounting"))
        ended_at = polled_at if watch.ended_at is None else watch.ended_at
        watch = replace(watch, ended_at=ended_at)
        if polled_at - ended_at < rules.settle_seconds:
            return Step(watch, tuple(notes))
    elif not state.is_terminal:
        watch = replace(watch, ended_at=None)
    watch, changed = _transition(watch, state, polled_at)
    notes.extend(changed)
    if state.is_terminal:
        return Step(watch, tuple(notes), _event(watch, EventStatus.TERMINAL, "", state))
    return Step(watch, tuple(notes))


def _missing(watch: Watch, rules: WatchRules, polled_at: float, last_seen: float | None) -> Step:
    """Judge a poll that did not find the job: VANISHED once it has been missing longer than the grace."""
    watch = replace(watch, last_seen=max(watch.last_seen, last_seen or watch.last_seen))
    missing = polled_at - watch.last_seen
    if missing <= rules.not_found_grace_seconds:
        return Step(watch)
    message = (
        f"SLURM job {watch.label} is unknown to squeue and sacct for {missing:.0f} s; check `sacct -j "
        f"{watch.slurm_job_id}` and the cluster's accounting"
    )
    return Step(watch, event=_event(watch, EventStatus.VANISHED, message))


def _transition(watch: Watch, state: JobState, polled_at: float) -> tuple[Watch, list[Note]]:
    """Count a requeue and record a change of state or reason, with the lines that say so."""
    notes: list[Note] = []
    if watch.ran and state.tao_state is TaoState.PENDING:
        watch = replace(watch, restarts=watch.restarts + 1, ran=False)
        notes.append(
            Note(
                logging.WARNING,
                f"SLURM job {watch.label} went back to the queue: preempted (or a node failed); requeued by SLURM "
                f"(restart {watch.restarts}), the same job runs again and is watched to its end",
            )
        )
    watch = replace(watch, ran=watch.ran or state.tao_state is TaoState.RUNNING)
    current = (str(state.tao_state), state.reason)
    if current == watch.last:
        return watch, notes
    hint = pending_hint(state.reason) if state.tao_state is TaoState.PENDING else None
    notes.append(
        Note(
            logging.INFO,
            f"SLURM job {watch.label}: {state.native or state.raw_state}"
            + (f" reason={state.reason}" if state.reason else "")
            + (f" nodes={state.node_list}" if state.node_list else "")
            + (f" ({hint})" if hint else ""),
        )
    )
    seen = Observation(polled_at, state.tao_state, state.native, state.reason)
    return replace(watch, last=current, transitions=(*watch.transitions, seen)), notes


def _event(watch: Watch, status: EventStatus, message: str, state: JobState | None = None) -> JobEvent:
    return JobEvent(status, watch.slurm_job_id, watch.job_name, state, watch.transitions, message)
