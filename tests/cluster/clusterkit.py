"""Shared helpers and fixtures of the cluster suites (the fault and security suites, submit-and-watch, watch-live ...).

Everything runs against the local SLURM test cluster (``tests/cluster/harness.py``). The helpers ask the
cluster through real OpenSSH (``ssh_run``), never through the provider, so what they report is
independent evidence: which jobs carry a name, a file's mode, a record's content.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import structlog

from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.hooks.slurm import async_pool
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.config import ClusterSettings
    from tests.cluster.conftest import ClusterEnv, SshRun

HARNESS = Path(__file__).resolve().parent / "harness.py"
CLUSTER_CONFTEST = "tao_cluster_conftest"
SECRET_SOURCE = "TAO_RELIABILITY_SECRET"
#: Prints a digest of the secret the job received: proves it arrived without ever printing it.
SHOW_SECRET = 'echo "secret-digest=$(printf %s "$RL_TOKEN" | sha256sum | cut -c1-16)"'
POLL_S = 1.0

# ---------------------------------------------------------------------- the cluster, asked over OpenSSH


#: Set by the cluster conftest while a test runs: ``alone`` for a test marked so, ``beside`` for one that runs
#: beside other cluster tests (make test runs those side by side).
TEST_KIND_ENV = "TAO_CLUSTER_TEST"
ALONE = "alone"


def require_alone(what: str) -> None:
    """Fail at once, naming the marker, when a test that runs beside others does ``what``: something that changes
    the cluster for every job on it (a fault, a node or partition changed, every GPU of a partition held)."""
    if os.environ.get(TEST_KIND_ENV) not in (None, ALONE):
        pytest.fail(
            f"{what}: a test that changes the cluster for everyone must be marked @pytest.mark.{ALONE} "
            "(make test runs the others side by side)",
            pytrace=False,
        )


#: The harness commands that cut its cut login sshd off the scheduler, or lift the cut: only the tests that log in
#: there see it, so a test holding :func:`login_cut_held` may run them beside others.
CUT_COMMANDS = frozenset({"cut-login-ctld", "cut-login-head", "restore-login"})
CUT_LOCK = Path("/var/lib/slurmtest/login-cut.lock")
#: Whether this process holds :data:`CUT_LOCK` (a test's threads, an event loop's too, run its harness calls).
_cut = {"held": False}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the lock file at ``path`` (``flock``, across the workers of make test) for the block."""
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def login_cut_held() -> Iterator[None]:
    """Hold the harness's cut login sshd for this test: the tests that cut it take turns (a lock across the
    workers of make test); the other tests never log in there."""
    with _locked(CUT_LOCK):
        _cut["held"] = True
        try:
            yield
        finally:
            _cut["held"] = False


#: Taken while the harness's fault switch file is rewritten (tests side by side each list their own word).
FAULT_SWITCH_LOCK = Path("/var/lib/slurmtest/fault-switch.lock")


def _rewrite_switch(switch: Path, change: Callable[[list[str]], list[str]]) -> None:
    """Rewrite the fault switch's words under :data:`FAULT_SWITCH_LOCK`, whole (a reader never sees half)."""
    with _locked(FAULT_SWITCH_LOCK):
        words = change(switch.read_text().split() if switch.exists() else [])
        if not words:
            switch.unlink(missing_ok=True)
            return
        partial = switch.with_name(f".{switch.name}.{os.getpid()}")
        partial.write_text("".join(f"{word}\n" for word in words))
        partial.chmod(0o644)
        partial.replace(switch)


@contextlib.contextmanager
def fault_listed(switch: Path, word: str) -> Iterator[None]:
    """List ``word`` in the harness's fault switch (``cluster.json``'s ``fault_switch``) for the block, beside
    the words other tests listed: each takes only its own word away again."""
    _rewrite_switch(switch, lambda words: words if word in words else [*words, word])
    try:
        yield
    finally:
        _rewrite_switch(switch, lambda words: [w for w in words if w != word])


