"""``SlurmJobSensor``: wait (deferred) for a submitted job, then settle its record.

On the trigger's event it writes the observed transitions to the job record, shows the end of
the job's logs in the task log, checks ``status.json`` on success, classifies failures with
evidence and has infrastructure failures resubmitted by the job-lifecycle layer (new record,
``retry_of``, failed nodes excluded). A vanished job, or one stuck in a state nobody knows, is
recorded UNKNOWN and fails the task. The sensor itself submits nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import Asset, BaseSensorOperator, PokeReturnValue
from airflow.sdk.observability.stats import Stats

from airflow_provider_tao_slurm.core.execution import parse_child_exit_codes
from airflow_provider_tao_slurm.core.failures import classify
from airflow_provider_tao_slurm.core.records import JobRecord, mark
from airflow_provider_tao_slurm.core.states import ErrClass, JobState, TaoState
from airflow_provider_tao_slurm.core.status import status_verdict
from airflow_provider_tao_slurm.core.usage import JobUsage
from airflow_provider_tao_slurm.exceptions import (
    JobFailedError,
    JobLookupError,
    JobNotFoundError,
    UnknownStateError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.lifecycle.events import (
    DEFAULT_NOT_FOUND_GRACE_S,
    DEFAULT_UNRECOGNISED_GRACE_S,
    EventStatus,
    JobEvent,
    JobHandle,
)
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle, record_dict
from airflow_provider_tao_slurm.lifecycle.links import WATCHED_JOB_KEY, SlurmJobLogsLink, SlurmJobResultsLink
from airflow_provider_tao_slurm.lifecycle.support import SlurmHookMixin, default_deferrable, resolve_secret
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

#: What the sensor needs from the submit operator's job handle.
HANDLE_KEYS = ("job_id", "slurm_job_id", "job_dir", "results_dir", "record_path", "results_base")


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str | None) -> float | None:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp() if text else None


class SlurmJobSensor(SlurmHookMixin, BaseSensorOperator):
    """Wait until a job submitted by :class:`SbatchSubmitOperator` is terminal; return its final record.

    The sensor waits and settles; the job's life (record, resubmission, cancel, sidecar) is
    :class:`~airflow_provider_tao_slurm.lifecycle.jobs.JobLifecycle`'s.

    Declare the results as an Airflow Asset (``outlets=[Asset("tao://team/classifier/train")]``) to
    schedule downstream DAGs on a finished training: the Asset event's extra carries the job's
    ``results_dir``, ``job_id``, ``slurm_job_id``, ``cluster``, ``gpu_hours`` and ``elapsed_seconds``.

    :param job: the job handle returned by ``SbatchSubmitOperator`` (usually its XCom).
    :param slurm_conn_id: the ``tao_slurm`` connection.
    :param poke_interval: seconds between status polls (shared per cluster when deferred).
    :param deferrable: wait in the triggerer instead of holding a worker slot; default: Airflow's
        ``[operators] default_deferrable`` (set it, or pass ``True``, to watch long trainings deferred).
    :param max_infra_retries: how many times an infrastructure failure (NODE_FAIL, GPU Xid, NCCL
        transport, ...) is resubmitted, avoiding the failed nodes.
    :param require_status_json: fail a COMPLETED job whose ``status.json`` does not say SUCCESS (missing
        included). Default: required for TAO jobs (any ``network_arch`` other than ``custom``, as the job
        record says), not for custom programs.
    :param not_found_grace: seconds a job may be unknown to squeue and sacct (accounting lag)
        before it is recorded UNKNOWN and the task fails.
    :param unrecognised_grace: seconds SLURM may report a state this provider does not know
        before the task fails naming it.
    """

    template_fields: Sequence[str] = ("job",)
    ui_color = "#76b900"
    operator_extra_links = (SlurmJobLogsLink(), SlurmJobResultsLink())

    def __init__(
        self,
        *,
        job: Mapping[str, Any] | str,
        slurm_conn_id: str = SlurmHook.default_conn_name,
        poke_interval: float = 30,
        deferrable: bool = default_deferrable(),
        max_infra_retries: int = 2,
        require_status_json: bool | None = None,
        not_found_grace: float = DEFAULT_NOT_FOUND_GRACE_S,
        unrecognised_grace: float = DEFAULT_UNRECOGNISED_GRACE_S,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("timeout", 60 * 60 * 24 * 365)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job = job
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = deferrable
        self.max_infra_retries = max_infra_retries
        self.require_status_json = require_status_json
        self.not_found_grace = not_found_grace
        self.unrecognised_grace = unrecognised_grace
        self._current: JobHandle | None = None
        self._first_missing: float | None = None
        self._strange_since: float | None = None

    @property
    def lifecycle(self) -> JobLifecycle:
        """The job-lifecycle layer over this sensor's hook."""
        return JobLifecycle(self.hook, self.log)

    # ------------------------------------------------------------------ deferrable path

    def execute(self, context: Any) -> Any:
        """Validate the handle, then defer to :class:`SlurmJobTrigger` (or poke when not deferrable)."""
        handle = JobHandle.from_dict(self.job)
        self._publish(context, handle)
        if not self.deferrable:
            self._current = handle
            return super().execute(context)
        self._defer(handle)
        return None

    @staticmethod
    def _publish(context: Any, handle: JobHandle) -> None:
        """Tell the extra links (and anyone reading XCom) which job this sensor is watching now."""
        context["ti"].xcom_push(key=WATCHED_JOB_KEY, value=handle.to_dict())

    def _defer(self, handle: JobHandle) -> None:
        self.defer(
            trigger=SlurmJobTrigger(
                slurm_conn_id=self.slurm_conn_id,
                slurm_job_id=handle.slurm_job_id,
                job_name=handle.job_id,
                poll_interval=float(self.poke_interval),
                submitted_at=_epoch(handle.submitted_at),
                not_found_grace=self.not_found_grace,
                sidecar_path=handle.sidecar_path,
                record_path=handle.record_path,
                unrecognised_grace=self.unrecognised_grace,
            ),
            method_name="execute_complete",
            kwargs={"job": handle.to_dict()},
            timeout=None,
        )

    def execute_complete(self, context: Any, event: Mapping[str, Any] | None = None, job: Any = None) -> Any:
        """Resume after the trigger fired: settle the record, maybe have the job resubmitted (and defer again)."""
        handle = JobHandle.from_dict(self.job if job is None else job)
        parsed = JobEvent.from_dict(event)
        if parsed.slurm_job_id != handle.slurm_job_id:
            raise ValidationError(
                f"trigger event is for job {parsed.slurm_job_id}, not {handle.slurm_job_id}; clear the task"
            )
        outcome = self._settle(context, handle, parsed)
        if isinstance(outcome, JobHandle):
            self._publish(context, outcome)
            self._defer(outcome)
        return outcome

    # ------------------------------------------------------------------ poke path

    def poke(self, context: Any) -> bool | PokeReturnValue:
        """One status query; settles the job when it is terminal, vanished or stuck in an unknown state."""
        handle = self._current or JobHandle.from_dict(self.job)
        now = datetime.now(UTC).timestamp()
        try:
            state = self.hook.get_states([handle.slurm_job_id]).get(handle.slurm_job_id)
        except JobLookupError as exc:
            # A failed query is no evidence that the job is gone: the not-found clock restarts.
            self._first_missing = None
            self.log.warning("SLURM status query failed, still waiting: %s", exc)
            return False
        event: JobEvent | None = None
        if state is None:
            self._first_missing = self._first_missing or now
            if now - self._first_missing > self.not_found_grace:
                event = JobEvent(
                    EventStatus.VANISHED,
                    handle.slurm_job_id,
                    handle.job_id,
                    message=f"SLURM job {handle.slurm_job_id} ({handle.job_id}) is unknown to squeue and sacct for "
                    f"{now - self._first_missing:.0f} s; check `sacct -j {handle.slurm_job_id}`",
                )
        else:
            self._first_missing = None
            self._strange_since = (self._strange_since or now) if state.tao_state is TaoState.UNKNOWN else None
            if self._strange_since is not None and now - self._strange_since >= self.unrecognised_grace:
                event = JobEvent(
                    EventStatus.UNRECOGNISED,
                    handle.slurm_job_id,
                    handle.job_id,
                    state,
                    message=f"SLURM reports job {handle.slurm_job_id} in state {state.raw_state.strip()!r}, which "
                    f"this provider does not know, for {now - self._strange_since:.0f} s; check `scontrol show job "
                    f"{handle.slurm_job_id}` and cancel it if it should not run",
                )
            elif state.is_terminal:
                event = JobEvent(EventStatus.TERMINAL, handle.slurm_job_id, handle.job_id, state)
            else:
                self.log.info("SLURM job %s: %s %s", handle.slurm_job_id, state.native, state.reason or "")
        if event is None:
            return False
        outcome = self._settle(context, handle, event)
        if isinstance(outcome, JobHandle):
            self._publish(context, outcome)
            self._current = outcome
            return False
        return PokeReturnValue(is_done=True, xcom_value=outcome)

    def on_kill(self) -> None:
        """A user killed the task waiting in a worker (``deferrable=False``): cancel, record CANCELED, drop the sidecar.

        A deferred sensor is killed through its trigger's ``on_kill`` instead; this one then has no job.
        """
        if self._current is not None:
            self.lifecycle.cancel(self._current, source="sensor on_kill")

    # ------------------------------------------------------------------ settling

    def _settle(self, context: Any, handle: JobHandle, event: JobEvent) -> dict[str, Any] | JobHandle:
        """Record what the trigger saw and the outcome; a JobHandle back means "resubmitted, watch this one"."""
        lifecycle = self.lifecycle
        record = self._observed(handle, lifecycle.require_record(handle), event)
        secrets = self._secret_values(handle)
        log_tail = self._show_logs(lifecycle, handle, secrets)
        if event.status is EventStatus.VANISHED:
            lifecycle.mark_unknown(handle, record, event.message, remove_sidecar=True)
            raise JobNotFoundError(event.message)
        if event.status is EventStatus.UNRECOGNISED:
            lifecycle.mark_unknown(handle, record, event.message, remove_sidecar=False)
            raise UnknownStateError(event.message)
        state = event.state
        assert state is not None  # JobEvent.from_dict guarantees it for TERMINAL
        usage = lifecycle.usage(handle.slurm_job_id)
        if usage is not None:
            record = dataclasses.replace(record, extra={**record.extra, "usage": usage.to_dict()})
            self._report_usage(handle, usage, state)
        if state.tao_state is TaoState.COMPLETE:
            result = self._completed(lifecycle, handle, record, state)
            result = {**result, **usage.to_dict()} if usage is not None else result
            self._announce(context, handle, result)
            return result
        if state.tao_state is TaoState.CANCELED:
            reason = f"SLURM job {state.job_id} ended {state.raw_state or state.native}"
            lifecycle.settle(handle, record, TaoState.CANCELED, message=reason)
            raise JobFailedError(f"{reason}; it was cancelled outside this task (scancel, preemption or an admin)")
        verdict = classify(state, log_tail)
        if verdict.retryable and handle.infra_retries < self.max_infra_retries:
            return lifecycle.resubmit(context["ti"], handle, record, state, verdict)
        lifecycle.settle(
            handle,
            record,
            TaoState.ERROR,
            message=f"{state.native} exit {state.exit_code}: {verdict.reason} [{verdict.evidence}]",
            err_class=verdict.err_class,
            exit_codes=self._exit_codes(handle, state.exit_code),
        )
        raise JobFailedError(
            f"SLURM job {state.job_id} failed ({verdict.err_class}): {verdict.reason}; evidence: {verdict.evidence}. "
            f"Logs: {handle.log_dir}",
            err_class=str(verdict.err_class),
        )

    def _observed(self, handle: JobHandle, record: JobRecord, event: JobEvent) -> JobRecord:
        """The record with the trigger's observations (a terminal record takes none)."""
        started = any(t.source == "trigger" and t.state == TaoState.RUNNING for t in record.transitions)
        for seen in event.transitions if record.terminal_state is None else ():
            started = started or seen.state is TaoState.RUNNING
            # The submit already recorded RUNNING ("submitted"); queue waits before the job first ran
            # are logged by the trigger, while PENDING after a real start (a requeue) is recorded.
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
        self, lifecycle: JobLifecycle, handle: JobHandle, record: JobRecord, state: JobState
    ) -> dict[str, Any]:
        verdict = status_verdict(self.hook.read_status_json(f"{handle.results_dir}/status.json"))
        exit_codes = self._exit_codes(handle, state.exit_code if state.exit_code is not None else 0)
        required = self.require_status_json
        if required is None:
            required = record.network_arch != "custom"  # a TAO job is COMPLETE only with status.json SUCCESS
        if verdict.ok is False or (verdict.ok is None and required):
            lifecycle.settle(
                handle,
                record,
                TaoState.ERROR,
                message=f"COMPLETED but {verdict.message}",
                err_class=ErrClass.ERR_PROGRAM,
                exit_codes=exit_codes,
            )
            raise JobFailedError(f"SLURM job {state.job_id} completed but {verdict.message}", err_class="ERR_PROGRAM")
        record = lifecycle.settle(
            handle,
            record,
            TaoState.COMPLETE,
            message=f"COMPLETED; status.json: {verdict.message}",
            backend_ref=handle.slurm_job_id,
            exit_codes=exit_codes,
        )
        self.log.info("Job %s complete; results in %s", handle.job_id, handle.results_dir)
        return record_dict(record)

    # ------------------------------------------------------------------ helpers

    def _announce(self, context: Any, handle: JobHandle, result: Mapping[str, Any]) -> None:
        """Give each Asset in ``outlets`` the finished job's results as its event's extra.

        A downstream DAG scheduled on the Asset finds them in ``triggering_asset_events``.
        """
        assets = [outlet for outlet in self.outlets if isinstance(outlet, Asset)]
        if not assets:
            return
        extra = {
            "results_dir": handle.results_dir,
            "job_id": handle.job_id,
            "slurm_job_id": handle.slurm_job_id,
            "cluster": handle.cluster,
            **{key: result[key] for key in ("gpu_hours", "elapsed_seconds") if key in result},
        }
        for asset in assets:
            context["outlet_events"][asset].extra.update(extra)

    def _report_usage(self, handle: JobHandle, usage: JobUsage, state: JobState) -> None:
        """The job's cost as the task log's summary line and as Airflow metrics (``tao_slurm.job.*``)."""
        self.log.info("%s", usage.summary(handle.slurm_job_id, f"{state.tao_state} ({state.native})"))
        tags = {"cluster": handle.cluster or "", "state": str(state.tao_state)}
        if usage.queue_seconds is not None:
            Stats.timing("tao_slurm.job.queue_time", timedelta(seconds=usage.queue_seconds), tags=tags)
        Stats.timing("tao_slurm.job.run_time", timedelta(seconds=usage.elapsed_seconds), tags=tags)
        Stats.gauge("tao_slurm.job.gpu_hours", usage.gpu_hours, tags=tags)
        Stats.incr("tao_slurm.job.gpu_seconds", round(usage.gpu_hours * 3600), tags=tags)

    def _show_logs(self, lifecycle: JobLifecycle, handle: JobHandle, secrets: list[str]) -> str:
        """Put the end of main.out/main.err (bounded, redacted) into the task log; return it for classification."""
        if not handle.log_dir:
            return ""
        tails: list[str] = []
        for name in ("main.out", "main.err"):
            path = f"{handle.log_dir}/{name}"
            text = lifecycle.log_tail(path, secrets=secrets)
            if text:
                self.log.info("---- %s (last %d bytes) ----\n%s", path, len(text.encode()), text)
            tails.append(text)
        return "\n".join(tails)

    def _secret_values(self, handle: JobHandle) -> list[str]:
        """The job's secrets, resolved from the handle's references, so a job that prints one is redacted."""
        values: list[str] = []
        for name, source in handle.secret_refs.items():
            try:
                values.append(resolve_secret(name, source))
            except Exception as exc:  # a reference unresolvable here still leaves pattern redaction
                self.log.warning("Cannot resolve secret_env[%s] for log redaction: %s", name, type(exc).__name__)
        return values

    def _exit_codes(self, handle: JobHandle, job_code: int | None) -> dict[str, Any] | None:
        """The job's exit code plus, for execution blocks, every child's (from the child exit-code file)."""
        codes: dict[str, Any] = {} if job_code is None else {"job": job_code}
        if handle.child_exit_code_path:
            text = self.hook.read_file(handle.child_exit_code_path)
            if text:
                codes["children"] = parse_child_exit_codes(text)
        return codes or None
