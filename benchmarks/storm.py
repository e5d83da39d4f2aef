"""A sweep's submit storm through a real Airflow, and the RPCs each path sends against SLURM's rate limit.

Issue 35, items 9 and 10.

**The storm** (item 9): ``airflow standalone`` (``tests/cluster/airflow_stack.py``: api-server,
scheduler with the LocalExecutor, dag-processor, triggerer) with ``parallelism`` :data:`PARALLELISM`
runs a DAG written here: ONE :class:`SbatchSubmitOperator` mapped over :data:`TASKS` commands
(``.expand``), tiny jobs (1 CPU, 1 GPU, ``sleep 1``, the one-minute partition, no retries). Its
``slurm_default`` connection goes to a login sshd of its own, configured as the harness's
``sshd-limits`` (OpenSSH's default ``MaxStartups 10:30:100``, ``MaxSessions 10``, PAM on as on a real
login node; the harness's one serves other benchmarks meanwhile) and has no ``rpc_*`` extras: the
provider paces the submissions as users get it by default, i.e. where the cluster's slurmctld limits RPCs
(``rl_enable``) and not where it does not. Figures: the time from the first task's start to the last task's end (its
job submitted), jobs by name (each task's job exactly once: squeue + sacct), failed tasks (REST API),
logins and refused connections (its sshd's log: ``Accepted publickey``, ``drop connection``), and the
cluster user's slurmctld RPCs per submission.

**The RPCs of each path** (item 10): ``sdiag``'s per-user counts, sampled every :data:`SAMPLE_S`
seconds, give how many slurmctld RPCs the cluster user sent while a path ran, and when: one submission
(``execute`` in this process, as ``benchmarks/submit.py``), one job's whole life (the same submission, then
its job runs ``sleep 1`` and ends by itself; the count closes once squeue, asked as root, shows it ended: the
container step's RPCs and whatever the job asks slurmctld at its end are in it), once without ``secret_env``
and once with it (its sidecar asks ``scontrol show job`` once at the end), each against what the provider's
pacing takes per submission (``SUBMISSION_RPCS``), one status poll of :data:`WATCHED` held jobs
by the hook's ``get_states`` on a hook that polled before (the batched query the shared poller sends per
interval), and the same on a fresh hook (the first poll after a triggerer restart: the triggers only
subscribe; their first poll is this query on a new connection). Other work on the cluster runs as the
same user, and its RPCs only add to a count: each path runs :data:`ROUNDS` times and counts the fewest.
The storm's RPCs are the cluster user's RPCs as the samples saw them arrive, from the trigger to the
last task's end; the count less the user's background rate measured just before is printed beside them.
Each timeline goes through a simulated default ``rl_enable`` bucket (``benchmarks/ratelimit.py``: 30
tokens, refilled 2 per second); the storm's RPCs also as one burst, as they would arrive with enough
workers and cores. A path of a few RPCs cannot be throttled by a full bucket of 30: those rows are
information, and only the storm's row is judged (0 throttled), where the provider paced it (the site has
``rl_enable``).

**With slurmctld's rate limit on** (``--rate-limit rl_enable,...``, SLURM 23.02 and later; ``make
bench-release`` on 26.05): ``harness.py rate-limit`` sets it for the whole run and turns it off again at the
end, whatever happens (the provider's cached reading of the site's limiter is removed both times), the
results go to ``storm@<release>-rl.json``, and the provider paces the submissions (four fifths of the site's
bucket). Beside the simulated bucket, slurmctld's own refusals of the cluster user's RPCs during the storm
are counted in its log ("RPC rate limit exceeded by uid ..."): judged (none) where the site limits RPCs. The
status polls of :data:`WATCHED` held jobs are left out there (creating that many jobs as the cluster user
would take the limiter half an hour; the unlimited run measures them).

Usage: ``python benchmarks/storm.py [--tasks 40] [--parallelism 16] [--watched 1000] [--rate-limit PARAMETERS]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import _common  # before Airflow: isolated Airflow home and the bench connections
from _common import Figure
from provenance import RATE_LIMITED
from ratelimit import DEFAULT_BUCKET_SIZE, DEFAULT_REFILL_PER_S, Throttling, pacing_floor_s, site_limit, throttle
from submit import FakeTaskInstance, MemoryStateStore

sys.path.insert(0, str(_common.REPO / "tests" / "cluster"))
from airflow.sdk.bases.operator import ExecutorSafeguard
from airflow_stack import Stack, standalone
from conftest import ClusterEnv
from demo import SUITE_RPC_BUDGET, connection_uri_json, free_port
from harness import DEFAULT_SSHD_LIMITS, sshd_config

from airflow_provider_tao_slurm.core.commands.pacing import SITE_SHARE, SUBMISSION_RPCS
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator

#: The code this benchmark measures (the submit path and a job's life: the operator, the lifecycle, the hook, core and
#: the job templates); report.py counts the commits that changed it since.
MEASURES = (
    "airflow_provider_tao_slurm/operators",
    "airflow_provider_tao_slurm/lifecycle",
    "airflow_provider_tao_slurm/hooks",
    "airflow_provider_tao_slurm/core",
    "airflow_provider_tao_slurm/exceptions.py",
    "templates",
)

TASKS = 40
#: Rounds of each single path (one submission, one poll): its RPCs are the fewest any round counted, as
#: the cluster user's other traffic only adds to a count.
ROUNDS = 5
#: The LocalExecutor's worker processes: the issue asks for at least 16.
PARALLELISM = 16
WATCHED = 1000
#: Seconds between two ``sdiag`` samples of the per-user RPC counts.
SAMPLE_S = 0.5
#: Seconds of the background sample before the storm; the longest the storm may take.
BACKGROUND_S = 10.0
STORM_TIMEOUT_S = 600.0
#: The job: one CPU, one GPU, one second, on the one-minute partition.
JOB: dict[str, Any] = {
    "command": "sleep 1",
    "cpus_per_task": 1,
    "gpus_per_node": 1,
    "time_hours": 1 / 60,
    "timeout_hours": 0.95 / 60,
}
#: Rounds of a job's whole life per kind (without and with ``secret_env``); the fewest RPCs count.
LIFE_ROUNDS = 3
#: The longest one job may take from its submission to its end.
LIFE_TIMEOUT_S = 180.0
#: The environment variable the ``secret_env`` job's secret is read from (``env:``), set by this process.
SIDECAR_ENV_SOURCE = "TAO_BENCH_STORM_SECRET"
#: squeue states of a job that has ended (``COMPLETING`` has not: its batch script may still be asking slurmctld).
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}
#: Seconds allowed for the storm's own login sshd to listen (to write its pid file).
SSHD_START_S = 10.0
DAG_ID = f"bench_storm_{_common.TOKEN}"

DAG_FILE = '''"""Written by benchmarks/storm.py: one submit task mapped over {tasks} commands."""

from airflow.sdk import DAG

from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator

with DAG(dag_id={dag_id!r}, schedule=None, catchup=False, max_active_tasks={tasks}):
    SbatchSubmitOperator.partial(
        task_id="train",
        image={image!r},
        partition={partition!r},
        cpus_per_task={cpus_per_task!r},
        gpus_per_node={gpus_per_node!r},
        time_hours={time_hours!r},
        timeout_hours={timeout_hours!r},
        retries=0,
    ).expand(command=[{command!r} + f" # task {{i}}" for i in range({tasks})])
'''


Sample = tuple[float, int]


class RpcSampler(threading.Thread):
    """Samples the cluster user's slurmctld RPC count (``sdiag``, by user) every :data:`SAMPLE_S` seconds.

    :ivar samples: ``(time.monotonic(), count)`` pairs, oldest first.
    """

    def __init__(self, user: str) -> None:
        super().__init__(daemon=True, name="rpc-sampler")
        self.user = user
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def sample(self) -> Sample:
        """Take one sample now; return it."""
        with self._lock:
            taken = (time.monotonic(), _common.ctld_rpcs_by_user().get(self.user, 0))
            self.samples.append(taken)
        return taken

    def run(self) -> None:
        """Sample until :meth:`finish`."""
        while not self._done.wait(SAMPLE_S):
            self.sample()

    def finish(self) -> None:
        """Stop sampling."""
        self._done.set()
        self.join()

    def arrivals(self, first: Sample, last: Sample) -> list[float]:
        """The RPCs between two samples as send times (seconds after ``first``), spread evenly within each sample."""
        times: list[float] = []
        window = [s for s in self.samples if first[0] <= s[0] <= last[0]]
        for (t0, c0), (t1, c1) in itertools.pairwise(window):
            n = c1 - c0
            times += [t0 - first[0] + (t1 - t0) * (k + 1) / n for k in range(n)]
        return times


def fewest(sampler: RpcSampler, action: Callable[[int], Any], rounds: int) -> tuple[list[Any], int, list[float]]:
    """Run ``action(round)`` ``rounds`` times, each between two samples.

    :returns: every round's result, the fewest RPCs of the cluster user a round counted, and that round's timeline.
    """
    results, counted = [], []
    for index in range(rounds):
        first = sampler.sample()
        results.append(action(index))
        last = sampler.sample()
        counted.append((last[1] - first[1], sampler.arrivals(first, last)))
    rpcs, timeline = min(counted, key=lambda pair: pair[0])
    return results, rpcs, timeline


def cluster_env() -> ClusterEnv:
    """The running cluster as the cluster tests' :class:`ClusterEnv` (what ``standalone`` takes)."""
    return ClusterEnv.from_json(_common.CLUSTER)


