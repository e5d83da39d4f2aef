#!/usr/bin/env python3
"""Local SLURM test cluster for the provider's cluster tests (standard library only, run as root).

Usage: ``python3 tests/cluster/harness.py COMMAND`` where COMMAND is one of

- ``up``: install the Debian packages if missing, write the configuration, start every daemon that
  is not running or whose configuration changed, wait until every node is usable and the cluster
  user can log in, then print the environment JSON (also written to ``<state>/cluster.json``).
  Idempotent; a second ``up`` restarts nothing and takes about a second.
- ``down``: cancel all jobs, then stop the daemons ``up`` started (by pid file, after checking the
  process name). Nothing else is touched.
- ``status``: one line per daemon, then the node states. Exit 1 if a daemon is not running.
- ``env``: print (and write) the environment JSON.
- fault injection: ``restart-sshd``, ``stop-slurmdbd``, ``start-slurmdbd``, ``restart-slurmctld``,
  ``stop-slurmctld``, ``start-slurmctld`` (waits until every node has registered again),
  ``node-down NODE``, ``node-resume NODE``, ``drain NODE``, ``rotate-host-key`` (gives the "rotating"
  sshd a new host key and restarts it; its open sessions stay up, as with a real sshd restart).
- ``min-job-age SECONDS`` (or ``default``): slurmctld's ``MinJobAge`` (SLURM's default 300 s), the time a
  finished job stays known to squeue; slurm.conf is rewritten and slurmctld reconfigured. ``up`` sets the
  default again.
- ``rate-limit PARAMETERS`` (or ``off``): slurmctld's per-user RPC rate limiter (``rl_enable``, from SLURM
  23.02), e.g. ``rl_enable,rl_bucket_size=10,rl_refill_rate=1`` as ``SlurmctldParameters``; slurm.conf is
  rewritten and slurmctld reconfigured. ``up`` turns it off again.
- ``preempt-signal on|off|default``: how a preempted job is warned. ``on`` and ``off`` give the partitions
  ``polar_urgent`` preempts (those of n1/n2) a preemption ``GraceTime`` (:data:`PREEMPT_GRACE_S`), ``on`` also
  has the batch shell sent its ``--signal`` warning at preemption (``PreemptParameters=send_user_signal`` from
  SLURM 23.02, ``SlurmctldParameters=preempt_send_user_signal`` before it);
  ``default``: neither, as ``up`` sets it again. slurm.conf is rewritten and slurmctld reconfigured.
- ``pyxis-off NODE`` / ``pyxis-on NODE``: hide (show) the Pyxis stand-in from the job steps of one node
  while the login host's srun keeps offering its options, as on a site whose GPU nodes lack Pyxis
  (see :func:`node_pyxis`); ``up`` shows it on every node.

The cluster (Debian 12, SLURM 22.05, no systemd): ``slurmctld`` + ``slurmdbd`` (private MariaDB on
127.0.0.1:3307) + ``munged``; four ``slurmd`` nodes in their own UTS and mount namespaces: GPU nodes
``n1``/``n2``, each with four fake GPUs (char devices, typed GRES: ``a100`` on n1, ``h100`` on n2), 8 CPUs
and node features (n1 ``a100,ib``, n2 ``h100,ib``), the CPU node ``n3`` (no GPUs, 8 CPUs, feature ``cpu``),
and the 16-GPU node ``n4`` (``h100``, 16 CPUs, features ``h100,ib,wide``) in a partition of its own.
Shaped unlike a seed site: GPU partitions ``polar`` (the default, 4 h), ``polar_long`` (48 h),
``debug`` (30 minutes: sinfo prints ``30:00``), ``polar_1m`` (one minute: ``1:00``) and the hidden
``polar_hidden`` (24 h, ``Hidden=YES``: only ``sinfo -a`` lists it) and ``polar_urgent`` (1 h,
``PriorityTier=10``: with ``PreemptType=preempt/partition_prio`` and ``PreemptMode=REQUEUE`` its jobs
requeue the jobs of the other partitions they need the nodes of; ``AuthInfo=cred_expire=60`` has a
requeued job start again after a minute instead of two), all on n1/n2 with 4 GPUs a node;
``cpu_long`` (7 days) on n3 alone; ``polar_16g`` (4 h) on n4 alone, where an 8-GPU job shares the node
and a 16-GPU one takes it whole; a QOS ``long_qos`` besides ``normal``; account ``gpu_proj`` with two users (both
may use ``long_qos``): ``slurmuser`` (the provider's) and ``slurmother`` (another person on
the shared cluster: no SSH login, its own ``/srv/lustre/slurmother``; tests submit as it with ``runuser``).
The login node is a key-only sshd on 127.0.0.1:22022 for ``slurmuser``; a second
"fault" sshd on 127.0.0.1:22023 puts ``<state>/faultbin`` first on PATH, whose ``sbatch`` submits and
then cuts the connection before the reply (or, while the fault switch below lists ``sbatch_slow``,
answers 8 s late without a cut); a third, "bastion" sshd on 127.0.0.1:22024 only forwards
to the login sshd (no shell, ``PermitOpen`` the login port only), for jump-host tests; a fourth,
"rotating" sshd on 127.0.0.1:22025 (same shell as the login one) has its own host key, which
``rotate-host-key`` replaces (host-key rotation tests); and a "black hole" on 127.0.0.3:22022 (the
login port on another loopback address, so it can stand first in a connection's host list) accepts
TCP connections and never sends a byte (``black-hole.py`` in the state directory, see
:data:`BLACK_HOLE_SOURCE`), as a login host whose sshd hangs or a middlebox that swallows traffic.
``/usr/local/bin/enroot`` and the SPANK plugin ``fakepyxis.so`` stand in for Enroot and Pyxis (see
those files). Jobs get CPU PyTorch from the venv
``/opt/tao-slurm/venv`` (the Pyxis stand-in runs commands on the host). Fault switch, all on the
cluster's side (the provider ships no test hook): while ``/srv/lustre/.harness/faults`` lists
``nccl_hang_unless_p2p_disable``, the TaskProlog exports ``SLURMTEST_FAULT=nccl_hang_unless_p2p_disable``
to every task, and the torch venv's ``slurmtest_faults`` start-up hook (see ``torch_faults.py``) then
keeps global rank 0 out of every ``all_reduce`` unless ``NCCL_P2P_DISABLE=1``: the other ranks hang in
it, as with a broken NCCL peer-to-peer path.

A login host cut off from the head node while its sshd stays up: a "cut" sshd on 127.0.0.1:22026 (same
shell as the login one) puts ``<state>/cutbin`` first on PATH, wrappers of the SLURM client tools
(``srun`` is not wrapped). ``cut-login-ctld`` writes ``<state>/login-cut/slurm.conf``, a copy of
slurm.conf whose ``SlurmctldPort`` is a port nothing listens on, and the wrappers use it as
``SLURM_CONF`` while it exists (squeue, sbatch, scancel, sinfo fail with "Unable to contact slurm
controller"; sacct still reaches slurmdbd); ``cut-login-head`` also points ``AccountingStoragePort``
there (sacct fails too); ``restore-login`` (and ``up``) removes it. slurmd and slurmctld keep talking,
so jobs keep running; only sessions of that sshd are affected.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import releases

HERE = Path(__file__).resolve().parent

STATE = Path("/var/lib/slurmtest")
RUN = STATE / "run"
LOG = STATE / "log"
CONF = STATE / "conf"
HASHES = RUN / "hashes"
DEV = STATE / "dev"
EVIDENCE = STATE / "evidence"
FAULTBIN = STATE / "faultbin"
SSH_DIR = STATE / "ssh"
CLIENT_DIR = STATE / "client"
MYSQL_DATA = STATE / "mysql"
MYSQL_CNF = CONF / "mariadb.cnf"
MYSQL_SOCKET = RUN / "mysql" / "mysqld.sock"
DB_PASSWORD_FILE = CONF / "db.password"
PLUGIN_STAMP = CONF / "fakepyxis.src.sha256"
HOST_KEY = SSH_DIR / "ssh_host_ed25519_key"
ROTATING_HOST_KEY = SSH_DIR / "rotating_host_ed25519_key"
BLACK_HOLE = STATE / "black-hole.py"
CLIENT_KEY = CLIENT_DIR / "id_ed25519"
KNOWN_HOSTS = CLIENT_DIR / "known_hosts"
CLUSTER_JSON = STATE / "cluster.json"
ENROOT_LOG = EVIDENCE / "enroot-imports.log"
PYXIS_LOG = EVIDENCE / "pyxis-registry-images.log"
FAULT_LOG = EVIDENCE / "fault-sbatch.log"

ETC_SLURM = Path("/etc/slurm")
SLURM_CONF = ETC_SLURM / "slurm.conf"
GRES_CONF = ETC_SLURM / "gres.conf"
SLURMDBD_CONF = ETC_SLURM / "slurmdbd.conf"
CGROUP_CONF = ETC_SLURM / "cgroup.conf"
PLUGSTACK_CONF = ETC_SLURM / "plugstack.conf.d" / "fakepyxis.conf"
PLUGIN_SO = Path("/usr/local/lib/slurm/fakepyxis.so")
ENROOT_BIN = Path("/usr/local/bin/enroot")
MUNGE_KEY = Path("/etc/munge/munge.key")
HOSTS_FILE = Path("/etc/hosts")
LOCK_FILE = Path("/run/slurmtest-harness.lock")

SHARED = Path("/srv/lustre")
CONTAINERS = SHARED / "containers"
ENROOT_KNOBS = SHARED / ".harness" / "enroot.conf"
#: A site mount every container gets (Enroot's mounts.d; the nodes are slurmds on this machine, so their steps
#: read this /etc/enroot): the shared datasets directory, shown at SITE_MOUNT_DESTINATION.
ENROOT_SITE_MOUNTS = Path("/etc/enroot/mounts.d/50-site.fstab")
SITE_DATASETS = SHARED / "datasets"
SITE_MOUNT_DESTINATION = "/datasets"
#: Written by ``min-job-age``: the ``MinJobAge`` slurm.conf sets (absent: SLURM's default, 300 s).
MIN_JOB_AGE = STATE / "min-job-age"
#: Written by ``rate-limit``: the ``SlurmctldParameters`` slurm.conf sets (absent: none, no RPC limiter).
RATE_LIMIT = STATE / "rate-limit"
#: Written by ``preempt-signal``: ``on`` or ``off`` (absent: no preemption GraceTime, no PreemptParameters).
PREEMPT_SIGNAL = STATE / "preempt-signal"
#: The preemption ``GraceTime`` of the preemptible partitions while ``preempt-signal`` is ``on`` or ``off``.
PREEMPT_GRACE_S = 10
FAULT_SWITCH = SHARED / ".harness" / "faults"
TASK_PROLOG = ETC_SLURM / "task_prolog.sh"
TEST_FAULTS = ("nccl_hang_unless_p2p_disable",)
FAULT_VAR = "SLURMTEST_FAULT"
TORCH_VENV = Path("/opt/tao-slurm/venv")
#: Copies of interpreters the cluster user could not run where they are (see :func:`python_for_cluster_user`).
TORCH_PYTHONS = Path("/opt/tao-slurm/python")
TORCH_FAULTS_MODULE = "slurmtest_faults"
TORCH_REQUIREMENT = "torch==2.13.0"

USER = "slurmuser"
PREFERRED_UID = 1001
#: A second cluster user: "other people" on a shared cluster (no SSH login; tests submit as it with runuser).
OTHER_USER = "slurmother"
OTHER_PREFERRED_UID = 1002
CLUSTER = "mini"
ACCOUNT = "gpu_proj"
GPU_PARTITION = "polar"
LONG_PARTITION = "polar_long"
#: The CPU partition: its node has no GPUs (sinfo's GRES says so), as conversion partitions on real sites.
CPU_PARTITION = "cpu_long"
#: A CPU partition that is DOWN (``State=DOWN``: jobs queue and never start), ahead of the CPU partition in
#: sinfo's order: an automatic conversion partition must pass it over.
DOWN_PARTITION = "cpu_down"
#: A GPU debug partition under an hour (sinfo prints ``30:00``), as most sites have one.
DEBUG_PARTITION = "debug"
DEBUG_MAX_TIME = "30"
#: A GPU partition with a one-minute limit (sinfo prints ``1:00``): slices of long trainings end fast here.
SHORT_PARTITION = "polar_1m"
SHORT_MAX_TIME = "1"
#: A partition with ``Hidden=YES``: plain ``sinfo`` does not list it, ``sinfo -a`` does.
HIDDEN_PARTITION = "polar_hidden"
#: A GPU partition of a higher ``PriorityTier``: its jobs preempt (requeue) jobs of the other partitions.
URGENT_PARTITION = "polar_urgent"
#: The partition of the 16-GPU node (:data:`WIDE_GPU_NODES`) alone; nothing preempts its jobs.
WIDE_PARTITION = "polar_16g"
#: ``AuthInfo=cred_expire``: a step credential's life, and how long a requeued job waits before it starts
#: again (SLURM's default 120 s); long enough for a step launch on a loaded machine.
CRED_EXPIRE_S = 60
QOS = "long_qos"
NODES = {
    "n1": ("127.0.1.1", 6831),
    "n2": ("127.0.1.2", 6832),
    "n3": ("127.0.1.3", 6833),
    "n4": ("127.0.1.4", 6834),
}
#: Each GPU node's GPU type (typed GRES) and its features (``--constraint``), as on a mixed site.
GPU_TYPES = {"n1": "a100", "n2": "h100", "n4": "h100"}
#: The 4-GPU nodes: every GPU partition but :data:`WIDE_PARTITION`.
GPU_NODES = ("n1", "n2")
GPUS_PER_NODE = 4
#: A 16-GPU node, only in :data:`WIDE_PARTITION`, as on a site with 16-GPU and 4-GPU nodes: an 8-GPU job shares
#: it with other tenants, a 16-GPU job takes it whole.
WIDE_GPU_NODES = ("n4",)
WIDE_GPUS_PER_NODE = 16
#: Nodes without GPUs (no GRES), for the CPU partition.
CPU_NODES = ("n3",)
NODE_FEATURES = {"n1": ("a100", "ib"), "n2": ("h100", "ib"), "n3": ("cpu",), "n4": ("h100", "ib", "wide")}
#: The GPUs of each GPU node (typed GRES, file-backed by the fake devices ``nvidia0`` on).
NODE_GPUS = {**dict.fromkeys(GPU_NODES, GPUS_PER_NODE), **dict.fromkeys(WIDE_GPU_NODES, WIDE_GPUS_PER_NODE)}
#: The CPUs each slurmd reports (``SlurmdParameters=config_overrides``: whatever this machine has).
NODE_CPUS = {"n1": 8, "n2": 8, "n3": 8, "n4": 16}
#: ``DefMemPerCPU``, and each node's ``RealMemory`` per CPU: a whole-node job's default memory fits its node.
MEM_PER_CPU_MB = 1024
GPU_MAJOR = 195
HOST = "127.0.0.1"
SSH_PORT = 22022
FAULT_PORT = 22023
#: A bastion: forwards to the login sshd only (no shell, no other destination), for jump-host tests.
BASTION_PORT = 22024
#: An sshd whose host key ``rotate-host-key`` replaces (not in the harness's known_hosts).
ROTATING_PORT = 22025
#: A login host that accepts TCP on the login port and never speaks (see :data:`BLACK_HOLE_SOURCE`).
BLACK_HOLE_HOST = "127.0.0.3"
#: A login sshd like a real one: OpenSSH's default connection limits (``MaxStartups 10:30:100``,
#: ``MaxSessions 10``) and PAM on (``UsePAM yes``, Debian's ``/etc/pam.d/sshd``).
LIMITS_PORT = 22027
DEFAULT_SSHD_LIMITS = ("10:30:100", "10")
#: PostgreSQL for Airflow's metadata database in the high-availability tests (two triggerers need a real
#: database server; SQLite serves one process). Loopback only, trust authentication, its own data directory.
PG_PORT = 5433
PG_DATA = STATE / "pgdata"
#: A login sshd whose sessions see a clock :data:`LOGIN_CLOCK_SKEW` ahead (libfaketime, ``faketime`` package).
SKEWED_PORT = 22028
LOGIN_CLOCK_SKEW = "+10m"
#: The semaphore and shared memory every skewed session's libfaketime uses (``FAKETIME_SHARED``). Without
#: them each process creates its own pair named after its pid and removes it at exit; a process that
#: never exits normally (killed, or exec'd by its shell) leaves its pair behind, and a later process
#: given that pid again dies ("sem_open failed and recreation attempts failed"), seen in CI.
FAKETIME_SEM = "/tao_slurmtest_faketime_sem"
FAKETIME_SHM = "/tao_slurmtest_faketime_shm"
FIRST_CLOSED_PORT = 22029
DB_PORT = 3307
CTLD_PORT = 6817
DBD_PORT = 6819

PACKAGES = (
    "munge",
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmdbd",
    "mariadb-server",
    "openssh-server",
    "openssh-client",
    "squashfs-tools",
    "libslurm-dev",
    "gcc",
    "make",
    "libc6-dev",
    "faketime",
    "postgresql",
    "patchelf",
)
READY_TIMEOUT = 30.0
STOP_GRACE = 10.0
NODE_READY = {"idle", "mixed", "allocated", "completing", "planned", "reserved"}
NODE_RESUMABLE = {"down", "drained", "draining", "fail", "failing"}
HOSTS_BEGIN = "# BEGIN slurmtest nodes (tests/cluster/harness.py)"
HOSTS_END = "# END slurmtest nodes"
#: The black-holed login host: ``black-hole.py HOST PORT PIDFILE``. It accepts every connection and never
#: writes; it reads and drops what clients send and closes a connection once its client does, so nothing
#: piles up. One line per accept and close goes to stdout (the daemon's start log).
BLACK_HOLE_SOURCE = """\
#!/usr/bin/python3
\"\"\"A black-holed SSH login host, written by tests/cluster/harness.py (do not edit).\"\"\"
import os, selectors, signal, socket, sys, time

