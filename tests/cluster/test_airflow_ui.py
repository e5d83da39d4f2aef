"""The real Airflow services run the single-node example DAG on the local SLURM test cluster.

One module fixture starts ``airflow standalone`` (api-server, scheduler with LocalExecutor,
dag-processor, triggerer) in its own Airflow home, with the repo's ``dags/`` folder, the
``slurm_default`` connection of ``tests/cluster/demo.py``, parallelism 4, no login
(``SIMPLE_AUTH_MANAGER_ALL_ADMINS``) and its own free ports on 127.0.0.1. Another triggers
``example_tao_singlenode`` through the REST API and polls the task states until the run ends.
The tests check what a UI user sees: the sensor deferred, its log shows the SLURM job id, the
state transitions and the job's log tail; the submit task's extra links point at the job's logs
and results; the ``tao_slurm`` connection form has its fields. Headless Chromium takes two
screenshots (the DAG run's grid and the sensor's log); with ``UPDATE_SCREENSHOTS=1`` they replace
``docs/images/ui-grid.png`` and ``docs/images/ui-sensor-log.png`` (used by the README).

Every task gets one retry with a 2 s delay (``[core] default_task_retries``): upstream Airflow
3.3 may mark a deferred task FAILED from a stale executor event when its trigger fires quickly
(apache/airflow#72716); a retry resumes watching the same SLURM job.

``airflow standalone`` is stopped with SIGINT (it only shuts its components down on
KeyboardInterrupt) and any process left in its session is killed by PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as url_quote

import httpx
import pytest
from demo import DAG_ID, REPO, TASKS, airflow_bin, connection_uri_json, prepare_airflow, stage_assets

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv

pytestmark = pytest.mark.cluster

#: Seconds allowed for: the services to become healthy, the DAG to be parsed, the run to end.
START_TIMEOUT_S = 90.0
PARSE_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 150.0
STOP_TIMEOUT_S = 30.0
SCREEN_SIZE = (1600, 1000)
IMAGES = REPO / "docs" / "images"
SCREENSHOTS = {"grid": "ui-grid.png", "log": "ui-sensor-log.png"}
CONNECTION_FIELDS = {
    "partition",
    "account",
    "results_dir",
    "container_mounts",
    "conversion_partition",
    "max_time_hours",
    "cluster_name",
    "key_file",
    "private_key",
    "host_key",
    "no_host_key_check",
    "log_url_template",
    "private_key_passphrase",
    "conn_timeout",
    "cmd_timeout",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _session_pids(sid: int) -> list[int]:
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


@pytest.fixture(scope="module")
def stack(cluster: ClusterEnv) -> Iterator[Stack]:
    """Start ``airflow standalone`` against the test cluster; stop it (and every child) afterwards."""
    info = dataclasses.asdict(cluster)
    stage_assets(info)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="tao-airflow-ui-") as tmp:
        home = Path(tmp)
        env = prepare_airflow(
            info,
            home,
            {
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "1",
                "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2",
                "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
            },
        )
        # standalone starts its components as `airflow` from PATH: it must be this environment's.
        env["PATH"] = f"{Path(airflow_bin()).parent}{os.pathsep}{env.get('PATH', '')}"
        log = home / "standalone.log"
        with log.open("wb") as out:
            # A new session, with SIGINT not ignored: standalone stops its components only on SIGINT.
            proc = subprocess.Popen(
                ["setsid", "env", "--default-signal=INT", airflow_bin(), "standalone"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        client = httpx.Client(base_url=url, timeout=30)
        try:
            _wait_healthy(client, proc, log)
            yield Stack(url=url, home=home, log=log, client=client)
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
    while time.monotonic() < deadline and (proc.poll() is None or _session_pids(proc.pid)):
        time.sleep(0.5)
    for pid in _session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=10)


@dataclass(frozen=True)
class Run:
    """The DAG run triggered through the REST API, as the API reported it."""

    run_id: str
    state: str
    seen: dict[str, list[str]]
    tries: dict[str, int]

    @property
    def path(self) -> str:
        """The run's API path (run ids contain ``+`` and ``:``)."""
        return f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(self.run_id, safe='')}"