def one_submission(image: str, index: int) -> dict[str, Any]:
    """One ``SbatchSubmitOperator.execute`` in this process (the bench connection, the main login sshd)."""
    operator = SbatchSubmitOperator(
        task_id="one",
        slurm_conn_id=_common.SLURM_CONN_ID,
        image=image,
        partition=_common.CLUSTER["short_partition"],
        **JOB,
    )
    ti = FakeTaskInstance(DAG_ID, "one", f"one_submission_{index}")
    sentinel = {f"{SbatchSubmitOperator.__name__}__sentinel": ExecutorSafeguard.sentinel_value}
    try:
        return dict(operator.execute({"ti": ti, "task_state_store": MemoryStateStore()}, **sentinel))
    finally:
        operator.hook.close()


def ended_state(slurm_id: str, timeout: float = LIFE_TIMEOUT_S) -> str:
    """Wait until the job has ended; its state (squeue as root on this machine: no RPC of the cluster user).

    A job squeue no longer shows (its record purged after ``MinJobAge``) has ended too (``gone``).
    """
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", slurm_id, "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        state = proc.stdout.strip()
        if state in ENDED or (proc.returncode == 0 and not state) or "Invalid job id" in proc.stderr:
            return state or "gone"
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {slurm_id} did not end within {timeout:.0f} s (squeue: {state or proc.stderr!r})")
        time.sleep(0.5)