host, port, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = socket.create_server((host, port), backlog=128)
server.setblocking(False)
with open(pidfile + ".new", "w") as out:
    out.write(f"{os.getpid()}\\n")
os.replace(pidfile + ".new", pidfile)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
selector = selectors.DefaultSelector()
selector.register(server, selectors.EVENT_READ)
print(f"black hole: listening on {host}:{port}", flush=True)
while True:
    for key, _ in selector.select():
        if key.fileobj is server:
            try:
                conn, peer = server.accept()
            except BlockingIOError:
                continue
            conn.setblocking(False)
            selector.register(conn, selectors.EVENT_READ, (peer, time.monotonic()))
            print(f"accepted {peer[0]}:{peer[1]}", flush=True)
            continue
        try:
            data = key.fileobj.recv(65536)
        except OSError:
            data = b""
        if not data:
            (peer_host, peer_port), since = key.data
            selector.unregister(key.fileobj)
            key.fileobj.close()
            print(f"closed {peer_host}:{peer_port} by the client after {time.monotonic() - since:.1f} s", flush=True)
"""


def step(message: str) -> None:
    """Print one progress line."""
    print(f"harness: {message}", flush=True)


def fail(message: str) -> NoReturn:
    """Stop the harness with ``message`` on stderr and exit status 1."""
    raise SystemExit(f"harness: ERROR: {message}")


def tail(path: Path, lines: int = 15) -> str:
    """Return the last ``lines`` lines of a log file, framed for an error message."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"\n--- {path}: unreadable ({exc.strerror})"
    return f"\n--- last {len(text)} lines of {path}:\n" + "\n".join(text)


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    stdin: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command and capture its output.

    :param argv: the command.
    :param check: fail the harness (with the command's stderr) when it exits non-zero.
    :param stdin: text fed to the command's standard input.
    :param timeout: seconds before the command is killed and the harness fails.
    :param env: the environment (default: inherited).
    :returns: the completed process.
    """
    try:
        proc = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        fail(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s")
    except FileNotFoundError:
        fail(f"`{argv[0]}` is not installed; run `python3 tests/cluster/harness.py up` as root")
    if check and proc.returncode != 0:
        output = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        fail(f"`{' '.join(argv)}` exited {proc.returncode}: {output}")
    return proc


def sha256(*parts: bytes) -> str:
    """Return the hex SHA-256 of ``parts`` (each length-prefixed, so boundaries count)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def port_open(port: int, host: str = HOST) -> bool:
    """Return True when something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def wait_until(what: str, probe: Callable[[], bool], logs: Sequence[Path], timeout: float = READY_TIMEOUT) -> None:
    """Poll ``probe`` every 0.1 s until it returns True; fail with the logs' tails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            fail(f"{what} not ready after {timeout:.0f} s" + "".join(tail(log) for log in logs))
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------------
# files, users, directories


def chown(path: Path, owner: str) -> None:
    """Give ``path`` to ``owner`` and the owner's primary group."""
    entry = pwd.getpwnam(owner)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def write_file(path: Path, content: str, *, mode: int = 0o644, owner: str = "root") -> bool:
    """Write ``content`` atomically unless the file already holds it; always fix owner and mode.

    :returns: True when the content changed.
    """
    try:
        changed = path.read_text() != content
    except (FileNotFoundError, UnicodeDecodeError):
        changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(content)
        os.replace(tmp, path)
    chown(path, owner)
    path.chmod(mode)
    return changed


def ensure_dir(path: Path, owner: str, mode: int) -> None:
    """Create ``path`` (and parents) and set its owner and mode."""
    path.mkdir(parents=True, exist_ok=True)
    chown(path, owner)
    path.chmod(mode)


def ensure_packages() -> None:
    """Install the Debian packages the cluster needs when any is missing (apt-get update once)."""
    if shutil.which("dpkg-query") is None:
        fail("this harness needs Debian 12 (dpkg-query not found)")
    proc = run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *PACKAGES], check=False)
    installed = {line.split()[0] for line in proc.stdout.splitlines() if line.endswith(" installed")}
    missing = [name for name in PACKAGES if name not in installed]
    if not missing:
        step(f"packages: all {len(PACKAGES)} installed")
        return
    step(f"packages: installing {' '.join(missing)}")
    policy = Path("/usr/sbin/policy-rc.d")
    deny_service_start = not policy.exists()
    if deny_service_start:
        write_file(policy, "#!/bin/sh\nexit 101\n", mode=0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update"], timeout=900, env=env)
        run(["apt-get", "install", "-y", "--no-install-recommends", *missing], timeout=1800, env=env)
    finally:
        if deny_service_start:
            policy.unlink()


def ensure_user(name: str = USER, preferred_uid: int = PREFERRED_UID) -> pwd.struct_passwd:
    """Create a cluster user (``preferred_uid`` when free) and make sure key logins are not locked out."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        uid_free = all(other.pw_uid != preferred_uid for other in pwd.getpwall())
        uid_args = ["-u", str(preferred_uid)] if uid_free else []
        run(["useradd", "-m", "-s", "/bin/bash", *uid_args, name])
        entry = pwd.getpwnam(name)
        step(f"user: created {name} (uid {entry.pw_uid})")
    shadow = {line.split(":")[0]: line.split(":")[1] for line in Path("/etc/shadow").read_text().splitlines()}
    if shadow.get(name) != "*":
        run(["usermod", "-p", "*", name])
        step(f"user: {name} unlocked for key login (password field '*')")
    return entry


def ensure_layout() -> None:
    """Create the state, runtime and shared directories with their owners and modes."""
    dirs: list[tuple[Path, str, int]] = [
        (STATE, "root", 0o755),
        (RUN, "root", 0o755),
        (LOG, "root", 0o755),
        (CONF, "root", 0o700),
        (HASHES, "root", 0o700),
        (RUN / "munge", "munge", 0o755),
        (LOG / "munge", "munge", 0o700),
        (RUN / "mysql", "mysql", 0o755),
        (LOG / "mysql", "mysql", 0o750),
        (MYSQL_DATA, "mysql", 0o750),
        (RUN / "slurm", "slurm", 0o755),
        (LOG / "slurm", "slurm", 0o755),
        (STATE / "spool", "root", 0o755),
        (STATE / "spool" / "ctld", "slurm", 0o700),
        *[(STATE / "spool" / node, "root", 0o755) for node in NODES],
        (DEV, "root", 0o755),
        (SSH_DIR, "root", 0o700),
        (CLIENT_DIR, "root", 0o755),
        (EVIDENCE, "root", 0o755),
        (FAULTBIN, "root", 0o755),
        (Path("/run/munge"), "munge", 0o755),
        (Path("/run/sshd"), "root", 0o755),
        (PLUGIN_SO.parent, "root", 0o755),
        (PLUGSTACK_CONF.parent, "root", 0o755),
        (SHARED, "root", 0o1777),
        (CONTAINERS, "root", 0o1777),
        (SHARED / USER, USER, 0o755),
        (SHARED / OTHER_USER, OTHER_USER, 0o755),
        (ENROOT_KNOBS.parent, "root", 0o755),
        (SITE_DATASETS, "root", 0o755),
        (ENROOT_SITE_MOUNTS.parent, "root", 0o755),
    ]
    for path, owner, mode in dirs:
        ensure_dir(path, owner, mode)
    for log in (ENROOT_LOG, PYXIS_LOG, FAULT_LOG):
        log.touch(exist_ok=True)
        chown(log, USER)
        log.chmod(0o644)
    step(f"layout: {len(dirs)} directories and 3 evidence logs under {STATE}, {SHARED}")


def ensure_hosts() -> None:
    """Keep a marked block with the node addresses in /etc/hosts (rewritten in place: same inode)."""
    text = HOSTS_FILE.read_text()
    kept: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == HOSTS_BEGIN:
            inside = True
        elif inside:
            inside = line.rstrip("\n") != HOSTS_END
        else:
            kept.append(line)
    head = "".join(kept)
    if head and not head.endswith("\n"):
        head += "\n"
    block = "\n".join([HOSTS_BEGIN, *(f"{addr} {node}" for node, (addr, _) in NODES.items()), HOSTS_END])
    wanted = f"{head}{block}\n"
    if wanted == text:
        step("hosts: node block present in /etc/hosts")
        return
    with HOSTS_FILE.open("r+") as handle:
        handle.write(wanted)
        handle.truncate()
    step("hosts: node block written to /etc/hosts")


def local_torch_wheels() -> list[Path]:
    """The CPU wheels of :data:`TORCH_REQUIREMENT` in the machine's pip ``find-links`` folders.

    The folders come from ``PIP_FIND_LINKS`` and the ``find-links`` of pip's site and global config
    files, as pip itself reads them.
    """
    import configparser

    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    for config_file in (Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf"), Path.home() / ".config/pip/pip.conf"):
        parser = configparser.ConfigParser()
        try:
            parser.read(config_file)
        except configparser.Error:
            continue
        folders += parser.get("global", "find-links", fallback="").split()
    version = TORCH_REQUIREMENT.split("==")[1]
    found = {
        wheel for folder in folders for wheel in Path(folder.removeprefix("file://")).glob(f"torch-{version}+cpu-*.whl")
    }
    return sorted(found)


def python_for(tag: str) -> str | None:
    """A CPython interpreter on this machine for a wheel's Python tag (``cp311`` → a ``python3.11``).

    Debian's own (``/usr/bin``) first, then ``/usr/local`` and pyenv's versions (a Debian 13 machine's
    system Python is 3.13, while the CPU wheel on disk may be for 3.11).
    """
    version = f"{tag[2]}.{tag[3:]}"
    candidates = [Path(f"/usr/bin/python{version}"), Path(f"/usr/local/bin/python{version}")]
    candidates += sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"), reverse=True)
    found = next((path for path in candidates if os.access(path, os.X_OK)), None)
    return str(found) if found else None


def python_for_cluster_user(python: str) -> str:
    """``python``, or a copy of its installation the cluster user can run (jobs run as that user).

    An interpreter under a folder the user cannot enter (pyenv's under ``/root``) is copied, standard
    library and shared library without ``site-packages`` and tests, to :data:`TORCH_PYTHONS` once.
    """
    user = pwd.getpwnam(USER)
    if run(["runuser", "-u", user.pw_name, "--", python, "-c", "pass"], check=False).returncode == 0:
        return python
    prefix = Path(run([python, "-c", "import sys; print(sys.base_prefix)"]).stdout.strip())
    name = Path(python).name
    target = TORCH_PYTHONS / f"{name}-{sha256(str(prefix).encode())[:8]}"
    if not (target / "bin" / name).exists():
        shutil.rmtree(target, ignore_errors=True)
        TORCH_PYTHONS.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "bin").mkdir(parents=True)
        shutil.copy2(prefix / "bin" / name, partial / "bin" / name)
        stdlib = f"lib/{name}"
        shutil.copytree(
            prefix / stdlib,
            partial / stdlib,
            symlinks=True,
            ignore=shutil.ignore_patterns("site-packages", "test", "__pycache__"),
        )
        (partial / stdlib / "site-packages").mkdir()
        for library in (prefix / "lib").glob("libpython*.so*"):
            shutil.copy2(library, partial / "lib" / library.name, follow_symlinks=False)
        # The interpreter finds libpython through its RUNPATH, an absolute path into the original prefix.
        run(["patchelf", "--set-rpath", "$ORIGIN/../lib", str(partial / "bin" / name)])
        run(["chmod", "-R", "a+rX", str(partial)])
        partial.rename(target)
        step(f"torch: copied {prefix} ({name}) to {target} for {USER}")
    return str(target / "bin" / name)


def ensure_torch_venv() -> None:
    """Install CPU PyTorch for jobs in a venv everyone can read, from the machine's CPU wheel.

    The venv is made with a Python the wheel fits (:func:`python_for`), and torch is installed from the
    wheel file itself: pip never goes to the index for torch (where only CUDA builds of several GB are).
    Skipped when the venv holds a completed install of :data:`TORCH_REQUIREMENT` (stamp file).
    """
    stamp = TORCH_VENV / ".harness-installed"
    if stamp.is_file() and stamp.read_text() == TORCH_REQUIREMENT and (TORCH_VENV / "bin" / "torchrun").exists():
        step(f"torch: {TORCH_REQUIREMENT} present in {TORCH_VENV}")
        return
    started = time.monotonic()
    wheels = local_torch_wheels()
    fitting = [(wheel, python) for wheel in wheels if (python := python_for(wheel.name.split("-")[2]))]
    if not fitting:
        fail(
            f"no CPU wheel of {TORCH_REQUIREMENT} on this machine fits a Python here (wheels: "
            f"{', '.join(w.name for w in wheels) or 'none in pip find-links'}); the job venv is never made from "
            "the index, which serves only CUDA builds: put the CPU wheel in a find-links folder or install its Python"
        )
    wheel, python = fitting[0]
    run([python_for_cluster_user(python), "-m", "venv", "--clear", str(TORCH_VENV)], timeout=300)
    run([str(TORCH_VENV / "bin" / "pip"), "install", "-q", str(wheel)], timeout=1800)
    run(["chmod", "-R", "a+rX", str(TORCH_VENV.parent)])
    write_file(stamp, TORCH_REQUIREMENT)
    step(f"torch: installed {wheel.name} with {python} in {TORCH_VENV} ({time.monotonic() - started:.1f} s)")


def ensure_torch_faults() -> None:
    """Install the fault hook into the torch venv: a ``.pth`` line imports ``torch_faults.py`` at start-up.

    The hook does nothing unless the TaskProlog exported :data:`FAULT_VAR` (see the module docstring).
    """
    (site_packages,) = (TORCH_VENV / "lib").glob("python3*/site-packages")
    changed = write_file(site_packages / f"{TORCH_FAULTS_MODULE}.py", (HERE / "torch_faults.py").read_text())
    changed |= write_file(site_packages / f"{TORCH_FAULTS_MODULE}.pth", f"import {TORCH_FAULTS_MODULE}\n")
    step(f"torch: fault hook {'installed' if changed else 'present'} in {site_packages}")


def ensure_gpu_devices() -> None:
    """Create the fake GPU char devices (major 195, like NVIDIA's) used as GRES files, as many as a node has at most."""
    count = max(NODE_GPUS.values())
    for index in range(count):
        path = DEV / f"nvidia{index}"
        wanted = os.makedev(GPU_MAJOR, index)
        try:
            info = path.lstat()
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == wanted:
                continue
            path.unlink()
        except FileNotFoundError:
            pass
        os.mknod(path, 0o666 | stat.S_IFCHR, wanted)
        path.chmod(0o666)
    step(f"gpus: {count} fake devices {DEV}/nvidia[0-{count - 1}]")


def ensure_munge_key() -> None:
    """Make sure the munge key exists (Debian's postinst normally creates it)."""
    if not MUNGE_KEY.exists():
        run(["mungekey", "--create", f"--keyfile={MUNGE_KEY}"])
        step(f"munge: created {MUNGE_KEY}")
    chown(MUNGE_KEY, "munge")
    MUNGE_KEY.chmod(0o600)


def db_password() -> str:
    """Return the slurmdbd database password, created once and kept in the state dir (0600)."""
    if not DB_PASSWORD_FILE.exists():
        write_file(DB_PASSWORD_FILE, secrets.token_hex(16), mode=0o600)
    return DB_PASSWORD_FILE.read_text().strip()


# --------------------------------------------------------------------------------------------------
# configuration


def short_hostname() -> str:
    """Return this machine's short hostname (what slurmctld compares SlurmctldHost with)."""
    return socket.gethostname().split(".")[0]


def major_minor(version: str, command: str, printed: str) -> tuple[int, int]:
    """``(24, 11)`` for ``24.11.5`` (or ``24.11``); fails naming ``command`` and what it ``printed`` otherwise."""
    major, _, rest = version.partition(".")
    minor = rest.split(".")[0]
    if not (major.isdigit() and minor.isdigit()):
        fail(f"`{command}` printed {printed!r}, not a release")
    return int(major), int(minor)


@functools.cache
def slurm_release() -> tuple[int, int]:
    """The installed SLURM's release, ``(24, 11)`` for ``slurm-wlm 24.11.5`` (``slurmctld -V``)."""
    printed = run(["/usr/sbin/slurmctld", "-V"]).stdout.strip()
    return major_minor(printed.split()[-1] if printed else "", "slurmctld -V", printed)


def cgroup_conf() -> str:
    """Return cgroup.conf: slurmd 24.05 and later always start their cgroup plugin; there is none to use here.

    Older releases do not know ``CgroupPlugin=disabled`` and get an empty file (no cgroup plugin is
    configured: ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``).
    """
    lines = ["CgroupPlugin=disabled"] if slurm_release() >= (24, 5) else []
    return "# Written by tests/cluster/harness.py; edits are overwritten by `up`.\n" + "".join(
        f"{line}\n" for line in lines
    )


def preempt_signal() -> str | None:
    """``on`` or ``off`` as ``preempt-signal`` set it, None when it is SLURM's default (no grace, no parameters)."""
    return PREEMPT_SIGNAL.read_text().strip() if PREEMPT_SIGNAL.exists() else None


def slurm_conf() -> str:
    """Return slurm.conf for the cluster of :data:`NODES`."""
    host = short_hostname()
    try:
        loopback_name = socket.gethostbyname(host).startswith("127.")
    except OSError:
        loopback_name = False
    # The partitions polar_urgent preempts: a grace time while preempt-signal is set (SLURM's default is none).
    grace = f" GraceTime={PREEMPT_GRACE_S}" if preempt_signal() else ""
    # send_user_signal: PreemptParameters from 23.02; before it SlurmctldParameters=preempt_send_user_signal.
    preempt_parameters = slurm_release() >= (23, 2)
    ctld = [RATE_LIMIT.read_text().strip()] if RATE_LIMIT.exists() else []
    if preempt_signal() == "on" and not preempt_parameters:
        ctld.append("preempt_send_user_signal")
    lines = [
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={host}({HOST})",
        f"SlurmctldPort={CTLD_PORT}",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        f"AuthInfo=cred_expire={CRED_EXPIRE_S}",
        "CredType=cred/munge",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        # Multifactor became the default in 23.11. (25.11's requeue_delay, a requeued job's wait, follows
        # cred_expire: a minute here, as on the releases before.)
        "PriorityType=priority/basic",
        *(["CommunicationParameters=NoCtldInAddrAny"] if loopback_name else []),
        f"StateSaveLocation={STATE}/spool/ctld",
        f"SlurmdSpoolDir={STATE}/spool/%n",
        f"SlurmctldPidFile={RUN}/slurm/slurmctld.pid",
        f"SlurmdPidFile={RUN}/slurm/slurmd-%n.pid",
        f"SlurmctldLogFile={LOG}/slurm/slurmctld.log",
        f"SlurmdLogFile={LOG}/slurm/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={MEM_PER_CPU_MB}",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        "KillWait=5",
        "EnforcePartLimits=ALL",
        "JobRequeue=1",
        *([f"MinJobAge={MIN_JOB_AGE.read_text().strip()}"] if MIN_JOB_AGE.exists() else []),
        *([f"SlurmctldParameters={','.join(ctld)}"] if ctld else []),
        *(["PreemptParameters=send_user_signal"] if preempt_signal() == "on" and preempt_parameters else []),
        "MailProg=/bin/true",
        f"TaskProlog={TASK_PROLOG}",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={DBD_PORT}",
        "AccountingStorageTRES=gres/gpu",
        "AccountingStorageEnforce=associations",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
        "GresTypes=gpu",
        *(
            f"NodeName={node} NodeHostname={node} NodeAddr={addr} Port={port} CPUs={NODE_CPUS[node]} "
            f"RealMemory={NODE_CPUS[node] * MEM_PER_CPU_MB} "
            + (f"Gres=gpu:{GPU_TYPES[node]}:{NODE_GPUS[node]} " if node in NODE_GPUS else "")
            + f"Features={','.join(NODE_FEATURES[node])} State=UNKNOWN"
            for node, (addr, port) in NODES.items()
        ),
        f"PartitionName={GPU_PARTITION} Nodes={','.join(GPU_NODES)} Default=YES MaxTime=04:00:00 "
        f"DefaultTime=01:00:00{grace} State=UP",
        f"PartitionName={LONG_PARTITION} Nodes={','.join(GPU_NODES)} MaxTime=2-00:00:00 DefaultTime=01:00:00"
        f"{grace} State=UP",
        f"PartitionName={DOWN_PARTITION} Nodes={','.join(CPU_NODES)} MaxTime=7-00:00:00 State=DOWN",
        f"PartitionName={CPU_PARTITION} Nodes={','.join(CPU_NODES)} MaxTime=7-00:00:00 DefaultTime=01:00:00 State=UP",
        f"PartitionName={DEBUG_PARTITION} Nodes={','.join(GPU_NODES)} MaxTime={DEBUG_MAX_TIME}{grace} State=UP",
        f"PartitionName={SHORT_PARTITION} Nodes={','.join(GPU_NODES)} MaxTime={SHORT_MAX_TIME}{grace} State=UP",
        f"PartitionName={HIDDEN_PARTITION} Nodes={','.join(GPU_NODES)} MaxTime=1-00:00:00 Hidden=YES{grace} State=UP",
        f"PartitionName={URGENT_PARTITION} Nodes={','.join(GPU_NODES)} MaxTime=01:00:00 PriorityTier=10 State=UP",
        f"PartitionName={WIDE_PARTITION} Nodes={','.join(WIDE_GPU_NODES)} MaxTime=04:00:00 State=UP",
    ]
    return "# Written by tests/cluster/harness.py; edits are overwritten by `up`.\n" + "\n".join(lines) + "\n"


def gres_conf() -> str:
    """Return gres.conf: each GPU node's file-backed GPUs of its type (22.05 drops file-less GPUs)."""
    return "AutoDetect=off\n" + "".join(
        f"NodeName={node} Name=gpu Type={GPU_TYPES[node]} File={DEV}/nvidia[0-{gpus - 1}]\n"
        for node, gpus in NODE_GPUS.items()
    )


def slurmdbd_conf() -> str:
    """Return slurmdbd.conf (holds the database password: written 0600 slurm:slurm)."""
    return (
        "\n".join(
            [
                "AuthType=auth/munge",
                "DbdHost=localhost",
                f"DbdAddr={HOST}",
                f"DbdPort={DBD_PORT}",
                "SlurmUser=slurm",
                f"LogFile={LOG}/slurm/slurmdbd.log",
                f"PidFile={RUN}/slurm/slurmdbd.pid",
                "StorageType=accounting_storage/mysql",
                f"StorageHost={HOST}",
                f"StoragePort={DB_PORT}",
                "StorageUser=slurm",
                f"StoragePass={db_password()}",
                "StorageLoc=slurm_acct_db",
            ]
        )
        + "\n"
    )


def mariadb_cnf() -> str:
    """Return the option file of the private MariaDB instance (TCP on loopback only)."""
    return (
        "\n".join(
            [
                "[mysqld]",
                "user=mysql",
                f"datadir={MYSQL_DATA}",
                f"socket={MYSQL_SOCKET}",
                f"pid-file={RUN}/mysql/mariadbd.pid",
                f"log-error={LOG}/mysql/error.log",
                f"bind-address={HOST}",
                f"port={DB_PORT}",
                "skip-name-resolve",
                "innodb_buffer_pool_size=128M",
                "innodb_log_file_size=64M",
                "innodb_lock_wait_timeout=900",
                "performance_schema=OFF",
                # MariaDB 11.8 (Debian 13) defaults it ON: slurmdbd's transactions can abort with ER_CHECKREAD.
                # ``loose-``: releases without the option ignore it.
                "loose-innodb_snapshot_isolation=OFF",
            ]
        )
        + "\n"
    )


@functools.cache
def openssh_release() -> tuple[int, int]:
    """The installed OpenSSH's release, ``(10, 0)`` for ``OpenSSH_10.0p2`` (``ssh -V``)."""
    printed = run(["ssh", "-V"]).stderr.strip()
    return major_minor(printed.removeprefix("OpenSSH_").split("p")[0].split(",")[0], "ssh -V", printed)


def openssh_release_settings() -> list[str]:
    """sshd_config lines for newer OpenSSH releases.

    ``PerSourcePenalties no`` (9.8 and later): every client of the test cluster, the provider's and the
    fault tests' refused logins alike, comes from 127.0.0.1; with the penalties on, a test's refused
    login shuts every later one out for a while.
    """
    return ["PerSourcePenalties no"] if openssh_release() >= (9, 8) else []


def sshd_config(
    port: int,
    pidfile: Path,
    extra: Sequence[str] = (),
    host_key: Path = HOST_KEY,
    limits: tuple[str, str] = ("100:30:200", "100"),
    use_pam: bool = False,
) -> str:
    """Return the config of a key-only loopback sshd for the cluster user.

    ``limits`` are ``MaxStartups`` and ``MaxSessions`` (sshd takes a keyword's first value, so they
    cannot be overridden through ``extra``); the default is raised for the benchmarks. ``use_pam`` runs
    Debian's sshd PAM stack (``/etc/pam.d/sshd``: account and session modules, as on a real login node;
    key authentication does not ask PAM for a password).
    """
    return (
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {HOST}",
                f"HostKey {host_key}",
                f"PidFile {pidfile}",
                f"AllowUsers {USER}",
                "PermitRootLogin no",
                "PubkeyAuthentication yes",
                "AuthorizedKeysFile .ssh/authorized_keys",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                f"UsePAM {'yes' if use_pam else 'no'}",
                "X11Forwarding no",
                "PrintMotd no",
                f"MaxStartups {limits[0]}",
                f"MaxSessions {limits[1]}",
                "AcceptEnv LANG LC_*",
                *openssh_release_settings(),
                "Subsystem sftp /usr/lib/openssh/sftp-server",
                *extra,
            ]
        )
        + "\n"
    )


def task_prolog() -> str:
    """Return the TaskProlog: the fault switch (prints nothing unless the switch file lists a fault)."""
    return (
        "#!/bin/sh\n"
        "# Written by tests/cluster/harness.py. SLURM runs this before every task, as the job's user, and\n"
        '# adds each "export NAME=value" line it prints to the task environment. Fault switch: the first\n'
        f"# known fault word listed in {FAULT_SWITCH} is exported as {FAULT_VAR} (read by the torch venv's\n"
        f"# {TORCH_FAULTS_MODULE} start-up hook).\n"
        f"[ -r {FAULT_SWITCH} ] || exit 0\n"
        'while read -r word _ || [ -n "$word" ]; do\n'
        '    case "$word" in\n'
        f'    {"|".join(TEST_FAULTS)}) echo "export {FAULT_VAR}=$word"; exit 0 ;;\n'
        "    esac\n"
        f"done < {FAULT_SWITCH}\n"
        "exit 0\n"
    )


def libfaketime() -> str:
    """The libfaketime library the skewed login sshd preloads (installed with the ``faketime`` package)."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        fail("libfaketime.so.1 not found under /usr/lib/*/faketime: install the faketime package")
    return str(found[0])


def ensure_faketime_shared(user: pwd.struct_passwd) -> None:
    """Create the skewed sessions' libfaketime semaphore and shared memory afresh, owned by the cluster user.

    The shared memory is libfaketime 0.9.10's ``struct ft_shared_s`` as its own ``ft_shm_create`` leaves
    it: no ticks, no file index, start times unset (``tv_nsec = -1``). Stale per-pid pairs that earlier
    sessions left in ``/dev/shm`` are removed.
    """
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.sem_open.restype = ctypes.c_void_p
    libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
    shm = Path("/dev/shm")
    stale = [p for p in shm.glob("*faketime_s[eh]m_*") if p.stat().st_uid == user.pw_uid]
    for path in (*stale, shm / f"sem.{FAKETIME_SEM[1:]}", shm / FAKETIME_SHM[1:]):
        path.unlink(missing_ok=True)
    sem = libc.sem_open(FAKETIME_SEM.encode(), os.O_CREAT | os.O_EXCL, 0o600, 1)
    if not sem:
        fail(f"sem_open {FAKETIME_SEM}: {os.strerror(ctypes.get_errno())}")
    libc.sem_close(ctypes.c_void_p(sem))
    unset = -1
    layout = struct.pack("<QQ8q", 0, 0, 0, unset, 0, unset, 0, unset, 0, 0)
    (shm / FAKETIME_SHM[1:]).write_bytes(layout)
    for path in (shm / f"sem.{FAKETIME_SEM[1:]}", shm / FAKETIME_SHM[1:]):
        os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(path, 0o600)
    step(f"faketime: shared semaphore and memory for the skewed sessions (removed {len(stale)} stale)")


def write_configs() -> list[str]:
    """Write every configuration file; report and return the ones that changed."""
    files: list[tuple[Path, str, int, str]] = [
        (SLURM_CONF, slurm_conf(), 0o644, "root"),
        (GRES_CONF, gres_conf(), 0o644, "root"),
        (CGROUP_CONF, cgroup_conf(), 0o644, "root"),
        (SLURMDBD_CONF, slurmdbd_conf(), 0o600, "slurm"),
        (MYSQL_CNF, mariadb_cnf(), 0o644, "root"),
        (SSH_DIR / "sshd_config", sshd_config(SSH_PORT, RUN / "sshd.pid"), 0o600, "root"),
        (
            SSH_DIR / "sshd_fault_config",
            sshd_config(FAULT_PORT, RUN / "sshd-fault.pid", [f"SetEnv PATH={FAULTBIN}:/usr/local/bin:/usr/bin:/bin"]),
            0o600,
            "root",
        ),
        (
            SSH_DIR / "sshd_bastion_config",
            sshd_config(
                BASTION_PORT,
                RUN / "sshd-bastion.pid",
                [
                    "AllowTcpForwarding local",
                    f"PermitOpen {HOST}:{SSH_PORT}",
                    "ForceCommand /bin/false",
                    "LogLevel VERBOSE",
                ],
            ),
            0o600,
            "root",
        ),
        (
            SSH_DIR / "sshd_rotating_config",
            sshd_config(ROTATING_PORT, RUN / "sshd-rotating.pid", host_key=ROTATING_HOST_KEY),
            0o600,
            "root",
        ),
        (
            SSH_DIR / "sshd_limits_config",
            sshd_config(LIMITS_PORT, RUN / "sshd-limits.pid", limits=DEFAULT_SSHD_LIMITS, use_pam=True),
            0o600,
            "root",
        ),
        (
            SSH_DIR / "sshd_skewed_config",
            sshd_config(
                SKEWED_PORT,
                RUN / "sshd-skewed.pid",
                [
                    # NO_FAKE_STAT: the files' times stay the storage's (Debian 13's libfaketime shifts
                    # what stat() returns too, unless told not to).
                    f"SetEnv LD_PRELOAD={libfaketime()} FAKETIME={LOGIN_CLOCK_SKEW} FAKETIME_DONT_FAKE_MONOTONIC=1 "
                    f'FAKETIME_NO_CACHE=1 NO_FAKE_STAT=1 "FAKETIME_SHARED={FAKETIME_SEM} {FAKETIME_SHM}"'
                ],
            ),
            0o600,
            "root",
        ),
        (BLACK_HOLE, BLACK_HOLE_SOURCE, 0o755, "root"),
        (ENROOT_BIN, (HERE / "enroot").read_text().replace("@STATE_DIR@", str(STATE)), 0o755, "root"),
        (
            FAULTBIN / "sbatch",
            (HERE / "faultbin" / "sbatch")
            .read_text()
            .replace("@STATE_DIR@", str(STATE))
            .replace("@FAULT_SWITCH@", str(FAULT_SWITCH)),
            0o755,
            "root",
        ),
        (TASK_PROLOG, task_prolog(), 0o755, "root"),
        (
            ENROOT_SITE_MOUNTS,
            f"# the site's datasets in every container (tests/cluster/harness.py)\n"
            f"{SITE_DATASETS} {SITE_MOUNT_DESTINATION} none x-create=dir,bind,ro,nosuid,nodev,private\n",
            0o644,
            "root",
        ),
    ]
    changed = [str(path) for path, content, mode, owner in files if write_file(path, content, mode=mode, owner=owner)]
    if not ENROOT_KNOBS.exists():
        write_file(ENROOT_KNOBS, "DELAY=2\nPAD_KIB=0\n")
        changed.append(str(ENROOT_KNOBS))
    step("config: " + (f"wrote {', '.join(changed)}" if changed else f"{len(files) + 1} files unchanged"))
    return changed


def build_plugin() -> None:
    """Compile fakepyxis.c when its source changed, then register it in plugstack.conf.d."""
    source = HERE / "fakepyxis.c"
    digest = sha256(source.read_bytes())
    stamp = PLUGIN_STAMP.read_text() if PLUGIN_STAMP.exists() else ""
    if PLUGIN_SO.exists() and stamp == digest:
        step(f"pyxis stand-in: {PLUGIN_SO} up to date")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / "fakepyxis.so"
            run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(built), str(source)])
            staged = PLUGIN_SO.with_name(".fakepyxis.so.new")
            shutil.copyfile(built, staged)
            staged.chmod(0o755)
            os.replace(staged, PLUGIN_SO)
        write_file(PLUGIN_STAMP, digest, mode=0o600)
        step(f"pyxis stand-in: compiled {PLUGIN_SO}")
    write_file(
        PLUGSTACK_CONF,
        "# Pyxis stand-in (tests/cluster/fakepyxis.c), written by tests/cluster/harness.py. `required`, as\n"
        "# sites run Pyxis: a failing check must fail the step; Slurm ignores an `optional` plugin's errors.\n"
        f"required {PLUGIN_SO} registry_log={PYXIS_LOG}\n",
    )


def public_key(private_key: Path) -> str:
    """Return ``"ssh-ed25519 AAAA..."`` (no comment) for a private key file."""
    return " ".join(run(["ssh-keygen", "-y", "-f", str(private_key)]).stdout.split()[:2])


def ensure_ssh_keys(user: pwd.struct_passwd) -> None:
    """Create the stable host key, the rotating sshd's first host key and the client key once; write
    known_hosts (the stable key only) and authorized_keys."""
    created = []
    for key, comment in (
        (HOST_KEY, "slurmtest-host"),
        (ROTATING_HOST_KEY, "slurmtest-rotating-host"),
        (CLIENT_KEY, "slurmtest-client"),
    ):
        if not key.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
            created.append(str(key))
        key.chmod(0o600)
    host_key = public_key(HOST_KEY)
    write_file(
        KNOWN_HOSTS,
        "".join(
            f"[{HOST}]:{port} {host_key}\n"
            for port in (SSH_PORT, FAULT_PORT, BASTION_PORT, CUT_PORT, LIMITS_PORT, SKEWED_PORT)
        ),
    )
    ssh_dir = Path(user.pw_dir) / ".ssh"
    ensure_dir(ssh_dir, USER, 0o700)
    write_file(ssh_dir / "authorized_keys", public_key(CLIENT_KEY) + " slurmtest-client\n", mode=0o600, owner=USER)
    step("ssh keys: " + (f"created {', '.join(created)}" if created else "host and client keys kept"))


# --------------------------------------------------------------------------------------------------
# daemons


@dataclass(frozen=True)
class Daemon:
    """A daemon the harness starts and stops by hand.

    :param key: short name used in messages and for the config-hash file.
    :param comm: the process name expected in /proc/PID/comm.
    :param pidfile: where the daemon writes its pid.
    :param argv: how to start it.
    :param configs: files whose content decides a restart.
    :param logs: logs whose tail explains a failure.
    :param ready: probe telling that the daemon serves requests.
    :param ports: TCP ports on 127.0.0.1 it listens on (must be free before it starts).
    :param marker: text that must appear (as whole words) in /proc/PID/cmdline.
    :param foreground: True when the program does not daemonize itself.
    :param prepare: run before each start (config test, one-time initialisation).
    """

    key: str
    comm: str
    pidfile: Path
    argv: tuple[str, ...]
    configs: tuple[Path, ...]
    logs: tuple[Path, ...]
    ready: Callable[[], bool]
    ports: tuple[int, ...] = ()
    marker: str = ""
    foreground: bool = False
    prepare: Callable[[], None] | None = None


def postgres_bin(tool: str) -> str:
    """A PostgreSQL server program (``initdb``, ``pg_ctl``) of the installed major version.

    Before the postgresql package is installed (``up`` installs it), the bare name: the daemon table is
    built first, and running the program then fails as "not installed".
    """
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"))
    return str(found[-1]) if found else tool


def prepare_postgres() -> None:
    """Create the PostgreSQL data directory once (trust authentication on loopback, owned by postgres)."""
    for directory in (RUN / "postgres", LOG / "postgres"):
        directory.mkdir(parents=True, exist_ok=True)
        chown(directory, "postgres")
    if (PG_DATA / "PG_VERSION").exists():
        return
    PG_DATA.mkdir(parents=True, exist_ok=True)
    chown(PG_DATA, "postgres")
    PG_DATA.chmod(0o700)
    run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            postgres_bin("initdb"),
            "-D",
            str(PG_DATA),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
        timeout=120,
    )
    step(f"postgres: data directory {PG_DATA} created")


def postgres_daemon() -> Daemon:
    """PostgreSQL on 127.0.0.1:PG_PORT (``pg_ctl`` daemonizes it; its pid is the first line of postmaster.pid)."""
    options = f"-p {PG_PORT} -c listen_addresses={HOST} -k {RUN / 'postgres'} -c max_connections=200"
    return Daemon(
        key="postgres",
        comm="postgres",
        pidfile=PG_DATA / "postmaster.pid",
        argv=(
            "runuser",
            "-u",
            "postgres",
            "--",
            postgres_bin("pg_ctl"),
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(PG_DATA),
            "-l",
            str(LOG / "postgres" / "postgres.log"),
            "-o",
            options,
        ),
        configs=(),
        logs=(LOG / "postgres" / "postgres.log",),
        ready=lambda: port_open(PG_PORT),
        ports=(PG_PORT,),
        marker=str(PG_DATA),
        prepare=prepare_postgres,
    )


def munge_works() -> bool:
    """Return True when a munge credential round-trips through munged."""
    cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
    if cred.returncode != 0:
        return False
    return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10, check=False).returncode == 0


def mariadb_argv(*args: str) -> list[str]:
    """Return the MariaDB client command for root over the private instance's socket."""
    return ["mariadb", "--no-defaults", f"--socket={MYSQL_SOCKET}", "-uroot", *args]


def mariadb_works() -> bool:
    """Return True when MariaDB answers a query."""
    return run(mariadb_argv("-e", "select 1"), check=False, timeout=10).returncode == 0


def slurmctld_works() -> bool:
    """Return True when ``scontrol ping`` reports the controller UP."""
    return "is UP" in run(["scontrol", "ping"], check=False, timeout=20).stdout


def init_mariadb() -> None:
    """Initialise the MariaDB data directory on first start."""
    if (MYSQL_DATA / "mysql").is_dir():
        return
    started = time.monotonic()
    run(
        [
            "mariadb-install-db",
            f"--defaults-file={MYSQL_CNF}",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ],
        timeout=300,
    )
    step(f"mariadb: initialised {MYSQL_DATA} ({time.monotonic() - started:.1f} s)")


def check_sshd_config(config: Path) -> Callable[[], None]:
    """Return a prepare hook that validates an sshd config with ``sshd -t``."""

    def prepare() -> None:
        run(["/usr/sbin/sshd", "-t", "-f", str(config)])

    return prepare


def daemons() -> dict[str, Daemon]:
    """Return every daemon in start order, keyed by :attr:`Daemon.key`."""
    listed: list[Daemon] = [
        Daemon(
            key="munged",
            comm="munged",
            pidfile=RUN / "munge" / "munged.pid",
            argv=(
                "runuser",
                "-u",
                "munge",
                "--",
                "/usr/sbin/munged",
                "--force",
                f"--pid-file={RUN}/munge/munged.pid",
                f"--log-file={LOG}/munge/munged.log",
            ),
            configs=(MUNGE_KEY,),
            logs=(LOG / "munge" / "munged.log",),
            ready=munge_works,
            marker=f"--pid-file={RUN}/munge/munged.pid",
        ),
        Daemon(
            key="mariadb",
            comm="mariadbd",
            pidfile=RUN / "mysql" / "mariadbd.pid",
            argv=("/usr/sbin/mariadbd", f"--defaults-file={MYSQL_CNF}"),
            configs=(MYSQL_CNF,),
            logs=(LOG / "mysql" / "error.log",),
            ready=mariadb_works,
            ports=(DB_PORT,),
            marker=f"--defaults-file={MYSQL_CNF}",
            foreground=True,
            prepare=init_mariadb,
        ),
        Daemon(
            key="slurmdbd",
            comm="slurmdbd",
            pidfile=RUN / "slurm" / "slurmdbd.pid",
            argv=("/usr/sbin/slurmdbd",),
            configs=(SLURMDBD_CONF,),
            logs=(LOG / "slurm" / "slurmdbd.log",),
            ready=lambda: port_open(DBD_PORT),
            ports=(DBD_PORT,),
        ),
        Daemon(
            key="slurmctld",
            comm="slurmctld",
            pidfile=RUN / "slurm" / "slurmctld.pid",
            argv=("/usr/sbin/slurmctld",),
            configs=(SLURM_CONF, GRES_CONF),
            logs=(LOG / "slurm" / "slurmctld.log",),
            ready=slurmctld_works,
            ports=(CTLD_PORT,),
        ),
    ]
    for node, (_, port) in NODES.items():
        pidfile = RUN / "slurm" / f"slurmd-{node}.pid"
        listed.append(
            Daemon(
                key=f"slurmd-{node}",
                comm="slurmd",
                pidfile=pidfile,
                # Its own mount namespace too (mounts of the machine still reach it): ``pyxis-off`` hides the
                # node's SPANK plugin configuration there, as on a site whose nodes lack Pyxis.
                argv=(
                    *("unshare", "--uts", "--mount", "--propagation", "slave"),
                    *("/bin/sh", "-c", f"hostname {node} && exec /usr/sbin/slurmd -N {node}"),
                ),
                configs=(SLURM_CONF, GRES_CONF, CGROUP_CONF, PLUGSTACK_CONF, PLUGIN_SO),
                logs=(LOG / "slurm" / f"slurmd-{node}.log",),
                ready=lambda pidfile=pidfile: pidfile.exists(),
                ports=(port,),
                marker=f"-N {node}",
            )
        )
    for key, port, config, pidfile, host_key in (
        ("sshd", SSH_PORT, SSH_DIR / "sshd_config", RUN / "sshd.pid", HOST_KEY),
        ("sshd-fault", FAULT_PORT, SSH_DIR / "sshd_fault_config", RUN / "sshd-fault.pid", HOST_KEY),
        ("sshd-bastion", BASTION_PORT, SSH_DIR / "sshd_bastion_config", RUN / "sshd-bastion.pid", HOST_KEY),
        (
            "sshd-rotating",
            ROTATING_PORT,
            SSH_DIR / "sshd_rotating_config",
            RUN / "sshd-rotating.pid",
            ROTATING_HOST_KEY,
        ),
        ("sshd-limits", LIMITS_PORT, SSH_DIR / "sshd_limits_config", RUN / "sshd-limits.pid", HOST_KEY),
        ("sshd-skewed", SKEWED_PORT, SSH_DIR / "sshd_skewed_config", RUN / "sshd-skewed.pid", HOST_KEY),
    ):
        listed.append(
            Daemon(
                key=key,
                comm="sshd",
                pidfile=pidfile,
                argv=("/usr/sbin/sshd", "-f", str(config), "-E", str(LOG / f"{key}.log")),
                configs=(config, host_key),
                logs=(LOG / f"{key}.log",),
                ready=lambda port=port: port_open(port),
                ports=(port,),
                marker=str(config),
                prepare=check_sshd_config(config),
            )
        )
    listed.append(
        Daemon(
            key="black-hole",
            comm="python3",
            pidfile=RUN / "black-hole.pid",
            argv=("/usr/bin/python3", str(BLACK_HOLE), BLACK_HOLE_HOST, str(SSH_PORT), str(RUN / "black-hole.pid")),
            configs=(BLACK_HOLE,),
            logs=(LOG / "black-hole.start.log",),
            ready=lambda: port_open(SSH_PORT, BLACK_HOLE_HOST),
            marker=str(BLACK_HOLE),
            foreground=True,
        )
    )
    listed.append(login_cut_daemon())
    listed.append(postgres_daemon())
    return {daemon.key: daemon for daemon in listed}


def process_state(pid: int) -> str | None:
    """Return the one-letter state of a process, or None when it does not exist."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat_line.rsplit(")", 1)[1].split()[0]


def pid_of(daemon: Daemon) -> int | None:
    """Return the pid of the running daemon, checked against /proc (name, command line, not a zombie)."""
    try:
        pid = int(daemon.pidfile.read_text().split()[0])
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, IndexError):
        return None
    if comm != daemon.comm or (daemon.marker and f" {daemon.marker} " not in f" {cmdline.strip()} "):
        return None
    return pid if process_state(pid) not in (None, "Z") else None


def config_hash(daemon: Daemon) -> str:
    """Return the hash of what a daemon was (or would be) started with: argv and config files."""
    parts = [" ".join(daemon.argv).encode()]
    for path in daemon.configs:
        try:
            parts.append(path.read_bytes())
        except FileNotFoundError:
            parts.append(b"<missing>")
    return sha256(*parts)


def hash_file(daemon: Daemon) -> Path:
    """Return where the config hash of a running daemon is kept."""
    return HASHES / f"{daemon.key}.sha256"


def start_daemon(daemon: Daemon) -> None:
    """Start a daemon and wait until it is ready; record its config hash."""
    for port in daemon.ports:
        if port_open(port):
            fail(
                f"{daemon.key}: port {port} on {HOST} is already in use by a process this harness did not "
                f"start; stop it (see `ss -ltnp 'sport = :{port}'`) and run `up` again"
            )
    if daemon.prepare is not None:
        daemon.prepare()
    daemon.pidfile.unlink(missing_ok=True)
    started = time.monotonic()
    start_log = LOG / f"{daemon.key}.start.log"
    with start_log.open("ab") as out:
        if daemon.foreground:
            subprocess.Popen(
                daemon.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        else:
            proc = subprocess.run(
                daemon.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=60, check=False
            )
            if proc.returncode != 0:
                fail(
                    f"{daemon.key}: start exited {proc.returncode}" + tail(start_log) + "".join(map(tail, daemon.logs))
                )
    wait_until(daemon.key, lambda: pid_of(daemon) is not None and daemon.ready(), [start_log, *daemon.logs])
    write_file(hash_file(daemon), config_hash(daemon), mode=0o600)
    step(f"{daemon.key}: started (pid {pid_of(daemon)}, {time.monotonic() - started:.1f} s)")


def stop_daemon(daemon: Daemon) -> int | None:
    """Stop a daemon by its pid file: TERM, then KILL after 10 s (a zombie counts as exited).

    :returns: the pid stopped, or None when it was not running.
    """
    pid = pid_of(daemon)
    hash_file(daemon).unlink(missing_ok=True)
    if pid is None:
        daemon.pidfile.unlink(missing_ok=True)
        return None
    for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while process_state(pid) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        if process_state(pid) in (None, "Z"):
            break
    else:
        fail(f"{daemon.key}: pid {pid} survived SIGKILL")
    daemon.pidfile.unlink(missing_ok=True)
    return pid


def runs_current_config(daemon: Daemon) -> bool:
    """Whether the daemon runs and was started with its config files as they are now."""
    recorded = hash_file(daemon).read_text() if hash_file(daemon).exists() else ""
    return pid_of(daemon) is not None and recorded == config_hash(daemon)


def ensure_daemon(daemon: Daemon) -> None:
    """Start a daemon unless it runs with its current config; restart it when the config changed."""
    pid = pid_of(daemon)
    if runs_current_config(daemon):
        wait_until(daemon.key, daemon.ready, daemon.logs)
        step(f"{daemon.key}: running (pid {pid})")
        return
    if pid is not None:
        step(f"{daemon.key}: configuration changed, restarting (pid {pid})")
        stop_daemon(daemon)
    start_daemon(daemon)


def restart_daemon(daemon: Daemon) -> None:
    """Stop (if running) and start a daemon."""
    pid = stop_daemon(daemon)
    step(f"{daemon.key}: stopped (pid {pid})" if pid else f"{daemon.key}: was not running")
    start_daemon(daemon)


# --------------------------------------------------------------------------------------------------
# database, accounting, nodes, logins


def ensure_database() -> None:
    """Create the accounting database and the ``slurm`` user (both loopback host forms)."""
    password = db_password()
    statements = ["CREATE DATABASE IF NOT EXISTS slurm_acct_db;"]
    for host in ("127.0.0.1", "localhost"):
        statements += [
            f"CREATE USER IF NOT EXISTS 'slurm'@'{host}' IDENTIFIED BY '{password}';",
            f"ALTER USER 'slurm'@'{host}' IDENTIFIED BY '{password}';",
            f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{host}';",
        ]
    run(mariadb_argv(), stdin="\n".join(statements) + "\n")
    step("database: slurm_acct_db and its user in place")


def sacctmgr_list(*args: str) -> list[list[str]]:
    """Return the rows of a parsable ``sacctmgr list`` query."""
    proc = run(["sacctmgr", "-n", "-P", "list", *args])
    return [line.split("|") for line in proc.stdout.splitlines() if line]


def ensure_accounting() -> None:
    """Create the cluster, the account and the user associations in slurmdbd when missing."""
    wait_until(
        "slurmdbd (sacctmgr)",
        lambda: run(["sacctmgr", "-n", "list", "cluster"], check=False, timeout=20).returncode == 0,
        [LOG / "slurm" / "slurmdbd.log"],
    )
    added = []
    if [CLUSTER] not in sacctmgr_list("cluster", "format=cluster"):
        run(["sacctmgr", "-i", "add", "cluster", CLUSTER])
        added.append(f"cluster {CLUSTER}")
    if [ACCOUNT] not in sacctmgr_list("account", "format=account"):
        run(
            [
                "sacctmgr", "-i", "add", "account", ACCOUNT, f"Cluster={CLUSTER}",
                "Description=GPU test project", "Organization=slurmtest",
            ]
        )  # fmt: skip
        added.append(f"account {ACCOUNT}")
    if [QOS] not in sacctmgr_list("qos", "format=name"):
        run(["sacctmgr", "-i", "add", "qos", QOS, "Description=longer GPU jobs"])
        added.append(f"qos {QOS}")
    associations = sacctmgr_list("association", f"cluster={CLUSTER}", "format=account,user,qos")
    for user in ("root", USER, OTHER_USER):
        row = next((row for row in associations if row[:2] == [ACCOUNT, user]), None)
        if row is None:
            run(
                [
                    "sacctmgr", "-i", "add", "user", user, f"Account={ACCOUNT}",
                    f"DefaultAccount={ACCOUNT}", f"Cluster={CLUSTER}",
                ]
            )  # fmt: skip
            added.append(f"user {user}")
        if row is None or QOS not in row[2].split(","):
            run(
                [
                    "sacctmgr", "-i", "modify", "user", "where", f"name={user}", f"account={ACCOUNT}",
                    f"cluster={CLUSTER}", "set", f"QOS+={QOS}",
                ]
            )  # fmt: skip
            added.append(f"qos {QOS} for {user}")
    step(
        "accounting: "
        + (
            f"added {', '.join(added)}"
            if added
            else f"{CLUSTER}/{ACCOUNT}/root,{USER},{OTHER_USER} with QOS {QOS} present"
        )
    )


def node_states() -> dict[str, str]:
    """Return each node's long state as sinfo prints it (``idle``, ``down*``, ``drained`` ...)."""
    proc = run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=20)
    return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)