def harness(*args: str, timeout: float = 120) -> str:
    """Run a harness fault command (we run as root, as the harness requires); return its output.

    A fault disturbs every job on the cluster: only a test marked ``alone`` may inject one (:func:`require_alone`),
    but for a cut of the cut login sshd by a test that holds it (:func:`login_cut_held`) and a new host key of the
    rotating sshd (only its own test logs in there).
    """
    private = args[:1] == ("rotate-host-key",)  # the rotating sshd: one test logs in there
    if not (private or (args[:1] and args[0] in CUT_COMMANDS and _cut["held"])):
        require_alone(f"harness {' '.join(args)}")
    proc = subprocess.run(
        [sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"harness {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


def remote_text(ssh_run: SshRun, path: str) -> str:
    """A file's content on the cluster ('' when it does not exist)."""
    _, out, _ = ssh_run(f"cat -- {quote(path)} 2>/dev/null")
    return out


def sidecar_mode(ssh_run: SshRun, path: str) -> str:
    """``stat -c %a`` of a file (the secret sidecar), or ``gone``."""
    _, out, _ = ssh_run(f"stat -c %a -- {quote(path)} 2>/dev/null || echo gone")
    return out.strip()


def squeue_field(ssh_run: SshRun, slurm_id: str, field: str) -> str:
    """One ``squeue -t all`` column (``%T``, ``%N``, ``%r`` ...) of a job; empty when squeue forgot it."""
    _, out, _ = ssh_run(join(["squeue", "-h", "-t", "all", "-j", slurm_id, "-o", field]))
    return out.strip()


def start_requeued_elsewhere(ssh_run: SshRun, slurm_id: str, ran_on: str) -> None:
    """End a requeued job's wait (``BeginTime``) as its owner may, on a node other than ``ran_on``.

    SLURM holds a requeued job for ``cred_expire`` because the node it ran on refuses the job's revoked
    credential until then: started there sooner, the rerun is killed at once ("Job credential revoked",
    exit 1) and the job really ends FAILED. Any other node may start it now.
    """
    rc, _, err = ssh_run(join(["scontrol", "update", f"jobid={slurm_id}", f"ExcNodeList={ran_on}", "StartTime=now"]))
    assert rc == 0, err


def final_state(ssh_run: SshRun, slurm_id: str) -> str:
    """The job's state as sacct has it, first word (``CANCELLED by 1001`` -> ``CANCELLED``)."""
    _, out, _ = ssh_run(join(["sacct", "-X", "-n", "-P", "-j", slurm_id, "-o", "State", "--starttime=now-1days"]))
    words = out.split()
    return words[0] if words else ""


def jobs_named(ssh_run: SshRun, name: str) -> list[str]:
    """Ids of every job (live, or finished in the last day) named exactly ``name``, by squeue and sacct."""
    command = (
        join(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i"])
        + " ; "
        + join(["sacct", "-X", "-n", "-P", "--starttime=now-1days", f"--name={name}", "-o", "JobIDRaw"])
    )
    _, out, _ = ssh_run(command)
    return sorted(set(out.split()), key=int)


def job_names(ssh_run: SshRun, prefix: str) -> dict[str, str]:
    """``{slurm id: name}`` of every job of the cluster user (live or finished today) named ``prefix...``."""
    command = (
        join(["squeue", "-h", "-t", "all", "--me", "-o", "%i|%j"])
        + " ; "
        + join(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,JobName", "--starttime=now-1days"])
    )
    _, out, _ = ssh_run(command)
    found: dict[str, str] = {}
    for line in out.splitlines():
        slurm_id, _, name = line.partition("|")
        if name.startswith(prefix):
            found[slurm_id.strip()] = name
    return found


def as_other(cluster: ClusterEnv, command: str, timeout: float = 60) -> tuple[int, str, str]:
    """Run a shell command on this machine (the login host) as the cluster's second user; ``(rc, out, err)``."""
    proc = subprocess.run(
        ["runuser", "-u", cluster.other_user, "--", "bash", "-c", command],
        cwd=cluster.other_dir,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": cluster.other_dir},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def submit_as_other(
    cluster: ClusterEnv, job_name: str, command: str = "sleep 300", *, hold: bool = False, partition: str | None = None
) -> str:
    """Submit a job named ``job_name`` as the second user (held with ``hold``); return its SLURM id."""
    argv = [
        "sbatch",
        "--parsable",
        *(["--hold"] if hold else []),
        f"--job-name={job_name}",
        f"--output={cluster.other_dir}/%x-%j.out",
        f"--partition={partition or cluster.gpu_partition}",
        "--time=00:10:00",
        f"--wrap={command}",
    ]
    rc, out, err = as_other(cluster, join(argv))
    if rc != 0:
        pytest.fail(f"sbatch as {cluster.other_user} failed: {err.strip()}")
    return out.strip().split(";")[0]


# A submit task's try, in its own process, against the fault login sshd (its sbatch submits the held job,
# then cuts the session before the reply): it stops right before reconciling, to be SIGKILLed there.
_KILLED_SUBMIT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from clusterkit import submit_op
from deferral import context
from airflow_provider_tao_slurm.lifecycle import submission

def killed_before_reconciling(hook, job_name, log, **kwargs):
    print("RECONCILING", job_name, flush=True)
    time.sleep(600)

submission.reconcile = killed_before_reconciling
submit_op(sys.argv[2], sys.argv[5]).execute(context(sys.argv[3], "submit", "r1", try_number=int(sys.argv[4])))
"""


def submit_and_sigkill(cluster: ClusterEnv, image: str, dag: str, *, try_number: int, command: str) -> str:
    """Run try ``try_number`` of task ``submit`` (run ``r1``) in a child process through the fault sshd and
    SIGKILL it right after its sbatch, before it could reconcile or release the held job (a worker killed
    mid-submit); return the job name it submitted under."""
    env = {**os.environ, "AIRFLOW_CONN_SLURM_DEFAULT": connection_json(cluster, port=cluster.fault_port)}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SUBMIT, str(HARNESS.parent), image, dag, str(try_number), command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None
        output = []
        for line in child.stdout:  # Airflow logs to stdout too; the child exits only if submit went wrong
            output.append(line)
            if line.startswith("RECONCILING "):
                os.kill(child.pid, signal.SIGKILL)
                return line.split()[1]
        pytest.fail(f"try {try_number} ended without reaching the reconcile step:\n" + "".join(output[-20:]))
    finally:
        child.kill()
        child.wait(30)


def record_of(ssh_run: SshRun, path: str) -> dict[str, Any]:
    """The job record on the cluster, parsed."""
    text = remote_text(ssh_run, path)
    assert text, f"no record at {path}"
    return dict(json.loads(text))


def digest(value: str) -> str:
    """What :data:`SHOW_SECRET` prints for ``value``."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- connections


def connection_json(cluster: ClusterEnv, **changes: Any) -> str:
    """``AIRFLOW_CONN_SLURM_DEFAULT`` for the test cluster (as ``slurm_connection_env`` sets it), for module
    fixtures; ``changes`` replace connection fields, ``extra`` entries are merged.

    ``tests/cluster/conftest.py`` is loaded by path: the import name ``conftest`` belongs to several modules.
    """
    module = sys.modules.get(CLUSTER_CONFTEST)
    if module is None:
        spec = importlib.util.spec_from_file_location(CLUSTER_CONFTEST, HARNESS.with_name("conftest.py"))
        assert spec is not None
        assert spec.loader is not None
        module = sys.modules[CLUSTER_CONFTEST] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    fields = {"conn_type": "tao_slurm", **module.connection_fields(cluster)}
    fields["extra"] = {**fields["extra"], **changes.pop("extra", {})}
    return json.dumps({**fields, **changes})


async def pooled_port(settings: ClusterSettings) -> int:
    """The local port of the pooled async SSH connection the triggers of this event loop share."""
    conn = await async_pool().connection(settings)
    return int(conn.get_extra_info("sockname")[1])


def cut_connection(cluster: ClusterEnv, local_port: int) -> None:
    """Reset one SSH connection on the server side (``ss -K``), as a login-host restart or a network cut does.

    Only the connection from ``local_port`` is hit: other suites' sessions stay up.
    """
    subprocess.run(
        ["ss", "-K", "-t", "src", f"{cluster.host}:{cluster.port}", "dst", f"{cluster.host}:{local_port}"],
        check=True,
        capture_output=True,
    )


# ---------------------------------------------------------------------- triggerer


class Triggerer:
    """One event loop in a background thread, as in a triggerer process: every trigger runs in it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="triggerer", daemon=True)
        self.thread.start()

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run ``coroutine`` on the triggerer's loop; wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def first_event(self, trigger: Any, timeout: float = 180) -> dict[str, Any]:
        """Rebuild ``trigger`` from ``serialize()`` (as the triggerer does) and return its first event's payload."""
        classpath, kwargs = trigger.serialize()
        module, _, name = classpath.rpartition(".")
        rebuilt = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))

        async def first() -> dict[str, Any]:
            events = rebuilt.run()
            try:
                return dict((await anext(events)).payload)
            finally:
                await events.aclose()

        return dict(self.call(first(), timeout))

    def close(self) -> None:
        """Close the pooled connections of the loop and stop it."""
        self.call(async_pool().close_all(), 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# ---------------------------------------------------------------------- operators


def submit_op(image: str, command: str, **kwargs: Any) -> SbatchSubmitOperator:
    """A small, fast job: one GPU, one CPU, six minutes (three for the program), the test secret in ``RL_TOKEN``."""
    kwargs.setdefault("secret_env", {"RL_TOKEN": f"env:{SECRET_SOURCE}"})
    kwargs.setdefault("time_hours", 0.1)
    kwargs.setdefault("timeout_hours", 0.05)
    return SbatchSubmitOperator(
        task_id=kwargs.pop("task_id", "submit"),
        image=image,
        command=command,
        gpus_per_node=kwargs.pop("gpus_per_node", 1),
        cpus_per_task=1,
        **kwargs,
    )


def submit(op: SbatchSubmitOperator, ctx: dict[str, Any]) -> dict[str, Any]:
    """``op.execute(ctx)``, closing the operator's SSH connection afterwards."""
    try:
        return dict(op.execute(ctx))
    finally:
        op.hook.close()


def sensor_for(handle: dict[str, Any], **kwargs: Any) -> SlurmJobSensor:
    """The sensor on a job handle, polling every second."""
    kwargs.setdefault("poke_interval", POLL_S)
    return SlurmJobSensor(task_id="wait", job=handle, **kwargs)


# ---------------------------------------------------------------------- evidence collectors


class ArgvSampler(threading.Thread):
    """Samples every process's command line on this machine (it is the login host) with ``ps -eo args``."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="argv-sampler")
        self.samples: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append(subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True).stdout)

    def stop(self) -> list[str]:
        """Stop sampling; return the samples."""
        self.done.set()
        self.join(10)
        return self.samples


class LogCapture(logging.Handler):
    """Every log line this process emits while active: Airflow's structlog loggers (operators, hooks,
    triggers) and the standard library loggers (poller, asyncssh, paramiko) down to DEBUG.

    The structlog recorder sits right before the renderer, after the message was formatted, and
    before any masking a task runner might add: what it sees is what the code wrote.
    """

    LOGGERS = ("", "airflow_provider_tao_slurm", "asyncssh", "paramiko", "airflow")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._levels: dict[str, int] = {}
        self._processors: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")

    def _record(self, _logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        self.lines.append(" ".join(f"{key}={value}" for key, value in event_dict.items()))
        return event_dict

    def __enter__(self) -> LogCapture:
        self._processors = list(structlog.get_config()["processors"])
        structlog.configure(processors=[*self._processors[:-1], self._record, self._processors[-1]])
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(logging.DEBUG)
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
        structlog.configure(processors=self._processors)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def demo_program() -> None:
    """The training stand-in and its datasets under the demo directory (once per module that uses it)."""
    from demo import load_cluster, stage_assets

    stage_assets(load_cluster())


@pytest.fixture(scope="session")
def image(cluster: ClusterEnv, ssh_run: SshRun) -> str:
    """A real squashfs made once by the Enroot stand-in (reused while its magic is right)."""
    path = f"{cluster.containers_dir}/reliability.sqsh"
    # Under a lock: the cluster tests run side by side (make test), and each worker's session asks once.
    make = (
        f'[ "$(head -c 4 -- {quote(path)} 2>/dev/null)" = hsqs ] || '
        f"{{ rm -f -- {quote(path)} && {join(['enroot', 'import', '-o', path, 'docker://nvcr.io#nvidia/x:1'])}; }}"
    )
    rc, _, err = ssh_run(join(["flock", f"{path}.lock", "sh", "-c", make]), timeout=120)
    assert rc == 0, err
    return path


@pytest.fixture(scope="session")
def secret_value() -> str:
    """The secret of this session's jobs (``secret_env`` reads it from the worker's environment)."""
    return f"rl-{uuid.uuid4().hex}"


@pytest.fixture
def conn(slurm_connection_env: str, secret_value: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ``slurm_default`` connection, plus the worker-side variable the secret is read from."""
    monkeypatch.setenv(SECRET_SOURCE, secret_value)
    return slurm_connection_env


@pytest.fixture
def dag_id(request: pytest.FixtureRequest) -> str:
    """A DAG id unique to this test and run (it is part of every job name)."""
    node = hashlib.sha256(f"{request.node.nodeid}{uuid.uuid4()}".encode()).hexdigest()[:10]
    return f"rl-{re.sub(r'[^a-z0-9]+', '-', request.node.originalname.removeprefix('test_'))[:24]}-{node}"
