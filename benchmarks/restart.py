"""Benchmark: recovery after a real triggerer restart, shared poller vs the SSH provider's per-job trigger.

A real ``airflow triggerer`` (Airflow's own command, its supervisor and trigger-runner processes) runs N
deferred triggers over N held SLURM jobs; it is killed with SIGKILL (the whole process group, as a
crashed host) and a new ``airflow triggerer`` is started at once, the same moment in both modes. The new
one takes the orphaned triggers over once the dead one's heartbeat is older than
``[triggerer] triggerer_health_check_threshold`` (:data:`HEALTH_CHECK_THRESHOLD_S`, heartbeat every
:data:`HEARTBEAT_S`; identical in both modes), starts them and polls. Per restart:

- kill -> every trigger's state known: from the SIGKILL to the last job's first answer in the new triggerer;
- new triggerer's first trigger running -> every state known: from its first trigger's ``run()`` to the
  last job's first answer (the triggerer's own start-up and the takeover delay left out); it includes how
  long the triggerer takes to start all N triggers (first -> last ``run()``, printed beside it), which no
  trigger controls;
- each trigger's ``run()`` -> its job's state known (p95 and max over the N triggers): what a trigger
  adds once the triggerer started it, the figure the 1 s target applies to;
- the cluster user's slurmctld RPCs from the kill to every state known (``sdiag`` by user), and what
  SLURM's default ``rl_enable`` bucket would do with them sent all at once (``benchmarks/ratelimit.py``), for
  reference: a full bucket takes any burst up to its size, so that row has no verdict (the RPC count is the figure).

"State known" is each trigger's first poll result, recorded by observing subclasses of the two triggers
(``benchmarks/_restart_probe.py``: shared mode around the shared poller's status query, baseline at the
end of the SSH trigger's first complete poll); the triggers themselves are unchanged.

The DAG run and its deferred task instances are rows in a benchmark metadata database (the isolated
``AIRFLOW_HOME`` of :mod:`_common`, SQLite: one triggerer runs at a time), written through Airflow's ORM
the way a task's deferral writes them: a ``trigger`` row per task instance (``Trigger.from_object``) and the
task instance ``deferred`` on it. N task instances (map indexes 0..N-1) of a one-task DAG, serialized by
``airflow dags reserialize``: the triggerer builds each trigger's workload from the task instance as it does
for any deferred task. No scheduler runs (nothing else touches the rows); the jobs stay held, so no trigger
fires during the measurement.

Both modes watch through the login sshd of :data:`_common.LIMITS_PID_FILE` (OpenSSH's default limits,
PAM on); its CPU time from the kill to every state known is read from its own cgroup.

Usage: ``python benchmarks/restart.py [--n 1000] [--samples 5] [--interval 10]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common  # before Airflow: isolated Airflow home and the bench connections
from _common import Figure
from _restart_probe import PROBE_ENV, ObservedSlurmJobTrigger, ObservedSSHRemoteJobTrigger
from poller import _create_job_files, job_files
from ratelimit import DEFAULT_BUCKET_SIZE, DEFAULT_REFILL_PER_S, throttle

_common.point_connections_at(int(_common.CLUSTER["limits_port"]))

#: The code this benchmark measures (the triggerer's side: the trigger, its shared poller, the hook and what they use);
#: report.py counts the commits that changed it since.
MEASURES = (
    "airflow_provider_tao_slurm/triggers",
    "airflow_provider_tao_slurm/hooks",
    "airflow_provider_tao_slurm/lifecycle",
    "airflow_provider_tao_slurm/core",
    "airflow_provider_tao_slurm/exceptions.py",
)

DAG_ID = "bench_restart"
TASK_ID = "wait"
#: ``[triggerer] job_heartbeat_sec`` and ``triggerer_health_check_threshold`` of every triggerer started here.
HEARTBEAT_S = 2
HEALTH_CHECK_THRESHOLD_S = 10
#: How long a triggerer may take to bring every trigger to its first answer.
KNOWN_TIMEOUT_S = 600.0
#: Target at N = 1000: each trigger's job state known this long after the triggerer started the trigger.
RUNNING_TO_KNOWN_TARGET_S = 1.0
DAG_SOURCE = f"""
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG({DAG_ID!r}, schedule=None):
    EmptyOperator(task_id={TASK_ID!r})