def ensure_nodes_ready() -> None:
    """Wait until every node is usable; resume a node left down or drained."""
    resumed: list[str] = []

    def ready() -> bool:
        states = node_states()
        for node in NODES:
            state = states.get(node, "unknown*")
            if state.startswith("inval"):
                fail(
                    f"node {node} is INVAL (config rejected by slurmctld)"
                    + tail(LOG / "slurm" / f"slurmd-{node}.log")
                    + tail(LOG / "slurm" / "slurmctld.log")
                )
            if state in NODE_RESUMABLE and node not in resumed:
                update_node(node, "resume")
                resumed.append(node)
        return all(states.get(node) in NODE_READY for node in NODES)

    started = time.monotonic()
    wait_until("nodes", ready, [LOG / "slurm" / "slurmctld.log", *(LOG / "slurm" / f"slurmd-{n}.log" for n in NODES)])
    states = node_states()
    summary = ", ".join(f"{node} {states.get(node, '?')}" for node in NODES)
    step(
        f"nodes: {summary}"
        + (f" (resumed {', '.join(resumed)})" if resumed else "")
        + f" ({time.monotonic() - started:.1f} s)"
    )


def nodes_responding() -> bool:
    """Return True when slurmctld knows every node and none is marked not responding (``*``).

    Unlike :func:`ensure_nodes_ready` it resumes nothing: a node someone drained stays drained.
    """
    states = node_states()
    return set(states) == set(NODES) and all(
        state != "unknown" and not state.endswith("*") for state in states.values()
    )


