"""The soak's judge (``tests/cluster/soak_judge.py``), over rows shaped as Airflow's REST API and ``sacct`` give them.

Every case builds what the soak reads after a run: the task instances (``/taskInstances``), each task instance's tries
(``/taskInstances/{task}/tries``, ``/{map_index}/tries``), each try's log (``/logs/{try}``, JSON ``content``) and XCom
values, and ``sacct -X -D -P -n`` rows with ``SLURM_TIME_FORMAT=%s``; then asserts on the violations the judge lists.
"""

from __future__ import annotations

import ast
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from examples import load_file

_PATH = Path(__file__).resolve().parents[1] / "cluster" / "soak_judge.py"
sj = load_file("soak_judge", _PATH)

#: 2025-06-01 10:00:00 UTC: the soak's start in these cases.
T0 = 1_748_772_000
BASE = "/srv/lustre/slurmuser/soak-7-a1b2c3"
SINGLE = "soak_single"
RUN1 = "manual__2025-06-01T10:00:01.102938+00:00"
RUN2 = "manual__2025-06-01T10:00:02.847561+00:00"


def iso(moment: float | None) -> str | None:
    """An Airflow API timestamp (``2025-06-01T10:00:03.412871Z``)."""
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def name(dag: str, task: str, digest: str) -> str:
    """A job name such as the provider mints (the judge never derives one: it is an opaque string to it)."""
    return f"tao-{dag}.{task}-{digest}"


def script_of(first: str) -> str:
    return f"{BASE}/{first}/sbatch/job_{first}.sbatch"


def sacct_row(
    job_id: int,
    job_name: str,
    state: str,
    submit: float | None,
    start: float | None,
    end: float | None,
    *,
    nodes: str = "n1",
    script: str | None = None,
    exit_code: str = "0:0",
    partition: str = "polar",
) -> str:
    """One row of ``SLURM_TIME_FORMAT=%s sacct -X -D -P -n -o JobIDRaw,...,SubmitLine``."""

    def moment(value: float | None) -> str:
        return "Unknown" if value is None else str(int(value))

    line = f"sbatch --parsable --hold --export=ALL --job-name={job_name} {script}" if script else ""
    return "|".join(
        [str(job_id), job_name, state, moment(submit), moment(start), moment(end), exit_code, partition, nodes, line]
    )


def log_answer(moment: float, *lines: str) -> dict[str, Any]:
    """The logs endpoint's JSON answer for one try: the source group, then one structured event per line."""
    content: list[Any] = [
        {"timestamp": iso(moment), "event": "::group::Log message source details", "sources": ["/root/logs/x.log"]},
        {"event": "::endgroup::"},
    ]
    content += [
        {"timestamp": iso(moment + i), "event": line, "level": "info", "logger": "airflow.task.operators"}
        for i, line in enumerate(lines)
    ]
    return {"content": content, "continuation_token": None}


def handle(job_name: str, slurm_id: int) -> dict[str, Any]:
    """A submit task's return value, as the XCom endpoint serves it."""
    job_dir = f"{BASE}/{job_name}"
    return {
        "job_id": job_name,
        "slurm_job_id": str(slurm_id),
        "job_dir": job_dir,
        "results_dir": f"{job_dir}/results",
        "log_dir": f"{job_dir}/logs",
        "record_path": f"{BASE}/records/{job_name}.json",
        "sidecar_path": f"{job_dir}/secrets/env",
        "cluster": "slurmtest",
    }


@dataclass
class Attempt:
    task: str
    index: int
    number: int
    state: str
    start: float | None
    end: float | None
    log: dict[str, Any] | None = None