"""


def _airflow_env() -> dict[str, str]:
    """The environment of every ``airflow`` command here: the benchmark's home, the probes importable."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": str(HEARTBEAT_S),
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(HEALTH_CHECK_THRESHOLD_S),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }


def _airflow(*argv: str) -> None:
    """Run an ``airflow`` command to its end; raise with its output when it fails."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), *argv],
        env=_airflow_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(argv)} failed (rc {proc.returncode}): {proc.stderr[-2000:]}")


def prepare_database() -> None:
    """Create the benchmark's metadata database and serialize its one-task DAG."""
    os.environ.setdefault("AIRFLOW__CORE__FERNET_KEY", _fernet_key())
    home = Path(os.environ["AIRFLOW_HOME"])
    (home / "dags").mkdir(parents=True, exist_ok=True)
    (home / "dags" / f"{DAG_ID}.py").write_text(DAG_SOURCE)
    _airflow("db", "migrate")
    _airflow("dags", "reserialize")


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def defer(mode: str, job_ids: list[str], interval: float, files: str | None) -> None:
    """Write a DAG run with one task instance per job, each deferred on its mode's trigger (Airflow's ORM)."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    with create_session() as session:
        model = SerializedDagModel.get(DAG_ID, session=session)
        assert model is not None, f"{DAG_ID} is not serialized"
        now = timezone.utcnow()
        model.dag.create_dagrun(
            run_id=mode,
            run_after=now,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            session=session,
        )
        task = model.dag.get_task(TASK_ID)
        for index, job_id in enumerate(job_ids):
            trigger = Trigger.from_object(_trigger(mode, job_id, interval, files))
            session.add(trigger)
            session.flush()
            ti = TaskInstance(task, dag_version_id=model.dag_version_id, run_id=mode, map_index=index)
            ti.state = TaskInstanceState.DEFERRED
            ti.trigger_id = trigger.id
            ti.try_number = 1
            ti.next_method = "execute_complete"
            session.add(ti)


def _trigger(mode: str, job_id: str, interval: float, files: str | None) -> Any:
    """The trigger a deferred task of ``mode`` waits on."""
    if mode == "shared":
        return ObservedSlurmJobTrigger(
            _common.SLURM_CONN_ID, job_id, f"bench-{job_id}", interval, submitted_at=time.time()
        )
    assert files is not None, "the baseline watches files"
    exit_code_file, log_file = job_files(files, job_id)
    return ObservedSSHRemoteJobTrigger(
        ssh_conn_id=_common.SSH_CONN_ID,
        remote_host=None,
        job_id=job_id,
        job_dir=f"{files}/{job_id}",
        log_file=log_file,
        exit_code_file=exit_code_file,
        remote_os="posix",
        poll_interval=interval,  # type: ignore[arg-type]  # seconds; asyncio.sleep takes a float
    )


def undefer(mode: str) -> None:
    """Remove the mode's DAG run, its task instances and their triggers."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import delete, select

    with create_session() as session:
        trigger_ids = select(TaskInstance.trigger_id).where(TaskInstance.run_id == mode)
        session.execute(delete(Trigger).where(Trigger.id.in_(trigger_ids)).execution_options(synchronize_session=False))
        session.execute(delete(TaskInstance).where(TaskInstance.run_id == mode))
        session.execute(delete(DagRun).where(DagRun.run_id == mode))


# ------------------------------------------------------------------------------------ triggerers


