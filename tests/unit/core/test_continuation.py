"""Trainings over several allocations: parameters, the checkpoint listing and the stop rules, table-driven."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.continuation import (
    DEFAULT_CHECKPOINT_GLOBS,
    SliceEnd,
    check_checkpoint_globs,
    check_checkpoint_signal,
    check_max_continuations,
    continuation_verdict,
    ends_slice,
    grace_seconds,
    new_checkpoints,
    parse_new_checkpoints,
    slice_job_id,
    slice_marker,
    spec_checkpoint_interval,
)
from airflow_provider_tao_slurm.core.states import parse_sacct
from airflow_provider_tao_slurm.exceptions import ValidationError


def as_printed(row: str) -> str:
    """The native state of one ``sacct -X -n -P`` row as the parser reads it (the sensor's path)."""
    (state,) = parse_sacct(row + "\n").values()
    return state.native


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (1, 1), (5, 5), (1000, 1000)])
def test_max_continuations(value: int, expected: int) -> None:
    assert check_max_continuations(value) == expected


@pytest.mark.parametrize("value", [-1, 1001, 1.5, "3", True, None])
def test_max_continuations_refused(value: Any) -> None:
    with pytest.raises(ValidationError, match=r"max_continuations=.* must be a whole number from 0"):
        check_max_continuations(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, DEFAULT_CHECKPOINT_GLOBS, id="tao-default"),
        pytest.param("*.pth", ("*.pth",), id="one"),
        pytest.param(["*.pth", "epoch_[0-9]*.ckpt", "*.pth"], ("*.pth", "epoch_[0-9]*.ckpt"), id="list-deduplicated"),
    ],
)
def test_checkpoint_globs(value: Any, expected: tuple[str, ...]) -> None:
    assert check_checkpoint_globs(value) == expected


@pytest.mark.parametrize("value", ["", [], "ckpt/*.pth", "*.pth; rm -rf ~", "$(id).pth", "a b", 3, ["*.pth", 3]])
def test_checkpoint_globs_refused(value: Any) -> None:
    with pytest.raises(ValidationError, match=r"checkpoint_glob=.* must be a file name pattern"):
        check_checkpoint_globs(value)


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("USR1", "USR1"), ("sigusr2", "USR2"), ("SIGUSR1", "USR1")]
)
def test_checkpoint_signal(value: Any, expected: str | None) -> None:
    assert check_checkpoint_signal(value) == expected


@pytest.mark.parametrize("value", ["KILL", "STOP", "TERM", "HUP", "INT", "USR1; id", 10, ""])
def test_checkpoint_signal_refused(value: Any) -> None:
    with pytest.raises(ValidationError, match=r"checkpoint_signal=.* must be one of USR1, USR2"):
        check_checkpoint_signal(value)


@pytest.mark.parametrize(
    ("hours", "override", "expected"),
    [
        pytest.param(1 / 60, None, 10, id="one-minute-slice-10-s"),
        pytest.param(0.25, None, 90, id="quarter-hour-a-tenth"),
        pytest.param(4, None, 600, id="four-hours-capped"),
        pytest.param(4, 120, 120, id="given"),
        pytest.param(0.33, None, 118, id="a-tenth-in-whole-seconds"),  # --signal=B:USR1@118 takes whole seconds
    ],
)
def test_grace_seconds(hours: float, override: int | None, expected: int) -> None:
    assert grace_seconds(hours, override) == expected


@pytest.mark.parametrize("override", [0, 60, 1.5, True, "30"])
def test_grace_seconds_refused(override: Any) -> None:
    with pytest.raises(ValidationError, match=r"signal_grace_seconds=.* from 1 to less than the slice"):
        grace_seconds(1 / 60, override)


@pytest.mark.parametrize(
    ("hours", "override", "allowed"),
    [
        pytest.param(1.0, 3600, False, id="one-hour-slice-warned-an-hour-ahead"),
        pytest.param(1.0, 3599, True, id="one-hour-slice-warned-a-second-after-it-starts"),
        pytest.param(4.0, 14400, False, id="four-hour-slice-warned-four-hours-ahead"),
        pytest.param(1.0, 1, True, id="one-second-the-least"),
    ],
)
def test_a_grace_override_runs_from_one_second_to_less_than_the_slice(
    hours: float, override: int, allowed: bool
) -> None:
    if allowed:
        assert grace_seconds(hours, override) == override
        return
    with pytest.raises(ValidationError, match=r"less than the slice \(\d+ s\)"):
        grace_seconds(hours, override)


