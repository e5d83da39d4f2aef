"""``make soak``: trainings under a seeded random schedule of real faults, judged from Airflow's record and SLURM's
accounting alone (issue 41, item 8; issue 49, item 4; issue 51).

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
3. Injects a seeded random schedule of real faults, one at a time (:data:`FAULT_HOLD_S`): the seed and the whole
   schedule are printed first. Each injection asks SLURM (``squeue`` over the plain login sshd, which no fault cuts)
   whether a training's job was RUNNING at that moment, and waits up to :data:`RUNNING_WAIT_S` for one; a kind that
   did not hit a running training takes the slot of a repeat of a kind that did, until it hits
   (:func:`soak_judge.next_kind`); no fault starts after ``--minutes``. Two kinds start a long training of their own
   and stop it while its job runs: its DAG run marked failed, or its sensor marked failed (in turn), and a user cancel
   inside a login-host cut (``cut-login-head`` and ``cut-login-ctld`` in turn); a minute after each, the training's
   files (the paths its XComs name) are searched for the secret. At each fault, SLURM's spools (slurmctld's state
   save and each slurmd's: job scripts and environments live there only while a job does) are searched for it.
4. Waits for every run to end, then reads Airflow's REST API (runs, task instances, each try's window, log and XCom)
   and SLURM's accounting (``sacct -X -D``, ``squeue``) and hands them to the judge, :mod:`soak_judge`, which owes
   the provider nothing (its docstring says how a job is tied to a task try): every job of the soak's user matched
   to a try or flagged an orphan, every training's Airflow state against its SLURM truth, every watch's end no
   earlier than its jobs' ends, each stop's jobs CANCELLED in time, every fault kind's hits on a running training.
   The soak also searches the secret in the Airflow home and logs, the results base, every XCom and log the API
   serves, SLURM's state, spool and log directories (and job scripts accounting stores, if it stores any), and
   audits the provider's job records against accounting (an audit of the provider; the judge does not use them).
5. Prints the table and writes it into ``RELIABILITY.md`` as its own section (seed, commit, date,
   duration), replacing the previous soak section; exits 1 on any violation.

Run as root (the harness's faults need it), holding the cluster lock: ``make soak SOAK_SEED=7 SOAK_MINUTES=60
SOAK_TRAININGS=40``, or ``python tests/cluster/soak.py --seed 7 --minutes 12 --trainings 8`` (a run shorter than
one slot per fault kind cannot hit every kind, and fails saying which).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
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
from soak_judge import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    STOP_DEADLINE_S,
    Findings,
    Injection,
    Job,
    Running,
    Stop,
    Unit,
    add_squeue,
    build_units,
    fault_table,
    flatten,
    judge,
    leaks,
    log_text,
    name_tokens,
    next_kind,
    parse_running,
    parse_sacct,
    parse_tries,
    paths_under,
    settle_kind,
    submitted_before,
)
from test_airflow_ui import _triggerer_pids

#: The registry image the Enroot stand-in converts once (the reliability suites' ``image`` fixture's).
SOAK_IMAGE = "docker://nvcr.io#nvidia/x:1"
PROGRAM = f"python3 {DEMO_DIR}/tao_like_train.py"
#: The soak's DAGs: kind -> DAG id.
DAGS = {kind: f"soak_{kind}" for kind in ("single", "norequeue", "multi", "chain", "sweep")}
#: How often each kind of training is triggered.
KIND_WEIGHTS = {"single": 4, "norequeue": 2, "multi": 2, "chain": 2, "sweep": 1}
#: The share of single-node runs the user cancels once their job runs.
CANCEL_SHARE = 0.4
#: Seconds a user waits after the sensor deferred before cancelling.
CANCEL_AFTER_S = 15.0
#: Seconds every fault slot lasts (the faults' count is the soak's length over this).
FAULT_SLOT_S = 60.0
#: Seconds a fault waits for a training's job to run before it is injected anyway (a miss).
RUNNING_WAIT_S = 45.0
#: The training a stopping fault starts for itself (two minutes of work: it runs when stopped), and how long the fault
#: waits for its job to run with its sensor deferred.
VICTIM_CONF = {"epochs": 40, "epoch_seconds": 3}
VICTIM_WAIT_S = 150.0
#: How the stopped-run fault stops its training, in turn: the DAG run, or its sensor task, marked failed.
STOP_PATHS = ("run marked failed", "sensor marked failed")
#: The login-host cuts a user cancel falls in, in turn; seconds the cut holds before the user cancels.
CUTS = ("cut-login-head", "cut-login-ctld")
CUT_SETTLE_S = 3.0
#: Seconds allowed, after the last trigger, for every run to end.
DRAIN_S = 420.0
#: A record's terminal state for each sacct end state (the design's state table): the audit of the provider's records.
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
#: The SLURM directories searched for the secret (under the harness's state dir): slurmctld's StateSaveLocation and
#: each slurmd's SlurmdSpoolDir (``spool``), the daemons' logs (``log``), the harness's evidence logs. The MariaDB and
#: PostgreSQL data directories are left out (binary, and slurmdbd stores no job script unless AccountingStoreFlags
#: says so: that is asked of accounting itself).
SLURM_SECRET_DIRS = ("spool", "log", "evidence")

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
    """The cluster as the soak asks it: over the harness's OpenSSH, as the cluster user, on the plain login sshd (the
    faults cut the other one, which the soak's connection uses)."""

    def __init__(self, env: ClusterEnv) -> None:
        self.env = env
        self.info = {item.name: getattr(env, item.name) for item in fields(ClusterEnv)}
        #: The cut login sshd (its SLURM tools can be cut off the head node): the soak's connection goes there.
        self.cut_port = int(json.loads(CLUSTER_JSON.read_text())["cut_port"])

    def run(self, command: str, timeout: float = 60) -> str:
        """The command's output ('' when it failed)."""
        rc, output = ssh(self.info, command, timeout=timeout)
        return output if rc == 0 else ""

    def running_jobs(self) -> list[Running]:
        """The cluster user's RUNNING jobs, as squeue lists them now (none when it cannot be asked)."""
        return parse_running(self.run(shlex.join(["squeue", "--me", "-h", "-t", "RUNNING", "-o", "%i|%j|%N"])))

    def busy_gpu_node(self) -> tuple[str, list[Running]] | None:
        """A GPU node running a job of the cluster user (the newest job's first), with the jobs running there."""
        jobs = self.running_jobs()
        for job in sorted(jobs, key=lambda item: -int(item.job_id)):
            for node in job.nodes:
                if node in self.env.nodes:
                    return node, [item for item in jobs if node in item.nodes]
        return None

    def node_usable(self, node: str) -> bool:
        """Whether ``sinfo`` shows the node in service."""
        state = self.run(shlex.join(["sinfo", "-h", "-N", "-n", node, "-o", "%T"])).strip()
        return bool(state) and not state.startswith(("down", "drain", "fail", "unknown", "not_responding"))

    def wait_usable(self, node: str, timeout: float = 120) -> None:
        """Wait until ``node`` is back in service (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.node_usable(node):
            time.sleep(2)

    def accounting(self, since: str) -> tuple[str, str]:
        """``sacct -X -D`` of the cluster user since ``since`` (every run of every job, epoch seconds) and
        ``squeue -t all`` of the user's jobs (what accounting may not have yet)."""
        sacct = ["sacct", "-X", "-D", "-n", "-P", "-u", self.env.user, "-S", since, "-o", ",".join(SACCT_FIELDS)]
        squeue = ["squeue", "--me", "-h", "-t", "all", "-o", SQUEUE_FORMAT]
        return (
            self.run("SLURM_TIME_FORMAT=%s " + shlex.join(sacct), timeout=120),
            self.run("SLURM_TIME_FORMAT=%s " + shlex.join(squeue)),
        )

    def store_flags(self) -> str:
        """slurmctld's ``AccountingStoreFlags`` (``job_script``, ``job_env``: what slurmdbd keeps of each job)."""
        for line in self.run(shlex.join(["scontrol", "show", "config"])).splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "AccountingStoreFlags":
                return value.strip()
        return ""