@pytest.fixture(scope="module")
def run(stack: Stack) -> Run:
    """Wait for the DAG to be parsed, unpause it, trigger it; poll the task states until the run ends."""
    deadline = time.monotonic() + PARSE_TIMEOUT_S
    while stack.client.get(f"/api/v2/dags/{DAG_ID}").status_code != 200:
        if time.monotonic() > deadline:
            pytest.fail(f"{DAG_ID} was not parsed within {PARSE_TIMEOUT_S:.0f} s:\n{stack.log.read_text()[-4000:]}")
        time.sleep(0.5)
    stack.client.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
    # Epochs of 4 s: the job runs long enough for the triggerer (which picks the trigger up a few seconds
    # after the deferral) to see it RUNNING, as a user watching a real training would.
    command = (
        "python3 /srv/lustre/demo/tao_like_train.py --spec {config_path} --results {results_dir} --epoch-seconds 4"
    )
    posted = stack.client.post(
        f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {"command": command}}
    )
    posted.raise_for_status()
    run_id = posted.json()["dag_run_id"]
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(run_id, safe='')}"
    seen: dict[str, list[str]] = {task: [] for task in TASKS}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        for ti in stack.get(f"{path}/taskInstances")["task_instances"]:
            states = seen[ti["task_id"]]
            if ti["state"] and states[-1:] != [ti["state"]]:
                states.append(ti["state"])
        state = stack.get(path)["state"]
        if state in ("success", "failed"):
            break
        time.sleep(0.5)
    tis = stack.get(f"{path}/taskInstances")["task_instances"]
    return Run(run_id=run_id, state=state, seen=seen, tries={ti["task_id"]: ti["try_number"] for ti in tis})


def _handle(stack: Stack, run: Run) -> dict[str, Any]:
    entry = stack.get(f"{run.path}/taskInstances/submit/xcomEntries/return_value", deserialize="true")
    value = entry["value"]
    return dict(json.loads(value) if isinstance(value, str) else value)


def _log_text(stack: Stack, run: Run, task_id: str) -> str:
    """Every try's log of ``task_id`` (trigger lines included), one event per line."""
    lines = []
    for attempt in range(1, run.tries[task_id] + 1):
        content = stack.get(f"{run.path}/taskInstances/{task_id}/logs/{attempt}")["content"]
        lines += [str(item.get("event", "")) for item in content]
    return "\n".join(lines)


def test_run_succeeds_and_the_sensor_deferred(run: Run) -> None:
    """Every task succeeds; the sensor was seen deferred (in the triggerer) before it succeeded."""
    assert run.state == "success", run.seen
    assert {task: states[-1] for task, states in run.seen.items()} == dict.fromkeys(TASKS, "success")
    assert "deferred" in run.seen["wait"], run.seen
    assert run.seen["wait"].index("deferred") < run.seen["wait"].index("success")


def test_sensor_log_shows_job_id_transitions_and_tail(stack: Stack, run: Run) -> None:
    """The sensor's task log: deferral, the trigger's RUNNING and COMPLETED lines, main.out's tail, the result."""
    handle = _handle(stack, run)
    text = _log_text(stack, run, "wait")
    slurm_id, job_id = handle["slurm_job_id"], handle["job_id"]
    expected = [
        "Pausing task as DEFERRED.",
        f"SLURM job {slurm_id} ({job_id}): RUNNING",
        f"SLURM job {slurm_id} ({job_id}): COMPLETED",
        f"---- {handle['log_dir']}/main.out (last",
        f"TAO_SLURM: job {slurm_id} start",
        "[status] SUCCESS: training finished: 3 epochs",
        f"Job {job_id} complete; results in {handle['results_dir']}",
    ]
    assert [line for line in expected if line not in text] == [], text[-6000:]
    positions = [text.index(line) for line in expected]
    assert positions == sorted(positions)


def test_submit_log_names_the_paths(stack: Stack, run: Run) -> None:
    """The submit task's log names the SLURM job, its log files, results dir and record."""
    handle = _handle(stack, run)
    text = _log_text(stack, run, "submit")
    assert f"SLURM job {handle['slurm_job_id']} ({handle['job_id']}) submitted on {handle['cluster']}" in text
    assert f"Logs: {handle['log_dir']}/main.out" in text
    assert f"results: {handle['results_dir']}; record: {handle['record_path']}" in text