@dataclass
class Probe:
    """What one triggerer's observed triggers recorded (``_restart_probe``): per job, first start and answer."""

    started: dict[str, float]
    known: dict[str, float]
    gave_up: set[str]

    @classmethod
    def read(cls, path: Path) -> Probe:
        started: dict[str, float] = {}
        known: dict[str, float] = {}
        gave_up: set[str] = set()
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                kind, job_id, at = line.split()
                if kind == "start":
                    started.setdefault(job_id, float(at))
                elif kind == "known":
                    known.setdefault(job_id, float(at))
                elif kind == "gaveup":
                    gave_up.add(job_id)
        return cls(started, known, gave_up)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_triggerer(probe: Path, log: Path, capacity: int) -> subprocess.Popen[bytes]:
    """Start ``airflow triggerer`` in a session of its own, its triggers recording into ``probe``."""
    probe.unlink(missing_ok=True)
    env = {
        **_airflow_env(),
        PROBE_ENV: str(probe),
        "AIRFLOW__TRIGGERER__CAPACITY": str(capacity),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "triggerer"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill(proc: subprocess.Popen[bytes]) -> float:
    """SIGKILL the triggerer's process group (supervisor and trigger runner); the moment of the kill."""
    at = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return at


def wait_known(probe: Path, job_ids: list[str], proc: subprocess.Popen[bytes], log: Path) -> Probe:
    """Wait until every job's state is known (or its trigger gave up) in the triggerer writing ``probe``."""
    deadline = time.monotonic() + KNOWN_TIMEOUT_S
    while True:
        seen = Probe.read(probe)
        if len(seen.known.keys() | seen.gave_up) >= len(job_ids):
            return seen
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"the triggerer knew {len(seen.known)} of {len(job_ids)} states "
                f"(rc {proc.returncode}); {log}:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.2)


def run_mode(mode: str, n: int, samples: int, interval: float) -> dict[str, Any]:
    """N held jobs deferred on ``mode``'s triggers; a first triggerer, then ``samples`` SIGKILL + restart."""
    job_ids = _common.create_held_jobs(f"bench-{_common.TOKEN}-restart-{mode}{n}", n)
    files = f"{_common.CLUSTER['results_dir']}/bench-{_common.TOKEN}-restart{n}" if mode == "baseline" else None
    log = _common.OUT_DIR / f"restart-{mode}-{n}.log"
    log.unlink(missing_ok=True)
    login = _common.LoginCgroup.attach()
    runs: list[dict[str, float | int]] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        if files is not None:
            _create_job_files(files, job_ids)
        defer(mode, job_ids, interval, files)
        probe = _common.OUT_DIR / f"restart-{mode}-{n}-0.probe"
        proc = start_triggerer(probe, log, n)
        first = wait_known(probe, job_ids, proc, log)
        user = str(_common.CLUSTER["user"])
        for k in range(1, samples + 1):
            login0 = login.cpu_seconds() if login else float("nan")
            rpcs0 = _common.ctld_rpcs_by_user().get(user, 0)
            killed_at = kill(proc)
            probe = _common.OUT_DIR / f"restart-{mode}-{n}-{k}.probe"
            proc = start_triggerer(probe, log, n)
            seen = wait_known(probe, job_ids, proc, log)
            rpcs = _common.ctld_rpcs_by_user().get(user, 0) - rpcs0
            last_known = max(seen.known.values(), default=float("nan"))
            lags = sorted(seen.known[job] - seen.started[job] for job in seen.known.keys() & seen.started.keys())
            runs.append(
                {
                    "kill_to_known_s": last_known - killed_at,
                    "running_to_known_s": last_known - min(seen.started.values()),
                    "kill_to_first_running_s": min(seen.started.values()) - killed_at,
                    "first_to_last_running_s": max(seen.started.values()) - min(seen.started.values()),
                    "trigger_known_p95_s": lags[min(len(lags) - 1, int(0.95 * len(lags)))],
                    "trigger_known_max_s": lags[-1],
                    "never_known": len(seen.gave_up - seen.known.keys()),
                    "login_cpu_s": (login.cpu_seconds() if login else float("nan")) - login0,
                    "ctld_rpcs": rpcs,
                }
            )
            print(f"  {mode} N={n} restart {k}: {runs[-1]}", flush=True)
    finally:
        if proc is not None:
            kill(proc)
        _common.cancel_jobs(job_ids)
        undefer(mode)
        if files is not None:
            _common.remove_remote([files])
    return {
        "mode": mode,
        "n": n,
        "interval_s": interval,
        "first_triggerer_known_s": max(first.known.values()) - min(first.started.values()),
        "restarts": runs,
    }


# ------------------------------------------------------------------------------------ figures


def _spread(values: list[float], fmt: str = ".2f") -> str:
    """``min / median / max`` of the samples."""
    return " / ".join(format(v, fmt) for v in (min(values), _common.median(values), max(values)))


def figures(n: int, shared: dict[str, Any], base: dict[str, Any]) -> list[Figure]:
    """The restart figures (min / median / max over the restarts); the time target applies at N = 1000."""
    count = len(shared["restarts"])
    at_target = n >= 1000

    def column(run: dict[str, Any], key: str) -> list[float]:
        return [float(r[key]) for r in run["restarts"]]

    def row(name: str, key: str, target: str = "", ok: bool | None = None) -> Figure:
        ours, theirs = column(shared, key), column(base, key)
        ratio = _common.median(ours) / _common.median(theirs) if _common.median(theirs) else float("nan")
        return Figure(
            f"N={n} real triggerer restart ({count} SIGKILLs): {name}, min / median / max",
            _spread(ours),
            f"{_spread(theirs)}, median ratio {ratio:.3f}x",
            target,
            ok,
        )

    lag = column(shared, "trigger_known_max_s")
    never = sum(int(r["never_known"]) for r in shared["restarts"])
    bursts = [throttle([0.0] * int(r["ctld_rpcs"])) for r in shared["restarts"]]
    return [
        row(
            f"kill -> every state known, s (takeover after the dead heartbeat: threshold {HEALTH_CHECK_THRESHOLD_S} s, "
            f"heartbeat {HEARTBEAT_S} s)",
            "kill_to_known_s",
        ),
        row("kill -> new triggerer's first trigger running, s", "kill_to_first_running_s"),
        row("new triggerer's first trigger running -> every state known, s", "running_to_known_s"),
        row("  of which the triggerer starting its N triggers (first -> last run()), s", "first_to_last_running_s"),
        row("each trigger's run() -> its job's state known, p95 over the N triggers, s", "trigger_known_p95_s"),
        row(
            "each trigger's run() -> its job's state known, max over the N triggers, s",
            "trigger_known_max_s",
            f"<= {RUNNING_TO_KNOWN_TARGET_S:g} at N=1000" if at_target else "",
            max(lag) <= RUNNING_TO_KNOWN_TARGET_S if at_target else None,
        ),
        row("login node CPU s from the kill to every state known (sshd + commands, own cgroup)", "login_cpu_s"),
        row("slurmctld RPCs of the cluster user from the kill to every state known", "ctld_rpcs"),
        Figure(  # information: a full bucket takes any burst of up to its size, so this row has no verdict
            f"N={n} real triggerer restart: those RPCs at once through the default rl_enable bucket "
            f"({DEFAULT_BUCKET_SIZE} tokens, +{DEFAULT_REFILL_PER_S:g}/s), worst restart",
            f"{max(b.throttled for b in bursts)} throttled",
            f"for reference: a full bucket takes up to {DEFAULT_BUCKET_SIZE} RPCs at once (the RPCs: the row above)",
        ),
        Figure(
            f"N={n} real triggerer restart: jobs whose state was never known (trigger gave up), all restarts",
            f"{never}",
            f"{sum(int(r['never_known']) for r in base['restarts'])}",
            "0",
            never == 0,
        ),
    ]


def main() -> None:
    """Run both modes, print the figures and store them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args()
    _common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        prepare_database()
        base = run_mode("baseline", args.n, args.samples, args.interval)
        shared = run_mode("shared", args.n, args.samples, args.interval)
    finally:  # the metadata database and N task logs per triggerer: hundreds of MB at N = 1000
        shutil.rmtree(os.environ["AIRFLOW_HOME"], ignore_errors=True)
    rows = figures(args.n, shared, base)
    _common.print_figures(
        f"Real triggerer restart, N={args.n}, {args.samples} SIGKILLs per mode, interval {args.interval:g} s "
        "(shared poller; baseline SSHRemoteJobTrigger)",
        rows,
    )
    details = {"runs": [base, shared], "wall_s": time.monotonic() - started}
    _common.write_result("restart", "Real triggerer restart (benchmarks/restart.py)", rows, details, measures=MEASURES)
    print(f"\nrestart.py: {details['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