@pytest.mark.parametrize(
    ("native", "exit_code", "expected"),
    [
        ("TIMEOUT", 0, True),
        ("PREEMPTED", 0, True),
        ("FAILED", 124, True),
        ("FAILED", 1, False),
        ("COMPLETED", 0, False),
        ("CANCELLED", 0, False),
        ("NODE_FAIL", 1, False),
        ("OUT_OF_MEMORY", 0, False),
        # exit 124 ends a slice only from FAILED: a node failure, a cancel or OOM that exits 124 is theirs
        ("NODE_FAIL", 124, False),
        ("CANCELLED", 124, False),
        ("BOOT_FAIL", 124, False),
        ("OUT_OF_MEMORY", 124, False),
        ("COMPLETED", 124, False),
    ],
)
def test_ends_slice(native: str, exit_code: int, expected: bool) -> None:
    assert ends_slice(native, exit_code) is expected


#: sacct rows of a slice's end (``JobIDRaw,JobName,State,ExitCode,Reason,NodeList,Start,End``).
RAN = "n1|2026-12-03T06:00:00|2026-12-03T10:00:05"


@pytest.mark.parametrize(
    ("row", "exit_code", "expected"),
    [
        pytest.param(f"7|tao-x|FAILED|124:0|NonZeroExitCode|{RAN}", 124, True, id="program-timeout-124"),
        pytest.param(f"7|tao-x|TIMEOUT|0:15|TimeLimit|{RAN}", 0, True, id="slurm-time-limit"),
        pytest.param(f"7|tao-x|PREEMPTED|0:15|None|{RAN}", 0, True, id="preempted-not-requeued"),
        pytest.param(f"7|tao-x|FAILED|1:0|NonZeroExitCode|{RAN}", 1, False, id="program-error"),
    ],
)
def test_ends_slice_of_a_state_as_sacct_prints_it(row: str, exit_code: int, expected: bool) -> None:
    assert ends_slice(as_printed(row), exit_code) is expected


