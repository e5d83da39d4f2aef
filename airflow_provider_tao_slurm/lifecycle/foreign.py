"""Watching a job by its bare SLURM id: a job submitted outside this provider.

Such a job has no record, is never resubmitted, and a user kill leaves it running. It is found
with ``scontrol show job`` (for its name, owner and log paths), watched by the same
:mod:`~airflow_provider_tao_slurm.lifecycle.watch` as the provider's jobs, and its end decides the
task: COMPLETED succeeds with its cost, anything else fails with the classified reason.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.failures import classify
from airflow_provider_tao_slurm.core.records import check_slurm_job_id
from airflow_provider_tao_slurm.core.states import TaoState
from airflow_provider_tao_slurm.exceptions import (
    JobFailedError,
    JobNotFoundError,
    UnknownStateError,
    ValidationError,
    job_failed,
)
from airflow_provider_tao_slurm.lifecycle.events import EventStatus
from airflow_provider_tao_slurm.lifecycle.settle import failure_message

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.lifecycle.events import JobEvent
    from airflow_provider_tao_slurm.lifecycle.settle import Settlement


@dataclass(frozen=True)
class ForeignJob:
    """A job submitted elsewhere, as ``scontrol show job`` describes it.

    :param slurm_job_id: its id.
    :param job_name: its name ("" when slurmctld no longer knows it).
    :param logs: ``{"stdout": path, "stderr": path}`` (stderr only when it is another file).
    :param owner: its user, for the log.
    :param work_dir: its working directory, if known.
    """

    slurm_job_id: str
    job_name: str = ""
    logs: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    work_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return what the deferral keeps (``execute_complete``'s ``foreign`` kwarg)."""
        return {"slurm_job_id": self.slurm_job_id, "job_name": self.job_name, "logs": dict(self.logs)}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> ForeignJob:
        return cls(str(value["slurm_job_id"]), str(value.get("job_name") or ""), dict(value.get("logs") or {}))

    def watched(self, cluster: str | None) -> dict[str, Any]:
        """Return the XCom the extra links read for this job."""
        return {
            "slurm_job_id": self.slurm_job_id,
            "job_id": self.job_name,
            "cluster": cluster,
            "log_dir": posixpath.dirname(self.logs["stdout"]) if "stdout" in self.logs else None,
            "results_dir": self.work_dir,
        }


def find_foreign_job(hook: Any, slurm_job_id: str) -> ForeignJob:
    """Return the job ``slurm_job_id`` as slurmctld describes it (checked, then looked up).

    :raises ValidationError: when the id is not a SLURM job id.
    :raises JobNotFoundError: when neither scontrol nor squeue nor sacct knows it.
    """
    slurm_job_id = check_slurm_job_id(str(slurm_job_id).strip())
    info = hook.describe_job(slurm_job_id)
    if not info and slurm_job_id not in hook.get_states([slurm_job_id]):
        cluster = hook.settings.cluster_name or hook.settings.hosts[0]
        raise JobNotFoundError(
            f"SLURM job {slurm_job_id} is unknown to scontrol, squeue and sacct on {cluster}; "
            "check the id and that the connection points at the cluster that runs it"
        )
    paths = {"stdout": info.get("StdOut") or "", "stderr": info.get("StdErr") or ""}
    if paths["stderr"] == paths["stdout"]:
        del paths["stderr"]
    return ForeignJob(
        slurm_job_id,
        info.get("JobName", ""),
        {label: path for label, path in paths.items() if path.startswith("/")},
        info.get("UserId") or "",
        info.get("WorkDir") or None,
    )


def settle_foreign(settlement: Settlement, job: ForeignJob, event: JobEvent) -> dict[str, Any]:
    """Settle the end of a job submitted elsewhere: its outcome, logs and cost; nothing recorded or resubmitted.

    :raises ValidationError: when the event is about another job.
    :raises JobNotFoundError: it vanished.
    :raises UnknownStateError: SLURM kept reporting a state nobody knows.
    :raises JobFailedError: it did not complete.
    """
    if event.slurm_job_id != job.slurm_job_id:
        raise ValidationError(f"trigger event is for job {event.slurm_job_id}, not {job.slurm_job_id}; clear the task")
    tails = [settlement.show_log(label, path, (), event.log_offsets.get(label)) for label, path in job.logs.items()]
    if event.status is EventStatus.VANISHED:
        raise JobNotFoundError(event.message)
    if event.status is EventStatus.UNRECOGNISED:
        raise UnknownStateError(event.message)
    state = event.state
    assert state is not None  # JobEvent.from_dict guarantees it for TERMINAL
    usage = settlement.lifecycle.usage(job.slurm_job_id)
    if usage is not None:
        settlement.log.info("%s", usage.summary(job.slurm_job_id, f"{state.tao_state} ({state.native})"))
    if state.tao_state is TaoState.CANCELED:
        raise JobFailedError(f"SLURM job {job.slurm_job_id} ended {state.raw_state or state.native}")
    if state.tao_state is not TaoState.COMPLETE:
        verdict = classify(state, "\n".join(tails))
        raise job_failed(failure_message(job.slurm_job_id, verdict, None), str(verdict.err_class))
    result = {
        "slurm_job_id": job.slurm_job_id,
        "job_name": job.job_name,
        "terminal_state": str(state.tao_state),
        "native_state": state.native,
        "exit_code": state.exit_code,
        "node_list": state.node_list,
    }
    return {**result, **usage.to_dict()} if usage is not None else result
