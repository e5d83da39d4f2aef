"""The approval example with the real Airflow services, both approvals given through the REST API.

One module fixture starts ``airflow standalone`` (:func:`airflow_stack.standalone`) and triggers
``example_tao_approval`` through the REST API with its defaults: the training can use at most 8 GPU
hours (2 slices of 2 nodes x 1 GPU x 2 h), four times the default ``gpu_hour_budget``. Like a person with the UI's
"Required Actions", the test waits until ``approve_training`` waits for input, reads its
human-in-the-loop detail (``GET .../taskInstances/approve_training/-1/hitlDetails``) and approves
it (``PATCH`` the same path, ``{"chosen_options": ["Approve"]}``) once the scheduler has taken the
exit of the worker that parked it (:meth:`ApprovalRun.wait_parked`); the training runs on 2 nodes of
the test cluster, the evaluation reports its KPIs, and ``approve_export`` is read and approved the
same way. Expected: nothing was submitted before the approval; each approval's text shows the
numbers to decide on (the GPU hours; the evaluation's KPIs as the evaluate sensor returned them);
the run succeeds with the export done. A second run at the same time, with ``gpu_hour_budget`` 8 (the
request fits), goes straight on to the training: its ``approve_training`` is skipped and only its
export is approved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as url_quote

import pytest
from airflow_stack import Stack, standalone

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DAG_ID = "example_tao_approval"
#: Seconds allowed for the DAG to be parsed, and for each step of the run (to an approval, to the end).
PARSE_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 180.0
#: At most this long the test waits for the scheduler's line about the parking worker's exit before answering.
PARK_TIMEOUT_S = 10.0
EXECUTOR_EVENT = "Received executor event with state "
#: What the approval's text must show: the DAG's shape (2 nodes x 1 GPU x 2 h) against its default budget.
GPU_REQUEST = "2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours per slice; at most 2 slices = 8 GPU hours"
#: A human-in-the-loop task waiting for its answer (Airflow 3.3; deferred before).
WAITING = ("awaiting_input", "deferred")
APPROVE = {"chosen_options": ["Approve"], "params_input": {}}


@dataclass
class ApprovalRun:
    """The DAG run, what each approval showed while it waited, and every task state seen."""

    stack: Stack
    run_id: str
    #: Task id -> the HITL detail read while the task waited.
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Task id -> the answer the PATCH returned.
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Task id -> the task states when that approval was found waiting.
    states_at: dict[str, dict[str, str | None]] = field(default_factory=dict)
    seen: dict[str, list[str]] = field(default_factory=dict)
    state: str = ""

    @property
    def path(self) -> str:
        """The run's REST API path (run ids contain ``+`` and ``:``)."""
        return f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(self.run_id, safe='')}"

    def look(self) -> dict[str, str | None]:
        """One look at the run: its state and each task's, newly seen task states recorded in :attr:`seen`."""
        self.state = self.stack.get(self.path)["state"]
        states = {ti["task_id"]: ti["state"] for ti in self.stack.get(f"{self.path}/taskInstances")["task_instances"]}
        for task, state in states.items():
            history = self.seen.setdefault(task, [])
            if state and history[-1:] != [state]:
                history.append(state)
        return states

    def wait_for(self, what: str, done: Callable[[dict[str, str | None]], bool]) -> dict[str, str | None]:
        """Look until ``done(task states)``; fail when the run ends first or after :data:`STEP_TIMEOUT_S`."""
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            states = self.look()
            if done(states):
                return states
            if self.state in ("success", "failed"):
                break
            time.sleep(0.5)
        stuck = [task for task, states in self.seen.items() if states and states[-1] not in ("success", "skipped")]
        logs = "\n".join(f"--- {task}:\n{self.task_log(task)[-6000:]}" for task in stuck)
        pytest.fail(f"{what}: not seen (run {self.state}, task states {self.seen})\n{logs}")

    def task_log(self, task_id: str) -> str:
        """Every try's log of ``task_id``: its events and errors, one a line."""
        path = f"{self.path}/taskInstances/{task_id}"
        tries = range(1, self.stack.get(path)["try_number"] + 1)
        content = [item for n in tries for item in self.stack.get(f"{path}/logs/{n}")["content"]]
        return "\n".join(f"{item.get('event', '')} {item.get('error_detail') or ''}".rstrip() for item in content)

    def approve(self, task_id: str) -> None:
        """Wait until ``task_id`` waits for its answer, read its HITL detail, then approve it: all through REST."""
        self.states_at[task_id] = self.wait_for(f"{task_id} waiting", lambda states: states.get(task_id) in WAITING)
        self.wait_parked(task_id)
        path = f"{self.path}/taskInstances/{task_id}/-1/hitlDetails"
        self.pending[task_id] = self.stack.get(path)
        response = self.stack.client.patch(path, json=APPROVE)
        response.raise_for_status()
        self.answers[task_id] = response.json()

    def wait_parked(self, task_id: str) -> None:
        """Wait until the scheduler has taken the exit of the worker that parked ``task_id`` (its log says so).

        A person answers seconds later. An answer before that (within about a second) hits a race in
        Airflow 3.3.2: the scheduler queues the resumed task, then takes the parking worker's exit as the
        end of a task killed externally and retries it, and the retry asks again.
        """
        try_number = self.stack.get(f"{self.path}/taskInstances/{task_id}")["try_number"]
        key = f"task_id='{task_id}', run_id='{self.run_id}', try_number={try_number},"
        deadline = time.monotonic() + PARK_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(key in line for line in self.stack.log.read_text().splitlines() if EXECUTOR_EVENT in line):
                return
            time.sleep(0.5)

    def xcom(self, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom (its return value unless ``key`` says otherwise), as the REST API gives it."""
        entry = self.stack.get(f"{self.path}/taskInstances/{task_id}/xcomEntries/{key}", deserialize="true")
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) and value[:1] in ("{", "[") else value


def trigger(stack: Stack, conf: dict[str, Any]) -> ApprovalRun:
    """Trigger a run of the DAG with ``conf`` through the REST API."""
    answer = stack.post(f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf})
    return ApprovalRun(stack=stack, run_id=str(answer["dag_run_id"]))


@dataclass(frozen=True)
class Runs:
    """The two runs of the module, made at the same time in one ``airflow standalone``."""

    #: The DAG's defaults: at most 8 GPU hours over a budget of 2; both approvals given.
    over: ApprovalRun
    #: ``gpu_hour_budget`` 8: the training goes straight on; only the export's approval is given.
    within: ApprovalRun


@pytest.fixture(scope="module")
def runs(cluster: ClusterEnv) -> Iterator[Runs]:
    """Both runs triggered through the REST API, their approvals given through it, each followed until it ends."""
    with standalone(cluster, prefix="tao-approval-") as stack:
        deadline = time.monotonic() + PARSE_TIMEOUT_S
        while stack.client.get(f"/api/v2/dags/{DAG_ID}").status_code != 200:
            assert time.monotonic() < deadline, f"{DAG_ID} was not parsed:\n{stack.log.read_text()[-3000:]}"
            time.sleep(0.5)
        stack.client.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
        over, within = trigger(stack, {}), trigger(stack, {"gpu_hour_budget": 8})
        over.approve("approve_training")
        for run in (within, over):
            run.approve("approve_export")
        for run in (within, over):
            run.wait_for("the run's end", lambda _, run=run: run.state in ("success", "failed"))
        yield Runs(over=over, within=within)


@pytest.fixture(scope="module")
def approved(runs: Runs) -> ApprovalRun:
    """The run over the budget."""
    return runs.over


def test_the_training_waits_for_an_approval_that_shows_its_gpu_hours(approved: ApprovalRun) -> None:
    """Over the budget, the run stops at ``approve_training`` before anything is submitted; its text has the numbers."""
    detail = approved.pending["approve_training"]
    states = approved.states_at["approve_training"]
    assert states["check_budget"] == "success"
    assert states["train"] is None, "nothing is submitted before the approval"
    assert detail["task_instance"]["state"] in WAITING
    assert (detail["response_received"], detail["options"]) == (False, ["Approve", "Reject"])
    assert GPU_REQUEST in detail["subject"], detail
    assert f"**{GPU_REQUEST}**, over the budget of 2 GPU hours" in detail["body"], detail
    assert approved.xcom("check_budget", "gpu_request") == GPU_REQUEST


def test_the_export_approval_shows_the_evaluations_kpis(approved: ApprovalRun) -> None:
    """``approve_export`` lists the KPIs that the evaluate sensor returned, before anything is exported."""
    detail = approved.pending["approve_export"]
    states = approved.states_at["approve_export"]
    assert (states["wait_evaluate"], states["export"]) == ("success", None)
    kpis = approved.xcom("wait_evaluate")["kpis"]
    assert set(kpis) == {"accuracy", "loss"}, kpis
    assert [f"- {name}: {value}" for name, value in kpis.items()] == [
        line for line in detail["body"].splitlines() if line.startswith("- ")
    ], detail["body"]
    checkpoints = f"{approved.xcom('train')['results_dir']}/checkpoints"
    assert detail["body"].startswith(f"The evaluation of {checkpoints} reported:"), detail["body"]


def test_both_approvals_were_answered_through_the_rest_api(approved: ApprovalRun) -> None:
    for task_id, answer in approved.answers.items():
        assert answer["chosen_options"] == ["Approve"], (task_id, answer)
        detail = approved.stack.get(f"{approved.path}/taskInstances/{task_id}/-1/hitlDetails")
        assert (detail["response_received"], detail["chosen_options"]) == (True, ["Approve"]), detail
    assert list(approved.answers) == ["approve_training", "approve_export"]


def test_the_run_succeeds_with_the_two_node_training_and_the_export(approved: ApprovalRun, ssh_run: SshRun) -> None:
    """Every task succeeds; the training ran on 2 nodes; the export job completed."""
    assert approved.state == "success", approved.seen
    assert {task: states[-1] for task, states in approved.seen.items()} == dict.fromkeys(approved.seen, "success")
    assert len(approved.seen) == 11
    for task_id in ("approve_training", "approve_export"):
        assert set(approved.seen[task_id]) & set(WAITING), approved.seen[task_id]
        ti = approved.stack.get(f"{approved.path}/taskInstances/{task_id}")
        assert ti["try_number"] == 1, f"{task_id} asked again: the first answer was lost ({approved.seen[task_id]})"
    train = approved.xcom("train")
    rc, out, err = ssh_run(f"sacct -X -n -P -j {train['slurm_job_id']} -o NNodes,State")
    assert (rc, out.split()) == (0, ["2|COMPLETED"]), err
    assert approved.xcom("wait_export")["terminal_state"] == "COMPLETE"


def test_within_the_budget_the_training_goes_straight_on(runs: Runs) -> None:
    """``gpu_hour_budget`` 8 (the request's at most 8 GPU hours fit): no training approval; the run succeeds."""
    within = runs.within
    assert within.state == "success", within.seen
    assert within.xcom("check_budget", "gpu_request") == GPU_REQUEST
    assert within.seen["approve_training"] == ["skipped"]
    assert {task: states[-1] for task, states in within.seen.items() if task != "approve_training"} == dict.fromkeys(
        set(within.seen) - {"approve_training"}, "success"
    )
    assert list(within.answers) == ["approve_export"]
    assert within.stack.client.get(f"{within.path}/taskInstances/approve_training/-1/hitlDetails").status_code == 404
