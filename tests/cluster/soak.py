"""``make soak``: trainings under a seeded random schedule of real faults, checked against SLURM (issue 41, item 8).

1. Starts a real ``airflow standalone`` (:func:`airflow_stack.standalone`: api-server, scheduler with the
   LocalExecutor, dag-processor, triggerer) against the local SLURM test cluster, with DAG files of its own
   (:data:`DAGS`): single-node trainings (some without ``--requeue``: a node failure is resubmitted by the
   provider), two-node trainings with an explicit ``nccl_env``, trainings continued over several slices on
   the one-minute partition (``max_continuations``), and mapped sweeps (``.expand``); most carry a
   ``secret_env``. The connection goes through the harness's cut login sshd (its SLURM tools can be cut off
   the head node) and writes under a results base of its own.
2. Triggers ``--trainings`` runs at seeded random moments over the first three quarters of ``--minutes``,
   through the REST API; some are cancelled by the user (the sensor marked failed through the API, which
   calls the trigger's ``on_kill``).
3. Injects a seeded random schedule of real faults, one at a time (:data:`FAULTS`): the seed and the whole
   schedule are printed first.
4. Waits for every run to end, then checks, from ``squeue``/``sacct``, the files on shared storage, the
   Airflow logs and the API (never from the provider's answers): one SLURM job per job name (a logical
   submission or a slice), each training's final Airflow state against its SLURM truth, nothing of the
   soak left queued or running, the secret nowhere, every job record's terminal state against accounting.
   The record files are read only to link a resubmission to the training it retries (``retry_of``).
5. Prints the table and writes it into ``RELIABILITY.md`` as its own section (seed, commit, date,
   duration), replacing the previous soak section; exits 1 on any violation.

Run as root (the harness's faults need it), holding the cluster lock: ``make soak SOAK_SEED=7 SOAK_MINUTES=60
SOAK_TRAININGS=40``, or ``python tests/cluster/soak.py --seed 7 --minutes 8 --trainings 8``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote as url_quote

import httpx
from airflow_stack import Stack, standalone
from clusterkit import SECRET_SOURCE, as_other, connection_json, harness
from conftest import CLUSTER_JSON, ClusterEnv
from demo import DEMO_DIR, airflow_bin, ssh
from reliability_report import REPORT, replace_soak_section, tested_commit
from test_airflow_ui import _triggerer_pids

from airflow_provider_tao_slurm.core.records import mint_job_id
from airflow_provider_tao_slurm.core.shell import join

#: The registry image the Enroot stand-in converts once (the reliability suites' ``image`` fixture's).
SOAK_IMAGE = "docker://nvcr.io#nvidia/x:1"
PROGRAM = f"python3 {DEMO_DIR}/tao_like_train.py"
#: The soak's DAGs: kind -> DAG id (every job name starts ``tao-soak_<kind>``).
DAGS = {kind: f"soak_{kind}" for kind in ("single", "norequeue", "multi", "chain", "sweep")}
#: How often each kind of training is triggered.
KIND_WEIGHTS = {"single": 4, "norequeue": 2, "multi": 2, "chain": 2, "sweep": 1}
#: The share of single-node runs the user cancels once their job runs.
CANCEL_SHARE = 0.4
#: Seconds a user waits after the sensor deferred before cancelling.
CANCEL_AFTER_S = 15.0
#: Seconds every fault slot lasts (the faults' count is the soak's length over this).
FAULT_SLOT_S = 60.0
#: Seconds allowed, after the last trigger, for every run to end.
DRAIN_S = 420.0
#: sacct states of a job that has not ended.
LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED", "RESIZING", "REQUEUE_HOLD"}
#: A record's terminal state for each sacct end state (the design's state table).
RECORD_STATE = {
    "COMPLETED": "COMPLETE",
    "FAILED": "ERROR",
    "TIMEOUT": "ERROR",
    "OUT_OF_MEMORY": "ERROR",
    "DEADLINE": "ERROR",
    "NODE_FAIL": "ERROR",
    "BOOT_FAIL": "ERROR",
    "CANCELLED": "CANCELED",
    "PREEMPTED": "CANCELED",
    "REVOKED": "CANCELED",
}

DAG_SOURCE = '''"""Soak DAGs (tests/cluster/soak.py writes this file)."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

