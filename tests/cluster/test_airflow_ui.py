"""The real Airflow services run the single-node example DAG on the local SLURM test cluster.

One module fixture starts ``airflow standalone`` (api-server, scheduler with LocalExecutor,
dag-processor, triggerer) in its own Airflow home, with the repo's ``dags/`` folder, the
``slurm_default`` connection of ``tests/cluster/demo.py`` on the 16-GPU node's partition (the other
cluster tests, side by side with these under make test, run elsewhere; the whole-node test, which uses
it too, runs on this module's worker) plus a ``log_url_template`` (an Open
OnDemand-style file browser URL: Airflow 3.3's UI shows only http(s), mailto and same-origin extra
links, so the default ``file://`` links would not appear), parallelism 4, no login
(``SIMPLE_AUTH_MANAGER_ALL_ADMINS``), wrapped log lines (``[api] default_wrap``) and its own free
ports on 127.0.0.1. The runs are triggered through the REST API, their task states polled until
they end:

- ``run``: the DAG's defaults with 4 s epochs. The sensor deferred, its log shows the SLURM job id,
  the state transitions and the job's live ``main.out |`` lines; the submit task's extra links
  point at the job's logs and results; the ``tao_slurm`` connection form has its fields.
- ``scenes``: first one blocker job per node of that partition, asking for all of its GPUs, is
  submitted over SSH as the cluster user, so that a run of 15 epochs of 2 s pends with reason
  ``Resources`` (the sensor's log shows the PENDING line and its hint); the blockers are cancelled
  (always, in a ``finally``), the job starts and its log shows live ``main.out |`` and
  ``status.json |`` lines while the sensor is still deferred. Meanwhile a run whose command adds
  ``--fail-at-epoch 2 --exit-code 3`` fails its sensor in its first try with ``ProgramFailedError`` and the evidence.

Headless Chromium, driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: it can
click, which the connection dialog needs), takes the screenshots: the DAG run's grid, the sensor's
log, a pending job, a running job's live log, a failed job, the submit task's extra links and the
``tao_slurm`` connection form. Before each one the page's DOM (what ``--dump-dom`` prints) must
show the texts that matter; the task-log pages must not show SSH connection chatter (paramiko's
"Connected (version", "Authentication (publickey)", asyncssh's "[conn=0, chan="). With
``UPDATE_SCREENSHOTS=1`` they replace ``docs/images/ui-*.png`` (used by the README and the docs).

Every task gets one retry with a 2 s delay (``[core] default_task_retries``): upstream Airflow
3.3 may mark a deferred task FAILED from a stale executor event when its trigger fires quickly
(apache/airflow#72716); a retry resumes watching the same SLURM job.

``airflow standalone`` is stopped with SIGINT (it only shuts its components down on
KeyboardInterrupt) and any process left in its session is killed by PID.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import select
import shlex
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as url_quote

import httpx
import pytest
from airflow_stack import STOP_TIMEOUT_S, Stack, session_pids, standalone
from demo import DAG_ID, REPO, TASKS, airflow_bin, connection_uri_json

from airflow_provider_tao_slurm.core.states import pending_hint

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: Seconds allowed for: a run to end, a line to
#: reach a task log, a page to show what it should.
RUN_TIMEOUT_S = 150.0
LOG_TIMEOUT_S = 90.0
PAGE_TIMEOUT_S = 30.0
#: How long a try's log may answer 404 while the try moves to the task-instance history.
TRY_LOG_GRACE_S = 15.0
SCREEN_SIZE = (1600, 1000)
#: The window height while the connection dialog is captured: the form with every field is taller than a screen.
FORM_HEIGHT = 2600
IMAGES = REPO / "docs" / "images"
SCREENSHOTS = {
    "grid": "ui-grid.png",
    "log": "ui-sensor-log.png",
    "pending": "ui-pending.png",
    "live": "ui-live-log.png",
    "failure": "ui-failure.png",
    "links": "ui-links.png",
    "connection": "ui-connection.png",
}
#: SSH connection chatter that must never reach a task log.
CHATTER = ("Connected (version", "Authentication (publickey)", "[conn=0, chan=")
#: The extra links' URL template of the stack's connection (the README's example).
LOG_URL_TEMPLATE = "https://ondemand.example.org/pun/sys/dashboard/files/fs{path}"
TRAIN = "python3 /srv/lustre/demo/tao_like_train.py --spec {config_path} --results {results_dir}"
#: Epochs of 4 s: the job runs long enough for the triggerer (which picks the trigger up a few seconds
#: after the deferral) to see it RUNNING, as a user watching a real training would.
DEFAULT_CONF = {"command": f"{TRAIN} --epoch-seconds 4"}
#: 15 epochs of 2 s: long enough to be seen running, with some epochs logged, while the sensor is deferred.
LONG_CONF = {"spec": {"epochs": 15, "batch_size": 4, "learning_rate": 0.001}, "command": f"{TRAIN} --epoch-seconds 2"}
FAILING_CONF = {"command": f"{TRAIN} --fail-at-epoch 2 --exit-code 3"}
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


@pytest.fixture(scope="module")
def stack(cluster: ClusterEnv) -> Iterator[Stack]:
    """``airflow standalone`` with the example DAGs and the extra links' URL template."""
    extra = {"log_url_template": LOG_URL_TEMPLATE, "partition": cluster.wide_partition}
    with standalone(cluster, connection_extra=extra, prefix="tao-airflow-ui-") as running:
        yield running


