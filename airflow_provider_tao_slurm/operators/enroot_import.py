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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import CONVERSION_TIME_HOURS
from airflow_provider_tao_slurm.lifecycle.support import (
    check_flag,
    check_poll_interval_seconds,
    default_deferrable,
    renamed_attribute,
    renamed_parameter,
)
from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.conversion import SubmittedConversion
    from airflow_provider_tao_slurm.core.images import ImageRef
    from airflow_provider_tao_slurm.core.resources import JobParameters
    from airflow_provider_tao_slurm.lifecycle.conversion import Conversion

# The conversion itself (lock, submit or adopt, wait, verify) is the lifecycle's
# (:mod:`airflow_provider_tao_slurm.lifecycle.conversion`). Run-time modules (the lifecycle, core's
# domain modules, the trigger) are imported inside the methods that run a task: a DAG file that
# imports this operator loads none of them (tests/unit/test_dag_parse.py).


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
        from airflow_provider_tao_slurm.lifecycle.conversion import existing_image  # run time only (see above)
        from airflow_provider_tao_slurm.lifecycle.waiting import wait_for_job
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

        image = self._image()
        if image.path is not None:
            return existing_image(self.hook, self.log, image.path)
        owner = secrets.token_hex(8)
        job = self._job_parameters()  # every resource parameter checked before any SSH
        conversion = self._conversion(image)
        script = conversion.script(
            job, owner, cpus=self.cpus_per_task, mem_mb=self.mem_mb, time_minutes=self._time_minutes()
        )
        started = conversion.start(script, owner)
        if isinstance(started, str):
            return started
        self._converting = None if started.adopted else started
        event = wait_for_job(
            self,
            conversion.handle(started),
            trigger=SlurmJobTrigger,
            poll_interval=self.poll_interval_seconds,
            cancel_on_kill=not started.adopted,  # a conversion another run shares is its to cancel
        )
        return self.execute_complete(context, event)

    def on_kill(self) -> None:
        """Cancel the conversion the task submitted: a user killed the task while it waited in the worker.

        A conversion adopted from another run is left running for that run; a deferred task is
        killed through its trigger, which cancels only a conversion this task submitted.
        """
        from airflow_provider_tao_slurm.lifecycle.conversion import cancel_conversion  # run time only (see above)

        if self._converting is not None:
            cancel_conversion(self.hook, self.log, self._converting)

    def execute_complete(self, context: Any, event: Any = None) -> str:
        """Check the trigger's event and the converted file; fail with the conversion log's tail."""
        return self._conversion(self._image()).finish(event)

    # ------------------------------------------------------------------ validation (no SSH)

    def _job_parameters(self) -> JobParameters:
        """Return the conversion job's resource parameters, checked as every submitting operator checks them.

        :raises ResourceError: (or ``ValidationError`` for a site option) naming the parameter and the fix.
        """
        from airflow_provider_tao_slurm.core.resources import check_job_parameters  # run time only (see above)
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
        """Check the flags and the image reference (no SSH); return the parsed image."""
        from airflow_provider_tao_slurm.core.images import parse_image  # run time only (see above)
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

    def _conversion(self, image: ImageRef) -> Conversion:
        """Return the conversion of ``image`` into its target (no SSH; a missing results_dir fails here)."""
        from airflow_provider_tao_slurm.lifecycle.conversion import Conversion, conversion_plan  # run time only

        plan = conversion_plan(
            self.hook.settings,
            self.slurm_conn_id,
            image,
            sqsh_path=self.sqsh_path,
            containers_dir=self.containers_dir,
            partition=self.partition,
            account=self.account,
        )
        return Conversion(
            self.hook,
            self.log,
            plan,
            force_reconvert_latest=self.force_reconvert_latest,
            registry_conn_id=self.registry_conn_id,
        )
