"""``SlurmJobSensor`` with the shared fake hook: deferral, event validation, settling, infra resubmission."""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from types import MethodType, SimpleNamespace
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from fakes import SETTINGS, FakeSlurmHook, FakeTaskStateStore

from airflow_provider_tao_slurm.core.commands import end_markers
from airflow_provider_tao_slurm.core.images import parse_image
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import from_json, mark, mint_job_id, open_record, to_json
from airflow_provider_tao_slurm.core.states import JobState, TaoState, state_from_native
from airflow_provider_tao_slurm.core.tao import job_network_arch
from airflow_provider_tao_slurm.core.usage import usage_command
from airflow_provider_tao_slurm.exceptions import (
    AmbiguousSubmissionError,
    JobFailedError,
    JobLookupError,
    JobNotFoundError,
    MissingPathsError,
    RemoteCommandError,
    RemoteReadError,
    SubmissionError,
    UnknownStateError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW, CommandResult, SlurmHook
from airflow_provider_tao_slurm.lifecycle import jobs as jobs_module
from airflow_provider_tao_slurm.lifecycle.events import JobEvent, JobHandle, state_to_payload
from airflow_provider_tao_slurm.lifecycle.links import WATCHED_JOB_KEY, SlurmJobLogsLink, SlurmJobResultsLink
from airflow_provider_tao_slurm.sensors import slurm_job as sensor_module
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

BASE = "/lustre/u"
SLURM_ID = "500"
NOW = "2026-01-02T03:04:05Z"
XCOM: dict[str, Any] = {}
CTX = {
    "ti": SimpleNamespace(
        dag_id="dag",
        task_id="wait",
        run_id="run1",
        map_index=-1,
        try_number=1,
        xcom_push=lambda key, value: XCOM.__setitem__(key, value),
    )
}
JOB_ID = mint_job_id("dag", "submit", "run1")
LAYOUT = JobLayout(BASE, JOB_ID)
#: What settling the job removes, in one command: its secret sidecar and its end markers.
SETTLED_REMOVAL = f"rm -f -- {LAYOUT.sidecar_path} {BASE}/ends/{SLURM_ID}-*.end"
RETRY_ID = mint_job_id("dag", "wait", "run1", retry_of=JOB_ID)
RETRY_LAYOUT = JobLayout(BASE, RETRY_ID)
STATUS_PATH = f"{LAYOUT.results_dir}/status.json"


def make_handle(**changes: Any) -> dict[str, Any]:
    handle = {
        "job_id": JOB_ID,
        "slurm_job_id": SLURM_ID,
        "job_dir": LAYOUT.job_dir,
        "results_dir": LAYOUT.results_dir,
        "log_dir": LAYOUT.job_log_dir(SLURM_ID),
        "record_path": LAYOUT.record_path,
        "cluster": "mini",
        "script_path": LAYOUT.script_path,
        "sidecar_path": LAYOUT.sidecar_path,
        "exit_code_path": LAYOUT.exit_code_path,
        "results_base": BASE,
        "submitted_at": NOW,
        "exclude_nodes": [],
    }
    handle.update(changes)
    return handle


def running_record(network_arch: str = "custom") -> str:
    record = open_record(
        job_id=JOB_ID,
        cluster="mini",
        image="/lustre/c/x.sqsh",
        network_arch=network_arch,
        action="train",
        results_dir=LAYOUT.results_dir,
        job_dir=LAYOUT.job_dir,
        log_dir=LAYOUT.log_dir,
        job_name=JOB_ID,
        now=NOW,
    )
    record = mark(record, TaoState.RUNNING, now=NOW, message="submitted", source="submit", backend_ref=SLURM_ID)
    return to_json(record)


class SensorHook(FakeSlurmHook):
    """The shared fake holding the job's running record; it answers what settling asks of the cluster."""

    def __init__(self) -> None:
        super().__init__({LAYOUT.record_path: running_record()})
        self.usage_stdout = ""
        self.checkpoints = "NOSTART\n"
        self.handlers.append(self._cluster)

    def _cluster(self, command: str) -> CommandResult | None:
        if "%N|%P|%t" in command:  # node states: n2 went down with the failure
            return CommandResult(0, "n1|polar*|idle\nn2|polar*|down*\n", "")
        if command == usage_command(SLURM_ID):
            return CommandResult(0, self.usage_stdout, "")
        if "-newer" in command:  # a slice's new checkpoints
            return CommandResult(0, self.checkpoints, "")
        return CommandResult(0, "n2\n", "") if command.startswith("sinfo") else None


def read_record(hook: FakeSlurmHook, path: str = LAYOUT.record_path) -> dict[str, Any]:
    return dict(json.loads(hook.files[path]))


def set_status(hook: FakeSlurmHook, status: list[dict[str, Any]] | None) -> None:
    """Put TAO's ``status.json`` lines in the job's results directory (None: the job wrote none)."""
    if status is not None:
        hook.files[STATUS_PATH] = "".join(f"{json.dumps(line)}\n" for line in status)


class NoHook:
    """Any use of the hook fails the test: validation must come first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the hook was used ({name}) before the input was validated")


def sensor_with(hook: Any, **kwargs: Any) -> SlurmJobSensor:
    sensor = SlurmJobSensor(task_id="wait", job=kwargs.pop("job", make_handle()), poke_interval=5, **kwargs)
    sensor.__dict__["hook"] = hook
    return sensor


def terminal(native: str, *, exit_code: int = 0, node_list: str | None = "n2", **extra: Any) -> dict[str, Any]:
    state = state_from_native(SLURM_ID, native, source="sacct", exit_code=exit_code, signal=0, node_list=node_list)
    return {
        "status": "terminal",
        "slurm_job_id": SLURM_ID,
        "job_name": JOB_ID,
        "state": state_to_payload(state),
        **extra,
    }


def node_failed(hook: FakeSlurmHook, node: str = "n2") -> None:
    """Put SLURM's own node-failure banner (as slurmstepd writes it) in the first job's main.err."""
    hook.files[f"{LAYOUT.job_log_dir(SLURM_ID)}/main.err"] = (
        f"srun: error: Node failure on {node}\nslurmstepd-{node}: error: *** JOB {SLURM_ID} ON {node} CANCELLED AT "
        "2026-12-03T06:11:25 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
    )


def complete(sensor: SlurmJobSensor, event: Any, handle: dict[str, Any] | None = None) -> Any:
    return sensor.execute_complete(CTX, event=event, job=handle or make_handle())


# ---------------------------------------------------------------------- deferral and validation


def test_execute_defers_to_the_trigger_with_the_handle() -> None:
    sensor = sensor_with(NoHook())

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(CTX)

    trigger = deferred.value.trigger
    assert isinstance(trigger, SlurmJobTrigger)
    assert (trigger.slurm_job_id, trigger.job_name, trigger.poll_interval) == (SLURM_ID, JOB_ID, 5.0)
    assert trigger.submitted_at == 1767323045.0
    assert trigger.sidecar_path == LAYOUT.sidecar_path  # a user kill removes it (no execute_complete follows)
    assert deferred.value.method_name == "execute_complete"
    kept = deferred.value.kwargs["job"]
    assert {key: kept[key] for key in make_handle()} == make_handle()  # the public handle keys travel as they are
    assert (kept["infra_retries"], kept["retry_of"]) == (0, None)
    assert XCOM[WATCHED_JOB_KEY] == kept, "the extra links know the watched job while it runs"
    assert [type(link) for link in sensor.operator_extra_links] == [SlurmJobLogsLink, SlurmJobResultsLink]
    assert trigger.record_path == LAYOUT.record_path  # a user kill records CANCELED
    assert deferred.value.timeout is None


@pytest.mark.parametrize(
    ("job", "match"),
    [
        pytest.param("{'job_id': 'x'}", "dict returned by SbatchSubmitOperator", id="string"),
        pytest.param(make_handle(record_path=""), "lacks record_path", id="missing-key"),
        pytest.param({"job_id": JOB_ID}, "lacks slurm_job_id, job_dir", id="bare"),
        pytest.param(make_handle(slurm_job_id="12;mini"), "bad slurm_job_id", id="bad-slurm-id"),
    ],
)
def test_execute_refuses_a_bad_handle_before_any_ssh(job: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        sensor_with(NoHook(), job=job).execute(CTX)


@pytest.mark.parametrize(
    ("event", "match"),
    [
        pytest.param(None, "unexpected trigger event", id="none"),
        pytest.param("terminal", "unexpected trigger event", id="text"),
        pytest.param({"slurm_job_id": SLURM_ID}, "unexpected trigger event", id="no-status"),
        pytest.param({**terminal("COMPLETED"), "slurm_job_id": "999"}, "not 500; clear the task", id="other-job"),
        pytest.param({"status": "terminal"}, "unexpected trigger event", id="no-job-id"),
        pytest.param({**terminal("COMPLETED"), "status": "done"}, "unexpected trigger event", id="unknown-status"),
        pytest.param({**terminal("RUNNING")}, "carries no terminal state", id="terminal-without-terminal-state"),
    ],
)
def test_execute_complete_refuses_a_bad_event_before_any_ssh(event: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        complete(sensor_with(NoHook()), event)


# ---------------------------------------------------------------------- settling


def test_completed_job_settles_complete_and_removes_the_sidecar() -> None:
    hook = SensorHook()
    event = terminal("COMPLETED", transitions=[{"ts": 1767323046.0, "state": "RUNNING", "native": "RUNNING"}])

    result = complete(sensor_with(hook), event)

    assert result == read_record(hook)
    assert result["terminal_state"] == "COMPLETE"
    assert result["exit_codes"] == {"job": 0}
    assert [(t["state"], t["source"]) for t in result["transitions"]] == [
        ("PENDING", "submit"),
        ("RUNNING", "submit"),
        ("RUNNING", "trigger"),
        ("COMPLETE", "sensor"),
    ]
    assert hook.commands == [usage_command(SLURM_ID), SETTLED_REMOVAL]
    assert hook.submits == []


def test_the_jobs_cost_and_timing_reach_the_xcom_the_record_the_metrics_and_the_log(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    hook = SensorHook()
    hook.usage_stdout = (
        f"{SLURM_ID}|2026-12-03T06:00:00|2026-12-03T06:00:12|2026-12-03T07:02:10|3718|cpu=2,gres/gpu=2|n2|0:0"
        "|polar|240\n"
    )
    metrics: list[tuple[str, str, Any]] = []
    recorder = SimpleNamespace(
        timing=lambda name, value, tags: metrics.append(("timing", name, value.total_seconds())),
        gauge=lambda name, value, tags: metrics.append(("gauge", name, value)),
        incr=lambda name, value, tags: metrics.append(("incr", name, value)),
    )
    monkeypatch.setattr("airflow.sdk.observability.stats.Stats", recorder)
    capfd.readouterr()

    result = complete(sensor_with(hook), terminal("COMPLETED", node_list="n2"))

    figures = {
        "queue_seconds": 12,
        "elapsed_seconds": 3718,
        "gpus": 2,
        "gpu_hours": 2.0656,
        "node_list": "n2",
        "exit_code": 0,
        "partition": "polar",
        "time_limit_seconds": 14400,
    }
    assert {key: result[key] for key in figures} == figures
    assert read_record(hook)["extra"]["usage"] == figures
    assert metrics == [
        ("timing", "tao_slurm.job.queue_time", 12.0),
        ("timing", "tao_slurm.job.run_time", 3718.0),
        ("gauge", "tao_slurm.job.gpu_hours", 2.0656),
        ("incr", "tao_slurm.job.gpu_seconds", 7436),
    ]
    out = capfd.readouterr()
    assert (
        f"SLURM job {SLURM_ID} COMPLETE (COMPLETED): queued 12 s, ran 1 h 1 min on n2, 2 GPU(s) = 2.0656 GPU hours, "
        "exit code 0"
    ) in out.out + out.err


@pytest.fixture(autouse=True)
def no_status_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing status.json or checkpoint counts as missing at once here (the settle windows have their own tests)."""
    monkeypatch.setattr(jobs_module, "STATUS_SETTLE_S", 0.0)
    monkeypatch.setattr(jobs_module, "CHECKPOINT_SETTLE_S", 0.0)


class LateStatusHook(SensorHook):
    """``status.json`` says SUCCESS only once it was read more than ``appears_after`` times (None: never)."""

    def __init__(self, appears_after: int | None) -> None:
        super().__init__()
        self.appears_after = appears_after
        self.status_reads: list[str] = []

    def read_status_json(self, path: str, max_bytes: int = 1 << 20) -> list[dict[str, Any]] | None:
        self.status_reads.append(path)
        if self.appears_after is not None and len(self.status_reads) > self.appears_after:
            set_status(self, [{"status": "SUCCESS"}])
        return super().read_status_json(path, max_bytes)


@pytest.mark.parametrize(("appears_after", "outcome"), [(2, "COMPLETE"), (None, "ERROR")], ids=["lagging", "missing"])
def test_a_missing_status_json_is_read_again_before_it_counts_as_missing(
    monkeypatch: pytest.MonkeyPatch, appears_after: int | None, outcome: str
) -> None:
    """Shared storage caches attributes: the login host may not see the file a node wrote just before the end."""
    monkeypatch.setattr(jobs_module, "STATUS_SETTLE_S", 0.3)
    monkeypatch.setattr(jobs_module, "STATUS_RETRY_S", 0.05)
    hook = LateStatusHook(appears_after)
    hook.files[LAYOUT.record_path] = running_record("classification_pyt")
    reads = hook.status_reads
    if outcome == "COMPLETE":
        assert complete(sensor_with(hook), terminal("COMPLETED"))["terminal_state"] == "COMPLETE"
        assert len(reads) == 3
    else:
        with pytest.raises(JobFailedError, match=r"status\.json is missing"):
            complete(sensor_with(hook), terminal("COMPLETED"))
        assert 4 <= len(reads) <= 8  # read again for the whole window, then missing
    assert read_record(hook)["terminal_state"] == outcome


@pytest.mark.parametrize(
    ("network_arch", "status", "outcome"),
    [
        pytest.param("classification_pyt", None, "status.json is missing", id="tao-job-needs-status-json"),
        pytest.param("classification_pyt", [{"status": "RUNNING"}], "no SUCCESS line", id="tao-job-needs-success"),
        pytest.param("classification_pyt", [{"status": "SUCCESS"}], "COMPLETE", id="tao-job-success"),
        pytest.param("custom", None, "COMPLETE", id="custom-program-without-status-json"),
    ],
)
def test_a_tao_job_is_complete_only_with_status_json_success(network_arch: str, status: Any, outcome: str) -> None:
    hook = SensorHook()
    hook.files[LAYOUT.record_path] = running_record(network_arch)
    set_status(hook, status)
    if outcome == "COMPLETE":
        assert complete(sensor_with(hook), terminal("COMPLETED"))["terminal_state"] == "COMPLETE"
        return
    with pytest.raises(JobFailedError, match=outcome):
        complete(sensor_with(hook), terminal("COMPLETED"))
    assert read_record(hook)["terminal_state"] == "ERROR"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param("python3 /lustre/demo/tao_like_train.py --spec {config_path}", id="tao-image"),
        pytest.param("classification_pyt train -e {config_path}", id="tao-entry-point"),
    ],
)
@pytest.mark.parametrize("status", [None, [{"status": "STARTED"}]], ids=["no-status-json", "no-success-line"])
def test_a_tao_job_submitted_with_the_defaults_is_not_complete_without_status_json_success(
    command: str, status: Any
) -> None:
    """The record the submit operator opens for a TAO job without ``network_arch`` holds it to the TAO rule."""
    network_arch = job_network_arch(
        None, parse_image("/lustre/c/nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh"), command
    )
    hook = SensorHook()
    hook.files[LAYOUT.record_path] = running_record(network_arch)
    set_status(hook, status)

    with pytest.raises(JobFailedError, match="pass network_arch='custom' to SbatchSubmitOperator") as failed:
        complete(sensor_with(hook), terminal("COMPLETED"))

    assert failed.value.err_class == "ERR_PROGRAM"
    assert isinstance(failed.value, AirflowFailException), "a retry cannot fix a program error"
    assert (read_record(hook)["terminal_state"], read_record(hook)["err_class"]) == ("ERROR", "ERR_PROGRAM")