def _run_path(run_id: str) -> str:
    """A run's API path (run ids contain ``+`` and ``:``)."""
    return f"/api/v2/dags/{DAG_ID}/dagRuns/{url_quote(run_id, safe='')}"


@dataclass(frozen=True)
class Run:
    """A DAG run triggered through the REST API, as the API reported it."""

    run_id: str
    state: str
    seen: dict[str, list[str]]

    @property
    def path(self) -> str:
        """The run's API path."""
        return _run_path(self.run_id)


def _trigger(stack: Stack, conf: dict[str, Any]) -> str:
    """Trigger a run of the example with ``conf``; return its run id."""
    return stack.trigger(DAG_ID, conf)


def _follow(stack: Stack, run_id: str) -> Run:
    """Poll the run's task states until it ends (or :data:`RUN_TIMEOUT_S` passed)."""
    path = _run_path(run_id)
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
    return Run(run_id=run_id, state=state, seen=seen)


@pytest.fixture(scope="module")
def run(stack: Stack) -> Run:
    """A run of the DAG's defaults (4 s epochs), followed until it ends."""
    return _follow(stack, _trigger(stack, DEFAULT_CONF))


def _handle(stack: Stack, run_id: str) -> dict[str, Any]:
    entry = stack.get(f"{_run_path(run_id)}/taskInstances/submit/xcomEntries/return_value", deserialize="true")
    value = entry["value"]
    return dict(json.loads(value) if isinstance(value, str) else value)