#: Mounted over the SPANK plugin directory in a node's mount namespace by ``pyxis-off``: an empty directory.
NO_PYXIS_DIR = STATE / "no-pyxis"


def node_pyxis(node: str, *, on: bool) -> None:
    """Show or hide Pyxis (the stand-in's plugstack.conf.d entry) to the job steps of ``node``.

    The node's slurmd runs in its own mount namespace; an empty directory mounted over
    plugstack.conf.d there leaves the login host's srun with Pyxis' options and the node without the
    plugin, so a step with ``--container-image`` runs its command outside any container, as on a
    site whose GPU nodes lack Pyxis. ``up`` shows it again on every node.
    """
    pid = pid_of(daemons()[f"slurmd-{node}"])
    if pid is None:
        fail(f"pyxis: slurmd-{node} is not running")
    target = str(PLUGSTACK_CONF.parent)
    # ``--root``: the slurmd's root directory too (a release tree's: entering only the mount namespace
    # would resolve the paths from the machine's root and hide nothing the node reads).
    enter = ["nsenter", f"--target={pid}", "--mount", "--root", "--wd", "--"]
    hidden = any(line.split()[4] == target for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines())
    if on and hidden:
        run([*enter, "umount", target])
    elif not on and not hidden:
        NO_PYXIS_DIR.mkdir(mode=0o755, exist_ok=True)
        run([*enter, "mount", "--bind", str(NO_PYXIS_DIR), target])
    step(f"node {node}: Pyxis {'loaded' if on else 'hidden'} in its job steps")


