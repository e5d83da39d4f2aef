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
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cached_property
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
    renamed_parameter,
)

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.lifecycle.events import JobEvent, JobHandle
    from airflow_provider_tao_slurm.lifecycle.following import LiveLogs
    from airflow_provider_tao_slurm.lifecycle.foreign import ForeignJob
    from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
    from airflow_provider_tao_slurm.lifecycle.settle import Settlement
    from airflow_provider_tao_slurm.lifecycle.watch import Watch

#: What the sensor needs from the submit operator's job handle.
HANDLE_KEYS = ("job_id", "slurm_job_id", "job_dir", "results_dir", "record_path", "results_base")


def _watch_tag(context: Any) -> str:
    """Return a short name for this task try: its live-log cursors are its own (a new try shows the logs afresh)."""
    ti = context["ti"]
    ident = f"{ti.dag_id}|{ti.task_id}|{ti.run_id}|{getattr(ti, 'map_index', -1)}|{getattr(ti, 'try_number', 0)}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def _events_dir(directory: str) -> str:
    """Return where the triggers leave their full events under ``directory``.

    ``directory`` is the job's directory, or the connection's results dir for a job submitted elsewhere.
    The compact event names its file there; ``execute_complete`` reads it from the directory it knows
    (never from a path the event gives, nor from a deferral kwarg, which ``airflow dags test`` drops).
    """
    return f"{directory}/events"


def _event_path(events_dir: str, slurm_job_id: str) -> str:
    """Return a new file in ``events_dir`` for the full event of one deferral's trigger.

    A new name per deferral: no two watches of a job (tries, sensors) share one.
    """
    return f"{events_dir}/{slurm_job_id}-{uuid.uuid4().hex[:12]}.json"