def one_life(image: str, index: int, *, secret: bool) -> dict[str, Any]:
    """One job's whole life: ``SbatchSubmitOperator.execute`` as :func:`one_submission` (with ``secret_env`` when
    ``secret``), then its job runs ``sleep 1`` and ends by itself; returns once it ended (and a second more, for
    the last RPCs of its end), its handle with its final state under ``ended``."""
    operator = SbatchSubmitOperator(
        task_id="life",
        slurm_conn_id=_common.SLURM_CONN_ID,
        image=image,
        partition=_common.CLUSTER["short_partition"],
        secret_env={"BENCH_TOKEN": f"env:{SIDECAR_ENV_SOURCE}"} if secret else None,
        **JOB,
    )
    ti = FakeTaskInstance(DAG_ID, "life", f"life_{'secret' if secret else 'plain'}_{index}")
    sentinel = {f"{SbatchSubmitOperator.__name__}__sentinel": ExecutorSafeguard.sentinel_value}
    try:
        handle = dict(operator.execute({"ti": ti, "task_state_store": MemoryStateStore()}, **sentinel))
    finally:
        operator.hook.close()
    handle["ended"] = ended_state(str(handle["slurm_job_id"]))
    time.sleep(1.0)
    return handle


def life_round(image: str, index: int, *, secret: bool) -> dict[str, Any]:
    """:func:`one_life` as :func:`fewest` calls a round (``action(index)``)."""
    return one_life(image, index, secret=secret)


