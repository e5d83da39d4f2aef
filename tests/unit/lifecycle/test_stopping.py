"""A run its user stops (:mod:`airflow_provider_tao_slurm.lifecycle.stopping`): what a submission stopped halfway
leaves is cancelled by the job's name, its staged secrets removed, and a failed lookup is never "no job"."""

from __future__ import annotations

import logging

import pytest
from fakes import FakeSlurmHook

from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import open_record, to_json
from airflow_provider_tao_slurm.exceptions import JobLookupError
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
from airflow_provider_tao_slurm.lifecycle.stopping import STOPPED_BY_CTRL_C, abandon_submission, in_process_run

LAYOUT = JobLayout("/lustre/u", "tao-dag.submit-0123456789abcdef")
REMOVE_SIDECAR = f"rm -f -- {LAYOUT.sidecar_path}"


def stopped(hook: FakeSlurmHook) -> None:
    abandon_submission(JobLifecycle(hook, logging.getLogger("test")), LAYOUT.job_id, LAYOUT, source=STOPPED_BY_CTRL_C)


def test_a_job_sbatch_made_is_cancelled_by_id_and_name_its_record_marked_and_its_sidecar_removed() -> None:
    record = open_record(
        job_id=LAYOUT.job_id,
        cluster="mini",
        image="/lustre/c/x.sqsh",
        network_arch="custom",
        action="train",
        results_dir=LAYOUT.results_dir,
        job_dir=LAYOUT.job_dir,
        log_dir=LAYOUT.log_dir,
        job_name=LAYOUT.job_id,
        now="2026-12-06T09:00:00Z",
    )
    hook = FakeSlurmHook({LAYOUT.record_path: to_json(record)})
    hook.found[LAYOUT.job_id] = ["501"]

    stopped(hook)

    assert hook.cancels == [(["501"], LAYOUT.job_id)]
    assert REMOVE_SIDECAR in hook.commands
    assert '"terminal_state": "CANCELED"' in hook.files[LAYOUT.record_path]
    assert STOPPED_BY_CTRL_C in hook.files[LAYOUT.record_path]


def test_with_no_job_of_that_name_only_the_staged_sidecar_goes() -> None:
    hook = FakeSlurmHook()

    stopped(hook)

    assert hook.cancels == []
    assert hook.commands == [REMOVE_SIDECAR]


def test_a_failed_lookup_is_raised_never_read_as_no_job_and_the_sidecar_still_goes() -> None:
    hook = FakeSlurmHook()
    hook.lookup_error = JobLookupError("looking up jobs by name failed", evidence="squeue exited 1")

    with pytest.raises(JobLookupError):
        stopped(hook)

    assert hook.cancels == []
    assert hook.commands == [REMOVE_SIDECAR]


def test_only_an_in_process_supervisor_channel_is_a_dags_test_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)
    assert not in_process_run()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object(), raising=False)
    assert not in_process_run()  # a worker's or a triggerer's channel
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object.__new__(InProcessSupervisorComms), raising=False)
    assert in_process_run()