def _check_event_job(event: JobEvent, handle: JobHandle, source: str) -> None:
    """Refuse a trigger event about another job than ``handle`` (the one the sensor deferred on).

    The event names its job by SLURM id, and a full event by name too (``job_name``, our job id): both
    must be ``handle``'s, so that a stale event (an earlier slice's, a reused SLURM id) ends nothing.

    :param source: where ``handle`` was read, for the message.
    :raises ValidationError: naming both jobs.
    """
    from airflow_provider_tao_slurm.exceptions import ValidationError

    if event.slurm_job_id != handle.slurm_job_id:
        raise ValidationError(
            f"trigger event is for job {event.slurm_job_id}, not {handle.slurm_job_id}; clear the task (SLURM job "
            f"{handle.slurm_job_id} is {source}; an event of another job settles nothing)"
        )
    if event.job_name and event.job_name != handle.job_id:
        raise ValidationError(
            f"trigger event for SLURM job {event.slurm_job_id} names the job {event.job_name}, not {handle.job_id}; "
            f"clear the task ({handle.job_id} is {source}; an event of another job settles nothing)"
        )


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
    :param not_found_grace_seconds: seconds a job may be unknown to squeue and sacct (accounting lag)
        before it is recorded UNKNOWN and the task fails (old name ``not_found_grace``, deprecated).
    :param unrecognised_grace_seconds: seconds SLURM may report a state this provider does not know
        before the task fails naming it (old name ``unrecognised_grace``, deprecated).
    :param stream_logs: show the job's new log lines and ``status.json`` progress in the task log
        while it runs.
    :param log_bytes_per_poll: bytes of each log read per poll at most: a job writing faster has the
        excess skipped (the task log says so; the whole log stays on the cluster).
    """

    template_fields: Sequence[str] = ("job", "slurm_job_id")
    ui_color = "#76b900"
    operator_extra_links = (SlurmJobLogsLink(), SlurmJobResultsLink())
    #: The links read the watched job's handle (``watched_job`` XCom) first.
    publishes_watched_job = True

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
        not_found_grace_seconds: float = DEFAULT_NOT_FOUND_GRACE_S,
        unrecognised_grace_seconds: float = DEFAULT_UNRECOGNISED_GRACE_S,
        stream_logs: bool = True,
        log_bytes_per_poll: int = DEFAULT_BYTES_PER_POLL,
        **kwargs: Any,
    ) -> None:
        not_found_grace_seconds = renamed_parameter(
            kwargs, "not_found_grace", "not_found_grace_seconds", not_found_grace_seconds, DEFAULT_NOT_FOUND_GRACE_S
        )
        unrecognised_grace_seconds = renamed_parameter(
            kwargs,
            "unrecognised_grace",
            "unrecognised_grace_seconds",
            unrecognised_grace_seconds,
            DEFAULT_UNRECOGNISED_GRACE_S,
        )
        kwargs.setdefault("timeout", 60 * 60 * 24 * 365)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job = job
        self.slurm_job_id = slurm_job_id
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = deferrable
        self.max_infra_retries = max_infra_retries
        self.require_status_json = require_status_json
        self.not_found_grace_seconds = not_found_grace_seconds
        self.unrecognised_grace_seconds = unrecognised_grace_seconds
        self.stream_logs = stream_logs
        self.log_bytes_per_poll = log_bytes_per_poll
        self._current: JobHandle | None = None
        self._foreign: ForeignJob | None = None
        self._watch: Watch | None = None

    @property
    def lifecycle(self) -> JobLifecycle:
        """The job-lifecycle layer over this sensor's hook."""
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        return JobLifecycle(self.hook, self.log)

    @cached_property
    def _live(self) -> LiveLogs:
        """The job's logs as this sensor follows them in the worker, and the jobs whose lines it withholds."""
        from airflow_provider_tao_slurm.lifecycle.following import LiveLogs

        return LiveLogs("on this worker")

    @property
    def settlement(self) -> Settlement:
        """How this sensor's jobs are settled once their wait is over (its retry and status.json rules)."""
        from airflow_provider_tao_slurm.lifecycle.settle import Settlement

        return Settlement(
            self.lifecycle, max_infra_retries=self.max_infra_retries, require_status_json=self.require_status_json
        )

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
        if not self.deferrable and self.mode == "reschedule":
            raise ValidationError(
                "SlurmJobSensor does not support mode='reschedule': each reschedule starts a new sensor, which "
                "would forget the job it resubmitted and how long the job has been missing or in an unknown "
                "state. Use deferrable=True (the wait moves to the triggerer and frees the worker slot, as "
                "reschedule would) or mode='poke'"
            )
        if self.slurm_job_id is not None:
            return self._watch_foreign(context)
        handle = self._resumed(context, JobHandle.from_dict(self.job))
        self._current = handle  # what a stop cancels: Ctrl-C here, SIGTERM while the trigger runs inline
        try:
            self._publish(context, handle)
            streams = self._live_streams(context, handle)
            if not self.deferrable:
                self._start_watch(handle)
                self._live.follow(streams, self._secret_values(handle), self.log_bytes_per_poll)
                return super().execute(context)
            self._defer(handle, streams)
        except KeyboardInterrupt:  # Ctrl-C (airflow dags test), or SIGINT forwarded by the supervisor
            self.on_kill()
            raise
        return None

    def _resumed(self, context: Any, root: JobHandle) -> JobHandle:
        """Return the job to watch: the newest one an earlier try of this sensor watched, else ``root``.

        An earlier try that had the job resubmitted (or its next slice started) stored that job in
        Airflow's task state store; this try goes on with it instead of settling the chain again.
        """
        from airflow_provider_tao_slurm.lifecycle.resume import watched_since

        newer = watched_since(context, root)
        if newer is None:
            return root
        self.log.info(
            "Going on with SLURM job %s (%s), which an earlier try of this sensor watched (task state store)",
            newer.slurm_job_id,
            newer.job_id,
        )
        return newer

    def _publish(self, context: Any, handle: JobHandle) -> None:
        """Tell the extra links, XCom readers and this task's later tries which job this sensor is watching now."""
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle
        from airflow_provider_tao_slurm.lifecycle.resume import remember_watched

        context["ti"].xcom_push(key=WATCHED_JOB_KEY, value=handle.to_dict())
        remember_watched(context, JobHandle.from_dict(self.job), handle)

    def _defer(self, handle: JobHandle, streams: list[dict[str, str | None]]) -> None:
        """Defer to the trigger; it leaves the full event in the job's ``events`` directory, a new file per deferral."""
        from airflow_provider_tao_slurm.core.layout import ends_dir
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

        event_path = _event_path(_events_dir(handle.job_dir), handle.slurm_job_id)
        self._current = handle  # a resumed sensor defers on the next job here: a SIGTERM under dags test cancels it
        self.defer(
            trigger=SlurmJobTrigger(
                slurm_conn_id=self.slurm_conn_id,
                slurm_job_id=handle.slurm_job_id,
                job_name=handle.job_id,
                poll_interval=float(self.poke_interval),
                submitted_at=_epoch(handle.submitted_at),
                not_found_grace=self.not_found_grace_seconds,
                sidecar_path=handle.sidecar_path,
                record_path=handle.record_path,
                unrecognised_grace=self.unrecognised_grace_seconds,
                log_streams=streams,
                log_bytes_per_poll=self.log_bytes_per_poll,
                secret_refs=dict(handle.secret_refs),
                end_marker_dir=ends_dir(handle.results_base),
                event_path=event_path,
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
        """Resume after the trigger fired: settle the record, maybe have the job resubmitted (and defer again).

        A compact event is read whole from the file it names in the job's ``events`` directory (the
        connection's results dir's for a job submitted elsewhere), where the trigger wrote it and where it stays.

        The job the event must be about is the one this sensor last deferred on (see :meth:`_deferred_on`):
        ``airflow dags test`` resumes with the event alone, without the deferral's ``job``.
        """
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle
        from airflow_provider_tao_slurm.lifecycle.foreign import ForeignJob, settle_foreign

        if foreign is not None:
            parsed = self.settlement.trigger_event(event, self._foreign_events_dir())
            return settle_foreign(self.settlement, ForeignJob.from_dict(dict(foreign)), parsed)
        handle, source = self._deferred_on(context, job)
        parsed = self.settlement.trigger_event(event, _events_dir(handle.job_dir))
        _check_event_job(parsed, handle, source)
        outcome = self._settle(context, handle, parsed)
        if isinstance(outcome, JobHandle):
            self._publish(context, outcome)
            self._defer(outcome, self._live_streams(context, outcome))
        return outcome

    def _deferred_on(self, context: Any, job: Any) -> tuple[JobHandle, str]:
        """Return the job this sensor last deferred on, and where that was read (for messages).

        The sensor stores the job it watches in Airflow's task state store right before each deferral
        (:meth:`_publish`), so the stored job is the last one deferred on, whether or not the resume
        carries the deferral's kwargs: the real triggerer passes them (``job``), ``airflow dags test``
        (``dag.test()``) passes the event alone. Without a stored job (no store in the context), the
        deferral's ``job``, else the submitted job (``job`` of this sensor).

        :raises ValidationError: when the deferral's ``job`` names another job than the stored one: the
            deferral is older than the sensor's last one (a stale resume), and settling its job again could
            end a slice the sensor has already followed with the next.
        """
        from airflow_provider_tao_slurm.exceptions import ValidationError
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle
        from airflow_provider_tao_slurm.lifecycle.resume import last_watched

        root = JobHandle.from_dict(self.job)
        deferred = None if job is None else JobHandle.from_dict(job)
        stored = last_watched(context, root)
        if stored is None:
            if deferred is not None:
                return deferred, "the job it deferred on"
            return root, "the submitted job"
        if deferred is not None and deferred.slurm_job_id != stored.slurm_job_id:
            raise ValidationError(
                f"this resume is for SLURM job {deferred.slurm_job_id}, but the sensor has since deferred on SLURM "
                f"job {stored.slurm_job_id} (its task state store): a stale resume settles nothing; clear the task "
                f"to watch job {stored.slurm_job_id}"
            )
        if job is None and stored.slurm_job_id != root.slurm_job_id:
            self.log.info(
                "Resumed without the deferral's kwargs (airflow dags test): going on with SLURM job %s (%s), "
                "the job this sensor last deferred on (task state store)",
                stored.slurm_job_id,
                stored.job_id,
            )
        return stored, "the job it last deferred on (task state store)"

    # ------------------------------------------------------------------ live logs

    def _live_streams(self, context: Any, handle: JobHandle) -> list[dict[str, str | None]]:
        """List the files shown live (``main.out``, ``main.err``, ``status.json``), each with its log-dir cursor."""
        from airflow_provider_tao_slurm.core.logstream import PROGRESS
        from airflow_provider_tao_slurm.lifecycle.settle import LOGS

        if not self.stream_logs or not handle.log_dir:
            return []
        tag = _watch_tag(context)
        paths = {name: f"{handle.log_dir}/{name}" for name in LOGS}  # main.out, main.err
        paths[PROGRESS] = f"{handle.results_dir}/status.json"
        return [
            {"label": label, "path": path, "cursor_path": f"{handle.log_dir}/.live-{tag}.{label}.offset"}
            for label, path in paths.items()
        ]

    # ------------------------------------------------------------------ a job submitted elsewhere

    def _watch_foreign(self, context: Any) -> Any:
        """Watch a job known only by its SLURM id: its log paths come from ``scontrol show job``."""
        from airflow_provider_tao_slurm.lifecycle.foreign import find_foreign_job
        from airflow_provider_tao_slurm.lifecycle.watch import Watch
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

        job = find_foreign_job(self.hook, str(self.slurm_job_id))
        tag = _watch_tag(context)
        streams: list[dict[str, str | None]] = [
            {
                "label": label,
                "path": path,
                "cursor_path": f"{posixpath.dirname(path)}/.live-{tag}.{job.slurm_job_id}.{label}.offset",
            }
            for label, path in job.logs.items()
            if self.stream_logs
        ]
        self.log.info(
            "Watching SLURM job %s (%s, owner %s), submitted outside this provider: no record, no resubmission, "
            "a user kill leaves it running",
            job.slurm_job_id,
            job.job_name or "name unknown",
            job.owner or "unknown",
        )
        self.log.info(
            "Logs of SLURM job %s: %s",
            job.slurm_job_id,
            ", ".join(job.logs.values()) or "unknown (slurmctld no longer knows the job)",
        )
        context["ti"].xcom_push(key=WATCHED_JOB_KEY, value=job.watched(self.hook.settings.cluster_name))
        if not self.deferrable:
            self._foreign = job
            self._watch = Watch.start(job.slurm_job_id, "", submitted_at=datetime.now(UTC).timestamp())
            self._live.follow(streams, (), self.log_bytes_per_poll)
            return super().execute(context)
        events_dir = self._foreign_events_dir()
        event_path = _event_path(events_dir, job.slurm_job_id) if events_dir else None
        self.defer(
            trigger=SlurmJobTrigger(
                slurm_conn_id=self.slurm_conn_id,
                slurm_job_id=job.slurm_job_id,
                job_name="",
                poll_interval=float(self.poke_interval),
                not_found_grace=self.not_found_grace_seconds,
                unrecognised_grace=self.unrecognised_grace_seconds,
                log_streams=streams,
                log_bytes_per_poll=self.log_bytes_per_poll,
                cancel_on_kill=False,
                event_path=event_path,
            ),
            method_name="execute_complete",
            kwargs={"foreign": job.to_dict()},
            timeout=None,
        )
        return None

    def _foreign_events_dir(self) -> str | None:
        """Where a job submitted elsewhere has its full events: it has no job dir, so the results dir's (or none)."""
        results_dir = self.hook.settings.results_dir
        return _events_dir(results_dir) if results_dir else None

    # ------------------------------------------------------------------ poke path

    def poke(self, context: Any) -> bool | PokeReturnValue:
        """One status query through the watch the trigger uses; settles the job once the watch says it is over."""
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle

        event = self._poll()
        if event is None:
            return False
        if self._foreign is not None:
            from airflow_provider_tao_slurm.lifecycle.foreign import settle_foreign

            return PokeReturnValue(is_done=True, xcom_value=settle_foreign(self.settlement, self._foreign, event))
        handle = self._current or JobHandle.from_dict(self.job)
        outcome = self._settle(context, handle, event)
        if isinstance(outcome, JobHandle):
            self._publish(context, outcome)
            self._start_watch(outcome)
            streams = self._live_streams(context, outcome)
            self._live.follow(streams, self._secret_values(outcome), self.log_bytes_per_poll)
            return False
        return PokeReturnValue(is_done=True, xcom_value=outcome)

    def _start_watch(self, handle: JobHandle) -> None:
        """Watch ``handle``'s job from now on (in this worker)."""
        from airflow_provider_tao_slurm.lifecycle.watch import Watch

        self._current = handle
        submitted = _epoch(handle.submitted_at) or datetime.now(UTC).timestamp()
        self._watch = Watch.start(handle.slurm_job_id, handle.job_id, submitted_at=submitted)

    def _poll(self) -> JobEvent | None:
        """Ask the scheduler once, show the new log lines, and return the watch's event when the wait is over."""
        from airflow_provider_tao_slurm.core.states import TaoState
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle
        from airflow_provider_tao_slurm.lifecycle.watch import WatchRules

        if self._watch is None:  # execute() starts it; a poke on its own watches the handle
            self._start_watch(JobHandle.from_dict(self.job))
        assert self._watch is not None
        rules = WatchRules(self.not_found_grace_seconds, self.unrecognised_grace_seconds)
        step, state = self.lifecycle.poll(self._watch, rules, now=datetime.now(UTC).timestamp())
        self._watch = step.watch
        if state is not None and state.tao_state is not TaoState.PENDING:
            self._live.show_new_lines(self.log, self.hook.tail_many)
        if step.event is None:
            return None
        return dataclasses.replace(step.event, log_offsets=self._live.shown_offsets())

    def on_kill(self) -> None:
        """Cancel, record CANCELED, drop the sidecar: a user killed the task waiting in a worker (``deferrable=False``).

        A deferred sensor is killed through its trigger's ``on_kill`` instead: its worker has exited. Under
        ``airflow dags test`` the trigger runs in this process, and a SIGTERM reaches this method (the Task
        SDK's handler): it cancels the job the sensor deferred on, and the trigger then sees it end.
        """
        if self._current is not None:
            self.lifecycle.cancel(self._current, source="sensor on_kill")

    # ------------------------------------------------------------------ settling

    def _settle(self, context: Any, handle: JobHandle, event: JobEvent) -> dict[str, Any] | JobHandle:
        """Settle through the lifecycle's :class:`Settlement`; announce a finished job's results to the outlets."""
        outcome = self.settlement.settle(context["ti"], handle, event, self._secret_values(handle))
        if isinstance(outcome, dict):
            self._announce(context, handle, outcome)
        return outcome

    def _announce(self, context: Any, handle: JobHandle, result: Mapping[str, Any]) -> None:
        """Give each Asset in ``outlets`` the finished job's results as its event's extra.

        A downstream DAG scheduled on the Asset finds them in ``triggering_asset_events``.
        """
        from airflow_provider_tao_slurm.lifecycle.settle import asset_extra

        for asset in [outlet for outlet in self.outlets if isinstance(outlet, Asset)]:
            context["outlet_events"][asset].extra.update(asset_extra(handle, result))

    def _secret_values(self, handle: JobHandle) -> list[str] | None:
        """Return the job's secrets, resolved from the handle's references, so a job that prints one is redacted.

        None (said once per job) when one does not resolve here: the job's log lines are then not shown
        (:meth:`LiveLogs.secrets <airflow_provider_tao_slurm.lifecycle.following.LiveLogs.secrets>`).
        """
        return self._live.secrets(
            self.log, handle.slurm_job_id, handle.secret_refs, handle.log_dir or "the job's log directory"
        )
