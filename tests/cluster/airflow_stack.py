"""A real ``airflow standalone`` against the local SLURM test cluster, for the tests that need the services.

:func:`standalone` starts api-server, scheduler (LocalExecutor), dag-processor and triggerer in
their own Airflow home with the ``slurm_default`` connection of ``tests/cluster/demo.py``, no login
(``SIMPLE_AUTH_MANAGER_ALL_ADMINS``) and their own free ports on 127.0.0.1; it stops them with
SIGINT (``airflow standalone`` only shuts its components down on KeyboardInterrupt) and kills
whatever is left of its session by PID.
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from demo import airflow_bin, connection_uri_json, free_port, prepare_airflow, stage_assets

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv

#: Seconds allowed for the services to become healthy, and to stop; for a DAG to be parsed.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
PARSE_TIMEOUT_S = 60.0


def session_pids(sid: int) -> list[int]:
    """PIDs of the processes in session ``sid`` (field 6 of ``/proc/PID/stat``)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            pids.append(int(stat.parent.name))
    return pids


@dataclass(frozen=True)
class Stack:
    """A running ``airflow standalone``."""

    url: str
    home: Path
    log: Path
    client: httpx.Client
    env: dict[str, str]
    session: int

    def get(self, path: str, **params: Any) -> Any:
        """GET a JSON answer; fail on any HTTP error."""
        response = self.client.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: Any) -> Any:
        """POST JSON, return the JSON answer; fail on any HTTP error."""
        response = self.client.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def trigger(self, dag_id: str, conf: Mapping[str, Any]) -> str:
        """Wait for ``dag_id`` to be parsed, unpause it, trigger a run with ``conf``; return its run id."""
        unpause(self.client, dag_id, PARSE_TIMEOUT_S, self.log)
        run = self.post(f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": dict(conf)})
        return str(run["dag_run_id"])


def unpause(client: httpx.Client, dag_id: str, timeout: float, log: Path | None = None) -> None:
    """Wait until the API knows ``dag_id`` (parsed), then unpause it; fail naming the DAG (and ``log``'s end)."""
    deadline = time.monotonic() + timeout
    while client.get(f"/api/v2/dags/{dag_id}").status_code != 200:
        if time.monotonic() > deadline:
            tail = f":\n{log.read_text()[-4000:]}" if log is not None else ""
            pytest.fail(f"{dag_id} was not parsed within {timeout:.0f} s{tail}")
        time.sleep(0.5)
    client.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()


@contextlib.contextmanager
def standalone(
    cluster: ClusterEnv,
    *,
    connection_extra: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    prefix: str = "tao-airflow-",
) -> Iterator[Stack]:
    """Start ``airflow standalone`` against the test cluster; stop it (and every child) afterwards.

    :param connection_extra: more ``slurm_default`` connection extras.
    :param env: more Airflow settings (``AIRFLOW__...``), e.g. another DAGs folder.
    """
    info = dataclasses.asdict(cluster)
    stage_assets(info)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    connection = json.loads(connection_uri_json(info))
    connection["extra"].update(connection_extra or {})
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        home = Path(tmp)
        settings = prepare_airflow(
            info,
            home,
            {
                "AIRFLOW_CONN_SLURM_DEFAULT": json.dumps(connection),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "1",
                "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2",
                "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": url,
                "AIRFLOW__API__DEFAULT_WRAP": "True",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                **(env or {}),
            },
        )
        # standalone starts its components as `airflow` from PATH: it must be this environment's.
        settings["PATH"] = f"{Path(airflow_bin()).parent}{os.pathsep}{settings.get('PATH', '')}"
        log = home / "standalone.log"
        with log.open("wb") as out:
            # A new session, with SIGINT not ignored: standalone stops its components only on SIGINT.
            proc = subprocess.Popen(
                ["setsid", "env", "--default-signal=INT", airflow_bin(), "standalone"],
                env=settings,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        client = httpx.Client(base_url=url, timeout=30)
        try:
            _wait_healthy(client, proc, log)
            yield Stack(url=url, home=home, log=log, client=client, env=settings, session=proc.pid)
        finally:
            client.close()
            _stop(proc)


def _wait_healthy(client: httpx.Client, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    health: Any = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            health = client.get("/api/v2/monitor/health").json()
        except (httpx.HTTPError, ValueError):
            health = None
        if isinstance(health, dict) and all(
            (health.get(part) or {}).get("status") == "healthy"
            for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
        ):
            return
        time.sleep(0.5)
    pytest.fail(f"airflow standalone did not become healthy ({health}); its log:\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to standalone, wait; then SIGKILL whatever is left of its session, by PID."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and (proc.poll() is None or session_pids(proc.pid)):
        time.sleep(0.5)
    for pid in session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=10)