# ---------------------------------------------------------------------- faults


@dataclass
class Fault:
    """One fault of the schedule, and how it went."""

    at: float
    kind: str
    hold_s: float
    done: str = "not reached"
    #: The kind scheduled in this slot, when a kind that had not hit a running training yet took it.
    replaced: str = ""
    injected: bool = False
    #: The training jobs (``id name@nodes``) SLURM listed RUNNING, where the fault struck, as it was injected.
    running: tuple[str, ...] = ()

    @property
    def hit(self) -> bool:
        return self.injected and bool(self.running)


class Injector:
    """Injects the faults of the schedule, one at a time, in a thread; re-injects a kind until it hits a running
    training; keeps the login-host cuts' windows and the trainings it started to stop."""

    def __init__(
        self,
        cluster: Cluster,
        stack: Stack,
        faults: list[Fault],
        logs: Path,
        *,
        rng: random.Random,
        secret: str,
        base: Path,
        minutes: float,
    ) -> None:
        self.cluster, self.stack, self.faults, self.logs = cluster, stack, faults, logs
        self.rng, self.secret, self.base, self.minutes = rng, secret, base, minutes
        self.replacements: list[subprocess.Popen[bytes]] = []
        self.start = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self.hit: set[str] = set()
        self.owed: list[str] = []
        #: Every login-host cut, ``(cut, lifted)`` in epoch seconds.
        self.cuts: list[tuple[float, float]] = []
        #: The trainings a stopping fault started.
        self.victims: list[Training] = []
        self.timers: list[threading.Timer] = []
        self.scanned: Counter[str] = Counter()
        self.spool_leaks: list[str] = []
        self.stops = 0
        self.cancels = 0
        self.actions: dict[str, Callable[[Fault], str]] = {
            "sshd restart": self._sshd_restart,
            "login host cut off": self._login_cut,
            "slurmctld restart": self._slurmctld_restart,
            "slurmdbd stopped": self._slurmdbd,
            "node down under a job": self._node_down,
            "preempted by an urgent job": self._preempt,
            "triggerer SIGKILLed": self._triggerer,
            "worker SIGKILLed mid-submit": self._worker,
            "run stopped while its job runs": self._stop_run,
            "user cancel inside a login-host cut": self._cancel_in_cut,
        }

    @property
    def end(self) -> float:
        return self.start + self.minutes * 60

    def _run(self) -> None:
        for fault in self.faults:
            delay = self.start + fault.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if time.monotonic() >= self.end:
                fault.done = "not reached: the soak's time was up"
                continue
            kind = next_kind(fault.kind, self.hit, self.owed)
            if kind != fault.kind:
                low, high = FAULT_HOLD_S[kind]
                fault.replaced, fault.kind, fault.hold_s = fault.kind, kind, self.rng.uniform(low, high)
                print(
                    f"soak: fault {kind} instead of {fault.replaced}: it has not hit a running training yet", flush=True
                )
            self._scan_spools()
            began = time.monotonic() - self.start
            try:
                fault.done = f"{began:.0f} s: {self.actions[fault.kind](fault)}"
            except Exception as exc:  # reported in the table: the soak goes on
                fault.done = f"{began:.0f} s: injection failed: {type(exc).__name__}: {str(exc)[:200]}"
            settle_kind(fault.kind, fault.hit, self.hit, self.owed)
            where = f"; RUNNING then: {', '.join(fault.running)}" if fault.running else "; no training's job RUNNING"
            print(f"soak: fault {fault.kind}: {fault.done}{where if fault.injected else ''}", flush=True)

    # ------------------------------------------------------------------ what the fault hits

    def _await_running(self, limit: float = RUNNING_WAIT_S) -> list[Running]:
        """The user's RUNNING jobs, waiting up to ``limit`` (not past the soak's end) for one to run."""
        deadline = min(time.monotonic() + limit, self.end)
        while True:
            running = self.cluster.running_jobs()
            if running or time.monotonic() >= deadline:
                return running
            time.sleep(2)

    @staticmethod
    def _injected(fault: Fault, running: list[Running]) -> None:
        fault.injected = True
        fault.running = tuple(f"{job.job_id} {job.name}@{','.join(job.nodes)}" for job in running)

    def _scan_spools(self) -> None:
        """Search SLURM's spools for the secret now, while jobs live (slurmd removes a job's files at its end)."""
        spool = Path(self.cluster.env.state_dir) / "spool"
        label = "files searched for the secret: SLURM's spools, at each fault"
        for path in leaks([spool], self.secret, self.scanned, label):
            if not any(item.startswith(f"{path} (") for item in self.spool_leaks):  # each file once, when first seen
                self.spool_leaks.append(f"{path} (at {time.monotonic() - self.start:.0f} s)")

    # ------------------------------------------------------------------ the faults

    def _sshd_restart(self, fault: Fault) -> str:
        """The login sshd restarted: the harness restarts the login sshd, and every session of the soak's login
        sshd (the cut one) is reset, as a restarting login host drops them."""
        running = self._await_running()
        harness("restart-sshd")
        subprocess.run(["ss", "-K", "-t", "sport", "=", f":{self.cluster.cut_port}"], capture_output=True)
        self._injected(fault, running)
        return "login sshd restarted, the sessions of the soak's login sshd reset"

    def _slurmctld_restart(self, fault: Fault) -> str:
        running = self._await_running()
        harness("restart-slurmctld", timeout=180)
        self._injected(fault, running)
        return "slurmctld restarted"

    def _login_cut(self, fault: Fault) -> str:
        running = self._await_running()
        cut = time.time()
        harness("cut-login-head")
        try:
            self._injected(fault, running)
            time.sleep(fault.hold_s)
        finally:
            harness("restore-login")
            self.cuts.append((cut, time.time()))
        return f"slurmctld and slurmdbd unreachable from the login host for {fault.hold_s:.0f} s"

    def _slurmdbd(self, fault: Fault) -> str:
        running = self._await_running()
        harness("stop-slurmdbd")
        try:
            self._injected(fault, running)
            time.sleep(fault.hold_s)
        finally:
            harness("start-slurmdbd", timeout=180)
        return f"slurmdbd down for {fault.hold_s:.0f} s"

    def _node_down(self, fault: Fault) -> str:
        busy = self._wait_for_node()
        if busy is None:
            return "not injected: no job of the soak ran within 120 s"
        node, running = busy
        harness("node-down", node)
        self._injected(fault, running)
        try:
            time.sleep(fault.hold_s)
        finally:
            if not self.cluster.node_usable(node):  # slurmd may have brought it back already
                harness("node-resume", node)
            self.cluster.wait_usable(node)
        return f"{node} down for {fault.hold_s:.0f} s"

    def _preempt(self, fault: Fault) -> str:
        busy = self._wait_for_node()
        if busy is None:
            return "not injected: no job of the soak ran within 120 s"
        node, running = busy
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
        rc, out, err = as_other(env, shlex.join(argv))
        if rc != 0:
            raise RuntimeError(f"sbatch as {env.other_user}: {err.strip()}")
        self._injected(fault, running)
        return f"{env.other_user}'s job {out.strip()} on {env.urgent_partition} took {node} for {fault.hold_s:.0f} s"

    def _triggerer(self, fault: Fault) -> str:
        running = self._await_running()
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
        self._injected(fault, running)
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
        deadline = min(time.monotonic() + max(fault.hold_s, 120), self.end)
        while time.monotonic() < deadline:
            for ti in running_submits(self.stack):
                for pid in worker_pids(str(ti["id"])):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        self._injected(fault, self.cluster.running_jobs())
                        return f"{ti['dag_id']} {ti['dag_run_id']} map {ti['map_index']}: task process {pid} killed"
            time.sleep(0.2)
        return "not injected: no submit task ran within the window"

    def _stop_run(self, fault: Fault) -> str:
        """A training of its own stopped while its job runs and its sensor defers: the DAG run marked failed, or the
        sensor task marked failed (in turn). Its jobs must end CANCELLED within a minute, its files lose the secret."""
        how = STOP_PATHS[self.stops % len(STOP_PATHS)]
        found = self._victim(how)
        if isinstance(found, str):
            return found
        training, running = found
        self.stops += 1
        training.stopped_at = time.time()
        if how == "run marked failed":
            answer = self.stack.client.patch(training.path, json={"state": "failed"})
        else:
            answer = self.stack.client.patch(f"{training.path}/taskInstances/wait", json={"new_state": "failed"})
        if answer.status_code != 200:
            training.stopped_at = 0.0
            return f"not injected: {training.dag_id} {training.run_id}: PATCH {answer.status_code} {answer.text[:200]}"
        training.stop_how = how
        self._injected(fault, running)
        self._check_left_later(training, STOP_DEADLINE_S)
        return f"{training.dag_id} {training.run_id}: {how} while SLURM job {running[0].job_id} ran"

    def _cancel_in_cut(self, fault: Fault) -> str:
        """A training of its own cancelled by its user (its sensor marked failed) while the login host is cut off the
        head node (slurmctld, or slurmctld and slurmdbd, in turn): once the cut is lifted its job must end CANCELLED."""
        cut = CUTS[self.cancels % len(CUTS)]
        found = self._victim("user cancel inside a login-host cut")
        if isinstance(found, str):
            return found
        training, running = found
        self.cancels += 1
        began = time.time()
        harness(cut)
        try:
            time.sleep(CUT_SETTLE_S)
            training.stopped_at = time.time()
            answer = self.stack.client.patch(f"{training.path}/taskInstances/wait", json={"new_state": "failed"})
            if answer.status_code == 200:
                training.stop_how = f"user cancel inside a login-host cut ({cut})"
                self._injected(fault, running)
            else:
                training.stopped_at = 0.0
            time.sleep(fault.hold_s)
        finally:
            harness("restore-login")
            lifted = time.time()
            self.cuts.append((began, lifted))
        if not training.stop_how:
            return f"not injected: {training.dag_id} {training.run_id}: PATCH {answer.status_code} {answer.text[:200]}"
        training.lifted = lifted
        self._check_left_later(training, STOP_DEADLINE_S)
        return (
            f"{training.dag_id} {training.run_id}: cancelled {CUT_SETTLE_S:.0f} s into {cut} while SLURM job "
            f"{running[0].job_id} ran; the cut lifted {lifted - training.stopped_at:.0f} s later"
        )

    def _victim(self, why: str) -> tuple[Training, list[Running]] | str:
        """Trigger a long training for a stopping fault; return it once its job runs (SLURM) while its sensor defers
        (Airflow), with its RUNNING jobs, or why not."""
        training = Training(at=time.monotonic() - self.start, kind="single", conf=dict(VICTIM_CONF), cancel=False)
        training.victim = why
        training.run_id = self.stack.trigger(training.dag_id, training.conf)
        self.victims.append(training)
        print(f"soak: triggered {training.dag_id} {training.run_id} to be stopped ({why})", flush=True)
        deadline = min(time.monotonic() + VICTIM_WAIT_S, self.end)
        while time.monotonic() < deadline:
            time.sleep(3)
            running = self.cluster.running_jobs()
            wait = self.stack.client.get(f"{training.path}/taskInstances/wait")
            if not running or wait.status_code != 200 or wait.json().get("state") != "deferred":
                continue
            values = run_xcoms(self.stack, training)
            words = name_tokens(flatten(values))
            mine = [job for job in running if job.name in words]
            if mine:
                training.paths = paths_under(values, str(self.base))
                return training, mine
        return f"not injected: {training.dag_id} {training.run_id} had no job RUNNING with its sensor deferred in time"

    def _check_left_later(self, training: Training, delay: float) -> None:
        """Search the training's files for the secret ``delay`` seconds from now (its sidecar must be gone)."""

        def check() -> None:
            label = "files of stopped trainings searched for the secret, a minute on"
            training.secret_left = [
                str(path) for path in leaks([Path(p) for p in training.paths], self.secret, self.scanned, label)
            ]

        timer = threading.Timer(delay, check)
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    def _wait_for_node(self) -> tuple[str, list[Running]] | None:
        deadline = min(time.monotonic() + 120, self.end)
        while time.monotonic() < deadline:
            busy = self.cluster.busy_gpu_node()
            if busy:
                return busy
            time.sleep(2)
        return None

    def stop(self) -> None:
        """Stop the replacement triggerers; let the pending searches of stopped trainings finish."""
        for timer in self.timers:
            timer.join(STOP_DEADLINE_S + 10)
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
#: urgent job's length, the triggerer's downtime, the window a worker kill waits for a submit task, the cut after a
#: user's cancel inside it.
FAULT_HOLD_S = {
    "sshd restart": (0, 0),
    "login host cut off": (30, 60),
    "slurmctld restart": (0, 0),
    "slurmdbd stopped": (60, 120),
    "node down under a job": (20, 40),
    "preempted by an urgent job": (15, 30),
    "triggerer SIGKILLed": (5, 20),
    "worker SIGKILLed mid-submit": (60, 90),
    "run stopped while its job runs": (0, 0),
    "user cancel inside a login-host cut": (30, 60),
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
    #: The stopping fault that started it ('' for a training of the schedule).
    victim: str = ""
    #: When (epoch seconds) and how the user stopped it ('' when not), when the cut it fell in was lifted.
    stopped_at: float = 0.0
    stop_how: str = ""
    lifted: float | None = None
    #: Its files (the paths its XComs name), and those that still held the secret a minute after its stop.
    paths: list[str] = field(default_factory=list)
    secret_left: list[str] = field(default_factory=list)

    @property
    def dag_id(self) -> str:
        return DAGS[self.kind]

    @property
    def path(self) -> str:
        return run_path(self.dag_id, self.run_id)


def run_path(dag_id: str, run_id: str) -> str:
    return f"/api/v2/dags/{dag_id}/dagRuns/{url_quote(run_id, safe='')}"


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


def api_json(stack: Stack, path: str, *, headers: dict[str, str] | None = None, **params: Any) -> Any:
    """GET a JSON answer; None for a client error (404: no such thing) or a server error that lasted a minute; a lost
    connection is asked again for a minute (then it raises: the API server is gone)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = stack.client.get(path, params=params, headers=headers)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
            continue
        if answer.status_code < 400:
            try:
                return answer.json()
            except ValueError:
                return None
        if answer.status_code < 500 or time.monotonic() > deadline:
            return None
        time.sleep(2)


def api_pages(stack: Stack, path: str, key: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a paged collection (``key``: ``dag_runs``, ``task_instances``, ``xcom_entries``)."""
    items: list[dict[str, Any]] = []
    while True:
        answer = api_json(stack, path, limit=100, offset=len(items), **params) or {}
        page = list(answer.get(key) or [])
        items += page
        if not page or len(items) >= int(answer.get("total_entries") or 0):
            return items


def run_xcoms(stack: Stack, training: Training) -> list[Any]:
    """Every XCom value of a training's run (any task, any map index), as the API serves them."""
    values = []
    for entry in api_pages(stack, f"{training.path}/taskInstances/~/xcomEntries", "xcom_entries"):
        key = url_quote(str(entry["key"]), safe="")
        task = url_quote(str(entry["task_id"]), safe="")
        answer = api_json(
            stack, f"{training.path}/taskInstances/{task}/xcomEntries/{key}", map_index=entry["map_index"]
        )
        values.append(answer.get("value") if answer else None)
    return values


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
    stopped_at = time.time()
    answer = stack.client.patch(f"{training.path}/taskInstances/wait", json={"new_state": "failed"})
    if answer.status_code == 200:
        training.stopped_at, training.stop_how = stopped_at, "user cancel"
    training.cancelled_at = (
        f"{time.monotonic() - start:.0f} s" if answer.status_code == 200 else f"PATCH {answer.status_code}"
    )
    print(f"soak: cancelled {training.dag_id} {training.run_id}: {training.cancelled_at}", flush=True)


def drain(stack: Stack, trainings: list[Training], timeout: float) -> None:
    """Wait for every run to end (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        for training in trainings:
            if training.run_id and training.state not in ("success", "failed"):
                training.state = str(api_get(stack, training.path)["state"])
        if all(t.state in ("success", "failed") for t in trainings if t.run_id) or time.monotonic() > deadline:
            break
        time.sleep(5)


# ---------------------------------------------------------------------- what Airflow and SLURM recorded


@dataclass
class AirflowRecord:
    """What Airflow's REST API says of the soak's DAGs: the trainings (units) and every log and XCom text read."""

    units: list[Unit] = field(default_factory=list)
    runs: list[tuple[str, str, str]] = field(default_factory=list)
    #: ``(what, text)``: each try's log and each task instance's XComs, for the secret search.
    texts: list[tuple[str, str]] = field(default_factory=list)


def collect_airflow(stack: Stack) -> AirflowRecord:
    """Every run of the soak's DAGs, its task instances, their tries, each try's log and each instance's XComs."""
    record = AirflowRecord()
    as_json = {"Accept": "application/json"}
    for dag_id in DAGS.values():
        for run in api_pages(stack, f"/api/v2/dags/{dag_id}/dagRuns", "dag_runs"):
            run_id = str(run["dag_run_id"])
            record.runs.append((dag_id, run_id, str(run.get("state"))))
            path = run_path(dag_id, run_id)
            tis = api_pages(stack, f"{path}/taskInstances", "task_instances")
            tries: dict[tuple[str, int], Any] = {}
            logs: dict[tuple[str, int, int], str] = {}
            xcoms: dict[tuple[str, int], str] = {}
            for ti in tis:
                task, index = str(ti["task_id"]), int(ti["map_index"])
                prefix = f"{path}/taskInstances/{url_quote(task, safe='')}"
                answer = api_json(stack, f"{prefix}/{index}/tries" if index >= 0 else f"{prefix}/tries")
                tries[(task, index)] = answer or {}
                for attempt in parse_tries(answer or {}):
                    log = api_json(
                        stack,
                        f"{prefix}/logs/{attempt.try_number}",
                        headers=as_json,
                        map_index=index,
                        full_content="true",
                    )
                    text = log_text(log) if isinstance(log, dict) else ""
                    logs[(task, index, attempt.try_number)] = text
                    record.texts.append(
                        (f"the log of {dag_id} {run_id} {task}[{index}] try {attempt.try_number}", text)
                    )
                values = []
                for entry in api_pages(stack, f"{prefix}/xcomEntries", "xcom_entries", map_index=index):
                    key = url_quote(str(entry["key"]), safe="")
                    value = api_json(stack, f"{prefix}/xcomEntries/{key}", map_index=index)
                    values.append(value.get("value") if value else None)
                xcoms[(task, index)] = flatten(values)
                record.texts.append((f"the XCom of {dag_id} {run_id} {task}[{index}]", xcoms[(task, index)]))
            record.units += build_units(dag_id, run_id, tis, tries, logs, xcoms)
    return record


def stops_of(trainings: list[Training], cuts: list[tuple[float, float]]) -> dict[tuple[str, str], Stop]:
    """The judge's stops: each training the user stopped; a scheduled cancel that fell inside a login-host cut counts as
    one inside a cut (its jobs must end CANCELLED within a minute of the cut's end)."""
    stops = {}
    for training in trainings:
        if not (training.run_id and training.stop_how and training.stopped_at):
            continue
        how, lifted, bounded = training.stop_how, training.lifted, bool(training.victim)
        if not training.victim:
            window = next((cut for cut in cuts if cut[0] <= training.stopped_at <= cut[1]), None)
            if window is not None:
                how, lifted, bounded = "user cancel inside a login-host cut (scheduled)", window[1], True
        stops[(training.dag_id, training.run_id)] = Stop(
            at=training.stopped_at, how=how, lifted=lifted, bounded=bounded, secret_left=tuple(training.secret_left)
        )
    return stops


# ---------------------------------------------------------------------- checks


def read_records(base: Path) -> dict[str, dict[str, Any]]:
    """Every job record under the soak's results base (read on this machine: it is the storage's host)."""
    records = {}
    for path in sorted((base / "records").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            records[path.stem] = json.loads(path.read_text())
    return records


def audit_records(found: Findings, records: dict[str, dict[str, Any]], jobs: dict[str, Job]) -> None:
    """The provider's job records against accounting: an audit of the provider (the judge does not read them)."""
    found.evidence["the provider's job records audited against accounting"] = len(records)
    for job_id, record in sorted(records.items()):
        ref = str(record.get("backend_ref") or "")
        terminal = record.get("terminal_state")
        job = jobs.get(ref)
        state = job.state if job is not None else ""
        if not ref:
            found.notes.append(f"record {job_id}: no SLURM job bound (terminal {terminal})")
        elif terminal is None:
            found.violations.append(f"record {job_id}: no terminal state (SLURM job {ref}: {state or 'not found'})")
        elif RECORD_STATE.get(state) != terminal:
            found.violations.append(f"record {job_id}: terminal {terminal}, accounting {state or 'no row'} (job {ref})")


def check(
    cluster: Cluster,
    stack: Stack,
    injector: Injector,
    trainings: list[Training],
    started: float,
    base: Path,
    secret: str,
    logs: list[Path],
) -> Findings:
    """Judge the soak from Airflow's API and SLURM's accounting, then search the secret and audit the records.

    :param started: when the soak began (epoch seconds): accounting is asked from then on.
    """
    sacct, squeue = cluster.accounting(datetime.fromtimestamp(started).strftime("%Y-%m-%dT%H:%M:%S"))
    jobs = parse_sacct(sacct)
    live = add_squeue(jobs, squeue)
    earlier = submitted_before(jobs, started)
    airflow = collect_airflow(stack)
    stops = stops_of(trainings, injector.cuts)
    found = judge(jobs, airflow.units, stops, kinds={dag: kind for kind, dag in DAGS.items()})
    found.evidence["live jobs only squeue listed"] = len(live)
    for job in earlier.values():
        found.notes.append(f"{job.describe()} was submitted before the soak began: not judged")
    triggered = {(t.dag_id, t.run_id) for t in trainings if t.run_id}
    for dag_id, run_id, state in airflow.runs:
        if (dag_id, run_id) not in triggered:
            found.notes.append(f"{dag_id} {run_id} ({state}): a run the soak did not trigger")
    for dag_id, run_id in sorted(triggered - {(dag, run) for dag, run, _ in airflow.runs}):
        found.violations.append(f"{dag_id} {run_id}: triggered, but the API does not list the run")
    found.violations += fault_rows(injector.faults)[1]
    # The secret: in nothing Airflow serves, on storage, in Airflow's home, in SLURM's state, spools and logs.
    for what, text in airflow.texts:
        found.evidence["Airflow logs and XCom texts searched for the secret (API)"] += 1
        if secret in text:
            found.violations.append(f"the secret is in {what}")
    for path in leaks([base, *logs], secret, found.evidence, "files searched for the secret: Airflow and storage"):
        found.violations.append(f"the secret is in {path}")
    slurm_dirs = [Path(cluster.env.state_dir) / name for name in SLURM_SECRET_DIRS]
    for path in leaks(slurm_dirs, secret, found.evidence, "files searched for the secret: SLURM's state and logs"):
        found.violations.append(f"the secret is in {path}")
    found.violations += [f"the secret was in {item}" for item in injector.spool_leaks]
    found.evidence.update(injector.scanned)
    flags = cluster.store_flags()
    stored = [flag for flag in ("job_script", "job_env") if flag in flags]
    for job_id in sorted(jobs, key=int) if stored else []:
        argv = ["sacct", "-j", job_id, *(["--batch-script"] if "job_script" in stored else [])]
        argv += ["--env-vars"] if "job_env" in stored else []
        found.evidence["jobs whose stored script and environment accounting was asked for"] += 1
        if secret in cluster.run(shlex.join(argv)):
            found.violations.append(f"the secret is in what accounting stores of SLURM job {job_id}")
    if not stored:
        found.notes.append(
            f"accounting stores no job script or environment (AccountingStoreFlags: {flags or 'none'}): none to search"
        )
    audit_records(found, read_records(base), jobs)
    return found


# ---------------------------------------------------------------------- report


def fault_rows(faults: list[Fault]) -> tuple[list[tuple[str, int, int, int]], list[str]]:
    """Each fault kind's slots, injections and hits on a running training; a violation per kind that never hit one."""
    return fault_table([Injection(f.kind, f.injected, f.hit) for f in faults], FAULT_KINDS)


def table(
    seed: int, minutes: float, trainings: list[Training], faults: list[Fault], found: Findings, meta: dict[str, str]
) -> str:
    """The soak's section of RELIABILITY.md."""
    rows = fault_rows(faults)[0]
    victims = sum(1 for t in trainings if t.run_id and t.victim)
    lines = [
        "## Soak (`make soak`)",
        "",
        f"Seed {seed}, {minutes:g} minutes, {sum(1 for t in trainings if t.run_id)} trainings ({victims} started by a "
        f"fault to be stopped); commit `{meta['commit']}`, started {meta['date']}, took {meta['took']}. Faults from "
        "`tests/cluster/harness.py`, one at a time.",
        "",
        "The judge (`tests/cluster/soak_judge.py`) imports nothing of the provider. Its sources: Airflow's REST API "
        "(the DAG runs, task instances and map indexes, every try's start, end and state, every try's log and every "
        "task instance's XCom) and SLURM's accounting (`sacct -X -D` of the soak's user, `squeue`). A job belongs to "
        "the training whose tries' log or XCom names it, or that SLURM ran from the same batch script (`SubmitLine`), "
        "and to the try that ran when SLURM took it (`Submit`); any other job of the user is an orphan.",
        "",
        "| fault | slots | injected | hit a running training |",
        "|---|---|---|---|",
        *[f"| {kind} | {slots} | {injected} | {hits} |" for kind, slots, injected, hits in rows],
        "",
        "| matched (Airflow ↔ SLURM) | count |",
        "|---|---|",
        *[f"| {what} | {count} |" for what, count in found.matching.items()],
        "",
        "| watches and stops | count |",
        "|---|---|",
        *[f"| {what} | {count} |" for what, count in found.watches.items()],
        "",
        "| training: Airflow / SLURM | count |",
        "|---|---|",
        *[f"| {outcome} | {count} |" for outcome, count in sorted(found.outcomes.items())],
        "",
        "| also checked | count |",
        "|---|---|",
        *[f"| {what} | {count} |" for what, count in found.evidence.items()],
        "",
        f"**Violations: {len(found.violations)}.**",
        "",
        *[f"- {item}" for item in found.violations],
    ]
    if found.notes:
        lines += ["", "Notes:", "", *[f"- {item}" for item in found.notes]]
    lines += ["", "Faults as injected:", ""]
    for fault in faults:
        instead = f" (instead of {fault.replaced})" if fault.replaced else ""
        hit = " **hit**" if fault.hit else ""
        lines.append(f"- {fault.kind}{instead}: {fault.done}{hit}")
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
    if cluster.run(shlex.join(["head", "-c", "4", "--", image])) != "hsqs":
        rm, imp = ["rm", "-f", "--", image], ["enroot", "import", "-o", image, SOAK_IMAGE]
        cluster.run(shlex.join(rm) + " && " + shlex.join(imp), 120)
    tag = f"soak-{seed}-{uuid.uuid4().hex[:6]}"
    base = Path(env.results_dir) / tag
    secret = f"soak-{uuid.uuid4().hex}"
    meta = {"commit": tested_commit(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    soak_started = time.time()
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
        injector = Injector(
            cluster,
            stack,
            faults,
            stack.home,
            rng=random.Random(seed + 1),
            secret=secret,
            base=base,
            minutes=args.minutes,
        )
        try:
            begin = time.monotonic()
            injector.start = begin
            injector.thread.start()
            drive(stack, trainings, begin, args.minutes)
            injector.thread.join()
            trainings += injector.victims
            print("soak: waiting for every run to end", flush=True)
            drain(stack, trainings, DRAIN_S)
            for timer in injector.timers:
                timer.join(STOP_DEADLINE_S + 10)
            logs = [stack.home / "logs", stack.log, *stack.home.glob("triggerer-*.log"), stack.home / "airflow.db"]
            found = check(cluster, stack, injector, trainings, soak_started, base, secret, logs)
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