@dataclass
class Run:
    """One DAG run as the soak reads it through the REST API."""

    dag: str
    run: str
    attempts: list[Attempt] = field(default_factory=list)
    xcoms: dict[tuple[str, int], list[Any]] = field(default_factory=dict)

    def tried(
        self,
        task: str,
        state: str,
        start: float | None,
        end: float | None,
        *lines: str,
        index: int = -1,
    ) -> Run:
        # A task instance that never ran (upstream failed) is at try 0.
        number = 0 if start is None else 1 + sum(a.task == task and a.index == index for a in self.attempts)
        log = log_answer(start, *lines) if start is not None else None
        self.attempts.append(Attempt(task, index, number, state, start, end, log))
        return self

    def xcom(self, task: str, value: Any, index: int = -1) -> Run:
        self.xcoms.setdefault((task, index), []).append(value)
        return self

    def ti(self, attempt: Attempt, *, history: bool) -> dict[str, Any]:
        """The task instance (or one of its tries) as ``/taskInstances`` and ``/tries`` list it."""
        item: dict[str, Any] = {
            "task_id": attempt.task,
            "dag_id": self.dag,
            "dag_run_id": self.run,
            "map_index": attempt.index,
            "start_date": iso(attempt.start),
            "end_date": iso(attempt.end),
            "duration": None if attempt.start is None or attempt.end is None else attempt.end - attempt.start,
            "state": attempt.state,
            "try_number": attempt.number,
            "max_tries": 5 if attempt.task == "submit" else 1,
            "task_display_name": attempt.task,
            "dag_display_name": self.dag,
            "hostname": "storm",
            "unixname": "root",
            "pool": "default_pool",
            "pool_slots": 1,
            "queue": "default",
            "priority_weight": 2,
            "operator": "SbatchSubmitOperator" if attempt.task == "submit" else "SlurmJobSensor",
            "operator_name": None,
            "queued_when": iso(None if attempt.start is None else attempt.start - 0.4),
            "scheduled_when": iso(None if attempt.start is None else attempt.start - 0.9),
            "pid": 4242,
            "executor": None,
            "executor_config": "{}",
            "dag_version": {"id": str(uuid.uuid4()), "version_number": 1, "dag_id": self.dag},
        }
        if not history:
            item |= {
                "id": str(uuid.uuid4()),
                "logical_date": None,
                "run_after": iso(T0),
                "note": None,
                "rendered_map_index": None if attempt.index < 0 else str(attempt.index),
                "rendered_fields": {},
                "trigger": None,
                "triggerer_job": None,
            }
        return item

    def units(self) -> list[Any]:
        latest: dict[tuple[str, int], Attempt] = {}
        for attempt in self.attempts:
            latest[(attempt.task, attempt.index)] = attempt
        task_instances = [self.ti(attempt, history=False) for attempt in latest.values()]
        tries = {
            key: {
                "task_instances": [self.ti(a, history=True) for a in self.attempts if (a.task, a.index) == key],
                "total_entries": sum((a.task, a.index) == key for a in self.attempts),
            }
            for key in latest
        }
        logs = {(a.task, a.index, a.number): sj.log_text(a.log) for a in self.attempts if a.log is not None}
        xcoms = {key: sj.flatten(values) for key, values in self.xcoms.items()}
        return list(sj.build_units(self.dag, self.run, task_instances, tries, logs, xcoms))


def judged(runs: list[Run], rows: list[str], stops: dict[tuple[str, str], Any] | None = None) -> Any:
    jobs = sj.parse_sacct("\n".join(rows))
    return sj.judge(jobs, [unit for run in runs for unit in run.units()], stops or {})


def single(run_id: str, digest: str, slurm_id: int, start: float, *, watch_end: float) -> Run:
    """A single-node training: submit (one try), then its sensor, which ended success at ``watch_end``."""
    job = name(SINGLE, "submit", digest)
    return (
        Run(SINGLE, run_id)
        .tried("submit", "success", start, start + 4, f"SLURM job {slurm_id} ({job}) submitted on slurmtest")
        .xcom("submit", handle(job, slurm_id))
        .tried("wait", "success", start + 5, watch_end, f"SLURM job {slurm_id} COMPLETED")
    )


# ---------------------------------------------------------------------- parsing


def test_sacct_rows_of_a_requeued_job_are_one_job_with_its_runs() -> None:
    text = "\n".join(
        [
            "sacct: error: a warning on stderr is no row",
            sacct_row(401, "tao-soak_single.submit-0a0a", "PREEMPTED", T0 + 10, T0 + 11, T0 + 40, script="/x/j.sbatch"),
            sacct_row(401, "tao-soak_single.submit-0a0a", "COMPLETED", T0 + 41, T0 + 102, T0 + 130, nodes="n2"),
            sacct_row(402, "other", "CANCELLED by 1001", T0 + 50, T0 + 60, T0 + 60, nodes="None assigned"),
            sacct_row(403, "live", "RUNNING", T0 + 70, T0 + 71, None, nodes="n[1-2]"),
        ]
    )
    jobs = sj.parse_sacct(text)
    assert sorted(jobs) == ["401", "402", "403"]
    requeued = jobs["401"]
    assert [run.state for run in requeued.runs] == ["PREEMPTED", "COMPLETED"]
    assert (requeued.first_submit, requeued.end, requeued.state) == (T0 + 10, T0 + 130, "COMPLETED")
    assert requeued.script == "/x/j.sbatch"
    assert (jobs["402"].state, jobs["402"].ran) == ("CANCELLED", False)
    assert (jobs["403"].end, jobs["403"].ran) == (None, True)