@pytest.mark.parametrize(
    ("status", "require", "match"),
    [
        pytest.param([{"status": "FAILURE", "message": "loss is NaN"}], False, "loss is NaN", id="failure"),
        pytest.param(None, True, "status.json is missing", id="required-missing"),
    ],
)
def test_completed_job_with_bad_status_json_fails(status: Any, require: bool, match: str) -> None:
    hook = SensorHook()
    set_status(hook, status)

    with pytest.raises(JobFailedError, match=match) as failed:
        complete(sensor_with(hook, require_status_json=require), terminal("COMPLETED"))

    assert failed.value.err_class == "ERR_PROGRAM"
    assert isinstance(failed.value, AirflowFailException), "a retry cannot fix a program error"
    assert (read_record(hook)["terminal_state"], read_record(hook)["err_class"]) == ("ERROR", "ERR_PROGRAM")


def test_program_failure_fails_without_resubmission() -> None:
    hook = SensorHook()

    with pytest.raises(JobFailedError, match=r"(?s)ERR_PROGRAM.*ExitCode=3:0") as failed:
        complete(sensor_with(hook), terminal("FAILED", exit_code=3))

    assert failed.value.err_class == "ERR_PROGRAM"
    assert isinstance(failed.value, AirflowFailException), "a retry cannot fix a program error"
    record = read_record(hook)
    assert (record["terminal_state"], record["err_class"], record["exit_codes"]) == ("ERROR", "ERR_PROGRAM", {"job": 3})
    assert hook.submits == []
    assert hook.lookups == []
    assert hook.commands == [usage_command(SLURM_ID), SETTLED_REMOVAL]


def test_cancelled_job_is_canceled_not_unknown() -> None:
    hook = SensorHook()
    event = terminal("CANCELLED by 1001")

    with pytest.raises(JobFailedError, match="cancelled outside this task"):
        complete(sensor_with(hook), event)

    record = read_record(hook)
    assert record["terminal_state"] == "CANCELED"
    assert record["transitions"][-1]["message"] == "SLURM job 500 ended CANCELLED by 1001"
    assert hook.commands == [usage_command(SLURM_ID), SETTLED_REMOVAL]


@pytest.mark.parametrize("status", ["vanished", "error"], ids=["vanished", "older-provider-error"])
def test_vanished_job_is_recorded_unknown_and_its_sidecar_removed(status: str) -> None:
    hook = SensorHook()
    event = {
        "status": status,
        "slurm_job_id": SLURM_ID,
        "job_name": JOB_ID,
        "message": "SLURM job 500 is unknown to squeue and sacct",
    }

    with pytest.raises(JobNotFoundError, match="unknown to squeue and sacct"):
        complete(sensor_with(hook), event)

    record = read_record(hook)
    assert (record["terminal_state"], record["transitions"][-1]["state"]) == (None, "UNKNOWN")
    assert hook.commands[-1] == f"rm -f -- {LAYOUT.sidecar_path}"