IMAGE = {image!r}
SECRET = {{"RL_TOKEN": "env:{secret_source}"}}
TRAIN = "{program} --spec {{config_path}} --results {{results_dir}} --epoch-seconds {{{{ params.epoch_seconds }}}}"
MULTI = (
    'RESULTS={{results_dir}}; [ "$NODE_RANK" = 0 ] || RESULTS="$RESULTS/node_$NODE_RANK"; '
    'exec {program} --spec {{config_path}} --results "$RESULTS" --epoch-seconds {{{{ params.epoch_seconds }}}}'
)
PARAMS = {{"epochs": Param(6, type="integer"), "epoch_seconds": Param(3, type="integer")}}
SPEC = {{"train": {{"epochs": "{{{{ params.epochs }}}}"}}}}
# A submission tried during an outage fails cleanly (no job): its retries outlast the soak's longest outage.
COMMON = dict(image=IMAGE, cpus_per_task=1, network_arch="classification_pyt", retries=5,
              retry_delay=timedelta(seconds=30))


def sensor(**kwargs):
    return SlurmJobSensor(task_id="wait", poke_interval=2, deferrable=True, retries=1, **kwargs)


def dag(dag_id):
    return DAG(dag_id=dag_id, schedule=None, params=PARAMS, render_template_as_native_obj=True,
               default_args={{"retries": 1, "retry_delay": timedelta(seconds=2)}}, tags=["soak"])


with dag({single!r}):
    submit = SbatchSubmitOperator(task_id="submit", command=TRAIN, gpus_per_node=1, time_hours=0.1,
                                  timeout_hours=0.08, secret_env=SECRET, spec=SPEC, **COMMON)
    sensor(job=submit.output)

with dag({norequeue!r}):
    submit = SbatchSubmitOperator(task_id="submit", command=TRAIN, gpus_per_node=1, time_hours=0.1,
                                  timeout_hours=0.08, secret_env=SECRET, requeue=False, spec=SPEC, **COMMON)
    sensor(job=submit.output)

with dag({multi!r}):
    submit = SbatchSubmitOperator(task_id="submit", command=MULTI, num_nodes=2, gpus_per_node=1, time_hours=0.1,
                                  timeout_hours=0.08, secret_env=SECRET, nccl_env={{"NCCL_DEBUG": "WARN"}},
                                  spec=SPEC, **COMMON)
    sensor(job=submit.output)

with dag({chain!r}):
    submit = SbatchSubmitOperator(task_id="submit", command=TRAIN, gpus_per_node=1, partition={short!r},
                                  time_hours=1 / 60, timeout_hours=None, max_continuations=4, secret_env=SECRET,
                                  spec=SPEC, **COMMON)
    sensor(job=submit.output)

with dag({sweep!r}):
    submit = SbatchSubmitOperator.partial(task_id="submit", command=TRAIN, gpus_per_node=1, time_hours=0.1,
                                          timeout_hours=0.08, **COMMON).expand(
        spec=[{{"train": {{"epochs": epochs}}}} for epochs in (3, 5, 7)]
    )
    SlurmJobSensor.partial(task_id="wait", poke_interval=2, deferrable=True, retries=1).expand(job=submit.output)