def update_node(node: str, state: str) -> None:
    """Set a node's state with ``scontrol update`` (down and drain need a reason)."""
    reason = [f"reason=harness {state}"] if state in ("down", "drain") else []
    run(["scontrol", "update", f"nodename={node}", f"state={state}", *reason])
    step(f"node {node}: state={state}")


def ssh_argv(port: int, known_hosts: Path = KNOWN_HOSTS) -> list[str]:
    """Return the OpenSSH client command logging in as the cluster user with strict host-key checks."""
    return [
        "ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", "-i", str(CLIENT_KEY),
        "-p", str(port), f"{USER}@{HOST}",
    ]  # fmt: skip


def check_logins() -> None:
    """Log in on the three shell sshds and check which ``sbatch`` each one's PATH finds (the rotating
    sshd is checked against its current host key, which the harness's known_hosts does not list)."""
    with tempfile.TemporaryDirectory() as tmp:
        rotating_known_hosts = Path(tmp) / "known_hosts"
        rotating_known_hosts.write_text(f"[{HOST}]:{ROTATING_PORT} {public_key(ROTATING_HOST_KEY)}\n")
        for key, port, expected, known_hosts in (
            ("sshd", SSH_PORT, "/usr/bin/sbatch", KNOWN_HOSTS),
            ("sshd-fault", FAULT_PORT, str(FAULTBIN / "sbatch"), KNOWN_HOSTS),
            ("sshd-rotating", ROTATING_PORT, "/usr/bin/sbatch", rotating_known_hosts),
        ):
            proc = run([*ssh_argv(port, known_hosts), "command -v sbatch"], check=False, timeout=30)
            found = proc.stdout.strip()
            if proc.returncode != 0 or found != expected:
                fail(
                    f"ssh login as {USER} on port {port}: rc {proc.returncode}, sbatch={found!r} "
                    f"(expected {expected}): {proc.stderr.strip()}" + tail(LOG / f"{key}.log")
                )
    step(
        f"ssh: key login as {USER} works on {SSH_PORT} and {ROTATING_PORT} (/usr/bin/sbatch) and {FAULT_PORT} "
        f"({FAULTBIN}/sbatch)"
    )


