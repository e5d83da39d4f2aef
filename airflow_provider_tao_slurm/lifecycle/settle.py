"""One settle: what happens once the watch says a job's wait is over.

:class:`Settlement` takes the watch's :class:`~airflow_provider_tao_slurm.lifecycle.events.JobEvent`
and decides the job's outcome in one place, whoever waited (the deferred sensor on the trigger's
event, the poking sensor on its own): it writes the observed transitions to the record, shows the
end of the job's logs, reads the job's cost, continues a chain of slices, checks ``status.json`` on
success, classifies a failure with its evidence and has an infrastructure failure resubmitted. It
returns the final record (as the task's result, with the KPIs ``status.json`` reports), or the handle
of the job that follows (watch that one), or raises the failure. The sensor keeps only the Airflow
glue (defer, poke, XCom, outlets).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.continuation import ends_slice
from airflow_provider_tao_slurm.core.execution import parse_child_exit_codes
from airflow_provider_tao_slurm.core.failures import classify
from airflow_provider_tao_slurm.core.logstream import clean_lines, show_lines
from airflow_provider_tao_slurm.core.records import mark
from airflow_provider_tao_slurm.core.secrets import key_block_at, redact_chunk, redact_obj
from airflow_provider_tao_slurm.core.states import ErrClass, TaoState
from airflow_provider_tao_slurm.core.status import status_kpis, status_verdict
from airflow_provider_tao_slurm.core.tao import is_tao_action
from airflow_provider_tao_slurm.exceptions import (
    JobFailedError,
    JobNotFoundError,
    MissingPathsError,
    UnknownStateError,
    ValidationError,
    job_failed,
)
from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent
from airflow_provider_tao_slurm.lifecycle.jobs import chain_summary, record_dict
from airflow_provider_tao_slurm.lifecycle.waiting import log_tails

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.failures import Classification
    from airflow_provider_tao_slurm.core.records import JobRecord
    from airflow_provider_tao_slurm.core.states import JobState
    from airflow_provider_tao_slurm.core.usage import JobUsage
    from airflow_provider_tao_slurm.lifecycle.events import JobHandle
    from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

#: Bytes of each log shown when the job ends (what the live lines did not show yet, at most this).
FINAL_LOG_BYTES = 16384
#: The job's own logs in its log directory.
LOGS = ("main.out", "main.err")


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def asset_extra(handle: JobHandle, result: Mapping[str, Any]) -> dict[str, Any]:
    """Return what an Asset event of a finished job carries: where its results are, which job, its cost and KPIs.

    ``kpis`` (what the job's ``status.json`` reports, e.g. an evaluation's ``{"mAP": 0.81}``) is there only
    when the result has it, as ``gpu_hours`` and ``elapsed_seconds`` only when accounting answered.
    """
    return {
        "results_dir": handle.results_dir,
        "job_id": handle.job_id,
        "slurm_job_id": handle.slurm_job_id,
        "cluster": handle.cluster,
        **{key: result[key] for key in ("gpu_hours", "elapsed_seconds", "kpis") if key in result},
    }


def failure_message(slurm_job_id: str, verdict: Classification, log_dir: str | None) -> str:
    """Return the error of a failed job: the verdict and where its logs are, then (a line of its own) the evidence.

    The evidence (up to :data:`~airflow_provider_tao_slurm.core.failures.EVIDENCE_MAX_CHARS`, often one of the
    job's log lines) gets its own line, so that no line of the task log runs on.
    """
    logs = f". Logs: {log_dir}" if log_dir else ""
    return (
        f"SLURM job {slurm_job_id} failed ({verdict.err_class}): {verdict.reason}{logs}\n"
        f"SLURM job {slurm_job_id} failed; evidence: {verdict.evidence}"
    )


class Settlement:
    """Settles jobs over ``lifecycle`` by the sensor's rules.

    :param lifecycle: the job-lifecycle layer (its hook and the task's logger).
    :param max_infra_retries: how many times an infrastructure failure is resubmitted.
    :param require_status_json: whether COMPLETED needs ``status.json`` SUCCESS (None: for TAO actions).
    """

    def __init__(
        self, lifecycle: JobLifecycle, *, max_infra_retries: int = 2, require_status_json: bool | None = None
    ) -> None:
        self.lifecycle = lifecycle
        self.hook = lifecycle.hook
        self.log: logging.Logger | Any = lifecycle.log
        self.max_infra_retries = max_infra_retries
        self.require_status_json = require_status_json

    def trigger_event(self, value: object, events_dir: str | None) -> JobEvent:
        """Return the event a trigger fired: ``value`` itself, or the full event in the file it names in ``events_dir``.

        A trigger given an ``event_path`` writes the full event there and fires a compact one naming the
        file (:meth:`JobEvent.compact <airflow_provider_tao_slurm.lifecycle.events.JobEvent.compact>`); the
        file stays after the settle. Only its name comes from the event: the directory is the caller's.

        :param value: the trigger event's payload.
        :param events_dir: where the deferral had the trigger write (``<job_dir>/events``, or
            ``<results_dir>/events`` for a job submitted elsewhere); None: nowhere.
        :raises ValidationError: for a malformed event, a compact one without a directory to read it from, or
            a file that is no event or is about another job or outcome.
        :raises MissingPathsError: when the file is missing (the fix: clear the task, which watches the job again).
        :raises RemoteReadError: when it could not be read (never taken for a missing file).
        """
        ref = JobEvent.reference(value)
        if ref is None:
            return JobEvent.from_dict(value)
        assert isinstance(value, Mapping)  # JobEvent.reference returns a ref only for a mapping
        if events_dir is None:
            raise ValidationError(
                f"trigger event refers to the file {ref!r}, but this task knows no directory it could be in "
                "(the connection has no results_dir); clear the task"
            )
        path = f"{events_dir}/{ref}"
        text = self.hook.read_file(path)
        if text is None:
            raise MissingPathsError(
                f"the trigger's event file {path} of SLURM job {value['slurm_job_id']} is missing on the "
                "cluster (removed since the trigger wrote it); clear the task to watch the job again",
                [path],
            )
        return JobEvent.from_file(text, value, path)

    def settle(
        self, ti: Any, handle: JobHandle, event: JobEvent, secrets: list[str] | None
    ) -> dict[str, Any] | JobHandle:
        """Record what the wait saw and the outcome; a JobHandle back means "the job goes on as this one".

        :param ti: the task instance (names a resubmission or the next slice).
        :param secrets: the job's secret values for redaction; None when they did not resolve (its
            log lines are then not shown).
        :raises JobFailedError: the job failed (or was cancelled outside the task); the record says so.
        :raises JobNotFoundError: it vanished without evidence of its end (recorded UNKNOWN).
        :raises UnknownStateError: SLURM kept reporting a state nobody knows (recorded UNKNOWN).
        """
        lifecycle = self.lifecycle
        record = self._observed(handle, lifecycle.require_record(handle), event)
        log_tail = self.show_logs(handle, secrets, event.log_offsets)
        if event.status is EventStatus.UNRECOGNISED:
            lifecycle.mark_unknown(handle, record, event.message, remove_sidecar=False)
            raise UnknownStateError(event.message)
        state = event.state if event.status is EventStatus.TERMINAL else lifecycle.end_evidence(handle)
        if state is None:  # vanished, and its own files do not show how it ended
            lifecycle.mark_unknown(handle, record, event.message, remove_sidecar=True)
            raise JobNotFoundError(event.message)
        if event.status is EventStatus.VANISHED:
            self.log.warning("%s", event.message)
            self.log.warning(
                "Its batch script's end marker and exit-code file show that SLURM job %s ended %s with exit code %s "
                "(accounting lags): settled on that evidence",
                handle.slurm_job_id,
                state.native,
                state.exit_code,
            )
        usage = lifecycle.usage(handle.slurm_job_id)
        if usage is not None:
            record = dataclasses.replace(record, extra={**record.extra, "usage": usage.to_dict()})
            self.report_usage(handle, usage, state)
        if handle.max_continuations and ends_slice(state.native, state.exit_code):
            return lifecycle.continue_slice(ti, handle, record, state, usage)
        chain = chain_summary(handle, state, usage) if handle.max_continuations else {}
        if chain:  # the last slice's record carries the whole chain
            record = dataclasses.replace(record, extra={**record.extra, **chain})
        if state.tao_state is TaoState.COMPLETE:
            result = self._completed(handle, record, state, secrets)
            return {**result, **(usage.to_dict() if usage is not None else {}), **chain}
        if state.tao_state is TaoState.CANCELED:
            reason = f"SLURM job {state.job_id} ended {state.raw_state or state.native}"
            lifecycle.settle(handle, record, TaoState.CANCELED, message=reason)
            raise JobFailedError(f"{reason}; it was cancelled outside this task (scancel, preemption or an admin)")
        verdict = classify(state, log_tail)
        if verdict.retryable and handle.infra_retries < self.max_infra_retries:
            return lifecycle.resubmit(ti, handle, record, state, verdict, usage)
        lifecycle.settle(
            handle,
            record,
            TaoState.ERROR,
            message=f"{state.native} exit {state.exit_code}: {verdict.reason} [{verdict.evidence}]",
            err_class=verdict.err_class,
            exit_codes=self._exit_codes(handle, state.exit_code),
        )
        raise job_failed(failure_message(state.job_id, verdict, handle.log_dir), str(verdict.err_class))

    def _observed(self, handle: JobHandle, record: JobRecord, event: JobEvent) -> JobRecord:
        """Return the record with the wait's observations (a terminal record takes none)."""
        started = any(t.source == "trigger" and t.state == TaoState.RUNNING for t in record.transitions)
        for seen in event.transitions if record.terminal_state is None else ():
            started = started or seen.state is TaoState.RUNNING
            # The submit already recorded RUNNING ("submitted"); queue waits before the job first ran
            # are logged by the wait, while PENDING after a real start (a requeue) is recorded.
            if (
                seen.state.is_terminal
                or seen.state is TaoState.UNKNOWN
                or (seen.state is TaoState.PENDING and not started)
            ):
                continue
            record = mark(
                record,
                seen.state,
                now=_utc(seen.ts),
                message=" ".join(x for x in (seen.native, seen.reason) if x),
                source="trigger",
                backend_ref=handle.slurm_job_id,
            )
        return record

    def _completed(
        self, handle: JobHandle, record: JobRecord, state: JobState, secrets: list[str] | None
    ) -> dict[str, Any]:
        """Settle a COMPLETED job: COMPLETE when its ``status.json`` agrees (or is not required), else ERROR.

        The COMPLETE result is the final record, plus ``kpis`` when ``status.json`` reports KPIs (TAO's
        ``"kpi"`` lines, e.g. an evaluation's), redacted as the record is.
        """
        required = self.require_status_json
        if required is None:
            required = is_tao_action(record.network_arch)  # a TAO action is COMPLETE only with status.json SUCCESS
        status = self.lifecycle.read_status(f"{handle.results_dir}/status.json", settle=required)
        verdict = status_verdict(status)
        exit_codes = self._exit_codes(handle, state.exit_code if state.exit_code is not None else 0)
        if verdict.ok is False or (verdict.ok is None and required):
            self.lifecycle.settle(
                handle,
                record,
                TaoState.ERROR,
                message=f"COMPLETED but {verdict.message}",
                err_class=ErrClass.ERR_PROGRAM,
                exit_codes=exit_codes,
            )
            why = (
                f": a TAO action (network_arch {record.network_arch!r} in its record) is COMPLETE only when its "
                "status.json says SUCCESS.\nIf it is a plain container job, pass network_arch='custom' to "
                "SbatchSubmitOperator (or require_status_json=False to this sensor)"
                if verdict.ok is None and self.require_status_json is None
                else ""
            )
            raise job_failed(f"SLURM job {state.job_id} completed but {verdict.message}{why}", ErrClass.ERR_PROGRAM)
        record = self.lifecycle.settle(
            handle,
            record,
            TaoState.COMPLETE,
            message=f"COMPLETED; status.json: {verdict.message}",
            backend_ref=handle.slurm_job_id,
            exit_codes=exit_codes,
        )
        self.log.info("Job %s complete; results in %s", handle.job_id, handle.results_dir)
        result = record_dict(record)
        kpis = status_kpis(status)
        if kpis:
            result["kpis"] = redact_obj(kpis, secrets or ())
            self.log.info("Job %s KPIs (status.json): %s", handle.job_id, result["kpis"])
        return result

    def report_usage(self, handle: JobHandle, usage: JobUsage, state: JobState) -> None:
        """Report the job's cost as the task log's summary line and as Airflow metrics (``tao_slurm.job.*``)."""
        from airflow.sdk.observability.stats import Stats

        self.log.info("%s", usage.summary(handle.slurm_job_id, f"{state.tao_state} ({state.native})"))
        tags = {"cluster": handle.cluster or "", "state": str(state.tao_state)}
        if usage.queue_seconds is not None:
            Stats.timing("tao_slurm.job.queue_time", timedelta(seconds=usage.queue_seconds), tags=tags)
        Stats.timing("tao_slurm.job.run_time", timedelta(seconds=usage.elapsed_seconds), tags=tags)
        Stats.gauge("tao_slurm.job.gpu_hours", usage.gpu_hours, tags=tags)
        Stats.incr("tao_slurm.job.gpu_seconds", round(usage.gpu_hours * 3600), tags=tags)

    def show_logs(self, handle: JobHandle, secrets: list[str] | None, shown: Mapping[str, int]) -> str:
        """Show what the live lines did not of main.out/main.err; return their ends for classification.

        With ``secrets`` None (the job's secrets did not resolve here) nothing is shown.
        """
        if not handle.log_dir:
            return ""
        if secrets is None:
            return log_tails(self.lifecycle, [f"{handle.log_dir}/{name}" for name in LOGS], FINAL_LOG_BYTES)
        return "\n".join(self.show_log(name, f"{handle.log_dir}/{name}", secrets, shown.get(name)) for name in LOGS)

    def show_log(self, label: str, path: str, secrets: Sequence[str], shown: int | None) -> str:
        """Log the part of ``path`` after ``shown`` (or its end) as live lines are shown; return its end.

        Each line is cleaned like a live line (bounded, no escapes, redacted, a private key over many lines
        too, prefixed with the label), so a job's output cannot forge task-log lines. Neither part knows
        where the live lines left a private key block: each starts outside one only at the file's start,
        elsewhere in an unknown place, where the lines that may be a key's body are withheld.
        """
        raw, key_block = self.lifecycle.raw_tail(path, FINAL_LOG_BYTES)
        tail = redact_chunk(raw, secrets, key_block)[0]
        rest, heading = raw, f"last {len(raw.encode())} bytes"
        if shown is not None:
            chunk = self.hook.read_log(path, shown, FINAL_LOG_BYTES)
            if not chunk.restarted:
                rest, key_block = chunk.data, key_block_at(shown)
            heading = "after the live lines"
        if rest.strip():
            self.log.info("---- %s (%s) ----", path, heading)
            lines, _ = clean_lines(rest.splitlines(), secrets, key_block)
            show_lines(self.log, [f"{label} | {line}" for line in lines])
        return tail

    def _exit_codes(self, handle: JobHandle, job_code: int | None) -> dict[str, Any] | None:
        """Return the job's exit code plus, for execution blocks, every child's (from the child exit-code file)."""
        codes: dict[str, Any] = {} if job_code is None else {"job": job_code}
        if handle.child_exit_code_path:
            text = self.hook.read_file(handle.child_exit_code_path)
            if text:
                codes["children"] = parse_child_exit_codes(text)
        return codes or None
