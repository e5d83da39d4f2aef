"""An operator's own job: one way to wait for it (deferred or in the worker), and one way to quote its logs' ends.

:func:`wait_for_job` is how every operator that waits for a SLURM job of its own (the conversion of
:class:`~airflow_provider_tao_slurm.operators.enroot_import.EnrootImportOperator`, each probe of
:class:`~airflow_provider_tao_slurm.operators.nccl_probe.NcclProbeOperator`) waits: deferred on the
trigger, or blocking in the worker with the trigger's own watch rules; either way the operator gets
the same event. :func:`log_tails` formats the end of a job's logs for the task log and error messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_tao_slurm.exceptions import TaoSlurmError
from airflow_provider_tao_slurm.lifecycle.events import JobHandle
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.layout import JobLayout
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook


class WaitingOperator(Protocol):
    """What :func:`wait_for_job` needs of an operator: its connection, hook, log and ``defer``."""

    deferrable: bool
    slurm_conn_id: str

    @property
    def hook(self) -> SlurmHook: ...

    @property
    def log(self) -> Any: ...

    def defer(
        self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = ..., timeout: Any = ...
    ) -> Any: ...


def layout_handle(layout: JobLayout, slurm_job_id: str, submitted_at: float) -> JobHandle:
    """Return the handle of a job that has no record (a conversion, a probe), for :func:`wait_for_job`.

    :param submitted_at: epoch seconds of the submission (kept to the microsecond).
    """
    return JobHandle(
        job_id=layout.job_id,
        slurm_job_id=slurm_job_id,
        job_dir=layout.job_dir,
        results_dir=layout.results_dir,
        record_path=layout.record_path,
        results_base=layout.base,
        log_dir=layout.job_log_dir(slurm_job_id),
        submitted_at=datetime.fromtimestamp(submitted_at, UTC).isoformat(),
    )


def submitted_epoch(handle: JobHandle) -> float | None:
    """Return the handle's submission time in epoch seconds (None when it has none)."""
    return datetime.fromisoformat(handle.submitted_at).timestamp() if handle.submitted_at else None


def wait_for_job(
    operator: WaitingOperator,
    handle: JobHandle,
    *,
    trigger: Callable[..., Any],
    poll_interval: float,
    cancel_on_kill: bool = True,
    method_name: str = "execute_complete",
    kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Wait until the handle's job ends: deferred on ``trigger`` when the operator is deferrable, else in the worker.

    Deferred, the task resumes in ``method_name`` with the trigger's event and ``kwargs`` (this call
    raises Airflow's deferral). In the worker, the event comes from
    :meth:`~airflow_provider_tao_slurm.lifecycle.jobs.JobLifecycle.wait_until_ended` (the trigger's
    watch rules) and is returned; the operator hands it to ``method_name`` itself.

    :param trigger: the trigger class (``SlurmJobTrigger``; the operators name it, the lifecycle cannot).
    :param cancel_on_kill: whether a user kill of the deferred task cancels the job (not for a job another
        run shares).
    """
    submitted_at = submitted_epoch(handle)
    if operator.deferrable:
        operator.defer(
            trigger=trigger(
                slurm_conn_id=operator.slurm_conn_id,
                slurm_job_id=handle.slurm_job_id,
                job_name=handle.job_id,
                poll_interval=float(poll_interval),
                submitted_at=submitted_at,
                cancel_on_kill=cancel_on_kill,
            ),
            method_name=method_name,
            kwargs=dict(kwargs) if kwargs is not None else None,
        )
    return JobLifecycle(operator.hook, operator.log).wait_until_ended(
        handle.slurm_job_id,
        handle.job_id,
        submitted_at=submitted_at if submitted_at is not None else datetime.now(UTC).timestamp(),
        poll_interval=float(poll_interval),
    )


def log_tails(
    lifecycle: JobLifecycle,
    paths: Sequence[str],
    max_bytes: int,
    *,
    heading: str = "",
    quoted: bool = False,
) -> str:
    """Return the end of each log in ``paths`` (its last ``max_bytes``, redacted), one after the other.

    :param heading: a line put above each tail, ``{path}`` standing for its path (e.g. ``"--- {path} ---"``);
        none when empty.
    :param quoted: for an error message: each tail stripped, an empty one said as ``(empty or missing)`` and
        one that cannot be read as ``(could not read it: ...)`` instead of failing.
    :raises TaoSlurmError: when a log cannot be read (unless ``quoted``).
    """
    sections = []
    for path in paths:
        try:
            text = lifecycle.log_tail(path, max_bytes)
        except TaoSlurmError as exc:
            if not quoted:
                raise
            text = f"(could not read it: {exc})"
        if quoted:
            text = text.strip() or "(empty or missing)"
        sections.append(f"{heading.format(path=path)}\n{text}" if heading else text)
    return "\n".join(sections)
