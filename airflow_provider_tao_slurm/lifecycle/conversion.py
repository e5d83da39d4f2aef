"""One image conversion: take the lock, submit the conversion job or adopt another run's, verify the ``.sqsh``.

:class:`Conversion` carries out what :mod:`airflow_provider_tao_slurm.core.conversion` decides: the
lock directory on shared storage makes concurrent runs for one target convert once (one submits,
the others adopt its job id), a stale lock is broken, and a finished job's file is checked (squashfs
magic and size) before its path is returned. A failed or invalid conversion raises
:class:`~airflow_provider_tao_slurm.exceptions.ImageConversionError` with the conversion log's tail;
a registry URI is never returned. The waiting itself is :func:`~.waiting.wait_for_job`'s.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.conversion import (
    LOCK_SUBMIT_GRACE_S,
    ConversionJob,
    ConversionPlan,
    LockAction,
    LockState,
    SubmittedConversion,
    acquire_lock,
    conversion_job_name,
    held_lock_action,
    lock_dir,
    owner_of_job,
    parse_lock,
    record_lock_job,
    remove_lock,
    render_conversion_script,
    sqsh_target,
)
from airflow_provider_tao_slurm.core.images import needs_conversion, sqsh_cache_path
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.states import TaoState
from airflow_provider_tao_slurm.core.storage import display_value, resolve_cluster_path
from airflow_provider_tao_slurm.exceptions import (
    ConnectionConfigError,
    ImageConversionError,
    RemoteCommandError,
    TaoSlurmError,
    ValidationError,
)
from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent, JobHandle
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
from airflow_provider_tao_slurm.lifecycle.submission import submit_job
from airflow_provider_tao_slurm.lifecycle.support import (
    MISSING_IMAGE,
    install_registry_credentials,
    partitions_for,
    registry_credentials_from_connection,
    sqsh_problem,
)
from airflow_provider_tao_slurm.lifecycle.waiting import layout_handle, log_tails

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.config import ClusterSettings
    from airflow_provider_tao_slurm.core.images import ImageRef
    from airflow_provider_tao_slurm.core.resources import JobParameters
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

#: Bytes of each conversion log quoted in a failure message.
LOG_TAIL_BYTES = 4096
#: Seconds between looks at a lock whose owner is still submitting its job.
LOCK_POLL_S = 2.0


def conversion_plan(
    settings: ClusterSettings,
    conn_id: str,
    image: ImageRef,
    *,
    sqsh_path: str | None,
    containers_dir: str | None,
    partition: str | None,
    account: str | None,
) -> ConversionPlan:
    """Decide where ``image`` is converted to (no SSH): the target, its lock, the partition asked for, the account.

    :raises ConnectionConfigError: when the connection has no ``results_dir``.
    """
    if not settings.results_dir:
        raise ConnectionConfigError(
            f"connection {conn_id!r} has no results_dir: set it (the shared base directory, e.g. "
            "/lustre/<user>); conversion scripts and logs go under it"
        )
    results_dir = resolve_cluster_path(settings.results_dir, param="results_dir")
    if sqsh_path is not None:
        target = sqsh_target(sqsh_path)
    else:
        containers = resolve_cluster_path(containers_dir or f"{results_dir}/containers", param="containers_dir")
        target = sqsh_cache_path(image, containers)
    return ConversionPlan(
        image=image,
        target=target,
        lock=lock_dir(target),
        partition=partition or settings.conversion_partition,
        account=account or settings.account,
        results_dir=results_dir,
    )


def existing_image(hook: SlurmHook, log: Any, path: str) -> str:
    """Return ``path`` once it is checked to be a usable ``.sqsh`` on the cluster.

    :raises ImageConversionError: when it is missing or not a squashfs image.
    """
    problem = sqsh_problem(hook, path)
    if problem == MISSING_IMAGE:
        raise ImageConversionError(
            f"image {path} does not exist on cluster {hook.settings.cluster_name!r}; fix the path, or give "
            "the registry image (e.g. nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt) to convert it"
        )
    if problem is not None:
        raise ImageConversionError(f"image {path} is not usable: {problem}")
    log.info("Using the existing image %s", path)
    return path


def read_conversion_event(event: Any) -> tuple[str, str, str | None]:
    """``(job id, job name, failure description or None)`` from a trigger event.

    :raises ImageConversionError: for an event that is not about a conversion job.
    """
    try:
        parsed = JobEvent.from_dict(event, what="conversion trigger event")
        owner_of_job(parsed.job_name)
    except ValidationError as exc:
        raise ImageConversionError(
            f"the conversion trigger sent an unusable event ({exc}); check the triggerer's log and run the task again"
        ) from None
    state = parsed.state
    if parsed.status is EventStatus.TERMINAL and state is not None and state.tao_state is TaoState.COMPLETE:
        return parsed.slurm_job_id, parsed.job_name, None
    if parsed.status is EventStatus.TERMINAL and state is not None:
        return (
            parsed.slurm_job_id,
            parsed.job_name,
            f"ended {state.message or state.native} (exit code {state.exit_code})",
        )
    return parsed.slurm_job_id, parsed.job_name, parsed.message or f"ended with event status {parsed.status}"


def cancel_conversion(hook: SlurmHook, log: Any, started: SubmittedConversion) -> None:
    """Cancel a conversion this run submitted (a user killed the task while it waited in the worker)."""
    JobLifecycle(hook, log).cancel_job(started.job_id, started.job_name, source="EnrootImportOperator on_kill")


class Conversion:
    """One image's conversion into its plan's target, for one run (``owner``) of the converting task.

    :param hook: the cluster's hook.
    :param log: the task's logger.
    :param plan: what is converted where (:func:`conversion_plan`).
    :param force_reconvert_latest: convert a ``:latest`` image again even if a valid file exists.
    :param registry_conn_id: an Airflow connection with the registry key, installed before converting.
    """

    def __init__(
        self,
        hook: SlurmHook,
        log: Any,
        plan: ConversionPlan,
        *,
        force_reconvert_latest: bool = False,
        registry_conn_id: str | None = None,
    ) -> None:
        self.hook = hook
        self.log = log
        self.plan = plan
        self.force_reconvert_latest = force_reconvert_latest
        self.registry_conn_id = registry_conn_id

    def script(self, job: JobParameters, owner: str, *, cpus: int, mem_mb: int, time_minutes: int) -> str:
        """Choose the CPU partition (never a GPU one) and render ``owner``'s conversion script for it.

        :param job: the conversion job's checked resource parameters (its time and sbatch options).
        """
        plan = self.plan
        partition = ",".join(partitions_for(self.hook, plan.partition, job.time_hours, cpu_only=True))
        self.plan = plan = replace(plan, partition=partition)
        return render_conversion_script(
            ConversionJob(
                job_name=conversion_job_name(owner),
                image=plan.image,
                target=plan.target,
                partition=partition,
                account=plan.account,
                cpus=cpus,
                mem_mb=mem_mb,
                time_minutes=time_minutes,
                log_dir=JobLayout(plan.results_dir, conversion_job_name(owner)).log_dir,
                sbatch_extra=job.sbatch_extra,
            )
        )

    def handle(self, started: SubmittedConversion) -> JobHandle:
        """Return the handle :func:`~.waiting.wait_for_job` waits on for a submitted or adopted conversion."""
        layout = JobLayout(self.plan.results_dir, started.job_name)
        return layout_handle(layout, started.job_id, started.submitted_at)

    def start(self, script: str, owner: str) -> str | SubmittedConversion:
        """Reuse a valid file, or submit the conversion, or adopt the conversion another run started.

        :returns: the target's path when nothing needs converting, else the job to wait for.
        :raises ImageConversionError: when a lock stays without a conversion job, or cannot be removed.
        """
        plan = self.plan
        problem = sqsh_problem(self.hook, plan.target)
        if not needs_conversion(plan.image, problem is None, self.force_reconvert_latest):
            self.log.info("Reusing the converted image %s", plan.target)
            return plan.target
        if problem not in (None, MISSING_IMAGE):
            self.log.warning("%s is not a usable image (%s); converting again to replace it", plan.target, problem)
        deadline = time.monotonic() + LOCK_SUBMIT_GRACE_S + 60
        while time.monotonic() < deadline:
            acquired = self.hook.run(acquire_lock(plan.lock, owner), check=True, what="taking the conversion lock")
            lock = parse_lock(acquired.stdout)
            if lock.acquired:
                return self._convert(script, owner)
            found = self._held(lock)
            if found is not None:
                return found
        raise ImageConversionError(
            f"the conversion lock {plan.lock} stayed without a conversion job for {LOCK_SUBMIT_GRACE_S} s; if no "
            f"conversion of this image is running (squeue --me), remove it by hand (rm -rf {plan.lock}) and retry"
        )

    def _held(self, lock: LockState) -> str | SubmittedConversion | None:
        """Act on a lock another run holds: adopt its job, reuse its file, or wait or break it (None: try again)."""
        plan = self.plan
        holder = self.hook.get_states([lock.job_id]).get(lock.job_id) if lock.job_id else None
        action = held_lock_action(lock, holder)
        if action is LockAction.ADOPT and lock.owner and lock.job_id:
            self.log.info("Another run is converting %s with SLURM job %s: waiting for it", plan.target, lock.job_id)
            return SubmittedConversion(
                lock.job_id, conversion_job_name(lock.owner), time.time() - lock.age_seconds, adopted=True
            )
        if action is LockAction.WAIT:
            time.sleep(LOCK_POLL_S)
            return None
        if (
            action is LockAction.FINISHED
            and not self.force_reconvert_latest
            and sqsh_problem(self.hook, plan.target) is None
        ):
            self.remove_lock_quietly(lock.owner)
            self.log.info("Reusing the image converted by SLURM job %s: %s", lock.job_id, plan.target)
            return plan.target
        self.log.warning("Removing the stale conversion lock %s (%s, job %s)", plan.lock, action, lock.job_id)
        self.remove_lock(lock.owner)
        return None

    def _convert(self, script: str, owner: str) -> str | SubmittedConversion:
        """Check the target once more, then stage and submit the conversion job (holding the lock)."""
        plan = self.plan
        job_name = conversion_job_name(owner)
        try:
            problem = sqsh_problem(self.hook, plan.target)
            if not needs_conversion(plan.image, problem is None, self.force_reconvert_latest):
                self.remove_lock(owner)
                self.log.info("Reusing the image another run converted meanwhile: %s", plan.target)
                return plan.target
            if self.registry_conn_id is not None:
                login, password = registry_credentials_from_connection(self.registry_conn_id)
                machines = install_registry_credentials(self.hook, plan.image, login, password)
                self.log.info("Installed Enroot credentials for %s", ", ".join(machines))
            layout = JobLayout(plan.results_dir, job_name)
            self.hook.write_file(layout.script_path, script.encode(), mode="600")
            job_id = submit_job(self.hook, layout.script_path, job_name, log_dir=layout.log_dir, log=self.log)
        except Exception:
            self.remove_lock_quietly(owner)
            raise
        recorded = self.hook.run(record_lock_job(plan.lock, owner, job_id), what="recording the conversion job")
        if recorded.rc != 0:
            self.log.warning("The conversion lock %s was taken over; SLURM job %s converts anyway", plan.lock, job_id)
        self.log.info(
            "Converting %s into %s with SLURM job %s on partition %s",
            plan.image.raw,
            plan.target,
            job_id,
            plan.partition,
        )
        return SubmittedConversion(job_id, job_name, time.time())

    def finish(self, event: Any) -> str:
        """Check the trigger's event and the converted file; return its path, or fail with the conversion log's tail.

        The lock is released either way.
        """
        plan = self.plan
        job_id, job_name, failure = read_conversion_event(event)
        try:
            if failure is None:
                problem = sqsh_problem(self.hook, plan.target)
                if problem is None:
                    self.log.info("Image %s converted by SLURM job %s: %s", plan.image.raw, job_id, plan.target)
                    return plan.target
                failure = f"completed, but {plan.target} is not a usable image: {problem}"
            raise ImageConversionError(
                f"converting image {display_value(plan.image.raw)} failed: SLURM job {job_id} ({job_name}) "
                f"{failure}. Nothing usable is at {plan.target}, and no GPU job may fall back to the registry "
                "image. Fix the cause shown in the conversion log below (image name and tag, registry credentials "
                "via registry_conn_id, mem_mb, time_hours) and run the task again.\n" + self.log_tail(job_id, job_name)
            )
        finally:
            self.remove_lock_quietly(owner_of_job(job_name))

    def log_tail(self, job_id: str, job_name: str) -> str:
        """Return the last :data:`LOG_TAIL_BYTES` of the conversion's ``main.err`` and ``main.out``, redacted."""
        paths = JobLayout(self.plan.results_dir, job_name).log_paths(job_id)[::-1]
        lifecycle = JobLifecycle(self.hook, self.log)
        return log_tails(lifecycle, paths, LOG_TAIL_BYTES, heading="--- end of {path} ---", quoted=True)

    def remove_lock(self, owner: str | None) -> None:
        """Remove the lock ``owner`` holds (any owner's when None).

        :raises ImageConversionError: when it cannot be removed (with the command that removes it by hand).
        """
        lock = self.plan.lock
        try:
            self.hook.run(remove_lock(lock, owner), check=True, what="removing the conversion lock")
        except RemoteCommandError as exc:
            raise ImageConversionError(
                f"cannot remove the stale conversion lock {lock} ({exc}); if no conversion of this image is "
                f"running (squeue --me), remove it by hand: rm -rf {lock}"
            ) from None

    def remove_lock_quietly(self, owner: str | None) -> None:
        """Remove the lock ``owner`` holds; a failure is only said (the next run cleans it up)."""
        lock = self.plan.lock
        try:
            self.hook.run(remove_lock(lock, owner), check=True, what="removing the conversion lock")
        except TaoSlurmError as exc:
            self.log.warning("Could not remove the conversion lock %s (%s); the next run cleans it up", lock, exc)
