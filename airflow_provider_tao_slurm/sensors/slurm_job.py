"""``SlurmJobSensor``: wait for a submitted job (deferred when deferrable), then settle its record.

On the trigger's event it writes the observed transitions to the job record, shows the end of
the job's logs in the task log, checks ``status.json`` on success, classifies failures with
evidence and has infrastructure failures resubmitted by the job-lifecycle layer (new record,
``retry_of``, failed nodes excluded). A vanished job, or one stuck in a state nobody knows, is
recorded UNKNOWN and fails the task. The sensor itself submits nothing.

While it waits, the job's new ``main.out``/``main.err`` lines and ``status.json`` progress appear in
the task log at every poll. Given only a SLURM job id (a job submitted outside the provider), it
watches that job the same way, without a record, resubmission or cancel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseSensorOperator, PokeReturnValue

from airflow_provider_tao_slurm.core.defaults import (
    DEFAULT_BYTES_PER_POLL,
    DEFAULT_CONN_ID,
    DEFAULT_NOT_FOUND_GRACE_S,
    DEFAULT_UNRECOGNISED_GRACE_S,
)
from airflow_provider_tao_slurm.lifecycle.links import WATCHED_JOB_KEY, SlurmJobLogsLink, SlurmJobResultsLink
from airflow_provider_tao_slurm.lifecycle.support import (
    SerializeParamsOnceMixin,
    SlurmHookMixin,
    default_deferrable,
    resolve_secrets,
)

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.logstream import LineStream
    from airflow_provider_tao_slurm.core.records import JobRecord
    from airflow_provider_tao_slurm.core.states import JobState
    from airflow_provider_tao_slurm.core.usage import JobUsage
    from airflow_provider_tao_slurm.lifecycle.events import JobEvent, JobHandle
    from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

#: What the sensor needs from the submit operator's job handle.
HANDLE_KEYS = ("job_id", "slurm_job_id", "job_dir", "results_dir", "record_path", "results_base")
#: Bytes of each log shown when the job ends (what the live lines did not show yet, at most this).
FINAL_LOG_BYTES = 16384
#: The job's own logs in its log directory.
LOGS = ("main.out", "main.err")


def _watch_tag(context: Any) -> str:
    """A short name for this task try: its live-log cursors are its own (a new try shows the logs afresh)."""
    ti = context["ti"]
    ident = f"{ti.dag_id}|{ti.task_id}|{ti.run_id}|{getattr(ti, 'map_index', -1)}|{getattr(ti, 'try_number', 0)}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str | None) -> float | None:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp() if text else None


class SlurmJobSensor(SlurmHookMixin, SerializeParamsOnceMixin, BaseSensorOperator):
    """Wait until a job submitted by :class:`SbatchSubmitOperator` is terminal; return its final record.

    The sensor waits and settles; the job's life (record, resubmission, cancel, sidecar) is
    :class:`~airflow_provider_tao_slurm.lifecycle.jobs.JobLifecycle`'s.

    Declare the results as an Airflow Asset (``outlets=[Asset("tao://team/classifier/train")]``) to
    schedule downstream DAGs on a finished training: the Asset event's extra carries the job's
    ``results_dir``, ``job_id``, ``slurm_job_id``, ``cluster``, ``gpu_hours`` and ``elapsed_seconds``.

    :param job: the job handle returned by ``SbatchSubmitOperator`` (usually its XCom).
    :param slurm_job_id: instead of ``job``, the id of a job submitted outside this provider: it is
        watched (state, live logs, cost) and its end decides the task, but it has no record, is never
        resubmitted and a user kill leaves it running.
    :param slurm_conn_id: the ``tao_slurm`` connection.
    :param poke_interval: seconds between status polls (shared per cluster when deferred).
    :param deferrable: wait in the triggerer instead of holding a worker slot; default: Airflow's
        ``[operators] default_deferrable`` (set it, or pass ``True``, to watch long trainings deferred).
    :param max_infra_retries: how many times an infrastructure failure (NODE_FAIL, GPU Xid, NCCL
        transport, ...) is resubmitted, avoiding the failed nodes.
    :param require_status_json: fail a COMPLETED job whose ``status.json`` does not say SUCCESS (missing
        included). Default: required for TAO actions, as the job record says (any ``network_arch`` other than
        ``custom``: ``SbatchSubmitOperator`` records one for a TAO image or entry point unless told
        ``network_arch="custom"``), not for plain container jobs.
    :param not_found_grace: seconds a job may be unknown to squeue and sacct (accounting lag)
        before it is recorded UNKNOWN and the task fails.
    :param unrecognised_grace: seconds SLURM may report a state this provider does not know
        before the task fails naming it.
    :param stream_logs: show the job's new log lines and ``status.json`` progress in the task log
        while it runs.
    :param log_bytes_per_poll: bytes of each log read per poll at most: a job writing faster has the
        excess skipped (the task log says so; the whole log stays on the cluster).
    """

    template_fields: Sequence[str] = ("job", "slurm_job_id")
    ui_color = "#76b900"
    operator_extra_links = (SlurmJobLogsLink(), SlurmJobResultsLink())

    def __init__(
        self,
        *,
        job: Mapping[str, Any] | str | None = None,
        slurm_job_id: str | int | None = None,
        slurm_conn_id: str = DEFAULT_CONN_ID,
        poke_interval: float = 30,
        deferrable: bool = default_deferrable(),
        max_infra_retries: int = 2,
        require_status_json: bool | None = None,
        not_found_grace: float = DEFAULT_NOT_FOUND_GRACE_S,
        unrecognised_grace: float = DEFAULT_UNRECOGNISED_GRACE_S,
        stream_logs: bool = True,
        log_bytes_per_poll: int = DEFAULT_BYTES_PER_POLL,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("timeout", 60 * 60 * 24 * 365)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job = job
        self.slurm_job_id = slurm_job_id
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = deferrable
        self.max_infra_retries = max_infra_retries
        self.require_status_json = require_status_json
        self.not_found_grace = not_found_grace
        self.unrecognised_grace = unrecognised_grace
        self.stream_logs = stream_logs
        self.log_bytes_per_poll = log_bytes_per_poll
        self._current: JobHandle | None = None
        self._foreign: dict[str, Any] | None = None
        self._streams: list[LineStream] = []
        self._first_missing: float | None = None
        self._strange_since: float | None = None
        self._unaccounted_since: float | None = None
        self._withheld: set[str] = set()  # jobs whose unresolved secrets were already reported

    @property
    def lifecycle(self) -> JobLifecycle:
        """The job-lifecycle layer over this sensor's hook."""
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        return JobLifecycle(self.hook, self.log)

    # ------------------------------------------------------------------ deferrable path

    def execute(self, context: Any) -> Any:
        """Validate the handle, then defer to :class:`SlurmJobTrigger` (or poke when not deferrable)."""
        from airflow_provider_tao_slurm.exceptions import ValidationError
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle

        if (self.job is None) == (self.slurm_job_id is None):
            raise ValidationError(
                "give SlurmJobSensor either job (SbatchSubmitOperator's output) or slurm_job_id (a job "
                "submitted outside the provider), not both and not neither"
            )
        if self.slurm_job_id is not None:
            return self._watch_foreign(context)
        handle = JobHandle.from_dict(self.job)
        self._publish(context, handle)
        streams = self._live_streams(context, handle)
        if not self.deferrable:
            self._current = handle
            self._streams = self._line_streams(streams, self._secret_values(handle))
            return super().execute(context)
        self._defer(handle, streams)
        return None

    @staticmethod
    def _publish(context: Any, handle: JobHandle) -> None:
        """Tell the extra links (and anyone reading XCom) which job this sensor is watching now."""
        context["ti"].xcom_push(key=WATCHED_JOB_KEY, value=handle.to_dict())

    def _defer(self, handle: JobHandle, streams: list[dict[str, str | None]]) -> None:
        from airflow_provider_tao_slurm.core.layout import ends_dir
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

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
                log_streams=streams,
                log_bytes_per_poll=self.log_bytes_per_poll,
                secret_refs=dict(handle.secret_refs),
                end_marker_dir=ends_dir(handle.results_base),
            ),
            method_name="execute_complete",
            kwargs={"job": handle.to_dict()},
            timeout=None,
        )

    def execute_complete(
        self,
        context: Any,
        event: Mapping[str, Any] | None = None,
        job: Any = None,
        foreign: Mapping[str, Any] | None = None,
    ) -> Any:
        """Resume after the trigger fired: settle the record, maybe have the job resubmitted (and defer again)."""
        from airflow_provider_tao_slurm.exceptions import ValidationError
        from airflow_provider_tao_slurm.lifecycle.events import JobEvent, JobHandle

        parsed = JobEvent.from_dict(event)
        if foreign is not None:
            return self._settle_foreign(dict(foreign), parsed)
        handle = JobHandle.from_dict(self.job if job is None else job)
        if parsed.slurm_job_id != handle.slurm_job_id:
            raise ValidationError(
                f"trigger event is for job {parsed.slurm_job_id}, not {handle.slurm_job_id}; clear the task"
            )
        outcome = self._settle(context, handle, parsed)
        if isinstance(outcome, JobHandle):
            self._publish(context, outcome)
            self._defer(outcome, self._live_streams(context, outcome))
        return outcome

    # ------------------------------------------------------------------ live logs

    def _live_streams(self, context: Any, handle: JobHandle) -> list[dict[str, str | None]]:
        """The files shown live (``main.out``, ``main.err``, ``status.json``), each with its cursor in the log dir."""
        from airflow_provider_tao_slurm.core.logstream import PROGRESS

        if not self.stream_logs or not handle.log_dir:
            return []
        tag = _watch_tag(context)
        paths = {name: f"{handle.log_dir}/{name}" for name in LOGS}
        paths[PROGRESS] = f"{handle.results_dir}/status.json"
        return [
            {"label": label, "path": path, "cursor_path": f"{handle.log_dir}/.live-{tag}.{label}.offset"}
            for label, path in paths.items()
        ]

    def _line_streams(self, streams: list[dict[str, str | None]], secrets: Sequence[str] | None) -> list[LineStream]:
        """The live streams, redacting ``secrets``; none when the job's secrets did not resolve (None)."""
        from airflow_provider_tao_slurm.core.logstream import LineStream

        if secrets is None:
            return []
        return [
            LineStream(
                str(item["label"]),
                str(item["path"]),
                item.get("cursor_path"),
                max_bytes=self.log_bytes_per_poll,
                secrets=tuple(secrets),
            )
            for item in streams
        ]

    def _follow(self) -> None:
        """Poke path: show the new lines of the job's logs (one batched read)."""
        if not self._streams:
            return
        try:
            chunks = self.hook.tail_many([stream.request() for stream in self._streams])
        except Exception as exc:  # the next poke reads the same bytes again
            self.log.warning("Reading the job's logs failed (read again next poke): %s", exc)
            return
        for stream, chunk in zip(self._streams, chunks, strict=True):
            for line in stream.feed(chunk):
                self.log.info("%s", line)

    def _shown_offsets(self) -> dict[str, int]:
        shown = {stream.label: stream.shown_offset for stream in self._streams}
        return {label: offset for label, offset in shown.items() if offset is not None}

    # ------------------------------------------------------------------ a job submitted elsewhere

    def _watch_foreign(self, context: Any) -> Any:
        """Watch a job known only by its SLURM id: its log paths come from ``scontrol show job``."""
        from airflow_provider_tao_slurm.core.records import check_slurm_job_id
        from airflow_provider_tao_slurm.exceptions import JobNotFoundError
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

        slurm_job_id = check_slurm_job_id(str(self.slurm_job_id).strip())
        info = self.hook.describe_job(slurm_job_id)
        if not info and slurm_job_id not in self.hook.get_states([slurm_job_id]):
            cluster = self.hook.settings.cluster_name or self.hook.settings.hosts[0]
            raise JobNotFoundError(
                f"SLURM job {slurm_job_id} is unknown to scontrol, squeue and sacct on {cluster}; "
                "check the id and that the connection points at the cluster that runs it"
            )
        paths = {"stdout": info.get("StdOut") or "", "stderr": info.get("StdErr") or ""}
        if paths["stderr"] == paths["stdout"]:
            del paths["stderr"]
        logs = {label: path for label, path in paths.items() if path.startswith("/")}
        tag = _watch_tag(context)
        streams: list[dict[str, str | None]] = [
            {
                "label": label,
                "path": path,
                "cursor_path": f"{posixpath.dirname(path)}/.live-{tag}.{slurm_job_id}.{label}.offset",
            }
            for label, path in logs.items()
        ]
        foreign = {"slurm_job_id": slurm_job_id, "job_name": info.get("JobName", ""), "logs": logs}
        self.log.info(
            "Watching SLURM job %s (%s, owner %s), submitted outside this provider: no record, no resubmission, "
            "a user kill leaves it running; logs: %s",
            slurm_job_id,
            foreign["job_name"] or "name unknown",
            info.get("UserId") or "unknown",
            ", ".join(logs.values()) or "unknown (slurmctld no longer knows the job)",
        )
        context["ti"].xcom_push(
            key=WATCHED_JOB_KEY,
            value={
                "slurm_job_id": slurm_job_id,
                "job_id": foreign["job_name"],
                "cluster": self.hook.settings.cluster_name,
                "log_dir": posixpath.dirname(logs["stdout"]) if "stdout" in logs else None,
                "results_dir": info.get("WorkDir") or None,
            },
        )
        if not self.stream_logs:
            streams = []
        if not self.deferrable:
            self._foreign = foreign
            self._streams = self._line_streams(streams, ())
            return super().execute(context)
        self.defer(
            trigger=SlurmJobTrigger(
                slurm_conn_id=self.slurm_conn_id,
                slurm_job_id=slurm_job_id,
                job_name="",
                poll_interval=float(self.poke_interval),
                not_found_grace=self.not_found_grace,
                unrecognised_grace=self.unrecognised_grace,
                log_streams=streams,
                log_bytes_per_poll=self.log_bytes_per_poll,
                cancel_on_kill=False,
            ),
            method_name="execute_complete",
            kwargs={"foreign": foreign},
            timeout=None,
        )
        return None

    def _settle_foreign(self, foreign: dict[str, Any], event: JobEvent) -> dict[str, Any]:
        """The end of a job submitted elsewhere: its outcome, logs and cost; nothing recorded or resubmitted."""
        from airflow_provider_tao_slurm.core.failures import classify
        from airflow_provider_tao_slurm.core.states import TaoState
        from airflow_provider_tao_slurm.exceptions import (
            JobFailedError,
            JobNotFoundError,
            UnknownStateError,
            ValidationError,
        )
        from airflow_provider_tao_slurm.lifecycle.events import EventStatus

        slurm_job_id = str(foreign["slurm_job_id"])
        if event.slurm_job_id != slurm_job_id:
            raise ValidationError(f"trigger event is for job {event.slurm_job_id}, not {slurm_job_id}; clear the task")
        tails = [
            self._show_log(label, str(path), (), event.log_offsets.get(label))
            for label, path in dict(foreign.get("logs") or {}).items()
        ]
        if event.status is EventStatus.VANISHED:
            raise JobNotFoundError(event.message)
        if event.status is EventStatus.UNRECOGNISED:
            raise UnknownStateError(event.message)
        state = event.state
        assert state is not None  # JobEvent.from_dict guarantees it for TERMINAL
        usage = self.lifecycle.usage(slurm_job_id)
        if usage is not None:
            self.log.info("%s", usage.summary(slurm_job_id, f"{state.tao_state} ({state.native})"))
        if state.tao_state is TaoState.CANCELED:
            raise JobFailedError(f"SLURM job {slurm_job_id} ended {state.raw_state or state.native}")
        if state.tao_state is not TaoState.COMPLETE:
            verdict = classify(state, "\n".join(tails))
            raise JobFailedError(
                f"SLURM job {slurm_job_id} failed ({verdict.err_class}): {verdict.reason}; "
                f"evidence: {verdict.evidence}",
                err_class=str(verdict.err_class),
            )
        result = {
            "slurm_job_id": slurm_job_id,
            "job_name": foreign.get("job_name") or "",
            "terminal_state": str(state.tao_state),
            "native_state": state.native,
            "exit_code": state.exit_code,
            "node_list": state.node_list,
        }
        return {**result, **usage.to_dict()} if usage is not None else result

    # ------------------------------------------------------------------ poke path

    def poke(self, context: Any) -> bool | PokeReturnValue:
        """One status query; settles the job when it is terminal, vanished or stuck in an unknown state."""
        from airflow_provider_tao_slurm.core.states import TaoState
        from airflow_provider_tao_slurm.exceptions import JobLookupError
        from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent, JobHandle

        if self._foreign is not None:
            return self._poke_foreign(self._foreign)
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
            elif state.is_terminal and self._awaits_accounting(state, now):
                self.log.info(
                    "SLURM job %s ended %s; waiting for accounting's exit code", handle.slurm_job_id, state.native
                )
            elif state.is_terminal:
                self._follow()
                event = JobEvent(
                    EventStatus.TERMINAL, handle.slurm_job_id, handle.job_id, state, log_offsets=self._shown_offsets()
                )
            else:
                self._unaccounted_since = None
                self.log.info("SLURM job %s: %s %s", handle.slurm_job_id, state.native, state.reason or "")
                if state.tao_state is not TaoState.PENDING:
                    self._follow()
        if event is None:
            return False
        outcome = self._settle(context, handle, event)
        if isinstance(outcome, JobHandle):
            self._publish(context, outcome)
            self._current = outcome
            self._unaccounted_since = None
            self._streams = self._line_streams(self._live_streams(context, outcome), self._secret_values(outcome))
            return False
        return PokeReturnValue(is_done=True, xcom_value=outcome)

    def _awaits_accounting(self, state: JobState, now: float) -> bool:
        """Whether a terminal state without accounting's full row (:attr:`JobState.accounted`) still waits for it."""
        from airflow_provider_tao_slurm.core.states import ACCOUNTING_SETTLE_S

        if state.accounted:
            return False
        self._unaccounted_since = self._unaccounted_since or now
        return now - self._unaccounted_since < ACCOUNTING_SETTLE_S

    def _poke_foreign(self, foreign: dict[str, Any]) -> bool | PokeReturnValue:
        from airflow_provider_tao_slurm.core.states import TaoState
        from airflow_provider_tao_slurm.exceptions import JobLookupError
        from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent

        slurm_job_id = str(foreign["slurm_job_id"])
        try:
            state = self.hook.get_states([slurm_job_id]).get(slurm_job_id)
        except JobLookupError as exc:
            self.log.warning("SLURM status query failed, still waiting: %s", exc)
            return False
        if state is not None and state.tao_state is not TaoState.PENDING:
            self._follow()
        if state is None or not state.is_terminal:
            return False
        if self._awaits_accounting(state, datetime.now(UTC).timestamp()):
            return False
        event = JobEvent(EventStatus.TERMINAL, slurm_job_id, "", state, log_offsets=self._shown_offsets())
        return PokeReturnValue(is_done=True, xcom_value=self._settle_foreign(foreign, event))

    def on_kill(self) -> None:
        """A user killed the task waiting in a worker (``deferrable=False``): cancel, record CANCELED, drop the sidecar.

        A deferred sensor is killed through its trigger's ``on_kill`` instead; this one then has no job.
        """
        if self._current is not None:
            self.lifecycle.cancel(self._current, source="sensor on_kill")

    # ------------------------------------------------------------------ settling

    def _settle(self, context: Any, handle: JobHandle, event: JobEvent) -> dict[str, Any] | JobHandle:
        """Record what the trigger saw and the outcome; a JobHandle back means "resubmitted, watch this one"."""
        from airflow_provider_tao_slurm.core.continuation import ends_slice
        from airflow_provider_tao_slurm.core.failures import classify
        from airflow_provider_tao_slurm.core.states import TaoState
        from airflow_provider_tao_slurm.exceptions import JobFailedError, JobNotFoundError, UnknownStateError
        from airflow_provider_tao_slurm.lifecycle.events import EventStatus
        from airflow_provider_tao_slurm.lifecycle.jobs import chain_summary

        lifecycle = self.lifecycle
        record = self._observed(handle, lifecycle.require_record(handle), event)
        secrets = self._secret_values(handle)
        log_tail = self._show_logs(handle, secrets, event.log_offsets)
        if event.status is EventStatus.UNRECOGNISED:
            lifecycle.mark_unknown(handle, record, event.message, remove_sidecar=False)
            raise UnknownStateError(event.message)
        state = event.state if event.status is EventStatus.TERMINAL else lifecycle.end_evidence(handle)
        if state is None:  # vanished, and its own files do not show how it ended
            lifecycle.mark_unknown(handle, record, event.message, remove_sidecar=True)
            raise JobNotFoundError(event.message)
        if event.status is EventStatus.VANISHED:
            self.log.warning(
                "%s; its batch script's end marker and exit-code file show that it ended %s with exit code %s "
                "(accounting lags): settled on that evidence",
                event.message,
                state.native,
                state.exit_code,
            )
        usage = lifecycle.usage(handle.slurm_job_id)
        if usage is not None:
            record = dataclasses.replace(record, extra={**record.extra, "usage": usage.to_dict()})
            self._report_usage(handle, usage, state)
        if handle.max_continuations and ends_slice(state.native, state.exit_code):
            return lifecycle.continue_slice(context["ti"], handle, record, state, usage)
        chain = chain_summary(handle, state, usage) if handle.max_continuations else {}
        if chain:  # the last slice's record carries the whole chain
            record = dataclasses.replace(record, extra={**record.extra, **chain})
        if state.tao_state is TaoState.COMPLETE:
            result = self._completed(lifecycle, handle, record, state)
            result = {**result, **usage.to_dict()} if usage is not None else result
            result = {**result, **chain}
            self._announce(context, handle, result)
            return result
        if state.tao_state is TaoState.CANCELED:
            reason = f"SLURM job {state.job_id} ended {state.raw_state or state.native}"
            lifecycle.settle(handle, record, TaoState.CANCELED, message=reason)
            raise JobFailedError(f"{reason}; it was cancelled outside this task (scancel, preemption or an admin)")
        verdict = classify(state, log_tail)
        if verdict.retryable and handle.infra_retries < self.max_infra_retries:
            return lifecycle.resubmit(context["ti"], handle, record, state, verdict, usage)
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
        from airflow_provider_tao_slurm.core.records import mark
        from airflow_provider_tao_slurm.core.states import TaoState

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
        from airflow_provider_tao_slurm.core.states import ErrClass, TaoState
        from airflow_provider_tao_slurm.core.status import status_verdict
        from airflow_provider_tao_slurm.core.tao import is_tao_action
        from airflow_provider_tao_slurm.exceptions import JobFailedError
        from airflow_provider_tao_slurm.lifecycle.jobs import record_dict

        verdict = status_verdict(self.hook.read_status_json(f"{handle.results_dir}/status.json"))
        exit_codes = self._exit_codes(handle, state.exit_code if state.exit_code is not None else 0)
        required = self.require_status_json
        if required is None:
            required = is_tao_action(record.network_arch)  # a TAO action is COMPLETE only with status.json SUCCESS
        if verdict.ok is False or (verdict.ok is None and required):
            lifecycle.settle(
                handle,
                record,
                TaoState.ERROR,
                message=f"COMPLETED but {verdict.message}",
                err_class=ErrClass.ERR_PROGRAM,
                exit_codes=exit_codes,
            )
            why = (
                f": a TAO action (network_arch {record.network_arch!r} in its record) is COMPLETE only when its "
                "status.json says SUCCESS. If it is a plain container job, pass network_arch='custom' to "
                "SbatchSubmitOperator (or require_status_json=False to this sensor)"
                if verdict.ok is None and self.require_status_json is None
                else ""
            )
            raise JobFailedError(
                f"SLURM job {state.job_id} completed but {verdict.message}{why}", err_class="ERR_PROGRAM"
            )
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
        from airflow.sdk.observability.stats import Stats

        self.log.info("%s", usage.summary(handle.slurm_job_id, f"{state.tao_state} ({state.native})"))
        tags = {"cluster": handle.cluster or "", "state": str(state.tao_state)}
        if usage.queue_seconds is not None:
            Stats.timing("tao_slurm.job.queue_time", timedelta(seconds=usage.queue_seconds), tags=tags)
        Stats.timing("tao_slurm.job.run_time", timedelta(seconds=usage.elapsed_seconds), tags=tags)
        Stats.gauge("tao_slurm.job.gpu_hours", usage.gpu_hours, tags=tags)
        Stats.incr("tao_slurm.job.gpu_seconds", round(usage.gpu_hours * 3600), tags=tags)

    def _show_logs(self, handle: JobHandle, secrets: list[str] | None, shown: Mapping[str, int]) -> str:
        """Show what the live lines did not of main.out/main.err; return their ends for classification.

        With ``secrets`` None (the job's secrets did not resolve here) nothing is shown.
        """
        if not handle.log_dir:
            return ""
        if secrets is None:
            return "\n".join(self.lifecycle.log_tail(f"{handle.log_dir}/{name}", FINAL_LOG_BYTES) for name in LOGS)
        return "\n".join(self._show_log(name, f"{handle.log_dir}/{name}", secrets, shown.get(name)) for name in LOGS)

    def _show_log(self, label: str, path: str, secrets: Sequence[str], shown: int | None) -> str:
        """Log the part of ``path`` after ``shown`` (or its end), line by line as the live lines are; return its end.

        Each line is cleaned like a live line (bounded, no escapes, redacted, a private key over many lines
        too, prefixed with the label), so a job's output cannot forge task-log lines.
        """
        from airflow_provider_tao_slurm.core.logstream import clean_stream_line

        tail = self.lifecycle.log_tail(path, FINAL_LOG_BYTES, secrets=secrets)
        if shown is None:
            rest = tail
            heading = f"last {len(tail.encode())} bytes"
        else:
            chunk = self.hook.read_log(path, shown, FINAL_LOG_BYTES)
            rest = chunk.data if not chunk.restarted else tail
            heading = "after the live lines"
        if rest.strip():
            self.log.info("---- %s (%s) ----", path, heading)
            in_key = False
            for line in rest.splitlines():
                cleaned, in_key = clean_stream_line(line, secrets, in_key)
                self.log.info("%s | %s", label, cleaned)
        return tail

    def _secret_values(self, handle: JobHandle) -> list[str] | None:
        """The job's secrets, resolved from the handle's references, so a job that prints one is redacted.

        None (said once per job) when one does not resolve here: pattern redaction alone would show that
        secret if the job printed it, so the job's log lines are not shown (they stay in its files).
        """
        values, failed = resolve_secrets(handle.secret_refs)
        if failed and handle.slurm_job_id not in self._withheld:
            self._withheld.add(handle.slurm_job_id)
            self.log.warning(
                "Cannot resolve %s on this worker (%s): the log lines of SLURM job %s are not shown in the task "
                "log, so that a secret it prints cannot show; they stay in %s",
                ", ".join(f"secret_env[{name}]" for name in failed),
                ", ".join(sorted(set(failed.values()))),
                handle.slurm_job_id,
                handle.log_dir or "the job's log directory",
            )
        return None if failed else values

    def _exit_codes(self, handle: JobHandle, job_code: int | None) -> dict[str, Any] | None:
        """The job's exit code plus, for execution blocks, every child's (from the child exit-code file)."""
        from airflow_provider_tao_slurm.core.execution import parse_child_exit_codes

        codes: dict[str, Any] = {} if job_code is None else {"job": job_code}
        if handle.child_exit_code_path:
            text = self.hook.read_file(handle.child_exit_code_path)
            if text:
                codes["children"] = parse_child_exit_codes(text)
        return codes or None