def _wait_handle(stack: Stack, run_id: str) -> dict[str, Any]:
    """The submit task's job handle, once it has one."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    path = f"{_run_path(run_id)}/taskInstances/submit/xcomEntries/return_value"
    while stack.client.get(path).status_code != 200:
        if time.monotonic() > deadline:
            pytest.fail(f"the submit task of {run_id} returned no job handle within {RUN_TIMEOUT_S:.0f} s")
        time.sleep(0.5)
    return _handle(stack, run_id)


def _try_log(stack: Stack, path: str) -> Any:
    """GET one try's log; a 404 is asked again for up to :data:`TRY_LOG_GRACE_S`.

    Airflow's log endpoint looks the try up in ``task_instance``, then in ``task_instance_history``, in
    two queries; a try being moved between them while the scheduler starts the next one (the retry
    every task gets here) is in neither for a moment (seen once in CI: 404 for the first try of a
    failed sensor).
    """
    deadline = time.monotonic() + TRY_LOG_GRACE_S
    while True:
        try:
            return stack.get(path)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def _log_text(stack: Stack, run_id: str, task_id: str) -> str:
    """Every try's log of ``task_id`` so far (trigger lines included), one event per line, an exception
    as ``type: message`` after its event."""
    path = f"{_run_path(run_id)}/taskInstances/{task_id}"
    lines = []
    for attempt in range(1, int(stack.get(path)["try_number"]) + 1):
        for item in _try_log(stack, f"{path}/logs/{attempt}")["content"]:
            lines.append(str(item.get("event", "")))
            details = item.get("error_detail")
            for detail in details if isinstance(details, list) else ():
                if isinstance(detail, dict):
                    lines += f"{detail.get('exc_type', '')}: {detail.get('exc_value', '')}".splitlines()
    return "\n".join(lines)


#: The longest line the provider or a trigger event may put in a task log (issue 34, item 4).
MAX_LINE = 300
#: Prefixes of the job's own lines (its output, bounded but the job's): not the provider's.
JOB_LINES = ("main.out | ", "main.err | ", "status.json | ")


def _long_lines(stack: Stack, run_id: str, task_id: str) -> list[str]:
    """The lines over :data:`MAX_LINE` characters the provider or a trigger event wrote in every try's log.

    Each log event is rendered as the UI shows it (``event key=value ...``, an exception as
    ``type: message``); the provider's are those of its loggers, the triggerer's ``Trigger fired event``
    and the task's exception (the sensor raises only the provider's).
    """
    path = f"{_run_path(run_id)}/taskInstances/{task_id}"
    long = []
    for attempt in range(1, int(stack.get(path)["try_number"]) + 1):
        for item in _try_log(stack, f"{path}/logs/{attempt}")["content"]:
            event = str(item.get("event", ""))
            ours = "airflow_provider_tao_slurm" in str(item.get("logger", "")) or event == "Trigger fired event"
            shown = [event, *(f"{key}={value}" for key, value in item.items() if key not in UI_FIELDS)]
            lines = [" ".join(shown)] if ours and not event.startswith(JOB_LINES) else []
            details = item.get("error_detail")
            for detail in details if isinstance(details, list) else ():
                if isinstance(detail, dict):
                    lines += f"{detail.get('exc_type', '')}: {detail.get('exc_value', '')}".splitlines()
            long += [line for line in lines if len(line) > MAX_LINE]
    return long


#: Fields of a log event the UI does not show as ``key=value`` after its text (the triggerer's context
#: bindings included: the UI shows ``name=`` and ``result=`` of ``Trigger fired event``, not these).
UI_FIELDS = {
    "event",
    "timestamp",
    "level",
    "logger",
    "error_detail",
    "chan",
    "filename",
    "lineno",
    "dag_id",
    "run_id",
    "task_id",
    "map_index",
    "try_number",
    "ti_id",
}


def _wait_log(stack: Stack, run_id: str, task_id: str, texts: Sequence[str], *, not_before: str = "") -> str:
    """Wait until the task's log has every one of ``texts``; fail early when ``not_before`` comes first."""
    deadline = time.monotonic() + LOG_TIMEOUT_S
    text = ""
    while time.monotonic() < deadline:
        text = _log_text(stack, run_id, task_id)
        if all(line in text for line in texts):
            return text
        if not_before and not_before in text:
            pytest.fail(f"{not_before!r} came before {list(texts)} in the {task_id} log:\n{text[-4000:]}")
        time.sleep(1)
    pytest.fail(f"the {task_id} log of {run_id} lacks {[t for t in texts if t not in text]}:\n{text[-4000:]}")


def _occupy_gpus(ssh_run: SshRun, cluster: ClusterEnv) -> list[str]:
    """Submit one blocker job per node of the stack's partition (the 16-GPU node's) asking for all its GPUs;
    return their SLURM ids. The cluster tests that run beside this module use the other partitions' nodes.

    They sleep for 10 minutes at most (their time limit), should the test die before it cancels them.
    """
    ids: list[str] = []
    for node in cluster.wide_nodes:
        command = (
            f"sbatch --parsable --job-name=tao-ui-blocker --partition={shlex.quote(cluster.wide_partition)}"
            f" --account={shlex.quote(cluster.account)} --nodelist={shlex.quote(node)} --nodes=1 --ntasks=1"
            f" --cpus-per-task=1 --gres=gpu:{cluster.wide_gpus_per_node} --time=10 --output=/dev/null"
            " --wrap='sleep 600'"
        )
        rc, out, err = ssh_run(command)
        if rc != 0:
            _release(ssh_run, ids)
            pytest.fail(f"submitting a blocker on {node} failed (rc {rc}): {err or out}")
        ids.append(out.strip().split(";")[0])
    return ids


def _release(ssh_run: SshRun, ids: Sequence[str]) -> None:
    """Cancel the blocker jobs ``ids``."""
    if ids:
        rc, out, err = ssh_run(f"scancel {' '.join(shlex.quote(job_id) for job_id in ids)}")
        assert rc == 0, f"scancel {ids} failed (rc {rc}): {err or out}"