def test_unrecognised_state_fails_naming_it_and_keeps_the_sidecar() -> None:
    hook = SensorHook()
    state = state_from_native(SLURM_ID, "WEIRD_STATE", source="squeue")
    message = "SLURM reports job 500 in state 'WEIRD_STATE', which this provider does not know"
    event = {
        "status": "unrecognised",
        "slurm_job_id": SLURM_ID,
        "job_name": JOB_ID,
        "state": state_to_payload(state),
        "message": message,
    }

    with pytest.raises(UnknownStateError, match="'WEIRD_STATE'"):
        complete(sensor_with(hook), event)

    record = read_record(hook)
    assert (record["terminal_state"], record["transitions"][-1]["state"]) == (None, "UNKNOWN")
    assert f"rm -f -- {LAYOUT.sidecar_path}" not in hook.commands  # the job may still run and need it


def test_non_deferrable_on_kill_cancels_records_and_removes_the_sidecar() -> None:
    hook = SensorHook()
    sensor = sensor_with(hook, deferrable=False)
    sensor._current = JobHandle.from_dict(make_handle())

    sensor.on_kill()

    assert hook.cancels == [([SLURM_ID], JOB_ID)]
    record = read_record(hook)
    assert (record["terminal_state"], record["transitions"][-1]["source"]) == ("CANCELED", "sensor on_kill")
    assert hook.commands[-1] == f"rm -f -- {LAYOUT.sidecar_path}"


def test_ctrl_c_of_a_poking_sensor_cancels_its_job_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """``airflow dags test`` stopped with Ctrl-C (or SIGINT forwarded to a worker) while the sensor pokes."""
    hook = SensorHook()
    sensor = sensor_with(hook, deferrable=False)

    def interrupted(context: Any) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(sensor, "poke", interrupted)

    with pytest.raises(KeyboardInterrupt):
        sensor.execute(CTX)

    assert hook.cancels == [([SLURM_ID], JOB_ID)]
    assert read_record(hook)["terminal_state"] == "CANCELED"
    assert hook.commands[-1] == f"rm -f -- {LAYOUT.sidecar_path}"


def test_infra_failure_the_partition_could_not_fit_again_is_not_resubmitted() -> None:
    hook = SensorHook()
    node_failed(hook)
    handle = make_handle(num_nodes=2, partition="polar")

    with pytest.raises(JobFailedError, match=r"only 1 node\(s\) \(n1\) for a 2-node job, which could never start"):
        complete(sensor_with(hook), terminal("NODE_FAIL", node_list="n[1-2]"), handle)

    assert hook.submits == []
    assert RETRY_LAYOUT.record_path not in hook.files
    old = read_record(hook)
    assert (old["terminal_state"], old["err_class"]) == ("ERROR", "ERR_INFRA")
    assert "not resubmitted" in old["transitions"][-1]["message"]
    assert hook.commands[-1] == SETTLED_REMOVAL


def test_a_retried_sensor_settles_an_already_terminal_record_without_changing_it() -> None:
    hook = SensorHook()
    with pytest.raises(JobFailedError):
        complete(sensor_with(hook), terminal("FAILED", exit_code=3))
    settled = hook.files[LAYOUT.record_path]
    replay = terminal("FAILED", exit_code=3, transitions=[{"ts": 1767323999.0, "state": "RUNNING"}])

    with pytest.raises(JobFailedError, match="ERR_PROGRAM"):
        complete(sensor_with(hook), replay)

    assert hook.files[LAYOUT.record_path] == settled


# ---------------------------------------------------------------------- infrastructure failures


def test_node_failure_is_resubmitted_once_keeping_excluded_nodes() -> None:
    hook = SensorHook()
    node_failed(hook)
    sensor = sensor_with(hook)

    with pytest.raises(TaskDeferred) as deferred:
        complete(sensor, terminal("NODE_FAIL", node_list="n2"), make_handle(exclude_nodes=["n1"]))

    assert hook.lookups == [RETRY_ID]
    assert hook.submits == [(LAYOUT.script_path, RETRY_ID, LAYOUT.log_dir, ("--exclude=n1,n2",))]
    old = read_record(hook)
    assert (old["terminal_state"], old["err_class"]) == ("ERROR", "ERR_INFRA")
    assert RETRY_ID in old["transitions"][-1]["message"]
    retry = from_json(hook.files[RETRY_LAYOUT.record_path])
    assert (retry.retry_of, retry.backend_ref, retry.state) == (JOB_ID, "501", TaoState.RUNNING)
    assert retry.results_dir == LAYOUT.results_dir
    handle = deferred.value.kwargs["job"]
    assert handle["job_id"] == RETRY_ID
    assert handle["slurm_job_id"] == "501"
    assert handle["retry_of"] == JOB_ID
    assert handle["record_path"] == RETRY_LAYOUT.record_path
    assert handle["log_dir"] == f"{LAYOUT.log_dir}/{RETRY_ID}-501"
    assert handle["exclude_nodes"] == ["n1", "n2"]
    assert handle["infra_retries"] == 1
    assert handle["sidecar_path"] == LAYOUT.sidecar_path
    assert deferred.value.trigger.slurm_job_id == "501"
    assert XCOM[WATCHED_JOB_KEY] == handle, "the extra links follow the resubmitted job"
    assert f"rm -f -- {LAYOUT.sidecar_path}" not in hook.commands


def test_a_node_failure_the_log_does_not_confirm_is_not_resubmitted() -> None:
    hook = SensorHook()
    hook.files[f"{LAYOUT.job_log_dir(SLURM_ID)}/main.err"] = "Traceback (most recent call last):\nValueError: bad\n"

    with pytest.raises(JobFailedError, match=r"NODE_FAIL on n2\) but the log names no infrastructure error") as failed:
        complete(sensor_with(hook), terminal("NODE_FAIL", node_list="n2"))

    assert failed.value.err_class == "ERR_INFRA"
    assert not isinstance(failed.value, AirflowFailException), "a retry may find other nodes"
    assert hook.submits == []
    assert (read_record(hook)["terminal_state"], read_record(hook)["err_class"]) == ("ERROR", "ERR_INFRA")


def test_hardware_evidence_in_the_log_is_an_infrastructure_failure() -> None:
    hook = SensorHook()
    hook.files[f"{LAYOUT.job_log_dir(SLURM_ID)}/main.err"] = (
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n"
    )

    with pytest.raises(TaskDeferred):
        complete(sensor_with(hook), terminal("FAILED", exit_code=1, node_list=None))

    assert hook.submits == [(LAYOUT.script_path, RETRY_ID, LAYOUT.log_dir, ())]


def test_a_retried_sensor_adopts_the_job_an_earlier_try_resubmitted() -> None:
    hook = SensorHook()
    node_failed(hook)
    with pytest.raises(TaskDeferred):
        complete(sensor_with(hook), terminal("NODE_FAIL"))
    old_record = hook.files[LAYOUT.record_path]
    retry_record = hook.files[RETRY_LAYOUT.record_path]
    hook.found[RETRY_ID] = ["501"]

    with pytest.raises(TaskDeferred) as deferred:
        complete(sensor_with(hook), terminal("NODE_FAIL"))

    assert len(hook.submits) == 1
    assert deferred.value.kwargs["job"]["slurm_job_id"] == "501"
    assert hook.files[LAYOUT.record_path] == old_record
    assert hook.files[RETRY_LAYOUT.record_path] == retry_record


def test_two_resubmitted_jobs_of_one_name_stop_the_sensor() -> None:
    hook = SensorHook()
    node_failed(hook)
    hook.found[RETRY_ID] = ["501", "502"]

    with pytest.raises(AmbiguousSubmissionError, match="cancel the extra ones"):
        complete(sensor_with(hook), terminal("NODE_FAIL"))

    assert hook.submits == []


def test_infra_retries_are_bounded() -> None:
    hook = SensorHook()

    with pytest.raises(JobFailedError, match="ERR_INFRA") as failed:
        complete(sensor_with(hook, max_infra_retries=2), terminal("NODE_FAIL"), make_handle(infra_retries=2))

    assert failed.value.err_class == "ERR_INFRA"
    assert not isinstance(failed.value, AirflowFailException), "a retry may find other nodes"
    assert (read_record(hook)["terminal_state"], read_record(hook)["err_class"]) == ("ERROR", "ERR_INFRA")
    assert hook.submits == []


def test_a_refused_resubmission_settles_both_records_and_fails() -> None:
    hook = SensorHook()
    node_failed(hook)
    hook.submit_error = SubmissionError("Requested node configuration is not available", rc=1)

    with pytest.raises(JobFailedError, match=r"resubmission .* was refused .*excluded nodes \(n1,n2\)") as failed:
        complete(sensor_with(hook), terminal("NODE_FAIL"), make_handle(exclude_nodes=["n1"]))

    assert failed.value.err_class == "ERR_INFRA"
    assert not isinstance(failed.value, AirflowFailException), "a retry may find other nodes"
    assert (read_record(hook)["terminal_state"], read_record(hook)["err_class"]) == ("ERROR", "ERR_INFRA")
    retry = read_record(hook, RETRY_LAYOUT.record_path)
    assert retry["terminal_state"] == "ERROR"
    assert "not available" in retry["transitions"][-1]["message"]
    assert hook.commands[-1] == SETTLED_REMOVAL