def storm_pacing() -> tuple[str, bool, str]:
    """How the provider paced the storm, read from the site as the provider reads it (``SlurmctldParameters``).

    :returns: the words for the figure, whether it paced (the storm's bucket figure and slurmctld's refusals are
        judged only then: where the site has no limiter the provider does not pace, and the simulated bucket
        shows what a site with the default limiter would refuse of RPCs sent unpaced, for reference), and the
        site's ``SlurmctldParameters``.
    """
    parameters = _common.ssh("scontrol show config | sed -n 's/^SlurmctldParameters *= *//p'").strip()
    if "rl_enable" in parameters.split(","):
        return f"paced by the provider: the site has {parameters}", True, parameters
    return (
        f"not paced: this cluster's slurmctld has no rl_enable ({parameters or 'not shown'}); a site with it "
        "gets them paced",
        False,
        parameters,
    )


@contextlib.contextmanager
def login_sshd(workdir: Path) -> Iterator[tuple[int, Path]]:
    """A login sshd of the storm's own, configured as the harness's limits sshd (OpenSSH's default limits, PAM).

    The harness's ``sshd-limits`` serves other benchmarks at the same time; this one (same host key,
    user and ``MaxStartups``/``MaxSessions``, its own port and log) sees only the storm's connections.

    :returns: its port and its log.
    """
    port = free_port()
    config, pid_file, log = workdir / "sshd_config", workdir / "sshd.pid", workdir / "sshd.log"
    config.write_text(sshd_config(port, pid_file, limits=DEFAULT_SSHD_LIMITS, use_pam=True))
    subprocess.run(["/usr/sbin/sshd", "-f", str(config), "-E", str(log)], check=True, timeout=30)
    deadline = time.monotonic() + SSHD_START_S
    while not pid_file.exists():  # sshd writes it once it listens (no probe: a connection would be counted)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the storm's sshd did not listen on {port} within {SSHD_START_S:.0f} s: {log}")
        time.sleep(0.1)
    try:
        yield port, log
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGTERM)


def sshd_log_counts(text: str) -> dict[str, int]:
    """Logins, connections refused past ``MaxStartups`` and throttling episodes in a login sshd's log."""
    lines = text.splitlines()
    return {
        "logins": sum("Accepted publickey" in line for line in lines),
        "refused": sum(line.startswith("drop connection #") for line in lines),
        "throttling_episodes": sum("beginning MaxStartups throttling" in line for line in lines),
        "closed_before_login": sum("[preauth]" in line and "Connection" in line for line in lines),
    }


