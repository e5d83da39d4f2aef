"""``EnrootImportOperator``: convert a registry image to ``.sqsh`` once, on a CPU partition, before any GPU job.

The conversion is a batch job (template ``enroot_import.sbatch.j2``) that writes a temporary file,
checks the squashfs magic and size, and renames it into place. While it runs the task is
deferred on :class:`~airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger` (no SSH
session is held). Concurrent runs for the same target take turns through a lock directory on
shared storage (see :mod:`airflow_provider_tao_slurm.core.conversion`): one submits, the others
adopt its job id. A failed or invalid conversion fails the task; a registry URI is never returned.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import CONVERSION_TIME_HOURS
from airflow_provider_tao_slurm.lifecycle.support import (
    MISSING_IMAGE,
    check_flag,
    check_poll_interval_seconds,
    default_deferrable,
    install_registry_credentials,
    partitions_for,
    registry_credentials_from_connection,
    renamed_attribute,
    renamed_parameter,
    sqsh_problem,
)
from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.conversion import ConversionPlan, SubmittedConversion
    from airflow_provider_tao_slurm.core.images import ImageRef
    from airflow_provider_tao_slurm.core.resources import JobParameters

#: Bytes of each conversion log quoted in a failure message.
LOG_TAIL_BYTES = 4096
#: Seconds between looks at a lock whose owner is still submitting its job.
LOCK_POLL_S = 2.0


class EnrootImportOperator(SlurmBaseOperator):
    """Make a container image available as a ``.sqsh`` file on shared storage and return its path.

    ``image`` may be an absolute ``.sqsh`` path (checked: it must exist and be a squashfs image,
    then it is returned as it is), or a registry image (``registry#repo:tag``,
    ``docker://registry#repo:tag``, ``registry/repo:tag``). A registry image is converted into
    ``sqsh_path`` (default: its cache name in ``containers_dir``) unless a valid file is already
    there; a ``:latest`` image is reused too unless ``force_reconvert_latest``. An invalid or
    truncated file at the target is reported and replaced, never used.

    ``slurm_conn_id`` (the ``tao_slurm`` connection, default ``slurm_default``) and the ``BaseOperator``
    arguments (``task_id``, ``retries``, ...) are passed on through ``**kwargs``.

    :param image: the image; templated.
    :param sqsh_path: where to write the converted image (absolute, ending in ``.sqsh``); templated.
    :param force_reconvert_latest: convert a ``:latest`` image again even if a valid file exists.
    :param partition: the CPU partition of the conversion job (default: the connection's
        ``conversion_partition``, else a partition of the cluster whose nodes have no GPUs: a
        conversion never goes to a GPU default partition); templated.
    :param account: the SLURM account (default: the connection's); templated.
    :param cpus_per_task: CPUs of the conversion job (formerly ``cpus``, still accepted with a
        deprecation warning for one release).
    :param mem_mb: memory of the conversion job in MB.
    :param time_hours: wall-time limit of the conversion job in hours, checked against the partition's
        (formerly ``time_minutes``, still accepted with a deprecation warning for one release).
    :param qos: SLURM QOS of the conversion job (``--qos``).
    :param reservation: SLURM reservation(s) for the conversion job.
    :param constraint: node features the conversion job needs (``--constraint``).
    :param sbatch_options: more sbatch options ``{long-name: value}``, validated as for ``SbatchSubmitOperator``.
    :param deferrable: wait for the conversion job in the triggerer instead of the worker; default:
        Airflow's ``[operators] default_deferrable``.
    :param containers_dir: the image cache directory (default ``<results_dir>/containers``); templated.
    :param poll_interval_seconds: seconds between status polls of the conversion job (formerly
        ``poll_interval`` and ``poke_interval``, still accepted with a deprecation warning for one release).
    :param registry_conn_id: an Airflow connection whose password is the registry key (login defaults
        to ``$oauthtoken``); when given, Enroot credentials are installed before converting.
    """

    #: The old name of ``poll_interval_seconds``, read-only while the old parameter name is accepted.
    poll_interval = renamed_attribute("poll_interval_seconds")

    template_fields = (
        "image",
        "sqsh_path",
        "partition",
        "account",
        "containers_dir",
        "qos",
        "reservation",
        "constraint",
        "sbatch_options",
    )

    def __init__(
        self,
        *,
        image: str,
        sqsh_path: str | None = None,
        force_reconvert_latest: bool = False,
        partition: str | None = None,
        account: str | None = None,
        cpus_per_task: int = 4,
        mem_mb: int = 7200,
        time_hours: float = CONVERSION_TIME_HOURS,
        deferrable: bool = default_deferrable(),
        containers_dir: str | None = None,
        poll_interval_seconds: float = 10.0,
        registry_conn_id: str | None = None,
        qos: str | None = None,
        reservation: str | None = None,
        constraint: str | None = None,
        sbatch_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        cpus_per_task = renamed_parameter(kwargs, "cpus", "cpus_per_task", cpus_per_task, 4)
        for old in ("poll_interval", "poke_interval"):
            poll_interval_seconds = renamed_parameter(kwargs, old, "poll_interval_seconds", poll_interval_seconds, 10.0)
        if "time_minutes" in kwargs:
            minutes = renamed_parameter(kwargs, "time_minutes", "time_hours", time_hours, CONVERSION_TIME_HOURS)
            time_hours = minutes / 60 if isinstance(minutes, int | float) and not isinstance(minutes, bool) else minutes
        super().__init__(**kwargs)
        self.qos = qos
        self.reservation = reservation
        self.constraint = constraint
        self.sbatch_options = sbatch_options
        self.image = image
        self.sqsh_path = sqsh_path
        self.force_reconvert_latest = force_reconvert_latest
        self.partition = partition
        self.account = account
        self.cpus_per_task = cpus_per_task
        self.mem_mb = mem_mb
        self.time_hours = time_hours
        self.deferrable = deferrable
        self.containers_dir = containers_dir
        self.poll_interval_seconds = poll_interval_seconds
        self.registry_conn_id = registry_conn_id
        self._converting: SubmittedConversion | None = None  # the conversion this task submitted and waits for

    # ------------------------------------------------------------------ entry points

    def execute(self, context: Any) -> str:
        """Return the ``.sqsh`` path: checked, reused, or converted (deferring while the job runs)."""
        from airflow_provider_tao_slurm.core.conversion import (
            ConversionJob,
            conversion_job_name,
            render_conversion_script,
        )
        from airflow_provider_tao_slurm.core.layout import JobLayout
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

        image = self._image()
        if image.path is not None:
            return self._existing_image(image.path)
        owner = secrets.token_hex(8)
        extra = self._job_parameters().sbatch_extra  # every resource parameter checked before any SSH
        plan = self._plan(image)
        partition = ",".join(partitions_for(self.hook, plan.partition, self.time_hours, cpu_only=True))
        plan = replace(plan, partition=partition)
        script = render_conversion_script(
            ConversionJob(
                job_name=conversion_job_name(owner),
                image=image,
                target=plan.target,
                partition=partition,
                account=plan.account,
                cpus=self.cpus_per_task,
                mem_mb=self.mem_mb,
                time_minutes=self._time_minutes(),
                log_dir=JobLayout(plan.results_dir, conversion_job_name(owner)).log_dir,
                sbatch_extra=extra,
            )
        )
        started = self._start(plan, script, owner)
        if isinstance(started, str):
            return started
        if self.deferrable:
            self.defer(
                trigger=SlurmJobTrigger(
                    slurm_conn_id=self.slurm_conn_id,
                    slurm_job_id=started.job_id,
                    job_name=started.job_name,
                    poll_interval=self.poll_interval_seconds,
                    submitted_at=started.submitted_at,
                    cancel_on_kill=not started.adopted,  # a conversion another run shares is its to cancel
                ),
                method_name="execute_complete",
            )
        self._converting = None if started.adopted else started
        event = JobLifecycle(self.hook, self.log).wait_until_ended(
            started.job_id,
            started.job_name,
            submitted_at=started.submitted_at,
            poll_interval=self.poll_interval_seconds,
        )
        return self.execute_complete(context, event)

    def on_kill(self) -> None:
        """Cancel the conversion the task submitted: a user killed the task while it waited in the worker.

        A conversion adopted from another run is left running for that run; a deferred task is
        killed through its trigger, which cancels only a conversion this task submitted.
        """
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        if self._converting is not None:
            JobLifecycle(self.hook, self.log).cancel_job(
                self._converting.job_id, self._converting.job_name, source="EnrootImportOperator on_kill"
            )

    def execute_complete(self, context: Any, event: Any = None) -> str:
        """Check the trigger's event and the converted file; fail with the conversion log's tail."""
        from airflow_provider_tao_slurm.core.conversion import owner_of_job
        from airflow_provider_tao_slurm.core.storage import display_value
        from airflow_provider_tao_slurm.exceptions import ImageConversionError

        plan = self._plan(self._image())
        job_id, job_name, failure = self._read_event(event)
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
                "via registry_conn_id, mem_mb, time_hours) and run the task again.\n"
                + self._log_tail(plan.results_dir, job_id, job_name)
            )
        finally:
            self._remove_lock_quietly(plan.lock, owner_of_job(job_name))

    # ------------------------------------------------------------------ validation (no SSH)

    def _job_parameters(self) -> JobParameters:
        """Return the conversion job's resource parameters, checked as every submitting operator checks them.

        :raises ResourceError: (or ``ValidationError`` for a site option) naming the parameter and the fix.
        """
        from airflow_provider_tao_slurm.core.resources import check_job_parameters
        from airflow_provider_tao_slurm.exceptions import ResourceError

        job = check_job_parameters(
            partition=self.partition,
            account=self.account,
            cpus_per_task=self.cpus_per_task,
            mem_mb=self.mem_mb,
            time_hours=self.time_hours,
            qos=self.qos,
            constraint=self.constraint,
            reservation=self.reservation,
            sbatch_options=self.sbatch_options,
        )
        if job.mem_mb is None:
            raise ResourceError(
                "mem_mb=None: a conversion job needs its memory (Enroot unpacks the layers in parallel); give it in "
                "MB, e.g. mem_mb=7200"
            )
        return job

    def _time_minutes(self) -> int:
        """``time_hours`` (checked by :meth:`_job_parameters`) as whole minutes for the conversion job, rounded up."""
        return math.ceil(self.time_hours * 60)

    def _image(self) -> ImageRef:
        from airflow_provider_tao_slurm.core.images import parse_image
        from airflow_provider_tao_slurm.core.storage import display_value
        from airflow_provider_tao_slurm.exceptions import ValidationError

        for name in ("force_reconvert_latest", "deferrable"):
            check_flag(name, getattr(self, name))
        check_poll_interval_seconds(self.poll_interval_seconds)
        image = parse_image(self.image)
        if image.path is not None and self.sqsh_path is not None:
            raise ValidationError(
                f"sqsh_path is only for registry images, but image={display_value(self.image)} is already a "
                ".sqsh file; remove sqsh_path"
            )
        return image

    def _plan(self, image: ImageRef) -> ConversionPlan:
        from airflow_provider_tao_slurm.core.conversion import ConversionPlan, lock_dir, sqsh_target
        from airflow_provider_tao_slurm.core.images import sqsh_cache_path
        from airflow_provider_tao_slurm.core.storage import resolve_cluster_path
        from airflow_provider_tao_slurm.exceptions import ConnectionConfigError

        settings = self.hook.settings
        if not settings.results_dir:
            raise ConnectionConfigError(
                f"connection {self.slurm_conn_id!r} has no results_dir: set it (the shared base directory, e.g. "
                "/lustre/<user>); conversion scripts and logs go under it"
            )
        results_dir = resolve_cluster_path(settings.results_dir, param="results_dir")
        if self.sqsh_path is not None:
            target = sqsh_target(self.sqsh_path)
        else:
            containers = resolve_cluster_path(
                self.containers_dir or f"{results_dir}/containers", param="containers_dir"
            )
            target = sqsh_cache_path(image, containers)
        return ConversionPlan(
            image=image,
            target=target,
            lock=lock_dir(target),
            partition=self.partition or settings.conversion_partition,
            account=self.account or settings.account,
            results_dir=results_dir,
        )

    # ------------------------------------------------------------------ on the cluster

    def _existing_image(self, path: str) -> str:
        from airflow_provider_tao_slurm.exceptions import ImageConversionError

        problem = sqsh_problem(self.hook, path)
        if problem == MISSING_IMAGE:
            raise ImageConversionError(
                f"image {path} does not exist on cluster {self.hook.settings.cluster_name!r}; fix the path, or give "
                "the registry image (e.g. nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt) to convert it"
            )
        if problem is not None:
            raise ImageConversionError(f"image {path} is not usable: {problem}")
        self.log.info("Using the existing image %s", path)
        return path

    def _start(self, plan: ConversionPlan, script: str, owner: str) -> str | SubmittedConversion:
        """Reuse a valid file, or submit the conversion, or adopt the conversion another run started."""
        from airflow_provider_tao_slurm.core.conversion import (
            LOCK_SUBMIT_GRACE_S,
            LockAction,
            SubmittedConversion,
            acquire_lock,
            conversion_job_name,
            held_lock_action,
            parse_lock,
        )
        from airflow_provider_tao_slurm.core.images import needs_conversion
        from airflow_provider_tao_slurm.exceptions import ImageConversionError

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
                return self._convert(plan, script, owner)
            holder = self.hook.get_states([lock.job_id]).get(lock.job_id) if lock.job_id else None
            action = held_lock_action(lock, holder)
            if action is LockAction.ADOPT and lock.owner and lock.job_id:
                self.log.info(
                    "Another run is converting %s with SLURM job %s: waiting for it", plan.target, lock.job_id
                )
                return SubmittedConversion(
                    lock.job_id, conversion_job_name(lock.owner), time.time() - lock.age_seconds, adopted=True
                )
            if action is LockAction.WAIT:
                time.sleep(LOCK_POLL_S)
                continue
            if (
                action is LockAction.FINISHED
                and not self.force_reconvert_latest
                and sqsh_problem(self.hook, plan.target) is None
            ):
                self._remove_lock_quietly(plan.lock, lock.owner)
                self.log.info("Reusing the image converted by SLURM job %s: %s", lock.job_id, plan.target)
                return plan.target
            self.log.warning("Removing the stale conversion lock %s (%s, job %s)", plan.lock, action, lock.job_id)
            self._remove_lock(plan.lock, lock.owner)
        raise ImageConversionError(
            f"the conversion lock {plan.lock} stayed without a conversion job for {LOCK_SUBMIT_GRACE_S} s; if no "
            f"conversion of this image is running (squeue --me), remove it by hand (rm -rf {plan.lock}) and retry"
        )

    def _convert(self, plan: ConversionPlan, script: str, owner: str) -> str | SubmittedConversion:
        """Check the target once more, then stage and submit the conversion job (holding the lock)."""
        from airflow_provider_tao_slurm.core.conversion import (
            SubmittedConversion,
            conversion_job_name,
            record_lock_job,
        )
        from airflow_provider_tao_slurm.core.images import needs_conversion
        from airflow_provider_tao_slurm.core.layout import JobLayout
        from airflow_provider_tao_slurm.lifecycle.submission import submit_job

        job_name = conversion_job_name(owner)
        try:
            problem = sqsh_problem(self.hook, plan.target)
            if not needs_conversion(plan.image, problem is None, self.force_reconvert_latest):
                self._remove_lock(plan.lock, owner)
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
            self._remove_lock_quietly(plan.lock, owner)
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

    def _read_event(self, event: Any) -> tuple[str, str, str | None]:
        """``(job id, job name, failure description or None)`` from a trigger event."""
        from airflow_provider_tao_slurm.core.conversion import owner_of_job
        from airflow_provider_tao_slurm.core.states import TaoState
        from airflow_provider_tao_slurm.exceptions import ImageConversionError, ValidationError
        from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent

        try:
            parsed = JobEvent.from_dict(event, what="conversion trigger event")
            owner_of_job(parsed.job_name)
        except ValidationError as exc:
            raise ImageConversionError(
                f"the conversion trigger sent an unusable event ({exc}); check the triggerer's log and run the task "
                "again"
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

    def _log_tail(self, results_dir: str, job_id: str, job_name: str) -> str:
        """Return the last :data:`LOG_TAIL_BYTES` of the conversion's ``main.err`` and ``main.out``, redacted."""
        from airflow_provider_tao_slurm.core.layout import JobLayout
        from airflow_provider_tao_slurm.exceptions import TaoSlurmError
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        lifecycle = JobLifecycle(self.hook, self.log)
        sections = []
        for path in JobLayout(results_dir, job_name).log_paths(job_id)[::-1]:
            try:
                text = lifecycle.log_tail(path, LOG_TAIL_BYTES)
            except TaoSlurmError as exc:
                text = f"(could not read it: {exc})"
            sections.append(f"--- end of {path} ---\n{text.strip() or '(empty or missing)'}")
        return "\n".join(sections)

    def _remove_lock(self, lock: str, owner: str | None) -> None:
        from airflow_provider_tao_slurm.core.conversion import remove_lock
        from airflow_provider_tao_slurm.exceptions import ImageConversionError, RemoteCommandError

        try:
            self.hook.run(remove_lock(lock, owner), check=True, what="removing the conversion lock")
        except RemoteCommandError as exc:
            raise ImageConversionError(
                f"cannot remove the stale conversion lock {lock} ({exc}); if no conversion of this image is "
                f"running (squeue --me), remove it by hand: rm -rf {lock}"
            ) from None

    def _remove_lock_quietly(self, lock: str, owner: str | None) -> None:
        from airflow_provider_tao_slurm.core.conversion import remove_lock
        from airflow_provider_tao_slurm.exceptions import TaoSlurmError

        try:
            self.hook.run(remove_lock(lock, owner), check=True, what="removing the conversion lock")
        except TaoSlurmError as exc:
            self.log.warning("Could not remove the conversion lock %s (%s); the next run cleans it up", lock, exc)
