"""Shared helpers of the benchmarks: the test cluster, an isolated Airflow home, figures and results.

Every benchmark script imports this module FIRST (before anything imports Airflow): it points
``AIRFLOW_HOME`` at a temporary directory and defines two connections to the local test cluster
(``bench_slurm`` of type ``tao_slurm`` and ``bench_ssh`` of type ``ssh`` for the SSH provider's
hooks). Results go to ``$BENCH_OUT`` (default ``/tmp/tao-slurm-bench``) as one JSON file per
script; ``report.py`` turns them into ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import platform
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gitstate import checkout_commit
from provenance import RELEASE_PROBE, parse_release_probe
from provenance import result_name as _result_name

REPO = Path(__file__).resolve().parent.parent
#: The test cluster's harness (``rate-limit`` and the other cluster-wide settings).
HARNESS = REPO / "tests" / "cluster" / "harness.py"

CLUSTER_JSON = Path("/var/lib/slurmtest/cluster.json")
OUT_DIR = Path(os.environ.get("BENCH_OUT", "/tmp/tao-slurm-bench"))
SLURM_CONN_ID = "bench_slurm"
SSH_CONN_ID = "bench_ssh"
#: A short random token naming this run's jobs and files on the cluster.
TOKEN = secrets.token_hex(3)


def load_cluster() -> dict[str, Any]:
    """The running test cluster's description (``cluster.json``); exits with the fix when it is down."""
    try:
        return dict(json.loads(CLUSTER_JSON.read_text()))
    except (OSError, ValueError) as exc:
        sys.exit(f"the local SLURM test cluster is not up ({exc}): run `make cluster-up` first")


CLUSTER = load_cluster()
#: The login sshd with OpenSSH's default limits (``MaxStartups 10:30:100``, ``MaxSessions 10``): where the
#: polling benchmark's two patterns meet the login host as users' clusters configure it.
LIMITS_PID_FILE = CLUSTER_JSON.parent / "run" / "sshd-limits.pid"
LOGIN_CGROUP = "tao-bench-login"


def _setup_airflow_env() -> None:
    home = tempfile.mkdtemp(prefix="tao-slurm-bench-airflow-")
    os.environ["AIRFLOW_HOME"] = home
    # Known before Airflow is imported: Airflow keeps the DAGs folder it read at import time.
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = f"{home}/dags"
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")  # figures, not log lines, on stdout
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home}/airflow.db"
    c = CLUSTER
    os.environ[f"AIRFLOW_CONN_{SLURM_CONN_ID.upper()}"] = json.dumps(
        {
            "conn_type": "tao_slurm",
            "host": c["host"],
            "login": c["user"],
            "port": c["port"],
            "extra": {
                "key_file": c["key_file"],
                "host_key": c["host_key"],
                "cluster_name": c["cluster_name"],
                "results_dir": c["results_dir"],
                "account": c["account"],
                "partition": c["gpu_partition"],
                "container_mounts": f"{c['shared_dir']}:{c['shared_dir']}",
            },
        }
    )
    os.environ[f"AIRFLOW_CONN_{SSH_CONN_ID.upper()}"] = json.dumps(
        {
            "conn_type": "ssh",
            "host": c["host"],
            "login": c["user"],
            "port": c["port"],
            "extra": {"key_file": c["key_file"], "known_hosts": c["known_hosts"]},
        }
    )


_setup_airflow_env()


def point_connections_at(port: int) -> None:
    """Point both bench connections at the login sshd listening on ``port`` (same host, keys and user)."""
    for conn_id in (SLURM_CONN_ID, SSH_CONN_ID):
        variable = f"AIRFLOW_CONN_{conn_id.upper()}"
        os.environ[variable] = json.dumps({**json.loads(os.environ[variable]), "port": port})


# Only now: the provider's modules import Airflow, which reads AIRFLOW_HOME once, at import.
from airflow_provider_tao_slurm.core.shell import join  # noqa: E402

# ---------------------------------------------------------------------------------------- cluster


def ssh_argv(command: str) -> list[str]:
    """The OpenSSH client command line running ``command`` as the cluster user (strict host keys)."""
    c = CLUSTER
    return [
        "ssh",
        "-F",
        "none",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={c['known_hosts']}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
        "-i",
        c["key_file"],
        "-p",
        str(c["port"]),
        f"{c['user']}@{c['host']}",
        command,
    ]