class DevToolsError(RuntimeError):
    """Chromium answered a command with an error, or the page's script threw."""


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

    Chromium reads commands on its fd 3 and writes answers and events on its fd 4, each a JSON text
    ending in a NUL byte. One page (a target attached in flat mode) is driven through its session id.
    """

    def __init__(self, chromium: str, profile: Path) -> None:
        commands_read, self._commands = os.pipe()
        self._answers, answers_write = os.pipe()
        width, height = SCREEN_SIZE
        argv = [
            # bash puts the two pipe ends on fds 3 and 4, where Chromium expects them, then becomes Chromium.
            "bash",
            "-c",
            'exec 3<&"$0" 4>&"$1" "${@:2}"',
            str(commands_read),
            str(answers_write),
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
            "--remote-debugging-pipe",
            "about:blank",
        ]
        with (profile.parent / f"{profile.name}.log").open("wb") as log:
            self._proc = subprocess.Popen(
                argv, pass_fds=(commands_read, answers_write), stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        os.close(commands_read)
        os.close(answers_write)
        self._buffer = b""
        self._last_id = 0
        self._session = ""
        target = self.call("Target.createTarget", page=False, url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", page=False, targetId=target, flatten=True)["sessionId"]
        self.resize(width, height)

    def call(self, method: str, *, page: bool = True, timeout: float = 60, **params: Any) -> dict[str, Any]:
        """Send one command (to the page's session when ``page``); return its result, skipping events."""
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params}
        if page:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, _, self._buffer = self._buffer.partition(b"\0")
                answer = json.loads(raw)
                if answer.get("id") == self._last_id:
                    if "error" in answer:
                        raise DevToolsError(f"{method}: {answer['error']}")
                    return dict(answer.get("result") or {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._answers], [], [], left)[0]:
                raise TimeoutError(f"Chromium did not answer {method} within {timeout:.0f} s")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited (rc {self._proc.poll()}) during {method}")
            self._buffer += chunk

    def js(self, expression: str) -> Any:
        """Evaluate ``expression`` in the page; return its value."""
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise DevToolsError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def resize(self, width: int, height: int) -> None:
        """Set the page's viewport."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def open(self, url: str) -> None:
        """Load ``url`` (after a blank page, so that nothing of the previous page is waited for)."""
        for address in ("about:blank", url):
            self.call("Page.navigate", url=address)
            deadline = time.monotonic() + PAGE_TIMEOUT_S
            while not self._loaded(address):
                assert time.monotonic() < deadline, f"{address} did not load within {PAGE_TIMEOUT_S:.0f} s"
                time.sleep(0.2)

    def _loaded(self, url: str) -> bool:
        """Whether the page is ``about:blank`` (for that URL) or another page that finished loading."""
        blank = url == "about:blank"
        try:
            return bool(
                self.js(
                    f"location.href {'===' if blank else '!=='} 'about:blank' && document.readyState === 'complete'"
                )
            )
        except DevToolsError:  # the page is between two documents
            return False

    def dom(self) -> str:
        """The page's DOM as HTML (what ``chromium --dump-dom`` prints)."""
        try:
            return str(self.js("document.documentElement.outerHTML"))
        except DevToolsError:  # the page is between two documents
            return ""

    def wait_for(self, texts: Sequence[str], timeout: float = PAGE_TIMEOUT_S) -> str:
        """The DOM once it contains every one of ``texts`` (or when ``timeout`` passed), after a settling pause."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(text in self.dom() for text in texts):
                break
            time.sleep(0.5)
        time.sleep(1.5)  # let the page finish its layout (the log view scrolls to its end)
        return self.dom()

    def click(self, element: str) -> None:
        """Click, with the mouse, the middle of the element that the JavaScript expression ``element`` finds."""
        x, y = self.js(
            f"(() => {{ const e = {element}; e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
        time.sleep(0.5)

    def type(self, text: str, *, enter: bool = False) -> None:
        """Type ``text`` into the focused element, then press Enter when ``enter``."""
        self.call("Input.insertText", text=text)
        time.sleep(0.5)
        for kind in ("keyDown", "keyUp") if enter else ():
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13)
        time.sleep(0.5)

    def screenshot(self, element: str | None = None) -> bytes:
        """A PNG of the viewport, or of the element that the JavaScript expression ``element`` finds."""
        params: dict[str, Any] = {"format": "png"}
        if element is not None:
            x, y, width, height = self.js(
                f"(() => {{ const r = ({element}).getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; }})()"
            )
            params["clip"] = {"x": x, "y": y, "width": width, "height": height, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def close(self) -> None:
        """Close Chromium (kill it when it does not exit) and the pipes."""
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):
            self.call("Browser.close", page=False, timeout=10)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        os.close(self._commands)
        os.close(self._answers)


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


@pytest.fixture(scope="module")
def browser(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One headless Chromium for the module's screenshots."""
    driver = Browser(chromium, tmp_path_factory.mktemp("chromium") / "profile")
    try:
        yield driver
    finally:
        driver.close()