def jobs_named(prefix: str) -> dict[str, set[str]]:
    """``{job name: {slurm ids}}`` of the cluster user's jobs named ``<prefix>-...`` (squeue + sacct, last hour)."""
    out = _common.ssh(
        "squeue -h -t all --me -o '%i|%j' ; sacct -X -n -P -o JobIDRaw,JobName --starttime=now-1hours ; true"
    )
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        slurm_id, _, name = line.strip().partition("|")
        if name.startswith(f"{prefix}-") and slurm_id.isdigit():
            found.setdefault(name, set()).add(slurm_id)
    return found


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def storm(stack: Stack, sampler: RpcSampler, tasks: int) -> dict[str, Any]:
    """Trigger the mapped DAG, wait for every task to end; what the API and the samples say."""
    quiet = sampler.sample()
    time.sleep(BACKGROUND_S)
    first = sampler.sample()
    background = (first[1] - quiet[1]) / (first[0] - quiet[0])
    by_type = _common.rpc_counts()["slurmctld"]
    run_id = stack.trigger(DAG_ID, {})
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances"
    deadline = first[0] + STORM_TIMEOUT_S
    while True:
        instances = [ti for ti in stack.get(path, limit=tasks + 10)["task_instances"] if ti["task_id"] == "train"]
        ended = [ti for ti in instances if ti["state"] in ("success", "failed", "upstream_failed", "skipped")]
        if len(instances) == tasks and len(ended) == tasks:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the storm did not end within {STORM_TIMEOUT_S:.0f} s: {len(ended)} of {tasks} ended")
        time.sleep(1)
    last = sampler.sample()
    after = _common.rpc_counts()["slurmctld"]
    handles = [
        stack.get(f"{path}/train/xcomEntries/return_value", map_index=ti["map_index"], deserialize="true")["value"]
        for ti in instances
        if ti["state"] == "success"
    ]
    started = min(_when(ti["start_date"]) for ti in instances if ti["start_date"])
    finished = max(_when(ti["end_date"]) for ti in instances if ti["end_date"])
    windows = [
        ((_when(ti["start_date"]) - started).total_seconds(), (_when(ti["end_date"]) - started).total_seconds())
        for ti in instances
        if ti["start_date"] and ti["end_date"]
    ]
    return {
        "run_id": run_id,
        "states": sorted(ti["state"] for ti in instances),
        "tries": max(ti["try_number"] for ti in instances),
        "first_start_to_last_end_s": (finished - started).total_seconds(),
        "background_rpcs_per_s": background,
        "rpcs": last[1] - first[1],
        "rpcs_less_background": last[1] - first[1] - background * (last[0] - first[0]),
        "task_windows_s": sorted(windows),
        "arrivals": sampler.arrivals(first, last),
        "ctld_rpcs_by_type": {
            name: after[name] - by_type.get(name, 0)
            for name in sorted(after)
            if after[name] != by_type.get(name, 0) and name not in _common.OWN_RPCS
        },
        "handles": [json.loads(h) if isinstance(h, str) else h for h in handles],
    }


def bucket_figure(name: str, result: Throttling, *, judged: bool = False) -> Figure:
    """A path's RPCs through the default bucket, judged (none throttled) only with ``judged``.

    A path of up to a full bucket's RPCs cannot be throttled (the bucket starts full): its row is information.
    """
    return Figure(
        f"  {name}: through the default rl_enable bucket ({DEFAULT_BUCKET_SIZE} tokens, +{DEFAULT_REFILL_PER_S:g}/s)",
        f"{result.throttled} of {result.rpcs} throttled, longest wait {result.max_delay_s:.1f} s",
        ""
        if judged or result.rpcs > DEFAULT_BUCKET_SIZE
        else f"for reference: a full bucket takes any {DEFAULT_BUCKET_SIZE} RPCs",
        "0 throttled" if judged else "",
        result.throttled == 0 if judged else None,
    )


