"""One NCCL probe: its candidates' jobs planned, each submitted in turn, judged, and the winner cached.

:class:`NcclProbe` carries out what :mod:`airflow_provider_tao_slurm.core.nccl` decides: every
candidate's batch script is rendered up front (a bad candidate fails before anything is submitted),
the per-cluster cache is read before any job and written after the first candidate that passes, and
a candidate that hung or failed its all-reduce is cancelled (nothing of it left behind) before the
next one is tried. The waiting itself is :func:`~.waiting.wait_for_job`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.nccl import (
    GLOO,
    PROBE_FILE,
    CachedEnv,
    ProbeAttempt,
    ProbeOutcome,
    ProbePlan,
    Verdict,
    cache_key,
    cache_path,
    cache_text,
    candidate_envs,
    judge_probe,
    lookup_cache,
    probe_command,
)
from airflow_provider_tao_slurm.core.records import check_slurm_job_id, mint_job_id
from airflow_provider_tao_slurm.core.secrets import redact_text
from airflow_provider_tao_slurm.core.storage import display_value
from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch, resource_fields
from airflow_provider_tao_slurm.exceptions import NcclProbeError, RemoteReadError, ValidationError
from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent, JobHandle
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
from airflow_provider_tao_slurm.lifecycle.submission import submit_job
from airflow_provider_tao_slurm.lifecycle.support import lint_bash, place_on_cluster, utc_now
from airflow_provider_tao_slurm.lifecycle.waiting import layout_handle, log_tails

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.resources import Resources
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

#: Bytes of the end of each probe log that are judged (and shown on failure).
LOG_TAIL_BYTES = 65536
#: Bytes of a failed candidate's log shown in the task log.
SHOWN_LOG_BYTES = 4096


def probe_program() -> bytes:
    """Return the probe program staged next to each probe job's script (package data)."""
    return resources.files("airflow_provider_tao_slurm.probes").joinpath(PROBE_FILE).read_bytes()


def env_text(env: Mapping[str, str]) -> str:
    """Return an NCCL environment as the task log shows it."""
    return " ".join(f"{name}={value}" for name, value in env.items()) or "(no NCCL settings)"


def probe_job_names(ti: Any, count: int) -> list[str]:
    """One job name per candidate: a chain from this try's id, so each attempt is its own job."""
    names = [mint_job_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, try_number=ti.try_number)]
    while len(names) < count:
        names.append(
            mint_job_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, try_number=ti.try_number, retry_of=names[-1])
        )
    return names


def probe_plan(
    hook: SlurmHook,
    resources_: Resources,
    job_names: Sequence[str],
    *,
    image_path: str,
    results_dir: str,
    candidates: Sequence[Mapping[str, str]] | None,
    backend: str,
    python: str,
    container_mounts: str | None,
) -> ProbePlan:
    """Render every candidate's script up front, so a bad candidate fails before anything is submitted.

    :param job_names: one per candidate (:func:`probe_job_names`, or the deferral's).
    :param candidates: the operator's ``candidate_envs`` (None: the default candidates).
    :raises NcclProbeError: when the names do not match the candidates (``candidate_envs`` changed since).
    """
    envs = candidate_envs(candidates)
    if len(job_names) != len(envs):
        raise NcclProbeError(
            f"the deferred probe knew {len(job_names)} candidate(s) but candidate_envs now has {len(envs)}; "
            "clear the task to probe again"
        )
    layouts = [JobLayout(results_dir, name) for name in job_names]
    commands_ = [
        probe_command(
            f"{layout.inputs_dir}/{PROBE_FILE}",
            nodes=resources_.num_nodes,
            gpus_per_node=resources_.gpus_per_node,
            python=python,
            backend=backend,
        )
        for layout in layouts
    ]
    # Only now, with every input checked, ask the cluster for the partition, its limit and its GPUs.
    placed = place_on_cluster(hook, resources_, param="the probe's wall time (timeout_seconds + grace, in hours)")
    mounts = container_mounts or hook.settings.container_mounts
    attempts = tuple(
        _attempt(index, env, layout, command, placed, image_path, mounts)
        for index, (env, layout, command) in enumerate(zip(envs, layouts, commands_, strict=True))
    )
    chosen = (placed.partition or "").split(",")
    key = cache_key(hook.settings.cluster_name, chosen, placed.num_nodes, backend, image_path)
    return ProbePlan(resources=placed, key=key, cache_path=cache_path(results_dir, key), attempts=attempts)