@dataclass(frozen=True)
class Shot:
    """A page as the browser showed it: its DOM and screenshot, and the task's whole log through the API."""

    url: str
    expected: tuple[str, ...]
    dom: str
    png: bytes
    log: str | None = None


def _task_page(stack: Stack, run_id: str, task_id: str | None = None) -> str:
    page = f"{stack.url}/dags/{DAG_ID}/runs/{url_quote(run_id, safe='')}"
    return f"{page}/tasks/{task_id}" if task_id else page


def _capture(browser: Browser, url: str, expected: Sequence[str]) -> Shot:
    """Open ``url``, wait until its DOM shows ``expected``, take the screenshot."""
    browser.open(url)
    dom = browser.wait_for(expected)
    return Shot(url=url, expected=tuple(expected), dom=dom, png=browser.screenshot())


def _capture_log(browser: Browser, stack: Stack, run_id: str, task_id: str, expected: Sequence[str]) -> Shot:
    """:func:`_capture` of a task's log page, with the task's whole log read right after."""
    shot = _capture(browser, _task_page(stack, run_id, task_id), expected)
    return dataclasses.replace(shot, log=_log_text(stack, run_id, task_id))


@dataclass(frozen=True)
class Scenes:
    """The runs of :func:`scenes` and the pages taken while they ran."""

    long: Run
    failing: Run
    shots: dict[str, Shot]


@pytest.fixture(scope="module")
def scenes(stack: Stack, run: Run, browser: Browser, cluster: ClusterEnv, ssh_run: SshRun) -> Scenes:
    """A job pending behind blockers, then running (live log), and a failing job; their pages when it mattered."""
    shots: dict[str, Shot] = {}
    blockers = _occupy_gpus(ssh_run, cluster)
    try:
        long_id = _trigger(stack, LONG_CONF)
        handle = _wait_handle(stack, long_id)
        job = f"SLURM job {handle['slurm_job_id']} ({handle['job_id']})"
        pending = f"{job}: PENDING reason=Resources ({pending_hint('Resources')})"
        _wait_log(stack, long_id, "wait", [pending], not_before=f"{job}: RUNNING")
        shots["pending"] = _capture_log(browser, stack, long_id, "wait", [pending, "Deferred"])
    finally:
        _release(ssh_run, blockers)
    failing_id = _trigger(stack, FAILING_CONF)
    _wait_log(
        stack, long_id, "wait", ["main.out | Epoch 3/15", "status.json | RUNNING"], not_before=f"{job}: COMPLETED"
    )
    # The log view shows its end: the lines of the latest epochs.
    live = [f"SLURM job {handle['slurm_job_id']}", "main.out | Epoch ", "status.json | RUNNING epoch ", "Deferred"]
    shots["live"] = _capture_log(browser, stack, long_id, "wait", live)
    long, failing = _follow(stack, long_id), _follow(stack, failing_id)
    failed = _wait_handle(stack, failing_id)
    shots["failure"] = _capture_log(
        browser,
        stack,
        failing_id,
        "wait",
        [
            f"SLURM job {failed['slurm_job_id']} failed (ERR_PROGRAM): ",
            "; evidence: ",
            "main.err | ",
            "ProgramFailedError",
            "Failed",
        ],
    )
    return Scenes(long=long, failing=failing, shots=shots)


def test_run_succeeds_and_the_sensor_deferred(run: Run) -> None:
    """Every task succeeds; the sensor was seen deferred (in the triggerer) before it succeeded."""
    assert run.state == "success", run.seen
    assert {task: states[-1] for task, states in run.seen.items()} == dict.fromkeys(TASKS, "success")
    assert "deferred" in run.seen["wait"], run.seen
    assert run.seen["wait"].index("deferred") < run.seen["wait"].index("success")