def rotate_host_key(daemon: Daemon) -> None:
    """Give the rotating sshd a new host key and restart its listener (open sessions stay up)."""
    old = public_key(ROTATING_HOST_KEY)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "key"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "slurmtest-rotating-host", "-f", str(staged)])
        staged.chmod(0o600)
        shutil.copyfile(staged.with_suffix(".pub"), ROTATING_HOST_KEY.with_suffix(".pub"))
        shutil.copy2(staged, ROTATING_HOST_KEY.with_name(f".{ROTATING_HOST_KEY.name}.new"))
        os.replace(ROTATING_HOST_KEY.with_name(f".{ROTATING_HOST_KEY.name}.new"), ROTATING_HOST_KEY)
    restart_daemon(daemon)
    new = public_key(ROTATING_HOST_KEY)
    step(f"{daemon.key}: host key rotated from ...{old.split()[1][-12:]} to ...{new.split()[1][-12:]}")


# --------------------------------------------------------------------------------------------------
# a login host cut off from the head node (see the module docstring)

#: The "cut" login sshd: its SLURM client tools go through :data:`CUT_BIN`.
CUT_PORT = 22026
CUT_BIN = STATE / "cutbin"
#: While this file exists, the wrappers in :data:`CUT_BIN` run the real tool with ``SLURM_CONF`` set to it.
CUT_CONF = STATE / "login-cut" / "slurm.conf"
CUT_TOOLS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "sacctmgr", "sstat", "sprio", "sshare")


