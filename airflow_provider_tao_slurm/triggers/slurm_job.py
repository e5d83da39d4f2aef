"""``SlurmJobTrigger``: waits in the triggerer until a SLURM job is terminal.

It polls nothing itself: it subscribes its job to the cluster's shared
:class:`~airflow_provider_tao_slurm.triggers.poller.StatusPoller`, so a thousand deferred jobs
of one cluster cost one batched query per interval over one SSH connection. It yields exactly one
event and returns. A user kill (Airflow 3.3 ``on_kill``) cancels the SLURM job; a triggerer
restart (``cleanup`` only) does not.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.states import JobState, TaoState

#: How long a job may be unknown to both squeue and sacct after submit (sacct lags by seconds).
DEFAULT_NOT_FOUND_GRACE_S = 300.0
#: How long a terminal state seen only by squeue waits for sacct's row, which carries the exit
#: code (sacct lags squeue by seconds; without accounting the squeue state is used after this).
ACCOUNTING_SETTLE_S = 30.0


def state_to_payload(state: JobState) -> dict[str, Any]:
    """A JSON-safe dict of a :class:`JobState` (enums as plain strings)."""
    return {
        "job_id": state.job_id,
        "native": state.native,
        "raw_state": state.raw_state,
        "tao_state": str(state.tao_state),
        "exit_code": state.exit_code,
        "signal": state.signal,
        "reason": state.reason,
        "node_list": state.node_list,
        "start": state.start,
        "end": state.end,
        "name": state.name,
        "source": state.source,
        "err_class": str(state.err_class) if state.err_class else None,
        "message": state.message,
    }


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
            },
        )

    def _hook(self) -> Any:
        from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

        return SlurmHook(self.slurm_conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Subscribe to the shared poller and yield one event when the job is terminal (or vanished)."""
        from airflow_provider_tao_slurm.triggers.poller import get_poller

        hook = self._hook()
        settings = await hook.a_settings()
        poller = get_poller(settings.pool_key, hook.a_get_states, self.poll_interval)
        queue = poller.subscribe(self.slurm_job_id, self.poll_interval)
        transitions: list[dict[str, Any]] = []
        last = (self.last_state, self.last_reason)
        last_seen = self.submitted_at
        ended_at: float | None = None
        try:
            while True:
                update = await queue.get()
                if update.error is not None:
                    self.log.warning("SLURM status poll failed, still waiting: %s", update.error)
                    continue
                state = update.state
                if state is None:
                    if update.polled_at - last_seen > self.not_found_grace:
                        yield TriggerEvent(self._vanished(update.polled_at - last_seen))
                        return
                    continue
                last_seen = update.polled_at
                if state.is_terminal and state.source == "squeue":
                    if ended_at is None:
                        ended_at = update.polled_at
                    if update.polled_at - ended_at < ACCOUNTING_SETTLE_S:
                        continue  # sacct has not recorded the end yet: wait for its exit code
                current = (str(state.tao_state), state.reason)
                if current != last:
                    self.log.info(
                        "SLURM job %s (%s): %s%s%s",
                        self.slurm_job_id,
                        self.job_name,
                        state.native,
                        f" reason={state.reason}" if state.reason else "",
                        f" nodes={state.node_list}" if state.node_list else "",
                    )
                    transitions.append(
                        {
                            "ts": update.polled_at,
                            "state": str(state.tao_state),
                            "native": state.native,
                            "reason": state.reason,
                        }
                    )
                    last = current
                if state.is_terminal:
                    yield TriggerEvent(
                        {
                            "status": "terminal",
                            "slurm_job_id": self.slurm_job_id,
                            "job_name": self.job_name,
                            "state": state_to_payload(state),
                            "transitions": transitions,
                        }
                    )
                    return
        finally:
            poller.unsubscribe(self.slurm_job_id, queue)

    def _vanished(self, unseen_for: float) -> dict[str, Any]:
        return {
            "status": "error",
            "slurm_job_id": self.slurm_job_id,
            "job_name": self.job_name,
            "state": {"tao_state": str(TaoState.UNKNOWN), "native": "NOT_FOUND"},
            "message": (
                f"SLURM job {self.slurm_job_id} ({self.job_name}) is unknown to squeue and sacct for "
                f"{unseen_for:.0f} s; check `sacct -j {self.slurm_job_id}` and the cluster's accounting"
            ),
            "transitions": [],
        }

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: cancel the SLURM job, remove its sidecar.

        Airflow 3.3 calls this only on explicit user action, never on triggerer restarts.
        """
        self.log.info("Cancelling SLURM job %s (%s) on user request", self.slurm_job_id, self.job_name)
        hook = self._hook()
        await hook.a_cancel([self.slurm_job_id], job_name=self.job_name)
        if self.sidecar_path:
            removed = await hook.a_run(commands.remove_files([self.sidecar_path]))
            if removed.rc != 0:
                self.log.warning(
                    "Could not remove the secret sidecar %s (exit %s): %s; remove it by hand",
                    self.sidecar_path,
                    removed.rc,
                    removed.stderr.strip(),
                )
