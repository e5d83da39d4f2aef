"""The approval example: a budget branch before the training, and approvals whose texts show the numbers.

The end-to-end run on the test cluster, with the approvals given through the REST API, is
``tests/cluster/test_example_approval.py``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.providers.standard.operators.python import BranchPythonOperator
from examples import load_example

KPIS = {"accuracy": 0.6234, "loss": 1.5064}
#: Both figures: one slice, and at most (max_continuations=1: two slices).
GPU_REQUEST = "2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours per slice; at most 2 slices = 8 GPU hours"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("example_tao_approval")


class FakeTi:
    """What the callable and the templates use of a task instance: XCom."""

    def __init__(self, pulls: dict[tuple[str, str], Any] | None = None) -> None:
        self.pulls = pulls or {}
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.pulls.get((task_ids, key))


def test_the_budget_branch_comes_before_the_training_and_the_approval_before_export(example: ModuleType) -> None:
    dag = example.dag
    check_budget, approve_training, approve_export = (
        dag.get_task(task_id) for task_id in ("check_budget", "approve_training", "approve_export")
    )
    train = dag.get_task("train")

    assert isinstance(check_budget, BranchPythonOperator)
    assert check_budget.python_callable is example.route_by_budget
    assert check_budget.upstream_task_ids == {"import_image"}
    assert check_budget.downstream_task_ids == {"approve_training", "train"}
    assert isinstance(approve_training, ApprovalOperator)
    assert approve_training.downstream_task_ids == {"train"}
    assert train.trigger_rule == "none_failed_min_one_success", "a skipped approval (within the budget) lets it run"
    assert (train.num_nodes, train.gpus_per_node, train.time_hours, train.max_continuations) == (2, 1, 2.0, 1)
    assert check_budget.op_kwargs["max_continuations"] == train.max_continuations
    assert isinstance(approve_export, ApprovalOperator)
    assert approve_export.upstream_task_ids == {"wait_evaluate"}
    assert approve_export.downstream_task_ids == {"export"}
    assert dag.get_task("wait_export").upstream_task_ids == {"export"}
    assert approve_training.defaults == approve_export.defaults == ["Reject"], "no answer in time rejects"
    assert dag.params["gpu_hour_budget"] == 2
    assert len(dag.tasks) == 11


@pytest.mark.parametrize(
    ("budget", "next_task"),
    [
        pytest.param(0, "approve_training", id="no-budget"),
        pytest.param(2, "approve_training", id="default-budget-a-quarter-of-the-most"),
        pytest.param(4, "approve_training", id="one-slice-fits-but-not-the-chain"),
        pytest.param(7.99, "approve_training", id="just-under"),
        pytest.param(8, "train", id="equal"),
        pytest.param(100, "train", id="well-within"),
    ],
)
def test_a_request_over_the_budget_waits_for_approval(example: ModuleType, budget: float, next_task: str) -> None:
    """The budget is judged on the most a continued training can use: 2 slices of 4 GPU hours."""
    ti = FakeTi()
    assert example.route_by_budget(2, 1, 2.0, 1, budget, ti) == next_task
    assert ti.pushed == {"gpu_request": GPU_REQUEST}


def test_a_training_that_is_not_continued_is_judged_on_its_one_slice(example: ModuleType) -> None:
    ti = FakeTi()
    assert example.route_by_budget(2, 1, 2.0, 0, 4, ti) == "train"
    assert ti.pushed == {"gpu_request": "2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours"}


def render(example: ModuleType, task_id: str, field: str, ti: FakeTi, params: dict[str, Any]) -> Any:
    """Render one template field of the DAG's task the way Airflow does (native objects, the DAG's environment)."""
    dag = example.dag
    template = getattr(dag.get_task(task_id), field)
    return dag.get_template_env().from_string(template).render(ti=ti, params=params)


def test_the_training_approval_shows_the_gpu_hours_and_the_budget(example: ModuleType) -> None:
    ti = FakeTi({("check_budget", "gpu_request"): GPU_REQUEST})
    subject = render(example, "approve_training", "subject", ti, {"gpu_hour_budget": 2})
    body = render(example, "approve_training", "body", ti, {"gpu_hour_budget": 2})

    assert subject == f"Approve a training of {GPU_REQUEST}?"
    assert body.startswith(f"The training asks for **{GPU_REQUEST}**, over the budget of 2 GPU hours")


@pytest.mark.parametrize(
    ("evaluation", "lines"),
    [
        pytest.param({"kpis": KPIS}, ["- accuracy: 0.6234", "- loss: 1.5064"], id="kpis"),
        pytest.param(
            {"terminal_state": "COMPLETE"}, ["- none: the evaluation reported no KPIs in its status.json"], id="no-kpis"
        ),
    ],
)
def test_the_export_approval_lists_the_evaluations_kpis(
    example: ModuleType, evaluation: dict[str, Any], lines: list[str]
) -> None:
    ti = FakeTi({("wait_evaluate", "return_value"): evaluation, ("train", "return_value"): {"results_dir": "/r/t"}})
    body = render(example, "approve_export", "body", ti, {})

    assert isinstance(body, str)
    assert body.startswith("The evaluation of /r/t/checkpoints reported:\n\n")
    assert [line for line in lines if line not in body.splitlines()] == []