def _tries_failed_by_airflow(stack: Stack, run_id: str, task_id: str) -> set[int]:
    """The tries of a task Airflow's scheduler itself failed from a stale executor event: its audit log's "state
    mismatch" (upstream Airflow 3.3, apache/airflow#72716: a sensor whose trigger fires within seconds resumes, and
    the scheduler then reads the deferring process's exit as the resumed try's end and fails it, retries left or
    not). Seen with the cluster tests side by side: the failing run's sensor raised ProgramFailedError in try 1,
    and Airflow ran try 2 all the same."""
    logs = stack.get("/api/v2/eventLogs", dag_id=DAG_ID, run_id=run_id, task_id=task_id, event="state mismatch")
    return {int(entry["try_number"]) for entry in logs["event_logs"]}


def _in_order(stack: Stack, run_id: str, task_id: str, *chains: Sequence[str]) -> str:
    """Every line of every chain is in the task's log, each chain's first occurrences in that order; return the log.

    The log is read once every line is there (:func:`_wait_log`): Airflow serves a trigger's lines from the file its
    triggerer writes them to, which can lag the run's end when the machine is busy (seen with the cluster tests side
    by side: the failing run's sensor log read right after the run ended had only the trigger's "starting" line).
    """
    text = _wait_log(stack, run_id, task_id, [line for lines in chains for line in lines])
    for lines in chains:
        positions = [text.index(line) for line in lines]
        assert positions == sorted(positions), (lines, text[-6000:])
    return text


def test_sensor_log_shows_job_id_transitions_and_live_lines(stack: Stack, run: Run) -> None:
    """The sensor's task log: deferral, the trigger's RUNNING and COMPLETED lines, the job's live
    ``main.out`` and ``status.json`` lines, the result; no SSH chatter."""
    handle = _handle(stack, run.run_id)
    slurm_id, job_id = handle["slurm_job_id"], handle["job_id"]
    done = f"Job {job_id} complete; results in {handle['results_dir']}"
    # The trigger logs a poll's new lines (main.out, main.err, then status.json) before the state it saw.
    text = _in_order(
        stack,
        run.run_id,
        "wait",
        [
            "Pausing task as DEFERRED.",
            f"SLURM job {slurm_id} ({job_id}): RUNNING",
            f"SLURM job {slurm_id} ({job_id}): COMPLETED",
            done,
        ],
        [
            "Pausing task as DEFERRED.",
            f"main.out | TAO_SLURM: job {slurm_id} start",
            "main.out | Epoch 1/3: loss=",
            "[status] SUCCESS: training finished: 3 epochs",
            done,
        ],
        ["Pausing task as DEFERRED.", "status.json | RUNNING epoch 1", "status.json | SUCCESS", done],
    )
    assert [chatter for chatter in CHATTER if chatter in text] == []
    assert "Trigger fired event" in text
    assert _long_lines(stack, run.run_id, "wait") == []


def test_submit_log_names_the_paths(stack: Stack, run: Run) -> None:
    """The submit task's log names the SLURM job, its log files, results dir and record."""
    handle = _handle(stack, run.run_id)
    _wait_log(
        stack,
        run.run_id,
        "submit",
        [
            f"SLURM job {handle['slurm_job_id']} ({handle['job_id']}) submitted on {handle['cluster']}",
            f"Logs: {handle['log_dir']}/main.out",
            f"results: {handle['results_dir']}; record: {handle['record_path']}",
        ],
    )


def _link(path: str) -> str:
    return LOG_URL_TEMPLATE.format(path=url_quote(path, safe="/"))


def test_submit_extra_links_point_at_the_job(stack: Stack, run: Run) -> None:
    """The submit task's extra links are the connection's ``log_url_template`` filled with the job's directories."""
    handle = _handle(stack, run.run_id)
    links = stack.get(f"{run.path}/taskInstances/submit/links")["extra_links"]
    assert links == {"SLURM job logs": _link(handle["log_dir"]), "SLURM job results": _link(handle["results_dir"])}
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