@pytest.mark.parametrize(
    ("kwargs", "go_on", "message"),
    [
        pytest.param(
            {"checkpoints": ["/r/train/epoch_5.pth"]},
            True,
            "slice 1 ended TIMEOUT after writing 1 checkpoint(s); slice 2 of at most 5 resumes from "
            "/r/train/epoch_5.pth",
            id="continues",
        ),
        pytest.param(
            {"checkpoints": [], "time_hours": 4.0},
            False,
            "the 4 h slice 1 ended TIMEOUT and wrote no checkpoint: lower the training's checkpoint interval (TAO: "
            "train.checkpoint_interval; the spec sets no checkpoint interval) so it saves within a slice, or raise "
            "time_hours; no new checkpoint in 1 listing(s)",
            id="no-checkpoint",
        ),
        pytest.param(
            {
                "checkpoints": [],
                "slice_number": 3,
                "last_checkpoint": "/r/e9.pth",
                "elapsed_seconds": 62,
                "checkpoint_interval": "5 epoch",
                "listings": 7,
                "listed_over_seconds": 30.0,
            },
            False,
            "the 1 min slice 3 ended TIMEOUT and wrote no checkpoint: lower the training's checkpoint interval (TAO: "
            "train.checkpoint_interval; the spec's checkpoint interval is 5 epoch) so it saves within a slice (this "
            "one ran 1 min 2 s of its 1 min), or raise time_hours; no new checkpoint in 7 listing(s) over 30 s; the "
            "last checkpoint is /r/e9.pth",
            id="no-checkpoint-names-the-slice-length-the-interval-and-the-last",
        ),
        pytest.param(
            {
                "native": "PREEMPTED",
                "checkpoints": [],
                "time_hours": 4.0,
                "elapsed_seconds": 600,
                "checkpoint_interval": "1 epoch",
                "listings": 7,
                "listed_over_seconds": 30.0,
            },
            False,
            "the 4 h slice 1 was preempted before its first checkpoint (ran 10 min of its 4 h); no new checkpoint in "
            "7 listing(s) over 30 s, the spec's checkpoint interval is 1 epoch: nothing newer to resume from, so the "
            "chain stops. Run it where it is not preempted (requeue=True lets SLURM rerun a preempted job itself), "
            "then clear the task",
            id="preempted-before-its-first-checkpoint",
        ),
        pytest.param(
            {"checkpoints": ["/r/e20.pth"], "slice_number": 5},
            False,
            "slice 5 ended TIMEOUT and max_continuations=4 is used up; the last checkpoint is /r/e20.pth: raise "
            "max_continuations, or resume from it by hand",
            id="used-up",
        ),
        pytest.param(
            {"checkpoints": ["/r/e19.pth", "/r/e20.pth"], "slice_number": 5},
            False,
            "slice 5 ended TIMEOUT and max_continuations=4 is used up; the last checkpoint is /r/e20.pth: raise "
            "max_continuations, or resume from it by hand",
            id="used-up-names-the-newest-checkpoint",
        ),
        pytest.param(
            {"checkpoints": ["/r/e5.pth", "/r/e10.pth"], "slice_number": 2, "max_continuations": 5},
            True,
            "slice 2 ended TIMEOUT after writing 2 checkpoint(s); slice 3 of at most 6 resumes from /r/e10.pth",
            id="second-slice-of-six",
        ),
        pytest.param(
            {"checkpoints": ["/r/e16.pth"], "slice_number": 4},
            True,
            "slice 4 ended TIMEOUT after writing 1 checkpoint(s); slice 5 of at most 5 resumes from /r/e16.pth",
            id="the-last-continuation-still-runs",
        ),
        pytest.param(
            {"native": "FAILED", "checkpoints": [], "time_hours": 4.0},
            False,
            "the 4 h slice 1 ended FAILED and wrote no checkpoint: lower the training's checkpoint interval (TAO: "
            "train.checkpoint_interval; the spec sets no checkpoint interval) so it saves within a slice, or raise "
            "time_hours; no new checkpoint in 1 listing(s)",
            id="program-timeout-124-without-checkpoint-is-not-a-preemption",
        ),
        pytest.param(
            {"native": as_printed(f"7|tao-x|PREEMPTED|0:15|None|{RAN}"), "checkpoints": [], "time_hours": 4.0},
            False,
            "the 4 h slice 1 was preempted before its first checkpoint; no new checkpoint in 1 listing(s), the spec "
            "sets no checkpoint interval: nothing newer to resume from, so the chain stops. Run it where it is not "
            "preempted (requeue=True lets SLURM rerun a preempted job itself), then clear the task",
            id="preempted-as-sacct-prints-it",
        ),
    ],
)
def test_continuation_verdict(kwargs: dict[str, Any], go_on: bool, message: str) -> None:
    values: dict[str, Any] = {
        "native": "TIMEOUT",
        "slice_number": 1,
        "max_continuations": 4,
        "time_hours": 1 / 60,
        "checkpoints": [],
        "last_checkpoint": None,
    }
    verdict = continuation_verdict(**{**values, **kwargs})
    assert (verdict.go_on, verdict.reason) == (go_on, message)


def test_preempted_before_a_first_checkpoint_never_blames_the_interval() -> None:
    verdict = continuation_verdict(
        native="PREEMPTED", slice_number=2, max_continuations=4, time_hours=4.0, checkpoints=[],
        last_checkpoint="/r/e3.pth",
    )  # fmt: skip
    assert not verdict.go_on
    assert "preempted before its first checkpoint" in verdict.reason
    assert "lower the training's checkpoint interval" not in verdict.reason
    assert verdict.reason.endswith("; the last checkpoint is /r/e3.pth")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"train": {"checkpoint_interval": 5, "checkpoint_interval_unit": "epoch"}}, "5 epoch", id="unit"),
        pytest.param({"train": {"checkpoint_interval": 2000}}, "2000", id="no-unit"),
        pytest.param({"train": {"num_epochs": 3}}, None, id="unset"),
        pytest.param({"train": "x"}, None, id="not-a-section"),
        pytest.param({"train": {"checkpoint_interval": True}}, None, id="not-a-number"),
        pytest.param(None, None, id="no-spec"),
    ],
)
def test_spec_checkpoint_interval(spec: Any, expected: str | None) -> None:
    assert spec_checkpoint_interval(spec) == expected


