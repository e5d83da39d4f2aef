"""Job records: id minting, opening, transitions, redaction and JSON round trips."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from airflow_provider_tao_slurm.core import records
from airflow_provider_tao_slurm.core.records import JobRecord, Transition
from airflow_provider_tao_slurm.core.states import ErrClass, TaoState
from airflow_provider_tao_slurm.exceptions import RecordError, ValidationError

T0 = "2024-05-01T10:00:00+00:00"
T1 = "2024-05-01T10:01:00Z"
T2 = "2024-05-01T10:02:00.123456+00:00"
JOB_ID = "tao-demo.train-0123456789abcdef"
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
SHA = "a" * 64


def _open(**overrides: Any) -> JobRecord:
    kwargs: dict[str, Any] = {
        "job_id": JOB_ID,
        "cluster": "polaris",
        "image": "/lustre/images/tao-pyt.sqsh",
        "network_arch": "classification_pyt",
        "action": "train",
        "results_dir": f"/lustre/base/results/{JOB_ID}",
        "job_dir": f"/lustre/base/jobs/{JOB_ID}",
        "log_dir": "/lustre/base/logs",
        "job_name": JOB_ID,
        "now": T0,
    }
    kwargs.update(overrides)
    return records.open_record(**kwargs)


def _running() -> JobRecord:
    return records.mark(_open(), TaoState.RUNNING, now=T1, message="RUNNING", source="trigger", backend_ref="42")


# ------------------------------------------------------------------ mint_job_id

GOLDEN_ID = "tao-my_dag.train-5d9ea2199ed7a48b"


def test_mint_job_id_is_stable_across_versions() -> None:
    # Changing this breaks adoption of jobs submitted by an older provider version.
    assert records.mint_job_id("my_dag", "train", "manual__2024-05-01T00:00:00+00:00") == GOLDEN_ID


@pytest.mark.parametrize(
    ("dag_id", "task_id", "run_id"),
    [
        ("my_dag", "train", "manual__2024"),
        ("dag with spaces; rm -rf /", "grp.task$(touch x)", "r`id`"),
        ("ünïcødé-日本", "täsk", "run\nline"),
        ("d" * 500, "t" * 500, "r" * 500),
        ("---", "...", "-"),
        ("*?[", "'\"", "&&"),
    ],
    ids=["plain", "shell-metachars", "unicode-newline", "very-long", "only-punctuation", "globs-quotes"],
)
def test_mint_job_id_is_a_safe_slurm_job_name(dag_id: str, task_id: str, run_id: str) -> None:
    job_id = records.mint_job_id(dag_id, task_id, run_id)
    assert SAFE_NAME.match(job_id)
    assert len(job_id) <= 64
    assert job_id.startswith("tao-")
    assert records.check_job_id(job_id) == job_id
    assert records.mint_job_id(dag_id, task_id, run_id) == job_id


def test_mint_job_id_slug_is_readable() -> None:
    assert records.mint_job_id("nightly train", "tao/train", "r").startswith("tao-nightly-train.tao-train-")
    assert records.mint_job_id("---", "...", "r").startswith("tao-job-")


BASE = ("dag", "task", "run")


@pytest.mark.parametrize(
    ("other_args", "other_kwargs"),
    [
        (("dag2", "task", "run"), {}),
        (("dag", "task2", "run"), {}),
        (("dag", "task", "run2"), {}),
        (BASE, {"map_index": 0}),
        (BASE, {"try_number": 1}),
        (BASE, {"retry_of": records.mint_job_id(*BASE)}),
    ],
    ids=["dag", "task", "run", "map-index", "try-number", "retry-of"],
)
def test_mint_job_id_differs_for_different_inputs(other_args: tuple[str, ...], other_kwargs: dict[str, Any]) -> None:
    assert records.mint_job_id(*other_args, **other_kwargs) != records.mint_job_id(*BASE)


def test_mint_job_id_same_slug_different_inputs() -> None:
    first, second = records.mint_job_id("dag.x", "task", "r"), records.mint_job_id("dag", "x.task", "r")
    assert first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0]
    assert first != second


def test_mint_job_id_retry_chain_gives_a_new_id_each_time() -> None:
    first = records.mint_job_id(*BASE)
    second = records.mint_job_id(*BASE, retry_of=first)
    third = records.mint_job_id(*BASE, retry_of=second)
    assert len({first, second, third}) == 3
    assert records.mint_job_id(*BASE, retry_of=first) == second


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("", "t", "r"), {}),
        (("d", "", "r"), {}),
        (("d", "t", ""), {}),
        (("d", "t", "r"), {"retry_of": "not a job id"}),
        (("d", "t", "r"), {"retry_of": "-leading"}),
    ],
    ids=["empty-dag", "empty-task", "empty-run", "retry-of-spaces", "retry-of-leading-dash"],
)
def test_mint_job_id_rejects(args: tuple[str, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        records.mint_job_id(*args, **kwargs)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("123", True),
        ("123_4", True),
        ("123+0", True),
        ("123;cluster", False),
        ("", False),
        ("12 3", False),
        ("-1", False),
        ("1_", False),
        ("abc", False),
    ],
    ids=["plain", "array", "het", "cluster-suffix", "empty", "space", "negative", "dangling", "letters"],
)
def test_check_slurm_job_id(value: str, ok: bool) -> None:
    if ok:
        assert records.check_slurm_job_id(value) == value
    else:
        with pytest.raises(ValidationError):
            records.check_slurm_job_id(value)


# ------------------------------------------------------------------ open_record


def test_open_record_fields() -> None:
    record = _open(retry_of="tao-demo.train-fedcba9876543210", bundle_sha256=SHA, extra={"n": 1})
    assert record == JobRecord(
        job_id=JOB_ID,
        platform="slurm",
        cluster="polaris",
        backend_ref=None,
        job_name=JOB_ID,
        image="/lustre/images/tao-pyt.sqsh",
        network_arch="classification_pyt",
        action="train",
        results_dir=f"/lustre/base/results/{JOB_ID}",
        job_dir=f"/lustre/base/jobs/{JOB_ID}",
        log_dir="/lustre/base/logs",
        storage_tier="A",
        submitted_at=T0,
        transitions=[Transition(T0, TaoState.PENDING, "record opened; job not submitted yet", "submit")],
        terminal_state=None,
        err_class=None,
        retry_of="tao-demo.train-fedcba9876543210",
        exit_codes={},
        bundle_sha256=SHA,
        config_sha256=None,
        redacted=True,
        extra={"n": 1},
    )
    assert record.state is TaoState.PENDING


def test_open_record_redacts_secrets_in_every_field() -> None:
    record = _open(
        image="/lustre/images/hunter2-secret.sqsh",
        extra={"api_key": "abcd1234", "note": "uses hunter2-secret", "nested": [{"password": "pw12345"}]},
        secrets=("hunter2-secret",),
    )
    text = json.dumps(records.to_json(record))
    assert "hunter2-secret" not in text
    assert "abcd1234" not in text
    assert "pw12345" not in text
    assert record.image == "/lustre/images/${REDACTED}.sqsh"
    assert record.extra == {
        "api_key": "${REDACTED}",
        "note": "uses ${REDACTED}",
        "nested": [{"password": "${REDACTED}"}],
    }


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"job_id": "bad id"}, ValidationError),
        ({"job_name": "$(touch x)"}, ValidationError),
        ({"retry_of": "bad id"}, ValidationError),
        ({"retry_of": JOB_ID}, RecordError),
        ({"cluster": ""}, RecordError),
        ({"image": ""}, RecordError),
        ({"results_dir": "relative/results"}, RecordError),
        ({"job_dir": ""}, RecordError),
        ({"log_dir": "-rf"}, RecordError),
        ({"now": "2024-05-01T10:00:00"}, RecordError),
        ({"now": "2024-05-01T12:00:00+02:00"}, RecordError),
        ({"now": "yesterday"}, RecordError),
        ({"bundle_sha256": "ABC"}, RecordError),
        ({"config_sha256": "A" * 64}, RecordError),
    ],
    ids=[
        "job-id",
        "job-name",
        "retry-of-format",
        "retry-of-self",
        "cluster",
        "image",
        "results-dir",
        "job-dir",
        "log-dir",
        "naive-time",
        "non-utc-time",
        "not-a-time",
        "bundle-sha",
        "config-sha-uppercase",
    ],
)
def test_open_record_rejects(overrides: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        _open(**overrides)


# ------------------------------------------------------------------ mark

# (state, kwargs) steps -> expected (state, source) rows, terminal state, err_class, backend_ref
MarkStep = tuple[TaoState | str, dict[str, Any]]
REF = {"backend_ref": "42"}

TRANSITION_CASES: list[tuple[str, list[MarkStep], list[TaoState], TaoState | None, ErrClass | None]] = [
    ("submitted", [("PENDING", {"message": "submitted", **REF})], ["PENDING", "PENDING"], None, None),
    (
        "normal-run",
        [("RUNNING", REF), ("COMPLETE", {"message": "done"})],
        ["PENDING", "RUNNING", "COMPLETE"],
        TaoState.COMPLETE,
        None,
    ),
    ("sacct-only-short-job", [("COMPLETE", REF)], ["PENDING", "COMPLETE"], TaoState.COMPLETE, None),
    (
        "requeue",
        [("RUNNING", REF), ("PENDING", {"message": "requeued"}), ("RUNNING", {"message": "rerun"})],
        ["PENDING", "RUNNING", "PENDING", "RUNNING"],
        None,
        None,
    ),
    (
        "unknown-then-back",
        [("RUNNING", REF), ("UNKNOWN", {"message": "not found"}), ("RUNNING", {})],
        ["PENDING", "RUNNING", "UNKNOWN", "RUNNING"],
        None,
        None,
    ),
    (
        "infra-error",
        [("RUNNING", REF), ("ERROR", {"message": "NODE_FAIL", "err_class": "ERR_INFRA"})],
        ["PENDING", "RUNNING", "ERROR"],
        TaoState.ERROR,
        ErrClass.ERR_INFRA,
    ),
    (
        "refused-before-submit",
        [("ERROR", {"message": "sbatch refused", "err_class": ErrClass.ERR_PROGRAM})],
        ["PENDING", "ERROR"],
        TaoState.ERROR,
        ErrClass.ERR_PROGRAM,
    ),
    (
        "user-kill-before-submit",
        [("CANCELED", {"message": "killed"})],
        ["PENDING", "CANCELED"],
        TaoState.CANCELED,
        None,
    ),
    (
        "repeats-collapse",
        [("RUNNING", REF), ("RUNNING", {}), ("RUNNING", {"source": "sensor"}), ("RUNNING", REF)],
        ["PENDING", "RUNNING"],
        None,
        None,
    ),
    (
        "terminal-repeat-is-idempotent",
        [("RUNNING", REF), ("CANCELED", {"message": "x"}), ("CANCELED", {"message": "x"})],
        ["PENDING", "RUNNING", "CANCELED"],
        TaoState.CANCELED,
        None,
    ),
]


def _apply(record: JobRecord, steps: list[MarkStep]) -> JobRecord:
    for index, (state, extra) in enumerate(steps):
        kwargs: dict[str, Any] = {
            "now": f"2024-05-01T10:{index + 1:02d}:00Z",
            "message": str(state),
            "source": "trigger",
            **extra,
        }
        record = records.mark(record, state, **kwargs)
    return record


@pytest.mark.parametrize(
    ("steps", "states", "terminal", "err_class"),
    [case[1:] for case in TRANSITION_CASES],
    ids=[case[0] for case in TRANSITION_CASES],
)
def test_mark_transitions(
    steps: list[MarkStep], states: list[str], terminal: TaoState | None, err_class: ErrClass | None
) -> None:
    record = _apply(_open(), steps)
    assert [row.state for row in record.transitions] == states
    assert all(isinstance(row.state, TaoState) for row in record.transitions)
    assert record.terminal_state == terminal
    assert record.err_class == err_class
    assert record.state == states[-1]


REJECTED_CASES: list[tuple[str, list[MarkStep], MarkStep]] = [
    ("after-complete", [("RUNNING", REF), ("COMPLETE", {})], ("RUNNING", {})),
    ("complete-then-error", [("COMPLETE", REF)], ("ERROR", {})),
    ("error-then-pending", [("ERROR", {})], ("PENDING", {})),
    ("canceled-new-message", [("CANCELED", {"message": "a"})], ("CANCELED", {"message": "b"})),
    (
        "terminal-repeat-changing-exit-codes",
        [("CANCELED", {"message": "a"})],
        ("CANCELED", {"message": "a", "exit_codes": {"slurm": "0:15"}}),
    ),
    ("running-without-ref", [], ("RUNNING", {})),
    ("complete-without-ref", [], ("COMPLETE", {})),
    ("second-backend-ref", [("RUNNING", REF)], ("RUNNING", {"backend_ref": "43", "message": "other"})),
    ("err-class-without-error", [], ("CANCELED", {"err_class": "ERR_INFRA"})),
    ("unknown-state", [], ("FAILED", {})),
    ("unknown-err-class", [], ("ERROR", {"err_class": "ERR_OTHER"})),
    ("empty-message", [], ("PENDING", {"message": ""})),
    ("empty-source", [], ("PENDING", {"source": ""})),
    ("naive-time", [], ("PENDING", {"now": "2024-05-01T10:00:00"})),
    ("time-on-repeat-still-checked", [("PENDING", {"message": "m"})], ("PENDING", {"message": "m", "now": "x"})),
]


@pytest.mark.parametrize(
    ("steps", "bad"), [case[1:] for case in REJECTED_CASES], ids=[case[0] for case in REJECTED_CASES]
)
def test_mark_rejects(steps: list[MarkStep], bad: MarkStep) -> None:
    record = _apply(_open(), steps)
    before = records.to_json(record)
    with pytest.raises(RecordError):
        _apply(record, [bad])
    assert records.to_json(record) == before


@pytest.mark.parametrize("backend_ref", ["12;cluster", "abc", ""], ids=["cluster-suffix", "letters", "empty"])
def test_mark_rejects_bad_backend_ref(backend_ref: str) -> None:
    with pytest.raises(ValidationError):
        records.mark(_open(), "RUNNING", now=T1, message="m", source="s", backend_ref=backend_ref)


def test_mark_does_not_change_its_input() -> None:
    record = _open()
    before = records.to_json(record)
    marked = records.mark(record, "RUNNING", now=T1, message="go", source="trigger", backend_ref="7")
    assert records.to_json(record) == before
    assert record.backend_ref is None
    assert marked.backend_ref == "7"
    assert len(marked.transitions) == 2


def test_mark_merges_exit_codes_and_keeps_timestamps() -> None:
    record = _running()
    record = records.mark(record, "RUNNING", now=T2, message="step 2", source="trigger", exit_codes={"a": 1})
    record = records.mark(
        record,
        "ERROR",
        now=T2,
        message="FAILED 3:0",
        source="sacct",
        exit_codes={"slurm": "3:0"},
        err_class="ERR_PROGRAM",
    )
    assert record.exit_codes == {"a": 1, "slurm": "3:0"}
    assert [row.ts for row in record.transitions] == [T0, T1, T2, T2]
    assert [row.source for row in record.transitions] == ["submit", "trigger", "trigger", "sacct"]


def test_mark_redacts_messages_and_dedupes_on_the_redacted_text() -> None:
    record = _running()
    first = records.mark(
        record,
        "RUNNING",
        now=T2,
        message="env HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789 and s3cret-value",
        source="trigger",
        secrets=["s3cret-value"],
    )
    assert first.transitions[-1].message == "env HF_TOKEN=${REDACTED} and ${REDACTED}"
    again = records.mark(
        first,
        "RUNNING",
        now=T2,
        message="env HF_TOKEN=other and s3cret-value",
        source="sensor",
        secrets=["s3cret-value"],
    )
    assert again == first


def test_transition_table_is_data() -> None:
    assert set(records.TRANSITIONS) == set(TaoState)
    terminal = {state for state, successors in records.TRANSITIONS.items() if not successors}
    assert terminal == {state for state in TaoState if state.is_terminal}
    assert records.TRANSITIONS[TaoState.PENDING] >= {TaoState.COMPLETE, TaoState.RUNNING}
    assert TaoState.PENDING in records.TRANSITIONS[TaoState.RUNNING]


# ------------------------------------------------------------------ JSON

GOLDEN_JSON = """{
  "action": "train",
  "backend_ref": "42",
  "bundle_sha256": null,
  "cluster": "polaris",
  "config_sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "err_class": "ERR_INFRA",
  "exit_codes": {
    "slurm": "0:0"
  },
  "extra": {
    "note": "über"
  },
  "image": "/lustre/images/tao-pyt.sqsh",
  "job_dir": "/lustre/base/jobs/tao-demo.train-0123456789abcdef",
  "job_id": "tao-demo.train-0123456789abcdef",
  "job_name": "tao-demo.train-0123456789abcdef",
  "log_dir": "/lustre/base/logs",
  "network_arch": "classification_pyt",
  "platform": "slurm",
  "redacted": true,
  "results_dir": "/lustre/base/results/tao-demo.train-0123456789abcdef",
  "retry_of": null,
  "storage_tier": "A",
  "submitted_at": "2024-05-01T10:00:00+00:00",
  "terminal_state": "ERROR",
  "transitions": [
    {
      "message": "record opened; job not submitted yet",
      "source": "submit",
      "state": "PENDING",
      "ts": "2024-05-01T10:00:00+00:00"
    },
    {
      "message": "RUNNING",
      "source": "trigger",
      "state": "RUNNING",
      "ts": "2024-05-01T10:01:00Z"
    },
    {
      "message": "NODE_FAIL 0:0",
      "source": "sacct",
      "state": "ERROR",
      "ts": "2024-05-01T10:02:00.123456+00:00"
    }
  ]
}
"""


def _failed() -> JobRecord:
    record = replace(_running(), config_sha256=SHA, extra={"note": "über"})
    return records.mark(
        record,
        "ERROR",
        now=T2,
        message="NODE_FAIL 0:0",
        source="sacct",
        err_class=ErrClass.ERR_INFRA,
        exit_codes={"slurm": "0:0"},
    )


def test_to_json_golden() -> None:
    assert records.to_json(_failed()) == GOLDEN_JSON


@pytest.mark.parametrize("factory", [_open, _running, _failed], ids=["opened", "running", "failed"])
def test_json_round_trip(factory: Any) -> None:
    record = factory()
    parsed = records.from_json(records.to_json(record))
    assert parsed == record
    assert all(isinstance(row.state, TaoState) for row in parsed.transitions)
    assert records.to_json(parsed) == records.to_json(record)


def test_to_json_redacts_every_write() -> None:
    record = replace(_running(), extra={"password": "pw-12345", "cmd": "x --api-key=abcdefgh", "raw": "tok-987654"})
    text = records.to_json(record, secrets=["tok-987654"])
    assert "pw-12345" not in text
    assert "abcdefgh" not in text
    assert "tok-987654" not in text
    assert json.loads(text)["extra"] == {
        "password": "${REDACTED}",
        "cmd": "x --api-key=${REDACTED}",
        "raw": "${REDACTED}",
    }


def test_to_json_rejects_unserialisable_values() -> None:
    with pytest.raises(RecordError, match="JSON"):
        records.to_json(replace(_open(), extra={"obj": object()}))


def _broken(change: Any) -> str:
    data = json.loads(records.to_json(_failed()))
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        _broken(lambda d: d.pop("results_dir")),
        _broken(lambda d: d.update(surprise=1)),
        _broken(lambda d: d.update(redacted=False)),
        _broken(lambda d: d.update(transitions=[])),
        _broken(lambda d: d["transitions"][0].update(state="FAILED")),
        _broken(lambda d: d["transitions"][0].pop("source")),
        _broken(lambda d: d["transitions"][0].update(ts="noon")),
        _broken(lambda d: d.update(terminal_state=None)),
        _broken(lambda d: d.update(terminal_state="COMPLETE")),
        _broken(lambda d: d.update(err_class="ERR_OTHER")),
        _broken(lambda d: d.update(job_id=None)),
        _broken(lambda d: d.update(backend_ref=42)),
        _broken(lambda d: d.update(extra=[])),
    ],
    ids=[
        "empty",
        "truncated",
        "not-object",
        "missing-field",
        "unknown-field",
        "not-redacted",
        "no-transitions",
        "bad-state",
        "transition-missing-field",
        "bad-ts",
        "terminal-missing",
        "terminal-mismatch",
        "bad-err-class",
        "null-job-id",
        "int-backend-ref",
        "extra-not-object",
    ],
)
def test_from_json_rejects(text: str) -> None:
    with pytest.raises(RecordError):
        records.from_json(text)