def test_a_job_pending_for_resources_then_runs_to_success(stack: Stack, scenes: Scenes) -> None:
    """The run held back by the blockers succeeds; its sensor log has the PENDING line with its hint, then
    RUNNING with live lines of all 15 epochs, then COMPLETED."""
    long = scenes.long
    assert long.state == "success", long.seen
    handle = _handle(stack, long.run_id)
    job = f"SLURM job {handle['slurm_job_id']} ({handle['job_id']})"
    _in_order(
        stack,
        long.run_id,
        "wait",
        [
            f"{job}: PENDING reason=Resources ({pending_hint('Resources')})",
            f"{job}: RUNNING",
            f"{job}: COMPLETED",
            f"Job {handle['job_id']} complete",
        ],
        [
            f"{job}: PENDING",
            "main.out | Epoch 1/15",
            "status.json | RUNNING epoch 1",
            "Epoch 15/15",
            f"Job {handle['job_id']} complete",
        ],
    )


def test_a_failing_job_fails_the_sensor_with_its_evidence(stack: Stack, scenes: Scenes) -> None:
    """The run whose program exits 3 at epoch 2 fails at the sensor in its first try, although the task has a
    retry: a program error fails without using the retries (``ProgramFailedError``, an ``AirflowFailException``),
    with the job's error lines and the error naming the class and the evidence. (A second try only where Airflow's
    scheduler failed the first itself, as its audit log says: :func:`_tries_failed_by_airflow`.)"""
    failing = scenes.failing
    assert failing.state == "failed", failing.seen
    assert [failing.seen[task][-1] for task in TASKS] == ["success", "success", "success", "failed"], failing.seen
    handle = _handle(stack, failing.run_id)
    wait = stack.get(f"{_run_path(failing.run_id)}/taskInstances/wait")
    # Every try but the last was failed by Airflow itself (none, unless the upstream race struck), never by a retry
    # the program error used.
    restarted = set(range(1, int(wait["try_number"])))
    by_airflow = _tries_failed_by_airflow(stack, failing.run_id, "wait")
    assert restarted <= by_airflow, _log_text(stack, failing.run_id, "wait")
    assert wait["state"] == "failed", wait
    _in_order(
        stack,
        failing.run_id,
        "wait",
        [
            "main.out | Epoch 1/3",
            "main.err | ",
            "status.json | FAILURE epoch 2",
            f"SLURM job {handle['slurm_job_id']} ({handle['job_id']}): FAILED",
            f"ProgramFailedError: SLURM job {handle['slurm_job_id']} failed (ERR_PROGRAM): ",
            "; evidence: ",
        ],
    )
    assert _long_lines(stack, failing.run_id, "wait") == []


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _shoot(page: str, stack: Stack, run: Run, browser: Browser, request: pytest.FixtureRequest) -> Shot:
    """The page's :class:`Shot`: taken now, or (pending, live, failure) while :func:`scenes` ran."""
    if page in ("pending", "live", "failure"):
        scenes: Scenes = request.getfixturevalue("scenes")
        return scenes.shots[page]
    if page == "grid":
        return _capture(
            browser, _task_page(stack, run.run_id), [run.run_id, "Success", "SbatchSubmitOperator", "SlurmJobSensor"]
        )
    handle = _handle(stack, run.run_id)
    if page == "log":
        expected = [f"SLURM job {handle['slurm_job_id']}", "main.out | ", "Success"]
        return _capture_log(browser, stack, run.run_id, "wait", expected)
    if page == "links":
        expected = ["Extra Links", "SLURM job logs", "SLURM job results"]
        expected += [f'href="{_link(handle[key])}"' for key in ("log_dir", "results_dir")]
        return _capture(browser, f"{_task_page(stack, run.run_id, 'submit')}/details", expected)
    return _connection_form(stack, browser)


def _connection_form(stack: Stack, browser: Browser) -> Shot:
    """Admin > Connections > Add Connection, type "TAO SLURM (over SSH)", its Extra Fields opened: the dialog."""
    (meta,) = [m for m in stack.get("/ui/connections/hook_meta") if m["connection_type"] == "tao_slurm"]
    titles = [str(field["schema"]["title"]) for field in meta["extra_fields"].values()]
    url = f"{stack.url}/connections"
    browser.resize(SCREEN_SIZE[0], FORM_HEIGHT)
    try:
        browser.open(url)
        browser.wait_for(["Add Connection"])
        buttons = "[...document.querySelectorAll('{}button')].find(b => b.innerText.trim() === '{}')"
        browser.click(buttons.format("", "Add Connection"))
        browser.wait_for(["connection_id"])
        browser.click("document.querySelector('[role=dialog] input[name=connection_id]')")
        browser.type("slurm_default")
        browser.click("document.querySelector('[role=dialog] input[role=combobox]')")
        browser.type(meta["hook_name"], enter=True)
        browser.click(buttons.format("[role=dialog] ", "Extra Fields"))
        expected = ["Add Connection", meta["hook_name"], *titles]
        dom = browser.wait_for(expected)
        png = browser.screenshot("document.querySelector('[role=dialog]')")
    finally:
        browser.resize(*SCREEN_SIZE)
    return Shot(url=url, expected=tuple(expected), dom=dom, png=png)


