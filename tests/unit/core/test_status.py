"""TAO status.json parsing and verdicts."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.status import parse_status_lines, status_verdict

STARTED = '{"status": "STARTED", "message": "Starting Training Loop."}'
SUCCESS = '{"status": "SUCCESS", "message": "Training finished successfully."}'
FAILURE = '{"status": "FAILURE", "message": "Training failed: CUDA OOM"}'


@pytest.mark.parametrize(
    ("text", "count"),
    [
        (f"{STARTED}\n{SUCCESS}\n", 2),
        (f"{STARTED}\nnot json\n\n{SUCCESS}", 2),
        (SUCCESS, 1),
        (f"[{STARTED}, {SUCCESS}, 3]", 2),
        ("", 0),
        ("garbage", 0),
    ],
    ids=["lines", "junk-skipped", "single-doc", "list", "empty", "garbage"],
)
def test_parse_status_lines(text: str, count: int) -> None:
    assert len(parse_status_lines(text)) == count


@pytest.mark.parametrize(
    ("text", "ok", "message"),
    [
        (f"{STARTED}\n{SUCCESS}", True, "Training finished successfully."),
        (f"{STARTED}\n{SUCCESS}\n{FAILURE}", False, "Training failed: CUDA OOM"),
        (f"{STARTED}\n{FAILURE}\n{STARTED}\n{SUCCESS}", True, "Training finished successfully."),
        (STARTED, None, "no SUCCESS line"),
        ("", None, "missing or empty"),
        ('{"status": "success"}', True, "SUCCESS"),
    ],
    ids=["success", "failure-last", "resumed-after-failure", "no-verdict", "missing", "lowercase"],
)
def test_status_verdict(text: str, ok: bool | None, message: str) -> None:
    verdict = status_verdict(parse_status_lines(text))
    assert verdict.ok is ok
    assert message in verdict.message
