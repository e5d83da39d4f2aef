"""Tables for the SLURM state vocabulary and the squeue/sacct/sbatch parsers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_provider_tao_slurm.core.states import (
    NATIVE_TO_TAO,
    ErrClass,
    JobState,
    Source,
    TaoState,
    merge_states,
    normalize_state,
    parse_jobs_by_name,
    parse_sacct,
    parse_sbatch_reply,
    parse_squeue,
    pending_hint,
    state_from_end_evidence,
    state_from_native,
)
from airflow_provider_tao_slurm.exceptions import JobLookupError, RemoteCommandError

P, R, C, E, X, U = (
    TaoState.PENDING,
    TaoState.RUNNING,
    TaoState.COMPLETE,
    TaoState.ERROR,
    TaoState.CANCELED,
    TaoState.UNKNOWN,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("COMPLETED", "COMPLETED", id="plain"),
        pytest.param("  COMPLETED ", "COMPLETED", id="padded"),
        pytest.param("                     COMPLETED ", "COMPLETED", id="state-width-30"),
        pytest.param("CANCELLED by 1001", "CANCELLED", id="cancelled-by-uid"),
        pytest.param("CANCELLED by 0", "CANCELLED", id="cancelled-by-root"),
        pytest.param("CANCELLED+", "CANCELLED", id="truncated-plus"),
        pytest.param("   CANCELLED+ ", "CANCELLED", id="padded-truncated-plus"),
        pytest.param("OUT_OF_MEMORY", "OUT_OF_MEMORY", id="underscores"),
        pytest.param("OUT_OF_ME+", "OUT_OF_ME", id="narrow-column-cut"),
        pytest.param("RUNNING\n", "RUNNING", id="newline"),
        pytest.param("\tPENDING\t", "PENDING", id="tabs"),
        pytest.param("NODE_FAIL", "NODE_FAIL", id="node-fail"),
        pytest.param("", "", id="empty"),
        pytest.param("   ", "", id="blank"),
        pytest.param("+", "", id="lone-plus"),
    ],
)
def test_normalize_state(raw: str, expected: str) -> None:
    assert normalize_state(raw) == expected


NATIVE_TABLE = [
    # native, TAO state, terminal, preset err_class
    ("PENDING", P, False, None),
    ("CONFIGURING", P, False, None),
    ("REQUEUED", P, False, None),
    ("REQUEUE_FED", P, False, None),
    ("EXPEDITING", P, False, None),
    ("REQUEUE_HOLD", P, False, None),
    ("RESV_DEL_HOLD", P, False, None),
    ("RUNNING", R, False, None),
    ("COMPLETING", R, False, None),
    ("SUSPENDED", R, False, None),
    ("STOPPED", R, False, None),
    ("RESIZING", R, False, None),
    ("SIGNALING", R, False, None),
    ("STAGE_OUT", R, False, None),
    ("COMPLETED", C, True, None),
    ("FAILED", E, True, None),
    ("TIMEOUT", E, True, None),
    ("OUT_OF_MEMORY", E, True, None),
    ("DEADLINE", E, True, None),
    ("SPECIAL_EXIT", E, True, None),
    ("NODE_FAIL", E, True, ErrClass.ERR_INFRA),
    ("BOOT_FAIL", E, True, ErrClass.ERR_INFRA),
    ("CANCELLED", X, True, None),
    ("PREEMPTED", X, True, None),
    ("REVOKED", X, True, None),
]


@pytest.mark.parametrize(
    ("raw", "reason", "start", "kept"),
    [
        ("FAILED", "JobHeldUser", "2026-12-06T10:49:43", None),  # accounting's memory of the submission hold
        ("COMPLETED", "JobHeldUser", "2026-12-06T10:49:43", None),
        ("CANCELLED by 0", "JobHeldUser", "Unknown", "JobHeldUser"),  # cancelled while held: it never ran
        ("PENDING", "JobHeldUser", "2026-12-06T10:49:43", "JobHeldUser"),  # held again after a run
        ("NODE_FAIL", "PartitionDown", "2026-12-06T10:49:43", "PartitionDown"),  # only the hold is dropped
    ],
)
def test_the_submission_holds_reason_is_dropped_from_a_job_that_started_and_ended(
    raw: str, reason: str, start: str, kept: str | None
) -> None:
    state = state_from_native("7", raw, source="sacct", reason=reason, start=start)

    assert state.reason == kept
    assert ("reason:" in state.message) is (kept is not None)


def test_native_table_covers_every_slurm_state_and_nothing_else() -> None:
    assert set(NATIVE_TO_TAO) == {row[0] for row in NATIVE_TABLE}


@pytest.mark.parametrize(("native", "tao", "terminal", "err_class"), NATIVE_TABLE, ids=[row[0] for row in NATIVE_TABLE])
@pytest.mark.parametrize("source", ["squeue", "sacct"])
def test_every_native_state(
    native: str, tao: TaoState, terminal: bool, err_class: ErrClass | None, source: Source
) -> None:
    state = state_from_native("42", native, source=source)
    assert (state.native, state.tao_state, state.is_terminal, state.err_class) == (native, tao, terminal, err_class)
    assert state.message.startswith(native)
    assert NATIVE_TO_TAO[native] is tao


@pytest.mark.parametrize(
    ("native", "words"),
    [
        pytest.param("SUSPENDED", "suspended", id="suspended-sub-state"),
        pytest.param("STOPPED", "SIGSTOP", id="stopped-sub-state"),
        pytest.param("REQUEUE_HOLD", "scontrol release", id="requeue-hold-surfaced"),
        pytest.param("RESV_DEL_HOLD", "scontrol release", id="resv-del-hold-surfaced"),
        pytest.param("REQUEUED", "same job id", id="requeued"),
        pytest.param("PREEMPTED", "not requeued", id="preempted"),
    ],
)
def test_sub_states_are_explained_in_the_message(native: str, words: str) -> None:
    assert words in state_from_native("7", native, source="squeue").message


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("WEIRD_NEW_STATE", id="future-state"),
        pytest.param("cancelled", id="lower-case"),
        pytest.param("OUT_OF_ME+", id="truncated-beyond-recognition"),
        pytest.param("", id="empty"),
        pytest.param("UNKNOWN", id="literal-unknown"),
    ],
)
def test_unrecognised_state_is_unknown_never_success_or_pending(raw: str) -> None:
    state = state_from_native("9", raw, source="sacct")
    assert state.tao_state is U
    assert not state.is_terminal
    assert state.raw_state == raw
    assert "unrecognised SLURM state" in state.message
    assert (raw or "(empty state)") in state.message


@pytest.mark.parametrize(
    ("tao", "terminal"),
    [(P, False), (R, False), (C, True), (E, True), (X, True), (U, False)],
    ids=lambda v: str(v),
)
def test_tao_state_is_terminal(tao: TaoState, terminal: bool) -> None:
    assert tao.is_terminal is terminal


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"reason": "None"}, {"reason": None}, id="reason-None"),
        pytest.param({"reason": "(null)"}, {"reason": None}, id="reason-null"),
        pytest.param({"reason": " Priority "}, {"reason": "Priority"}, id="reason-kept"),
        pytest.param({"start": "Unknown", "end": "None"}, {"start": None, "end": None}, id="times-unknown"),
        pytest.param({"start": "N/A", "end": ""}, {"start": None, "end": None}, id="times-na"),
        pytest.param({"start": "2024-05-01T10:00:00"}, {"start": "2024-05-01T10:00:00"}, id="start-kept"),
        pytest.param({"node_list": "None assigned"}, {"node_list": "None assigned"}, id="node-text-kept"),
        pytest.param({"node_list": "(null)"}, {"node_list": None}, id="node-null"),
        pytest.param({"node_list": "n[1-2]"}, {"node_list": "n[1-2]"}, id="node-range"),
        pytest.param({"name": ""}, {"name": None}, id="empty-name"),
        pytest.param({"exit_code": 3, "signal": 0}, {"exit_code": 3, "signal": 0}, id="exit-kept"),
    ],
)
def test_state_from_native_cleans_fields(fields: dict[str, object], expected: dict[str, object]) -> None:
    state = state_from_native("5", "RUNNING", source="squeue", **fields)  # type: ignore[arg-type]
    assert {key: getattr(state, key) for key in expected} == expected


def test_message_keeps_annotation_and_reason() -> None:
    state = state_from_native("5", "CANCELLED by 1001", source="sacct", reason="None")
    assert state.message == "CANCELLED by 1001"
    pending = state_from_native("6", "PENDING", source="squeue", reason="QOSGrpMemLimit")
    assert pending.message == "PENDING (reason: QOSGrpMemLimit)"


SQUEUE_TEXT = (
    "101|tao_train_a|RUNNING|None|n1|2024-05-01T10:00:00|2024-05-01T14:00:00\n"
    "\n"
    "102|tao_train_b|PENDING|Priority||N/A|N/A\n"
    "103|tao_train_c|PENDING|BeginTime||2024-05-01T10:02:00|2024-05-01T14:02:00\n"
    "104|tao_train_d|COMPLETING|None|n2|2024-05-01T09:00:00|2024-05-01T10:01:00\n"
    "105|tao_train_e|SUSPENDED|None|n1|2024-05-01T09:00:00|Unknown\n"
    "106|tao_train_f|REQUEUE_HOLD|JobHeldUser||N/A|N/A\n"
    "107_3|array_job|RUNNING|None|n2|2024-05-01T09:00:00|2024-05-01T13:00:00\n"
    "108+0|het_job|RUNNING|None|n[1-2]|2024-05-01T09:00:00|2024-05-01T13:00:00\n"
    "109|odd|name|RUNNING|None|n1|2024-05-01T09:00:00|2024-05-01T13:00:00\n"
    "110|tao_train_g|  RUNNING  | None |n1 |2024-05-01T09:00:00|2024-05-01T13:00:00\n"
    "111|tao_train_h|NEW_STATE|None|n1|N/A|N/A\n"
)


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        pytest.param(
            "101",
            {
                "tao_state": R,
                "node_list": "n1",
                "reason": None,
                "name": "tao_train_a",
                "start": "2024-05-01T10:00:00",
                "end": "2024-05-01T14:00:00",
            },
            id="running",
        ),
        pytest.param(
            "102", {"tao_state": P, "node_list": None, "reason": "Priority", "start": None}, id="pending-no-nodes"
        ),
        pytest.param(
            "103", {"tao_state": P, "reason": "BeginTime", "start": "2024-05-01T10:02:00"}, id="requeued-waiting"
        ),
        pytest.param("104", {"tao_state": R, "native": "COMPLETING"}, id="completing"),
        pytest.param("105", {"tao_state": R, "native": "SUSPENDED", "end": None}, id="suspended"),
        pytest.param("106", {"tao_state": P, "native": "REQUEUE_HOLD", "reason": "JobHeldUser"}, id="held"),
        pytest.param("107_3", {"tao_state": R, "name": "array_job"}, id="array-task-id-kept"),
        pytest.param("108+0", {"tao_state": R, "node_list": "n[1-2]"}, id="het-id-kept"),
        pytest.param("109", {"tao_state": R, "name": "odd|name", "node_list": "n1"}, id="pipe-in-name"),
        pytest.param("110", {"tao_state": R, "reason": None, "node_list": "n1"}, id="padded-fields"),
        pytest.param("111", {"tao_state": U, "raw_state": "NEW_STATE"}, id="unknown-kept"),
    ],
)
def test_parse_squeue(job_id: str, expected: dict[str, object]) -> None:
    states = parse_squeue(SQUEUE_TEXT)
    state = states[job_id]
    assert {key: getattr(state, key) for key in expected} == expected
    assert (state.job_id, state.source, state.exit_code, state.signal) == (job_id, "squeue", None, None)


def test_parse_squeue_reuses_the_state_of_a_line_printed_again() -> None:
    first = parse_squeue("7|tao-a|PENDING|JobHeldUser||N/A|N/A\n8|tao-b|RUNNING|None|n1|2026-12-04T05:00:00|N/A")
    again = parse_squeue("8|tao-b|RUNNING|None|n1|2026-12-04T05:00:00|N/A\n7|tao-a|PENDING|Priority||N/A|N/A")

    assert again["8"] is first["8"]
    assert again["7"] is not first["7"]
    assert (again["7"].reason, first["7"].reason) == ("Priority", "JobHeldUser")


def test_parse_squeue_returns_every_job_once() -> None:
    assert list(parse_squeue(SQUEUE_TEXT)) == [
        "101",
        "102",
        "103",
        "104",
        "105",
        "106",
        "107_3",
        "108+0",
        "109",
        "110",
        "111",
    ]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("\n\n  \n", id="blank-lines"),
        pytest.param("welcome to the cluster\n", id="shell-noise"),
        pytest.param("JOBID|NAME|STATE|REASON|NODELIST|START|END\n", id="header-row"),
        pytest.param("101.0|step|RUNNING|None|n1|N/A|N/A\n", id="step-row"),
    ],
)
def test_parse_squeue_ignores_non_job_lines(text: str) -> None:
    assert parse_squeue(text) == {}


SACCT_TEXT = (
    "201|tao_ok|COMPLETED|0:0|None|n1|2024-05-01T10:00:00|2024-05-01T10:05:00\n"
    "201.batch|batch|COMPLETED|0:0|None|n1|2024-05-01T10:00:00|2024-05-01T10:05:00\n"
    "201.extern|extern|COMPLETED|0:0|None|n1|2024-05-01T10:00:00|2024-05-01T10:05:00\n"
    "202|tao_exit3|FAILED|3:0|NonZeroExitCode|n2|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
    "202.0|python|FAILED|3:0|None|n2|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
    "203|tao_slow|TIMEOUT|0:15|TimeLimit|n1|2024-05-01T10:00:00|2024-05-01T10:01:24\n"
    "204|tao_killed|CANCELLED by 1001|0:0|None|n1|2024-05-01T10:00:00|2024-05-01T10:00:30\n"
    "205|tao_cut|CANCELLED+|0:15|None|n1|2024-05-01T10:00:00|2024-05-01T10:00:30\n"
    "206|tao_padded|                     COMPLETED |0:0|None|n1|2024-05-01T10:00:00|2024-05-01T10:00:09\n"
    "207|tao_nf|NODE_FAIL|0:0|NodeDown|n2|2024-05-01T10:00:00|2024-05-01T10:03:00\n"
    "208|allocation|PENDING|0:0|None||Unknown|Unknown\n"
    "209|tao_requeued|REQUEUED|0:0|None|n1|2024-05-01T09:00:00|2024-05-01T09:10:00\n"
    "209|tao_requeued|COMPLETED|0:0|None|n2|2024-05-01T09:12:03|2024-05-01T09:30:00\n"
    "210|tao_oom|OUT_OF_MEMORY|0:125|OutOfMemory|n1|2024-05-01T10:00:00|2024-05-01T10:02:00\n"
    "211|tao_live|RUNNING|0:0|None|n1|2024-05-01T10:00:00|Unknown\n"
    "212_4|tao_array|FAILED|1:0|NonZeroExitCode|n1|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
    "213+1|tao_het|COMPLETED|0:0|None|n2|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
    "214|tao_sig|FAILED|0:9|None|n1|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
    "215|tao_no_exit|FAILED||None|n1|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
    "216|tao_pending|PENDING|0:0|Priority||Unknown|Unknown\n"
    "217|tao_held|FAILED|3:0|JobHeldUser|n1|2026-12-06T10:49:43|2026-12-06T10:50:13\n"
)


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        pytest.param(
            "201", {"tao_state": C, "exit_code": 0, "signal": 0, "end": "2024-05-01T10:05:00"}, id="completed"
        ),
        pytest.param(
            "202",
            {"tao_state": E, "exit_code": 3, "signal": 0, "reason": "NonZeroExitCode", "node_list": "n2"},
            id="failed-exit-3",
        ),
        pytest.param("203", {"tao_state": E, "native": "TIMEOUT", "exit_code": 0, "signal": 15}, id="timeout-sigterm"),
        pytest.param(
            "204",
            {"tao_state": X, "native": "CANCELLED", "raw_state": "CANCELLED by 1001", "message": "CANCELLED by 1001"},
            id="cancelled-by-uid",
        ),
        pytest.param("205", {"tao_state": X, "native": "CANCELLED", "signal": 15}, id="cancelled-plus"),
        pytest.param("206", {"tao_state": C, "native": "COMPLETED"}, id="state-width-30-padding"),
        pytest.param(
            "207", {"tao_state": E, "err_class": ErrClass.ERR_INFRA, "reason": "NodeDown"}, id="node-fail-infra"
        ),
        pytest.param("208", {"tao_state": P, "placeholder": True, "name": None, "start": None}, id="placeholder-row"),
        pytest.param(
            "209", {"tao_state": C, "node_list": "n2", "start": "2024-05-01T09:12:03"}, id="duplicates-last-row-wins"
        ),
        pytest.param("210", {"tao_state": E, "native": "OUT_OF_MEMORY", "signal": 125}, id="oom"),
        pytest.param("211", {"tao_state": R, "end": None, "placeholder": False}, id="running"),
        pytest.param("212_4", {"tao_state": E, "exit_code": 1}, id="array-id-kept"),
        pytest.param("213+1", {"tao_state": C}, id="het-id-kept"),
        pytest.param("214", {"tao_state": E, "exit_code": 0, "signal": 9}, id="killed-by-signal"),
        pytest.param("215", {"tao_state": E, "exit_code": None, "signal": None}, id="blank-exit-code"),
        pytest.param(
            "216", {"tao_state": P, "placeholder": False, "name": "tao_pending"}, id="real-pending-not-placeholder"
        ),
        pytest.param(
            "217",
            {"tao_state": E, "reason": None, "message": "FAILED"},
            id="submission-hold-reason-dropped-once-it-ran",
        ),
    ],
)
def test_parse_sacct(job_id: str, expected: dict[str, object]) -> None:
    state = parse_sacct(SACCT_TEXT)[job_id]
    assert {key: getattr(state, key) for key in expected} == expected
    assert (state.job_id, state.source) == (job_id, "sacct")


def test_parse_sacct_drops_step_rows() -> None:
    assert list(parse_sacct(SACCT_TEXT)) == [
        "201",
        "202",
        "203",
        "204",
        "205",
        "206",
        "207",
        "208",
        "209",
        "210",
        "211",
        "212_4",
        "213+1",
        "214",
        "215",
        "216",
        "217",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "7|n|REQUEUED|0:0|None|n1|a|b\n7|n|PENDING|0:0|BeginTime||Unknown|Unknown\n",
            ("PENDING", "BeginTime"),
            id="requeue-then-pending",
        ),
        pytest.param(
            "7|n|PENDING|0:0|None||Unknown|Unknown\n7|n|REQUEUED|0:0|None|n1|a|b\n",
            ("REQUEUED", None),
            id="order-decides-not-severity",
        ),
        pytest.param(
            "7|n|PREEMPTED|0:15|None|n1|a|b\n7|n|RUNNING|0:0|None|n2|c|Unknown\n",
            ("RUNNING", None),
            id="preempted-then-rerun",
        ),
    ],
)
def test_parse_sacct_duplicates_last_row_wins(text: str, expected: tuple[str, str | None]) -> None:
    state = parse_sacct(text)["7"]
    assert (state.native, state.reason) == expected


def _sq(job_id: str, native: str, start: str | None = None) -> JobState:
    return state_from_native(job_id, native, source="squeue", start=start)


def _sa(job_id: str, native: str, name: str = "job", exit_code: int = 0, start: str | None = None) -> JobState:
    return state_from_native(job_id, native, source="sacct", name=name, exit_code=exit_code, signal=0, start=start)


@pytest.mark.parametrize(
    ("squeue", "sacct", "expected"),
    [
        pytest.param([_sq("1", "RUNNING")], [], {"1": ("squeue", "RUNNING")}, id="squeue-only"),
        pytest.param([], [_sa("1", "COMPLETED")], {"1": ("sacct", "COMPLETED")}, id="sacct-fills-gone-job"),
        pytest.param(
            [_sq("1", "RUNNING")],
            [_sa("1", "PENDING", name="allocation")],
            {"1": ("squeue", "RUNNING")},
            id="placeholder-loses-to-squeue",
        ),
        pytest.param(
            [], [_sa("1", "PENDING", name="allocation")], {"1": ("sacct", "PENDING")}, id="placeholder-alone-is-pending"
        ),
        pytest.param([_sq("1", "RUNNING")], [_sa("1", "PENDING")], {"1": ("squeue", "RUNNING")}, id="sacct-lags"),
        pytest.param(
            [_sq("1", "PENDING")],
            [_sa("1", "PREEMPTED")],
            {"1": ("squeue", "PENDING")},
            id="requeued-after-preemption-stays-pending",
        ),
        pytest.param([_sq("1", "PENDING")], [_sa("1", "REQUEUED")], {"1": ("squeue", "PENDING")}, id="requeued"),
        pytest.param(
            [_sq("1", "COMPLETING")],
            [_sa("1", "FAILED", exit_code=2)],
            {"1": ("squeue", "COMPLETING")},
            id="completing-still-live",
        ),
        pytest.param(
            [_sq("1", "FAILED")],
            [_sa("1", "FAILED", exit_code=2)],
            {"1": ("sacct", "FAILED")},
            id="both-terminal-sacct-has-exit-code",
        ),
        pytest.param(
            [_sq("1", "COMPLETED")],
            [_sa("1", "RUNNING")],
            {"1": ("squeue", "COMPLETED")},
            id="squeue-terminal-sacct-lags",
        ),
        pytest.param(
            [_sq("1", "RUNNING"), _sq("2", "PENDING")],
            [_sa("2", "PENDING"), _sa("3", "TIMEOUT"), _sa("4", "CANCELLED by 1001")],
            {
                "1": ("squeue", "RUNNING"),
                "2": ("squeue", "PENDING"),
                "3": ("sacct", "TIMEOUT"),
                "4": ("sacct", "CANCELLED"),
            },
            id="many-jobs",
        ),
        pytest.param(
            [_sq("1", "COMPLETED", start="2026-12-06T04:13:16")],
            [_sa("1", "FAILED", exit_code=143, start="2026-12-06T04:13:07")],
            {"1": ("squeue", "COMPLETED")},
            id="requeued-rerun-ended-accounting-still-shows-the-first-run",
        ),
        pytest.param(
            [_sq("1", "COMPLETED", start="2026-12-06T04:13:16")],
            [_sa("1", "COMPLETED", start="2026-12-06T04:13:16")],
            {"1": ("sacct", "COMPLETED")},
            id="requeued-rerun-ended-accounting-caught-up",
        ),
        pytest.param(
            [_sq("1", "CANCELLED")],
            [_sa("1", "CANCELLED by 1001")],
            {"1": ("sacct", "CANCELLED")},
            id="cancelled-before-it-started-no-start-times",
        ),
        pytest.param(  # squeue -t all within MinJobAge and sacct's full row, as printed: equal starts, one run
            list(parse_squeue("1|tao-x|COMPLETED|None|n1|2026-12-06T04:13:16|2026-12-06T04:20:02").values()),
            list(parse_sacct("1|tao-x|COMPLETED|0:0|None|n1|2026-12-06T04:13:16|2026-12-06T04:20:02").values()),
            {"1": ("sacct", "COMPLETED")},
            id="same-run-ended-as-printed-sacct-has-the-exit-code",
        ),
        pytest.param([], [], {}, id="nothing-known"),
    ],
)
def test_merge_states(squeue: list[JobState], sacct: list[JobState], expected: dict[str, tuple[str, str]]) -> None:
    merged = merge_states({s.job_id: s for s in squeue}, {s.job_id: s for s in sacct})
    assert {job_id: (s.source, s.native) for job_id, s in merged.items()} == expected


def test_merge_keeps_sacct_exit_code_when_both_terminal() -> None:
    merged = merge_states({"1": _sq("1", "FAILED")}, {"1": _sa("1", "FAILED", exit_code=2)})
    assert merged["1"].exit_code == 2


@pytest.mark.parametrize(
    ("row", "accounted"),
    [
        pytest.param("1|tao-x|FAILED|3:0|None|n1|2026-12-04T05:01:00|2026-12-04T05:02:00", True, id="full-row"),
        pytest.param("1|tao-x|FAILED|0:0|None|n1|2026-12-04T05:01:00|Unknown", False, id="state-before-end-record"),
        pytest.param(
            "1|tao-x|CANCELLED by 1001|0:0|None|None|2026-12-04T05:01:00|2026-12-04T05:01:00", True, id="cancelled"
        ),
        pytest.param("1|tao-x|RUNNING|0:0|None|n1|2026-12-04T05:01:00|Unknown", False, id="running"),
    ],
)
def test_accounted_needs_a_terminal_sacct_row_with_its_end(row: str, accounted: bool) -> None:
    assert parse_sacct(row)["1"].accounted is accounted


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(_sq("1", "FAILED"), id="no-end"),
        pytest.param(  # squeue -t all shows an ended job within MinJobAge, with its end time
            parse_squeue("1|tao-x|FAILED|NonZeroExitCode|n1|2026-12-04T05:01:00|2026-12-04T05:02:00")["1"],
            id="squeue-t-all-with-its-end",
        ),
    ],
)
def test_a_terminal_squeue_row_is_not_accounted(state: JobState) -> None:
    assert not state.accounted


@pytest.mark.parametrize(
    ("parse", "line", "expected"),
    [
        pytest.param(
            parse_squeue,
            "101|tao-a|RUNNING|None|n1|2024-05-01T10:00:00",
            "7 '|'-separated columns",
            id="squeue-cut-before-its-last-column",
        ),
        pytest.param(
            parse_sacct,
            "201|tao-a|COMPLETED|0:0|None|n1|2024-05-01T10:00:00",
            "8 '|'-separated columns",
            id="sacct-cut-before-its-last-column",
        ),
    ],
)
def test_a_job_row_one_column_short_is_an_error_not_a_shifted_row(
    parse: Callable[[str], dict[str, JobState]], line: str, expected: str
) -> None:
    """Output cut before its last column (a dropped connection): an error, never columns read one place off."""
    with pytest.raises(RemoteCommandError, match=expected):
        parse(line + "\n")


# --- a job squeue and sacct both no longer know (issue 32, item 11) ----------------------------------


@pytest.mark.parametrize(
    ("markers", "exit_code_text", "expected"),
    [
        pytest.param([(0, 0)], "0\n", ("COMPLETED", C, 0), id="clean-end"),
        pytest.param([(0, 3)], "3\n", ("FAILED", E, 3), id="program-failed"),
        pytest.param([(0, 0), (1, 2)], "2\n", ("FAILED", E, 2), id="latest-run-decides"),
        pytest.param([(1, 0), (0, 5)], " 0 ", ("COMPLETED", C, 0), id="markers-in-any-order"),
        pytest.param([], "0\n", None, id="no-marker-sigterm-or-lost"),
        pytest.param([(0, 0)], None, None, id="no-exit-code-file"),
        pytest.param([(0, 0)], "", None, id="empty-exit-code-file"),
        pytest.param([(0, 0)], "3\n", None, id="files-disagree"),
        pytest.param([(0, 3)], "0\n", None, id="files-disagree-the-marker-failed"),
        pytest.param([(0, 0)], "zero", None, id="garbled-exit-code-file"),
        pytest.param([(0, 0), (1, 0)], None, None, id="latest-run-removed-the-file-and-left-none"),
    ],
)
def test_the_jobs_own_end_marker_and_exit_code_file_settle_a_job_nobody_knows(
    markers: list[tuple[int, int]], exit_code_text: str | None, expected: tuple[str, TaoState, int] | None
) -> None:
    state = state_from_end_evidence("812", markers, exit_code_text)
    if expected is None:
        assert state is None
        return
    assert state is not None
    assert (state.native, state.tao_state, state.exit_code, state.signal, state.source) == (*expected, 0, "end marker")
    assert state.is_terminal
    assert not state.accounted
    assert "end marker" in state.message


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        pytest.param("11", ("11", None), id="bare-id"),
        pytest.param("11\n", ("11", None), id="newline"),
        pytest.param("11;mini\n", ("11", "mini"), id="id-cluster"),
        pytest.param("  4242;gpu-cluster_2  \n\n", ("4242", "gpu-cluster_2"), id="padded-cluster"),
        pytest.param("Welcome to polar!\nQuota: 80% used\n123\n", ("123", None), id="banner-before-id"),
        pytest.param("99\nsite banner 2024\n", None, id="trailing-banner-is-ambiguous"),
        pytest.param("1\n2\n", ("2", None), id="last-line-wins"),
        pytest.param("", None, id="empty"),
        pytest.param("\n  \n", None, id="blank"),
        pytest.param("Submitted batch job 11", None, id="non-parsable-reply"),
        pytest.param("11;", None, id="empty-cluster"),
        pytest.param("11;a;b", None, id="two-clusters"),
        pytest.param("11;mini cluster", None, id="space-in-cluster"),
        pytest.param("-11", None, id="negative"),
        pytest.param("11abc", None, id="garbage-suffix"),
        pytest.param("sbatch: error: Batch job submission failed", None, id="error-text"),
    ],
)
def test_parse_sbatch_reply(stdout: str, expected: tuple[str, str | None] | None) -> None:
    assert parse_sbatch_reply(stdout) == expected


OK = "#rc squeue 0\n#rc sacct 0\n"


@pytest.mark.parametrize(
    ("text", "mine", "foreign"),
    [
        pytest.param("11|alice\n" + OK, ("11",), (), id="one"),
        pytest.param("11|alice\n12|alice\n11|alice\n" + OK, ("11", "12"), (), id="dedup-keeps-order"),
        pytest.param("11|alice\n11.batch|alice\n11.0|alice\n" + OK, ("11",), (), id="steps-dropped"),
        pytest.param("  11|alice  \n\n\n13|alice\n" + OK, ("11", "13"), (), id="padding-and-blanks"),
        pytest.param("123_4|alice\n123+0|alice\n" + OK, ("123_4", "123+0"), (), id="array-het-kept"),
        pytest.param(OK, (), (), id="none"),
        pytest.param("JOBID|USER\nnoise line\n14|alice\n" + OK, ("14",), (), id="non-id-lines-dropped"),
        pytest.param("14|bob\n15|alice\n" + OK, ("15",), (("14", "bob"),), id="another-users-job-is-foreign"),
        pytest.param("14|alicex\n14|\n" + OK, (), (("14", "alicex"), ("14", "")), id="owner-must-match-exactly"),
    ],
)
def test_parse_jobs_by_name_keeps_only_our_jobs(
    text: str, mine: tuple[str, ...], foreign: tuple[tuple[str, str], ...]
) -> None:
    found = parse_jobs_by_name(text, "alice")
    assert (found.job_ids, found.foreign) == (mine, foreign)


@pytest.mark.parametrize(
    ("text", "evidence"),
    [
        pytest.param("#rc squeue 1\n#rc sacct 0\n", "squeue exited 1", id="squeue-failed"),
        pytest.param("11|alice\n#rc squeue 0\n#rc sacct 1\n", "sacct exited 1", id="sacct-failed-even-with-rows"),
        pytest.param("#rc squeue 0\n", "sacct gave no answer", id="cut-before-sacct"),
        pytest.param("", "squeue gave no answer", id="nothing-at-all"),
    ],
)
def test_a_failed_lookup_is_never_an_empty_answer(text: str, evidence: str) -> None:
    with pytest.raises(JobLookupError, match=evidence) as failed:
        parse_jobs_by_name(text, "alice", stderr="slurm_load_jobs error: Unable to contact slurm controller")
    assert "Unable to contact" in failed.value.evidence


@pytest.mark.parametrize(
    ("text", "evidence"),
    [
        pytest.param("#rc squeue 1\n#rc sacct 1\n", "squeue exited 1; sacct exited 1", id="both-failed"),
        pytest.param("11|alice\n#rc sacct 0\n", "squeue gave no answer", id="squeue-marker-missing"),
        pytest.param("11|alice\n#rc squeue 0\n11|alice\n", "sacct gave no answer", id="sacct-marker-missing"),
        pytest.param("#rc squeue x\n#rc sacct 0\n", "squeue gave no answer", id="garbled-marker-is-missing"),
        pytest.param("14|bob\n#rc squeue 0\n#rc sacct 255\n", "sacct exited 255", id="only-foreign-rows-and-failed"),
        pytest.param("11|alice\n#rc squeue 0\n#rc sacct 0 trailing\n", "sacct gave no answer", id="marker-with-junk"),
    ],
)
def test_any_failed_or_missing_query_raises_even_with_rows(text: str, evidence: str) -> None:
    with pytest.raises(JobLookupError) as failed:
        parse_jobs_by_name(text, "alice")
    assert failed.value.evidence == evidence  # no stderr: the evidence is the failures alone


@pytest.mark.parametrize(
    ("text", "mine", "foreign"),
    [
        pytest.param("11|alice\n#rc squeue 0\n12|alice\n#rc sacct 0\n", ("11", "12"), (), id="rows-of-both-tools"),
        pytest.param(
            "11|alice\n#rc squeue 0\n11|alice\n12|bob\n12|bob\n#rc sacct 0\n",
            ("11",),
            (("12", "bob"),),
            id="live-and-finished-row-of-one-job-once-foreign-once",
        ),
        pytest.param("  #rc squeue 0  \n#rc sacct 0\n", (), (), id="padded-marker"),
        pytest.param("11| alice \n" + OK, ("11",), (), id="owner-padding-stripped"),
    ],
)
def test_parse_jobs_by_name_more_answers(
    text: str, mine: tuple[str, ...], foreign: tuple[tuple[str, str], ...]
) -> None:
    found = parse_jobs_by_name(text, "alice")
    assert (found.job_ids, found.foreign) == (mine, foreign)


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("Priority", "other jobs are ahead"),
        ("Resources", "enough free nodes/GPUs"),
        ("QOSGrpMemLimit", "group memory limit"),
        ("QOSGrpGRES", "QOS group limit"),
        ("ReqNodeNotAvail, UnavailableNodes:n2", "down, drained or reserved"),
        ("PartitionTimeLimit", "can never start"),
        ("DependencyNeverSatisfied", "can never be satisfied"),
        ("Dependency", "waiting for the jobs it depends on"),
        ("JobHeldUser", "scontrol release"),
    ],
)
def test_pending_reasons_get_a_hint(reason: str, words: str) -> None:
    hint = pending_hint(reason)
    assert hint is not None
    assert words in hint


@pytest.mark.parametrize("reason", [None, "", "None", "SomethingNew"])
def test_other_reasons_get_no_hint(reason: str | None) -> None:
    assert pending_hint(reason) is None


SACCT_ROW = "{id}|tao-x|{state}|{code}|None|n1|2026-12-04T05:00:00|{end}"


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        # one run
        ([("7", "COMPLETED", "0:0", "2026-12-04T05:08:30")], {"7": ("COMPLETED", 0)}),
        # requeued once: the first run's row, then the newest (pending again)
        ([("7", "REQUEUED", "0:15", "2026-12-04T05:01:00"), ("7", "PENDING", "0:0", "Unknown")], {"7": ("PENDING", 1)}),
        # requeued twice, ended; another job beside it, and step rows that are not runs
        (
            [
                ("7", "NODE_FAIL", "0:0", "2026-12-04T05:01:00"),
                ("8", "RUNNING", "0:0", "Unknown"),
                ("7", "REQUEUED", "0:15", "2026-12-04T05:02:00"),
                ("7.batch", "CANCELLED", "0:15", "2026-12-04T05:02:00"),
                ("7", "COMPLETED", "0:0", "2026-12-04T05:08:30"),
            ],
            {"7": ("COMPLETED", 2), "8": ("RUNNING", 0)},
        ),
    ],
    ids=["one-run", "requeued-pending", "requeued-twice-ended"],
)
def test_sacct_every_run_counts_the_runs_of_a_requeued_job(
    rows: list[tuple[str, str, str, str]], expected: dict[str, tuple[str, int]]
) -> None:
    """``sacct -D`` lists every run of a requeued job, oldest first: the newest row wins and says which run it is."""
    text = "\n".join(SACCT_ROW.format(id=i, state=st, code=code, end=end) for i, st, code, end in rows) + "\n"
    parsed = parse_sacct(text, count_runs=True)
    assert {job: (state.native, state.run) for job, state in parsed.items()} == expected
    assert {state.run for state in parse_sacct(text).values()} == {None}, "without -D no run is counted"