def cut_wrapper() -> str:
    """Return the wrapper installed as every tool of :data:`CUT_TOOLS` in :data:`CUT_BIN`."""
    return (
        "#!/bin/sh\n"
        '# Written by tests/cluster/harness.py: a SLURM client tool of the "cut" login sshd. While\n'
        f"# {CUT_CONF} exists (harness cut-login-ctld / cut-login-head), the tool reads it as slurm.conf:\n"
        "# it names a port nothing listens on for slurmctld (and slurmdbd).\n"
        f"if [ -r {CUT_CONF} ]; then SLURM_CONF={CUT_CONF}; export SLURM_CONF; fi\n"
        'exec "/usr/bin/${0##*/}" "$@"\n'
    )


def ensure_login_cut() -> None:
    """Write the cut sshd's config and wrappers, and lift any cut (``up`` leaves a healthy login host)."""
    changed = [
        str(path)
        for path, content, mode in (
            (
                SSH_DIR / "sshd_cut_config",
                sshd_config(CUT_PORT, RUN / "sshd-cut.pid", [f"SetEnv PATH={CUT_BIN}:/usr/local/bin:/usr/bin:/bin"]),
                0o600,
            ),
            *((CUT_BIN / tool, cut_wrapper(), 0o755) for tool in CUT_TOOLS),
        )
        if write_file(path, content, mode=mode)
    ]
    CUT_BIN.chmod(0o755)
    restore_login()
    step("cut login: " + (f"wrote {', '.join(changed)}" if changed else "config and wrappers unchanged"))


def login_cut_daemon() -> Daemon:
    """Return the cut login sshd (:data:`CUT_PORT`)."""
    config = SSH_DIR / "sshd_cut_config"
    return Daemon(
        key="sshd-cut",
        comm="sshd",
        pidfile=RUN / "sshd-cut.pid",
        argv=("/usr/sbin/sshd", "-f", str(config), "-E", str(LOG / "sshd-cut.log")),
        configs=(config, HOST_KEY),
        logs=(LOG / "sshd-cut.log",),
        ready=lambda: port_open(CUT_PORT),
        ports=(CUT_PORT,),
        marker=str(config),
        prepare=check_sshd_config(config),
    )


def check_cut_login() -> None:
    """Log in on the cut sshd and check that its PATH finds the wrappers."""
    proc = run([*ssh_argv(CUT_PORT), "command -v squeue"], check=False, timeout=30)
    if proc.returncode != 0 or proc.stdout.strip() != str(CUT_BIN / "squeue"):
        fail(
            f"ssh login as {USER} on port {CUT_PORT}: rc {proc.returncode}, squeue={proc.stdout.strip()!r} "
            f"(expected {CUT_BIN / 'squeue'}): {proc.stderr.strip()}" + tail(LOG / "sshd-cut.log")
        )
    step(f"ssh: key login as {USER} works on {CUT_PORT} ({CUT_BIN}/squeue)")


def cut_login(*, head: bool) -> None:
    """Cut the cut sshd's SLURM tools off slurmctld (``head``: and slurmdbd) with a port nothing listens on."""
    dead = closed_port()
    content = slurm_conf().replace(f"SlurmctldPort={CTLD_PORT}\n", f"SlurmctldPort={dead}\n")
    if head:
        content = content.replace(f"AccountingStoragePort={DBD_PORT}\n", f"AccountingStoragePort={dead}\n")
    if f"SlurmctldPort={dead}" not in content:
        fail(f"cut-login: no SlurmctldPort={CTLD_PORT} line in slurm.conf to replace")
    # Outside /etc/slurm the clients would not find the SPANK plugins: sbatch must fail on the controller only.
    write_file(CUT_CONF, content + f"PlugStackConfig={ETC_SLURM / 'plugstack.conf'}\n")
    CUT_CONF.parent.chmod(0o755)
    step(f"login port {CUT_PORT}: slurmctld{' and slurmdbd' if head else ''} unreachable (port {dead})")


def restore_login() -> None:
    """Lift a cut: the cut sshd's SLURM tools use /etc/slurm/slurm.conf again."""
    if CUT_CONF.exists():
        CUT_CONF.unlink()
        step(f"login port {CUT_PORT}: slurmctld and slurmdbd reachable again")


# --------------------------------------------------------------------------------------------------
# environment JSON


def closed_port() -> int:
    """Return the first port from 22029 on where nothing listens (for failover tests)."""
    port = FIRST_CLOSED_PORT
    while port_open(port):
        port += 1
    return port


def cluster_env() -> dict[str, object]:
    """Return the environment the cluster tests read (also written to ``<state>/cluster.json``)."""
    if not HOST_KEY.exists() or not CLIENT_KEY.exists():
        fail(f"{STATE} is not set up; run `python3 tests/cluster/harness.py up` as root")
    return {
        "host": HOST,
        "port": SSH_PORT,
        "fault_port": FAULT_PORT,
        "bastion_port": BASTION_PORT,
        "rotating_port": ROTATING_PORT,
        "limits_port": LIMITS_PORT,
        "skewed_port": SKEWED_PORT,
        "login_clock_skew": LOGIN_CLOCK_SKEW,
        "postgres_port": PG_PORT,
        "black_hole_host": BLACK_HOLE_HOST,
        "black_hole_port": SSH_PORT,
        "closed_port": closed_port(),
        "user": USER,
        "uid": pwd.getpwnam(USER).pw_uid,
        "other_user": OTHER_USER,
        "other_uid": pwd.getpwnam(OTHER_USER).pw_uid,
        "other_dir": str(SHARED / OTHER_USER),
        "key_file": str(CLIENT_KEY),
        "known_hosts": str(KNOWN_HOSTS),
        "host_key": public_key(HOST_KEY),
        "shared_dir": str(SHARED),
        "results_dir": str(SHARED / USER),
        "containers_dir": str(CONTAINERS),
        "cluster_name": CLUSTER,
        "account": ACCOUNT,
        "gpu_partition": GPU_PARTITION,
        "long_partition": LONG_PARTITION,
        "cpu_partition": CPU_PARTITION,
        "down_partition": DOWN_PARTITION,
        "debug_partition": DEBUG_PARTITION,
        "short_partition": SHORT_PARTITION,
        "hidden_partition": HIDDEN_PARTITION,
        "urgent_partition": URGENT_PARTITION,
        "wide_partition": WIDE_PARTITION,
        "qos": QOS,
        "node_features": {node: list(features) for node, features in NODE_FEATURES.items()},
        "gpu_types": dict(GPU_TYPES),
        "nodes": list(GPU_NODES),
        "cpu_nodes": list(CPU_NODES),
        "gpus_per_node": GPUS_PER_NODE,
        "wide_nodes": list(WIDE_GPU_NODES),
        "wide_gpus_per_node": WIDE_GPUS_PER_NODE,
        "state_dir": str(STATE),
        "enroot_conf": str(ENROOT_KNOBS),
        "enroot_imports_log": str(ENROOT_LOG),
        "pyxis_registry_log": str(PYXIS_LOG),
        "fault_sbatch_log": str(FAULT_LOG),
        "torch_python": str(TORCH_VENV / "bin" / "python"),
        "torchrun": str(TORCH_VENV / "bin" / "torchrun"),
        "fault_switch": str(FAULT_SWITCH),
        "cut_port": CUT_PORT,
        "cut_conf": str(CUT_CONF),
    }