def _attempt(
    index: int,
    env: Mapping[str, str],
    layout: JobLayout,
    command: str,
    resources_: Resources,
    image_path: str,
    container_mounts: str | None,
) -> ProbeAttempt:
    """Render candidate ``index``'s probe job: its batch script for the placed resources.

    :raises ValidationError: naming the candidate when its environment cannot be used.
    """
    try:
        script = render_sbatch(
            SbatchSpec(
                **{**resource_fields(resources_), "requeue": False},
                job_name=layout.job_id,
                log_dir=layout.log_dir,
                job_dir=layout.job_dir,
                image=image_path,
                container_mounts=container_mounts,
                command=command,
                nccl_env=env,
                exit_code_file=layout.exit_code_path,
            )
        )
    except ValidationError as exc:
        raise ValidationError(f"candidate_envs[{index}] cannot be used: {exc}") from None
    return ProbeAttempt(index=index, env=dict(env), layout=layout, script=script)


class NcclProbe:
    """The probe of one plan: read the cache, submit a candidate's job, judge its end, cache the winner.

    :param hook: the cluster's hook.
    :param log: the task's logger.
    :param plan: the candidates' jobs and the cache entry (:func:`probe_plan`).
    :param python: the image's Python (named when the probe could not start).
    """

    def __init__(self, hook: SlurmHook, log: Any, plan: ProbePlan, *, python: str) -> None:
        self.hook = hook
        self.log = log
        self.plan = plan
        self.python = python

    @property
    def job_names(self) -> list[str]:
        """Every candidate's job name, in order."""
        return [attempt.job_name for attempt in self.plan.attempts]

    def label(self, current: ProbeAttempt) -> str:
        """How the task log names a candidate."""
        return f"candidate {current.index + 1}/{len(self.plan.attempts)} [{env_text(current.env)}]"

    def cached(self, max_age_hours: float) -> dict[str, str] | None:
        """Return the cached environment when the cache has a usable entry for the plan's key, else None."""
        plan = self.plan
        try:
            text = self.hook.read_file(plan.cache_path)
        except RemoteReadError as exc:
            self.log.warning("Cannot read the NCCL cache (%s): probing", exc)
            return None
        found = lookup_cache(text, plan.key, now=utc_now(), max_age_hours=float(max_age_hours))
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
            env_text(entry.env),
            plan.key.describe(),
            entry.slurm_job_id,
            entry.probed_at,
            entry.nodes,
            entry.gpus_per_node,
            entry.seen.describe(),
            plan.cache_path,
        )
        return entry.env

    def submit(self, index: int) -> JobHandle:
        """Stage and submit the probe of candidate ``index``; return the handle to wait on."""
        plan = self.plan
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
                rel(f"{layout.inputs_dir}/{PROBE_FILE}"): (probe_program(), 0o644),
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
            env_text(attempt.env),
            slurm_job_id,
            attempt.job_name,
            plan.resources.num_nodes,
            plan.resources.gpus_per_node,
            plan.resources.timeout_seconds,
            layout.job_log_dir(slurm_job_id),
        )
        return layout_handle(layout, slurm_job_id, submitted_at)

    def judge(
        self, event: Any, names: Sequence[str], outcomes: Sequence[str]
    ) -> dict[str, str] | tuple[int, list[str]]:
        """Judge the probe job the event says ended: its environment when it passed (cached), else what is next.

        :returns: the working environment, or the index of the next candidate to try and the history so far.
        :raises NcclProbeError: when the event is not about this probe, no other candidate can help, or none is left.
        """
        plan = self.plan
        current, parsed = self._ended_attempt(event, names)
        terminal = parsed.state if parsed.status is EventStatus.TERMINAL else None
        log_text = self.log_tail(current, parsed.slurm_job_id)
        outcome = judge_probe(
            native_state=terminal.native if terminal is not None else "",
            exit_code=terminal.exit_code if terminal is not None else None,
            log_text=log_text,
            world_size=plan.world_size,
            backend=plan.backend,
            partition=plan.resources.partition or "",
        )
        if outcome.verdict is Verdict.OK:
            self._cache(current, parsed.slurm_job_id, outcome)
            return current.env
        history = self._given_up(current, parsed, outcome, log_text, outcomes)
        if current.index + 1 < len(plan.attempts):
            self.log.warning("Trying the next NCCL candidate environment")
            return current.index + 1, history
        raise NcclProbeError(
            f"no candidate NCCL environment passed the all-reduce probe over {plan.resources.num_nodes} node(s) x "
            f"{plan.resources.gpus_per_node} GPU(s) on cluster {plan.cluster!r}:\n- "
            + "\n- ".join(history)
            + "\nAsk the cluster admins for the site's NCCL settings (interface, InfiniBand HCA) and pass them "
            "as candidate_envs; the probe logs are under " + current.layout.log_dir
        )

    def _ended_attempt(self, event: Any, names: Sequence[str]) -> tuple[ProbeAttempt, JobEvent]:
        """Return the candidate whose probe job the event says ended, and the parsed event.

        :raises NcclProbeError: when the event is not about one of this task's probe jobs.
        """
        try:
            parsed: JobEvent | None = JobEvent.from_dict(event, what="probe trigger event")
        except ValidationError:
            parsed = None
        current = next((a for a in self.plan.attempts if parsed is not None and a.job_name == parsed.job_name), None)
        if current is None or parsed is None:
            raise NcclProbeError(
                f"the trigger sent {display_value(event)}, which is not the end of one of this task's probe jobs "
                f"({', '.join(names)}); check the triggerer's log and clear the task"
            )
        return current, parsed

    def _cache(self, current: ProbeAttempt, slurm_job_id: str, outcome: ProbeOutcome) -> None:
        """Cache the candidate that passed (unless the cache cannot be read) and say so."""
        plan = self.plan
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
            self.label(current),
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
        current: ProbeAttempt,
        parsed: JobEvent,
        outcome: ProbeOutcome,
        log_text: str,
        outcomes: Sequence[str],
    ) -> list[str]:
        """Cancel a candidate that did not pass and say why; the history so far, or the error that ends the probe.

        :raises NcclProbeError: when no other candidate can help (no CUDA, a setup error, an unfinished job).
        """
        slurm_job_id, label = parsed.slurm_job_id, self.label(current)
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
        self._stop_unless_another_may_help(outcome, slurm_job_id, current.layout.job_log_dir(slurm_job_id))
        return [*outcomes, f"{label}: {outcome.verdict} (SLURM job {slurm_job_id}): {outcome.detail}"]

    def _stop_unless_another_may_help(self, outcome: ProbeOutcome, slurm_job_id: str, logs: str) -> None:
        """Raise the error that ends the probe when no other candidate can help (no CUDA, a setup error, no end)."""
        cluster = self.plan.cluster
        if outcome.verdict is Verdict.NO_CUDA:
            raise NcclProbeError(
                f"the NCCL probe on cluster {cluster!r} cannot prove NCCL: {outcome.detail}. Logs: {logs}"
            )
        if outcome.verdict is Verdict.SETUP_ERROR:
            raise NcclProbeError(
                f"the NCCL probe could not start on cluster {cluster!r}: {outcome.detail}. Check that the "
                f"image has PyTorch for python={self.python!r} and that results_dir is mounted in the container "
                f"at the same path. Logs: {logs}"
            )
        if not outcome.verdict.next_candidate_may_help:
            raise NcclProbeError(
                f"the NCCL probe job {slurm_job_id} did not finish ({outcome.detail}), which says nothing about "
                "the NCCL settings; run the task again"
            )

    def log_tail(self, attempt: ProbeAttempt, slurm_job_id: str) -> str:
        """Return the last :data:`LOG_TAIL_BYTES` of the probe's ``main.out`` and ``main.err``."""
        paths = attempt.layout.log_paths(slurm_job_id)
        return log_tails(JobLifecycle(self.hook, self.log), paths, LOG_TAIL_BYTES, heading="--- {path} ---")
