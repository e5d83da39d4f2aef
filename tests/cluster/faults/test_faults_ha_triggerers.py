"""Fault suite: Airflow's high-availability setup, two triggerers on a PostgreSQL metadata database.

Real Airflow 3.3 processes (api-server, scheduler with the LocalExecutor, dag-processor and two
``airflow triggerer`` processes, each capped at :data:`CAPACITY` triggers) share a database on the
harness's PostgreSQL (``tests/cluster/harness.py``), with the repo's ``dags/`` and the test cluster's
``slurm_default`` connection. :data:`RUNS` runs of ``example_tao_singlenode`` train at once; each
triggerer gets some of their sensors. One triggerer is then killed with SIGKILL (the process and its
trigger runner, as a crashed host): the other takes its triggers over once the dead one's heartbeat is
older than ``triggerer_health_check_threshold`` (10 s here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as url_quote

import httpx
import pytest
from airflow_stack import unpause
from demo import DAG_ID, airflow_bin, connection_uri_json, free_port, prepare_airflow, stage_assets

from airflow_provider_tao_slurm.core.shell import quote

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: DAG runs training at once.
RUNS = 3
#: Triggers one triggerer runs at most (``[triggerer] capacity``): spreads the sensors over both.
CAPACITY = 2
TRAIN = "python3 /srv/lustre/demo/tao_like_train.py --spec {config_path} --results {results_dir} --epoch-seconds 2"
CONF = {"spec": {"epochs": 10, "batch_size": 4, "learning_rate": 0.001}, "command": TRAIN}
START_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 240.0


def _psql(cluster: ClusterEnv, sql: str, database: str = "postgres") -> str:
    """Run SQL on the harness's PostgreSQL as its superuser; the unaligned, tuples-only answer."""
    return subprocess.run(
        [
            "psql",
            "-h",
            cluster.host,
            "-p",
            str(cluster.postgres_port),
            "-U",
            "postgres",
            "-d",
            database,
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def _tree(root: int) -> list[int]:
    """``root`` and every process under it."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
    tree = {root}
    while True:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        if not children:
            return sorted(tree)
        tree |= children


def _ssh_connections(pids: list[int], cluster: ClusterEnv) -> int:
    """Established TCP connections to the login sshd held by any of ``pids`` (``ss -tnp``)."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", "dst", f"{cluster.host}:{cluster.port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(any(f"pid={pid}," in line for pid in pids) for line in out.splitlines())


@dataclass
class HA:
    """The running processes and how to reach them."""

    url: str
    client: httpx.Client
    home: Path
    db: str
    triggerers: dict[str, subprocess.Popen[bytes]]

    def get(self, path: str) -> Any:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json()


def _start(name: str, argv: list[str], env: dict[str, str], home: Path) -> subprocess.Popen[bytes]:
    log = (home / f"{name}.log").open("wb")
    return subprocess.Popen(
        [airflow_bin(), *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's session, then SIGKILL what is left of it."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
            return


@pytest.fixture(scope="module")
def ha(cluster: ClusterEnv) -> Iterator[HA]:
    """Airflow on PostgreSQL with two triggerers; everything stopped and the database dropped afterwards."""
    info = dataclasses.asdict(cluster)
    stage_assets(info)
    db = f"airflow_ha_{uuid.uuid4().hex[:8]}"
    _psql(cluster, f"CREATE DATABASE {db}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="tao-airflow-ha-") as tmp:
        home = Path(tmp)
        try:
            env = prepare_airflow(
                info,
                home,
                {
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
                        f"postgresql+psycopg2://postgres@{cluster.host}:{cluster.postgres_port}/{db}"
                    ),
                    "AIRFLOW_CONN_SLURM_DEFAULT": connection_uri_json(info),
                    "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                    "AIRFLOW__CORE__PARALLELISM": "8",
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                    "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "1",
                    "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2",
                    "AIRFLOW__API__HOST": "127.0.0.1",
                    "AIRFLOW__API__PORT": str(port),
                    "AIRFLOW__API__BASE_URL": url,
                    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
                    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                    "AIRFLOW__TRIGGERER__CAPACITY": str(CAPACITY),
                    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
                    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
                    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                },
            )
            env["PATH"] = f"{Path(airflow_bin()).parent}{os.pathsep}{env.get('PATH', '')}"
            for name, argv in (
                ("api-server", ["api-server"]),
                ("scheduler", ["scheduler"]),
                ("dag-processor", ["dag-processor"]),
            ):
                processes.append(_start(name, argv, env, home))
            triggerers = {
                name: _start(
                    name, ["triggerer"], {**env, "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())}, home
                )
                for name in ("triggerer-a", "triggerer-b")
            }
            processes += triggerers.values()
            client = httpx.Client(base_url=url, timeout=30)
            _wait_healthy(client, home)
            yield HA(url=url, client=client, home=home, db=db, triggerers=triggerers)
            client.close()
        finally:
            for proc in processes:
                _stop(proc)
            with contextlib.suppress(subprocess.CalledProcessError):
                _psql(cluster, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def _wait_healthy(client: httpx.Client, home: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    health: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            health = client.get("/api/v2/monitor/health").json()
            if all(
                (health.get(part) or {}).get("status") == "healthy"
                for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
            ):
                return
        time.sleep(0.5)
    logs = "".join(f"\n--- {log.name}\n{log.read_text()[-1500:]}" for log in sorted(home.glob("*.log")))
    pytest.fail(f"Airflow on PostgreSQL did not become healthy ({health}):{logs}")


def _run_path(run_id: str) -> str:
    return f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(run_id, safe='')}"


def _trigger_runs(ha: HA) -> list[str]:
    unpause(ha.client, DAG_ID, START_TIMEOUT_S)
    run_ids = []
    for _ in range(RUNS):
        response = ha.client.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": CONF})
        response.raise_for_status()
        run_ids.append(str(response.json()["dag_run_id"]))
    return run_ids


def _assignments(cluster: ClusterEnv, db: str) -> dict[int, int]:
    """SlurmJobTriggers per triggerer job id (only triggers a triggerer holds)."""
    rows = _psql(
        cluster,
        "SELECT triggerer_id, count(*) FROM trigger WHERE classpath = 'airflow_provider_tao_slurm.triggers."
        "slurm_job.SlurmJobTrigger' AND triggerer_id IS NOT NULL GROUP BY triggerer_id",
        db,
    )
    return {int(a): int(b) for a, b in (line.split("|") for line in rows.split())}


def test_two_triggerers_share_the_sensors_and_one_takes_over_when_the_other_is_killed(
    ha: HA, cluster: ClusterEnv, ssh_run: SshRun, record_property: Any
) -> None:
    """Three runs train for 20 s each while two triggerers (capacity 2 each) run their sensors; then one
    triggerer is SIGKILLed (its sensors can only end if the other takes them over). Expected: the sensors
    were spread over both triggerers; each triggerer process held ONE SSH connection to the login host
    (shared by all its triggers); after the kill the other took the orphaned triggers over; every run
    succeeded without a sensor retry; each run's job was submitted once and completed (sacct by name: one
    row, COMPLETED)."""
    run_ids = _trigger_runs(ha)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    spread: dict[int, int] = {}
    while time.monotonic() < deadline:
        spread = _assignments(cluster, ha.db)
        if sum(spread.values()) == RUNS:
            break
        time.sleep(1)
    assert len(spread) == 2, f"sensors per triggerer job: {spread}"
    connections: dict[str, int] = {}
    while time.monotonic() < deadline:  # a trigger connects on its first poll, just after it starts running
        connections = {name: _ssh_connections(_tree(proc.pid), cluster) for name, proc in ha.triggerers.items()}
        if all(connections.values()):
            break
        time.sleep(0.5)
    time.sleep(3)  # a few more polls: still one connection each
    connections = {name: _ssh_connections(_tree(proc.pid), cluster) for name, proc in ha.triggerers.items()}
    assert connections == {"triggerer-a": 1, "triggerer-b": 1}, connections
    victim = ha.triggerers["triggerer-a"]
    for pid in _tree(victim.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {run_id: ha.get(_run_path(run_id))["state"] for run_id in run_ids}
        if all(state in ("success", "failed") for state in states.values()):
            break
        time.sleep(1)
    took = time.monotonic() - killed_at
    assert set(states.values()) == {"success"}, states
    for run_id in run_ids:
        wait = ha.get(f"{_run_path(run_id)}/taskInstances/wait")
        assert wait["try_number"] == 1, wait
        handle = ha.get(f"{_run_path(run_id)}/taskInstances/submit/xcomEntries/return_value?deserialize=true")
        value = handle["value"]
        job = json.loads(value) if isinstance(value, str) else value
        _, out, _ = ssh_run(f"sacct -X -n -P --starttime=now-1days --name={quote(job['job_id'])} -o JobIDRaw,State")
        assert out.split() == [f"{job['slurm_job_id']}|COMPLETED"], (run_id, out)
    record_property("sensors per triggerer job before the kill", json.dumps(spread))
    record_property("SSH connections per triggerer process", json.dumps(connections))
    record_property("seconds from the kill to the last run's end", round(took, 1))