@pytest.mark.parametrize(
    ("text", "tz", "expected"),
    [
        pytest.param("1748772005", None, T0 + 5.0, id="epoch seconds (SLURM_TIME_FORMAT=%s)"),
        pytest.param("2025-06-01T12:00:05", timezone(timedelta(hours=2)), T0 + 5.0, id="ISO in the given zone"),
        pytest.param("Unknown", None, None, id="a running job's End"),
        pytest.param("None", None, None, id="unset"),
        pytest.param("garbage", None, None, id="unreadable"),
    ],
)
def test_slurm_time(text: str, tz: Any, expected: float | None) -> None:
    assert sj.slurm_time(text, tz) == expected


def test_airflow_time_and_states() -> None:
    assert sj.airflow_time("2025-06-01T10:00:03.500000Z") == T0 + 3.5
    assert sj.airflow_time(None) is None
    assert sj.first_word("CANCELLED by 1001") == "CANCELLED"
    assert sj.first_word("CANCELLED+") == "CANCELLED"
    assert sj.batch_script("sbatch --parsable --job-name=a /srv/x/job_a.sbatch") == "/srv/x/job_a.sbatch"
    assert sj.batch_script("sbatch --wrap=sleep 5") == ""
    assert sj.batch_script("sbatch --output=/srv/x/out") == ""


def test_name_tokens_take_whole_names_only() -> None:
    text = (
        "SLURM job 101 (tao-soak_chain.submit-0a0a) submitted. Next: tao-soak_chain.submit-0a0a-s1, "
        f"record {BASE}/records/tao-soak_x.submit-1b1b.json, logs {BASE}/tao-soak_y.submit-2c2c/logs"
    )
    words = sj.name_tokens(text)
    assert {"tao-soak_chain.submit-0a0a", "tao-soak_chain.submit-0a0a-s1", "tao-soak_y.submit-2c2c"} <= words
    assert "tao-soak_x.submit-1b1b" not in words  # only as part of a file name


