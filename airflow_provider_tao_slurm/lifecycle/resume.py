"""Reattaching through Airflow's task state store (AIP-103): a retry reads the job its earlier try stored.

Right after a submission the submit task stores the job handle in its ``task_state_store``
(:class:`airflow.sdk.ResumableJobMixin` writes it, and Airflow's ``resumable_job.*`` metrics count
what each retry decided); a retry reads it first and reattaches without asking SLURM by name. The
sensor stores the job it watches the same way, right before each deferral, so that a retried sensor
goes on with the newest job of a chain (a resubmission, the next slice) instead of walking the chain
again from the first one, and a sensor resumed without its deferral's kwargs (``airflow dags test``
passes the trigger's event alone) knows the job that event must be about.

The name-based adoption of :meth:`~airflow_provider_tao_slurm.lifecycle.jobs.JobLifecycle.plan_attempt`
stays: it closes the window between ``sbatch`` and the store write (a worker that dies there leaves
nothing in the store), and it is what a retry falls back to whenever the stored job cannot be
reattached.

A stored job is described by one status string, ``"<kind> <detail>"``:

- ``live PENDING`` / ``live RUNNING`` ...: SLURM still runs it; the retry reattaches;
- ``ended COMPLETED`` / ``ended FAILED`` ...: it ended, but no sensor settled its record yet; the
  retry reattaches too (the sensor settles it, and an infrastructure failure is resubmitted there),
  and an ``ended COMPLETED`` one counts as "already succeeded";
- ``settled ERROR`` ...: a sensor already settled its record; the retry submits a fresh job (the
  task was cleared to run the training again), exactly as without the store;
- ``gone``: neither SLURM nor a record knows it; the retry falls back to the name-based adoption.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import WATCHED_JOB_STORE_KEY

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.lifecycle.events import JobHandle
    from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle


def stored_job_status(lifecycle: JobLifecycle, handle: JobHandle) -> str:
    """Return what became of a stored job (see the module's status strings).

    :raises RemoteReadError: when its record could not be read (never read as "no record").
    :raises StatusQueryError: when SLURM could not be asked (never read as "no job").
    """
    record = lifecycle.read_record(handle.record_path)
    if record is not None and record.terminal_state is not None:
        return f"settled {record.terminal_state}"
    state = lifecycle.hook.get_states([handle.slurm_job_id]).get(handle.slurm_job_id)
    if state is None or record is None:
        return "gone"
    return f"{'ended' if state.is_terminal else 'live'} {state.native}"


def reattachable(status: str) -> bool:
    """Whether a retry reattaches to a stored job with ``status`` (it runs, or ended unsettled)."""
    return status.startswith(("live ", "ended ")) and not ended_well(status)


def ended_well(status: str) -> bool:
    """Whether a stored job with ``status`` ended COMPLETED before any sensor settled it."""
    return status == "ended COMPLETED"


def remember_watched(context: Mapping[str, Any], root: JobHandle, handle: JobHandle) -> None:
    """Store the job a sensor watches now, tied to the submit task's job it descends from."""
    from airflow.sdk.execution_time.context import NEVER_EXPIRE

    store = context.get("task_state_store")
    if store is not None:
        value = {"root": root.slurm_job_id, "handle": handle.to_dict()}
        store.set(WATCHED_JOB_STORE_KEY, value, retention=NEVER_EXPIRE)


def last_watched(context: Mapping[str, Any], root: JobHandle) -> JobHandle | None:
    """Return the job this sensor stored last (``root`` itself included), when it descends from ``root``; else None.

    The sensor stores the job right before each deferral, so this is the job it last deferred on: what
    a resumed sensor watches when the resume carries no deferral kwargs (``airflow dags test``). A stored
    job of another submission (the submit task ran again and submitted a fresh job) is ignored.
    """
    from airflow_provider_tao_slurm.lifecycle.events import JobHandle

    store = context.get("task_state_store")
    stored = store.get(WATCHED_JOB_STORE_KEY) if store is not None else None
    if not isinstance(stored, Mapping) or stored.get("root") != root.slurm_job_id:
        return None
    return JobHandle.from_dict(stored.get("handle"))


def watched_since(context: Mapping[str, Any], root: JobHandle) -> JobHandle | None:
    """Return the job an earlier try of this sensor watched last, when it descends from ``root`` and is not it.

    None when nothing is stored, or ``root`` itself.

    A stored job of another submission (the submit task ran again and submitted a fresh job) is ignored.
    """
    handle = last_watched(context, root)
    return handle if handle is not None and handle.slurm_job_id != root.slurm_job_id else None
