"""``SlurmHook``: the only place in the provider that talks SSH.

The sync side (operators) is built on the SSH provider's :class:`~airflow.providers.ssh.hooks.ssh.SSHHook`
(paramiko) and keeps ONE connection for the hook's lifetime, failing over between login hosts in
order. The async side (triggers) uses asyncssh through a per-process pool: one connection per
cluster account, shared by every trigger of a triggerer, reconnecting with backoff.

Every command string comes from :mod:`airflow_provider_tao_slurm.core.commands` (every value
quoted); every output is parsed by the core. Secrets travel only over stdin.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import math
import os
import random
import re
import selectors
import shlex
import socket
import stat
import tarfile
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.config import (
    ClusterSettings,
    proxy_argv,
    settings_from_connection,
    settings_from_env,
)
from airflow_provider_tao_slurm.core.defaults import DEFAULT_CONN_ID
from airflow_provider_tao_slurm.core.logstream import TailChunk, TailRequest, parse_tail_output, tail_script
from airflow_provider_tao_slurm.core.partitions import Partition, parse_sinfo_partitions
from airflow_provider_tao_slurm.core.secrets import redact_text
from airflow_provider_tao_slurm.core.states import (
    SQUEUE_UNKNOWN_JOB,
    JobState,
    NameLookup,
    merge_states,
    parse_jobs_by_name,
    parse_sacct,
    parse_sbatch_reply,
    parse_squeue,
)
from airflow_provider_tao_slurm.core.status import parse_status_lines
from airflow_provider_tao_slurm.exceptions import (
    AmbiguousSubmissionError,
    ConnectionConfigError,
    ConnectionLostError,
    HostKeyError,
    JobLookupError,
    KeyFilePermissionError,
    RemoteCommandError,
    SlurmAuthenticationError,
    SlurmConnectionError,
    StatusQueryError,
    StoragePathError,
    SubmissionError,
)

if TYPE_CHECKING:
    import asyncssh
    import paramiko

log = logging.getLogger(__name__)
# paramiko logs every connection ("Connected (version 2.0 ...)", "Authentication ... successful!") at INFO:
# the task log is for the job, so only its warnings and errors are kept (as for asyncssh, see _async_connect).
logging.getLogger("paramiko.transport").setLevel(logging.WARNING)

#: sacct looks back this far when searching by name (without ``--starttime`` it starts at midnight).
DEFAULT_SACCT_WINDOW = "now-7days"
#: How long an unclear ``sbatch`` reply is reconciled by exact job name before resubmitting.
RECONCILE_TIMEOUT_S = 60.0
RECONCILE_INTERVAL_S = 2.0
#: stderr marker of a combined stage-and-submit command whose staging failed (sbatch never ran).
STAGING_FAILED = "#tao-slurm-staging-failed"
#: How long one sinfo answer about the partitions serves every worker of a cluster.
PARTITION_CACHE_S = 600
#: The cache file's name under ``<results_dir>/.tao-slurm``; it names sinfo's output format, so an answer
#: cached by a version that asked sinfo for other fields is never read as this one's.
PARTITION_CACHE_NAME = "partitions-a-gres"
#: Concurrent channels on one pooled async connection (sshd's MaxSessions defaults to 10).
ASYNC_MAX_SESSIONS = 8


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one remote command: exit status, decoded stdout and stderr, and the host used."""

    rc: int
    stdout: str
    stderr: str
    host: str = ""


@dataclass(frozen=True)
class LogChunk:
    """A bounded piece of a remote log read from a byte offset.

    :ivar size: the file's current size (0 when it does not exist yet).
    :ivar data: the bytes read, decoded as UTF-8 with replacement.
    :ivar next_offset: where the next read starts.
    :ivar restarted: True when the file shrank (a requeued rerun truncated it) and reading restarted at 0.
    """

    size: int
    data: str
    next_offset: int
    restarted: bool = False