@pytest.mark.parametrize("page", list(SCREENSHOTS))
def test_screenshot(
    stack: Stack, run: Run, browser: Browser, page: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The page showed what it should (its DOM when the screenshot was taken), a task log page shows no
    SSH chatter (nor does the whole log), and its screenshot is a full PNG."""
    shot = _shoot(page, stack, run, browser, request)
    (tmp_path / SCREENSHOTS[page]).write_bytes(shot.png)
    (tmp_path / "dom.html").write_text(shot.dom)
    assert [text for text in shot.expected if text not in shot.dom] == [], (shot.url, shot.dom[-4000:])
    if shot.log is not None:
        assert [chatter for chatter in CHATTER if chatter in shot.dom + shot.log] == [], shot.log[-4000:]
    width, height = _png_size(shot.png)
    if page == "connection":
        assert width >= 600, (width, height)
        assert height >= SCREEN_SIZE[1], (width, height)
    else:
        assert (width, height) == SCREEN_SIZE
    assert 20_000 < len(shot.png) < 1_500_000
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / SCREENSHOTS[page], IMAGES / SCREENSHOTS[page])


# ---------------------------------------------------------------------- the triggerer killed


def _triggerer_pids(session: int) -> list[int]:
    """The ``airflow triggerer`` process of a session and every process under it (its trigger runner)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
    roots = []
    for pid in session_pids(session):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"triggerer" in argv and parents.get(pid) not in roots:
                roots.append(pid)
    tree = set(roots)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= children
        grew = bool(children)
    return sorted(tree)


def test_the_triggerer_killed_mid_job_and_a_new_one_finishes_it(
    stack: Stack, ssh_run: SshRun, tmp_path: Path, record_property: Any
) -> None:
    """A run trains for 8 epochs of 2 s; while its sensor is deferred and the job runs, the real `airflow
    triggerer` process (and its trigger runner) is killed with SIGKILL, then a new `airflow triggerer` is
    started with the same configuration. Expected: the new triggerer takes the trigger over, the run
    succeeds, the job was submitted once and never cancelled (squeue/sacct by its name: one job, COMPLETED),
    and the sensor needed no retry. (Last test of the module: the replacement triggerer is stopped at its end.)"""
    run_id = _trigger(
        stack,
        {
            **DEFAULT_CONF,
            "spec": {"epochs": 8, "batch_size": 4, "learning_rate": 0.001},
            "command": f"{TRAIN} --epoch-seconds 2",
        },
    )
    handle = _wait_handle(stack, run_id)
    _wait_log(stack, run_id, "wait", ["main.out | Epoch 1/8"])
    victims = _triggerer_pids(stack.session)
    assert victims, "no airflow triggerer process found in the standalone session"
    killed_at = time.monotonic()
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    log = (tmp_path / "triggerer.log").open("wb")
    replacement = subprocess.Popen(
        [airflow_bin(), "triggerer"],
        env=stack.env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        finished = _follow(stack, run_id)
        took = time.monotonic() - killed_at
    finally:
        replacement.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            replacement.wait(STOP_TIMEOUT_S)
        if replacement.poll() is None:
            replacement.kill()
        log.close()
    assert finished.state == "success", (finished, _log_text(stack, run_id, "wait")[-3000:])
    _, out, _ = ssh_run(
        f"sacct -X -n -P --starttime=now-1days --name={shlex.quote(handle['job_id'])} -o JobIDRaw,State"
    )
    assert out.split() == [f"{handle['slurm_job_id']}|COMPLETED"], out
    wait = stack.get(f"{_run_path(run_id)}/taskInstances/wait")
    assert set(range(1, int(wait["try_number"]))) <= _tries_failed_by_airflow(stack, run_id, "wait"), wait
    record_property("processes killed", len(victims))
    record_property("seconds from the kill to the run's end", round(took, 1))
