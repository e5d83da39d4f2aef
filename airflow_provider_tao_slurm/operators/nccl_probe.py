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

import time
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import DEFAULT_NCCL_CACHE_MAX_AGE_HOURS
from airflow_provider_tao_slurm.lifecycle.support import (
    check_flag,
    check_poll_interval_seconds,
    default_deferrable,
    lint_bash,
    place_on_cluster,
    renamed_attribute,
    renamed_parameter,
    utc_now,
)
from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.layout import JobLayout
    from airflow_provider_tao_slurm.core.nccl import ProbeAttempt, ProbeOutcome, ProbePlan
    from airflow_provider_tao_slurm.core.resources import Resources
    from airflow_provider_tao_slurm.lifecycle.events import JobEvent

#: Bytes of the end of each probe log that are judged (and shown on failure).
LOG_TAIL_BYTES = 65536
SHOWN_LOG_BYTES = 4096


def _probe_program() -> bytes:
    from airflow_provider_tao_slurm.core.nccl import PROBE_FILE

    return resources.files("airflow_provider_tao_slurm.probes").joinpath(PROBE_FILE).read_bytes()


def _env_text(env: Mapping[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in env.items()) or "(no NCCL settings)"


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
        """Return the cached environment, or submit the first probe job and defer."""
        from airflow_provider_tao_slurm.core.nccl import candidate_envs

        resources_ = self._resources()
        if not resources_.needs_nccl_probe:
            self.log.info("A job with one GPU runs no collective across GPUs: no NCCL probe needed")
            return {}
        count = len(candidate_envs(self.candidate_envs))
        plan = self._plan(resources_, self._job_names(context, count))
        if not self.force_reprobe:
            cached = self._cached(plan)
            if cached is not None:
                return cached
        return self._submit(context, plan, 0, [])

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
        from airflow_provider_tao_slurm.core.nccl import Verdict, candidate_envs, judge_probe
        from airflow_provider_tao_slurm.exceptions import NcclProbeError
        from airflow_provider_tao_slurm.lifecycle.events import EventStatus

        names = list(job_names) or self._job_names(context, len(candidate_envs(self.candidate_envs)))
        plan = self._plan(self._resources(), names)
        current, parsed = self._ended_attempt(plan, event, names)
        terminal = parsed.state if parsed.status is EventStatus.TERMINAL else None
        log_text = self._log_tail(current, parsed.slurm_job_id)
        outcome = judge_probe(
            native_state=terminal.native if terminal is not None else "",
            exit_code=terminal.exit_code if terminal is not None else None,
            log_text=log_text,
            world_size=plan.world_size,
            backend=plan.backend,
            partition=plan.resources.partition or "",
        )
        if outcome.verdict is Verdict.OK:
            self._cache(plan, current, parsed.slurm_job_id, outcome)
            return current.env
        history = self._given_up(plan, current, parsed, outcome, log_text, outcomes)
        if current.index + 1 < len(plan.attempts):
            self.log.warning("Trying the next NCCL candidate environment")
            return self._submit(context, plan, current.index + 1, history)
        raise NcclProbeError(
            f"no candidate NCCL environment passed the all-reduce probe over {plan.resources.num_nodes} node(s) x "
            f"{plan.resources.gpus_per_node} GPU(s) on cluster {plan.cluster!r}:\n- "
            + "\n- ".join(history)
            + "\nAsk the cluster admins for the site's NCCL settings (interface, InfiniBand HCA) and pass them "
            "as candidate_envs; the probe logs are under " + current.layout.log_dir
        )

    def _ended_attempt(self, plan: ProbePlan, event: Any, names: Sequence[str]) -> tuple[ProbeAttempt, JobEvent]:
        """Return the candidate whose probe job the event says ended, and the parsed event.

        :raises NcclProbeError: when the event is not about one of this task's probe jobs.
        """
        from airflow_provider_tao_slurm.core.storage import display_value
        from airflow_provider_tao_slurm.exceptions import NcclProbeError, ValidationError
        from airflow_provider_tao_slurm.lifecycle.events import JobEvent

        try:
            parsed: JobEvent | None = JobEvent.from_dict(event, what="probe trigger event")
        except ValidationError:
            parsed = None
        current = next((a for a in plan.attempts if parsed is not None and a.job_name == parsed.job_name), None)
        if current is None or parsed is None:
            raise NcclProbeError(
                f"the trigger sent {display_value(event)}, which is not the end of one of this task's probe jobs "
                f"({', '.join(names)}); check the triggerer's log and clear the task"
            )
        return current, parsed

    def _label(self, plan: ProbePlan, current: ProbeAttempt) -> str:
        return f"candidate {current.index + 1}/{len(plan.attempts)} [{_env_text(current.env)}]"

    def _cache(self, plan: ProbePlan, current: ProbeAttempt, slurm_job_id: str, outcome: ProbeOutcome) -> None:
        """Cache the candidate that passed (unless the cache cannot be read) and say so."""
        from airflow_provider_tao_slurm.core.nccl import GLOO, CachedEnv, cache_text
        from airflow_provider_tao_slurm.exceptions import RemoteReadError

        entry = CachedEnv(
            env=current.env,
            probed_at=utc_now(),
            slurm_job_id=slurm_job_id,
            nodes=plan.resources.num_nodes,
            gpus_per_node=plan.resources.gpus_per_node,
            backend=plan.backend,
            image=plan.key.image,
            seen=outcome.seen,
        )
        try:
            previous = self.hook.read_file(plan.cache_path)
        except RemoteReadError as exc:  # writing without it would drop the other entries
            self.log.warning("Cannot read the NCCL cache (%s): this result is not cached", exc)
        else:
            self.hook.write_file(plan.cache_path, cache_text(previous, plan.key, entry).encode(), "644")
        self.log.info(
            "NCCL probe passed with %s (SLURM job %s, backend %s; %s): %s; cached in %s for %s",
            self._label(plan, current),
            slurm_job_id,
            plan.backend,
            outcome.seen.describe(),
            outcome.detail,
            plan.cache_path,
            plan.key.describe(),
        )
        if plan.backend == GLOO:
            self.log.warning(
                "backend=%r: the probe all-reduced on the CPU, which says nothing about NCCL; use it only on a "
                "CPU test cluster",
                plan.backend,
            )

    def _given_up(
        self,
        plan: ProbePlan,
        current: ProbeAttempt,
        parsed: JobEvent,
        outcome: ProbeOutcome,
        log_text: str,
        outcomes: Sequence[str],
    ) -> list[str]:
        """Cancel a candidate that did not pass and say why; the history so far, or the error that ends the probe.

        :raises NcclProbeError: when no other candidate can help (no CUDA, a setup error, an unfinished job).
        """
        from airflow_provider_tao_slurm.core.nccl import Verdict
        from airflow_provider_tao_slurm.core.secrets import redact_text
        from airflow_provider_tao_slurm.exceptions import NcclProbeError
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        slurm_job_id, label = parsed.slurm_job_id, self._label(plan, current)
        # The job has ended (the trigger only fires on a terminal state); cancelling it anyway makes
        # sure no step of a hung probe is left behind before the next candidate takes the nodes.
        JobLifecycle(self.hook, self.log).cancel_job(slurm_job_id, current.job_name, source="NCCL probe given up")
        self.log.warning(
            "NCCL probe %s: %s (SLURM job %s, %s, exit code %s): %s\n%s",
            label,
            outcome.verdict,
            slurm_job_id,
            parsed.state.native if parsed.state is not None else "no state",
            parsed.state.exit_code if parsed.state is not None else None,
            outcome.detail,
            redact_text(log_text[-SHOWN_LOG_BYTES:]),
        )
        logs = current.layout.job_log_dir(slurm_job_id)
        if outcome.verdict is Verdict.NO_CUDA:
            raise NcclProbeError(
                f"the NCCL probe on cluster {plan.cluster!r} cannot prove NCCL: {outcome.detail}. Logs: {logs}"
            )
        if outcome.verdict is Verdict.SETUP_ERROR:
            raise NcclProbeError(
                f"the NCCL probe could not start on cluster {plan.cluster!r}: {outcome.detail}. Check that the "
                f"image has PyTorch for python={self.python!r} and that results_dir is mounted in the container "
                f"at the same path. Logs: {logs}"
            )
        if not outcome.verdict.next_candidate_may_help:
            raise NcclProbeError(
                f"the NCCL probe job {slurm_job_id} did not finish ({outcome.detail}), which says nothing about "
                "the NCCL settings; run the task again"
            )
        return [*outcomes, f"{label}: {outcome.verdict} (SLURM job {slurm_job_id}): {outcome.detail}"]

    def _resources(self) -> Resources:
        from airflow_provider_tao_slurm.core.nccl import MIN_TIMEOUT_S, WALL_GRACE_S, check_backend, check_max_age
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

    def _job_names(self, context: Any, count: int) -> list[str]:
        """One job name per candidate: a chain from this try's id, so each attempt is its own job."""
        from airflow_provider_tao_slurm.core.records import mint_job_id

        ti = context["ti"]
        names = [mint_job_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, try_number=ti.try_number)]
        while len(names) < count:
            names.append(
                mint_job_id(
                    ti.dag_id, ti.task_id, ti.run_id, ti.map_index, try_number=ti.try_number, retry_of=names[-1]
                )
            )
        return names

    def _plan(self, resources_: Resources, job_names: Sequence[str]) -> ProbePlan:
        """Render every candidate's script up front, so a bad candidate fails before anything is submitted."""
        from airflow_provider_tao_slurm.core.layout import JobLayout
        from airflow_provider_tao_slurm.core.nccl import ProbePlan, cache_key, cache_path, candidate_envs
        from airflow_provider_tao_slurm.exceptions import NcclProbeError

        image_path, results_dir = self._image_and_results_dir()
        envs = candidate_envs(self.candidate_envs)
        if len(job_names) != len(envs):
            raise NcclProbeError(
                f"the deferred probe knew {len(job_names)} candidate(s) but candidate_envs now has {len(envs)}; "
                "clear the task to probe again"
            )
        layouts = [JobLayout(results_dir, name) for name in job_names]
        commands_ = [self._probe_command(layout, resources_) for layout in layouts]
        # Only now, with every input checked, ask the cluster for the partition, its limit and its GPUs.
        placed = place_on_cluster(
            self.hook, resources_, param="the probe's wall time (timeout_seconds + grace, in hours)"
        )
        attempts = tuple(
            self._attempt(index, env, layout, command, placed, image_path)
            for index, (env, layout, command) in enumerate(zip(envs, layouts, commands_, strict=True))
        )
        chosen = (placed.partition or "").split(",")
        key = cache_key(self.hook.settings.cluster_name, chosen, placed.num_nodes, self.backend, image_path)
        return ProbePlan(resources=placed, key=key, cache_path=cache_path(results_dir, key), attempts=attempts)

    def _image_and_results_dir(self) -> tuple[str, str]:
        """Return the probe's ``.sqsh`` image and the connection's results directory.

        :raises ImageReferenceError: for a registry reference (the probe runs only converted images).
        :raises ConnectionConfigError: when the connection has no results_dir.
        """
        from airflow_provider_tao_slurm.core.images import parse_image
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

    def _probe_command(self, layout: JobLayout, resources_: Resources) -> str:
        """Build the probe's command line (checks ``python`` and ``backend`` before anything asks the cluster)."""
        from airflow_provider_tao_slurm.core.nccl import PROBE_FILE, probe_command

        return probe_command(
            f"{layout.inputs_dir}/{PROBE_FILE}",
            nodes=resources_.num_nodes,
            gpus_per_node=resources_.gpus_per_node,
            python=self.python,
            backend=self.backend,
        )

    def _attempt(
        self,
        index: int,
        env: Mapping[str, str],
        layout: JobLayout,
        command: str,
        resources_: Resources,
        image_path: str,
    ) -> ProbeAttempt:
        """Render candidate ``index``'s probe job: its batch script for the placed resources.

        :raises ValidationError: naming the candidate when its environment cannot be used.
        """
        from airflow_provider_tao_slurm.core.nccl import ProbeAttempt
        from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch, resource_fields
        from airflow_provider_tao_slurm.exceptions import ValidationError

        try:
            script = render_sbatch(
                SbatchSpec(
                    **{**resource_fields(resources_), "requeue": False},
                    job_name=layout.job_id,
                    log_dir=layout.log_dir,
                    job_dir=layout.job_dir,
                    image=image_path,
                    container_mounts=self.container_mounts or self.hook.settings.container_mounts,
                    command=command,
                    nccl_env=env,
                    exit_code_file=layout.exit_code_path,
                )
            )
        except ValidationError as exc:
            raise ValidationError(f"candidate_envs[{index}] cannot be used: {exc}") from None
        return ProbeAttempt(index=index, env=dict(env), layout=layout, script=script)

    # ------------------------------------------------------------------ on the cluster

    def _cached(self, plan: ProbePlan) -> dict[str, str] | None:
        from airflow_provider_tao_slurm.core.nccl import lookup_cache
        from airflow_provider_tao_slurm.exceptions import RemoteReadError

        try:
            text = self.hook.read_file(plan.cache_path)
        except RemoteReadError as exc:
            self.log.warning("Cannot read the NCCL cache (%s): probing", exc)
            return None
        found = lookup_cache(
            text,
            plan.key,
            now=utc_now(),
            max_age_hours=float(self.cache_max_age_hours),
        )
        entry = found.entry
        if entry is None:
            self.log.info(
                "No usable cached NCCL environment for %s in %s (%s): probing",
                plan.key.describe(),
                plan.cache_path,
                found.reason,
            )
            return None
        self.log.info(
            "Using the cached NCCL environment [%s] for %s, proven by SLURM job %s at %s on %d x %d GPUs (%s); "
            "no probe job submitted (force_reprobe=True probes again). Cache: %s",
            _env_text(entry.env),
            plan.key.describe(),
            entry.slurm_job_id,
            entry.probed_at,
            entry.nodes,
            entry.gpus_per_node,
            entry.seen.describe(),
            plan.cache_path,
        )
        return entry.env

    def _submit(self, context: Any, plan: ProbePlan, index: int, outcomes: list[str]) -> dict[str, str]:
        """Stage and submit the probe of candidate ``index``, then wait until it ends (deferred or in the worker)."""
        from airflow_provider_tao_slurm.core.nccl import PROBE_FILE
        from airflow_provider_tao_slurm.core.records import check_slurm_job_id
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
        from airflow_provider_tao_slurm.lifecycle.submission import submit_job
        from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

        attempt = plan.attempts[index]
        layout = attempt.layout
        lint_bash(attempt.script)

        def rel(path: str) -> str:
            return path[len(layout.base) + 1 :]

        self.hook.stage_files(
            layout.base,
            {
                rel(layout.job_dir): (None, 0o755),
                rel(layout.inputs_dir): (None, 0o755),
                rel(f"{layout.inputs_dir}/{PROBE_FILE}"): (_probe_program(), 0o644),
                rel(layout.script_path): (attempt.script.encode(), 0o700),
            },
        )
        submitted_at = time.time()
        reply = submit_job(self.hook, layout.script_path, attempt.job_name, log_dir=layout.log_dir, log=self.log)
        slurm_job_id = check_slurm_job_id(reply)
        self.log.info(
            "NCCL probe candidate %d/%d [%s]: SLURM job %s (%s) over %d node(s) x %d GPU(s), timeout %d s; logs %s",
            index + 1,
            len(plan.attempts),
            _env_text(attempt.env),
            slurm_job_id,
            attempt.job_name,
            plan.resources.num_nodes,
            plan.resources.gpus_per_node,
            plan.resources.timeout_seconds,
            layout.job_log_dir(slurm_job_id),
        )
        job_names = [a.job_name for a in plan.attempts]
        if not self.deferrable:
            event = JobLifecycle(self.hook, self.log).wait_until_ended(
                slurm_job_id,
                attempt.job_name,
                submitted_at=submitted_at,
                poll_interval=float(self.poll_interval_seconds),
            )
            return self.execute_complete(context, event, job_names=job_names, outcomes=outcomes)
        self.defer(
            trigger=SlurmJobTrigger(
                slurm_conn_id=self.slurm_conn_id,
                slurm_job_id=slurm_job_id,
                job_name=attempt.job_name,
                poll_interval=float(self.poll_interval_seconds),
                submitted_at=submitted_at,
            ),
            method_name="execute_complete",
            kwargs={"job_names": job_names, "outcomes": outcomes},
        )

    def _log_tail(self, attempt: ProbeAttempt, slurm_job_id: str) -> str:
        """Return the last :data:`LOG_TAIL_BYTES` of the probe's ``main.out`` and ``main.err``."""
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        lifecycle = JobLifecycle(self.hook, self.log)
        return "\n".join(
            f"--- {path} ---\n{lifecycle.log_tail(path, LOG_TAIL_BYTES)}"
            for path in attempt.layout.log_paths(slurm_job_id)
        )