def check_key_file(path: str) -> None:
    """Refuse a private key that is missing or readable by group or others.

    :raises KeyFilePermissionError: with the ``chmod 600`` fix.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise KeyFilePermissionError(f"SSH key file {path!r} does not exist: fix key_file (or SSH_KEY_PATH)") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFilePermissionError(
            f"SSH key file {path!r} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod 600 {path}"
        )


def _pinned_host_key(host_key: str) -> paramiko.RSAKey | paramiko.ECDSAKey | paramiko.Ed25519Key:
    """The pinned ``host_key`` extra (``<type> <base64>``, as in known_hosts) as a paramiko key.

    :raises ConnectionConfigError: for text that is not such a key, or a key type SSH hosts do not use.
    """
    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook

    fix = "copy the '<type> <base64>' part of the host's line from `ssh-keyscan -p PORT HOST`"
    key_type, key_data = [*host_key.split(), "", ""][:2]
    constructor = SSHHook._host_key_mappings.get(key_type)
    if constructor is None:
        raise ConnectionConfigError(
            f"host_key type {key_type!r} is not one of {', '.join(SSHHook._host_key_mappings)}; {fix}"
        )
    try:
        return constructor(data=base64.b64decode(key_data, validate=True))
    except (ValueError, paramiko.SSHException) as exc:
        raise ConnectionConfigError(f"host_key is not a valid {key_type} key ({exc}); {fix}") from None


def _error_text(exc: BaseException) -> str:
    """Why a connection attempt failed, in words: ``Connection refused`` rather than ``[Errno None] ...``."""
    import paramiko

    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "; ".join(dict.fromkeys(_error_text(inner) for inner in exc.errors.values()))
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    if isinstance(exc, TimeoutError) and not str(exc):  # asyncio's timeouts carry no text
        return "timed out"
    return str(exc) or type(exc).__name__


#: What paramiko says when a host ran out of time: the session never negotiated (``start_client`` gave up),
#: no SSH banner within ``banner_timeout``, no answer to authentication within ``auth_timeout``.
_PARAMIKO_TIMEOUTS = ("No existing session", "Error reading SSH protocol banner", "Authentication timeout.")


def _timed_out(exc: BaseException) -> bool:
    """Whether a connection attempt failed for lack of an answer (a hung sshd, dropped traffic), not a refusal."""
    import paramiko

    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, paramiko.SSHException) and str(exc).startswith(_PARAMIKO_TIMEOUTS)


def _describe_connect_error(
    host: str, port: int, exc: BaseException, *, timeout: float | None = None, pinned: bool = False
) -> tuple[str, type[SlurmConnectionError]]:
    """One login host's failure (paramiko or asyncssh) as a message with its fix, and the error class.

    :param timeout: the connection's ``conn_timeout``; when given, a host that did not answer in time is
        reported as such (with the timeout) rather than as unreachable.
    :param pinned: whether the connection pins the host key (``host_key``): a key that is not trusted then
        is a key that CHANGED, never one to go and pin.
    """
    import asyncssh
    import paramiko

    text = _error_text(exc)
    if timeout is not None and _timed_out(exc):
        return (
            f"{host} port {port} did not answer within conn_timeout={timeout:g} s ({text}): no SSH handshake "
            "(a hung or overloaded sshd, or a firewall dropping the traffic); check that sshd answers there "
            "(ssh -v), or raise the connection's conn_timeout",
            SlurmConnectionError,
        )
    if isinstance(exc, paramiko.BadHostKeyException) or (pinned and isinstance(exc, asyncssh.HostKeyNotVerifiable)):
        return (
            f"host key of {host} CHANGED ({text}); if the cluster's key really changed, confirm the new key "
            "with its admins and update the connection's host_key extra (or ~/.ssh/known_hosts); otherwise "
            "someone may be intercepting the connection",
            HostKeyError,
        )
    if "known_hosts" in text or "Host key" in text:
        return (
            f"host key of {host} is not trusted ({text}); pin it with the connection's host_key extra "
            "(ssh-keyscan shows it) or add it to ~/.ssh/known_hosts",
            HostKeyError,
        )
    if isinstance(exc, paramiko.AuthenticationException | asyncssh.PermissionDenied):
        return f"{host} refused the key ({text}); check the user and that the key is authorised", (
            SlurmAuthenticationError
        )
    return (
        f"{host} port {port} unreachable ({text}); check the host name and port, and that sshd runs there",
        SlurmConnectionError,
    )


def _check_pinned_key(client: paramiko.SSHClient, host: str, host_key: str) -> None:
    """Close ``client`` unless its server presented the pinned ``host_key``.

    SSHHook pins the key next to ``~/.ssh/known_hosts``, and paramiko prefers the known_hosts entry: a
    host listed there is checked against that entry only, so the pin alone cannot be trusted to hold.

    :raises paramiko.BadHostKeyException: when the server's key is not the pinned one.
    :raises paramiko.SSHException: when the connection closed before its key could be checked.
    """
    import paramiko

    pinned = _pinned_host_key(host_key)
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        client.close()
        raise paramiko.SSHException("the connection closed before its host key could be checked")
    offered = transport.get_remote_server_key()
    if offered != pinned:
        client.close()
        raise paramiko.BadHostKeyException(host, offered, pinned)


def _send_without_delay(client: paramiko.SSHClient) -> None:
    """Turn off Nagle's algorithm on the connection's TCP socket, as asyncssh and OpenSSH do.

    paramiko leaves it on. A command is several small SSH packets in a row (channel open, exec
    request, stdin, EOF); with Nagle each waits for the server's ACK of the one before, which the
    server delays (40 ms on Linux), so every command cost 40-90 ms of waiting however fast it ran.
    A connection through a ProxyCommand has no socket of ours and is left as it is.
    """
    transport = client.get_transport()
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _no_host_answered(
    cluster_name: str, failures: Sequence[tuple[str, str]], kinds: set[type[SlurmConnectionError]]
) -> SlurmConnectionError:
    """The error for a failover that ran out of login hosts: the common error class, every host and why."""
    kind = kinds.pop() if len(kinds) == 1 else SlurmConnectionError
    detail = "; ".join(reason for _, reason in failures)
    return kind(f"no login host of cluster {cluster_name!r} answered: {detail}", failures)


class SlurmHook(BaseHook):
    """Run commands on a SLURM cluster's login hosts over SSH.

    Settings come from the ``tao_slurm`` Airflow connection ``slurm_conn_id``; when that connection
    does not exist, from the ``SLURM_*`` environment variables (``SLURM_USER``, ``SLURM_HOSTNAME``,
    ``SSH_KEY_PATH``, ...).

    :param slurm_conn_id: the Airflow connection id.
    :param settings: explicit settings (tests, benchmarks); skips the connection lookup.
    """

    conn_name_attr = "slurm_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "tao_slurm"
    hook_name = "TAO SLURM (over SSH)"

    def __init__(self, slurm_conn_id: str = default_conn_name, *, settings: ClusterSettings | None = None) -> None:
        super().__init__()
        self.slurm_conn_id = slurm_conn_id
        self._explicit_settings = settings
        self._async_settings: ClusterSettings | None = None
        self._client: paramiko.SSHClient | None = None
        self._host: str | None = None

    # ------------------------------------------------------------------ settings and connection

    @cached_property
    def settings(self) -> ClusterSettings:
        """The validated cluster settings (connection first, then ``SLURM_*`` variables)."""
        if self._explicit_settings is not None:
            return self._explicit_settings
        try:
            conn = self.get_connection(self.slurm_conn_id)
        except AirflowNotFoundException:
            return self._settings_without_connection()
        return settings_from_connection(
            host=conn.host,
            login=conn.login,
            port=conn.port,
            extra=conn.extra_dejson,
            source=f"connection {self.slurm_conn_id!r}",
        )

    def _settings_without_connection(self) -> ClusterSettings:
        """Settings from the ``SLURM_*`` variables, for when the default Airflow connection does not exist.

        The variables stand in for the default connection only: an explicitly named connection that
        does not exist is an error (a typo must not silently reach another cluster).

        :raises ConnectionConfigError: for a missing named connection, or when ``SLURM_HOSTNAME`` is not set.
        """
        if self.slurm_conn_id != self.default_conn_name:
            raise ConnectionConfigError(
                f"Airflow connection {self.slurm_conn_id!r} does not exist: create it (type 'tao_slurm') or fix "
                f"slurm_conn_id; the SLURM_* environment variables stand in for {self.default_conn_name!r} only"
            )
        if os.environ.get("SLURM_HOSTNAME"):
            return settings_from_env(os.environ)
        raise ConnectionConfigError(
            f"no Airflow connection {self.slurm_conn_id!r} and SLURM_HOSTNAME is not set: create a "
            "'tao_slurm' connection or export SLURM_HOSTNAME, SLURM_USER and SSH_KEY_PATH"
        )

    @property
    def active_host(self) -> str | None:
        """The login host the current connection goes to (None before connecting)."""
        return self._host

    def _ssh_hook(self, host: str) -> Any:
        """An SSH provider hook for one login host, configured from our settings."""
        from airflow.providers.ssh.hooks.ssh import SSHHook

        s = self.settings
        if s.key_file:
            check_key_file(s.key_file)
        if s.no_host_key_check:
            self.log.warning(
                "Host key checking is OFF for %s (no_host_key_check): connections are open to "
                "man-in-the-middle attacks",
                host,
            )
        ssh = SSHHook(
            remote_host=host,
            username=s.user,
            key_file=s.key_file,
            port=s.port,
            conn_timeout=math.ceil(s.conn_timeout),  # int(0.5) would be 0: a non-blocking connect
            cmd_timeout=s.cmd_timeout,
            banner_timeout=s.conn_timeout,  # the SSH provider waits 30 s for a silent host's banner
            auth_timeout=math.ceil(s.conn_timeout),
            conn_retry_attempts=1,
            no_host_key_check=s.no_host_key_check,
            host_proxy_cmd=shlex.join(proxy_argv(s.proxy_command, host, s.port, s.user)) if s.proxy_command else None,
        )
        ssh.look_for_keys = False
        if s.private_key:
            ssh.pkey = ssh._pkey_from_private_key(s.private_key, passphrase=s.private_key_passphrase)
        if s.host_key:
            ssh.host_key = _pinned_host_key(s.host_key)
        return ssh

    def _connect(self, host: str) -> paramiko.SSHClient:
        """Connect to one login host; the TCP connect, the SSH banner and the authentication each get
        ``conn_timeout``, and a pinned host key must be the one the server presents.

        :raises SlurmConnectionError: (or a subclass) naming the host and why.
        """
        import paramiko

        s = self.settings
        try:
            client = self._ssh_hook(host).get_conn()
            if s.host_key:
                _check_pinned_key(client, host, s.host_key)
            _send_without_delay(client)
            return client
        except (OSError, paramiko.SSHException, EOFError) as exc:
            message, kind = _describe_connect_error(host, s.port, exc, timeout=s.conn_timeout, pinned=bool(s.host_key))
            raise kind(message, [(host, message)]) from None

    def get_conn(self) -> paramiko.SSHClient:
        """Return the hook's SSH connection, connecting to the first login host that answers.

        :raises SlurmConnectionError: (or a subclass) listing every host tried and why it failed.
        """
        if self._client is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client
            self.close()
        failures: list[tuple[str, str]] = []
        kinds: set[type[SlurmConnectionError]] = set()
        for host in self.settings.hosts:
            try:
                self._client = self._connect(host)
            except SlurmConnectionError as exc:
                failures.extend(exc.failures)
                kinds.add(type(exc))
                self.log.warning("Login host failed, trying the next one: %s", exc)
                continue
            self._host = host
            if failures:
                self.log.warning("Connected to %s after %d failed login host(s)", host, len(failures))
            return self._client
        raise _no_host_answered(self.settings.cluster_name, failures, kinds)

    def close(self) -> None:
        """Close the SSH connection (a later call reconnects)."""
        if self._client is not None:
            self._client.close()
        self._client = None
        self._host = None

    # ------------------------------------------------------------------ running commands

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        what: str = "command",
    ) -> CommandResult:
        """Run ``command`` on the login host; ``stdin`` (e.g. a secret) is sent over the channel.

        :param timeout: seconds before the command is abandoned (default: the connection's cmd_timeout).
        :param check: raise :class:`RemoteCommandError` on a non-zero exit status.
        :param what: a short description used in errors.
        :raises ConnectionLostError: when the connection dropped after the command was sent.
        :raises StoragePathError: when the command refused to write into a directory another user
            could plant files in (:func:`~airflow_provider_tao_slurm.core.commands.secure_dirs`), whatever ``check``.
        """
        rc, out, err, host = self._run_bytes(command, stdin, timeout)
        result = _result(rc, out, err, host)
        if check and rc != 0:
            raise RemoteCommandError(
                f"{what} failed on {host} with exit status {rc}: {result.stderr.strip()[-2000:]}",
                rc=rc,
                stderr=result.stderr,
            )
        return result

    def _run_bytes(self, command: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes, str]:
        """Run ``command``; return the exit status, raw stdout and stderr, and the host used."""
        client = self.get_conn()
        host = self._host or ""
        limit = self.settings.cmd_timeout if timeout is None else timeout
        self.log.debug("ssh %s: %s", host, command)
        try:
            rc, out, err = _exec_channel(client, command, stdin, limit)
        except ConnectionLostError:
            self.close()
            raise
        return rc, out, err, host

    def check_paths(self, paths: Sequence[str]) -> list[str]:
        """Return the paths (absolute cluster paths) that do not exist, checked in one round trip."""
        if not paths:
            return []
        result = self.run(commands.test_paths(paths), check=True, what="path check")
        return commands.parse_test_paths(result.stdout, paths)

    def write_file(self, path: str, data: bytes, mode: str = "600") -> None:
        """Write ``data`` to ``path`` atomically (temp file + rename) with ``mode``; content goes over stdin."""
        base = commands.trusted_base(path, self.settings.results_dir)
        self.run(commands.write_file_from_stdin(path, mode, base), stdin=data, check=True, what=f"writing {path}")

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """Read at most ``max_bytes`` of a remote text file; None when it does not exist."""
        result = self.run(commands.read_file(path, max_bytes), what=f"reading {path}")
        if result.rc != 0:
            return None
        return result.stdout

    def read_log(self, path: str, offset: int = 0, max_bytes: int = 65536) -> LogChunk:
        """Read a log from a byte offset, at most ``max_bytes``; restarts at 0 if the file shrank.

        A multi-byte UTF-8 character cut by ``max_bytes`` is left for the next read, so joining the
        chunks' ``data`` gives back the file's text exactly.
        """
        _rc, out, _err, _host = self._run_bytes(commands.tail_bytes(path, offset, max_bytes), None, None)
        return _log_chunk(out, offset)

    def tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        """Read what every file appended since its offset, in one round trip (the script goes over stdin).

        :raises RemoteCommandError: when the reading script failed or its answer is incomplete.
        """
        if not requests:
            return []
        script, nonce = tail_script(requests)
        rc, out, err, host = self._run_bytes("sh -s", script.encode(), None)
        return _tail_chunks(rc, out, err, host, len(requests), nonce)

    def read_status_json(self, path: str, max_bytes: int = 1 << 20) -> list[dict[str, Any]] | None:
        """Read TAO ``status.json`` (JSON lines, or one JSON document); None when missing."""
        text = self.read_file(path, max_bytes)
        return None if text is None else parse_status_lines(text)

    # ------------------------------------------------------------------ jobs

    def stage_files(self, base: str, files: Mapping[str, tuple[bytes | None, int]]) -> None:
        """Write several files under ``base`` in one round trip: a tar archive sent over stdin.

        :param files: ``{relative path: (content, mode)}``, content ``None`` for a directory; secrets
            (the sidecar) go here too, never in argv.
        """
        command, archive = _staging(base, files)
        self.run(command, stdin=archive, check=True, what=f"staging files under {base}")

    def submit(
        self,
        script_path: str,
        job_name: str,
        *,
        log_dir: str,
        extra_args: Sequence[str] = (),
        stage: tuple[str, Mapping[str, tuple[bytes | None, int]]] | None = None,
        reconcile_timeout: float = RECONCILE_TIMEOUT_S,
        reconcile_interval: float = RECONCILE_INTERVAL_S,
    ) -> str:
        """Submit a staged batch script once and return its SLURM job id.

        The job is submitted held, its log directory ``<log_dir>/<job_name>-<id>`` created, then
        released (one round trip). When ``sbatch`` answers nothing usable or the connection drops
        after sending, the job may exist: it is looked up by its exact ``job_name`` on every login
        host within ``reconcile_timeout``. Exactly one match is adopted (and released); several
        raise; only when none appears is the script submitted again (once).

        :param stage: ``(base, files)`` as :meth:`stage_files` takes them, staged in the same round
            trip right before sbatch (and again with a second submission).
        :raises SubmissionError: when SLURM refused the job (message has sbatch's reason).
        :raises RemoteCommandError: when staging the files failed (nothing was submitted).
        :raises AmbiguousSubmissionError: when several jobs carry ``job_name``.
        """
        command = commands.sbatch_submit_held(
            script_path,
            log_dir=log_dir,
            job_name=job_name,
            user=self.settings.user,
            base=commands.trusted_base(log_dir, self.settings.results_dir),
            extra_args=extra_args,
        )
        archive = None
        if stage is not None:
            staging, archive = _staging(*stage)
            command = f"{{ {staging}; }} || {{ rc=$?; echo {shlex.quote(STAGING_FAILED)} >&2; exit $rc; }}; {command}"
        job_id = self._sbatch(command, script_path, archive)
        if job_id is not None:
            return job_id
        self.log.warning("sbatch reply for job %s unclear: reconciling by exact job name", job_name)
        found = self.reconcile_by_name(job_name, timeout=reconcile_timeout, interval=reconcile_interval)
        if found is None:
            self.log.warning("job %s not found after %.0f s: submitting it again", job_name, reconcile_timeout)
            found = self._sbatch(command, script_path, archive)
            if found is None:
                raise SubmissionError(
                    f"sbatch gave no job id twice for {job_name}; check the cluster (squeue --name={job_name})"
                )
            return found
        self.prepare_job_logs(log_dir, job_name, found)
        return found

    def prepare_job_logs(self, log_dir: str, job_name: str, job_id: str) -> None:
        """Create the log directory ``<log_dir>/<job_name>-<job_id>`` of an adopted job and release it if held.

        :raises StoragePathError: when another user could plant files in the log tree.
        :raises RemoteCommandError: when that failed.
        """
        base = commands.trusted_base(log_dir, self.settings.results_dir)
        self.run(
            commands.prepare_job_logs(log_dir, job_name, job_id, base), check=True, what="releasing the adopted job"
        )

    def _sbatch(self, command: str, script_path: str, stdin: bytes | None = None) -> str | None:
        try:
            result = self.run(command, stdin=stdin, what="sbatch")
        except ConnectionLostError:
            return None
        if result.rc != 0 and STAGING_FAILED in result.stderr:
            raise RemoteCommandError(
                f"staging the job's files failed on {result.host} with exit status {result.rc}, so nothing was "
                f"submitted: {result.stderr.replace(STAGING_FAILED, '').strip()[-2000:]}",
                rc=result.rc,
                stderr=result.stderr,
            )
        parsed = parse_sbatch_reply(result.stdout)
        concurrent = re.search(r"^#concurrent (\d+) (\d+)$", result.stdout, re.M)
        if concurrent:
            self.log.warning(
                "Another try of this task submitted job %s first: the job just submitted (%s) was cancelled "
                "while held and %s is adopted",
                concurrent.group(2),
                concurrent.group(1),
                concurrent.group(2),
            )
        if result.rc != 0:
            held = f" (job {parsed[0]} exists but is held: scontrol release {parsed[0]})" if parsed else ""
            raise SubmissionError(
                f"sbatch refused {script_path}{held}: {result.stderr.strip()[-2000:]}",
                rc=result.rc,
                stderr=result.stderr,
            )
        return parsed[0] if parsed else None

    def reconcile_by_name(self, job_name: str, *, timeout: float, interval: float) -> str | None:
        """Poll every login host for our jobs named exactly ``job_name`` until one appears or time runs out.

        A lookup that failed is asked again until ``timeout``; only answered lookups can end in "none".

        :raises AmbiguousSubmissionError: when more than one job has that name.
        :raises JobLookupError: when the last lookup before the deadline failed.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                ids = self.find_jobs_by_name(job_name, all_hosts=True)
            except JobLookupError as exc:
                if time.monotonic() >= deadline:
                    raise
                self.log.warning("job lookup failed, asking again: %s", exc)
                time.sleep(interval)
                continue
            if len(ids) > 1:
                raise AmbiguousSubmissionError(
                    f"{len(ids)} jobs are named {job_name} ({', '.join(ids)}); cancel the extra ones with "
                    "scancel before retrying",
                    ids,
                )
            if ids:
                return ids[0]
            if time.monotonic() >= deadline:
                return None
            time.sleep(interval)

    def find_jobs_by_name(
        self, job_name: str, *, all_hosts: bool = False, since: str = DEFAULT_SACCT_WINDOW
    ) -> list[str]:
        """Ids of OUR jobs whose name is exactly ``job_name`` (live in squeue, or finished in sacct).

        Both queries filter by the connection's user on the server side, and every row's owner is
        checked again: another user's job of the same name is never returned (it is logged).

        :param all_hosts: ask every reachable login host, not only the connected one.
        :raises JobLookupError: when a query failed or no login host answered: that is never
            "no such job".
        """
        user = self.settings.user
        command = commands.jobs_by_name(job_name, user, since)
        answers: list[NameLookup] = []
        if all_hosts:
            unreachable: list[str] = []
            for host in self.settings.hosts:
                try:
                    client = self._client if host == self._host and self._client else self._connect(host)
                except SlurmConnectionError as exc:
                    self.log.warning("job lookup: %s", exc)
                    unreachable.append(str(exc))
                    continue
                try:
                    _rc, out, err = _exec_channel(client, command, None, self.settings.cmd_timeout)
                except SlurmConnectionError as exc:
                    self.log.warning("job lookup on %s: %s", host, exc)
                    unreachable.append(f"{host}: {exc}")
                    continue
                finally:
                    if client is not self._client:
                        client.close()
                answers.append(parse_jobs_by_name(out.decode("utf-8", "replace"), user, redact_text(err.decode())))
            if not answers:
                raise JobLookupError(
                    f"no login host answered the lookup of job {job_name} ({'; '.join(unreachable)}); that is not "
                    "'no such job', so nothing is submitted: retry when a login host is reachable",
                    evidence="; ".join(unreachable),
                )
        else:
            result = self.run(command, what="job lookup by name")
            answers.append(parse_jobs_by_name(result.stdout, user, result.stderr))
        seen: dict[str, None] = {}
        for answer in answers:
            for job_id, owner in answer.foreign:
                self.log.warning(
                    "SLURM job %s is also named %s but belongs to %s, not %s: it is left alone",
                    job_id,
                    job_name,
                    owner,
                    user,
                )
            seen.update(dict.fromkeys(answer.job_ids))
        return list(seen)

    def get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        """States of many jobs in at most two queries: squeue for live jobs, sacct for the rest.

        Past :data:`~airflow_provider_tao_slurm.core.commands.IDS_ON_COMMAND_LINE` ids, squeue asks
        for the connection user's jobs (filtered by the server) instead of listing the ids.

        Jobs neither command knows are absent from the result (the caller's grace window decides);
        a job that a failed query could not speak for is never reported absent.

        :raises StatusQueryError: when squeue or sacct failed and some job was answered by neither
            (``states`` has the answered ones).
        """
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        squeue = self.run(commands.squeue_states(ids, self.settings.user), what="squeue")
        rest = _needs_sacct(ids, squeue)
        sacct = self.run(commands.sacct_states(rest, since), what="sacct") if rest else None
        return _combine_poll(ids, squeue, sacct)

    def describe_job(self, slurm_job_id: str) -> dict[str, str]:
        """What slurmctld knows of a job (name, owner, state, log paths); empty once it forgot the job."""
        result = self.run(commands.show_job(slurm_job_id), what="scontrol show job")
        return commands.parse_show_job(result.stdout) if result.rc == 0 else {}

    def cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        """Cancel jobs; unknown or finished jobs are fine. With ``job_name`` only jobs of that name are hit.

        :raises RemoteCommandError: when scancel reports an error (e.g. the controller is down).
        """
        if job_ids:
            _check_scancel(self.run(commands.scancel(job_ids, name=job_name, user=self.settings.user), what="scancel"))

    def partition_limits(self, *, fresh: bool = False) -> list[Partition]:
        """The cluster's partitions (hidden ones too) with their ``MaxTime``, default flag and GPU shape.

        One ``sinfo -a`` answer is kept for :data:`PARTITION_CACHE_S` seconds on shared storage (under
        ``results_dir``) and serves every worker; ``fresh`` asks sinfo again. A partition whose line
        cannot be read is named in a warning and kept with its ``problem``: only a job that asks for
        it is refused.

        :raises RemoteCommandError: when sinfo failed (e.g. the controller is down).
        """
        base = self.settings.results_dir
        cache = f"{base}/.tao-slurm/{PARTITION_CACHE_NAME}" if base else None
        result = self.run(
            commands.sinfo_partitions_cached(cache, 1 if fresh else PARTITION_CACHE_S, base),
            what="reading the partitions",
        )
        if result.rc != 0:
            raise RemoteCommandError(
                f"sinfo failed on {result.host} (exit {result.rc}): {result.stderr.strip()[-500:]}; the partition "
                "limits cannot be checked, so nothing is submitted: check that slurmctld is up (scontrol ping)",
                rc=result.rc,
                stderr=result.stderr,
            )
        partitions, unreadable = parse_sinfo_partitions(result.stdout)
        for partition in partitions:
            if partition.problem is not None:
                self.log.warning(
                    "Partition %s on cluster %s cannot be read (%s); jobs on other partitions are not affected",
                    partition.name,
                    self.settings.cluster_name,
                    partition.problem,
                )
        for line in unreadable:
            self.log.warning("sinfo printed %r, which names no partition; the line is ignored", line)
        return partitions

    def install_enroot_credentials(self, registry: str, password: str, login: str = "$oauthtoken") -> None:
        """Install Enroot credentials for ``registry`` (mode 600) from a secret sent over stdin only."""
        for machine in commands.enroot_credential_machines(registry):
            self.run(
                commands.install_enroot_credentials(machine, login),
                stdin=password.encode(),
                check=True,
                what=f"installing Enroot credentials for {machine}",
            )

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's "Test connection": login, the SLURM tools and the shared directory."""
        try:
            tools = ("sbatch", "squeue", "sacct", "scancel", "srun", "sinfo")
            result = self.run(commands.which(tools), what="tool check")
            missing = commands.parse_which(result.stdout, tools)
            problems = [
                f"{tool} not found on {self._host}; install the SLURM client tools or put them on the PATH of "
                "non-interactive shells"
                for tool in missing
            ]
            results_dir = self.settings.results_dir
            if results_dir:
                probe = self.run(commands.writable_dir(results_dir), what="results dir check")
                if probe.rc != 0:
                    problems.append(
                        f"results_dir {results_dir} is not writable by {self.settings.user} on {self._host}; "
                        "create it or set the results_dir extra to a writable shared directory"
                    )
        except Exception as exc:
            return False, redact_text(str(exc))
        if problems:
            return False, "; ".join(problems)
        where = f"; results_dir {results_dir} is writable" if results_dir else ""
        return True, f"connected to {self._host} as {self.settings.user}; found {', '.join(tools)}{where}"

    # ------------------------------------------------------------------ async twins (triggers)

    async def a_run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Async twin of :meth:`run` over the process-wide pooled connection.

        :raises ConnectionLostError: when the connection dropped after the command was sent (it is
            never sent again: it may have taken effect).
        """
        rc, out, err, host = await self._a_run_bytes(command, stdin, timeout)
        return _result(rc, out, err, host)

    async def _a_run_bytes(
        self, command: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes, str]:
        settings = await self.a_settings()
        return await _ASYNC_POOL.run(settings, command, stdin, settings.cmd_timeout if timeout is None else timeout)

    async def a_settings(self) -> ClusterSettings:
        """Settings read with the async connection API (safe inside the triggerer's event loop), read once.

        :raises ConnectionConfigError: as :attr:`settings`.
        """
        if self._explicit_settings is not None:
            return self._explicit_settings
        if self._async_settings is not None:
            return self._async_settings
        from airflow.providers.common.compat.connection import get_async_connection, get_async_extra_dejson

        try:
            conn = await get_async_connection(self.slurm_conn_id)
        except AirflowNotFoundException:
            self._async_settings = self._settings_without_connection()
            return self._async_settings
        extra = await get_async_extra_dejson(conn)
        self._async_settings = settings_from_connection(
            host=conn.host,
            login=conn.login,
            port=conn.port,
            extra=extra,
            source=f"connection {self.slurm_conn_id!r}",
        )
        return self._async_settings

    async def a_get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        """Async twin of :meth:`get_states`."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        squeue = await self.a_run(commands.squeue_states(ids, (await self.a_settings()).user))
        rest = _needs_sacct(ids, squeue)
        sacct = await self.a_run(commands.sacct_states(rest, since)) if rest else None
        return _combine_poll(ids, squeue, sacct)

    async def a_accounting_states(
        self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW
    ) -> dict[str, JobState]:
        """Accounting's word on many jobs in one ``sacct`` (slurmdbd; slurmctld is not asked).

        The shared poller confirms end markers with it: the state of a job that accounting shows
        ended is the state the record settles on.

        :raises RemoteCommandError: when sacct failed (e.g. slurmdbd is down).
        """
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        result = await self.a_run(commands.sacct_states(ids, since))
        if result.rc != 0:
            raise RemoteCommandError(
                f"sacct failed on {result.host} (exit {result.rc}): {result.stderr.strip()[-300:]}",
                rc=result.rc,
                stderr=result.stderr,
            )
        return {job_id: state for job_id, state in parse_sacct(result.stdout).items() if job_id in ids}

    async def a_read_log(self, path: str, offset: int = 0, max_bytes: int = 65536) -> LogChunk:
        """Async twin of :meth:`read_log`."""
        _rc, out, _err, _host = await self._a_run_bytes(commands.tail_bytes(path, offset, max_bytes), None, None)
        return _log_chunk(out, offset)

    async def a_tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        """Async twin of :meth:`tail_many` (the shared poller reads every watched job's logs with it)."""
        if not requests:
            return []
        script, nonce = tail_script(requests)
        rc, out, err, host = await self._a_run_bytes("sh -s", script.encode(), None)
        return _tail_chunks(rc, out, err, host, len(requests), nonce)

    async def a_end_markers(self, since: Mapping[str, float]) -> list[commands.EndMarker]:
        """The end markers in each ends directory modified after ``since[directory]``, in one command.

        :raises RemoteCommandError: when the listing failed (the poller tries again at its next read).
        """
        if not since:
            return []
        result = await self.a_run(commands.end_markers(since))
        if result.rc != 0:
            raise RemoteCommandError(
                f"listing the end markers failed on {result.host} (exit {result.rc}): {result.stderr.strip()[-300:]}",
                rc=result.rc,
                stderr=result.stderr,
            )
        return commands.parse_end_markers(result.stdout, list(since))

    async def a_cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        """Async twin of :meth:`cancel`."""
        if job_ids:
            user = (await self.a_settings()).user
            _check_scancel(await self.a_run(commands.scancel(job_ids, name=job_name, user=user)))

    async def a_read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """Async twin of :meth:`read_file`."""
        result = await self.a_run(commands.read_file(path, max_bytes))
        return result.stdout if result.rc == 0 else None

    async def a_write_file(self, path: str, data: bytes, mode: str = "600") -> None:
        """Async twin of :meth:`write_file` (content over stdin).

        :raises RemoteCommandError: when the write failed.
        """
        base = commands.trusted_base(path, (await self.a_settings()).results_dir)
        result = await self.a_run(commands.write_file_from_stdin(path, mode, base), stdin=data)
        if result.rc != 0:
            raise RemoteCommandError(
                f"writing {path} failed on {result.host} with exit status {result.rc}: {result.stderr.strip()[-2000:]}",
                rc=result.rc,
                stderr=result.stderr,
            )


# ---------------------------------------------------------------------- helpers shared by both sides


def _staging(base: str, files: Mapping[str, tuple[bytes | None, int]]) -> tuple[str, bytes]:
    """The command that unpacks ``files`` under ``base`` and the tar archive it reads on stdin."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, (content, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.mode = mode
            info.mtime = int(time.time())
            if content is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    command = commands.extract_tar(
        base,
        [name for name, (content, _mode) in files.items() if content is not None],
        [name for name, (content, _mode) in files.items() if content is None],
    )
    return command, buffer.getvalue()


def _result(rc: int, out: bytes, err: bytes, host: str) -> CommandResult:
    """A command's result, its stderr redacted.

    :raises StoragePathError: for a command that :func:`~airflow_provider_tao_slurm.core.commands.secure_dirs`
        stopped: nothing was written (or submitted) after the check.
    """
    stderr = redact_text(err.decode("utf-8", "replace"))
    unsafe = commands.UNSAFE_PATH_RE.search(stderr) if rc == commands.UNSAFE_PATH_STATUS else None
    if unsafe is not None:
        path, reason = unsafe.groups()
        raise StoragePathError(
            f"{path} {reason} on {host}, so another user could plant links or files where this task writes "
            "(secrets, records, scripts); nothing was written or submitted. Make every directory from results_dir "
            f"down yours and writable by you only (e.g. chmod go-w -- {shlex.quote(path)}, or remove a planted "
            "link), or set the connection's results_dir to a directory only you can write"
        )
    return CommandResult(rc, out.decode("utf-8", "replace"), stderr, host)


def _utf8_complete(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary (drops a cut-off character)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # ASCII or the lead byte of a multi-byte character
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


def _log_chunk(stdout: bytes, offset: int) -> LogChunk:
    """Parse ``tail_bytes`` output; a character cut at the end waits for the next read (unless nothing else fits)."""
    header, newline, body = stdout.partition(b"\n")
    chunk = commands.parse_tail((header + newline).decode("utf-8", "replace"))
    body = body[: chunk.length]
    keep = _utf8_complete(body) or len(body)
    next_offset, restarted = commands.next_offset(offset, chunk.size, keep)
    return LogChunk(
        size=chunk.size or 0,
        data=body[:keep].decode("utf-8", "replace"),
        next_offset=next_offset,
        restarted=restarted,
    )


def _tail_chunks(rc: int, out: bytes, err: bytes, host: str, count: int, nonce: str) -> list[TailChunk]:
    """Parse a batched log read; a failed shell is an error, not "no new lines"."""
    if rc != 0:
        stderr = redact_text(err.decode("utf-8", "replace"))
        raise RemoteCommandError(
            f"log read on {host} exited {rc}: {stderr.strip()[-500:]}; it is read again next poll",
            rc=rc,
            stderr=stderr,
        )
    return parse_tail_output(out, count, nonce)


def _check_scancel(result: CommandResult) -> None:
    """Accept ``scancel -Q``'s silent exit 1 (a name filter matched no live job: finished, unknown or not ours).

    :raises RemoteCommandError: when scancel printed an error.
    """
    if result.rc != 0 and result.stderr.strip():
        raise RemoteCommandError(
            f"scancel failed on {result.host} with exit status {result.rc}: {result.stderr.strip()[-2000:]}; "
            "check that slurmctld is up (scontrol ping) and cancel again",
            rc=result.rc,
            stderr=result.stderr,
        )


def _needs_sacct(ids: list[str], squeue: CommandResult) -> list[str]:
    """The ids squeue did not answer for (or saw finish): sacct has their final state and exit code."""
    live = parse_squeue(squeue.stdout) if squeue.rc == 0 else {}
    return [i for i in ids if i not in live or live[i].is_terminal]


def _combine_poll(ids: Sequence[str], squeue: CommandResult, sacct: CommandResult | None) -> dict[str, JobState]:
    """Merge one squeue and one sacct answer; squeue wins for live jobs, sacct fills in the rest.

    A failed query is not an answer: when squeue or sacct failed, every job that the other did not
    answer for is "unanswered", never "not found". squeue's "Invalid job id specified" (asked about
    one id it does not know) is an answer: not in the queue.

    :raises StatusQueryError: when some job was left unanswered (e.g. controller or accounting down).
    """
    wanted = set(ids)
    live = parse_squeue(squeue.stdout) if squeue.rc == 0 else {}
    finished = parse_sacct(sacct.stdout) if sacct is not None and sacct.rc == 0 else {}
    states = {job_id: state for job_id, state in merge_states(live, finished).items() if job_id in wanted}
    squeue_failed = squeue.rc != 0 and SQUEUE_UNKNOWN_JOB not in squeue.stderr
    failures = [f"squeue exited {squeue.rc}: {squeue.stderr.strip()[-300:]}"] if squeue_failed else []
    if sacct is not None and sacct.rc != 0:
        failures.append(f"sacct exited {sacct.rc}: {sacct.stderr.strip()[-300:]}")
    unanswered = [job_id for job_id in ids if job_id not in states] if failures else []
    if unanswered:
        evidence = "; ".join(failures)
        raise StatusQueryError(
            f"{len(unanswered)} of {len(ids)} job(s) unanswered on {squeue.host} ({evidence}); they are not taken "
            "as gone: check that slurmctld and slurmdbd are up (scontrol ping)",
            states,
            unanswered,
            evidence=evidence,
        )
    return states


def _exec_channel(
    client: paramiko.SSHClient, command: str, stdin: bytes | None, timeout: float | None
) -> tuple[int, bytes, bytes]:
    """Run one command on a new channel of ``client``; returns ``(rc, stdout, stderr)`` as raw bytes.

    :raises ConnectionLostError: when the channel closes without an exit status.
    :raises RemoteCommandError: when the command does not finish within ``timeout``.
    """
    import paramiko

    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise ConnectionLostError("the SSH connection is closed")
    try:
        channel = transport.open_session(timeout=timeout)
        channel.exec_command(command)
        if stdin:
            channel.sendall(stdin)
        channel.shutdown_write()
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise ConnectionLostError(f"the SSH connection dropped while sending a command: {exc}") from None
    out, err = bytearray(), bytearray()
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(channel, selectors.EVENT_READ)
        while True:
            while channel.recv_ready():
                out += channel.recv(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            if channel.exit_status_ready() and channel.eof_received:
                break
            if channel.closed or not transport.is_active():
                if channel.exit_status_ready():
                    break
                raise ConnectionLostError("the SSH connection dropped before the command's reply arrived")
            if deadline is not None and time.monotonic() > deadline:
                channel.close()
                raise RemoteCommandError(f"remote command did not finish within {timeout:.0f} s")
            selector.select(0.5)
    while channel.recv_ready():  # output that arrived together with the EOF
        out += channel.recv(65536)
    while channel.recv_stderr_ready():
        err += channel.recv_stderr(65536)
    rc = channel.recv_exit_status()
    channel.close()
    if rc == -1:
        raise ConnectionLostError("the remote command ended without an exit status (connection cut)")
    return rc, bytes(out), bytes(err)


@dataclass
class _Pooled:
    """One cluster account's pooled connection in one event loop."""

    lock: asyncio.Lock
    sessions: asyncio.Semaphore
    conn: asyncssh.SSHClientConnection | None = None


class _AsyncConnectionPool:
    """One asyncssh connection per (cluster account, event loop), shared by all triggers of a process.

    Entries are kept per event-loop object (weakly), so a new loop never inherits a closed loop's
    connection, lock or semaphore.
    """

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[str, tuple[str, ...], int], _Pooled]
        ]
        self._loops = weakref.WeakKeyDictionary()
        #: connections opened since start (benchmarks and tests read it)
        self.opened = 0

    def _entry(self, s: ClusterSettings) -> _Pooled:
        entries = self._loops.setdefault(asyncio.get_running_loop(), {})
        key = (s.pool_key, s.hosts, s.port)
        if key not in entries:
            entries[key] = _Pooled(asyncio.Lock(), asyncio.Semaphore(ASYNC_MAX_SESSIONS))
        return entries[key]

    async def connection(self, s: ClusterSettings) -> asyncssh.SSHClientConnection:
        entry = self._entry(s)
        async with entry.lock:
            if entry.conn is not None and not entry.conn.is_closed():
                return entry.conn
            entry.conn = await _async_connect(s)
            self.opened += 1
            return entry.conn

    async def run(
        self, s: ClusterSettings, command: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes, str]:
        """Run ``command``; return the exit status, raw stdout and stderr, and the host used.

        Only a session that could not be opened (the command never started) is retried, on a fresh
        connection with backoff; a command cut off after it started is never sent again.

        :raises ConnectionLostError: when the connection dropped while the command ran, or kept
            dropping before it could start.
        :raises RemoteCommandError: when the command does not finish within ``timeout``.
        """
        import asyncssh

        delay = 0.5
        for attempt in range(4):
            conn = await self.connection(s)
            async with self._entry(s).sessions:
                try:
                    process = await conn.create_process(command, input=stdin, encoding=None)
                except (OSError, asyncssh.Error) as exc:
                    conn.close()
                    failure = exc
                else:
                    return await _finish(process, timeout, getattr(conn, "_tao_host", ""))
            if attempt == 3:
                raise ConnectionLostError(f"the SSH connection to {s.cluster_name} keeps dropping: {failure}")
            await asyncio.sleep(delay + random.uniform(0, delay))  # noqa: S311 - jitter, not crypto
            delay *= 2
        raise AssertionError("unreachable")

    async def close_all(self) -> None:
        """Close every pooled connection of the running loop (tests, benchmarks)."""
        for entry in self._loops.pop(asyncio.get_running_loop(), {}).values():
            if entry.conn is not None:
                entry.conn.close()