def test_submit_extra_links_point_at_the_job(stack: Stack, run: Run) -> None:
    """The submit task's extra links are the file:// URLs of the job's log and results directories."""
    handle = _handle(stack, run)
    links = stack.get(f"{run.path}/taskInstances/submit/links")["extra_links"]
    assert links == {
        "SLURM job logs": f"file://{handle['log_dir']}",
        "SLURM job results": f"file://{handle['results_dir']}",
    }
    assert handle["log_dir"].endswith(f"{handle['job_id']}-{handle['slurm_job_id']}")


def test_connection_form_has_the_tao_slurm_fields(stack: Stack) -> None:
    """``/ui/connections/hook_meta``: the tao_slurm form's extra fields, relabels and hidden schema."""
    (meta,) = [m for m in stack.get("/ui/connections/hook_meta") if m["connection_type"] == "tao_slurm"]
    fields = meta["extra_fields"]
    assert CONNECTION_FIELDS - set(fields) == set()
    assert fields["private_key"]["schema"]["format"] == "password"
    assert fields["no_host_key_check"]["value"] is False
    standard = meta["standard_fields"]
    assert (standard["login"]["title"], standard["host"]["title"]) == ("SLURM user", "Login host(s)")
    assert standard["url_schema"]["hidden"] is True
    assert standard["password"]["hidden"] is True, "the provider reads no password"


def test_the_forms_test_button_checks_login_tools_and_storage(stack: Stack, cluster: ClusterEnv) -> None:
    """The form's Test button (``POST /api/v2/connections/test``, an unsaved connection) runs the hook's
    ``test_connection`` on the real login host; a wrong port is reported, not hidden."""
    good = json.loads(connection_uri_json(dataclasses.asdict(cluster)))
    body = {
        "connection_id": "tao_form_test",
        "conn_type": good["conn_type"],
        "host": good["host"],
        "port": good["port"],
        "login": good["login"],
        "extra": json.dumps(good["extra"]),
    }
    answer = stack.post("/api/v2/connections/test", body)
    assert answer["status"] is True, answer
    assert "sbatch" in answer["message"], answer
    assert f"results_dir {cluster.results_dir} is writable" in answer["message"], answer
    bad = stack.post("/api/v2/connections/test", {**body, "port": cluster.closed_port})
    assert bad["status"] is False
    assert str(cluster.closed_port) in bad["message"] or "refused" in bad["message"].lower(), bad


@pytest.fixture(scope="module")
def chromium() -> str:
    """The headless browser; Debian's ``chromium`` is installed when missing (as root)."""
    path = shutil.which("chromium")
    if path is None and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300, check=False)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            capture_output=True,
            timeout=600,
            check=False,
        )
        path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: run `apt-get install -y --no-install-recommends chromium` as root")
    return path


def _browse(chromium: str, url: str, profile: Path, *args: str) -> str:
    """Run headless Chromium on ``url`` after letting the page's scripts run; return its stdout."""
    width, height = SCREEN_SIZE
    argv = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "--virtual-time-budget=15000",
        *args,
        url,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("page", ["grid", "log"])
def test_screenshot(stack: Stack, run: Run, chromium: str, page: str, tmp_path: Path) -> None:
    """The page renders what it should (its DOM after the scripts ran), and its screenshot is a full PNG."""
    handle = _handle(stack, run)
    run_page = f"{stack.url}/dags/{DAG_ID}/runs/{url_quote(run.run_id, safe='')}"
    url, expected = {
        "grid": (run_page, [run.run_id, "Success", "SbatchSubmitOperator", "SlurmJobSensor"]),
        "log": (f"{run_page}/tasks/wait", [f"SLURM job {handle['slurm_job_id']}", "main.out", "Success"]),
    }[page]
    dom = _browse(chromium, url, tmp_path / "profile", "--dump-dom")
    assert [text for text in expected if text not in dom] == []
    shot = tmp_path / SCREENSHOTS[page]
    _browse(chromium, url, tmp_path / "profile", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert _png_size(data) == SCREEN_SIZE
    assert 20_000 < len(data) < 1_000_000
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, IMAGES / SCREENSHOTS[page])