def measure(args: argparse.Namespace, image: str, sampler: RpcSampler, paths: list[str]) -> dict[str, Any]:
    """Every path (one submission, a job's life, the polls unless ``args.watched`` is 0, the storm); the raw figures.

    :param paths: what the run leaves on the cluster is added to it (removed at the end).
    """
    c = _common.CLUSTER
    job_prefix = f"tao-{DAG_ID}.train"
    held_prefix = f"bench-storm-{_common.TOKEN}"
    uid = int(c["uid"])
    whole = _common.CtldLogWindow()
    handles, single_rpcs, single_times = fewest(sampler, lambda i: one_submission(image, i), ROUNDS)
    for handle in handles:
        paths += [handle["job_dir"], handle["results_dir"], handle["log_dir"], handle["record_path"]]
    _common.cancel_jobs([handle["slurm_job_id"] for handle in handles])
    for handle in handles:  # a cancelled job's end may ask slurmctld: not within the lives' counts
        ended_state(str(handle["slurm_job_id"]))
    time.sleep(1.0)

    lives: dict[str, dict[str, Any]] = {}
    for kind, secret in (("plain", False), ("secret_env", True)):
        ended, rpcs, times = fewest(sampler, functools.partial(life_round, image, secret=secret), LIFE_ROUNDS)
        for handle in ended:
            paths += [handle["job_dir"], handle["results_dir"], handle["log_dir"], handle["record_path"]]
        lives[kind] = {"rpcs": rpcs, "timeline": times, "states": [handle["ended"] for handle in ended]}

    polls: dict[str, Any] | None = None
    if args.watched:
        held = _common.create_held_jobs(held_prefix, args.watched)
        hooks = [SlurmHook(_common.SLURM_CONN_ID) for _ in range(ROUNDS)]
        answers, restart_rpcs, restart_times = fewest(sampler, lambda i: hooks[i].get_states(held), ROUNDS)
        answers_again, poll_rpcs, poll_times = fewest(sampler, lambda i: hooks[i].get_states(held), ROUNDS)
        for hook in hooks:
            hook.close()
        _common.cancel_by_prefix(held_prefix)
        answered = {len(answer) for answer in answers + answers_again}
        if answered != {args.watched}:
            raise RuntimeError(f"get_states answered for {sorted(answered)} of {args.watched} jobs")
        polls = {"poll": poll_rpcs, "restart": restart_rpcs, "poll_times": poll_times, "restart_times": restart_times}

    with tempfile.TemporaryDirectory(prefix="tao-bench-storm-") as tmp:
        dags = Path(tmp) / "dags"
        dags.mkdir()
        (dags / "storm.py").write_text(
            DAG_FILE.format(dag_id=DAG_ID, tasks=args.tasks, image=image, partition=c["short_partition"], **JOB)
        )
        with login_sshd(Path(tmp)) as (port, sshd_log):
            connection = {**json.loads(connection_uri_json(c)), "port": port}
            for key in SUITE_RPC_BUDGET:  # the provider's default pacing, as users run it
                del connection["extra"][key]
            settings = {
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW__CORE__PARALLELISM": str(args.parallelism),
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(args.tasks),
                "AIRFLOW_CONN_SLURM_DEFAULT": json.dumps(connection),
            }
            with standalone(cluster_env(), env=settings, prefix="tao-bench-storm-airflow-") as stack:
                window = _common.CtldLogWindow()
                ran = storm(stack, sampler, args.tasks)
                refused = window.refusals(uid)
        sshd = sshd_log_counts(sshd_log.read_text())
    for job in ran["handles"]:
        paths += [job["job_dir"], job["results_dir"], job["log_dir"], job["record_path"]]
    pacing, paced, parameters = storm_pacing()  # while the limiter set for this run is still on
    return {
        "single_rpcs": single_rpcs,
        "single_times": single_times,
        "lives": lives,
        "polls": polls,
        "storm": ran,
        "jobs": jobs_named(job_prefix),
        "sshd": sshd,
        "refused_in_storm": refused,
        "refused_in_run": whole.refusals(uid),
        "pacing": pacing,
        "paced": paced,
        "site_parameters": parameters,
    }