def test_log_tail_redacts_the_jobs_own_secrets(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = "tok-1f3a9c5e7b"
    monkeypatch.setenv("SENSOR_TEST_TOKEN", secret)
    hook = SensorHook()
    handle = make_handle(secret_refs={"HF_TOKEN": "env:SENSOR_TEST_TOKEN"})
    hook.files[f"{handle['log_dir']}/main.out"] = f"epoch 1\nleaked {secret} here\n"

    complete(sensor_with(hook), terminal("COMPLETED"), handle)

    out, err = capfd.readouterr()
    assert "leaked ${REDACTED} here" in out + err
    assert secret not in out + err


# ---------------------------------------------------------------------- poke mode and the non-deferrable kill

T0 = datetime.strptime(NOW, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp() + 100


class Clock(datetime):
    """``datetime`` whose ``now`` is whatever the test says."""

    at = T0

    @classmethod
    def now(cls, tz: Any = None) -> Clock:  # type: ignore[override]
        return cls.fromtimestamp(cls.at, tz)


class PokedHook(SensorHook):
    """Answers each status query with the next of ``answers``: a state, None (unknown to SLURM) or an exception."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[Any] = []

    def get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        ids = list(job_ids)
        self.polls.append(ids)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {} if answer is None else {ids[0]: answer}


def poking(hook: PokedHook, script: list[Any], monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> SlurmJobSensor:
    """A non-deferrable sensor whose status queries answer from ``script`` (a state, None, or an exception)."""
    monkeypatch.setattr(sensor_module, "datetime", Clock)
    hook.answers = list(script)
    sensor = sensor_with(hook, deferrable=False, **kwargs)
    # submitted at T0: the not-found clock starts there, as the trigger's does from the submission
    sensor._start_watch(JobHandle.from_dict({**make_handle(), "submitted_at": "2026-01-02T03:05:45Z"}))
    return sensor


def poke_at(sensor: SlurmJobSensor, *times: float) -> list[Any]:
    results = []
    for offset in times:
        Clock.at = T0 + offset
        results.append(sensor.poke(CTX))
    return results


def native(name: str, source: str = "squeue", **kwargs: Any) -> Any:
    if source == "sacct":
        kwargs.setdefault("end", "2026-12-04T05:08:30")
    return state_from_native(SLURM_ID, name, source=source, **kwargs)  # type: ignore[arg-type]


LOOKUP_FAILED = JobLookupError("1 of 1 job(s) unanswered", evidence="squeue exited 1")


@pytest.mark.parametrize(
    ("script", "times"),
    [
        pytest.param([None, None], (0, 5), id="not-found-within-grace"),
        pytest.param([native("PENDING"), native("RUNNING")], (0, 500), id="live"),
        pytest.param([native("WEIRD_STATE"), native("WEIRD_STATE")], (0, 9), id="unknown-within-grace"),
        pytest.param(
            [native("WEIRD_STATE"), native("RUNNING"), native("WEIRD_STATE")], (0, 8, 16), id="unknown-clock-reset"
        ),
        pytest.param([None, LOOKUP_FAILED, None, None], (0, 8, 12, 17), id="failed-query-restarts-not-found-clock"),
        pytest.param([LOOKUP_FAILED, LOOKUP_FAILED], (0, 500), id="failed-queries-are-no-evidence"),
    ],
)
def test_poke_keeps_waiting(monkeypatch: pytest.MonkeyPatch, script: list[Any], times: tuple[float, ...]) -> None:
    hook = PokedHook()
    before = hook.files[LAYOUT.record_path]
    sensor = poking(hook, script, monkeypatch, not_found_grace_seconds=10, unrecognised_grace_seconds=10)

    assert poke_at(sensor, *times) == [False] * len(times)

    assert hook.files[LAYOUT.record_path] == before
    assert hook.commands == []


def test_poke_vanished_is_recorded_unknown_and_its_sidecar_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = PokedHook()
    sensor = poking(hook, [None, None], monkeypatch, not_found_grace_seconds=10)

    with pytest.raises(JobNotFoundError, match=f"SLURM job {SLURM_ID} .* unknown to squeue and sacct for 11 s"):
        poke_at(sensor, 0, 11)

    record = read_record(hook)
    assert (record["terminal_state"], record["transitions"][-1]["state"]) == (None, "UNKNOWN")
    assert hook.commands[-1] == f"rm -f -- {LAYOUT.sidecar_path}"


def test_poke_unrecognised_is_recorded_unknown_and_keeps_the_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = PokedHook()
    sensor = poking(hook, [native("WEIRD_STATE"), native("WEIRD_STATE")], monkeypatch, unrecognised_grace_seconds=10)

    with pytest.raises(UnknownStateError, match="'WEIRD_STATE'"):
        poke_at(sensor, 0, 10)

    record = read_record(hook)
    assert (record["terminal_state"], record["transitions"][-1]["state"]) == (None, "UNKNOWN")
    assert f"rm -f -- {LAYOUT.sidecar_path}" not in hook.commands


def test_poke_completed_returns_the_final_record(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = PokedHook()
    sensor = poking(hook, [native("RUNNING"), native("COMPLETED", "sacct", exit_code=0, signal=0)], monkeypatch)

    first, done = poke_at(sensor, 0, 30)

    assert first is False
    assert done.is_done
    assert (done.xcom_value["terminal_state"], done.xcom_value["job_id"]) == ("COMPLETE", JOB_ID)
    assert hook.commands[-1] == SETTLED_REMOVAL


def test_poke_waits_for_accountings_full_row_then_takes_its_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue shows FAILED first, then sacct's row without its End (exit 0:0), then the full row."""
    hook = PokedHook()
    script = [
        native("FAILED"),
        native("FAILED", "sacct", exit_code=0, signal=0, end=None),
        native("FAILED", "sacct", exit_code=3, signal=0),
    ]
    sensor = poking(hook, script, monkeypatch)

    assert poke_at(sensor, 0, 10) == [False, False]
    with pytest.raises(JobFailedError):
        poke_at(sensor, 20)

    assert read_record(hook)["exit_codes"] == {"job": 3}


def test_poke_takes_the_state_at_hand_once_accounting_stays_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = PokedHook()
    sensor = poking(hook, [native("FAILED"), native("FAILED")], monkeypatch)

    assert poke_at(sensor, 0) == [False]
    with pytest.raises(JobFailedError):
        poke_at(sensor, 31)

    assert read_record(hook)["exit_codes"] == {}


def test_poke_resubmission_watches_the_new_job(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = PokedHook()
    node_failed(hook)
    failed = native("NODE_FAIL", "sacct", exit_code=0, signal=0, node_list="n2")
    sensor = poking(hook, [failed, native("RUNNING")], monkeypatch)

    assert poke_at(sensor, 0, 30) == [False, False]

    assert hook.polls == [[SLURM_ID], ["501"]]
    assert sensor._current is not None
    assert (sensor._current.job_id, sensor._current.slurm_job_id, sensor._current.retry_of) == (RETRY_ID, "501", JOB_ID)
    assert hook.submits == [(LAYOUT.script_path, RETRY_ID, LAYOUT.log_dir, ("--exclude=n2",))]


def test_non_deferrable_on_kill_scancels_our_job_by_name_and_user() -> None:
    hook = SensorHook()
    hook.settings = replace(hook.settings, user="alice")
    hook.cancel = MethodType(SlurmHook.cancel, hook)  # type: ignore[method-assign]  # the hook's real scancel line
    sensor = sensor_with(hook, deferrable=False)
    sensor._current = JobHandle.from_dict(make_handle())

    sensor.on_kill()

    assert hook.commands == [f"scancel -Q --name={JOB_ID} --user=alice {SLURM_ID}", f"rm -f -- {LAYOUT.sidecar_path}"]
    record = read_record(hook)
    assert record["terminal_state"] == "CANCELED"
    assert record["transitions"][-1]["source"] == "sensor on_kill"


def deferred_then_killed(hook: SensorHook, killed: str) -> tuple[TaskDeferred, dict[str, Any]]:
    """Run ``execute()`` of a deferrable sensor on ``hook`` (it defers on the job), then kill the sensor ``killed``.

    ``resumed``: the worker that deferred has exited (Airflow's task runner ends the process after the deferral) and
    the sensor killed is the one Airflow builds anew from the DAG for the task; ``the one that deferred``: the same
    object, as under ``airflow dags test``, whose trigger runs in the process that deferred. Returns the deferral and
    the record as the deferral left it.
    """
    sensor = sensor_with(hook)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(CTX)
    assert deferred.value.trigger.slurm_job_id == SLURM_ID
    assert (hook.commands, hook.cancels, hook.handed_off) == ([], [], [])  # deferring itself touches nothing
    record = read_record(hook)
    (sensor_with(hook) if killed == "resumed" else sensor).on_kill()
    return deferred.value, record


def test_a_deferred_sensor_on_kill_touches_nothing() -> None:
    """A user kill of a deferred task is its trigger's: Airflow calls the trigger's ``on_kill`` (which cancels, records
    CANCELED and drops the sidecar); the worker that ran ``execute()`` exited after the deferral. Expected: the
    sensor Airflow builds for the deferred task, killed while its job still waits, issues no scancel (not even one
    left to the login host), runs no command, so removes no sidecar, and leaves the record as the deferral left it."""
    hook = SensorHook()
    hook.cancel = MethodType(SlurmHook.cancel, hook)  # type: ignore[method-assign]  # the hook's real scancel line

    deferred, record = deferred_then_killed(hook, "resumed")

    assert deferred.trigger.cancel_on_kill  # the trigger is the one that cancels
    assert (hook.commands, hook.cancels, hook.handed_off) == ([], [], [])
    assert read_record(hook) == record
    assert record["terminal_state"] is None


def test_the_sensor_that_deferred_under_dags_test_cancels_when_killed() -> None:
    """``airflow dags test`` runs the trigger in the process that deferred, and its SIGTERM reaches the sensor's
    ``on_kill`` (tests/cluster/test_stopped_runs.py, sigterm-deferred). Expected: that sensor cancels the job it
    deferred on by name and user, drops the sidecar and records CANCELED: the contrast that makes the test above
    mean something."""
    hook = SensorHook()
    hook.settings = replace(hook.settings, user="alice")
    hook.cancel = MethodType(SlurmHook.cancel, hook)  # type: ignore[method-assign]  # the hook's real scancel line

    deferred_then_killed(hook, "the one that deferred")

    assert hook.commands == [f"scancel -Q --name={JOB_ID} --user=alice {SLURM_ID}", f"rm -f -- {LAYOUT.sidecar_path}"]
    record = read_record(hook)
    assert (record["terminal_state"], record["transitions"][-1]["source"]) == ("CANCELED", "sensor on_kill")


def test_a_finished_training_announces_its_results_on_the_sensors_assets() -> None:
    hook = SensorHook()
    hook.usage_stdout = (
        f"{SLURM_ID}|2026-12-03T06:00:00|2026-12-03T06:00:12|2026-12-03T06:10:12|600|gres/gpu=1|n2|0:0|polar|10\n"
    )
    results = Asset("tao://team/classifier/train")
    other = Asset("tao://team/other")
    events: dict[Asset, SimpleNamespace] = {}
    sensor = sensor_with(hook, outlets=[results])
    context = {**CTX, "outlet_events": _Events(events)}

    sensor.execute_complete(context, event=terminal("COMPLETED"), job=make_handle())

    assert events[results].extra == {
        "results_dir": LAYOUT.results_dir,
        "job_id": JOB_ID,
        "slurm_job_id": SLURM_ID,
        "cluster": "mini",
        "gpu_hours": 0.1667,
        "elapsed_seconds": 600,
    }
    assert other not in events


def test_a_failed_training_announces_nothing() -> None:
    hook = SensorHook()
    events: dict[Asset, SimpleNamespace] = {}
    sensor = sensor_with(hook, outlets=[Asset("tao://team/classifier/train")])
    with pytest.raises(JobFailedError):
        sensor.execute_complete({**CTX, "outlet_events": _Events(events)}, event=terminal("FAILED", exit_code=3))
    assert events == {}


class _Events:
    """``context["outlet_events"]``: an accessor per Asset, created on first use, as Airflow's."""

    def __init__(self, store: dict[Asset, SimpleNamespace]) -> None:
        self.store = store

    def __getitem__(self, asset: Asset) -> SimpleNamespace:
        return self.store.setdefault(asset, SimpleNamespace(extra={}))


#: What TAO's evaluate writes: its status logger repeats the KPIs on every line after it set them.
EVALUATION_STATUS = [
    {"status": "STARTED", "message": "Starting evaluation."},
    {"status": "RUNNING", "message": "Evaluation metrics computed.", "kpi": {"mAP": 0.79, "AP50": 0.9}},
    {"status": "SUCCESS", "message": "Evaluation finished successfully.", "kpi": {"mAP": 0.81, "AP50": 0.9}},
]


def test_a_completed_evaluation_returns_its_kpis_and_announces_them_reading_status_json_once() -> None:
    hook = LateStatusHook(appears_after=None)  # counts the reads; never rewrites the file
    hook.files[LAYOUT.record_path] = running_record("classification_pyt")
    set_status(hook, EVALUATION_STATUS)
    hook.usage_stdout = (
        f"{SLURM_ID}|2026-12-03T06:00:00|2026-12-03T06:00:12|2026-12-03T06:10:12|600|gres/gpu=1|n2|0:0|polar|10\n"
    )
    evaluation = Asset("tao://team/classifier/evaluate")
    events: dict[Asset, SimpleNamespace] = {}
    sensor = sensor_with(hook, outlets=[evaluation])

    result = sensor.execute_complete(
        {**CTX, "outlet_events": _Events(events)}, event=terminal("COMPLETED"), job=make_handle()
    )

    assert result["terminal_state"] == "COMPLETE"
    assert result["kpis"] == {"mAP": 0.81, "AP50": 0.9}
    assert events[evaluation].extra == {
        "results_dir": LAYOUT.results_dir,
        "job_id": JOB_ID,
        "slurm_job_id": SLURM_ID,
        "cluster": "mini",
        "gpu_hours": 0.1667,
        "elapsed_seconds": 600,
        "kpis": {"mAP": 0.81, "AP50": 0.9},
    }
    assert hook.status_reads == [STATUS_PATH], "the verdict and the KPIs come from one read"
    assert "kpis" not in read_record(hook), "the record keeps its own keys"


@pytest.mark.parametrize(
    ("network_arch", "status"),
    [
        pytest.param("classification_pyt", [{"status": "SUCCESS", "message": "Training finished."}], id="no-kpi-line"),
        pytest.param("classification_pyt", [{"status": "SUCCESS", "kpi": {}}], id="empty-kpi"),
        pytest.param("custom", None, id="no-status-json"),
    ],
)
def test_a_job_without_kpis_returns_and_announces_no_kpis_key(network_arch: str, status: Any) -> None:
    hook = SensorHook()
    hook.files[LAYOUT.record_path] = running_record(network_arch)
    set_status(hook, status)
    results = Asset("tao://team/classifier/train")
    events: dict[Asset, SimpleNamespace] = {}

    result = sensor_with(hook, outlets=[results]).execute_complete(
        {**CTX, "outlet_events": _Events(events)}, event=terminal("COMPLETED"), job=make_handle()
    )

    assert result == read_record(hook)
    assert "kpis" not in events[results].extra


def test_the_kpis_are_redacted_as_the_record_is(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "tok-1f3a9c5e7b"
    monkeypatch.setenv("SENSOR_TEST_TOKEN", secret)
    hook = SensorHook()
    set_status(hook, [{"status": "SUCCESS", "kpi": {"accuracy": 0.9, "note": f"run by {secret}", "hf_token": "x1"}}])
    handle = make_handle(secret_refs={"HF_TOKEN": "env:SENSOR_TEST_TOKEN"})

    result = complete(sensor_with(hook), terminal("COMPLETED"), handle)

    assert result["kpis"] == {"accuracy": 0.9, "note": "run by ${REDACTED}", "hf_token": "${REDACTED}"}


def test_a_poking_sensor_returns_the_kpis_too(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = PokedHook()
    set_status(hook, EVALUATION_STATUS)
    sensor = poking(hook, [native("COMPLETED", "sacct", exit_code=0, signal=0)], monkeypatch)

    (done,) = poke_at(sensor, 0)

    assert done.xcom_value["kpis"] == {"mAP": 0.81, "AP50": 0.9}


# ---------------------------------------------------------------------- the task state store (issue 34, item 1)


@pytest.mark.parametrize(
    ("stored_root", "watched"),
    [
        pytest.param(SLURM_ID, "777", id="a-retry-goes-on-with-the-job-its-earlier-try-resubmitted"),
        pytest.param("499", SLURM_ID, id="a-stored-job-of-another-submission-is-ignored"),
        pytest.param(None, SLURM_ID, id="nothing-stored-watches-the-submitted-job"),
    ],
)
def test_the_sensor_stores_the_job_it_watches_and_a_retry_goes_on_with_it(
    stored_root: str | None, watched: str
) -> None:
    store = FakeTaskStateStore()
    newer = make_handle(slurm_job_id="777", job_id=mint_job_id("dag", "wait", "run1", retry_of=JOB_ID))
    if stored_root is not None:
        store.set("watched_job", {"root": stored_root, "handle": newer})
    ctx = {**CTX, "task_state_store": store}

    with pytest.raises(TaskDeferred) as deferred:
        sensor_with(NoHook()).execute(ctx)

    assert deferred.value.trigger.slurm_job_id == watched
    assert store.values["watched_job"]["root"] == SLURM_ID
    assert store.values["watched_job"]["handle"]["slurm_job_id"] == watched


# ---------------------------------------------------------------------- live logs


def test_the_trigger_follows_main_out_main_err_and_status_json_with_cursors_per_try() -> None:
    """Three live streams, cursors in the log dir named per task try; the secret references (not values) travel."""
    handle = make_handle(secret_refs={"HF_TOKEN": "env:HF"})

    def streams(ctx: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
        with pytest.raises(TaskDeferred) as deferred:
            sensor_with(NoHook(), job=handle, **kwargs).execute(ctx)
        trigger = deferred.value.trigger
        assert trigger.secret_refs == {"HF_TOKEN": "env:HF"}
        return list(trigger.log_streams)

    first = streams(CTX)
    log_dir = handle["log_dir"]
    assert [(s["label"], s["path"]) for s in first] == [
        ("main.out", f"{log_dir}/main.out"),
        ("main.err", f"{log_dir}/main.err"),
        ("status.json", f"{handle['results_dir']}/status.json"),
    ]
    assert all(s["cursor_path"].startswith(f"{log_dir}/.live-") for s in first)
    assert len({s["cursor_path"] for s in first}) == 3
    retry = {"ti": SimpleNamespace(**{**vars(CTX["ti"]), "try_number": 2})}
    assert {s["cursor_path"] for s in streams(retry)}.isdisjoint({s["cursor_path"] for s in first})
    assert streams(CTX, stream_logs=False) == []


def test_the_end_shows_only_what_the_live_lines_did_not(capfd: pytest.CaptureFixture[str]) -> None:
    """The trigger showed 'epoch 1' and 'epoch 2' live; at the end only 'epoch 3' is shown, cleaned and prefixed."""
    hook = SensorHook()
    handle = make_handle()
    hook.files[f"{handle['log_dir']}/main.out"] = "epoch 1\nepoch 2\n\x1b[31mepoch 3\x1b[0m\n"
    hook.files[f"{handle['log_dir']}/main.err"] = "warning: x\n"

    complete(sensor_with(hook), terminal("COMPLETED", log_offsets={"main.out": 16}), handle)

    out = "".join(capfd.readouterr())
    assert "main.out | epoch 3" in out
    assert "epoch 1" not in out
    assert "main.err | warning: x" in out  # main.err was not streamed: its end is shown


def test_the_end_redacts_a_private_key_printed_over_many_lines(capfd: pytest.CaptureFixture[str]) -> None:
    """The key block came after the live lines: none of its lines is shown at the end, the lines after it are."""
    hook = SensorHook()
    handle = make_handle()
    body = ["MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo", "4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onL"]
    key = "\n".join(["-----BEGIN " + "RSA PRIVATE KEY-----", *body, "-----END " + "RSA PRIVATE KEY-----"])
    hook.files[f"{handle['log_dir']}/main.out"] = f"epoch 1\n{key}\nepoch 2\n"

    complete(sensor_with(hook), terminal("COMPLETED", log_offsets={"main.out": 8}), handle)

    out = "".join(capfd.readouterr())
    assert "main.out | epoch 2" in out
    assert not any(line in out for line in body)


# Rows of a private key's body: 300 of them hold more than the end of a log the sensor shows (FINAL_LOG_BYTES).
KEY_ROWS = [f"MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0g{n:04d}" for n in range(300)]


@pytest.mark.parametrize("native", ["COMPLETED", "FAILED"])
@pytest.mark.parametrize(
    "shown",
    [pytest.param(None, id="the-logs-end-starts-in-the-block"), pytest.param(290, id="the-live-lines-ended-in-it")],
)
def test_the_end_read_from_inside_a_key_block_shows_none_of_it(
    capfd: pytest.CaptureFixture[str], native: str, shown: int | None
) -> None:
    """The end of the log starts inside a key block whose BEGIN it does not hold (the log's last bytes, or what
    follows the live lines, which ended inside the block): no row is shown, classified or recorded."""
    hook = SensorHook()
    handle = make_handle()
    key = ["-----BEGIN " + "PRIVATE KEY-----", *KEY_ROWS, "dGFpbA==", "-----END " + "PRIVATE KEY-----"]
    text = "\n".join(["epoch 1", *key, "epoch 2", ""])
    hook.files[f"{handle['log_dir']}/main.out"] = text
    offsets = {} if shown is None else {"main.out": text.index(KEY_ROWS[shown])}

    sensor, event = sensor_with(hook), terminal(native, exit_code=int(native == "FAILED"), log_offsets=offsets)
    with pytest.raises(JobFailedError) if native == "FAILED" else contextlib.nullcontext() as failed:
        complete(sensor, event, handle)

    out = "".join(capfd.readouterr()) + hook.files[handle["record_path"]] + str(failed and failed.value)
    assert "main.out | epoch 2" in out
    assert "withheld" in out
    assert not any(row in out for row in [*KEY_ROWS, "dGFpbA=="])


def test_a_secret_this_worker_cannot_resolve_keeps_the_jobs_lines_out_of_the_task_log(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SENSOR_MISSING_TOKEN", raising=False)
    hook = SensorHook()
    handle = make_handle(secret_refs={"HF_TOKEN": "env:SENSOR_MISSING_TOKEN"})
    hook.files[f"{handle['log_dir']}/main.out"] = "epoch 1\nleaked tok-1f3a9c5e7b here\n"

    result = complete(sensor_with(hook), terminal("COMPLETED"), handle)

    out = "".join(capfd.readouterr())
    assert result["terminal_state"] == "COMPLETE"
    assert "epoch 1" not in out
    assert "tok-1f3a9c5e7b" not in out
    assert out.count("Cannot resolve secret_env[HF_TOKEN]") == 1
    assert f"they stay in {handle['log_dir']}" in out


class EndsHook(SensorHook):
    """A cluster whose ends directory holds ``markers`` (``<id>-<restart>-<code>.end`` names).

    With ``listing_error`` set, listing them fails with that error.
    """

    def __init__(self, *markers: str) -> None:
        super().__init__()
        self.markers = markers
        self.listing_error: str | None = None
        self.handlers.insert(0, self._list_markers)

    def _list_markers(self, command: str) -> CommandResult | None:
        if command != end_markers({f"{BASE}/ends": 0.0}):
            return None
        if self.listing_error is not None:
            return CommandResult(2, "", self.listing_error)
        listed = "".join(f"{name} 1767323045.5\n" for name in self.markers)
        return CommandResult(0, f"== tao-slurm ends 0\n{listed}", "")


VANISHED = {
    "status": "vanished",
    "slurm_job_id": SLURM_ID,
    "job_name": JOB_ID,
    "message": f"SLURM job {SLURM_ID} is unknown to squeue and sacct for 301 s",
}


def test_a_vanished_job_whose_end_marker_and_exit_code_file_show_a_clean_end_completes(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """slurmctld forgot the job (short MinJobAge) and slurmdbd lags past the grace: its own files settle it."""
    hook = EndsHook(f"{SLURM_ID}-0-0.end", f"9{SLURM_ID}-0-3.end")  # another job's marker is not this one's
    hook.files[LAYOUT.exit_code_path] = "0\n"

    result = complete(sensor_with(hook), VANISHED)

    assert (result["terminal_state"], result["exit_codes"]) == ("COMPLETE", {"job": 0})
    record = read_record(hook)
    assert record["terminal_state"] == "COMPLETE"
    assert "UNKNOWN" not in [t["state"] for t in record["transitions"]]
    assert "settled on that evidence" in "".join(capfd.readouterr())
    assert hook.commands[-1] == SETTLED_REMOVAL


def test_a_vanished_job_whose_files_show_a_failure_fails_with_its_exit_code() -> None:
    hook = EndsHook(f"{SLURM_ID}-0-0.end", f"{SLURM_ID}-1-3.end")  # the requeued run exited 3
    hook.files[LAYOUT.exit_code_path] = "3\n"

    with pytest.raises(JobFailedError) as failed:
        complete(sensor_with(hook), VANISHED)

    assert failed.value.err_class == "ERR_PROGRAM"
    assert isinstance(failed.value, AirflowFailException), "a retry cannot fix a program error"
    record = read_record(hook)
    assert (record["terminal_state"], record["exit_codes"]) == ("ERROR", {"job": 3})


@pytest.mark.parametrize(
    ("markers", "exit_code"),
    [
        pytest.param((f"{SLURM_ID}-0-0.end",), None, id="no-exit-code-file"),
        pytest.param((), "0\n", id="no-marker"),
        pytest.param((f"{SLURM_ID}-0-0.end",), "3\n", id="files-disagree"),
    ],
)
def test_a_vanished_job_without_evidence_of_its_end_stays_unknown(
    markers: tuple[str, ...], exit_code: str | None
) -> None:
    hook = EndsHook(*markers)
    if exit_code is not None:
        hook.files[LAYOUT.exit_code_path] = exit_code

    with pytest.raises(JobNotFoundError, match="unknown to squeue and sacct"):
        complete(sensor_with(hook), VANISHED)

    record = read_record(hook)
    assert (record["terminal_state"], record["transitions"][-1]["state"]) == (None, "UNKNOWN")


@pytest.mark.parametrize("unreadable", ["markers", "exit-code-file"])
def test_a_vanished_job_whose_files_could_not_be_read_is_not_settled(unreadable: str) -> None:
    """A read that failed is no evidence: the record stays as it was and the task fails to be retried."""
    hook = EndsHook(f"{SLURM_ID}-0-0.end")
    hook.files[LAYOUT.exit_code_path] = "0\n"
    before = hook.files[LAYOUT.record_path]
    if unreadable == "markers":
        hook.listing_error = "Stale file handle"
    else:
        hook.unreadable.add(LAYOUT.exit_code_path)

    with pytest.raises(RemoteCommandError, match=r"Stale file handle|Input/output error"):
        complete(sensor_with(hook), VANISHED)

    assert hook.files[LAYOUT.record_path] == before
    assert not [command for command in hook.commands if command.startswith("rm ")]


def test_job_or_slurm_job_id_but_not_both_nor_neither() -> None:
    for kwargs in ({"job": None}, {"slurm_job_id": "42"}):
        with pytest.raises(ValidationError, match="either job"):
            sensor_with(NoHook(), **kwargs).execute(CTX)


def foreign_hook(info: dict[str, str] | None) -> FakeSlurmHook:
    """A cluster that knows job 777 (``info``: what scontrol says of it; None: it forgot the job), submitted by
    someone else's script (stdout and stderr in one file)."""
    hook = FakeSlurmHook(settings=replace(SETTINGS, cluster_name="polaris"))
    if info is not None:
        hook.job_info["777"] = info
    return hook


FOREIGN_INFO = {
    "JobId": "777",
    "JobName": "train.sh",
    "UserId": "alice",
    "StdOut": "/home/alice/slurm-777.out",
    "StdErr": "/home/alice/slurm-777.out",
    "WorkDir": "/home/alice",
}


def foreign_event(native: str, exit_code: int = 0, **extra: Any) -> dict[str, Any]:
    state = state_from_native("777", native, source="sacct", exit_code=exit_code, signal=0, node_list="n1")
    return {"status": "terminal", "slurm_job_id": "777", "job_name": "", "state": state_to_payload(state), **extra}


def test_a_job_submitted_elsewhere_is_watched_by_its_id_and_never_cancelled() -> None:
    sensor = SlurmJobSensor(task_id="wait", job=None, slurm_job_id=" 777 ", poke_interval=5)
    sensor.__dict__["hook"] = foreign_hook(FOREIGN_INFO)

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(CTX)

    trigger = deferred.value.trigger
    assert (trigger.slurm_job_id, trigger.job_name, trigger.cancel_on_kill) == ("777", "", False)
    assert [(s["label"], s["path"]) for s in trigger.log_streams] == [("stdout", "/home/alice/slurm-777.out")]
    assert trigger.log_streams[0]["cursor_path"].startswith("/home/alice/.live-")
    assert (trigger.record_path, trigger.sidecar_path) == (None, None)
    assert XCOM[WATCHED_JOB_KEY]["log_dir"] == "/home/alice"
    foreign = deferred.value.kwargs["foreign"]

    result = sensor.execute_complete(CTX, event=foreign_event("COMPLETED"), foreign=foreign)
    assert (result["slurm_job_id"], result["job_name"], result["terminal_state"]) == ("777", "train.sh", "COMPLETE")

    with pytest.raises(JobFailedError, match="SLURM job 777 failed"):
        sensor.execute_complete(CTX, event=foreign_event("FAILED", exit_code=3), foreign=foreign)


def test_an_unknown_job_id_fails_naming_it() -> None:
    sensor = SlurmJobSensor(task_id="wait", slurm_job_id="777", poke_interval=5)
    hook = foreign_hook(None)
    sensor.__dict__["hook"] = hook
    with pytest.raises(JobNotFoundError, match="SLURM job 777 is unknown to scontrol, squeue and sacct on polaris"):
        sensor.execute(CTX)
    assert hook.polls == [["777"]]


def test_a_bad_job_id_is_refused_before_any_ssh() -> None:
    sensor = SlurmJobSensor(task_id="wait", slurm_job_id="7; scancel -u alice", poke_interval=5)
    sensor.__dict__["hook"] = NoHook()
    with pytest.raises(ValidationError):
        sensor.execute(CTX)


# ---------------------------------------------------------------------- end markers


def test_the_trigger_reads_the_jobs_end_markers() -> None:
    with pytest.raises(TaskDeferred) as deferred:
        sensor_with(NoHook()).execute(CTX)
    assert deferred.value.trigger.end_marker_dir == f"{BASE}/ends"


# ---------------------------------------------------------------------- a training over several slices (issue 33)

CHAIN = {"max_continuations": 3, "checkpoint_globs": ["*.pth"], "time_hours": 1 / 60}


@pytest.mark.parametrize(
    ("native", "exit_code"),
    [("TIMEOUT", 0), ("PREEMPTED", 0), ("FAILED", 124)],
    ids=["timeout", "preempted", "timeout-124"],
)
def test_a_slice_that_ran_out_of_time_after_a_checkpoint_is_continued(native: str, exit_code: int) -> None:
    hook = SensorHook()
    hook.checkpoints = f"START\n9.5 {LAYOUT.results_dir}/train/epoch_5.pth\n"

    with pytest.raises(TaskDeferred) as deferred:
        complete(sensor_with(hook), terminal(native, exit_code=exit_code), make_handle(**CHAIN))

    slice_2 = f"{JOB_ID}-s2"  # the training's name with the slice number, not the sensor task's
    assert hook.submits == [(LAYOUT.script_path, slice_2, LAYOUT.log_dir, ("--export=ALL,TAO_SLURM_SLICE=2",))]
    handle = deferred.value.kwargs["job"]
    assert (handle["job_id"], handle["slurm_job_id"], handle["slice_number"]) == (slice_2, "501", 2)
    assert [item["checkpoint"] for item in handle["slices"]] == [f"{LAYOUT.results_dir}/train/epoch_5.pth"]
    assert deferred.value.trigger.slurm_job_id == "501"
    assert XCOM[WATCHED_JOB_KEY] == handle, "the extra links follow the current slice"


def test_without_continuations_a_timeout_stays_an_error() -> None:
    hook = SensorHook()
    hook.checkpoints = f"START\n9.5 {LAYOUT.results_dir}/train/epoch_5.pth\n"

    with pytest.raises(JobFailedError, match="TIMEOUT"):
        complete(sensor_with(hook), terminal("TIMEOUT"))

    assert (hook.submits, read_record(hook)["terminal_state"]) == ([], "ERROR")


def test_a_slice_without_a_new_checkpoint_stops_the_chain_naming_the_fix() -> None:
    hook = SensorHook()
    with pytest.raises(JobFailedError, match=r"slice 1 ended TIMEOUT and wrote no checkpoint: lower the training"):
        complete(sensor_with(hook), terminal("TIMEOUT"), make_handle(**CHAIN))
    assert hook.submits == []
    assert (read_record(hook)["terminal_state"], read_record(hook)["err_class"]) == ("ERROR", "ERR_PROGRAM")


def test_the_last_slice_returns_every_slice_and_the_totals() -> None:
    hook = SensorHook()
    set_status(hook, [{"status": "SUCCESS"}])
    earlier = {
        "job_id": "tao-a-0000000000000001",
        "slurm_job_id": "400",
        "state": "TIMEOUT",
        "queue_seconds": 3,
        "elapsed_seconds": 70,
        "gpu_hours": 0.0194,
        "checkpoint": f"{LAYOUT.results_dir}/train/epoch_5.pth",
    }
    result = complete(sensor_with(hook), terminal("COMPLETED"), make_handle(**CHAIN, slice_number=2, slices=[earlier]))

    assert result["terminal_state"] == "COMPLETE"
    assert [item["state"] for item in result["slices"]] == ["TIMEOUT", "COMPLETED"]
    assert result["slices"][-1]["slurm_job_id"] == SLURM_ID
    assert result["totals"]["slices"] == 2
    assert result["totals"]["elapsed_seconds"] == 70
    record = read_record(hook)
    assert (record["terminal_state"], record["extra"]["totals"], record["extra"]["slices"]) == (
        "COMPLETE",
        result["totals"],
        result["slices"],
    ), "the final record carries every slice too"


# ---------------------------------------------------------------- a chain resumed without the kwargs (issue 41, item 6)


def slice_event(slurm_id: str, job_name: str, native: str) -> dict[str, Any]:
    """The terminal event of the SLURM job ``slurm_id`` named ``job_name``."""
    state = state_from_native(slurm_id, native, source="sacct", exit_code=0, signal=0, node_list="n2")
    return {"status": "terminal", "slurm_job_id": slurm_id, "job_name": job_name, "state": state_to_payload(state)}


#: Slice 1 (the submitted job) ran out of time.
SLICE_1_END = slice_event(SLURM_ID, JOB_ID, "TIMEOUT")


def slice_2_end(second: TaskDeferred) -> dict[str, Any]:
    """Slice 2 (SLURM job 501, the next slice ``second`` deferred on) completed."""
    assert second.kwargs is not None
    return slice_event("501", second.kwargs["job"]["job_id"], "COMPLETED")


def chain_hook() -> SensorHook:
    """Slice 1 wrote a checkpoint; slice 2 will end with status.json SUCCESS."""
    hook = SensorHook()
    hook.checkpoints = f"START\n9.5 {LAYOUT.results_dir}/train/epoch_5.pth\n"
    set_status(hook, [{"status": "SUCCESS"}])
    return hook


def continued(hook: SensorHook, store: FakeTaskStateStore, *, kwargs: bool) -> tuple[dict[str, Any], TaskDeferred]:
    """Defer on slice 1, resume on its TIMEOUT (with or without the deferral's kwargs): the sensor defers on slice 2."""
    ctx = {**CTX, "task_state_store": store}
    sensor = sensor_with(hook, job=make_handle(**CHAIN))
    first = deferral_in(sensor, ctx)
    with pytest.raises(TaskDeferred) as second:
        sensor.execute_complete(ctx, event=SLICE_1_END, **(first.kwargs if kwargs else {}))
    assert second.value.trigger.slurm_job_id == "501"
    assert store.values["watched_job"]["handle"]["slurm_job_id"] == "501", "stored before the deferral"
    return ctx, second.value


def deferral_in(sensor: SlurmJobSensor, ctx: dict[str, Any]) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(ctx)
    return deferred.value


@pytest.mark.parametrize(
    "resume",
    [
        pytest.param("event-only", id="dags-test-the-event-alone"),
        pytest.param("kwargs", id="the-triggerer-with-the-deferral-kwargs"),
        pytest.param("retry", id="a-retry-of-the-sensor-then-the-event-alone"),
    ],
)
def test_a_continued_training_resumed_with_the_event_alone_settles_the_slice_it_deferred_on(resume: str) -> None:
    """``airflow dags test`` resumes a deferred task with ``event`` only, not the deferral's ``job``. The sensor
    settles the job it last deferred on (its task state store): slice 2 completes the training, as it does when
    the triggerer passes the kwargs and when a retried sensor defers on slice 2 again."""
    hook, store = chain_hook(), FakeTaskStateStore()
    ctx, second = continued(hook, store, kwargs=resume == "kwargs")
    sensor = sensor_with(hook, job=make_handle(**CHAIN))  # a new instance, as each resume is
    if resume == "retry":
        second = deferral_in(sensor_with(hook, job=make_handle(**CHAIN)), ctx)
        assert second.trigger.slurm_job_id == "501"

    result = sensor.execute_complete(ctx, event=slice_2_end(second), **(second.kwargs if resume == "kwargs" else {}))

    assert second.kwargs is not None
    slice_2 = second.kwargs["job"]
    assert (result["job_id"], result["terminal_state"]) == (slice_2["job_id"], "COMPLETE")
    assert [(item["slurm_job_id"], item["state"]) for item in result["slices"]] == [
        (SLURM_ID, "TIMEOUT"),
        ("501", "COMPLETED"),
    ]
    assert len(hook.submits) == 1, "one next slice"
    assert read_record(hook, slice_2["record_path"])["terminal_state"] == "COMPLETE"


def test_a_compact_event_of_the_next_slice_is_read_beside_the_job_without_the_kwargs() -> None:
    """The next slice's compact event names a file in the chain's events directory; the sensor reads it there."""
    hook, store = chain_hook(), FakeTaskStateStore()
    ctx, second = continued(hook, store, kwargs=False)
    path = second.trigger.event_path
    assert path is not None
    assert path.startswith(f"{LAYOUT.job_dir}/events/501-")
    hook.files[path] = json.dumps(slice_2_end(second))
    compact = JobEvent.from_dict(slice_2_end(second)).compact(posixpath.basename(path))

    result = sensor_with(hook, job=make_handle(**CHAIN)).execute_complete(ctx, event=compact)

    assert (result["slices"][-1]["slurm_job_id"], result["terminal_state"]) == ("501", "COMPLETE")


@pytest.mark.parametrize(
    ("event", "kwargs", "match"),
    [
        pytest.param(
            SLICE_1_END, None, r"is for job 500, not 501; clear the task \(SLURM job 501 is the job it last deferred",
            id="slice-1s-event-again-without-kwargs",
        ),
        pytest.param(
            slice_event("777", JOB_ID, "COMPLETED"), None, "is for job 777, not 501", id="another-jobs-event"
        ),
        pytest.param(
            slice_event("777", JOB_ID, "COMPLETED"), "second", "is for job 777, not 501", id="another-with-kwargs"
        ),
        pytest.param(
            SLICE_1_END, "first", r"resume is for SLURM job 500, but the sensor has since deferred on SLURM job 501",
            id="slice-1s-deferral-resumed-again",
        ),
        pytest.param(
            slice_event("501", JOB_ID, "COMPLETED"), None, f"SLURM job 501 names the job {JOB_ID}, not ",
            id="slice-2s-id-with-another-name",
        ),
    ],
)  # fmt: skip
def test_a_stale_event_of_a_continued_training_settles_nothing(
    event: dict[str, Any], kwargs: str | None, match: str
) -> None:
    """Once the sensor deferred on slice 2, an event of any other job (slice 1's again, an unrelated one, slice 2's
    SLURM id under another name) or a resume of slice 1's deferral ends nothing: no record changes, no submission."""
    hook, store = chain_hook(), FakeTaskStateStore()
    first = make_handle(**CHAIN)
    ctx, second = continued(hook, store, kwargs=False)
    files, commands = dict(hook.files), list(hook.commands)
    given = {"first": {"job": first}, "second": second.kwargs, None: {}}[kwargs]

    with pytest.raises(ValidationError, match=match):
        sensor_with(hook, job=first).execute_complete(ctx, event=event, **given)

    assert hook.files == files
    assert hook.commands == commands
    assert len(hook.submits) == 1


def test_without_a_task_state_store_an_event_alone_is_taken_for_the_submitted_job() -> None:
    """No store in the context (nothing says which slice it deferred on last): the event must be the submitted job's."""
    hook = chain_hook()
    with pytest.raises(
        ValidationError, match=r"is for job 501, not 500; clear the task \(SLURM job 500 is the submitted"
    ):
        sensor_with(hook, job=make_handle(**CHAIN)).execute_complete(CTX, event=slice_event("501", JOB_ID, "COMPLETED"))
    assert hook.commands == []


@pytest.mark.parametrize("watched", [{}, {"job": None, "slurm_job_id": "123"}], ids=["handle", "foreign"])
def test_reschedule_mode_is_refused_before_anything_runs(watched: dict[str, Any]) -> None:
    """A rescheduled sensor is a new instance every poke: it would re-adopt a resubmitted job each time and
    its vanished/unknown clocks would never run out. Refused up front, naming the modes that work."""
    hook = SensorHook()
    sensor = sensor_with(hook, deferrable=False, mode="reschedule", **watched)

    with pytest.raises(ValidationError, match=r"mode='reschedule'.*deferrable=True.*mode='poke'"):
        sensor.execute(CTX)

    assert hook.commands == []


@pytest.mark.parametrize(
    ("old", "new"),
    [("not_found_grace", "not_found_grace_seconds"), ("unrecognised_grace", "unrecognised_grace_seconds")],
)
def test_the_old_grace_names_still_work_for_a_release(old: str, new: str) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=f"{old} is deprecated .* use {new}"):
        sensor = SlurmJobSensor(task_id="wait", job=make_handle(), **{old: 42})

    assert getattr(sensor, new) == 42
    with pytest.raises(ValidationError, match=f"{old} and {new} were both given"):
        SlurmJobSensor(task_id="wait", job=make_handle(), **{old: 42, new: 43})


# ---------------------------------------------------------------------- a compact trigger event (issue 34, item 4)

#: The job's running record, before anything settled it.
RUNNING_RECORD = running_record()


def deferral(sensor: SlurmJobSensor) -> TaskDeferred:
    """Defer ``sensor``; execute_complete is told nothing about the event file (``airflow dags test`` drops kwargs)."""
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(CTX)
    assert "event_path" not in (deferred.value.kwargs or {})
    return deferred.value


def test_each_deferral_gives_the_trigger_its_own_event_file_beside_the_job() -> None:
    first, second = (deferral(sensor_with(NoHook())).trigger.event_path for _ in range(2))

    for path in (first, second):
        assert path is not None
        assert re.fullmatch(rf"{re.escape(LAYOUT.job_dir)}/events/{SLURM_ID}-[0-9a-f]{{12}}\.json", path)
    assert first != second


def test_a_compact_event_settles_as_its_full_event_would() -> None:
    """The compact event names the file; the sensor reads the full event there and settles exactly as inline."""
    full = terminal("COMPLETED", transitions=[{"ts": 1767323046.0, "state": "RUNNING", "native": "RUNNING"}])
    inline_hook, file_hook = SensorHook(), SensorHook()
    path = deferral(sensor_with(NoHook())).trigger.event_path
    file_hook.files[path] = json.dumps(full)
    compact = JobEvent.from_dict(full).compact(posixpath.basename(path))

    inline = complete(sensor_with(inline_hook), full)
    via_file = complete(sensor_with(file_hook), compact)

    assert via_file["terminal_state"] == inline["terminal_state"] == "COMPLETE"
    assert [t["state"] for t in via_file["transitions"]] == [t["state"] for t in inline["transitions"]]
    assert file_hook.commands == inline_hook.commands
    assert file_hook.reads == [path, *inline_hook.reads]
    assert path in file_hook.files  # it stays beside the job


EVENT_FILE = f"{LAYOUT.job_dir}/events/{SLURM_ID}-0123456789ab.json"
COMPACT = {"status": "terminal", "slurm_job_id": SLURM_ID, "native": "COMPLETED", "ref": "500-0123456789ab.json"}


@pytest.mark.parametrize(
    ("file", "event", "error", "match"),
    [
        pytest.param(
            None, COMPACT, MissingPathsError, f"{EVENT_FILE} of SLURM job 500 is missing.*clear the task", id="no-file"
        ),
        pytest.param("unreadable", COMPACT, RemoteReadError, "Input/output error", id="failed-read"),
        pytest.param(
            terminal("COMPLETED"),
            {**COMPACT, "ref": "500-ffffffffffff.json"},
            MissingPathsError,
            "500-ffffffffffff.json of SLURM job 500 is missing",
            id="ref-to-another-file",
        ),
        pytest.param(
            terminal("COMPLETED"),
            {**COMPACT, "ref": "../../records/x.json"},
            ValidationError,
            "refers to no file name",
            id="ref-out-of-the-directory",
        ),
        pytest.param(
            {**terminal("COMPLETED"), "slurm_job_id": "501"},
            COMPACT,
            ValidationError,
            "about job 501 .*names job 500",
            id="file-of-another-job",
        ),
        pytest.param(
            terminal("FAILED", exit_code=3),
            {**COMPACT, "status": "vanished"},
            ValidationError,
            r"\(terminal\).*\(vanished\)",
            id="file-of-another-outcome",
        ),
        pytest.param(
            {**terminal("COMPLETED"), "slurm_job_id": "501"},
            {**COMPACT, "slurm_job_id": "501"},
            ValidationError,
            "is for job 501, not 500; clear the task",
            id="event-of-another-job",
        ),
    ],
)
def test_a_compact_event_whose_file_cannot_be_had_settles_nothing(
    file: dict[str, Any] | str | None, event: dict[str, Any], error: type[Exception], match: str
) -> None:
    """The file is read from the job's events directory, never from a path the event gives; a file missing, unread
    or about another job or outcome settles nothing."""
    hook = SensorHook()
    if file == "unreadable":
        hook.files[EVENT_FILE] = json.dumps(terminal("COMPLETED"))
        hook.unreadable.add(EVENT_FILE)
    elif isinstance(file, dict):
        hook.files[EVENT_FILE] = json.dumps(file)

    with pytest.raises(error, match=match):
        complete(sensor_with(hook), event)

    assert hook.files[LAYOUT.record_path] == RUNNING_RECORD
    assert hook.commands == []


@pytest.mark.parametrize(
    ("results_dir", "event_dir"),
    [
        pytest.param(SETTINGS.results_dir, f"{SETTINGS.results_dir}/events", id="in-the-results-dir"),
        pytest.param(None, None, id="inline-without-a-results-dir"),
    ],
)
def test_a_job_submitted_elsewhere_leaves_its_event_in_the_results_dir(
    results_dir: str | None, event_dir: str | None
) -> None:
    """Such a job has no job dir: its event file goes to the connection's results dir (inline without one)."""
    sensor = SlurmJobSensor(task_id="wait", slurm_job_id="777", poke_interval=5)
    hook = foreign_hook(FOREIGN_INFO)
    hook.settings = replace(hook.settings, results_dir=results_dir)
    sensor.__dict__["hook"] = hook

    deferred = deferral(sensor)

    path = deferred.trigger.event_path
    assert (posixpath.dirname(path) if path else None) == event_dir
    compact = JobEvent.from_dict(foreign_event("COMPLETED")).compact(posixpath.basename(path or "777-x.json"))
    if path is None:
        with pytest.raises(ValidationError, match="knows no directory"):
            sensor.execute_complete(CTX, event=compact, foreign=deferred.kwargs["foreign"])
        return
    hook.files[path] = json.dumps(foreign_event("COMPLETED"))
    result = sensor.execute_complete(CTX, event=compact, foreign=deferred.kwargs["foreign"])
    assert (result["slurm_job_id"], result["terminal_state"]) == ("777", "COMPLETE")