def ssh(command: str, *, stdin: str | None = None, timeout: float = 300) -> str:
    """Run ``command`` on the login host over OpenSSH; return stdout.

    :raises RuntimeError: when the command fails (with its stderr).
    """
    proc = subprocess.run(
        ssh_argv(command),
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ssh command failed (rc {proc.returncode}): {command[:200]}: {proc.stderr.strip()}")
    return proc.stdout


def create_held_jobs(prefix: str, count: int) -> list[str]:
    """Submit ``count`` held no-op jobs named ``<prefix>-<i>`` with ONE ssh command (8 sbatch at a time); their ids."""
    submit = join(
        ["sbatch", "--parsable", "--hold", "-p", CLUSTER["cpu_partition"], "-o", "/dev/null", "--wrap", "true"]
    )
    try:
        out = ssh(
            f"seq 1 {int(count)} | sed 's/^/{prefix}-/' | xargs -P 8 -n 1 {submit} -J",
            timeout=900,
        )
    except (RuntimeError, subprocess.TimeoutExpired):
        cancel_by_prefix(prefix)  # the submissions may have stopped halfway
        raise
    ids = [line.split(";")[0] for line in out.split()]
    if len(ids) != count or not all(i.isdigit() for i in ids):
        cancel_jobs([i for i in ids if i.isdigit()])
        raise RuntimeError(f"expected {count} job ids from sbatch, got {len(ids)}: {out[:200]!r}")
    return sorted(ids, key=int)


def cancel_jobs(job_ids: Sequence[str]) -> None:
    """Cancel jobs with the local SLURM client (root may cancel any job); finished ones are fine."""
    if job_ids:
        subprocess.run(["scancel", "-Q", *job_ids], check=False, capture_output=True, timeout=120)


def cancel_by_prefix(prefix: str) -> None:
    """Cancel every live job named ``<prefix>-<anything>`` (local SLURM client, as root)."""
    listing = subprocess.run(
        ["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=120, check=False
    ).stdout
    cancel_jobs(
        [
            job_id
            for job_id, _, name in (line.partition(" ") for line in listing.splitlines())
            if name.startswith(f"{prefix}-")
        ]
    )


def sqsh_image() -> str:
    """Import a stand-in ``.sqsh`` image (the harness's Enroot stand-in) for this run; return its path."""
    path = f"{CLUSTER['containers_dir']}/bench_{TOKEN}.sqsh"
    ssh(join(["enroot", "import", "-o", path, f"docker://nvcr.io#nvidia/bench:{TOKEN}"]))
    return path


def remove_remote(paths: Sequence[str]) -> None:
    """``rm -rf`` paths on the cluster (benchmark leftovers), in one command."""
    if paths:
        ssh(join(["rm", "-rf", "--", *paths]))


# ---------------------------------------------------------------------------- scheduler statistics

#: One line of an sdiag RPC table: a message type (or a user name), its number (or uid), its count.
_SDIAG_RPC = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)")


def _rpc_table(text: str, header: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    inside = False
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics by"):
            inside = line.startswith(header)
            continue
        match = _SDIAG_RPC.match(line) if inside else None
        if match:
            counts[match.group(1)] = int(match.group(2))
    return counts


def _admin(argv: list[str], attempts: int = 5) -> str:
    """Run a local SLURM admin command, retrying while a daemon restarts (other work may restart them)."""
    for attempt in range(attempts):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode == 0:
            return proc.stdout
        if attempt < attempts - 1:
            time.sleep(2)
    raise RuntimeError(f"{' '.join(argv)} failed (rc {proc.returncode}): {proc.stderr.strip()}; is the cluster up?")


def reset_rpc_counts() -> None:
    """Zero slurmctld's (``sdiag -r``) and slurmdbd's (``sacctmgr clear stats``) RPC counters (root)."""
    _admin(["sdiag", "-r"])
    _admin(["sacctmgr", "-i", "clear", "stats"])


def rpc_counts() -> dict[str, dict[str, int]]:
    """RPC counts by message type since the last reset: ``{"slurmctld": {...}, "slurmdbd": {...}}``."""
    by_type = "Remote Procedure Call statistics by message type"
    return {
        "slurmctld": _rpc_table(_admin(["sdiag"]), by_type),
        "slurmdbd": _rpc_table(_admin(["sacctmgr", "show", "stats"]), by_type),
    }


def ctld_rpcs_by_user() -> dict[str, int]:
    """slurmctld's RPC counts by user since its last reset (``sdiag``, read-only): what ``rl_enable`` limits."""
    return _rpc_table(_admin(["sdiag"]), "Remote Procedure Call statistics by user")


#: slurmctld messages that read job state (squeue, scontrol show job) and the slurmdbd one (sacct).
JOB_QUERY_RPCS = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_USER_INFO")
DBD_JOB_QUERY_RPCS = ("DBD_GET_JOBS_COND",)
#: RPCs that our own measuring (sdiag, sacctmgr) adds; left out of the totals.
OWN_RPCS = ("REQUEST_STATS_INFO", "DBD_GET_STATS", "DBD_CLEAR_STATS", "SLURM_PERSIST_INIT", "DBD_FINI")


def summarize_rpcs(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    """Job-state queries and all RPCs (minus our own ``sdiag``/``sacctmgr``) on each daemon."""
    ctld, dbd = counts["slurmctld"], counts["slurmdbd"]
    return {
        "ctld_job_queries": sum(ctld.get(name, 0) for name in JOB_QUERY_RPCS),
        "dbd_job_queries": sum(dbd.get(name, 0) for name in DBD_JOB_QUERY_RPCS),
        "ctld_rpcs": sum(v for k, v in ctld.items() if k not in OWN_RPCS),
        "dbd_rpcs": sum(v for k, v in dbd.items() if k not in OWN_RPCS),
    }


# ------------------------------------------------------------------------ slurmctld's RPC rate limit

#: slurmctld's log on this machine (the harness's; in a release tree, the tree's own).
CTLD_LOG = Path(CLUSTER.get("state_dir", "/var/lib/slurmtest")) / "log" / "slurm" / "slurmctld.log"
#: The provider's pacing state and its cached reading of the site's limiter, in the cluster user's home on the
#: login host (``core/commands/pacing.py``): removed whenever the limiter changes, so the next submission reads it.
PACING_FILES = (
    '"$HOME/.tao-slurm/rpc-bucket" "$HOME/.tao-slurm/slurmctld-parameters" "$HOME/.tao-slurm/slurmctld-preemption"'
)


def harness(*args: str, timeout: float = 300) -> str:
    """Run a harness command (``tests/cluster/harness.py``, as root); its output.

    :raises RuntimeError: when it fails (with its output).
    """
    proc = subprocess.run(
        [sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"harness {' '.join(args)} failed (rc {proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def forget_pacing() -> None:
    """Remove the provider's pacing state and cached limiter reading on the login host (:data:`PACING_FILES`)."""
    ssh(f"rm -f -- {PACING_FILES}")


@contextlib.contextmanager
def site_rate_limit(parameters: str | None) -> Iterator[str | None]:
    """slurmctld's RPC rate limit (``rl_enable``) set to ``parameters`` for the block and turned off after it,
    whatever happens in it (``harness.py rate-limit``; SLURM 23.02 and later). None: the cluster stays as it is.

    The provider caches its reading of the site's limiter for 10 minutes: :func:`forget_pacing` both times, so
    the first submission reads the new setting and later work does not pace against a limiter that is gone.
    """
    if not parameters:
        yield None
        return
    try:
        harness("rate-limit", parameters)
        forget_pacing()
        yield parameters
    finally:
        try:
            harness("rate-limit", "off")
        finally:
            forget_pacing()


class CtldLogWindow:
    """The lines slurmctld logs from now on (its log read from the size it had when this was made).

    slurmctld logs every RPC its rate limit refuses ("RPC rate limit exceeded by uid U with RPC ..., telling
    to back off"; ``rl_log_freq`` unset logs each one): :meth:`refusals` counts a user's.
    """

    def __init__(self, path: Path = CTLD_LOG) -> None:
        self.path = path
        try:
            self.offset: int | None = path.stat().st_size
        except OSError:
            self.offset = None

    def text(self) -> str | None:
        """What slurmctld logged since; None when its log cannot be read."""
        if self.offset is None:
            return None
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                return log.read().decode(errors="replace")
        except OSError:
            return None

    def refusals(self, uid: int) -> int | None:
        """RPCs of user ``uid`` the rate limit refused since; None when the log cannot be read."""
        from ratelimit import refusals

        text = self.text()
        return None if text is None else refusals(text, uid)


# ------------------------------------------------------------------------------ commands sent


class SentCommands:
    """Counts the commands the provider sends over its pooled asyncssh connection, where they go out.

    Every async hook method (status polls, log reads, end-marker reads) sends each of its commands
    through ``async_pool().run``: one SSH channel, one remote command. This replaces ``run`` on the pool
    instance (install it once per process) and counts each call.

    :ivar count: commands sent since installed.
    :ivar programs: the same commands by program (a command's first word: ``squeue``, ``sacct``, ``find``, ...).
    :ivar around: when set, each command runs inside it: ``around(send)`` must await ``send()`` once
        (the poller brackets single commands with the scheduler's RPC counters).
    """

    def __init__(self, pool: Any) -> None:
        self.count = 0
        self.programs: collections.Counter[str] = collections.Counter()
        self.around: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] | None = None
        send_one = pool.run

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            command = args[1] if len(args) > 1 else kwargs.get("command", "")
            self.programs[(command.split(None, 1) or [""])[0]] += 1
            send = functools.partial(send_one, *args, **kwargs)
            return await (send() if self.around is None else self.around(send))

        pool.run = counted


# ------------------------------------------------------------------------------ process figures


def rss_bytes() -> int:
    """This process's resident set size (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS missing from /proc/self/status")


def machine_cpu_seconds() -> float:
    """CPU seconds used by every process on the machine since boot (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / 100.0


def median(values: Sequence[float]) -> float:
    """The median (NaN for no values)."""
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class LoginCgroup:
    """A login sshd moved into a cgroup of its own: the CPU time and memory of sshd, its sessions and every
    command they run (squeue, sacct), apart from everything else on the machine.

    The listener is moved; connections opened afterwards fork from it and inherit the group. cgroup v1
    (``cpuacct`` + ``memory`` hierarchies) and v2 (``cpu.stat``, ``memory.peak``) are both read.
    """

    version: int
    cpu_file: Path
    peak_file: Path

    @classmethod
    def attach(cls, pid_file: Path = LIMITS_PID_FILE) -> LoginCgroup | None:
        """Move the sshd of ``pid_file`` into :data:`LOGIN_CGROUP` (idempotent); None where cgroups are not ours."""
        root = Path("/sys/fs/cgroup")
        try:
            pid = pid_file.read_text().strip()
            if (root / "cpuacct").is_dir() and (root / "memory").is_dir():
                groups = [root / "cpuacct" / LOGIN_CGROUP, root / "memory" / LOGIN_CGROUP]
                found = cls(1, groups[0] / "cpuacct.usage", groups[1] / "memory.max_usage_in_bytes")
            elif (root / "cgroup.controllers").exists():
                groups = [root / LOGIN_CGROUP]
                (root / "cgroup.subtree_control").write_text("+cpu +memory")
                found = cls(2, groups[0] / "cpu.stat", groups[0] / "memory.peak")
            else:
                raise OSError("no cpuacct/memory (v1) or unified (v2) cgroup hierarchy under /sys/fs/cgroup")
            for group in groups:
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(pid)
        except OSError as exc:
            print(f"warning: the login node's cost is not measured: {exc}", file=sys.stderr)
            return None
        return found

    def cpu_seconds(self) -> float:
        """CPU time used by the group so far (processes that exited included)."""
        text = self.cpu_file.read_text()
        if self.version == 1:
            return int(text) / 1e9
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6

    def reset_peak(self) -> None:
        """Start a new peak-memory window (v2 kernels before 6.12 cannot: the peak then covers the group's life)."""
        with contextlib.suppress(OSError):
            self.peak_file.write_text("0")

    def peak_bytes(self) -> int:
        """The group's peak memory since :meth:`reset_peak`."""
        return int(self.peak_file.read_text())


# ------------------------------------------------------------------------------ figures and output


@dataclass(frozen=True)
class Figure:
    """One printed figure: what, the measured value (text), the baseline, the target and the verdict.

    :ivar ok: True/False against the target, None when the figure has no target.
    """

    name: str
    value: str
    baseline: str = ""
    target: str = ""
    ok: bool | None = None


def verdict(ok: bool | None) -> str:
    """``ok`` / ``MISSED`` / ``-``."""
    return "-" if ok is None else ("ok" if ok else "MISSED")


def print_figures(title: str, figures: Sequence[Figure]) -> None:
    """Print a table of figures with their targets."""
    print(f"\n== {title}")
    width = max(len(f.name) for f in figures)
    vwidth = max(len(f.value) for f in figures)
    for f in figures:
        base = f"  (baseline {f.baseline})" if f.baseline else ""
        target = f"  target {f.target} -> {verdict(f.ok)}" if f.target else ""
        print(f"  {f.name:<{width}}  {f.value:>{vwidth}}{target}{base}")
    sys.stdout.flush()


def measured_commit() -> str:
    """``git rev-parse HEAD`` of the checkout measured, with ``-dirty`` when it has changes other than the outputs.

    The outputs (``benchmarks/results/``, ``benchmarks/RESULTS.md``) are not what is measured; any other
    change (provider, benchmarks, templates, docs, an untracked file) makes the commit ``-dirty``.
    """
    return checkout_commit(REPO, ("benchmarks/results", "benchmarks/RESULTS.md"))


#: The ``make bench`` run a script belongs to: its start time (UTC), exported once by the Makefile for the
#: whole run; None when the script runs alone.
BENCH_RUN = os.environ.get("BENCH_RUN") or None


#: The SLURM release of a Debian tree the script runs in (``tests/cluster/releases.py`` sets it); None on the
#: machine's own release. A tree's results are stored as ``<name>@<release>.json``.
RELEASE_TREE = os.environ.get("TAO_SLURM_RELEASE_TREE") or None


def result_name(name: str, release: str | None = RELEASE_TREE, variant: str | None = None) -> str:
    """The results file's name (without ``.json``) of script ``name`` run on ``release`` (None: the machine's),
    in ``variant`` (``rl``: slurmctld's RPC rate limit on; :func:`provenance.result_name`)."""
    return _result_name(name, release, variant)


def cluster_release() -> dict[str, str]:
    """The cluster's SLURM release, asked on the login host as the cluster user (one ``REQUEST_BUILD_INFO``):
    slurmctld's own (``scontrol show config``'s ``SLURM_VERSION``) and the login host's client (``sinfo --version``).

    Never raises: a cluster that cannot be asked reads ``unknown``, with why.
    """
    try:
        return parse_release_probe(ssh(RELEASE_PROBE, timeout=60))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        why = f"unknown ({str(exc)[:160]})"
        return {"slurmctld": why, "login_client": why}


def write_result(
    name: str,
    title: str,
    figures: Sequence[Figure],
    details: dict[str, Any],
    *,
    measures: Sequence[str],
    variant: str | None = None,
) -> Path:
    """Store a script's figures (and raw details) as ``$BENCH_OUT/<name>.json`` for ``report.py``.

    Each file records the commit measured, the ``make bench`` run (:data:`BENCH_RUN`) it belongs to, the
    cluster's SLURM release as slurmctld reports it (:func:`cluster_release`; the client where the script ran
    beside it) and the paths of the code it measures (the script's ``MEASURES``: ``report.py`` counts the
    commits that changed them since); in a release tree the name carries the release, and a variant
    (``rl``) its own suffix (:func:`result_name`).
    """
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stem = result_name(name, variant=variant)
    path = OUT_DIR / f"{stem}.json"
    release = cluster_release()
    data = {
        "name": stem,
        "title": title,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": measured_commit(),
        "run": BENCH_RUN,
        "slurmctld": release["slurmctld"],
        "slurm_login_client": release["login_client"],
        "slurm_local_client": _first_line(["sinfo", "-V"]),
        "measures": list(measures),
        "figures": [asdict(f) for f in figures],
        "details": details,
    }
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "absent"


def _first_line(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return f"unavailable ({exc})"
    return (proc.stdout or proc.stderr).strip().splitlines()[0] if (proc.stdout or proc.stderr).strip() else ""


def machine_description() -> dict[str, str]:
    """``nproc``, memory, CPU model, kernel, OS and the versions the figures depend on."""
    meminfo = Path("/proc/meminfo").read_text()
    mem_kb = int(re.search(r"MemTotal:\s+(\d+)", meminfo).group(1))  # type: ignore[union-attr]
    cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
    os_name = re.search(r'PRETTY_NAME="([^"]+)"', Path("/etc/os-release").read_text())
    return {
        "nproc": str(os.cpu_count()),
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "cpu": cpu.group(1).strip() if cpu else "unknown",
        "kernel": platform.release(),
        "os": os_name.group(1) if os_name else platform.platform(),
        "python": platform.python_version(),
        "apache-airflow": _version("apache-airflow"),
        "apache-airflow-providers-ssh": _version("apache-airflow-providers-ssh"),
        "asyncssh": _version("asyncssh"),
        "paramiko": _version("paramiko"),
        "slurm client on this machine (each table names the cluster's own)": _first_line(["sinfo", "-V"]),
        "openssh": _first_line(["ssh", "-V"]),
        "load average 1/5/15 min, at report time": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }
