"""The pipeline example's KPI gate: its place in the DAG, its decision, and the stand-in's KPIs it reads.

The end-to-end run on the test cluster is ``tests/cluster/test_example_pipeline.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import Asset
from examples import DAGS, load_example

from airflow_provider_tao_slurm.core.status import parse_status_lines, status_kpis

STAND_IN = DAGS / "programs" / "tao_like_train.py"
#: The threshold the cluster test's second run uses to have export skipped.
SKIP_THRESHOLD = 0.9


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("example_tao_pipeline")


def test_the_gate_sits_between_the_evaluation_and_export(example: ModuleType) -> None:
    dag = example.dag
    gate = dag.get_task("accuracy_gate")

    assert isinstance(gate, ShortCircuitOperator)
    assert gate.upstream_task_ids == {"wait_evaluate"}
    assert gate.downstream_task_ids == {"export"}
    assert dag.get_task("export").upstream_task_ids == {"accuracy_gate", "import_image"}
    assert dag.get_task("wait_train").downstream_task_ids == {"evaluate"}
    assert gate.ignore_downstream_trigger_rules, "a missed KPI skips wait_export too"
    assert gate.python_callable is example.kpi_reaches
    assert gate.op_kwargs["evaluation"].operator is dag.get_task("wait_evaluate")
    assert (gate.op_kwargs["kpi"], gate.op_kwargs["threshold"]) == ("accuracy", "{{ params.min_accuracy }}")
    assert dag.render_template_as_native_obj, "the threshold renders as a number"


def test_the_evaluation_is_announced_and_the_threshold_is_a_param(example: ModuleType) -> None:
    dag = example.dag
    assert dag.get_task("wait_evaluate").outlets == [Asset("tao://example_tao_pipeline/evaluate")]
    assert dag.params["min_accuracy"] == 0.5
    assert len(dag.tasks) == 9


@pytest.mark.parametrize(
    ("evaluation", "threshold", "passed"),
    [
        pytest.param({"kpis": {"accuracy": 0.62}}, 0.5, True, id="above"),
        pytest.param({"kpis": {"accuracy": 0.5}}, 0.5, True, id="equal"),
        pytest.param({"kpis": {"accuracy": 0.62, "loss": 1.5}}, 0.9, False, id="below"),
        pytest.param({"kpis": {"accuracy": 1}}, 0.99, True, id="integer"),
    ],
)
def test_the_gate_passes_a_kpi_that_reaches_the_threshold(
    example: ModuleType, evaluation: dict[str, Any], threshold: float, passed: bool
) -> None:
    assert example.kpi_reaches(evaluation, "accuracy", threshold) is passed


@pytest.mark.parametrize(
    "evaluation",
    [
        pytest.param(None, id="no-xcom"),
        pytest.param({"terminal_state": "COMPLETE"}, id="no-kpis"),
        pytest.param({"kpis": {"mAP": 0.8}}, id="other-kpi"),
        pytest.param({"kpis": {"accuracy": "NaN"}}, id="not-a-number"),
        pytest.param({"kpis": {"accuracy": True}}, id="bool"),
    ],
)
def test_the_gate_fails_an_evaluation_without_the_kpi(example: ModuleType, evaluation: Any) -> None:
    with pytest.raises(ValueError, match="no numeric 'accuracy' KPI"):
        example.kpi_reaches(evaluation, "accuracy", 0.5)


def run_stand_in(*args: str | Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.run(
        [sys.executable, str(STAND_IN), *map(str, args)], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_stand_ins_evaluation_reports_kpis_the_default_threshold_passes(
    example: ModuleType, tmp_path: Path
) -> None:
    """As TAO evaluate: the KPIs go into status.json's ``kpi``; the demo's defaults let export run."""
    data = tmp_path / "data"
    data.mkdir()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"train": example.dag.params["spec"], "dataset": {"train": str(data)}}))
    run_stand_in("--spec", spec, "--results", tmp_path / "train", "--epoch-seconds", "0")
    run_stand_in(
        "--action", "evaluate", "--checkpoint", tmp_path / "train" / "checkpoints", "--results", tmp_path / "ev"
    )

    status = parse_status_lines((tmp_path / "ev" / "status.json").read_text())
    evaluation = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    kpis = status_kpis(status)

    assert [line["status"] for line in status] == ["STARTED", "RUNNING", "SUCCESS"]
    assert status[-1]["kpi"] == kpis, "the SUCCESS line carries them, as TAO's status logger repeats them"
    assert kpis["accuracy"] == evaluation["accuracy"] == round(1 - kpis["loss"] / 4, 6)
    assert example.dag.params["min_accuracy"] <= kpis["accuracy"] < SKIP_THRESHOLD
    assert example.kpi_reaches({"kpis": kpis}, "accuracy", example.dag.params["min_accuracy"])