async def _finish(
    process: asyncssh.SSHClientProcess[bytes], timeout: float | None, host: str
) -> tuple[int, bytes, bytes, str]:
    """Wait for a started remote command: ``(rc, stdout, stderr, host)``; a lost connection is an error."""
    try:
        async with asyncio.timeout(timeout):
            result = await process.wait()
    except TimeoutError:
        process.close()
        raise RemoteCommandError(f"remote command did not finish within {timeout} s on {host}") from None
    if result.exit_status is None and result.exit_signal is None:
        raise ConnectionLostError(
            f"the SSH connection to {host} dropped before the command's reply arrived; it may or may not have "
            "taken effect"
        )
    rc = result.exit_status if result.exit_status is not None else -1
    return rc, _raw(result.stdout), _raw(result.stderr), host


def _raw(data: bytes | str | None) -> bytes:
    if isinstance(data, str):
        return data.encode()
    return data or b""


async def _async_connect(s: ClusterSettings) -> asyncssh.SSHClientConnection:
    import asyncssh

    # asyncssh logs every channel and command at INFO: it would bury the trigger's own lines in the task log.
    asyncssh.set_log_level(logging.WARNING)
    if s.key_file:
        check_key_file(s.key_file)
    failures: list[tuple[str, str]] = []
    kinds: set[type[SlurmConnectionError]] = set()
    for host in s.hosts:
        options: dict[str, Any] = {"username": s.user, "port": s.port, "connect_timeout": s.conn_timeout}
        if s.proxy_command:
            options["proxy_command"] = proxy_argv(s.proxy_command, host, s.port, s.user)
        if s.key_file:
            options["client_keys"] = [s.key_file]
        elif s.private_key:
            options["client_keys"] = [asyncssh.import_private_key(s.private_key, s.private_key_passphrase)]
        if s.no_host_key_check:
            options["known_hosts"] = None
        elif s.host_key:
            pinned = _pinned_host_key(s.host_key)
            entry = host if s.port == 22 else f"[{host}]:{s.port}"
            options["known_hosts"] = asyncssh.import_known_hosts(f"{entry} {pinned.get_name()} {pinned.get_base64()}\n")
        try:
            conn = await asyncssh.connect(host, keepalive_interval=30, **options)
        except (OSError, asyncssh.Error) as exc:
            message, kind = _describe_connect_error(host, s.port, exc, timeout=s.conn_timeout, pinned=bool(s.host_key))
            failures.append((host, message))
            kinds.add(kind)
            log.warning("Login host failed, trying the next one: %s", message)
            continue
        if failures:
            log.warning("Connected to %s after %d failed login host(s)", host, len(failures))
        conn._tao_host = host  # type: ignore[attr-defined]
        return conn
    raise _no_host_answered(s.cluster_name, failures, kinds)


_ASYNC_POOL = _AsyncConnectionPool()


def async_pool() -> _AsyncConnectionPool:
    """The process-wide async connection pool (shared by every trigger in a triggerer)."""
    return _ASYNC_POOL