def figures_for(raw: dict[str, Any], tasks: int, parallelism: int, watched: int) -> list[Figure]:
    """The printed figures of one run (:func:`measure`'s raw figures)."""
    ran, jobs, sshd, lives = raw["storm"], raw["jobs"], raw["sshd"], raw["lives"]
    failed = sum(state != "success" for state in ran["states"])
    ids = sum(len(found) for found in jobs.values())
    once = len(jobs) == tasks and ids == tasks
    storm_rpcs = ran["rpcs_less_background"]
    paced, single_rpcs = raw["paced"], raw["single_rpcs"]
    at_once = throttle([0.0] * len(ran["arrivals"]))
    limit = site_limit(raw["site_parameters"]) if paced else None
    floor = (
        f"; paced: the budget makes {tasks} submissions of {SUBMISSION_RPCS} tokens wait at least "
        f"{pacing_floor_s(tasks, SUBMISSION_RPCS, limit, SITE_SHARE):.0f} s"
        if limit
        else ""
    )
    refused = raw["refused_in_storm"]
    refused_text = "not read (slurmctld's log)" if refused is None else str(refused)

    def life(kind: str, what: str, budget: int, why: str) -> Figure:
        done = lives[kind]
        return Figure(
            f"RPCs (slurmctld, cluster user): one job's whole life {what} (submission to its end), "
            f"fewest of {LIFE_ROUNDS}",
            str(done["rpcs"]),
            f"{why}; the jobs ended {', '.join(done['states'])}",
            f"<= {budget}",
            done["rpcs"] <= budget,
        )

    figures = [
        Figure(
            f"storm: time from the first task's start to the {tasks}th job submitted (last task's end)",
            f"{ran['first_start_to_last_end_s']:.1f} s",
            f"LocalExecutor, parallelism {parallelism}, {os.cpu_count()} cores{floor}",
        ),
        Figure(
            f"storm: jobs by name (tao-{DAG_ID}.train-*)",
            f"{ids} jobs, {len(jobs)} names",
            "",
            f"{tasks} jobs, each name once",
            once,
        ),
        Figure(
            "storm: failed tasks (REST API; retries=0)",
            f"{failed} of {tasks} (highest try {ran['tries']})",
            "",
            "0",
            failed == 0,
        ),
        Figure(
            "storm: logins at its MaxStartups 10:30:100 sshd / connections refused past MaxStartups",
            f"{sshd['logins']} / {sshd['refused']}",
            f"throttling episodes {sshd['throttling_episodes']}, closed before login {sshd['closed_before_login']}",
        ),
        Figure(
            "storm: the cluster user's RPCs slurmctld's rate limit refused (its log)",
            refused_text,
            f"the site: {raw['site_parameters'] or 'not shown'}"
            + ("" if paced else "; no rl_enable: nothing is refused here"),
            "0" if paced else "",
            (refused == 0) if paced else None,
        ),
        Figure(
            "storm: slurmctld RPCs of the cluster user per submission, less the user's background rate",
            f"{storm_rpcs / tasks:.1f}",
            f"{ran['rpcs']} in all over the storm, background {ran['background_rpcs_per_s']:.2f}/s before it; "
            f"one submission alone: {single_rpcs}; a job's whole life: {lives['plain']['rpcs']} (below)",
        ),
        Figure(f"RPCs (slurmctld, cluster user): one submission, fewest of {ROUNDS}", str(single_rpcs)),
        life(
            "plain",
            "without secret_env",
            SUBMISSION_RPCS,
            f"the provider paces {SUBMISSION_RPCS} per submission (SUBMISSION_RPCS: the submission's and its "
            "container step's); a job no signal reached asks nothing at its end",
        ),
        life(
            "secret_env",
            "with secret_env",
            SUBMISSION_RPCS + 1,
            f"{SUBMISSION_RPCS} paced, and its sidecar asks scontrol show job once at the end (unpaced)",
        ),
        bucket_figure("one submission", throttle(raw["single_times"])),
        Figure(f"RPCs: the storm of {tasks}, as sampled (sdiag every {SAMPLE_S:g} s)", str(len(ran["arrivals"]))),
        bucket_figure(
            f"storm of {tasks}, as its RPCs arrived ({raw['pacing']})", throttle(ran["arrivals"]), judged=paced
        ),
        Figure(
            "  storm: the same RPCs all at once (enough workers and cores), for reference",
            f"{at_once.throttled} of {at_once.rpcs} throttled, longest wait {at_once.max_delay_s:.1f} s",
        ),
    ]
    polls = raw["polls"]
    if polls:
        figures += [
            Figure(f"RPCs: {watched} watched jobs, one interval (get_states), fewest of {ROUNDS}", str(polls["poll"])),
            bucket_figure(f"{watched} watched jobs", throttle(polls["poll_times"])),
            Figure(
                f"RPCs: first poll after a restart (get_states, fresh connection), fewest of {ROUNDS}",
                str(polls["restart"]),
            ),
            bucket_figure("restart", throttle(polls["restart_times"])),
        ]
    return figures