def write_env() -> None:
    """Write ``<state>/cluster.json`` (0644) and print it."""
    text = json.dumps(cluster_env(), indent=2) + "\n"
    write_file(CLUSTER_JSON, text)
    print(text, end="", flush=True)


# --------------------------------------------------------------------------------------------------
# commands


def install() -> pwd.struct_passwd:
    """What the cluster needs on the machine before anything starts (idempotent): packages, users, layout, the
    jobs' Python, fake GPUs, the munge key. Returns the cluster user."""
    ensure_packages()
    user = ensure_user()
    ensure_user(OTHER_USER, OTHER_PREFERRED_UID)
    ensure_layout()
    ensure_hosts()
    ensure_torch_venv()
    ensure_torch_faults()
    ensure_gpu_devices()
    ensure_munge_key()
    return user


def cmd_install() -> int:
    """Install what the cluster needs, starting nothing: a release's tree is prepared so while another cluster
    runs (``releases.py prepare``)."""
    started = time.monotonic()
    install()
    step(f"install: done in {time.monotonic() - started:.1f} s")
    return 0


def cmd_up() -> int:
    """Bring the cluster up (idempotent) and print the environment JSON."""
    started = time.monotonic()
    releases.stop_all()
    user = install()
    MIN_JOB_AGE.unlink(missing_ok=True)
    RATE_LIMIT.unlink(missing_ok=True)
    PREEMPT_SIGNAL.unlink(missing_ok=True)
    changed = write_configs()
    ensure_login_cut()
    build_plugin()
    ensure_ssh_keys(user)
    ensure_faketime_shared(user)
    table = daemons()
    for key in ("munged", "mariadb"):
        ensure_daemon(table[key])
    ensure_database()
    ensure_daemon(table["slurmdbd"])
    ensure_accounting()
    # slurm.conf is back to what slurmctld was started with, but slurmctld was reconfigured since
    # (min-job-age, rate-limit or preempt-signal of a run that did not finish): it keeps running, so have it read
    # the file again.
    reread = str(SLURM_CONF) in changed and runs_current_config(table["slurmctld"])
    for key in ("slurmctld", *(f"slurmd-{node}" for node in NODES)):
        ensure_daemon(table[key])
    if reread:
        reconfigure()
    for node in NODES:
        node_pyxis(node, on=True)
    ensure_nodes_ready()
    for key in ("sshd", "sshd-fault", "sshd-bastion", "sshd-rotating", "sshd-limits", "sshd-skewed", "black-hole"):
        ensure_daemon(table[key])
    check_logins()
    ensure_daemon(table["sshd-cut"])
    check_cut_login()
    ensure_daemon(table["postgres"])
    step(f"up: cluster ready in {time.monotonic() - started:.1f} s")
    write_env()
    return 0


def reconfigure() -> None:
    """Have slurmctld (and the slurmds) read slurm.conf again."""
    run(["scontrol", "reconfigure"])
    step("slurmctld: reconfigured")


def set_min_job_age(value: str) -> None:
    """Set slurmctld's ``MinJobAge`` to ``value`` seconds (``default``: SLURM's 300 s) and check that it took."""
    if value == "default":
        MIN_JOB_AGE.unlink(missing_ok=True)
    elif value.isdigit() and int(value) >= 2:
        write_file(MIN_JOB_AGE, f"{int(value)}\n")
    else:
        fail(f"min-job-age {value!r}: give whole seconds (at least 2, SLURM's minimum) or 'default'")
    write_file(SLURM_CONF, slurm_conf())
    reconfigure()
    expected = "300" if value == "default" else str(int(value))
    shown = {
        key.strip(): val.strip()
        for key, _, val in (line.partition("=") for line in run(["scontrol", "show", "config"]).stdout.splitlines())
    }.get("MinJobAge", "")
    if shown.split()[:1] != [expected]:
        fail(f"slurmctld reports MinJobAge {shown!r} after the reconfigure, not {expected} s")
    step(f"slurmctld: MinJobAge {shown}")


def set_rate_limit(value: str) -> None:
    """Set slurmctld's ``SlurmctldParameters`` to ``value`` (``rl_enable`` and its ``rl_*`` settings; ``off``:
    none) and check that it took.
    """
    if value == "off":
        RATE_LIMIT.unlink(missing_ok=True)
    elif slurm_release() < (23, 2):
        fail(f"rate-limit {value!r}: rl_enable came in SLURM 23.02, this cluster runs {slurm_release()}")
    elif value.split(",")[0] == "rl_enable" and all(
        key.startswith("rl_") and number.isdigit()
        for key, _, number in (item.partition("=") for item in value.split(",")[1:])
    ):
        write_file(RATE_LIMIT, f"{value}\n")
    else:
        fail(f"rate-limit {value!r}: give rl_enable[,rl_bucket_size=N,rl_refill_rate=N,...] or 'off'")
    write_file(SLURM_CONF, slurm_conf())
    reconfigure()
    shown = {
        key.strip(): val.strip()
        for key, _, val in (line.partition("=") for line in run(["scontrol", "show", "config"]).stdout.splitlines())
    }.get("SlurmctldParameters", "")
    expected = "(null)" if value == "off" else value
    if shown != expected:
        fail(f"slurmctld reports SlurmctldParameters {shown!r} after the reconfigure, not {expected!r}")
    step(f"slurmctld: SlurmctldParameters {shown}")


def set_preempt_signal(value: str) -> None:
    """Set how a preempted job is warned (see the module's ``preempt-signal``) and check that it took."""
    if value == "default":
        PREEMPT_SIGNAL.unlink(missing_ok=True)
    elif value in ("on", "off"):
        write_file(PREEMPT_SIGNAL, f"{value}\n")
    else:
        fail(f"preempt-signal {value!r}: give on, off or default")
    write_file(SLURM_CONF, slurm_conf())
    reconfigure()
    config = {
        key.strip(): val.strip()
        for key, _, val in (line.partition("=") for line in run(["scontrol", "show", "config"]).stdout.splitlines())
    }
    shown = f"PreemptParameters={config['PreemptParameters']}" if "PreemptParameters" in config else ""
    shown += f" SlurmctldParameters={config.get('SlurmctldParameters', '')}"
    grace = run(["scontrol", "show", "partition", GPU_PARTITION]).stdout.split("GraceTime=")[-1].split()[0]
    expected_grace = "0" if value == "default" else str(PREEMPT_GRACE_S)
    if ("send_user_signal" in shown) != (value == "on") or grace != expected_grace:
        fail(f"preempt-signal {value}: slurmctld reports {shown.strip()}, GraceTime {grace} after the reconfigure")
    step(f"slurmctld: {shown.strip()}, GraceTime {grace} s on the partitions polar_urgent preempts")


def cancel_all_jobs() -> None:
    """Cancel every job and wait (up to 15 s) until slurmctld forgets them."""
    if pid_of(daemons()["slurmctld"]) is None:
        step("jobs: slurmctld not running, nothing to cancel")
        return
    jobs = run(["squeue", "-h", "-o", "%i"], check=False, timeout=30).stdout.split()
    if not jobs:
        step("jobs: none")
        return
    run(["scancel", *jobs], check=False)
    deadline = time.monotonic() + 15
    while run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    step(f"jobs: cancelled {len(jobs)}")


def cmd_down() -> int:
    """Cancel all jobs, then stop the daemons ``up`` started, in reverse start order."""
    started = time.monotonic()
    cancel_all_jobs()
    for daemon in reversed(daemons().values()):
        pid = stop_daemon(daemon)
        step(f"{daemon.key}: stopped (pid {pid})" if pid else f"{daemon.key}: not running")
    step(f"down: done in {time.monotonic() - started:.1f} s")
    return 0


def cmd_status() -> int:
    """Print each daemon's state and the node states; return 1 when a daemon is not running."""
    all_running = True
    for daemon in daemons().values():
        pid = pid_of(daemon)
        if pid is None:
            all_running = False
            print(f"{daemon.key}: stopped")
            continue
        recorded = hash_file(daemon).read_text() if hash_file(daemon).exists() else ""
        stale = "" if recorded == config_hash(daemon) else " (configuration changed: run `up`)"
        print(f"{daemon.key}: running (pid {pid}){stale}")
    if all_running:
        for node, state in node_states().items():
            print(f"node {node}: {state}")
    return 0 if all_running else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run one command."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in (
        "up",
        "install",
        "down",
        "status",
        "env",
        "restart-sshd",
        "stop-slurmdbd",
        "start-slurmdbd",
        "restart-slurmctld",
        "stop-slurmctld",
        "start-slurmctld",
        "rotate-host-key",
        "cut-login-ctld",
        "cut-login-head",
        "restore-login",
    ):
        commands.add_parser(name)
    for name in ("node-down", "node-resume", "drain", "pyxis-off", "pyxis-on"):
        commands.add_parser(name).add_argument("node", choices=list(NODES))
    commands.add_parser("min-job-age").add_argument("seconds", help="whole seconds, or 'default' (300)")
    commands.add_parser("rate-limit").add_argument("parameters", help="rl_enable[,rl_bucket_size=N,...], or 'off'")
    commands.add_parser("preempt-signal").add_argument("setting", choices=("on", "off", "default"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        fail("run the harness as root (it installs packages and starts system daemons)")
    with LOCK_FILE.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run one parsed command (the caller holds the harness lock)."""
    table = daemons()
    if args.command == "up":
        return cmd_up()
    if args.command == "install":
        return cmd_install()
    if args.command == "down":
        return cmd_down()
    if args.command == "status":
        return cmd_status()
    if args.command == "env":
        write_env()
    elif args.command == "restart-sshd":
        restart_daemon(table["sshd"])
    elif args.command == "rotate-host-key":
        rotate_host_key(table["sshd-rotating"])
    elif args.command == "restart-slurmctld":
        restart_daemon(table["slurmctld"])
    elif args.command == "stop-slurmdbd":
        pid = stop_daemon(table["slurmdbd"])
        step(f"slurmdbd: stopped (pid {pid})" if pid else "slurmdbd: was not running")
    elif args.command == "start-slurmdbd":
        ensure_daemon(table["slurmdbd"])
    elif args.command == "stop-slurmctld":
        pid = stop_daemon(table["slurmctld"])
        step(f"slurmctld: stopped (pid {pid})" if pid else "slurmctld: was not running")
    elif args.command == "start-slurmctld":
        ensure_daemon(table["slurmctld"])
        wait_until("nodes registered again", nodes_responding, [LOG / "slurm" / "slurmctld.log"])
        step("nodes: " + ", ".join(f"{node} {state}" for node, state in node_states().items()))
    elif args.command in ("cut-login-ctld", "cut-login-head"):
        cut_login(head=args.command == "cut-login-head")
    elif args.command == "restore-login":
        restore_login()
    elif args.command == "min-job-age":
        set_min_job_age(args.seconds)
    elif args.command == "rate-limit":
        set_rate_limit(args.parameters)
    elif args.command == "preempt-signal":
        set_preempt_signal(args.setting)
    elif args.command in ("pyxis-off", "pyxis-on"):
        node_pyxis(args.node, on=args.command == "pyxis-on")
    else:
        update_node(args.node, {"node-down": "down", "node-resume": "resume", "drain": "drain"}[args.command])
    return 0


if __name__ == "__main__":
    sys.exit(main())