'''


# ---------------------------------------------------------------------- the cluster


def load_env() -> ClusterEnv:
    """The running cluster's description (``harness.py up`` writes it)."""
    return ClusterEnv.from_json(json.loads(CLUSTER_JSON.read_text()))


class Cluster:
    """The cluster as the soak asks it: over the harness's OpenSSH, as the cluster user, on the login sshd."""

    def __init__(self, env: ClusterEnv) -> None:
        self.env = env
        self.info = {item.name: getattr(env, item.name) for item in fields(ClusterEnv)}
        #: The cut login sshd (its SLURM tools can be cut off the head node): the soak's connection goes there.
        self.cut_port = int(json.loads(CLUSTER_JSON.read_text())["cut_port"])

    def run(self, command: str, timeout: float = 60) -> str:
        """The command's output ('' when it failed)."""
        rc, output = ssh(self.info, command, timeout=timeout)
        return output if rc == 0 else ""

    def running_node(self, prefix: str) -> str | None:
        """A node running one of the soak's jobs (names starting ``prefix``), if any."""
        out = self.run(join(["squeue", "--me", "-h", "-t", "RUNNING", "-o", "%j|%N"]))
        nodes = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith(prefix) and "|" in line]
        return next((node for node in nodes if node in self.env.nodes), None)

    def node_usable(self, node: str) -> bool:
        """Whether ``sinfo`` shows the node in service."""
        state = self.run(join(["sinfo", "-h", "-N", "-n", node, "-o", "%T"])).strip()
        return bool(state) and not state.startswith(("down", "drain", "fail", "unknown", "not_responding"))

    def wait_usable(self, node: str, timeout: float = 120) -> None:
        """Wait until ``node`` is back in service (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.node_usable(node):
            time.sleep(2)


# ---------------------------------------------------------------------- faults


@dataclass
class Fault:
    """One fault of the schedule."""

    at: float
    kind: str
    hold_s: float
    done: str = "not reached"


class Injector:
    """Injects the faults of the schedule, one at a time, in a thread."""

    def __init__(self, cluster: Cluster, stack: Stack, faults: list[Fault], prefix: str, logs: Path) -> None:
        self.cluster, self.stack, self.faults, self.prefix, self.logs = cluster, stack, faults, prefix, logs
        self.replacements: list[subprocess.Popen[bytes]] = []
        self.start = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self.actions: dict[str, Callable[[Fault], str]] = {
            "sshd restart": self._sshd_restart,
            "login host cut off": self._login_cut,
            "slurmctld restart": self._slurmctld_restart,
            "slurmdbd stopped": self._slurmdbd,
            "node down under a job": self._node_down,
            "preempted by an urgent job": self._preempt,
            "triggerer SIGKILLed": self._triggerer,
            "worker SIGKILLed mid-submit": self._worker,
        }

    def _run(self) -> None:
        for fault in self.faults:
            delay = self.start + fault.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            began = time.monotonic() - self.start
            try:
                fault.done = f"{began:.0f} s: {self.actions[fault.kind](fault)}"
            except Exception as exc:  # reported in the table: the soak goes on
                fault.done = f"{began:.0f} s: injection failed: {type(exc).__name__}: {str(exc)[:200]}"
            print(f"soak: fault {fault.kind}: {fault.done}", flush=True)

    def _sshd_restart(self, fault: Fault) -> str:
        """The login sshd restarted: the harness restarts the login sshd, and every session of the soak's login
        sshd (the cut one) is reset, as a restarting login host drops them."""
        harness("restart-sshd")
        subprocess.run(["ss", "-K", "-t", "sport", "=", f":{self.cluster.cut_port}"], capture_output=True)
        return "login sshd restarted, the sessions of the soak's login sshd reset"

    def _slurmctld_restart(self, fault: Fault) -> str:
        harness("restart-slurmctld", timeout=180)
        return "slurmctld restarted"

    def _login_cut(self, fault: Fault) -> str:
        harness("cut-login-head")
        try:
            time.sleep(fault.hold_s)
        finally:
            harness("restore-login")
        return f"slurmctld and slurmdbd unreachable from the login host for {fault.hold_s:.0f} s"

    def _slurmdbd(self, fault: Fault) -> str:
        harness("stop-slurmdbd")
        try:
            time.sleep(fault.hold_s)
        finally:
            harness("start-slurmdbd", timeout=180)
        return f"slurmdbd down for {fault.hold_s:.0f} s"

    def _node_down(self, fault: Fault) -> str:
        node = self._wait_for_node()
        if node is None:
            return "not injected: no job of the soak ran within 120 s"
        harness("node-down", node)
        try:
            time.sleep(fault.hold_s)
        finally:
            if not self.cluster.node_usable(node):  # slurmd may have brought it back already
                harness("node-resume", node)
            self.cluster.wait_usable(node)
        return f"{node} down for {fault.hold_s:.0f} s"

    def _preempt(self, fault: Fault) -> str:
        node = self._wait_for_node()
        if node is None:
            return "not injected: no job of the soak ran within 120 s"
        env = self.cluster.env
        argv = [
            "sbatch",
            "--parsable",
            f"--partition={env.urgent_partition}",
            f"--nodelist={node}",
            f"--gres=gpu:{env.gpus_per_node}",
            "--time=5",
            "--job-name=soak-urgent",
            f"--output={env.other_dir}/soak-urgent-%j.out",
            f"--wrap=sleep {int(fault.hold_s)}",
        ]
        rc, out, err = as_other(env, join(argv))
        if rc != 0:
            raise RuntimeError(f"sbatch as {env.other_user}: {err.strip()}")
        return f"{env.other_user}'s job {out.strip()} on {env.urgent_partition} took {node} for {fault.hold_s:.0f} s"

    def _triggerer(self, fault: Fault) -> str:
        live = [proc for proc in self.replacements if proc.poll() is None]
        if live:
            victims = [live[-1].pid]
            os.killpg(live[-1].pid, signal.SIGKILL)
        else:
            victims = _triggerer_pids(self.stack.session)
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if not victims:
            return "not injected: no triggerer process found"
        time.sleep(fault.hold_s)
        log = (self.logs / f"triggerer-{len(self.replacements) + 1}.log").open("wb")
        self.replacements.append(
            subprocess.Popen(
                [airflow_bin(), "triggerer"],
                env=self.stack.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        return f"{len(victims)} process(es) killed, a new triggerer started {fault.hold_s:.0f} s later"

    def _worker(self, fault: Fault) -> str:
        """SIGKILL the task process (``airflow worker -- <ti id>``) of a submit task while it runs."""
        deadline = time.monotonic() + max(fault.hold_s, 120)
        while time.monotonic() < deadline:
            for ti in running_submits(self.stack):
                for pid in worker_pids(str(ti["id"])):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        return f"{ti['dag_id']} {ti['dag_run_id']} map {ti['map_index']}: task process {pid} killed"
            time.sleep(0.2)
        return "not injected: no submit task ran within the window"

    def _wait_for_node(self) -> str | None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            node = self.cluster.running_node(self.prefix)
            if node:
                return node
            time.sleep(2)
        return None

    def stop(self) -> None:
        """Stop the replacement triggerers."""
        for proc in self.replacements:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def running_submits(stack: Stack) -> list[dict[str, Any]]:
    """The soak's submit task instances running now."""
    answer = stack.client.get("/api/v2/dags/~/dagRuns/~/taskInstances", params={"state": "running"})
    if answer.status_code != 200:
        return []
    return [ti for ti in answer.json()["task_instances"] if ti["task_id"] == "submit" and ti["dag_id"] in DAGS.values()]


def worker_pids(ti_id: str) -> list[int]:
    """Processes whose title is the task runner's ``airflow worker -- <ti id>``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if f"airflow worker -- {ti_id}".encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found


def fault_schedule(rng: random.Random, minutes: float) -> list[Fault]:
    """One fault per :data:`FAULT_SLOT_S` slot: every kind once (shuffled) before any repeats."""
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    count = max(1, int(minutes * 60 // FAULT_SLOT_S))
    picked = kinds[:count] + [rng.choice(FAULT_KINDS) for _ in range(count - len(kinds))]
    faults = []
    for slot, kind in enumerate(picked, start=1):
        low, high = FAULT_HOLD_S[kind]
        at = (slot - 0.5) * FAULT_SLOT_S + rng.uniform(-10, 10)
        faults.append(Fault(at=at, kind=kind, hold_s=rng.uniform(low, high)))
    return faults


#: Each fault kind and how long it holds (seconds, drawn uniformly): the outage, the node's downtime, the
#: urgent job's length, the triggerer's downtime, the window a worker kill waits for a submit task.
FAULT_HOLD_S = {
    "sshd restart": (0, 0),
    "login host cut off": (30, 60),
    "slurmctld restart": (0, 0),
    "slurmdbd stopped": (60, 120),
    "node down under a job": (20, 40),
    "preempted by an urgent job": (15, 30),
    "triggerer SIGKILLed": (5, 20),
    "worker SIGKILLed mid-submit": (60, 90),
}
FAULT_KINDS = tuple(FAULT_HOLD_S)


# ---------------------------------------------------------------------- trainings


@dataclass
class Training:
    """One triggered DAG run."""

    at: float
    kind: str
    conf: dict[str, int]
    cancel: bool
    run_id: str = ""
    cancelled_at: str = ""
    deferred_seen: float = 0.0
    state: str = ""
    tis: list[dict[str, Any]] = field(default_factory=list)

    @property
    def dag_id(self) -> str:
        return DAGS[self.kind]

    @property
    def path(self) -> str:
        return f"/api/v2/dags/{self.dag_id}/dagRuns/{url_quote(self.run_id, safe='')}"


def training_schedule(rng: random.Random, minutes: float, count: int) -> list[Training]:
    """``count`` runs at random moments of the first three quarters of the soak."""
    kinds = [kind for kind, weight in KIND_WEIGHTS.items() for _ in range(weight)]
    trainings = []
    for at in sorted(rng.uniform(0, minutes * 60 * 0.75) for _ in range(count)):
        kind = rng.choice(kinds)
        cancel = kind == "single" and rng.random() < CANCEL_SHARE
        if kind == "chain":
            conf = {"epochs": rng.randint(6, 9), "epoch_seconds": 10}
        elif cancel:
            conf = {"epochs": 40, "epoch_seconds": 3}
        else:
            conf = {"epochs": rng.randint(4, 10), "epoch_seconds": 3}
        trainings.append(Training(at=at, kind=kind, conf=conf, cancel=cancel))
    return trainings


def api_get(stack: Stack, path: str, **params: Any) -> Any:
    """GET, asked again for a minute while the API server is busy (it shares 2 cores with everything)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return stack.get(path, **params)
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def drive(stack: Stack, trainings: list[Training], start: float, minutes: float) -> None:
    """Trigger each run at its moment, cancel the ones the user cancels, until the soak's time is up."""
    pending = list(trainings)
    end = start + minutes * 60
    while time.monotonic() < end:
        now = time.monotonic() - start
        while pending and pending[0].at <= now:
            training = pending.pop(0)
            training.run_id = stack.trigger(training.dag_id, training.conf)
            print(f"soak: {now:6.0f} s  triggered {training.dag_id} {training.run_id} {training.conf}", flush=True)
        for training in trainings:
            if training.cancel and training.run_id and not training.cancelled_at:
                cancel_when_due(stack, training, start)
        time.sleep(1)


def cancel_when_due(stack: Stack, training: Training, start: float) -> None:
    """Mark the sensor failed through the API :data:`CANCEL_AFTER_S` after it deferred (a user kill)."""
    wait = stack.client.get(f"{training.path}/taskInstances/wait")
    if wait.status_code != 200:
        return
    state = wait.json().get("state")
    if state in ("success", "failed", "upstream_failed"):
        training.cancelled_at = f"not cancelled: the sensor was already {state}"
        return
    if state != "deferred":
        return
    if not training.deferred_seen:
        training.deferred_seen = time.monotonic()
    if time.monotonic() - training.deferred_seen < CANCEL_AFTER_S:
        return
    answer = stack.client.patch(f"{training.path}/taskInstances/wait", json={"new_state": "failed"})
    training.cancelled_at = (
        f"{time.monotonic() - start:.0f} s" if answer.status_code == 200 else f"PATCH {answer.status_code}"
    )
    print(f"soak: cancelled {training.dag_id} {training.run_id}: {training.cancelled_at}", flush=True)


def drain(stack: Stack, trainings: list[Training], timeout: float) -> None:
    """Wait for every run to end (or ``timeout``); note each run's state and task instances."""
    deadline = time.monotonic() + timeout
    while True:
        for training in trainings:
            if training.run_id and training.state not in ("success", "failed"):
                training.state = str(api_get(stack, training.path)["state"])
        if all(t.state in ("success", "failed") for t in trainings if t.run_id) or time.monotonic() > deadline:
            break
        time.sleep(5)
    for training in trainings:
        if training.run_id:
            training.tis = list(api_get(stack, f"{training.path}/taskInstances")["task_instances"])


# ---------------------------------------------------------------------- checks


@dataclass
class Findings:
    """What the checks found."""

    outcomes: Counter[str] = field(default_factory=Counter)
    #: How much was checked: jobs, runs, records, files, XCom entries.
    evidence: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def sacct_jobs(cluster: Cluster, since: str) -> dict[str, tuple[str, str]]:
    """``{JobIDRaw: (JobName, State)}`` of the cluster user's jobs since ``since`` (each job's last run),
    the live ones from ``squeue`` too (accounting can lag)."""
    out = cluster.run(
        join(["sacct", "-X", "-n", "-P", "-u", cluster.env.user, "-S", since, "-o", "JobIDRaw,JobName%80,State"])
    )
    jobs = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            jobs[parts[0].strip()] = (parts[1].strip(), parts[2].split()[0].rstrip("+") if parts[2].split() else "")
    live = cluster.run(join(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%j|%T"]))
    for line in live.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].strip().isdigit() and parts[0].strip() not in jobs:
            jobs[parts[0].strip()] = (parts[1].strip(), parts[2].strip())
    return jobs


def read_records(base: Path) -> dict[str, dict[str, Any]]:
    """Every job record under the soak's results base (read on this machine: it is the storage's host)."""
    records = {}
    for path in sorted((base / "records").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            records[path.stem] = json.loads(path.read_text())
    return records


def chain_names(first: str, records: dict[str, dict[str, Any]], names: set[str]) -> list[str]:
    """The job names of one logical submission: its first name, its slices (``-sN``) and every resubmission
    that retries one of them (``retry_of`` in the records), with their slices."""
    chain = [first]
    grew = True
    while grew:
        grew = False
        for name in sorted(names):
            root = name.rsplit("-s", 1)[0] if name.rsplit("-s", 1)[-1].isdigit() else name
            retried = (records.get(root) or {}).get("retry_of")
            if name not in chain and (root in chain or retried in chain):
                chain.append(name)
                grew = True
    return chain


def check(
    cluster: Cluster,
    stack: Stack,
    trainings: list[Training],
    since: str,
    base: Path,
    secret: str,
    logs: list[Path],
) -> Findings:
    """Every check of the soak, from SLURM, the storage, the Airflow logs and the API."""
    found = Findings()
    prefix = "tao-soak_"
    jobs = {jid: job for jid, job in sacct_jobs(cluster, since).items() if job[0].startswith(prefix)}
    by_name: dict[str, list[str]] = {}
    for jid, (name, _) in jobs.items():
        by_name.setdefault(name, []).append(jid)
    for name, ids in sorted(by_name.items()):
        if len(ids) > 1:
            found.violations.append(f"{len(ids)} SLURM jobs named {name}: {', '.join(sorted(ids, key=int))}")
    for jid, (name, state) in sorted(jobs.items()):
        if state in LIVE:
            found.violations.append(f"job {jid} ({name}) left {state}")
    runs = Counter(
        line.split("|")[0]
        for line in cluster.run(join(["sacct", "-D", "-X", "-n", "-P", "-u", cluster.env.user, "-S", since, "-o",
                                      "JobIDRaw,JobName%80"])).splitlines()
        if line.split("|")[-1].strip().startswith(prefix)
    )  # fmt: skip
    records = read_records(base)
    names = set(by_name)
    found.evidence.update(
        {
            "SLURM jobs of the soak (sacct, squeue)": len(jobs),
            "job names": len(by_name),
            "jobs that ran more than once (requeued)": sum(count > 1 for count in runs.values()),
            "job records": len(records),
        }
    )
    for training in trainings:
        if not training.run_id:
            continue
        for wait in [ti for ti in training.tis if ti["task_id"] == "wait"] or [{"map_index": -1, "state": None}]:
            index = int(wait["map_index"])
            label = f"{training.dag_id} {training.run_id}" + (f" [{index}]" if index >= 0 else "")
            chain = chain_names(mint_job_id(training.dag_id, "submit", training.run_id, index), records, names)
            ids = [jid for name in chain for jid in by_name.get(name, [])]
            last = max(ids, key=int) if ids else ""
            truth = jobs[last][1] if last else "no job"
            airflow = str(wait["state"])
            outcome = f"{training.kind}: {airflow} / {truth}" + (" (user cancel)" if training.cancelled_at else "")
            found.outcomes[outcome] += 1
            if airflow not in ("success", "failed", "upstream_failed"):
                found.violations.append(f"{label}: the sensor ended {airflow} (SLURM: {truth}): not watched to its end")
            elif (airflow == "success") != (truth == "COMPLETED"):
                found.violations.append(f"{label}: Airflow {airflow}, SLURM {truth} (job {last or '-'})")
            elif training.cancelled_at and not training.cancelled_at[0].isdigit():
                found.notes.append(f"{label}: {training.cancelled_at}")
            elif truth == "no job":
                found.notes.append(f"{label}: the submission failed every try and no SLURM job exists (its task logs)")
            elif training.cancelled_at and truth != "CANCELLED":
                found.violations.append(f"{label}: cancelled by the user, but SLURM says {truth}")
    for job_id, record in sorted(records.items()):
        ref = str(record.get("backend_ref") or "")
        terminal = record.get("terminal_state")
        state = jobs.get(ref, ("", ""))[1]
        if not ref:
            found.notes.append(f"record {job_id}: no SLURM job bound (terminal {terminal})")
        elif terminal is None:
            found.violations.append(f"record {job_id}: no terminal state (SLURM job {ref}: {state or 'not found'})")
        elif RECORD_STATE.get(state) != terminal:
            found.violations.append(f"record {job_id}: terminal {terminal}, accounting {state or 'no row'} (job {ref})")
    for path in leaks([base, *logs], secret, found.evidence):
        found.violations.append(f"the secret is in {path}")
    for training in trainings:
        for ti in training.tis:
            entry = stack.client.get(
                f"{training.path}/taskInstances/{ti['task_id']}/xcomEntries/return_value",
                params={"map_index": ti["map_index"]},
            )
            found.evidence["XCom entries read"] += entry.status_code == 200
            if entry.status_code == 200 and secret in entry.text:
                found.violations.append(f"the secret is in the XCom of {training.dag_id} {ti['task_id']}")
    return found


def leaks(roots: list[Path], secret: str, scanned: Counter[str]) -> Iterator[Path]:
    """Every file under ``roots`` holding ``secret`` (read here: no remote command line carries it); counts
    the files read in ``scanned``."""
    needle = secret.encode()
    for root in roots:
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            with contextlib.suppress(OSError):
                data = path.read_bytes()
                scanned["files searched for the secret"] += 1
                if needle in data:
                    yield path


# ---------------------------------------------------------------------- report


def table(
    seed: int, minutes: float, trainings: list[Training], faults: list[Fault], found: Findings, meta: dict[str, str]
) -> str:
    """The soak's section of RELIABILITY.md."""
    injected = Counter(f.kind for f in faults if f.done[:1].isdigit() and ": not injected" not in f.done
                       and "injection failed" not in f.done)  # fmt: skip
    lines = [
        "## Soak (`make soak`)",
        "",
        f"Seed {seed}, {minutes:g} minutes, {sum(1 for t in trainings if t.run_id)} trainings; commit "
        f"`{meta['commit']}`, started {meta['date']}, took {meta['took']}. Faults from `tests/cluster/harness.py`, "
        "one at a time; every check asks SLURM (`sacct`, `squeue`), the storage and Airflow, never the provider.",
        "",
        "| fault | scheduled | injected |",
        "|---|---|---|",
    ]
    lines += [f"| {kind} | {sum(f.kind == kind for f in faults)} | {injected.get(kind, 0)} |" for kind in FAULT_KINDS]
    lines += ["", "| training: Airflow / SLURM | count |", "|---|---|"]
    lines += [f"| {outcome} | {count} |" for outcome, count in sorted(found.outcomes.items())]
    lines += ["", "| checked | count |", "|---|---|"]
    lines += [f"| {what} | {count} |" for what, count in found.evidence.items()]
    lines += ["", f"**Violations: {len(found.violations)}.**", ""]
    lines += [f"- {item}" for item in found.violations]
    if found.notes:
        lines += ["", "Notes:", "", *[f"- {item}" for item in found.notes]]
    lines += ["", "Faults as injected:", "", *[f"- {f.kind}: {f.done}" for f in faults]]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the soak; 0 when it found no violation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one)")
    parser.add_argument("--minutes", type=float, default=60.0, help="how long trainings and faults go on")
    parser.add_argument("--trainings", type=int, default=40, help="DAG runs triggered over the first 3/4")
    parser.add_argument("--no-report", action="store_true", help=f"do not write the section into {REPORT.name}")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    rng = random.Random(seed)
    faults = fault_schedule(rng, args.minutes)
    trainings = training_schedule(rng, args.minutes, args.trainings)
    print(f"soak: seed {seed}, {args.minutes:g} minutes, {len(trainings)} trainings", flush=True)
    for fault in faults:
        print(f"soak: schedule {fault.at:6.0f} s  fault {fault.kind} (holds {fault.hold_s:.0f} s)")
    for training in trainings:
        cancel = " (the user cancels it)" if training.cancel else ""
        print(f"soak: schedule {training.at:6.0f} s  training {training.kind} {training.conf}{cancel}")
    env = load_env()
    cluster = Cluster(env)
    harness("restore-login")
    image = f"{env.containers_dir}/reliability.sqsh"
    if cluster.run(join(["head", "-c", "4", "--", image])) != "hsqs":
        cluster.run(join(["rm", "-f", "--", image]) + " && " + join(["enroot", "import", "-o", image, SOAK_IMAGE]), 120)
    tag = f"soak-{seed}-{uuid.uuid4().hex[:6]}"
    base = Path(env.results_dir) / tag
    secret = f"soak-{uuid.uuid4().hex}"
    meta = {"commit": tested_commit(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    since = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    connection = connection_json(env, port=cluster.cut_port, extra={"results_dir": str(base)})
    dags = Path(f"/tmp/{tag}-dags")
    dags.mkdir()
    (dags / "soak_dags.py").write_text(
        DAG_SOURCE.format(image=image, secret_source=SECRET_SOURCE, program=PROGRAM, short=env.short_partition, **DAGS)
    )
    started = time.monotonic()
    settings = {
        "AIRFLOW_CONN_SLURM_DEFAULT": connection,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PARALLELISM": "6",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
        SECRET_SOURCE: secret,
    }
    with standalone(env, env=settings, prefix=f"tao-{tag}-") as stack:
        print(f"soak: Airflow at {stack.url}, home {stack.home}; results base {base}", flush=True)
        injector = Injector(cluster, stack, faults, "tao-soak_", stack.home)
        try:
            begin = time.monotonic()
            injector.start = begin
            injector.thread.start()
            drive(stack, trainings, begin, args.minutes)
            injector.thread.join()
            print("soak: waiting for every run to end", flush=True)
            drain(stack, trainings, DRAIN_S)
            logs = [stack.home / "logs", stack.log, *stack.home.glob("triggerer-*.log"), stack.home / "airflow.db"]
            found = check(cluster, stack, trainings, since, base, secret, logs)
            kept = Path(f"/tmp/{tag}-airflow-logs")
            shutil.copytree(stack.home / "logs", kept, dirs_exist_ok=True)
            print(f"soak: the Airflow task logs are kept in {kept}", flush=True)
        finally:
            injector.stop()
            harness("restore-login")
            harness("start-slurmdbd", timeout=180)
    meta["took"] = f"{(time.monotonic() - started) / 60:.0f} min"
    section = table(seed, args.minutes, trainings, faults, found, meta)
    print("\n" + section, flush=True)
    if not args.no_report:
        REPORT.write_text(replace_soak_section(REPORT.read_text(), section))
        print(f"soak: the table is in {REPORT}")
    return 1 if found.violations else 0


if __name__ == "__main__":
    sys.exit(main())
