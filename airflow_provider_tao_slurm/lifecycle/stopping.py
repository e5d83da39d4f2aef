"""A run its user stops: the job it submitted or waits on is cancelled, and no secret file outlives it.

Deployed, a user stops a task from the UI and Airflow calls ``on_kill``: the sensor's in a worker, the
trigger's when deferred. ``airflow dags test`` (``dag.test()``, how docs/pipelines.md has a new user try
a pipeline) runs every task and trigger in one process, and its user stops it with Ctrl-C or ``kill``:

- Ctrl-C raises :class:`KeyboardInterrupt` in a task (the submit operator, a sensor that pokes), and
  cancels the trigger ``dag.test()`` runs inline (asyncio's SIGINT handling);
- SIGTERM reaches the running task's ``on_kill`` (the Task SDK's handler): the submit operator's raises
  :class:`~airflow_provider_tao_slurm.exceptions.SubmissionStopped` while it submits, the sensor's
  cancels its job, also while its trigger runs inline.

A trigger cancelled in a real triggerer (a restart, a trigger moved to another triggerer) must leave
its job alone: another triggerer takes the watch over. Inline under ``dag.test()`` nothing will, so
the job is cancelled there: :func:`in_process_run` tells the two apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_tao_slurm.lifecycle.submission import find_job

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.layout import JobLayout
    from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

#: Who cancels, as the log and the record say it, when a user stops ``airflow dags test`` with Ctrl-C.
STOPPED_BY_CTRL_C = "the run was stopped (Ctrl-C)"
#: The same for a kill (SIGTERM) that reached a task while it submitted.
STOPPED_BY_SIGTERM = "the task was killed (SIGTERM)"


def in_process_run() -> bool:
    """Whether this code runs under ``airflow dags test`` (``dag.test()``): tasks and triggers in one process.

    The Task SDK gives such a run its in-process supervisor channel; a worker or a triggerer has its own.
    """
    try:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms
    except ImportError:  # a Task SDK without in-process runs: nothing runs inline
        return False
    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), InProcessSupervisorComms)


def abandon_submission(lifecycle: JobLifecycle, job_name: str, layout: JobLayout, *, source: str) -> None:
    """Undo a submission stopped halfway: cancel the job of that name if sbatch made one, drop its sidecar.

    The job's name is its identity (a retry adopts it by that name), so the lookup finds the job however far
    sbatch got; with no job the record keeps what it said and only the staged sidecar goes.

    :raises JobLookupError: when the lookup failed (never read as "no job"); the sidecar is removed anyway.
    """
    try:
        slurm_id = find_job(lifecycle.hook, job_name)
    except BaseException:
        lifecycle.remove_sidecar(layout.sidecar_path)
        raise
    if slurm_id is None:
        lifecycle.log.info("No SLURM job named %s was submitted: removing its staged secrets", job_name)
        lifecycle.remove_sidecar(layout.sidecar_path)
        return
    lifecycle.cancel_job(
        slurm_id, job_name, record_path=layout.record_path, sidecar_path=layout.sidecar_path, source=source
    )