def main() -> None:
    """Measure one submission, a job's life, the storm and the polls; print and store the figures; clean up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=TASKS, help="mapped submit tasks")
    parser.add_argument("--parallelism", type=int, default=PARALLELISM, help="the LocalExecutor's parallelism")
    parser.add_argument("--watched", type=int, default=WATCHED, help="held jobs one status poll asks about")
    parser.add_argument(
        "--rate-limit",
        metavar="PARAMETERS",
        help="slurmctld's SlurmctldParameters for the run (rl_enable,...; SLURM 23.02+), off again at the end; "
        "the results are <name>-rl.json and the polls of held jobs are left out",
    )
    args = parser.parse_args()
    if args.rate_limit:
        args.watched = 0  # creating the held jobs as the cluster user would take the limiter half an hour
    os.environ[SIDECAR_ENV_SOURCE] = secrets.token_hex(16)
    image = _common.sqsh_image()
    sampler = RpcSampler(_common.CLUSTER["user"])
    sampler.start()
    paths: list[str] = [image]
    try:
        with _common.site_rate_limit(args.rate_limit):
            raw = measure(args, image, sampler, paths)
    finally:
        sampler.finish()
        _common.cancel_by_prefix(f"bench-storm-{_common.TOKEN}")
        for task in ("train", "one", "life"):  # the storm's, one submission's and a life's jobs left running
            _common.cancel_by_prefix(f"tao-{DAG_ID}.{task}")
        _common.remove_remote(paths)

    figures = figures_for(raw, args.tasks, args.parallelism, args.watched)
    title = f"Submit storm ({args.tasks} mapped tasks, real scheduler) and RPC rate limit (benchmarks/storm.py)"
    _common.print_figures(title, figures)
    ran = raw["storm"]
    print(f"  slurmctld RPCs by type over the storm (all users): {ran['ctld_rpcs_by_type']}")
    polls = raw["polls"] or {}
    buckets = {
        "one submission": throttle(raw["single_times"]),
        "storm": throttle(ran["arrivals"]),
        **{name: throttle(polls[f"{name}_times"]) for name in ("poll", "restart") if polls},
    }
    details = {
        "tasks": args.tasks,
        "parallelism": args.parallelism,
        "watched": args.watched,
        "rate_limit": args.rate_limit,
        "site_parameters": raw["site_parameters"],
        "storm": {k: v for k, v in ran.items() if k != "handles"},
        "jobs": {name: sorted(found) for name, found in raw["jobs"].items()},
        "sshd_limits_log": raw["sshd"],
        "refused": {"storm": raw["refused_in_storm"], "run": raw["refused_in_run"]},
        "rpcs": {
            "one_submission": raw["single_rpcs"],
            **{f"life_{kind}": life["rpcs"] for kind, life in raw["lives"].items()},
            **{name: polls[name] for name in ("poll", "restart") if polls},
        },
        "lives": raw["lives"],
        "timelines": {
            "one_submission": raw["single_times"],
            **{name: polls[f"{name}_times"] for name in ("poll", "restart") if polls},
        },
        "bucket": {name: dataclasses.asdict(result) for name, result in buckets.items()},
        "bucket_storm_at_once": dataclasses.asdict(throttle([0.0] * len(ran["arrivals"]))),
        "samples": sampler.samples,
    }
    variant = RATE_LIMITED if args.rate_limit else None
    _common.write_result("storm", title, figures, details, measures=MEASURES, variant=variant)


if __name__ == "__main__":
    main()
