"""``NcclProbeOperator``: find NCCL settings under which an all-reduce works, before a multi-GPU job runs.

The probe is a tiny job of the same shape as the real one (nodes x GPUs per node) rendered with
the provider's sbatch template: torchrun starts one probe process per GPU
(:mod:`airflow_provider_tao_slurm.probes.nccl_probe`, staged next to the script), which
all-reduces once and checks the sum. The job's own ``timeout`` bounds a hung collective (and its
wall limit backs that up), so a hang ends the job by itself; the task waits deferred on
:class:`~airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger` meanwhile. After a hang or
a failed collective the job is cancelled (a no-op once it has ended, but it leaves nothing behind)
and the next candidate environment is tried. The first environment that works is cached per
cluster, partition and node-count scope on shared storage and returned; a later run finds it there
and submits nothing, until the entry expires, the image changes or a later probe of the partition
sees another driver or NCCL version (:mod:`airflow_provider_tao_slurm.core.nccl`).

The probe proves NCCL: it is told ``backend="nccl"`` and a container without CUDA fails the task
at once with the reason (no other NCCL setting is tried). ``backend="gloo"`` all-reduces on the CPU
and is only for a CPU test cluster (such as this project's local SLURM test cluster).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import DEFAULT_NCCL_CACHE_MAX_AGE_HOURS
from airflow_provider_tao_slurm.lifecycle.support import (
    check_flag,
    check_poll_interval_seconds,
    default_deferrable,
    renamed_attribute,
    renamed_parameter,
)
from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.resources import Resources
    from airflow_provider_tao_slurm.lifecycle.probe import NcclProbe

# The probe itself (candidates, submit, judge, cache) is the lifecycle's
# (:mod:`airflow_provider_tao_slurm.lifecycle.probe`). Run-time modules (the lifecycle, core's domain
# modules, the trigger) are imported inside the methods that run a task: a DAG file that imports this
# operator loads none of them (tests/unit/test_dag_parse.py).


class NcclProbeOperator(SlurmBaseOperator):
    """Probe NCCL with one all-reduce over ``nodes`` x ``gpus_per_node`` GPUs; return the working environment.

    Put it upstream of a multi-node :class:`SbatchSubmitOperator` (or one with several GPUs per
    node) and pass its output as ``nccl_env``. Candidates are tried in order until one passes; a
    hang (no result within ``timeout_seconds``) or a failed all-reduce moves on to the next one,
    a probe that cannot start at all (no PyTorch, a bad rendezvous) or that finds no CUDA in the
    container while NCCL is required fails the task at once. The winner is cached per cluster and
    partition (``<results_dir>/nccl/<cluster>.<partition>.json``, one entry per node-count scope,
    multi-node or single-node, and backend) and returned; while the entry is usable no probe job is
    submitted unless ``force_reprobe``. An entry is not used once it is older than ``cache_max_age_hours``,
    when it was proven with another image (the NCCL library ships in the image), or when a later
    probe of the same partition saw another NVIDIA driver or NCCL version than it did. A job of one
    GPU needs no probe: the result is ``{}`` at once.

    The probe program is staged under ``results_dir``, which must be mounted in the container at
    the same path (as for the training job's spec), and runs with ``python -m torch.distributed.run``.

    ``slurm_conn_id`` (the ``tao_slurm`` connection, default ``slurm_default``) and the ``BaseOperator``
    arguments (``task_id``, ``retries``, ...) are passed on through ``**kwargs``.

    :param image: ``.sqsh`` path of the training image (it needs PyTorch); templated.
    :param num_nodes: nodes of the real job (formerly ``nodes``, still accepted with a deprecation
        warning for one release).
    :param gpus_per_node: GPUs per node of the real job.
    :param timeout_seconds: how long one probe may take once running, before it counts as hung; templated.
    :param candidate_envs: environments to try in order (dicts of strings); default: none, then
        ``NCCL_P2P_DISABLE=1``, then also ``NCCL_IB_DISABLE=1`` and ``NCCL_SOCKET_IFNAME=^lo,docker``;
        templated.
    :param backend: ``"nccl"`` (default): the all-reduce runs on the GPUs with NCCL, and a container
        without CUDA fails the task (check the image, the GPU request, ``--container-image``).
        ``"gloo"``: the all-reduce runs on the CPU, which proves nothing about NCCL; only for a CPU
        test cluster without CUDA; templated.
    :param cache_max_age_hours: how long a cached environment is used before the probe runs again
        (default 168, a week).
    :param force_reprobe: probe even when the cache has an answer (the new answer replaces it); templated
        (formerly ``force``, still accepted with a deprecation warning for one release).
    :param python: the image's Python with PyTorch; templated.
    :param partition: GPU partition(s); default from the connection, else the cluster's default; templated.
    :param account: SLURM account; default from the connection; templated.
    :param container_mounts: Pyxis mounts ``SRC:DST[,...]``; default from the connection; templated.
    :param cpus_per_task: CPUs per node (default: one per GPU).
    :param mem_mb: memory per node in MB (default: the partition's).
    :param poll_interval_seconds: seconds between status polls (shared per cluster when deferred; formerly
        ``poll_interval``, still accepted with a deprecation warning for one release).
    :param deferrable: wait for each probe job in the triggerer instead of the worker; default:
        Airflow's ``[operators] default_deferrable``.
    :param qos: SLURM QOS of the probe jobs (use the real job's).
    :param reservation: SLURM reservation(s) of the probe jobs.
    :param constraint: node features (``--constraint``), as the real job asks.
    :param gpu_type: GPU type (``--gres=gpu:<type>:<n>``), as the real job asks.
    :param sbatch_options: more sbatch options ``{long-name: value}``, validated as for ``SbatchSubmitOperator``.
    :rtype: dict[str, str]
    :returns: the working NCCL environment, e.g. ``{"NCCL_P2P_DISABLE": "1"}`` (``{}``: no settings needed).
    """

    template_fields: Sequence[str] = (
        "image",
        "backend",
        "candidate_envs",
        "force_reprobe",
        "timeout_seconds",
        "python",
        "partition",
        "account",
        "container_mounts",
    )
    template_fields_renderers = {"candidate_envs": "json"}
    #: The old name of ``poll_interval_seconds``, read-only while the old parameter name is accepted.
    poll_interval = renamed_attribute("poll_interval_seconds")

    def __init__(
        self,
        *,
        image: str,
        num_nodes: int = 2,
        gpus_per_node: int = 1,
        timeout_seconds: int = 120,
        candidate_envs: Sequence[Mapping[str, str]] | None = None,
        backend: str = "nccl",
        cache_max_age_hours: float = DEFAULT_NCCL_CACHE_MAX_AGE_HOURS,
        force_reprobe: bool = False,
        python: str = "python3",
        partition: str | None = None,
        account: str | None = None,
        container_mounts: str | None = None,
        cpus_per_task: int | None = None,
        mem_mb: int | None = None,
        poll_interval_seconds: float = 10.0,
        deferrable: bool = default_deferrable(),
        qos: str | None = None,
        reservation: str | None = None,
        constraint: str | None = None,
        gpu_type: str | None = None,
        sbatch_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        num_nodes = renamed_parameter(kwargs, "nodes", "num_nodes", num_nodes, 2)
        force_reprobe = renamed_parameter(kwargs, "force", "force_reprobe", force_reprobe, False)
        poll_interval_seconds = renamed_parameter(
            kwargs, "poll_interval", "poll_interval_seconds", poll_interval_seconds, 10.0
        )
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.qos = qos
        self.reservation = reservation
        self.constraint = constraint
        self.gpu_type = gpu_type
        self.sbatch_options = sbatch_options
        self.image = image
        self.num_nodes = num_nodes
        self.gpus_per_node = gpus_per_node
        self.timeout_seconds = timeout_seconds
        self.candidate_envs = candidate_envs
        self.backend = backend
        self.cache_max_age_hours = cache_max_age_hours
        self.force_reprobe = force_reprobe
        self.python = python
        self.partition = partition
        self.account = account
        self.container_mounts = container_mounts
        self.cpus_per_task = cpus_per_task
        self.mem_mb = mem_mb
        self.poll_interval_seconds = poll_interval_seconds

    # ------------------------------------------------------------------ entry points

    def execute(self, context: Any) -> dict[str, str]:
        """Return the cached environment, or submit the first probe job and wait for it (deferred or in the worker)."""
        from airflow_provider_tao_slurm.core.nccl import candidate_envs  # run time only (see above)
        from airflow_provider_tao_slurm.lifecycle.probe import probe_job_names

        resources_ = self._resources()
        if not resources_.needs_nccl_probe:
            self.log.info("A job with one GPU runs no collective across GPUs: no NCCL probe needed")
            return {}
        count = len(candidate_envs(self.candidate_envs))
        probe = self._probe(resources_, probe_job_names(context["ti"], count))
        if not self.force_reprobe:
            cached = probe.cached(float(self.cache_max_age_hours))
            if cached is not None:
                return cached
        return self._run(context, probe, 0, [])

    def execute_complete(
        self,
        context: Any,
        event: Any = None,
        job_names: Sequence[str] = (),
        outcomes: Sequence[str] = (),
    ) -> dict[str, str]:
        """Judge the finished probe job: cache and return its environment, or try the next candidate.

        The event names the job (and so the candidate). ``job_names`` and ``outcomes`` come from the
        deferral; where they are lost (``airflow dags test`` resumes with the event only) the names
        are minted again from the context, as they were before the deferral.
        """
        from airflow_provider_tao_slurm.core.nccl import candidate_envs  # run time only (see above)
        from airflow_provider_tao_slurm.lifecycle.probe import probe_job_names

        names = list(job_names) or probe_job_names(context["ti"], len(candidate_envs(self.candidate_envs)))
        probe = self._probe(self._resources(), names)
        judged = probe.judge(event, names, outcomes)
        if isinstance(judged, dict):
            return judged
        index, history = judged
        return self._run(context, probe, index, history)

    def _run(self, context: Any, probe: NcclProbe, index: int, outcomes: list[str]) -> dict[str, str]:
        """Submit the probe of candidate ``index``, wait until it ends (deferred or in the worker), judge it."""
        from airflow_provider_tao_slurm.lifecycle.waiting import wait_for_job  # run time only (see above)
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

        job_names = probe.job_names
        event = wait_for_job(
            self,
            probe.submit(index),
            trigger=SlurmJobTrigger,
            poll_interval=float(self.poll_interval_seconds),
            kwargs={"job_names": job_names, "outcomes": outcomes},
        )
        return self.execute_complete(context, event, job_names=job_names, outcomes=outcomes)

    # ------------------------------------------------------------------ validation (no SSH)

    def _resources(self) -> Resources:
        """Check every parameter (no SSH) and return the probe job's resources as requested."""
        from airflow_provider_tao_slurm.core.nccl import (  # run time only (see above)
            MIN_TIMEOUT_S,
            WALL_GRACE_S,
            check_backend,
            check_max_age,
        )
        from airflow_provider_tao_slurm.core.resources import check_count, check_job_parameters, gpu_resources
        from airflow_provider_tao_slurm.exceptions import ValidationError

        for name in ("num_nodes", "gpus_per_node", "timeout_seconds"):
            check_count(name, getattr(self, name))
        if self.timeout_seconds < MIN_TIMEOUT_S:
            raise ValidationError(
                f"timeout_seconds={self.timeout_seconds} leaves no time to start PyTorch; give at least {MIN_TIMEOUT_S}"
            )
        for flag in ("force_reprobe", "deferrable"):
            check_flag(flag, getattr(self, flag))
        check_backend(self.backend)
        check_max_age(self.cache_max_age_hours)
        check_poll_interval_seconds(self.poll_interval_seconds)
        settings = self.hook.settings
        job = check_job_parameters(
            partition=self.partition or settings.partitions,
            account=self.account or settings.account,
            cpus_per_task=self.gpus_per_node if self.cpus_per_task is None else self.cpus_per_task,
            mem_mb=self.mem_mb,
            time_hours=(self.timeout_seconds + WALL_GRACE_S) / 3600,
            gpu_type=self.gpu_type,
            qos=self.qos,
            constraint=self.constraint,
            reservation=self.reservation,
            sbatch_options=self.sbatch_options,
        )
        return gpu_resources(
            job,
            num_nodes=self.num_nodes,
            gpus_per_node=self.gpus_per_node,
            timeout_hours=self.timeout_seconds / 3600,
            max_time_hours=settings.max_time_hours,
            requeue=False,
        )

    def _image_and_results_dir(self) -> tuple[str, str]:
        """Return the probe's ``.sqsh`` image and the connection's results directory.

        :raises ImageReferenceError: for a registry reference (the probe runs only converted images).
        :raises ConnectionConfigError: when the connection has no results_dir.
        """
        from airflow_provider_tao_slurm.core.images import parse_image  # run time only (see above)
        from airflow_provider_tao_slurm.core.storage import display_value
        from airflow_provider_tao_slurm.exceptions import ConnectionConfigError, ImageReferenceError

        image = parse_image(self.image)
        if image.path is None:
            raise ImageReferenceError(
                f"image {display_value(self.image)} is a registry reference; the probe is a GPU job and only runs "
                ".sqsh files. Put EnrootImportOperator upstream and pass its output as image"
            )
        if not self.hook.settings.results_dir:
            raise ConnectionConfigError(
                f"connection {self.slurm_conn_id!r} has no results_dir: set the shared base directory "
                "(extra results_dir or SLURM_BASE_RESULTS_DIR); the probe and its cache live there"
            )
        return image.path, self.hook.settings.results_dir

    def _probe(self, resources_: Resources, job_names: Sequence[str]) -> NcclProbe:
        """Return the probe of every candidate, each job's script rendered (a bad one fails before any submission)."""
        from airflow_provider_tao_slurm.lifecycle.probe import NcclProbe, probe_plan  # run time only (see above)

        image_path, results_dir = self._image_and_results_dir()
        plan = probe_plan(
            self.hook,
            resources_,
            job_names,
            image_path=image_path,
            results_dir=results_dir,
            candidates=self.candidate_envs,
            backend=self.backend,
            python=self.python,
            container_mounts=self.container_mounts,
        )
        return NcclProbe(self.hook, self.log, plan, python=self.python)
