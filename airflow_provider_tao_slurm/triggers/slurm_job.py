"""``SlurmJobTrigger``: waits in the triggerer until a SLURM job is terminal.

It polls nothing itself: it subscribes its job to the cluster's shared
:class:`~airflow_provider_tao_slurm.triggers.poller.StatusPoller`, so a thousand deferred jobs
of one cluster cost one batched query per interval over one SSH connection. While the job runs,
the new lines of its logs and its ``status.json`` progress appear in the task log at every poll
(read for all jobs of the cluster by one more batched command, resumed after a triggerer restart
from cursor files beside the logs). It yields exactly one event and returns: given an ``event_path``,
a compact one (the triggerer logs it whole in the task log) whose full form is in that file. A user kill
(Airflow 3.3 ``on_kill``) cancels the SLURM job; a triggerer restart (``cleanup`` only) does not. Run
inline by ``airflow dags test`` and stopped there (Ctrl-C), it cancels the job: nothing else would watch it.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao_slurm.core.logstream import DEFAULT_BYTES_PER_POLL, LineStream, show_lines
from airflow_provider_tao_slurm.exceptions import TaoSlurmError
from airflow_provider_tao_slurm.lifecycle.events import (
    DEFAULT_NOT_FOUND_GRACE_S,
    DEFAULT_UNRECOGNISED_GRACE_S,
    JobEvent,
)
from airflow_provider_tao_slurm.lifecycle.following import LiveLogs
from airflow_provider_tao_slurm.lifecycle.stopping import STOPPED_BY_CTRL_C, in_process_run
from airflow_provider_tao_slurm.lifecycle.watch import Watch, WatchRules, observe


class SlurmJobTrigger(BaseTrigger):
    """Wait until SLURM job ``slurm_job_id`` reaches a terminal state.

    :param slurm_conn_id: the ``tao_slurm`` connection.
    :param slurm_job_id: the SLURM job id to watch.
    :param job_name: the job's exact SLURM name (our job id); scancel is limited to it.
    :param poll_interval: seconds between polls of the shared poller.
    :param submitted_at: epoch seconds of the submission; "not found" is tolerated for
        ``not_found_grace`` seconds after it (and after the job was last seen).
    :param last_state: the last state already reported (so a re-defer does not repeat it).
    :param last_reason: the last pending reason already reported.
    :param sidecar_path: the job's secret sidecar, removed when a user kill cancels the job (no
        ``execute_complete`` runs after a kill, so nothing else would remove it).
    :param record_path: the job record, marked CANCELED (source ``trigger on_kill``) on a user kill.
    :param unrecognised_grace: seconds a state this provider does not know may last before the
        trigger gives up (the task then fails naming the raw state).
    :param log_streams: files to show live, each ``{"label": ..., "path": ..., "cursor_path": ...}``
        (the cursor keeps the offset across triggerer restarts).
    :param log_bytes_per_poll: bytes read per file per poll at most; more is skipped (and said).
    :param secret_refs: the job's ``secret_env`` references (never values), resolved in the
        triggerer to redact the live lines; when one does not resolve there, the live lines are
        withheld (said once in the task log).
    :param cancel_on_kill: whether a user kill cancels the job (False for a job this provider did not submit, or
        a conversion another run submitted and shares).
    :param end_marker_dir: the ends directory where the job's batch script leaves its end marker
        (``<results_dir>/ends``); the shared poller reads it every couple of seconds and asks
        accounting about a job whose marker appeared, so the end is seen long before the next
        scheduler query. None: the scheduler queries alone decide.
    :param event_path: where the full event (:meth:`JobEvent.to_dict
        <airflow_provider_tao_slurm.lifecycle.events.JobEvent.to_dict>`, mode 600) is written before the
        trigger yields :meth:`~airflow_provider_tao_slurm.lifecycle.events.JobEvent.compact`, which names the
        file. None (a trigger an older provider serialized), or a failed write: the full event is yielded.
    """

    def __init__(
        self,
        slurm_conn_id: str,
        slurm_job_id: str,
        job_name: str,
        poll_interval: float = 30.0,
        submitted_at: float | None = None,
        not_found_grace: float = DEFAULT_NOT_FOUND_GRACE_S,
        last_state: str | None = None,
        last_reason: str | None = None,
        sidecar_path: str | None = None,
        record_path: str | None = None,
        unrecognised_grace: float = DEFAULT_UNRECOGNISED_GRACE_S,
        log_streams: list[dict[str, str | None]] | None = None,
        log_bytes_per_poll: int = DEFAULT_BYTES_PER_POLL,
        secret_refs: dict[str, str] | None = None,
        cancel_on_kill: bool = True,
        end_marker_dir: str | None = None,
        event_path: str | None = None,
    ) -> None:
        super().__init__()
        self.slurm_conn_id = slurm_conn_id
        self.slurm_job_id = str(slurm_job_id)
        self.job_name = job_name
        self.poll_interval = float(poll_interval)
        self.submitted_at = float(submitted_at) if submitted_at is not None else time.time()
        self.not_found_grace = float(not_found_grace)
        self.last_state = last_state
        self.last_reason = last_reason
        self.sidecar_path = sidecar_path
        self.record_path = record_path
        self.unrecognised_grace = float(unrecognised_grace)
        self.log_streams = [dict(item) for item in log_streams or ()]
        self.log_bytes_per_poll = int(log_bytes_per_poll)
        self.secret_refs = dict(secret_refs or {})
        self.cancel_on_kill = cancel_on_kill
        self.end_marker_dir = end_marker_dir
        self.event_path = event_path
        self._live = LiveLogs("in the triggerer")

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and primitive kwargs; ``cls(**kwargs)`` rebuilds an equivalent trigger."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "slurm_conn_id": self.slurm_conn_id,
                "slurm_job_id": self.slurm_job_id,
                "job_name": self.job_name,
                "poll_interval": self.poll_interval,
                "submitted_at": self.submitted_at,
                "not_found_grace": self.not_found_grace,
                "last_state": self.last_state,
                "last_reason": self.last_reason,
                "sidecar_path": self.sidecar_path,
                "record_path": self.record_path,
                "unrecognised_grace": self.unrecognised_grace,
                "log_streams": self.log_streams,
                "log_bytes_per_poll": self.log_bytes_per_poll,
                "secret_refs": self.secret_refs,
                "cancel_on_kill": self.cancel_on_kill,
                "end_marker_dir": self.end_marker_dir,
                "event_path": self.event_path,
            },
        )

    def _hook(self) -> Any:
        from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

        return SlurmHook(self.slurm_conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event when the job is terminal (or vanished).

        Cancelled, it leaves the job to the triggerer that takes the watch over; run inline by ``airflow dags
        test`` and stopped there (Ctrl-C), it cancels the job: nothing else would watch it.
        """
        try:
            payload = await self._watch_to_end()
        except asyncio.CancelledError:
            if in_process_run():
                await self._cancel(STOPPED_BY_CTRL_C)
            raise
        yield TriggerEvent(payload)

    async def _watch_to_end(self) -> dict[str, Any]:
        """Subscribe to the shared poller; return the payload of the event that ends the wait."""
        from airflow_provider_tao_slurm.triggers.poller import get_poller

        hook = self._hook()
        settings = await hook.a_settings()
        poller = get_poller(
            settings.pool_key,
            hook.a_get_states,
            self.poll_interval,
            hook.a_tail_many,
            hook.a_end_markers,
            hook.a_accounting_states,
        )
        queue = poller.subscribe(self.slurm_job_id, self.poll_interval, await self._line_streams(), self.end_marker_dir)
        watch = Watch.start(
            self.slurm_job_id,
            self.job_name,
            submitted_at=self.submitted_at,
            last_state=self.last_state,
            last_reason=self.last_reason,
        )
        rules = WatchRules(self.not_found_grace, self.unrecognised_grace)
        try:
            while True:
                update = await queue.get()
                show_lines(self.log, update.lines)
                step = observe(
                    watch,
                    rules,
                    polled_at=update.polled_at,
                    state=update.state,
                    error=update.error,
                    last_seen=update.last_seen,
                )
                watch = step.watch
                for note in step.notes:
                    self.log.log(note.level, "%s", note.message)
                if step.event is not None:
                    return await self._payload(hook, replace(step.event, log_offsets=self._live.shown_offsets()))
        finally:
            poller.unsubscribe(self.slurm_job_id, queue)

    async def _payload(self, hook: Any, event: JobEvent) -> dict[str, Any]:
        """Return what the event carries: :meth:`JobEvent.compact` once the full event is in ``event_path``.

        The full event itself without an ``event_path``, or when writing it failed (one round trip, which
        creates the file's directory; the failure is said, nothing is lost).
        """
        full = event.to_dict()
        if self.event_path is None:
            return full
        try:
            await hook.a_write_file(self.event_path, json.dumps(full).encode(), "600")
        except TaoSlurmError as exc:
            self.log.warning(
                "Could not write the end of SLURM job %s to %s: the trigger event carries all of it",
                self._job,
                self.event_path,
            )
            self.log.warning("Why the write failed: %s", exc)
            return full
        return event.compact(posixpath.basename(self.event_path))

    @property
    def _job(self) -> str:
        """The job as messages name it: its id, and its name when the provider submitted it."""
        return f"{self.slurm_job_id} ({self.job_name})" if self.job_name else self.slurm_job_id

    async def _line_streams(self) -> list[LineStream]:
        """Return the job's live streams, with its secrets (resolved here, never stored) for redaction.

        No streams when a secret does not resolve in the triggerer: the job's lines are withheld (said once;
        they stay in its files; see :class:`~airflow_provider_tao_slurm.lifecycle.following.LiveLogs`).
        """
        if not self.log_streams:
            return []
        kept_in = ", ".join(str(item["path"]) for item in self.log_streams)
        secrets = await self._live.a_secrets(self.log, self._job, self.secret_refs, kept_in)
        return self._live.follow(self.log_streams, secrets, self.log_bytes_per_poll)

    async def on_kill(self) -> None:
        """Cancel the job, record it, remove the sidecar: a user marked the deferred task failed/success or cleared it.

        Airflow 3.3 calls this only on explicit user action, never on triggerer restarts.
        """
        await self._cancel("trigger on_kill")

    async def _cancel(self, source: str) -> None:
        """Cancel the job through the lifecycle (unless it is not this task's to cancel); ``source`` says who."""
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        if not self.cancel_on_kill:
            self.log.info(
                "SLURM job %s is not this task's to cancel (submitted outside the provider, or a conversion another "
                "run shares): it is left running",
                self.slurm_job_id,
            )
            return
        await JobLifecycle(self._hook(), self.log).a_cancel(
            self.slurm_job_id,
            self.job_name,
            record_path=self.record_path,
            sidecar_path=self.sidecar_path,
            source=source,
        )
