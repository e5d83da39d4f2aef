"""TAO status.json parsing, verdicts and KPIs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.status import parse_status_lines, status_kpis, status_verdict

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


@pytest.mark.parametrize(
    ("text", "kpis"),
    [
        pytest.param(
            f'{STARTED}\n{{"status": "SUCCESS", "kpi": {{"mAP": 0.81, "AP50": 0.9}}}}',
            {"mAP": 0.81, "AP50": 0.9},
            id="evaluate",
        ),
        pytest.param(
            '{"status": "RUNNING", "kpi": {"mAP": 0.5, "val_loss": 1.2}}\n{"status": "SUCCESS", "kpi": {"mAP": 0.8}}',
            {"mAP": 0.8, "val_loss": 1.2},
            id="each-name-from-the-last-line-carrying-it",
        ),
        pytest.param(
            '{"status": "RUNNING", "kpi": {"mAP": 0.5}}\n{"status": "SUCCESS", "message": "done"}',
            {"mAP": 0.5},
            id="a-later-line-without-kpi-keeps-them",
        ),
        pytest.param(
            '{"status": "SUCCESS", "kpi": {"top_k_accuracy": 1, "anchors": "[(1.0, 2.0)]", "ok": true, "x": null}}',
            {"top_k_accuracy": 1, "anchors": "[(1.0, 2.0)]", "ok": True, "x": None},
            id="numbers-strings-bools-nulls-as-they-are",
        ),
        pytest.param(
            '{"status": "SUCCESS", "kpi": {"per_class": {"cat": {"AP": 0.7}, "dog": [0.6, NaN]}}}',
            {"per_class": {"cat": {"AP": 0.7}, "dog": [0.6, "NaN"]}},
            id="nested-kept-json-safe",
        ),
        pytest.param(
            '{"status": "FAILURE", "kpi": {"loss": NaN, "best": Infinity, "worst": -Infinity}}',
            {"loss": "NaN", "best": "Infinity", "worst": "-Infinity"},
            id="non-finite-numbers-as-their-json-tokens",
        ),
        pytest.param(
            '{"status": "SUCCESS", "kpi": [0.8]}\n{"status": "SUCCESS", "kpi": "mAP=0.8"}\n{"kpi": {}}',
            {},
            id="not-a-mapping-or-empty",
        ),
        pytest.param(f"{STARTED}\n{SUCCESS}", {}, id="no-kpi-lines"),
        pytest.param("", {}, id="missing"),
    ],
)
def test_status_kpis(text: str, kpis: dict[str, Any]) -> None:
    found = status_kpis(parse_status_lines(text))
    assert found == kpis
    assert json.loads(json.dumps(found, allow_nan=False)) == kpis, "JSON-safe: no NaN or Infinity left"


def test_status_kpis_of_no_status_json() -> None:
    assert status_kpis(None) == {}


def test_status_kpis_copies_what_it_returns() -> None:
    entries = parse_status_lines('{"status": "SUCCESS", "kpi": {"per_class": {"cat": 0.7}}}')
    status_kpis(entries)["per_class"]["cat"] = 0.0
    assert entries[0]["kpi"]["per_class"]["cat"] == 0.7
