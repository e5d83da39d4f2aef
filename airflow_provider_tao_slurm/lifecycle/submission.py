"""One submission: a staged batch script becomes exactly one SLURM job of ours, or a clear error.

Every path that starts a job comes here: a submit task's job, an infrastructure resubmission, the
next slice of a chain, an Enroot conversion and an NCCL probe. The hook's ``submit`` is one round
trip (stage, ``sbatch --hold``, the duplicate check, log directory, release) that returns the job id
or raises; this module owns what that round trip cannot know:

- a submission whose outcome is unknown (the command timed out, the connection dropped, the reply
  had no id, or the job exists but could not be checked or released) is looked up by its exact
  name on every login host before anything else happens: one job of ours is adopted
  (:func:`adopt_job`); none after :data:`RECONCILE_TIMEOUT_S` means it never reached
  SLURM, and it is submitted again, once (the duplicate check in the round trip keeps the older
  of two racing jobs, so even a very late first reply cannot leave two);
- a name carried by several of our jobs stops everything (:class:`AmbiguousSubmissionError`), in
  one place for every lookup;
- adoption (:func:`adopt_job`): every path that takes over a job of ours found by name (a submit
  task's retry, a sensor's retry that finds the next slice or the infrastructure resubmission an
  earlier try started, an unknown outcome reconciled here) releases it, creates its log directory
  and records it through that one function;
- a continued training whose ``checkpoint_signal`` preemption will not send (the site has no
  ``send_user_signal``) is told so once, when its first slice is submitted
  (:func:`note_unsignalled_preemption`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.records import JobRecord, mark, to_json
from airflow_provider_tao_slurm.core.states import TaoState
from airflow_provider_tao_slurm.exceptions import (
    AmbiguousSubmissionError,
    JobLookupError,
    SubmissionError,
    SubmissionOutcomeUnknownError,
)
from airflow_provider_tao_slurm.lifecycle.support import utc_now

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.request import Continuation
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

#: How long a submission whose outcome is unknown is looked for by name before it counts as never made.
RECONCILE_TIMEOUT_S = 60.0
#: Seconds between those lookups.
RECONCILE_INTERVAL_S = 2.0


def find_job(hook: SlurmHook, job_name: str) -> str | None:
    """Our job named exactly ``job_name`` (live or finished, on any login host), or None.

    :raises AmbiguousSubmissionError: when several of our jobs carry the name.
    :raises JobLookupError: when the lookup failed (never read as "no job").
    """
    ids = hook.find_jobs_by_name(job_name, all_hosts=True)
    if len(ids) > 1:
        raise AmbiguousSubmissionError(
            f"{len(ids)} SLURM jobs are named {job_name} ({', '.join(ids)}); cancel the extra ones with scancel "
            "before retrying",
            ids,
        )
    return ids[0] if ids else None


def reconcile(
    hook: SlurmHook,
    job_name: str,
    log: logging.Logger | Any,
    *,
    timeout: float | None = None,
    interval: float | None = None,
) -> str | None:
    """Look for our job named ``job_name`` until it appears or :data:`RECONCILE_TIMEOUT_S` passes.

    A lookup that failed is asked again until the deadline; only answered lookups can end in "none".

    :param timeout: seconds to look for it (``None``: :data:`RECONCILE_TIMEOUT_S`).
    :param interval: seconds between lookups (``None``: :data:`RECONCILE_INTERVAL_S`).
    :raises AmbiguousSubmissionError: when more than one job has that name.
    :raises JobLookupError: when the last lookup before the deadline failed.
    """
    deadline = time.monotonic() + (RECONCILE_TIMEOUT_S if timeout is None else timeout)
    while True:
        try:
            found = find_job(hook, job_name)
        except JobLookupError as exc:
            if time.monotonic() >= deadline:
                raise
            log.warning("Looking up job %s failed, asking again: %s", job_name, exc)
        else:
            if found is not None or time.monotonic() >= deadline:
                return found
        time.sleep(RECONCILE_INTERVAL_S if interval is None else interval)


def adopt_job(
    hook: SlurmHook,
    job_name: str,
    slurm_id: str,
    *,
    log_dir: str,
    log: logging.Logger | Any,
    why: str,
    record: tuple[str, JobRecord] | None = None,
    source: str = "submit",
    secrets: Sequence[str] = (),
) -> JobRecord | None:
    """Adopt our SLURM job ``slurm_id`` named ``job_name``: release it, create its log directory, record it.

    Every adoption of the provider comes here. The try that submitted the job may have died between
    ``sbatch --hold`` and the release (a killed worker, a cut connection): without the release the job
    stays held (``JobHeldUser``) and is watched forever, and without its log directory it fails at
    start (exit 0:53). Both steps are idempotent (:func:`~airflow_provider_tao_slurm.core.commands.prepare_job_logs`:
    a job already released or ended is left as it is).

    :param log_dir: the base log directory (the job logs to ``<log_dir>/<job_name>-<slurm_id>``).
    :param why: who submitted the job, for the log (``"submitted by an earlier try"``).
    :param record: ``(path, record)``: the job's record, written bound to ``slurm_id`` and RUNNING
        (:func:`bind_adopted`). None where there is no record yet: the caller records the job as it
        records a submission (an unknown outcome reconciled by :func:`submit_job`, a submit task whose
        earlier try left no record).
    :param source: who adopts, in the record (``"submit"``, ``"sensor"``).
    :param secrets: secret values to mask in the written record.
    :returns: the record as written, or None without one.
    :raises RemoteCommandError: when the release or the log directory failed (nothing is recorded).
    :raises RecordError: when the record is bound to another SLURM job.
    """
    log.info("Adopting SLURM job %s (%s), %s: releasing it if held", slurm_id, job_name, why)
    hook.prepare_job_logs(log_dir, job_name, slurm_id)
    if record is None:
        return None
    path, current = record
    bound = bind_adopted(current, slurm_id, source, secrets)
    if bound is not current:
        write_record(hook, path, bound, secrets)
    return bound


def bind_adopted(record: JobRecord, slurm_id: str, source: str, secrets: Sequence[str] = ()) -> JobRecord:
    """``record`` bound to the adopted SLURM job ``slurm_id`` and RUNNING.

    A record already RUNNING for that job, or already terminal (an earlier try watched the job to its
    end), is returned as it is (the same object).

    :raises RecordError: when the record is bound to another SLURM job.
    """
    if record.terminal_state is not None or (record.backend_ref == slurm_id and record.state is TaoState.RUNNING):
        return record
    return mark(
        record,
        TaoState.RUNNING,
        now=utc_now(),
        message=f"adopted SLURM job {slurm_id}",
        source=source,
        backend_ref=slurm_id,
        secrets=secrets,
    )


def write_record(hook: SlurmHook, path: str, record: JobRecord, secrets: Sequence[str] = ()) -> None:
    """Write ``record`` (redacted with ``secrets``) to ``path``."""
    hook.write_file(path, to_json(record, list(secrets)).encode(), "644")


def submit_job(
    hook: SlurmHook,
    script_path: str,
    job_name: str,
    *,
    log_dir: str,
    log: logging.Logger | Any,
    extra_args: Sequence[str] = (),
    stage: tuple[str, Mapping[str, tuple[bytes | None, int]]] | None = None,
    reconcile_timeout: float | None = None,
    reconcile_interval: float | None = None,
) -> str:
    """Submit the staged script ``script_path`` as job ``job_name`` exactly once; return its SLURM id.

    :param log_dir: the base log directory (the job logs to ``<log_dir>/<job_name>-<id>``).
    :param extra_args: more sbatch options (``--exclude=...``, the slice's ``--export``).
    :param stage: files to stage in the same round trip right before sbatch (again with a second try).
    :param reconcile_timeout: how long an unknown outcome is looked for by name (``None``:
        :data:`RECONCILE_TIMEOUT_S`).
    :param reconcile_interval: seconds between those lookups (``None``: :data:`RECONCILE_INTERVAL_S`).
    :raises SubmissionError: when SLURM refused the job, or its outcome stayed unknown twice with no
        job of that name to be found.
    :raises RemoteCommandError: when staging the files failed (nothing was submitted).
    :raises AmbiguousSubmissionError: when several of our jobs carry ``job_name``.
    :raises JobLookupError: when the job could not be looked up after an unknown outcome.
    """
    for attempt in (1, 2):
        try:
            return hook.submit(script_path, job_name, log_dir=log_dir, extra_args=extra_args, stage=stage)
        except SubmissionOutcomeUnknownError as exc:
            log.warning(
                "The outcome of sbatch for job %s is unknown (%s): looking for it by its exact name", job_name, exc
            )
        found = reconcile(hook, job_name, log, timeout=reconcile_timeout, interval=reconcile_interval)
        if found is not None:  # the caller records it as it records any submission
            adopt_job(hook, job_name, found, log_dir=log_dir, log=log, why="submitted by that sbatch")
            return found
        if attempt == 1:
            log.warning(
                "No job named %s after %.0f s: it never reached SLURM; submitting it again",
                job_name,
                RECONCILE_TIMEOUT_S if reconcile_timeout is None else reconcile_timeout,
            )
    raise SubmissionError(
        f"sbatch's outcome for {job_name} was unknown twice and no job of that name appeared; check the cluster "
        f"(squeue --me --name={job_name}) and retry"
    )


def note_unsignalled_preemption(hook: SlurmHook, continuation: Continuation, log: logging.Logger | Any) -> None:
    """Say in the task log when a continued training's ``checkpoint_signal`` will not come at preemption.

    Only a continued training with a ``checkpoint_signal`` asks: the site's preemption settings come from
    the ``scontrol show config`` read the RPC pacing keeps for 10 minutes on the login host
    (:func:`~airflow_provider_tao_slurm.core.commands.site_config`; ``scontrol`` is asked only when that
    is older). Where the site preempts without ``send_user_signal``, a warning says that only the time
    limit sends the signal. This never stops a submission: a read that fails is said in a warning.

    :param log: the task's logger.
    """
    from airflow_provider_tao_slurm.core import commands
    from airflow_provider_tao_slurm.core.preemption import parse_preemption, unsignalled_preemption
    from airflow_provider_tao_slurm.exceptions import TaoSlurmError

    if not continuation.max_continuations or continuation.checkpoint_signal is None:
        return
    try:
        result = hook.run(commands.site_config(), what="reading the site's preemption settings")
        note = unsignalled_preemption(parse_preemption(result.stdout), continuation.checkpoint_signal)
    except TaoSlurmError as exc:
        log.warning(
            "Whether preemption on cluster %s sends checkpoint_signal=%s is not known (%s): checkpoint periodically",
            hook.settings.cluster_name,
            continuation.checkpoint_signal,
            exc,
        )
        return
    if note is not None:
        log.warning("On cluster %s, %s", hook.settings.cluster_name, note)