@pytest.mark.parametrize(
    ("nodelist", "nodes"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("n[1-2],n4", ["n1", "n2", "n4"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("None assigned", []),
    ],
)
def test_expand_nodes(nodelist: str, nodes: list[str]) -> None:
    assert sj.expand_nodes(nodelist) == nodes


def test_running_jobs_and_squeue_fill_in_what_accounting_lags() -> None:
    running = sj.parse_running("101|tao-a|n[1-2]\n102|tao-b|n4\nslurm_load_jobs error: x\n")
    assert [(job.job_id, job.nodes) for job in running] == [("101", ("n1", "n2")), ("102", ("n4",))]
    jobs = sj.parse_sacct(sacct_row(7, "a", "PENDING", T0, None, None, nodes="None assigned"))
    added = sj.add_squeue(jobs, f"7|a|RUNNING|{T0}|n1\n8|b|PENDING|{T0 + 3}|\n9|c|COMPLETED|{T0}|n2")
    assert added == ["7", "8", "9"]
    assert (jobs["7"].state, jobs["8"].state, jobs["8"].first_submit) == ("RUNNING", "PENDING", T0 + 3)


def test_jobs_submitted_before_the_soak_are_taken_out() -> None:
    jobs = sj.parse_sacct(
        "\n".join(
            [
                sacct_row(1, "left-over", "RUNNING", T0 - 300, T0 - 299, None),
                sacct_row(2, "same-second", "COMPLETED", T0, T0, T0 + 5),
                sacct_row(3, "during", "COMPLETED", T0 + 2, T0 + 3, T0 + 5),
            ]
        )
    )
    before = sj.submitted_before(jobs, T0 + 0.4)
    assert sorted(before) == ["1"]
    assert sorted(jobs) == ["2", "3"]


def test_a_mapped_run_with_an_unexpanded_watch_gives_one_training_per_index() -> None:
    sweep = Run("soak_sweep", RUN1)
    for index in range(3):
        sweep.tried("submit", "failed" if index == 1 else "success", T0 + 1, T0 + 5, index=index)
    sweep.tried("wait", "upstream_failed", None, None)
    units = sweep.units()
    assert [unit.map_index for unit in units] == [0, 1, 2]
    assert [unit.states for unit in units][1] == {"submit": "failed", "wait": "upstream_failed"}
    assert all(len(unit.tries) == 1 for unit in units)  # the unexpanded watch never ran: no try


# ---------------------------------------------------------------------- matching


def test_concurrent_runs_of_one_dag_get_their_own_jobs() -> None:
    """Two runs of one DAG whose tries overlap in time: each job goes to the run whose Airflow record names it."""
    runs = [
        single(RUN1, "1111", 101, T0 + 1, watch_end=T0 + 33),
        single(RUN2, "2222", 102, T0 + 2, watch_end=T0 + 34),
    ]
    rows = [
        sacct_row(101, name(SINGLE, "submit", "1111"), "COMPLETED", T0 + 3, T0 + 4, T0 + 30, script=script_of("a")),
        sacct_row(102, name(SINGLE, "submit", "2222"), "COMPLETED", T0 + 3, T0 + 4, T0 + 31, script=script_of("b")),
    ]
    jobs = sj.parse_sacct("\n".join(rows))
    units = [unit for run in runs for unit in run.units()]
    matching = sj.match_jobs(jobs, units)
    assert matching.claims["101"].unit == (SINGLE, RUN1, -1)
    assert matching.claims["102"].unit == (SINGLE, RUN2, -1)
    assert matching.claims["101"].attempt == ("submit", 1)
    found = sj.judge(jobs, units, {})
    assert found.violations == []
    assert found.outcomes == Counter({"soak_single: success / COMPLETED": 2})
    assert found.watches["watches that ended no earlier than their jobs"] == 2


def test_a_mapped_sweep_ties_each_index_to_its_job() -> None:
    sweep = Run("soak_sweep", RUN1)
    rows = []
    for index, digest in enumerate(("aa00", "bb11", "cc22")):
        job = name("soak_sweep", "submit", digest)
        sweep.tried("submit", "success", T0 + 1 + index, T0 + 5 + index, index=index)
        sweep.xcom("submit", handle(job, 201 + index), index=index)
        sweep.tried("wait", "success", T0 + 6 + index, T0 + 40 + index, index=index)
        rows.append(sacct_row(201 + index, job, "COMPLETED", T0 + 3 + index, T0 + 4, T0 + 38 + index))
    found = judged([sweep], rows)
    assert found.violations == []
    assert found.matching["mapped indexes (Airflow)"] == 3
    assert found.matching["jobs matched to a task try"] == 3
    jobs = sj.parse_sacct("\n".join(rows))
    claims = sj.match_jobs(jobs, sweep.units()).claims
    assert [claims[str(201 + i)].unit for i in range(3)] == [("soak_sweep", RUN1, i) for i in range(3)]


def test_a_resubmission_named_in_the_watch_log_belongs_to_the_watch_try() -> None:
    first, second = name("soak_norequeue", "submit", "3333"), name("soak_norequeue", "wait", "4444")
    run = (
        Run("soak_norequeue", RUN1)
        .tried("submit", "success", T0 + 1, T0 + 5)
        .xcom("submit", handle(first, 301))
        .tried(
            "wait",
            "success",
            T0 + 6,
            T0 + 120,
            f"Infrastructure failure of SLURM job 301 (NODE_FAIL); resubmitted as {second} (SLURM 302), excluding n1",
        )
    )
    rows = [
        sacct_row(301, first, "NODE_FAIL", T0 + 3, T0 + 4, T0 + 40, script=script_of(first)),
        sacct_row(302, second, "COMPLETED", T0 + 45, T0 + 46, T0 + 110, nodes="n2", script=script_of(first)),
    ]
    jobs = sj.parse_sacct("\n".join(rows))
    claim = sj.match_jobs(jobs, run.units()).claims["302"]
    assert (claim.unit, claim.attempt, claim.how) == (("soak_norequeue", RUN1, -1), ("wait", 1), "named by wait try 1")
    found = judged([run], rows)
    assert found.violations == []
    assert found.outcomes == Counter({"soak_norequeue: success / COMPLETED": 1})
    assert found.matching["submitted by a watch try (a resubmission, a next slice)"] == 1


def test_a_continued_chain_ties_its_unnamed_slices_by_their_batch_script() -> None:
    """Slice s1 is named nowhere in Airflow: SLURM ran it from the chain's script, so it is the chain's."""
    first = name("soak_chain", "submit", "5555")
    run = (
        Run("soak_chain", RUN1)
        .tried("submit", "success", T0 + 1, T0 + 5)
        .xcom("submit", handle(first, 501))
        .tried("wait", "success", T0 + 6, T0 + 200, "Slice 2 of at most 5 started (SLURM job 502)")
        .xcom("wait", handle(f"{first}-s2", 503))
    )
    rows = [
        sacct_row(501, first, "TIMEOUT", T0 + 3, T0 + 4, T0 + 66, partition="polar_1m", script=script_of(first)),
        sacct_row(502, f"{first}-s1", "TIMEOUT", T0 + 70, T0 + 71, T0 + 133, script=script_of(first)),
        sacct_row(503, f"{first}-s2", "COMPLETED", T0 + 137, T0 + 138, T0 + 190, script=script_of(first)),
    ]
    jobs = sj.parse_sacct("\n".join(rows))
    claims = sj.match_jobs(jobs, run.units()).claims
    assert claims["501"].attempt == ("submit", 1)
    assert claims["502"].how == "same batch script as job 501"
    assert claims["502"].attempt == claims["503"].attempt == ("wait", 1)
    found = judged([run], rows)
    assert found.violations == []
    assert found.outcomes == Counter({"soak_chain: success / COMPLETED": 1})


def test_a_requeued_job_is_one_job_and_its_watch_must_outlast_its_last_run() -> None:
    job = name(SINGLE, "submit", "4040")
    rows = [
        sacct_row(401, job, "PREEMPTED", T0 + 3, T0 + 4, T0 + 30, script=script_of(job)),
        sacct_row(401, job, "COMPLETED", T0 + 31, T0 + 92, T0 + 120, nodes="n2", script=script_of(job)),
    ]
    ok = single(RUN1, "4040", 401, T0 + 1, watch_end=T0 + 121.2)
    found = judged([ok], rows)
    assert found.violations == []
    assert found.matching["requeued (one id, several runs)"] == 1
    early = single(RUN1, "4040", 401, T0 + 1, watch_end=T0 + 35)  # saw the first run's end
    found = judged([early], rows)
    assert len(found.violations) == 1
    assert "wait try 1 ended success" in found.violations[0]
    assert "before SLURM job 401" in found.violations[0]


def test_a_job_submitted_after_its_try_was_killed_goes_to_that_try() -> None:
    """The worker died between sbatch and the reply: SLURM took the job after try 1 ended; try 2 adopted it."""
    job = name(SINGLE, "submit", "6060")
    run = (
        Run(SINGLE, RUN1)
        .tried("submit", "failed", T0 + 1, T0 + 10.2)
        .tried("submit", "success", T0 + 41, T0 + 44, f"Adopting SLURM job 601 ({job}), found by name")
        .xcom("submit", handle(job, 601))
        .tried("wait", "success", T0 + 45, T0 + 90)
    )
    rows = [sacct_row(601, job, "COMPLETED", T0 + 12, T0 + 42, T0 + 80, script=script_of(job))]
    jobs = sj.parse_sacct("\n".join(rows))
    claim = sj.match_jobs(jobs, run.units()).claims["601"]
    assert (claim.attempt, claim.after_try) == (("submit", 1), True)
    found = judged([run], rows)
    assert found.violations == []
    assert found.matching["submitted after their try ended (adopted by the next)"] == 1


def test_jobs_of_the_user_no_training_names_are_orphans() -> None:
    run = single(RUN1, "7070", 701, T0 + 1, watch_end=T0 + 33)
    rows = [
        sacct_row(701, name(SINGLE, "submit", "7070"), "COMPLETED", T0 + 3, T0 + 4, T0 + 30, script=script_of("a")),
        sacct_row(702, name(SINGLE, "submit", "dead"), "COMPLETED", T0 + 3, T0 + 4, T0 + 30, script=script_of("b")),
        sacct_row(703, "interactive", "COMPLETED", T0 + 9, T0 + 9, T0 + 20, script=None),
    ]
    found = judged([run], rows)
    assert len(found.violations) == 2
    assert found.violations[0].startswith(f"SLURM job 702 ({name(SINGLE, 'submit', 'dead')}, COMPLETED)")
    assert "is an orphan: no task try's log or XCom names it" in found.violations[0]
    assert found.violations[1].startswith("SLURM job 703 (interactive, COMPLETED)")
    assert found.matching["orphans (no training)"] == 2


def test_an_unnamed_job_linked_to_an_orphan_by_its_script_is_an_orphan_too() -> None:
    rows = [
        sacct_row(801, "tao-x-1", "TIMEOUT", T0 + 3, T0 + 4, T0 + 60, script=script_of("x")),
        sacct_row(802, "tao-x-1-s1", "COMPLETED", T0 + 63, T0 + 64, T0 + 90, script=script_of("x")),
    ]
    found = judged([], rows)
    assert len(found.violations) == 2
    assert all("linked by its batch script or name to 801, 802" in item for item in found.violations)


def test_a_job_named_by_two_trainings_is_contested() -> None:
    job = name(SINGLE, "submit", "9090")
    one = single(RUN1, "9090", 901, T0 + 1, watch_end=T0 + 33)
    other = Run(SINGLE, RUN2).tried("submit", "success", T0 + 1, T0 + 5, f"Adopting SLURM job 901 ({job})")
    other.tried("wait", "success", T0 + 6, T0 + 40)
    rows = [sacct_row(901, job, "COMPLETED", T0 + 3, T0 + 4, T0 + 30)]
    found = judged([one, other], rows)
    assert (
        f"SLURM job 901 ({job}, COMPLETED) is claimed by several trainings: soak_single {RUN1}; soak_single {RUN2}"
        in (found.violations)
    )


def test_a_job_submitted_before_its_training_began_is_a_violation() -> None:
    run = single(RUN1, "a0a0", 1001, T0 + 100, watch_end=T0 + 133)
    rows = [sacct_row(1001, name(SINGLE, "submit", "a0a0"), "COMPLETED", T0 + 50, T0 + 51, T0 + 130)]
    found = judged([run], rows)
    assert len(found.violations) == 2  # before any try began; so no job is tied, and the outcome says so
    assert "was submitted 10:00:50, before any try of it began" in found.violations[0]
    assert found.violations[1] == f"soak_single {RUN1}: Airflow success, SLURM no job (no job)"


def test_two_jobs_of_one_name_that_ran_are_a_violation_and_a_stopped_twin_a_note() -> None:
    job = name(SINGLE, "submit", "b1b1")
    run = single(RUN1, "b1b1", 1101, T0 + 1, watch_end=T0 + 33)
    twin = sacct_row(1102, job, "CANCELLED by 1001", T0 + 3, T0 + 3, T0 + 3, nodes="None assigned")
    ran = sacct_row(1102, job, "COMPLETED", T0 + 3, T0 + 4, T0 + 29, nodes="n2")
    first = sacct_row(1101, job, "COMPLETED", T0 + 3, T0 + 4, T0 + 30)
    found = judged([run], [first, twin])
    assert found.violations == []
    assert found.notes == [f"{job}: a second submission (1102) was cancelled before it ran"]
    found = judged([run], [first, ran])
    assert found.violations == [f"2 SLURM jobs named {job} ran: 1101, 1102"]


# ---------------------------------------------------------------------- watches and outcomes


def test_a_watch_that_ended_before_its_job_is_caught() -> None:
    job = name(SINGLE, "submit", "c2c2")
    rows = [sacct_row(1201, job, "COMPLETED", T0 + 3, T0 + 4, T0 + 60)]
    found = judged([single(RUN1, "c2c2", 1201, T0 + 1, watch_end=T0 + 30.5)], rows)
    assert found.violations == [
        f"soak_single {RUN1}: wait try 1 ended success at 10:00:30, before SLURM job 1201 ({job}, COMPLETED) ended "
        "at 10:01:00 (30 s later)"
    ]
    assert found.watches["watches that ended no earlier than their jobs"] == 0


@pytest.mark.parametrize(
    ("watch_end", "violations"),
    [
        pytest.param(T0 + 60.0, 0, id="the same second"),
        pytest.param(T0 + 59.2, 0, id="End is whole seconds: 0.8 s inside the resolution"),
        pytest.param(T0 + 58.9, 1, id="over a second before"),
    ],
)
def test_the_watch_end_tolerates_slurm_whole_seconds_only(watch_end: float, violations: int) -> None:
    rows = [sacct_row(1301, name(SINGLE, "submit", "d3d3"), "COMPLETED", T0 + 3, T0 + 4, T0 + 60)]
    found = judged([single(RUN1, "d3d3", 1301, T0 + 1, watch_end=watch_end)], rows)
    assert len(found.violations) == violations


def test_a_watch_handed_over_to_its_retry_is_judged_by_the_last_try() -> None:
    job = name(SINGLE, "submit", "e4e4")
    run = (
        Run(SINGLE, RUN1)
        .tried("submit", "success", T0 + 1, T0 + 5)
        .xcom("submit", handle(job, 1401))
        .tried("wait", "failed", T0 + 6, T0 + 20, "Trigger failed")
        .tried("wait", "success", T0 + 23, T0 + 70, f"Going on with SLURM job 1401 ({job})")
    )
    rows = [sacct_row(1401, job, "COMPLETED", T0 + 3, T0 + 4, T0 + 66)]
    found = judged([run], rows)
    assert found.violations == []
    assert found.watches["watch tries handed over to a retry"] == 1


def test_airflow_success_over_a_failed_job_a_sensor_left_deferred_and_a_submit_without_job() -> None:
    failed = single(RUN1, "f5f5", 1501, T0 + 1, watch_end=T0 + 33)
    rows = [sacct_row(1501, name(SINGLE, "submit", "f5f5"), "FAILED", T0 + 3, T0 + 4, T0 + 30, exit_code="3:0")]
    assert judged([failed], rows).violations == [f"soak_single {RUN1}: Airflow success, SLURM FAILED (1501)"]
    deferred = Run(SINGLE, RUN2).tried("submit", "success", T0 + 1, T0 + 5).tried("wait", "deferred", T0 + 6, None)
    deferred.xcom("submit", handle(name(SINGLE, "submit", "0f0f"), 1502))
    rows = [sacct_row(1502, name(SINGLE, "submit", "0f0f"), "COMPLETED", T0 + 3, T0 + 4, T0 + 30)]
    assert judged([deferred], rows).violations == [
        f"soak_single {RUN2}: the sensor ended deferred (SLURM: COMPLETED): not watched to its end"
    ]
    nothing = Run(SINGLE, RUN1).tried("submit", "success", T0 + 1, T0 + 5).tried("wait", "failed", T0 + 6, T0 + 9)
    assert judged([nothing], []).violations == [
        f"soak_single {RUN1}: submit succeeded, but no SLURM job of the soak's user is tied to it"
    ]
    gave_up = Run(SINGLE, RUN1).tried("submit", "failed", T0 + 1, T0 + 5).tried("wait", "upstream_failed", None, None)
    found = judged([gave_up], [])
    assert found.violations == []
    assert found.notes == [
        f"soak_single {RUN1}: the submission failed every try and no SLURM job is tied to it (its task logs)"
    ]


def test_a_job_left_running_is_a_violation() -> None:
    job = name(SINGLE, "submit", "1a1a")
    run = single(RUN1, "1a1a", 1601, T0 + 1, watch_end=T0 + 33)
    jobs = sj.parse_sacct(sacct_row(1601, job, "RUNNING", T0 + 3, T0 + 4, None))
    found = sj.judge(jobs, run.units(), {})
    assert f"SLURM job 1601 ({job}, RUNNING) left RUNNING" in found.violations
    assert f"soak_single {RUN1}: Airflow success, SLURM RUNNING (1601)" in found.violations


# ---------------------------------------------------------------------- stops


def stopped(digest: str, slurm_id: int, stop_at: float, *, watch_end: float) -> Run:
    job = name(SINGLE, "submit", digest)
    return (
        Run(SINGLE, RUN1)
        .tried("submit", "success", T0 + 1, T0 + 5)
        .xcom("submit", handle(job, slurm_id))
        .tried("wait", "failed", T0 + 6, watch_end, "Trigger cancelled by user action, invoking on_kill")
    )


@pytest.mark.parametrize(
    ("state", "end", "stop", "violation"),
    [
        pytest.param("CANCELLED by 1001", T0 + 53, sj.Stop(T0 + 50, "user cancel", bounded=False), "", id="cancelled"),
        pytest.param("CANCELLED", T0 + 400, sj.Stop(T0 + 50, "user cancel", bounded=False), "", id="unbounded"),
        pytest.param(
            "COMPLETED", T0 + 90, sj.Stop(T0 + 50, "user cancel", bounded=False), "did not end CANCELLED", id="ran on"
        ),
        pytest.param(
            "CANCELLED", T0 + 112, sj.Stop(T0 + 50, "run marked failed"), "more than 60 s after the stop", id="late"
        ),
        pytest.param("CANCELLED", T0 + 110, sj.Stop(T0 + 50, "run marked failed"), "", id="within a minute"),
        pytest.param(
            "CANCELLED", T0 + 140, sj.Stop(T0 + 50, "user cancel inside a login-host cut", lifted=T0 + 95), "", id="cut"
        ),
        pytest.param(
            "CANCELLED",
            T0 + 160,
            sj.Stop(T0 + 50, "user cancel inside a login-host cut", lifted=T0 + 95),
            "more than 60 s after the cut was lifted",
            id="cut, then late",
        ),
    ],
)
def test_a_stopped_training_ends_cancelled_in_time(state: str, end: float, stop: Any, violation: str) -> None:
    job = name(SINGLE, "submit", "2b2b")
    run = stopped("2b2b", 1701, stop.at, watch_end=stop.at + 0.3)
    rows = [sacct_row(1701, job, state, T0 + 3, T0 + 4, end)]
    found = judged([run], rows, {(SINGLE, RUN1): stop})
    assert [item for item in found.violations if violation and violation in item] == found.violations
    assert len(found.violations) == (1 if violation else 0)
    assert found.watches[f"stops checked: {stop.how}"] == 1


def test_a_stopped_training_whose_job_ended_on_its_own_as_it_was_stopped_is_a_note() -> None:
    run = stopped("3c3c", 1801, T0 + 50, watch_end=T0 + 50.3)
    rows = [sacct_row(1801, name(SINGLE, "submit", "3c3c"), "COMPLETED", T0 + 3, T0 + 4, T0 + 52)]
    found = judged([run], rows, {(SINGLE, RUN1): sj.Stop(T0 + 50, "sensor marked failed")})
    assert found.violations == []
    assert len(found.notes) == 1
    assert "ended on its own as the user stopped it" in found.notes[0]


def test_a_stopped_training_submits_nothing_after_and_leaves_no_secret() -> None:
    first, second = name(SINGLE, "submit", "4d4d"), name(SINGLE, "wait", "5e5e")
    run = stopped("4d4d", 1901, T0 + 50, watch_end=T0 + 50.3)
    rows = [
        sacct_row(1901, first, "CANCELLED", T0 + 3, T0 + 4, T0 + 52, script=script_of(first)),
        sacct_row(1902, second, "CANCELLED", T0 + 56, T0 + 57, T0 + 58, script=script_of(first)),
    ]
    left = (f"{BASE}/{first}/secrets/env",)
    found = judged([run], rows, {(SINGLE, RUN1): sj.Stop(T0 + 50, "run marked failed", secret_left=left)})
    assert len(found.violations) == 2
    assert f"but SLURM job 1902 ({second}, CANCELLED) was submitted after" in found.violations[0]
    assert found.violations[1].endswith(f"the secret was still in {left[0]} 60 s later")


# ---------------------------------------------------------------------- faults


def test_a_kind_that_missed_takes_the_slot_of_a_repeat_until_it_hits() -> None:
    hit: set[str] = set()
    owed: list[str] = []
    slots = ["stop", "cut", "node", "stop", "node", "node", "stop"]
    outcomes = {"stop": [True], "cut": [False, False, True], "node": [False, True]}
    injected = []
    for scheduled in slots:
        kind = sj.next_kind(scheduled, hit, owed)
        was_hit = outcomes[kind].pop(0) if outcomes[kind] else True
        sj.settle_kind(kind, was_hit, hit, owed)
        injected.append(kind)
    # cut missed in slot 2 and takes the repeats of stop (slot 4) and node (slot 6, node having hit in slot 5).
    assert injected == ["stop", "cut", "node", "cut", "node", "cut", "stop"]
    assert (hit, owed) == ({"stop", "cut", "node"}, [])


def test_every_fault_kind_must_hit_a_running_training() -> None:
    kinds = ("sshd restart", "run stopped while its job runs", "user cancel inside a login-host cut")
    injections = [
        sj.Injection("sshd restart", injected=True, hit=False),
        sj.Injection("sshd restart", injected=True, hit=True),
        sj.Injection("run stopped while its job runs", injected=False, hit=False),
        sj.Injection("user cancel inside a login-host cut", injected=False, hit=True),  # not injected: no hit
    ]
    rows, violations = sj.fault_table(injections, kinds)
    assert rows == [
        ("sshd restart", 2, 2, 1),
        ("run stopped while its job runs", 1, 0, 0),
        ("user cancel inside a login-host cut", 1, 0, 0),
    ]
    assert violations == [
        "fault kind 'run stopped while its job runs' never hit a running training (1 slots, 0 injected)",
        "fault kind 'user cancel inside a login-host cut' never hit a running training (1 slots, 0 injected)",
    ]


# ---------------------------------------------------------------------- the secret


def test_the_secret_is_found_in_a_tree_of_spools_and_logs(tmp_path: Path) -> None:
    secret = "soak-0123456789abcdef"
    spool = tmp_path / "spool"
    (spool / "ctld" / "hash.1" / "job.1701").mkdir(parents=True)
    (spool / "ctld" / "hash.1" / "job.1701" / "environment").write_bytes(b"PATH=/usr/bin\0HOME=/home/u\0")
    (spool / "n1" / "job01701").mkdir(parents=True)
    (spool / "n1" / "job01701" / "slurm_script").write_text(f"#!/bin/bash\nexport RL_TOKEN={secret}\n")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "slurmctld.log").write_text("[2025-06-01T10:00:00] _slurm_rpc_submit_batch_job: JobId=1701\n")
    (tmp_path / "log" / "link").symlink_to(spool / "n1" / "job01701" / "slurm_script")
    scanned: Counter[str] = Counter()
    found = list(sj.leaks([spool, tmp_path / "log", tmp_path / "gone"], secret, scanned, "files"))
    assert found == [spool / "n1" / "job01701" / "slurm_script"]
    assert scanned == Counter({"files": 3})
    assert list(sj.leaks([tmp_path / "log" / "slurmctld.log"], secret, scanned, "files")) == []
    script = spool / "n1" / "job01701" / "slurm_script"
    twice = Counter[str]()
    assert list(sj.leaks([spool / "n1", script], secret, twice, "files")) == [script]  # a dir and a file in it
    assert twice == Counter({"files": 1})


def test_a_trainings_files_are_the_paths_its_xcoms_name() -> None:
    job = name(SINGLE, "submit", "6f6f")
    values = [handle(job, 2001), {"slurm_job_id": "2001", "job_dir": "/elsewhere/x", "results_base": BASE}, None, "12"]
    paths = sj.paths_under(values, BASE)
    assert paths == [
        f"{BASE}/{job}",
        f"{BASE}/{job}/results",
        f"{BASE}/{job}/logs",
        f"{BASE}/records/{job}.json",
        f"{BASE}/{job}/secrets/env",
    ]
    assert sj.paths_under('{"log_dir": "' + BASE + '/l"}', BASE) == [f"{BASE}/l"]


# ---------------------------------------------------------------------- owing the provider nothing


def test_the_judge_imports_the_standard_library_only() -> None:
    tree = ast.parse(_PATH.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            modules.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
    assert modules - {"__future__"} <= set(sys.stdlib_module_names), modules
