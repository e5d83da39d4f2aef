"""The soak's judge (``tests/cluster/soak.py``): what Airflow was asked to do against what SLURM ran, owing the provider
nothing (issue 49, item 4).

Its sources, and only these:

- **Airflow's REST API**, read once every run has ended: the soak DAGs' runs, each run's task instances (task id, map
  index, state), each task instance's tries (``/taskInstances/{task}/tries``, or ``/{task}/{map_index}/tries``: try
  number, state, start, end), each try's log (``/taskInstances/{task}/logs/{try}``) and each task instance's XCom
  entries (``/xcomEntries``). That is Airflow's own record of what each task try did.
- **SLURM's accounting**: ``sacct -X -D -P -n -u <soak user> -S <soak start>`` (every job of the soak's cluster user,
  each run of a requeued job on its own row: ``JobIDRaw, JobName, State, Submit, Start, End, ExitCode, Partition,
  NodeList, SubmitLine``), and ``squeue`` for what accounting has not caught up with.

This module imports nothing from ``airflow_provider_tao_slurm``: no job name is minted here, no job record or file
layout of the provider is read. (``soak.py`` still reads the provider's records, as an audit of them against
accounting; nothing here depends on it.)

How a SLURM job is tied to a task try
-------------------------------------
1. **Its training** (a DAG run and a map index, "unit" below) is the one whose tries name the job: its SLURM name, as
   accounting has it, stands as a whole word in the log of one of the unit's tries or in one of its XCom values
   (:func:`name_tokens`). The name is compared as an opaque string: never derived from the DAG, run or task, and the
   words around it do not matter. A name is unique to its training on this cluster (every run mints its own), so a
   job named in two trainings' evidence is *contested*: a violation.
2. Jobs SLURM ran **from the same batch script** (the absolute path that ends ``SubmitLine``, SLURM's record of the
   submitting command) or **under the same name** go together: a resubmission or the next slice of a chain reruns its
   training's staged script, so one that Airflow's logs do not name is still tied to its training, by SLURM's own
   record. A requeued job keeps its id: its runs are one job.
   A group of jobs so linked that no unit names is an **orphan**: a violation, whatever its name.
3. **The try** is the one of the unit's tries (its submit task or its watching sensor, at its map index) whose
   ``[start, end]`` holds the job's first ``Submit`` (1 s of slack: SLURM keeps whole seconds). A job submitted after
   its try ended and before the next began (a task process killed between ``sbatch`` and its reply: the retry adopts the
   job) goes to the try that started last before it. A job submitted before any try of its unit began cannot be that
   unit's work: a violation.

Why this owes the provider nothing: the expected work is Airflow's (runs, task instances, tries, map indexes); the jobs
are SLURM's; the tie between them is a string that both Airflow's record of a try and SLURM's accounting carry, or the
batch script SLURM says it ran. A provider that named a job nowhere in Airflow, or submitted one from a stray script,
gets an orphan; one that claimed another training's job gets a contested job. The words searched are what the task
wrote into Airflow's log and XCom (the submit task's return value names its job; a resubmission is logged), but they
are read as Airflow keeps them and only tested for the name: had the provider stopped writing names there, its jobs
would turn up as orphans, a false alarm, never a pass. Jobs SLURM took before the soak began are taken out first
(:func:`submitted_before`): ``sacct -S`` lists a job still live after the start too.

What is judged (:func:`judge`): every job matched or flagged; nothing left pending or running; no name that ran twice;
each training's final watch state against its last job's end state (``success`` iff ``COMPLETED``); every watch's end
no earlier than the end of every job of its training (a sensor that ended early is caught); a training the user stopped
(its sensor marked failed, its run marked failed, a cancel inside a login-host cut) has every job that still lived then
end ``CANCELLED`` (within :data:`STOP_DEADLINE_S` of the stop, or of the cut's end, for the soak's own stops; one that
ended on its own within :data:`STOP_RACE_S` of the stop is a note), nothing submitted after, and no file of it holding
the secret a minute on; every fault kind hit a running training at least once
(:func:`fault_table`). :func:`leaks` searches file trees for the secret.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

#: Slack for comparing Airflow's timestamps (microseconds) with SLURM's (whole seconds, truncated): same machine, same
#: clock, so no skew beyond that resolution.
RESOLUTION_S = 1.0
#: Seconds within which every job of a stopped training must have ended CANCELLED (counted from the end of the
#: login-host cut the stop fell in, if any), and after which no file of the training may hold the secret.
STOP_DEADLINE_S = 60.0
#: Seconds after a stop within which a job may still end on its own (COMPLETED, FAILED) before the cancel lands: the
#: triggerer notices the user's action and runs ``scancel`` over SSH in that time. A later natural end is a violation.
STOP_RACE_S = 10.0
#: The sacct fields the judge reads, in this order (``SubmitLine`` last: it may hold ``|``).
SACCT_FIELDS = (
    "JobIDRaw",
    "JobName",
    "State",
    "Submit",
    "Start",
    "End",
    "ExitCode",
    "Partition",
    "NodeList",
    "SubmitLine",
)
#: The squeue format of the live jobs accounting may not list yet (``%V``: submit time).
SQUEUE_FORMAT = "%i|%j|%T|%V|%N"
#: Job states of a job that has not ended.
LIVE = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUED",
        "SUSPENDED",
        "RESIZING",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
    }
)
#: Airflow states of a task instance that has ended.
FINISHED = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})
#: NodeList of a job that never got nodes.
NO_NODES = frozenset({"", "None assigned", "(null)", "None"})
_UNSET_TIMES = frozenset({"", "Unknown", "None", "N/A", "(null)"})
_NAME_RUN = re.compile(r"[A-Za-z0-9_.-]+")
_HOSTLIST = re.compile(r"([^,\[]+)(?:\[([^\]]*)\])?(?:,|$)")

UnitKey = tuple[str, str, int]
TryKey = tuple[str, int]


# ---------------------------------------------------------------------- SLURM's side


def slurm_time(text: str, tz: tzinfo | None = None) -> float | None:
    """Epoch seconds of a SLURM timestamp: ``SLURM_TIME_FORMAT=%s`` digits, or ISO local time (``tz``, else this
    machine's zone); None when unset (``Unknown``, ``None``)."""
    text = text.strip()
    if text in _UNSET_TIMES:
        return None
    if text.isdigit():
        return float(text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz) if tz is not None else parsed.astimezone()
    return parsed.timestamp()


def first_word(state: str) -> str:
    """``CANCELLED by 1001`` -> ``CANCELLED``; ``CANCELLED+`` -> ``CANCELLED``."""
    words = state.split()
    return words[0].rstrip("+") if words else ""


def batch_script(submit_line: str) -> str:
    """The batch script SLURM ran: the absolute path that ends ``SubmitLine`` ('' for ``--wrap`` or anything else)."""
    words = submit_line.split()
    last = words[-1] if words else ""
    return last if last.startswith("/") and "=" not in last else ""


@dataclass(frozen=True)
class JobRun:
    """One run of a job (one row of ``sacct -D``: a requeued job has one per run)."""

    state: str
    submit: float | None
    start: float | None
    end: float | None
    exit_code: str = ""
    partition: str = ""
    nodes: str = ""

    @property
    def ran(self) -> bool:
        """Whether this run got nodes (a job cancelled while pending has a Start, but no nodes)."""
        return self.nodes.strip() not in NO_NODES


@dataclass
class Job:
    """One SLURM job of the soak's user: its id, name, every run, and the command line it was submitted with."""

    job_id: str
    name: str
    runs: list[JobRun] = field(default_factory=list)
    submit_line: str = ""

    @property
    def final(self) -> JobRun:
        return self.runs[-1]

    @property
    def state(self) -> str:
        return self.final.state

    @property
    def end(self) -> float | None:
        """When it ended (its last run's End), None while it lives."""
        return None if self.state in LIVE else self.final.end

    @property
    def first_submit(self) -> float | None:
        times = [run.submit for run in self.runs if run.submit is not None]
        return min(times) if times else None

    @property
    def ran(self) -> bool:
        return any(run.ran for run in self.runs)

    @property
    def script(self) -> str:
        return batch_script(self.submit_line)

    def describe(self) -> str:
        return f"SLURM job {self.job_id} ({self.name or 'no name'}, {self.state or 'no state'})"


def parse_sacct(text: str, tz: tzinfo | None = None) -> dict[str, Job]:
    """Every job of ``sacct -X -D -P -n -o <SACCT_FIELDS>`` output, its runs in accounting's order; other lines (a
    warning on stderr) are skipped."""
    jobs: dict[str, Job] = {}
    for line in text.splitlines():
        parts = line.split("|", len(SACCT_FIELDS) - 1)
        if len(parts) != len(SACCT_FIELDS) or not parts[0].strip().isdigit():
            continue
        job_id, name, state, submit, start, end, exit_code, partition, nodes, submit_line = (p.strip() for p in parts)
        job = jobs.setdefault(job_id, Job(job_id, name))
        job.name = job.name or name
        job.submit_line = job.submit_line or submit_line
        job.runs.append(
            JobRun(
                state=first_word(state),
                submit=slurm_time(submit, tz),
                start=slurm_time(start, tz),
                end=slurm_time(end, tz),
                exit_code=exit_code,
                partition=partition,
                nodes=nodes,
            )
        )
    return jobs


def add_squeue(jobs: dict[str, Job], text: str, tz: tzinfo | None = None) -> list[str]:
    """Add the live jobs of ``squeue -h -t all -o <SQUEUE_FORMAT>`` that accounting does not list yet, or lists in an
    older state; return their ids."""
    added = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        job_id, name, state, submit, nodes = parts
        state = first_word(state)
        known = jobs.get(job_id)
        if known is not None and (known.state not in LIVE or state not in LIVE):
            continue  # accounting has its end, or squeue only keeps a finished one around
        if known is None:
            jobs[job_id] = Job(job_id, name, [JobRun(state, slurm_time(submit, tz), None, None, nodes=nodes)])
        else:
            known.runs.append(JobRun(state, known.final.submit, known.final.start, None, nodes=nodes))
        added.append(job_id)
    return added


def submitted_before(jobs: dict[str, Job], moment: float) -> dict[str, Job]:
    """Take out of ``jobs`` and return the ones SLURM took before ``moment`` (the soak's start): ``sacct -S`` lists a
    job that was still live after the start time too, and a job from before the soak is no training's."""
    before = {
        job_id: job
        for job_id, job in jobs.items()
        if job.first_submit is not None and job.first_submit < moment - RESOLUTION_S
    }
    for job_id in before:
        del jobs[job_id]
    return before


def expand_nodes(nodelist: str) -> list[str]:
    """SLURM's host list, expanded: ``n[1-2],n4`` -> ``[n1, n2, n4]`` (``None assigned`` -> nothing)."""
    if nodelist.strip() in NO_NODES:
        return []
    nodes: list[str] = []
    for prefix, ranges in _HOSTLIST.findall(nodelist.strip()):
        if not ranges:
            nodes.append(prefix)
            continue
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not high:
                nodes.append(f"{prefix}{low}")
                continue
            nodes.extend(f"{prefix}{number:0{len(low)}d}" for number in range(int(low), int(high) + 1))
    return nodes


@dataclass(frozen=True)
class Running:
    """A job squeue lists RUNNING (``%i|%j|%N``)."""

    job_id: str
    name: str
    nodes: tuple[str, ...]


def parse_running(text: str) -> list[Running]:
    """The jobs of ``squeue -h -t RUNNING -o %i|%j|%N``."""
    found = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) == 3 and parts[0].isdigit():
            found.append(Running(parts[0], parts[1], tuple(expand_nodes(parts[2]))))
    return found