def test_a_slice_is_named_after_the_training_with_its_number() -> None:
    assert slice_job_id("tao-dag.train-0123456789abcdef", 2) == "tao-dag.train-0123456789abcdef-s2"
    assert slice_job_id("tao-dag.train-0123456789abcdef", 11) == "tao-dag.train-0123456789abcdef-s11"
    for number in (1, 0, True, "2"):
        with pytest.raises(ValidationError, match="slice number"):
            slice_job_id("tao-dag.train-0123456789abcdef", number)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        slice_job_id("tao-x; id", 2)


def _touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    os.utime(path, (mtime, mtime))


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        pytest.param(
            "START\n1764734400.1234567890 /r/train/epoch_1.pth\n1764738000.1234567890 /r/train/epoch_2.pth\n",
            SliceEnd(started=True, warned=False, checkpoints=["/r/train/epoch_1.pth", "/r/train/epoch_2.pth"]),
            id="not-warned-two-checkpoints",
        ),
        pytest.param(
            "START\n1764734400.1234567890 /r/train/epoch_1.pth\n",
            SliceEnd(started=True, warned=False, checkpoints=["/r/train/epoch_1.pth"]),
            id="not-warned-one-checkpoint",
        ),
        pytest.param("START\nWARNED\n", SliceEnd(started=True, warned=True, checkpoints=[]), id="warned-none"),
        pytest.param("NOSTART\n", SliceEnd(started=False, warned=False, checkpoints=[]), id="never-started"),
    ],
)
def test_parse_new_checkpoints(stdout: str, expected: SliceEnd) -> None:
    """What :func:`new_checkpoints` prints (``START``, ``WARNED`` when warned, ``<mtime> <path>`` newest last)."""
    assert parse_new_checkpoints(stdout) == expected


def test_new_checkpoints_lists_only_the_slices_own_matching_files(tmp_path: Path) -> None:
    """Checkpoints older than the slice's last start marker (a requeued run starts again), other files, and
    files in a hostile directory name are told apart by a real shell."""
    results, slices = tmp_path / "res $(id) 'q'", tmp_path / "slices"
    now = time.time()
    _touch(results / "train" / "epoch_1.pth", now - 300)
    _touch(slices / slice_marker("77", 0, "start"), now - 250)
    _touch(results / "train" / "epoch_2.pth", now - 200)
    _touch(slices / slice_marker("77", 0, "ending"), now - 240)
    _touch(slices / slice_marker("77", 1, "start"), now - 150)  # the requeued run
    _touch(slices / slice_marker("77", 1, "ending"), now - 20)
    _touch(results / "train" / "epoch_3.ckpt", now - 100)
    _touch(results / "train" / "notes.txt", now - 50)
    _touch(results / "train" / "epoch_4.pth", now - 10)
    command = new_checkpoints(str(results), str(slices), "77", ("*.pth", "*.ckpt"))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert parse_new_checkpoints(out) == SliceEnd(
        started=True,
        warned=True,
        checkpoints=[str(results / "train" / "epoch_3.ckpt"), str(results / "train" / "epoch_4.pth")],
    )
    none = subprocess.run(["sh", "-c", new_checkpoints(str(results), str(slices), "78", ("*.pth",))], text=True,
                          capture_output=True, check=True)  # fmt: skip
    assert parse_new_checkpoints(none.stdout) == SliceEnd(started=False, warned=False, checkpoints=[])


def test_a_listing_that_failed_is_no_answer(tmp_path: Path) -> None:
    slices = tmp_path / "slices"
    _touch(slices / slice_marker("77", 0, "start"), time.time())
    command = new_checkpoints(str(tmp_path / "absent"), str(slices), "77", ("*.pth",))
    assert subprocess.run(["sh", "-c", command], capture_output=True, text=True).returncode != 0


def test_new_checkpoints_refuses_a_bad_job_id() -> None:
    with pytest.raises(ValidationError, match="is not a number"):
        new_checkpoints("/r", "/s", "77; id", ("*.pth",))
