"""The typed job handle and trigger event: round trips (dict and JSON) and what ``from_dict`` refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.records import mint_job_id
from airflow_provider_tao_slurm.core.states import JobState, TaoState, state_from_native
from airflow_provider_tao_slurm.exceptions import ValidationError
from airflow_provider_tao_slurm.lifecycle.events import (
    DEFAULT_NOT_FOUND_GRACE_S,
    DEFAULT_UNRECOGNISED_GRACE_S,
    EventStatus,
    JobEvent,
    JobHandle,
    Observation,
    state_from_payload,
    state_to_payload,
)

JOB_ID = mint_job_id("dag", "submit", "run1")
BASE = "/lustre/u"
REQUIRED = {
    "job_id": JOB_ID,
    "slurm_job_id": "500",
    "job_dir": f"{BASE}/jobs/{JOB_ID}",
    "results_dir": f"{BASE}/results/{JOB_ID}",
    "record_path": f"{BASE}/records/{JOB_ID}.json",
    "results_base": BASE,
}
FULL = {
    **REQUIRED,
    "log_dir": f"{BASE}/logs/{JOB_ID}-500",
    "cluster": "mini",
    "script_path": f"{BASE}/jobs/{JOB_ID}/sbatch/job_{JOB_ID}.sbatch",
    "sidecar_path": f"{BASE}/jobs/{JOB_ID}/.secrets.env",
    "exit_code_path": f"{BASE}/jobs/{JOB_ID}/exit_codes",
    "submitted_at": "2026-01-02T03:04:05Z",
    "exclude_nodes": ["n1", "n2"],
    "child_exit_code_path": f"{BASE}/jobs/{JOB_ID}/child_exit_codes",
    "secret_refs": {"HF_TOKEN": "env:HF_TOKEN"},
    "retry_of": mint_job_id("dag", "submit", "run0"),
    "infra_retries": 1,
    "num_nodes": 2,
    "partition": "gpu,debug",
    "max_continuations": 4,
    "slice_number": 2,
    "checkpoint_globs": ["*.pth", "*.ckpt"],
    "time_hours": 0.5,
    "checkpoint_interval": "5 epoch",
    "slices": [
        {
            "job_id": mint_job_id("dag", "submit", "run0"),
            "slurm_job_id": "499",
            "state": "TIMEOUT",
            "queue_seconds": 3,
            "elapsed_seconds": 1800,
            "gpu_hours": 2.0,
            "checkpoint": f"{BASE}/results/{JOB_ID}/epoch_3.pth",
        }
    ],
}


def test_defaults() -> None:
    assert (DEFAULT_NOT_FOUND_GRACE_S, DEFAULT_UNRECOGNISED_GRACE_S) == (300.0, 600.0)


@pytest.mark.parametrize("data", [REQUIRED, FULL], ids=["required-only", "every-field"])
def test_handle_round_trip(data: dict[str, Any]) -> None:
    handle = JobHandle.from_dict(data)
    as_dict = handle.to_dict()

    assert JobHandle.from_dict(json.loads(json.dumps(as_dict))) == handle
    assert {key: as_dict[key] for key in data} == data  # the public keys travel as they are
    assert isinstance(as_dict["exclude_nodes"], list)
    assert isinstance(as_dict["secret_refs"], dict)
    assert JobHandle.from_dict(handle) is handle


def test_handle_defaults_and_normalisation() -> None:
    handle = JobHandle.from_dict(
        {**REQUIRED, "slurm_job_id": 500, "exclude_nodes": None, "infra_retries": None, "newer_key": "x"}
    )
    assert handle.slurm_job_id == "500"
    assert (handle.exclude_nodes, handle.infra_retries, handle.retry_of) == ((), 0, None)
    assert (handle.num_nodes, handle.partition, handle.sidecar_path) == (None, None, None)
    assert (handle.max_continuations, handle.slice_number, handle.checkpoint_globs, handle.slices) == (0, 1, (), ())
    assert "newer_key" not in handle.to_dict()
    assert set(JobHandle.from_dict(REQUIRED).to_dict()) == set(FULL)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        pytest.param("{{ ti.xcom_pull('submit') }}", "got str", id="unrendered-template"),
        pytest.param(None, "got NoneType", id="none"),
        pytest.param(["500"], "got list", id="list"),
        pytest.param({}, "lacks job_id, slurm_job_id, job_dir, results_dir, record_path, results_base", id="empty"),
        *[
            pytest.param({k: v for k, v in REQUIRED.items() if k != key}, f"lacks {key};", id=f"no-{key}")
            for key in REQUIRED
        ],
        pytest.param({**REQUIRED, "record_path": ""}, "lacks record_path", id="empty-record-path"),
        pytest.param({**REQUIRED, "slurm_job_id": "12a"}, "bad slurm_job_id '12a'", id="slurm-id-letters"),
        pytest.param({**REQUIRED, "slurm_job_id": "-1"}, "bad slurm_job_id", id="slurm-id-negative"),
        pytest.param({**REQUIRED, "slurm_job_id": "12; id"}, "bad slurm_job_id", id="slurm-id-hostile"),
        pytest.param({**REQUIRED, "job_id": "a b"}, "job handle's job_id", id="job-id-space"),
        pytest.param({**REQUIRED, "job_id": "$(id)"}, "job handle's job_id", id="job-id-hostile"),
        pytest.param({**REQUIRED, "job_id": "-x"}, "job handle's job_id", id="job-id-option"),
    ],
)
def test_handle_validation_errors(value: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match.replace("(", r"\(").replace(")", r"\)")):
        JobHandle.from_dict(value)


def state(native: str, source: str = "sacct", **kwargs: Any) -> JobState:
    return state_from_native("500", native, source=source, **kwargs)  # type: ignore[arg-type]


TRANSITIONS = (
    Observation(1767323045.0, TaoState.PENDING, "PENDING", "Priority"),
    Observation(1767323055.5, TaoState.RUNNING, "RUNNING"),
)


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(
            JobEvent(
                EventStatus.TERMINAL,
                "500",
                JOB_ID,
                state("COMPLETED", exit_code=0, signal=0, node_list="n[1-2]"),
                TRANSITIONS,
            ),
            id="terminal",
        ),
        pytest.param(
            JobEvent(EventStatus.TERMINAL, "500", JOB_ID, state("CANCELLED by 1001", exit_code=0, signal=15)),
            id="terminal-cancelled",
        ),
        pytest.param(
            JobEvent(EventStatus.VANISHED, "500", JOB_ID, None, TRANSITIONS, "SLURM job 500 is unknown"),
            id="vanished",
        ),
        pytest.param(
            JobEvent(EventStatus.UNRECOGNISED, "500", JOB_ID, state("WEIRD_STATE", "squeue"), (), "WEIRD_STATE"),
            id="unrecognised",
        ),
    ],
)
def test_event_round_trip(event: JobEvent) -> None:
    payload = event.to_dict()

    assert payload["status"] == str(event.status)
    assert JobEvent.from_dict(json.loads(json.dumps(payload))) == event


def test_an_older_providers_error_event_reads_as_vanished() -> None:
    old = {
        "status": "error",
        "slurm_job_id": "500",
        "job_name": JOB_ID,
        "state": {"tao_state": "UNKNOWN", "native": "NOT_FOUND"},
        "message": "SLURM job 500 is unknown to squeue and sacct",
    }
    event = JobEvent.from_dict(old)
    assert event.status is EventStatus.VANISHED
    assert event.message == old["message"]
    assert event.transitions == ()


def test_an_event_without_a_job_name_is_not_named_none() -> None:
    old = {"status": "error", "slurm_job_id": "500", "message": "SLURM job 500 is unknown to squeue and sacct"}
    try:
        event = JobEvent.from_dict(old)
    except ValidationError:
        return
    assert event.job_name != "None"


TERMINAL = JobEvent(EventStatus.TERMINAL, "500", JOB_ID, state("COMPLETED", exit_code=0, signal=0)).to_dict()


@pytest.mark.parametrize(
    ("value", "match"),
    [
        pytest.param(None, "unexpected trigger event None", id="none"),
        pytest.param("terminal", "unexpected trigger event", id="text"),
        pytest.param({"slurm_job_id": "500"}, "unexpected trigger event", id="no-status"),
        pytest.param({**TERMINAL, "status": "done"}, "unexpected trigger event", id="unknown-status"),
        pytest.param({**TERMINAL, "status": "TERMINAL"}, "unexpected trigger event", id="status-case"),
        pytest.param({**TERMINAL, "slurm_job_id": "5x"}, "unexpected trigger event", id="bad-slurm-id"),
        pytest.param({**TERMINAL, "slurm_job_id": None}, "unexpected trigger event", id="no-slurm-id"),
        pytest.param({**TERMINAL, "job_name": "a b"}, "unexpected trigger event", id="bad-job-name"),
        pytest.param({**TERMINAL, "job_name": "$(id)"}, "unexpected trigger event", id="hostile-job-name"),
        pytest.param({**TERMINAL, "state": None}, "carries no terminal state", id="terminal-without-state"),
        pytest.param(
            {**TERMINAL, "state": state_to_payload(state("RUNNING", "squeue"))},
            "carries no terminal state",
            id="terminal-with-live-state",
        ),
        pytest.param({**TERMINAL, "transitions": [{"state": "RUNNING"}]}, "unexpected", id="transition-without-ts"),
        pytest.param(
            {**TERMINAL, "transitions": [{"ts": 1.0, "state": "BOGUS"}]}, "unexpected", id="transition-bad-state"
        ),
        pytest.param(
            {**TERMINAL, "transitions": [{"ts": "soon", "state": "RUNNING"}]}, "unexpected", id="transition-bad-ts"
        ),
        pytest.param({**TERMINAL, "transitions": ["RUNNING"]}, "unexpected", id="transition-not-a-dict"),
    ],
)
def test_bad_events_are_refused(value: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        JobEvent.from_dict(value)


def test_refusal_names_what_was_read() -> None:
    with pytest.raises(ValidationError, match="unexpected probe trigger event"):
        JobEvent.from_dict({"status": "done"}, what="probe trigger event")


@pytest.mark.parametrize(
    "value",
    [
        state("CANCELLED by 1001", exit_code=0, signal=15, node_list="n[1-2]", start="2024-01-01T00:00:00"),
        state("PENDING", "squeue", reason="Priority"),
        state("WEIRD_STATE", "squeue"),
        state("NODE_FAIL", exit_code=0, signal=9),
        state("OUT_OF_MEMORY", exit_code=0, signal=9, name="tao-x"),
    ],
    ids=["cancelled", "pending", "unknown", "node-fail", "oom"],
)
def test_state_payload_round_trip(value: JobState) -> None:
    payload = state_to_payload(value)
    assert json.loads(json.dumps(payload)) == payload
    assert state_from_payload("500", payload) == value


def test_observation_round_trip() -> None:
    for item in TRANSITIONS:
        assert Observation.from_dict(json.loads(json.dumps(item.to_dict()))) == item


# ---------------------------------------------------------------------- the compact event and its file

FAILED = JobEvent(
    EventStatus.TERMINAL, "500", JOB_ID, state("FAILED", exit_code=3, signal=0, node_list="n[1-2]"), TRANSITIONS
)
VANISHED = JobEvent(EventStatus.VANISHED, "500", JOB_ID, None, TRANSITIONS, "SLURM job 500 is unknown")
EVENT_FILE = f"{BASE}/jobs/{JOB_ID}/events/500-0123456789ab.json"


@pytest.mark.parametrize(
    ("event", "compact"),
    [
        pytest.param(
            FAILED,
            {"status": "terminal", "slurm_job_id": "500", "native": "FAILED", "ref": "500-0123456789ab.json"},
            id="terminal",
        ),
        pytest.param(
            VANISHED, {"status": "vanished", "slurm_job_id": "500", "ref": "500-0123456789ab.json"}, id="vanished"
        ),
    ],
)
def test_compact_event_round_trip_through_its_file(event: JobEvent, compact: dict[str, Any]) -> None:
    payload = event.compact("500-0123456789ab.json")

    assert payload == compact
    assert JobEvent.reference(json.loads(json.dumps(payload))) == "500-0123456789ab.json"
    assert JobEvent.from_file(json.dumps(event.to_dict()), payload, EVENT_FILE) == event


@pytest.mark.parametrize("event", [FAILED, VANISHED, TERMINAL], ids=["terminal", "vanished", "old-full-dict"])
def test_a_full_event_has_no_reference(event: JobEvent | dict[str, Any]) -> None:
    """A full event (an older provider's trigger, or a trigger whose write failed) is read as before."""
    payload = event.to_dict() if isinstance(event, JobEvent) else event
    assert JobEvent.reference(payload) is None
    assert JobEvent.from_dict(payload).to_dict() == payload


COMPACT = FAILED.compact("500-0123456789ab.json")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        pytest.param({**COMPACT, "ref": ""}, "refers to no file name", id="empty-ref"),
        pytest.param({**COMPACT, "ref": None}, "refers to no file name", id="no-ref"),
        pytest.param({**COMPACT, "ref": "../records/x.json"}, "refers to no file name", id="ref-with-a-dir"),
        pytest.param({**COMPACT, "ref": ".."}, "refers to no file name", id="ref-dot-dot"),
        pytest.param({**COMPACT, "status": "done"}, "unexpected trigger event", id="bad-status"),
        pytest.param({**COMPACT, "slurm_job_id": "5;x"}, "unexpected trigger event", id="bad-slurm-id"),
        pytest.param({"ref": "500-0123456789ab.json"}, "unexpected trigger event", id="ref-alone"),
    ],
)
def test_bad_compact_events_are_refused(value: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        JobEvent.reference(value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("{not json", "is not JSON", id="not-json"),
        pytest.param(json.dumps({"status": "terminal"}), "unexpected trigger event in", id="not-an-event"),
        pytest.param(
            json.dumps({**FAILED.to_dict(), "slurm_job_id": "501"}), "about job 501 .*names job 500", id="other-job"
        ),
        pytest.param(json.dumps(VANISHED.to_dict()), r"\(vanished\).*\(terminal\)", id="other-outcome"),
    ],
)
def test_an_event_file_that_does_not_match_its_compact_event_is_refused(text: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        JobEvent.from_file(text, COMPACT, EVENT_FILE)