# ---------------------------------------------------------------------- Airflow's side


def airflow_time(text: str | None) -> float | None:
    """Epoch seconds of an Airflow API timestamp (``2025-06-01T10:00:03.123456Z``); None when unset."""
    if not text:
        return None
    parsed = datetime.fromisoformat(text)
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


def flatten(value: Any) -> str:
    """Every string and number in a JSON value (an XCom, a log event), one per line."""
    if isinstance(value, Mapping):
        return "\n".join(f"{key}\n{flatten(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return "\n".join(flatten(item) for item in value)
    return "" if value is None else str(value)


def log_text(answer: Mapping[str, Any]) -> str:
    """The text of a try's log, as the logs endpoint answers in JSON (``content``: structured events or lines)."""
    return flatten(answer.get("content") or [])


def name_tokens(text: str) -> set[str]:
    """Every word that could be a SLURM job name in ``text``: each run of ``[A-Za-z0-9_.-]``, sentence punctuation
    (a trailing ``.`` or ``-``) dropped. ``job-a`` is not found in ``job-a-s1`` nor in ``/x/job-a.json``."""
    return {token.rstrip(".-") for token in _NAME_RUN.findall(text)} - {""}


@dataclass(frozen=True)
class Try:
    """One try of a task instance, as Airflow keeps it."""

    task_id: str
    map_index: int
    try_number: int
    state: str
    start: float | None
    end: float | None

    @property
    def key(self) -> TryKey:
        return (self.task_id, self.try_number)

    def holds(self, moment: float, slack: float = 0.0) -> bool:
        """Whether ``moment`` falls in this try's ``[start, end]`` (an open end while it runs)."""
        if self.start is None:
            return False
        return self.start - slack <= moment <= (self.end if self.end is not None else float("inf")) + slack

    def describe(self) -> str:
        return f"{self.task_id} try {self.try_number}"


def parse_tries(answer: Mapping[str, Any]) -> list[Try]:
    """The tries of the tries endpoint's answer (``task_instances``: one entry per try, the current one included)."""
    tries = []
    for item in answer.get("task_instances") or []:
        if int(item.get("try_number") or 0) < 1:
            continue  # never queued: nothing ran
        tries.append(
            Try(
                task_id=str(item["task_id"]),
                map_index=int(item.get("map_index", -1)),
                try_number=int(item["try_number"]),
                state=str(item.get("state")),
                start=airflow_time(item.get("start_date")),
                end=airflow_time(item.get("end_date")),
            )
        )
    return sorted(tries, key=lambda t: t.try_number)


@dataclass
class Unit:
    """One training: a DAG run at one map index (-1 when not mapped), its task instances' states, every try, and the
    words each try's log and XCom hold."""

    dag_id: str
    run_id: str
    map_index: int
    states: dict[str, str] = field(default_factory=dict)
    tries: list[Try] = field(default_factory=list)
    tokens: dict[TryKey, set[str]] = field(default_factory=dict)

    @property
    def key(self) -> UnitKey:
        return (self.dag_id, self.run_id, self.map_index)

    @property
    def label(self) -> str:
        return f"{self.dag_id} {self.run_id}" + (f" [{self.map_index}]" if self.map_index >= 0 else "")

    def names(self, name: str) -> list[TryKey]:
        """The tries whose log or XCom names ``name``."""
        return [key for key, words in self.tokens.items() if name in words]


def build_units(
    dag_id: str,
    run_id: str,
    task_instances: Sequence[Mapping[str, Any]],
    tries: Mapping[tuple[str, int], Mapping[str, Any]],
    logs: Mapping[tuple[str, int, int], str],
    xcoms: Mapping[tuple[str, int], str],
) -> list[Unit]:
    """A run's units from the API's answers: one per map index its task instances have (-1 when none is mapped); a
    task instance at -1 in a mapped run (a mapped task that never expanded) belongs to each.

    :param task_instances: the run's ``/taskInstances`` answer's ``task_instances``.
    :param tries: ``{(task id, map index): tries endpoint answer}``.
    :param logs: ``{(task id, map index, try number): log text}``.
    :param xcoms: ``{(task id, map index): every XCom value of the task instance, as text}`` (Airflow keeps a task
        instance's XCom of its latest try only: it counts as that try's).
    """
    indexes = sorted({int(ti["map_index"]) for ti in task_instances if int(ti["map_index"]) >= 0}) or [-1]
    units = []
    for index in indexes:
        unit = Unit(dag_id, run_id, index)
        # The expanded instance at this index first: it wins over an unexpanded one of the same task.
        for ti in sorted(task_instances, key=lambda ti: int(ti["map_index"]) == -1):
            task_id, map_index = str(ti["task_id"]), int(ti["map_index"])
            if map_index not in (index, -1) or task_id in unit.states:
                continue
            unit.states[task_id] = str(ti.get("state"))
            attempts = parse_tries(tries.get((task_id, map_index)) or {})
            unit.tries += attempts
            for attempt in attempts:
                words = name_tokens(logs.get((task_id, map_index, attempt.try_number), ""))
                if attempt.try_number == int(ti.get("try_number") or 0):
                    words |= name_tokens(xcoms.get((task_id, map_index), ""))
                unit.tokens[attempt.key] = words
        unit.tries.sort(key=lambda t: (t.start is None, t.start or 0.0, t.task_id, t.try_number))
        units.append(unit)
    return units


# ---------------------------------------------------------------------- matching


@dataclass(frozen=True)
class Claim:
    """A job's training and try, and how it was tied."""

    unit: UnitKey
    attempt: TryKey | None
    how: str
    after_try: bool = False


@dataclass
class Matching:
    """Every job of the user: claimed by one training, an orphan, contested, or submitted before its training began."""

    claims: dict[str, Claim] = field(default_factory=dict)
    orphans: dict[str, str] = field(default_factory=dict)
    contested: dict[str, list[UnitKey]] = field(default_factory=dict)
    early: dict[str, UnitKey] = field(default_factory=dict)


def _groups(jobs: Mapping[str, Job]) -> list[list[str]]:
    """Jobs linked by SLURM's record: one batch script, or one name (union-find)."""
    parent = {job_id: job_id for job_id in jobs}

    def find(item: str) -> str:
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    links: dict[str, list[str]] = defaultdict(list)
    for job_id, job in jobs.items():
        if job.script:
            links[f"script {job.script}"].append(job_id)
        if job.name:
            links[f"name {job.name}"].append(job_id)
    for members in links.values():
        for other in members[1:]:
            parent[find(other)] = find(members[0])
    groups: dict[str, list[str]] = defaultdict(list)
    for job_id in sorted(jobs, key=int):
        groups[find(job_id)].append(job_id)
    return list(groups.values())


def owning_try(unit: Unit, submitted: float | None) -> tuple[Try | None, bool]:
    """The try of ``unit`` that submitted a job at ``submitted``, and whether that was after the try had ended.

    :returns: ``(None, False)`` when the job was submitted before any try of the unit began (or has no Submit).
    """
    started = [t for t in unit.tries if t.start is not None]
    if submitted is None or not started:
        return None, False
    for slack in (0.0, RESOLUTION_S):
        inside = [t for t in started if t.holds(submitted, slack)]
        if inside:
            return max(inside, key=lambda t: t.start or 0.0), False
    before = [t for t in started if (t.start or 0.0) - RESOLUTION_S <= submitted]
    if before:
        return max(before, key=lambda t: t.start or 0.0), True
    return None, False


def match_jobs(jobs: Mapping[str, Job], units: Sequence[Unit]) -> Matching:
    """Tie every job to a training and a try (see the module's docstring), or say why it could not be."""
    matching = Matching()
    by_key = {unit.key: unit for unit in units}
    named = {job_id: {unit.key for unit in units if job.name and unit.names(job.name)} for job_id, job in jobs.items()}
    for group in _groups(jobs):
        claimants = sorted(set().union(*(named[job_id] for job_id in group)))
        if len(claimants) > 1:
            for job_id in group:
                matching.contested[job_id] = claimants
            continue
        if not claimants:
            for job_id in group:
                linked = f"; linked by its batch script or name to {', '.join(group)}" if len(group) > 1 else ""
                matching.orphans[job_id] = f"no task try's log or XCom names it{linked}"
            continue
        unit = by_key[claimants[0]]
        anchors = [job_id for job_id in group if named[job_id]]
        for job_id in group:
            job = jobs[job_id]
            if named[job_id]:
                how = "named by " + ", ".join(f"{task} try {number}" for task, number in unit.names(job.name))
            elif job.script and any(jobs[a].script == job.script for a in anchors):
                how = f"same batch script as job {next(a for a in anchors if jobs[a].script == job.script)}"
            else:
                how = f"linked through jobs {', '.join(group)}"
            attempt, after = owning_try(unit, job.first_submit)
            if attempt is None:
                matching.early[job_id] = unit.key
                continue
            matching.claims[job_id] = Claim(unit.key, attempt.key, how, after)
    return matching


# ---------------------------------------------------------------------- judging


@dataclass(frozen=True)
class Stop:
    """A training the user stopped: when, how, and what the soak saw of its files a minute later.

    :param lifted: when the login-host cut the stop fell in was lifted (the deadline counts from there).
    :param bounded: whether its jobs must end within :data:`STOP_DEADLINE_S` (a plain user cancel is not bounded).
    :param secret_left: files of the training that still held the secret :data:`STOP_DEADLINE_S` after the stop
        (or the cut's end).
    """

    at: float
    how: str
    lifted: float | None = None
    bounded: bool = True
    secret_left: tuple[str, ...] = ()

    @property
    def deadline(self) -> float | None:
        if not self.bounded:
            return None
        return (self.lifted if self.lifted is not None else self.at) + STOP_DEADLINE_S


@dataclass
class Findings:
    """What the judge (and the soak's own scans) found."""

    outcomes: Counter[str] = field(default_factory=Counter)
    #: How the jobs were tied to tries.
    matching: Counter[str] = field(default_factory=Counter)
    #: The watches and stops checked.
    watches: Counter[str] = field(default_factory=Counter)
    #: How much else was read: files, XCom entries, logs.
    evidence: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _at(moment: float | None) -> str:
    return "never" if moment is None else datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S")


def judge(
    jobs: Mapping[str, Job],
    units: Sequence[Unit],
    stops: Mapping[tuple[str, str], Stop],
    *,
    watch_task: str = "wait",
    submit_task: str = "submit",
    kinds: Mapping[str, str] | None = None,
) -> Findings:
    """Every check of the soak that Airflow's API and SLURM's accounting answer (see the module's docstring).

    :param stops: ``{(dag id, run id): Stop}``, the trainings the user stopped.
    :param kinds: ``{dag id: kind}`` for the outcome table (the DAG id itself otherwise).
    """
    found = Findings()
    matching = match_jobs(jobs, units)
    _judge_jobs(found, jobs, matching, {unit.key: unit for unit in units})
    owned: dict[UnitKey, list[Job]] = defaultdict(list)
    for job_id, claim in matching.claims.items():
        owned[claim.unit].append(jobs[job_id])
    for unit in units:
        own = sorted(owned.get(unit.key, []), key=lambda j: (j.first_submit or 0.0, int(j.job_id)))
        _judge_unit(found, unit, own, stops.get((unit.dag_id, unit.run_id)), watch_task, submit_task, kinds or {})
    runs = {(unit.dag_id, unit.run_id) for unit in units}
    found.matching.update(
        {
            "DAG runs (Airflow)": len(runs),
            "trainings: runs x map indexes (Airflow)": len(units),
            "mapped indexes (Airflow)": sum(unit.map_index >= 0 for unit in units),
            "task tries (Airflow)": sum(len(unit.tries) for unit in units),
            "SLURM jobs of the soak's user (sacct, squeue)": len(jobs),
            "jobs matched to a task try": len(matching.claims),
            "matched by their name in a try's log or XCom": sum(
                claim.how.startswith("named") for claim in matching.claims.values()
            ),
            "matched by their batch script or name (SLURM's SubmitLine)": sum(
                not claim.how.startswith("named") for claim in matching.claims.values()
            ),
            "submitted by a watch try (a resubmission, a next slice)": sum(
                claim.attempt is not None and claim.attempt[0] == watch_task for claim in matching.claims.values()
            ),
            "submitted after their try ended (adopted by the next)": sum(
                claim.after_try for claim in matching.claims.values()
            ),
            "requeued (one id, several runs)": sum(len(job.runs) > 1 for job in jobs.values()),
            "orphans (no training)": len(matching.orphans),
            "contested (several trainings)": len(matching.contested),
        }
    )
    return found


def _judge_jobs(found: Findings, jobs: Mapping[str, Job], matching: Matching, units: Mapping[UnitKey, Unit]) -> None:
    """The checks of each job alone: matched, ended, never run twice under one name."""
    for job_id, why in sorted(matching.orphans.items(), key=lambda item: int(item[0])):
        job = jobs[job_id]
        found.violations.append(f"{job.describe()}, submitted {_at(job.first_submit)}, is an orphan: {why}")
    for job_id, keys in sorted(matching.contested.items(), key=lambda item: int(item[0])):
        labels = "; ".join(units[key].label for key in keys)
        found.violations.append(f"{jobs[job_id].describe()} is claimed by several trainings: {labels}")
    for job_id, key in sorted(matching.early.items(), key=lambda item: int(item[0])):
        job = jobs[job_id]
        found.violations.append(
            f"{job.describe()} of {units[key].label} was submitted {_at(job.first_submit)}, before any try of it began"
        )
    for _, job in sorted(jobs.items(), key=lambda item: int(item[0])):
        if job.state in LIVE:
            found.violations.append(f"{job.describe()} left {job.state}")
    by_name: dict[str, list[Job]] = defaultdict(list)
    for job in jobs.values():
        if job.name:
            by_name[job.name].append(job)
    for name, group in sorted(by_name.items()):
        ran = [job.job_id for job in group if job.ran]
        if len(ran) > 1:
            found.violations.append(f"{len(ran)} SLURM jobs named {name} ran: {', '.join(sorted(ran, key=int))}")
        elif len(group) > 1:
            stopped = sorted((job.job_id for job in group if not job.ran), key=int)
            found.notes.append(f"{name}: a second submission ({', '.join(stopped)}) was cancelled before it ran")
            found.matching["second submissions stopped before they ran"] += len(stopped)


def _judge_unit(
    found: Findings,
    unit: Unit,
    own: list[Job],
    stop: Stop | None,
    watch_task: str,
    submit_task: str,
    kinds: Mapping[str, str],
) -> None:
    """The checks of one training: its outcome, its watch's end, its stop."""
    watch_state = unit.states.get(watch_task, "no watch")
    ran = [job for job in own if job.ran]
    last = (ran or own)[-1] if own else None
    truth = last.state if last is not None else "no job"
    label = unit.label
    outcome = f"{kinds.get(unit.dag_id, unit.dag_id)}: {watch_state} / {truth}" + (f" ({stop.how})" if stop else "")
    found.outcomes[outcome] += 1
    watches = [t for t in unit.tries if t.task_id == watch_task and t.start is not None]
    final = max(watches, key=lambda t: t.try_number) if watches else None
    found.watches["watch tries handed over to a retry"] += sum(t is not final for t in watches)
    if stop is not None:
        _judge_stop(found, unit, own, stop, watch_state)
        return
    if watch_state not in FINISHED:
        found.violations.append(f"{label}: the sensor ended {watch_state} (SLURM: {truth}): not watched to its end")
    elif (watch_state == "success") != (truth == "COMPLETED"):
        found.violations.append(f"{label}: Airflow {watch_state}, SLURM {truth} ({last.job_id if last else 'no job'})")
    elif last is None and unit.states.get(submit_task) == "success":
        found.violations.append(f"{label}: {submit_task} succeeded, but no SLURM job of the soak's user is tied to it")
    elif last is None:
        found.notes.append(f"{label}: the submission failed every try and no SLURM job is tied to it (its task logs)")
    if final is None or final.state not in ("success", "failed") or final.end is None:
        return
    found.watches["watches that ended success or failed, checked"] += 1
    early = [job for job in own if job.end is None or job.end > final.end + RESOLUTION_S]
    for job in early:
        if job.end is None and job.state in LIVE:
            continue  # left live: said once, above
        found.violations.append(
            f"{label}: {final.describe()} ended {final.state} at {_at(final.end)}, before {job.describe()} ended"
            + (f" at {_at(job.end)} ({job.end - final.end:.0f} s later)" if job.end is not None else "")
        )
    if not early:
        found.watches["watches that ended no earlier than their jobs"] += 1


def _judge_stop(found: Findings, unit: Unit, own: list[Job], stop: Stop, watch_state: str) -> None:
    """A stopped training: what still lived then ends CANCELLED (in time), nothing comes after, the secret goes."""
    label = f"{unit.label}: {stop.how} at {_at(stop.at)}"
    found.watches[f"stops checked: {stop.how}"] += 1
    if watch_state not in FINISHED:
        found.violations.append(f"{label}, but its sensor is still {watch_state}")
    after = [job for job in own if job.first_submit is not None and job.first_submit > stop.at + RESOLUTION_S]
    for job in after:
        found.violations.append(f"{label}, but {job.describe()} was submitted after, at {_at(job.first_submit)}")
    living = [
        job
        for job in own
        if job not in after and (job.end is None or job.end >= stop.at - RESOLUTION_S or job.state in LIVE)
    ]
    if not living:
        found.notes.append(f"{label}: every job of it had ended already")
    deadline = stop.deadline
    for job in living:
        if job.state != "CANCELLED":
            if job.end is not None and job.state not in LIVE and job.end <= stop.at + STOP_RACE_S:
                found.notes.append(f"{label}: {job.describe()} ended on its own as the user stopped it")
                continue
            found.violations.append(f"{label}, but {job.describe()} did not end CANCELLED")
        elif deadline is not None and (job.end is None or job.end > deadline + RESOLUTION_S):
            since = "the cut was lifted" if stop.lifted is not None else "the stop"
            late = f"at {_at(job.end)}" if job.end is not None else "never"
            found.violations.append(
                f"{label}: {job.describe()} ended {late}, more than {STOP_DEADLINE_S:.0f} s after {since}"
            )
        else:
            found.watches["stopped jobs that ended CANCELLED in time"] += 1
    for path in stop.secret_left:
        found.violations.append(f"{label}: the secret was still in {path} {STOP_DEADLINE_S:.0f} s later")


# ---------------------------------------------------------------------- faults


@dataclass(frozen=True)
class Injection:
    """One fault as it went: injected or not, and whether a training's job was RUNNING (asked of SLURM) then."""

    kind: str
    injected: bool
    hit: bool


def next_kind(scheduled: str, hit: set[str], owed: list[str]) -> str:
    """The kind to inject in a slot scheduled for ``scheduled``: a kind that has not hit a running training yet
    (``owed``, the oldest first) takes the slot of a kind that has; ``owed`` loses the kind returned."""
    if scheduled in hit and owed:
        return owed.pop(0)
    if scheduled in owed:
        owed.remove(scheduled)
    return scheduled


def settle_kind(kind: str, was_hit: bool, hit: set[str], owed: list[str]) -> None:
    """Note how an injection of ``kind`` went: a miss leaves the kind owed until one hits."""
    if was_hit:
        hit.add(kind)
        if kind in owed:
            owed.remove(kind)
    elif kind not in hit and kind not in owed:
        owed.append(kind)


def fault_table(
    injections: Iterable[Injection], kinds: Sequence[str]
) -> tuple[list[tuple[str, int, int, int]], list[str]]:
    """``(kind, slots, injected, hit a running training)`` per kind, and a violation per kind that never hit."""
    tried: Counter[str] = Counter()
    injected: Counter[str] = Counter()
    hits: Counter[str] = Counter()
    for item in injections:
        tried[item.kind] += 1
        injected[item.kind] += item.injected
        hits[item.kind] += item.injected and item.hit
    rows = [(kind, tried[kind], injected[kind], hits[kind]) for kind in kinds]
    violations = [
        f"fault kind {kind!r} never hit a running training ({tried[kind]} slots, {injected[kind]} injected)"
        for kind in kinds
        if not hits[kind]
    ]
    return rows, violations


# ---------------------------------------------------------------------- the secret


def leaks(
    roots: Iterable[Path], secret: str, scanned: Counter[str], label: str = "files searched for the secret"
) -> Iterator[Path]:
    """Every file under ``roots`` (a file, or a directory searched through) holding ``secret``, each once however many
    roots hold it; counts the files read under ``label`` in ``scanned``. Unreadable files and vanished ones (a job's
    spool removed meanwhile) are skipped."""
    needle = secret.encode()
    seen: set[Path] = set()
    for root in roots:
        if root.is_file():
            paths: Iterable[Path] = [root]
        elif root.is_dir():
            paths = sorted(path for path in root.rglob("*") if path.is_file() and not path.is_symlink())
        else:
            continue
        for path in paths:
            if path in seen:
                continue
            seen.add(path)
            with contextlib.suppress(OSError):
                data = path.read_bytes()
                scanned[label] += 1
                if needle in data:
                    yield path


def paths_under(value: Any, base: str) -> list[str]:
    """The absolute paths under ``base`` that a JSON value (a training's XComs) mentions, each once.

    ``base`` itself is left out: every job handle names it (``results_base``), and it holds every training's files
    (searched for a stopped training's secret, it found the sidecars of the trainings still running).
    """
    found: list[str] = []
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.values()
    elif isinstance(value, list | tuple):
        items = value
    else:
        text = value if isinstance(value, str) else ""
        if text.startswith(base.rstrip("/") + "/"):
            return [text]
        with contextlib.suppress(ValueError):
            if text.startswith(("{", "[")):
                return paths_under(json.loads(text), base)
        return []
    for item in items:
        found += [path for path in paths_under(item, base) if path not in found]
    return found
