"""Fast tests of ``SlurmHook`` that need no cluster: settings, key checks, error texts, output parsing.

Everything that talks SSH is covered by ``tests/cluster/test_hook.py`` against the real test cluster.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import subprocess
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncssh
import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.logstream import TailChunk
from airflow_provider_tao_slurm.core.states import TaoState
from airflow_provider_tao_slurm.exceptions import (
    CommandTimeoutError,
    ConnectionConfigError,
    ConnectionLostError,
    HostKeyError,
    JobLookupError,
    KeyFilePermissionError,
    RemoteCommandError,
    RemoteReadError,
    SlurmAuthenticationError,
    SlurmConnectionError,
    StatusQueryError,
    StoragePathError,
    SubmissionError,
    SubmissionOutcomeUnknownError,
)
from airflow_provider_tao_slurm.hooks.failover import _describe_connect_error, _no_host_answered
from airflow_provider_tao_slurm.hooks.options import _pinned_host_key, check_key_file
from airflow_provider_tao_slurm.hooks.replies import (
    CommandResult,
    _check_scancel,
    _combine_poll,
    _log_chunk,
    _needs_sacct,
    _utf8_complete,
)
from airflow_provider_tao_slurm.hooks.slurm import STAGING_FAILED, LogChunk, SlurmHook
from airflow_provider_tao_slurm.hooks.transport import _send_without_delay

HOST_KEY = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
SLURM_VARS = (
    "SLURM_USER",
    "SLURM_HOSTNAME",
    "SSH_KEY_PATH",
    "SLURM_PARTITION",
    "SLURM_ACCOUNT",
    "SLURM_BASE_RESULTS_DIR",
    "SLURM_CONTAINER_MOUNTS",
)

if TYPE_CHECKING:
    from conftest import HeldSubmission


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``SLURM_*`` variable or test connection leaks in from the caller's environment."""
    for name in (*SLURM_VARS, "AIRFLOW_CONN_UNIT_SLURM"):
        monkeypatch.delenv(name, raising=False)


def settings(**changes: Any) -> ClusterSettings:
    """Settings for an unreachable documentation host, with ``changes`` applied."""
    values: dict[str, Any] = {"hosts": ("login1.example.org",), "user": "alice", "cluster_name": "unit"}
    return ClusterSettings(**{**values, **changes})


# ---------------------------------------------------------------------- settings


CONNECTION = {
    "conn_type": "tao_slurm",
    "host": "login1.example.org, login2.example.org",
    "login": "alice",
    "port": 2222,
    "extra": {
        "key_file": "/home/alice/.ssh/id_ed25519",
        "host_key": HOST_KEY,
        "partition": "polar,grizzly",
        "account": "gpu_proj",
        "results_dir": "/lustre/alice",
        "cluster_name": "polaris",
    },
}
FROM_CONNECTION = ClusterSettings(
    hosts=("login1.example.org", "login2.example.org"),
    user="alice",
    port=2222,
    key_file="/home/alice/.ssh/id_ed25519",
    host_key=HOST_KEY,
    partitions=("polar", "grizzly"),
    account="gpu_proj",
    results_dir="/lustre/alice",
    cluster_name="polaris",
)
ENVIRONMENT = {
    "SLURM_HOSTNAME": "login1.example.org,login2.example.org",
    "SLURM_USER": "alice",
    "SSH_KEY_PATH": "/home/alice/.ssh/id_ed25519",
    "SLURM_PARTITION": "polar",
    "SLURM_ACCOUNT": "gpu_proj",
    "SLURM_BASE_RESULTS_DIR": "/lustre/alice",
    "SLURM_CONTAINER_MOUNTS": "/lustre:/lustre",
}
FROM_ENVIRONMENT = ClusterSettings(
    hosts=("login1.example.org", "login2.example.org"),
    user="alice",
    key_file="/home/alice/.ssh/id_ed25519",
    partitions=("polar",),
    account="gpu_proj",
    results_dir="/lustre/alice",
    container_mounts="/lustre:/lustre",
    cluster_name="login1.example.org",
)


@pytest.mark.parametrize(
    ("connection", "environment", "expected"),
    [
        (CONNECTION, {}, FROM_CONNECTION),
        (CONNECTION, ENVIRONMENT, FROM_CONNECTION),
        (None, ENVIRONMENT, FROM_ENVIRONMENT),
    ],
    ids=["connection", "connection-wins-over-environment", "environment-without-connection"],
)
@pytest.mark.parametrize("side", ["sync", "async"])
def test_settings_come_from_the_connection_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    connection: dict[str, Any] | None,
    environment: dict[str, str],
    expected: ClusterSettings,
    side: str,
) -> None:
    if connection is not None:
        monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", json.dumps(connection))
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    hook = SlurmHook()  # the SLURM_* variables stand in for the default connection only
    got = hook.settings if side == "sync" else asyncio.run(hook.a_settings())
    assert got == expected


@pytest.mark.parametrize("side", ["sync", "async"])
def test_missing_connection_and_environment_says_what_to_create(side: str) -> None:
    hook = SlurmHook()
    with pytest.raises(ConnectionConfigError) as caught:
        _ = hook.settings if side == "sync" else asyncio.run(hook.a_settings())
    assert str(caught.value) == (
        "no Airflow connection 'slurm_default' and SLURM_HOSTNAME is not set: create a 'tao_slurm' connection or "
        "export SLURM_HOSTNAME, SLURM_USER and SSH_KEY_PATH"
    )


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_named_connection_that_does_not_exist_never_falls_back_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    hook = SlurmHook("unit_slurm_typo")
    with pytest.raises(ConnectionConfigError, match="connection 'unit_slurm_typo' does not exist") as caught:
        _ = hook.settings if side == "sync" else asyncio.run(hook.a_settings())
    assert "stand in for 'slurm_default' only" in str(caught.value)


def test_invalid_connection_names_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_UNIT_SLURM", json.dumps({**CONNECTION, "login": ""}))
    with pytest.raises(ConnectionConfigError, match=r"^connection 'unit_slurm' is not usable: no SLURM user"):
        _ = SlurmHook("unit_slurm").settings


@pytest.mark.parametrize("side", ["sync", "async"])
def test_explicit_settings_skip_the_lookup(side: str) -> None:
    explicit = settings()
    hook = SlurmHook("no_such_connection", settings=explicit)
    assert (hook.settings if side == "sync" else asyncio.run(hook.a_settings())) is explicit


def test_async_settings_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_UNIT_SLURM", json.dumps(CONNECTION))
    hook = SlurmHook("unit_slurm")
    first = asyncio.run(hook.a_settings())
    monkeypatch.delenv("AIRFLOW_CONN_UNIT_SLURM")
    assert asyncio.run(hook.a_settings()) is first


def _counting_connection_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the async connection reads (the triggerer's supervisor round trips) of the hooks."""
    from airflow.providers.common.compat import connection as compat

    reads: list[str] = []
    real = compat.get_async_connection

    async def counting(conn_id: str) -> Any:
        reads.append(conn_id)
        await asyncio.sleep(0.01)  # a supervisor round trip: the other triggers start meanwhile
        return await real(conn_id)

    monkeypatch.setattr(compat, "get_async_connection", counting)
    return reads


def test_hooks_of_one_event_loop_share_a_connection_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of triggers starting together: one read of their connection in flight, shared by every hook."""
    monkeypatch.setenv("AIRFLOW_CONN_UNIT_SLURM", json.dumps(CONNECTION))
    reads = _counting_connection_reads(monkeypatch)

    async def many() -> list[ClusterSettings]:
        return list(await asyncio.gather(*(SlurmHook("unit_slurm").a_settings() for _ in range(300))))

    got = asyncio.run(many())
    assert reads == ["unit_slurm"]
    assert {id(one) for one in got} == {id(got[0])}
    assert got[0].user == CONNECTION["login"]


def test_a_finished_read_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection edited between two hooks of one event loop (a re-pinned host key): the second sees the edit."""
    monkeypatch.setenv("AIRFLOW_CONN_UNIT_SLURM", json.dumps(CONNECTION))
    reads = _counting_connection_reads(monkeypatch)

    async def before_and_after_an_edit() -> tuple[ClusterSettings, ClusterSettings]:
        first = await SlurmHook("unit_slurm").a_settings()
        monkeypatch.setenv("AIRFLOW_CONN_UNIT_SLURM", json.dumps({**CONNECTION, "login": "bob"}))
        return first, await SlurmHook("unit_slurm").a_settings()

    first, second = asyncio.run(before_and_after_an_edit())
    assert (first.user, second.user, len(reads)) == (CONNECTION["login"], "bob", 2)


def test_a_failed_read_is_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection missing at the first read and created before the next: the next hook reads it afresh."""

    async def before_and_after() -> ClusterSettings:
        with pytest.raises(ConnectionConfigError, match="connection 'unit_slurm' does not exist"):
            await SlurmHook("unit_slurm").a_settings()
        monkeypatch.setenv("AIRFLOW_CONN_UNIT_SLURM", json.dumps(CONNECTION))
        return await SlurmHook("unit_slurm").a_settings()

    assert asyncio.run(before_and_after()).user == CONNECTION["login"]


# ---------------------------------------------------------------------- private key file


@pytest.mark.parametrize(
    ("mode", "refused"),
    [
        (0o600, False),
        (0o400, False),
        (0o700, False),
        (0o640, True),
        (0o644, True),
        (0o604, True),
        (0o660, True),
        (0o610, True),
        (0o601, True),
    ],
    ids=lambda value: f"{value:o}" if isinstance(value, int) and not isinstance(value, bool) else str(value),
)
def test_key_file_readable_by_group_or_others_is_refused(tmp_path: Path, mode: int, refused: bool) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("not really a key\n")
    key.chmod(mode)
    if not refused:
        check_key_file(str(key))
        return
    with pytest.raises(KeyFilePermissionError) as caught:
        check_key_file(str(key))
    assert str(caught.value) == (
        f"SSH key file {str(key)!r} is accessible by group or others (mode {mode:o}); run: chmod 600 {key}"
    )


def test_missing_key_file_names_the_settings_to_fix(tmp_path: Path) -> None:
    with pytest.raises(KeyFilePermissionError, match=r"does not exist: fix key_file \(or SSH_KEY_PATH\)$"):
        check_key_file(str(tmp_path / "absent"))


@pytest.fixture
def quiet_listener() -> Any:
    """A local listener standing in for a login host; nothing must connect to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        yield server


@pytest.mark.parametrize("side", ["sync", "async"])
def test_open_key_file_is_refused_before_any_connection(tmp_path: Path, quiet_listener: Any, side: str) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("not really a key\n")
    key.chmod(0o644)
    hook = SlurmHook(settings=settings(hosts=("127.0.0.1",), port=quiet_listener.getsockname()[1], key_file=str(key)))
    with pytest.raises(KeyFilePermissionError, match="chmod 600"):
        hook.run("true") if side == "sync" else asyncio.run(hook.a_run("true"))
    with pytest.raises(BlockingIOError):
        quiet_listener.accept()


# ---------------------------------------------------------------------- Nagle


class _Client:
    """The one thing ``_send_without_delay`` asks of a paramiko client: its transport's ``sock``."""

    def __init__(self, sock: object) -> None:
        self.transport = type("Transport", (), {"sock": sock})()

    def get_transport(self) -> Any:
        return self.transport


def test_nagle_is_turned_off_on_a_tcp_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        _send_without_delay(_Client(sock))  # type: ignore[arg-type]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_connection_without_a_tcp_socket_of_ours_is_left_alone() -> None:
    proxy = paramiko.ProxyCommand("cat")
    left, right = socket.socketpair()
    try:
        for sock in (proxy, left, None):
            _send_without_delay(_Client(sock))  # type: ignore[arg-type]
    finally:
        proxy.close()
        left.close()
        right.close()


# ---------------------------------------------------------------------- pinned host key


def test_pinned_host_key_accepts_a_known_hosts_key_with_comment() -> None:
    key = _pinned_host_key(f"  {HOST_KEY} admin@cluster  ")
    assert f"{key.get_name()} {key.get_base64()}" == HOST_KEY


@pytest.mark.parametrize(
    ("host_key", "problem"),
    [
        (HOST_KEY.split()[1], "host_key type 'AAAAC3NzaC1lZDI1NTE5"),
        ("ssh-dss AAAAB3NzaC1kc3M=", "host_key type 'ssh-dss' is not one of ssh-rsa,"),
        ("ssh-ed25519", "host_key is not a valid ssh-ed25519 key"),
        ("ssh-ed25519 not*base64", "host_key is not a valid ssh-ed25519 key"),
        (f"ssh-rsa {HOST_KEY.split()[1]}", "host_key is not a valid ssh-rsa key"),
    ],
    ids=["no-type", "dss", "no-key", "not-base64", "type-mismatch"],
)
def test_bad_pinned_host_key_is_a_configuration_error(host_key: str, problem: str) -> None:
    with pytest.raises(ConnectionConfigError) as caught:
        _pinned_host_key(host_key)
    assert str(caught.value).startswith(problem)
    assert str(caught.value).endswith(
        "copy the '<type> <base64>' part of the host's line from `ssh-keyscan -p PORT HOST`"
    )


# ---------------------------------------------------------------------- connection errors


def _refused() -> ConnectionRefusedError:
    return ConnectionRefusedError(111, "Connect call failed ('10.0.0.1', 22)")


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (
            paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.1", 22): _refused()}),
            SlurmConnectionError,
            "login1 port 22 unreachable (Connection refused); check the host name and port, and that sshd runs there",
        ),
        (
            _refused(),
            SlurmConnectionError,
            "login1 port 22 unreachable (Connection refused); check the host name and port, and that sshd runs there",
        ),
        (
            TimeoutError("timed out"),
            SlurmConnectionError,
            "login1 port 22 unreachable (timed out); check the host name and port, and that sshd runs there",
        ),
        (
            paramiko.SSHException("Server '[login1]:22' not found in known_hosts"),
            HostKeyError,
            "host key of login1 is not trusted (Server '[login1]:22' not found in known_hosts); pin it with the "
            "connection's host_key extra (ssh-keyscan shows it) or add it to ~/.ssh/known_hosts",
        ),
        (
            asyncssh.HostKeyNotVerifiable("Host key is not trusted for host login1"),
            HostKeyError,
            "host key of login1 is not trusted (Host key is not trusted for host login1); pin it with the "
            "connection's host_key extra (ssh-keyscan shows it) or add it to ~/.ssh/known_hosts",
        ),
        (
            paramiko.AuthenticationException("Authentication failed."),
            SlurmAuthenticationError,
            "login1 refused the key (Authentication failed.); check the user and that the key is authorised",
        ),
        (
            asyncssh.PermissionDenied("Permission denied for user alice on host login1"),
            SlurmAuthenticationError,
            "login1 refused the key (Permission denied for user alice on host login1); check the user and that "
            "the key is authorised",
        ),
    ],
    ids=["paramiko-refused", "asyncssh-refused", "timeout", "unknown-key", "async-unknown-key", "auth", "async-auth"],
)
def test_connect_errors_say_why_and_what_to_do(error: BaseException, kind: type, message: str) -> None:
    assert _describe_connect_error("login1", 22, error) == (message, kind)


def test_changed_host_key_warns_of_interception() -> None:
    pinned = _pinned_host_key(HOST_KEY)
    offered = _pinned_host_key(
        Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    )
    message, kind = _describe_connect_error("login1", 22, paramiko.BadHostKeyException("login1", offered, pinned))
    assert kind is HostKeyError
    assert message.startswith("host key of login1 CHANGED (")
    assert message.endswith("otherwise someone may be intercepting the connection")


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        ({HostKeyError}, HostKeyError),
        ({SlurmConnectionError}, SlurmConnectionError),
        ({HostKeyError, SlurmAuthenticationError}, SlurmConnectionError),
    ],
    ids=["all-host-key", "all-unreachable", "mixed"],
)
def test_failover_error_keeps_a_common_class_and_every_failure(
    kinds: set[type[SlurmConnectionError]], expected: type
) -> None:
    failures = [("a", "a port 22 unreachable (Connection refused)"), ("b", "host key of b is not trusted")]
    error = _no_host_answered("polaris", failures, set(kinds))
    assert type(error) is expected
    assert error.failures == failures
    assert str(error) == (
        "no login host of cluster 'polaris' answered: a port 22 unreachable (Connection refused); "
        "host key of b is not trusted"
    )


# ---------------------------------------------------------------------- status.json, logs, results


@pytest.mark.parametrize(
    ("rc", "stdout", "expected"),
    [
        (commands.MISSING_FILE_STATUS, "", None),
        (0, "", []),
        (0, '{"status": "STARTED"}\n{"status": "SUCCESS"}\n', [{"status": "STARTED"}, {"status": "SUCCESS"}]),
        (0, '{"status": "SUCCESS", "message": "done"}', [{"status": "SUCCESS", "message": "done"}]),
        (0, '[{"status": "RUNNING"}, 3]', [{"status": "RUNNING"}]),
        (0, 'junk\n{"status": "FAILURE"}\n{"cut', [{"status": "FAILURE"}]),
    ],
    ids=["missing", "empty", "json-lines", "one-document", "list-document", "junk-lines-skipped"],
)
def test_read_status_json(
    monkeypatch: pytest.MonkeyPatch, rc: int, stdout: str, expected: list[dict[str, Any]] | None
) -> None:
    hook = SlurmHook(settings=settings())
    sent: list[str] = []

    def run(command: str, **_: Any) -> CommandResult:
        sent.append(command)
        return CommandResult(rc, stdout, "")

    monkeypatch.setattr(hook, "run", run)
    assert hook.read_status_json("/lustre/alice/job/status.json") == expected
    assert sent == [commands.read_file("/lustre/alice/job/status.json", 1 << 20)]


EIO = "head: error reading '/lustre/alice/job/status.json': Input/output error"


def call(hook: SlurmHook, method: str, *args: Any) -> Any:
    """``hook.<method>(*args)``, run to its end when it is an async twin (``a_...``)."""
    outcome = getattr(hook, method)(*args)
    return asyncio.run(outcome) if method.startswith("a_") else outcome


@pytest.mark.parametrize(
    ("rc", "stderr"),
    [(1, EIO), (1, "head: cannot open 'x' for reading: Permission denied"), (137, ""), (-1, "")],
    ids=["eio", "permission", "killed", "no-exit-status"],
)
@pytest.mark.parametrize("read", ["read_file", "a_read_file", "read_status_json"])
def test_a_failed_read_raises_and_is_never_no_file(
    monkeypatch: pytest.MonkeyPatch, rc: int, stderr: str, read: str
) -> None:
    hook = SlurmHook(settings=settings())
    answer = (rc, b"", stderr.encode(), "login1")

    async def a_run_bytes(*_: Any) -> tuple[int, bytes, bytes, str]:
        return answer

    monkeypatch.setattr(hook, "_run_bytes", lambda *_: answer)
    monkeypatch.setattr(hook, "_a_run_bytes", a_run_bytes)
    path = "/lustre/alice/job/status.json"

    with pytest.raises(RemoteReadError) as caught:
        call(hook, read, path)
    message = str(caught.value)
    assert isinstance(caught.value, RemoteCommandError)
    assert (caught.value.path, caught.value.rc) == (path, rc)
    assert message.startswith(f"reading {path} failed on login1 with exit status {rc}: ")
    assert (stderr or "no error message") in message
    assert "a failed read is not 'no file'" in message


@pytest.mark.parametrize("read", ["read_file", "a_read_file"])
def test_a_read_file_that_does_not_exist_is_none(monkeypatch: pytest.MonkeyPatch, read: str) -> None:
    """Only the read command's own "no such file" status means None; its stderr is not parsed by the hook."""
    hook = SlurmHook(settings=settings())
    answer = (commands.MISSING_FILE_STATUS, b"", b"head: cannot open 'x' for reading: No such file or directory\n", "h")

    async def a_run_bytes(*_: Any) -> tuple[int, bytes, bytes, str]:
        return answer

    monkeypatch.setattr(hook, "_run_bytes", lambda *_: answer)
    monkeypatch.setattr(hook, "_a_run_bytes", a_run_bytes)
    assert call(hook, read, "/lustre/alice/records/r.json") is None


EURO = "€".encode()  # 3 bytes
SMILE = "🙂".encode()  # 4 bytes


@pytest.mark.parametrize(
    ("data", "complete"),
    [
        (b"", 0),
        (b"abc", 3),
        (b"ab" + EURO, 5),
        (b"ab" + EURO[:1], 2),
        (b"ab" + EURO[:2], 2),
        (b"a" + SMILE[:1], 1),
        (b"a" + SMILE[:2], 1),
        (b"a" + SMILE[:3], 1),
        (b"a" + SMILE, 5),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),
        (b"a\x80\x80\x80\x80", 5),
    ],
    ids=[
        "empty",
        "ascii",
        "whole-3-byte",
        "3-byte-cut-after-1",
        "3-byte-cut-after-2",
        "4-byte-cut-after-1",
        "4-byte-cut-after-2",
        "4-byte-cut-after-3",
        "whole-4-byte",
        "whole-2-byte",
        "lone-lead-byte",
        "stray-continuation-bytes",
    ],
)
def test_utf8_complete_drops_only_a_cut_off_character(data: bytes, complete: int) -> None:
    assert _utf8_complete(data) == complete


@pytest.mark.parametrize(
    ("stdout", "offset", "expected"),
    [
        (b"MISSING\n", 0, LogChunk(size=0, data="", next_offset=0)),
        (b"MISSING\n", 40, LogChunk(size=0, data="", next_offset=0, restarted=True)),
        (b"SIZE 0 LEN 0\n", 0, LogChunk(size=0, data="", next_offset=0)),
        (b"SIZE 10 LEN 3\nabc", 0, LogChunk(size=10, data="abc", next_offset=3)),
        (b"SIZE 10 LEN 4\nab" + EURO[:2], 3, LogChunk(size=10, data="ab", next_offset=5)),
        (b"SIZE 10 LEN 5\nab" + EURO, 3, LogChunk(size=10, data="ab€", next_offset=8)),
        (b"SIZE 10 LEN 2\n" + SMILE[:2], 4, LogChunk(size=10, data="\ufffd", next_offset=6)),
        (b"SIZE 10 LEN 1\n" + EURO[2:], 6, LogChunk(size=10, data="\ufffd", next_offset=7)),
        (b"SIZE 6 LEN 0\n", 40, LogChunk(size=6, data="", next_offset=0, restarted=True)),
        (b"SIZE 40 LEN 0\n", 40, LogChunk(size=40, data="", next_offset=40)),
        (b"SIZE 10 LEN 3\nabcdef", 0, LogChunk(size=10, data="abc", next_offset=3)),
        (b"SIZE 10 LEN 2\na\nbc", 0, LogChunk(size=10, data="a\n", next_offset=2)),
    ],
    ids=[
        "missing",
        "vanished-after-reading",
        "empty-file",
        "ascii",
        "cut-character-left-for-next-read",
        "whole-character",
        "only-a-partial-character-still-advances",
        "starting-inside-a-character",
        "truncated-by-a-rerun",
        "nothing-new",
        "bytes-beyond-len-ignored",
        "newlines-in-data",
    ],
)
def test_log_chunk(stdout: bytes, offset: int, expected: LogChunk) -> None:
    assert _log_chunk(stdout, offset) == expected


def test_log_chunk_without_header_asks_to_read_again() -> None:
    with pytest.raises(RemoteCommandError, match="instead of 'SIZE <n> LEN <m>'; run it again"):
        _log_chunk(b"Welcome to the cluster!\nSIZE 3 LEN 3\nabc", 0)


def test_one_chunk_type_serves_the_single_read_and_the_batched_reader() -> None:
    single = _log_chunk(b"SIZE 10 LEN 3\nabc", 4)
    assert LogChunk is TailChunk
    assert isinstance(single, TailChunk)
    assert (single.data, single.size, single.end, single.restarted) == ("abc", 10, 7, False)
    batched = TailChunk(False, 4, 2, b"xyz")
    assert (batched.next_offset, batched.end) == (None, 9)
    assert TailChunk(missing=True).data == b""


def test_results_and_chunks_are_immutable_values() -> None:
    result = CommandResult(0, "out", "err")
    assert result.host == ""
    assert result == CommandResult(0, "out", "err", "")
    assert LogChunk(size=1, data="a", next_offset=1).restarted is False
    with pytest.raises(AttributeError):
        result.rc = 1  # type: ignore[misc]


# ---------------------------------------------------------------------- polling and cancelling


SQUEUE_RUNNING = "7|job_a|RUNNING|None|n1|2024-05-01T10:00:00|2024-05-01T14:00:00\n"
SQUEUE_DONE = "8|job_b|COMPLETED|None|n1|2024-05-01T10:00:00|2024-05-01T10:05:00\n"
SACCT_DONE = "8|job_b|COMPLETED|0:0|None|n1|2024-05-01T10:00:00|2024-05-01T10:05:00\n"
SACCT_CANCELLED = "9|job_c|CANCELLED by 1001|0:15|None|n2|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"


@pytest.mark.parametrize(
    ("squeue", "ids", "needs_sacct"),
    [
        (CommandResult(0, SQUEUE_RUNNING, ""), ["7"], []),
        (CommandResult(0, SQUEUE_RUNNING + SQUEUE_DONE, ""), ["7", "8"], ["8"]),
        (CommandResult(0, SQUEUE_RUNNING, ""), ["7", "9"], ["9"]),
        (CommandResult(1, "", DOWN), ["7", "9"], ["7", "9"]),
    ],
    ids=["live", "finished-in-squeue", "gone-from-squeue", "controller-down"],
)
def test_sacct_is_asked_only_for_jobs_squeue_cannot_settle(
    squeue: CommandResult, ids: list[str], needs_sacct: list[str]
) -> None:
    assert _needs_sacct(ids, squeue) == needs_sacct


def test_combined_poll_takes_live_states_from_squeue_and_final_ones_from_sacct() -> None:
    states = _combine_poll(
        ["7", "8", "9"],
        CommandResult(0, SQUEUE_RUNNING + SQUEUE_DONE, ""),
        CommandResult(0, SACCT_DONE + SACCT_CANCELLED, ""),
    )
    assert {job_id: (s.tao_state, s.source) for job_id, s in states.items()} == {
        "7": (TaoState.RUNNING, "squeue"),
        "8": (TaoState.COMPLETE, "sacct"),
        "9": (TaoState.CANCELED, "sacct"),
    }
    assert states["9"].raw_state == "CANCELLED by 1001"


def test_a_user_filtered_answer_keeps_only_the_jobs_asked_for() -> None:
    """At scale squeue lists all of the user's jobs: the poll answers for the watched ones only."""
    states = _combine_poll(["8"], CommandResult(0, SQUEUE_RUNNING + SQUEUE_DONE, ""), None)
    assert list(states) == ["8"]


def test_many_ids_are_filtered_by_user_on_the_server_not_listed() -> None:
    from airflow_provider_tao_slurm.core import commands

    many = [str(1000 + i) for i in range(commands.IDS_ON_COMMAND_LINE + 1)]
    assert commands.squeue_states(many, "alice") == "squeue -h -t all --user=alice -o '%i|%j|%T|%r|%N|%S|%e'"
    few = many[: commands.IDS_ON_COMMAND_LINE]
    assert commands.squeue_states(few, "alice").startswith(f"squeue -h -t all -j {','.join(few)} ")
    assert "-j" in commands.squeue_states(many).split()  # no user, no filter: the ids are listed


def test_controller_down_still_gives_accounting_states() -> None:
    states = _combine_poll(["8"], CommandResult(1, "", DOWN, "login1"), CommandResult(0, SACCT_DONE, "", "login1"))
    assert (states["8"].tao_state, states["8"].exit_code) == (TaoState.COMPLETE, 0)


def test_squeue_not_knowing_one_id_is_an_answer() -> None:
    unknown = CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n", "login1")
    assert _combine_poll(["99"], unknown, CommandResult(0, "", "", "login1")) == {}


def test_a_job_a_failed_query_could_not_speak_for_is_unanswered_not_gone() -> None:
    with pytest.raises(StatusQueryError) as caught:
        _combine_poll(["8", "9"], CommandResult(1, "", DOWN, "login1"), CommandResult(0, SACCT_DONE, "", "login1"))
    assert caught.value.unanswered == ["9"]
    assert set(caught.value.states) == {"8"}
    assert DOWN.strip() in caught.value.evidence


@pytest.mark.parametrize(
    "sacct",
    [None, CommandResult(1, "", "sacct: error: Problem talking to the database: Connection refused\n", "login1")],
    ids=["no-sacct", "sacct-failed"],
)
def test_no_answer_at_all_is_a_clear_error(sacct: CommandResult | None) -> None:
    with pytest.raises(StatusQueryError) as caught:
        _combine_poll(["7"], CommandResult(1, "", DOWN, "login1"), sacct)
    assert str(caught.value).startswith("1 of 1 job(s) unanswered on login1 (squeue exited 1: ")
    assert str(caught.value).endswith("check that slurmctld and slurmdbd are up (scontrol ping)")
    assert caught.value.unanswered == ["7"]
    assert (sacct is not None) == ("sacct exited 1" in caught.value.evidence)


@pytest.mark.parametrize(
    ("result", "fails"),
    [
        (CommandResult(0, "", ""), False),
        (CommandResult(1, "", ""), False),
        (CommandResult(1, "", DOWN), True),
        (
            CommandResult(8, "", "scancel: error: Kill job error on job id 7: Unable to contact slurm controller\n"),
            True,
        ),
    ],
    ids=["cancelled", "name-filter-matched-nothing", "controller-down", "kill-error"],
)
def test_scancel_outcome(result: CommandResult, fails: bool) -> None:
    if not fails:
        _check_scancel(result)
        return
    with pytest.raises(RemoteCommandError) as caught:
        _check_scancel(result)
    assert caught.value.rc == result.rc
    assert str(caught.value).endswith("check that slurmctld is up (scontrol ping) and cancel again")


def test_no_job_ids_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings())

    def run(command: str, **_: Any) -> CommandResult:
        raise AssertionError(f"sent {command!r}")

    monkeypatch.setattr(hook, "run", run)
    assert hook.get_states([]) == {}
    hook.cancel([])
    assert hook.check_paths([]) == []


# ---------------------------------------------------------------------- partial polls, own-user lookups and cancels

SQUEUE_DOWN = CommandResult(1, "", DOWN, "login1")
SACCT_DOWN = CommandResult(1, "", "sacct: error: Problem talking to the database\n", "login1")


@pytest.mark.parametrize(
    ("ids", "squeue", "sacct", "answered", "unanswered"),
    [
        pytest.param(
            ["8", "9"],
            SQUEUE_DOWN,
            CommandResult(0, SACCT_DONE + SACCT_CANCELLED, "", "login1"),
            {"8": TaoState.COMPLETE, "9": TaoState.CANCELED},
            None,
            id="squeue-failed-sacct-answered-all",
        ),
        pytest.param(
            ["7", "8", "9"],
            SQUEUE_DOWN,
            CommandResult(0, SACCT_DONE, "", "login1"),
            {"8": TaoState.COMPLETE},
            ["7", "9"],
            id="squeue-failed-ids-missing-from-sacct",
        ),
        pytest.param(
            ["7", "8"],
            CommandResult(0, SQUEUE_RUNNING, "", "login1"),
            SACCT_DOWN,
            {"7": TaoState.RUNNING},
            ["8"],
            id="sacct-failed-finished-job-unanswered",
        ),
        pytest.param(
            ["7", "8"],
            CommandResult(0, SQUEUE_RUNNING + SQUEUE_DONE, "", "login1"),
            SACCT_DOWN,
            {"7": TaoState.RUNNING, "8": TaoState.COMPLETE},
            None,
            id="sacct-failed-but-squeue-answered-all",
        ),
        pytest.param(["7"], SQUEUE_DOWN, None, {}, ["7"], id="squeue-failed-no-sacct"),
        pytest.param(
            ["7", "99"],
            CommandResult(0, SQUEUE_RUNNING, "", "login1"),
            CommandResult(0, "", "", "login1"),
            {"7": TaoState.RUNNING},
            None,
            id="both-answered-unknown-id-is-simply-absent",
        ),
    ],
)
def test_combine_poll_partial_answers(
    ids: list[str],
    squeue: CommandResult,
    sacct: CommandResult | None,
    answered: dict[str, TaoState],
    unanswered: list[str] | None,
) -> None:
    if unanswered is None:
        states = _combine_poll(ids, squeue, sacct)
    else:
        with pytest.raises(StatusQueryError) as caught:
            _combine_poll(ids, squeue, sacct)
        assert caught.value.unanswered == unanswered
        assert str(caught.value).startswith(f"{len(unanswered)} of {len(ids)} job(s) unanswered on login1")
        states = caught.value.states
    assert {job_id: state.tao_state for job_id, state in states.items()} == answered


class Recorder:
    """Stands in for ``run``/``a_run``: records commands (and stdin) and answers from a list."""

    def __init__(self, *answers: CommandResult) -> None:
        self.answers = list(answers)
        self.commands: list[tuple[str, bytes | None]] = []

    def __call__(self, command: str, **kwargs: Any) -> CommandResult:
        self.commands.append((command, kwargs.get("stdin")))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def a(self, command: str, **kwargs: Any) -> CommandResult:
        return self(command, **kwargs)


LOOKUP_OK = "#rc squeue 0\n#rc sacct 0\n"


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        pytest.param("11|alice\n12|bob\n#rc squeue 0\n11|alice\n#rc sacct 0\n", ["11"], id="only-our-jobs"),
        pytest.param("12|bob\n" + LOOKUP_OK, [], id="only-someone-elses"),
        pytest.param(LOOKUP_OK, [], id="none"),
    ],
)
def test_find_jobs_by_name_asks_for_our_user_and_keeps_our_jobs(
    monkeypatch: pytest.MonkeyPatch, stdout: str, expected: list[str]
) -> None:
    hook = SlurmHook(settings=settings())
    recorder = Recorder(CommandResult(0, stdout, "", "login1"))
    monkeypatch.setattr(hook, "run", recorder)

    assert hook.find_jobs_by_name("tao-x") == expected
    ((command, _),) = recorder.commands
    assert command.startswith("squeue -h -t all --name=tao-x --user=alice ")
    assert "sacct -X -n -P --name=tao-x --user=alice " in command


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(CommandResult(0, "#rc squeue 1\n#rc sacct 0\n", DOWN, "login1"), id="squeue-failed"),
        pytest.param(CommandResult(0, "#rc squeue 0\n", "", "login1"), id="cut-off"),
    ],
)
def test_find_jobs_by_name_failure_is_never_no_job(monkeypatch: pytest.MonkeyPatch, result: CommandResult) -> None:
    hook = SlurmHook(settings=settings())
    monkeypatch.setattr(hook, "run", Recorder(result))

    with pytest.raises(JobLookupError):
        hook.find_jobs_by_name("tao-x")


def test_find_jobs_by_name_on_all_hosts_with_none_reachable_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings(hosts=("login1.example.org", "login2.example.org")))

    def unreachable(host: str) -> Any:
        raise SlurmConnectionError(f"{host}: connection refused")

    monkeypatch.setattr(hook, "_connect", unreachable)

    with pytest.raises(JobLookupError, match="no login host answered") as caught:
        hook.find_jobs_by_name("tao-x", all_hosts=True)
    assert "login1.example.org: connection refused" in caught.value.evidence
    assert "login2.example.org: connection refused" in caught.value.evidence


@pytest.mark.parametrize(
    ("answer", "job_id"),
    [
        pytest.param(CommandTimeoutError("remote command did not finish within 3 s"), None, id="timed-out"),
        pytest.param(ConnectionLostError("the connection dropped before the reply"), None, id="connection-lost"),
        pytest.param(CommandResult(0, "sbatch: warning\n", "", "login1"), None, id="no-id-in-the-reply"),
        pytest.param(
            CommandResult(4, "42\n", "squeue: error: Socket timed out\nsqueue failed", "login1"),
            "42",
            id="held-its-twin-unchecked",
        ),
    ],
)
def test_a_submission_whose_outcome_is_unknown_says_so_and_submits_once(
    monkeypatch: pytest.MonkeyPatch, answer: Any, job_id: str | None
) -> None:
    """One round trip: the reconcile by name that must follow is the lifecycle's (lifecycle/submission.py)."""
    hook = SlurmHook(settings=settings(results_dir="/lustre/u"))
    sent: list[str] = []

    def run(command: str, **_: Any) -> CommandResult:
        sent.append(command)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(hook, "run", run)

    with pytest.raises(SubmissionOutcomeUnknownError) as caught:
        hook.submit("/lustre/u/jobs/j/job.sbatch", "j", log_dir="/lustre/u/logs")

    assert caught.value.job_id == job_id
    assert len(sent) == 1


def test_a_refused_submission_is_a_submission_error(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings(results_dir="/lustre/u"))
    refused = CommandResult(1, "", "sbatch: error: invalid partition specified: gpu", "login1")
    monkeypatch.setattr(hook, "run", Recorder(refused))

    with pytest.raises(SubmissionError, match="invalid partition specified") as caught:
        hook.submit("/lustre/u/jobs/j/job.sbatch", "j", log_dir="/lustre/u/logs")

    assert not isinstance(caught.value, SubmissionOutcomeUnknownError)


def test_the_twin_check_keeps_a_job_held_when_squeue_fails(tmp_path: Path, held_submission: HeldSubmission) -> None:
    """The held job's duplicate check runs squeue; a failed squeue is no answer: no release, exit 4, the id."""
    done = held_submission(
        {
            "sbatch": "echo 42",
            "squeue": "echo 'squeue: error: Socket timed out' >&2; exit 1",
            "scontrol": f'echo "$*" >> {tmp_path}/scontrol.calls',
            "scancel": f'echo "$*" >> {tmp_path}/scancel.calls',
        }
    )

    assert (done.returncode, done.stdout.strip().splitlines()[-1]) == (4, "42"), done.stderr
    assert "Socket timed out" in done.stderr
    assert not (tmp_path / "scontrol.calls").exists(), "never released"
    assert not (tmp_path / "scancel.calls").exists()


@pytest.mark.parametrize("side", ["sync", "async"])
def test_cancel_is_limited_to_our_user_and_the_job_name(monkeypatch: pytest.MonkeyPatch, side: str) -> None:
    hook = SlurmHook(settings=settings())
    recorder = Recorder(CommandResult(0, "", "", "login1"))
    if side == "sync":
        monkeypatch.setattr(hook, "run", recorder)
        hook.cancel(["12"], job_name="tao-x")
    else:
        monkeypatch.setattr(hook, "a_run", recorder.a)
        asyncio.run(hook.a_cancel(["12"], job_name="tao-x"))
    assert recorder.commands == [("scancel -Q --name=tao-x --user=alice 12", None)]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(CommandResult(0, '{"a": 1}', "", "login1"), '{"a": 1}', id="read"),
        pytest.param(CommandResult(commands.MISSING_FILE_STATUS, "", "", "login1"), None, id="missing"),
    ],
)
def test_a_read_file(monkeypatch: pytest.MonkeyPatch, result: CommandResult, expected: str | None) -> None:
    hook = SlurmHook(settings=settings())
    recorder = Recorder(result)
    monkeypatch.setattr(hook, "a_run", recorder.a)

    assert asyncio.run(hook.a_read_file("/lustre/u/records/r.json")) == expected
    ((command, _),) = recorder.commands
    assert "/lustre/u/records/r.json" in command


def test_a_write_file_sends_the_content_over_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings())
    recorder = Recorder(CommandResult(0, "", "", "login1"))
    monkeypatch.setattr(hook, "a_run", recorder.a)

    asyncio.run(hook.a_write_file("/lustre/u/records/r.json", b"secret-free", "644"))

    ((command, stdin),) = recorder.commands
    assert stdin == b"secret-free"
    assert "secret-free" not in command
    assert "/lustre/u/records/r.json" in command


def test_a_failed_async_write_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings())

    async def a_run_bytes(*_: Any) -> tuple[int, bytes, bytes, str]:
        return 1, b"", b"Disk quota exceeded\n", "login1"

    monkeypatch.setattr(hook, "_a_run_bytes", a_run_bytes)

    with pytest.raises(RemoteCommandError) as caught:
        asyncio.run(hook.a_write_file("/lustre/u/records/r.json", b"x"))
    assert str(caught.value) == (
        "writing /lustre/u/records/r.json failed on login1 with exit status 1: Disk quota exceeded"
    )
    assert caught.value.rc == 1


@pytest.mark.parametrize("side", ["sync", "async"])
@pytest.mark.parametrize("check", [False, True])
def test_run_and_a_run_check_the_exit_status_alike(monkeypatch: pytest.MonkeyPatch, side: str, check: bool) -> None:
    hook = SlurmHook(settings=settings())
    answer = (3, b"partial\n", b"sinfo: error: slurm_load_partitions: Unable to contact slurm controller\n", "login1")

    async def a_run_bytes(*_: Any) -> tuple[int, bytes, bytes, str]:
        return answer

    monkeypatch.setattr(hook, "_run_bytes", lambda *_: answer)
    monkeypatch.setattr(hook, "_a_run_bytes", a_run_bytes)

    def run() -> CommandResult:
        if side == "sync":
            return hook.run("sinfo", check=check, what="reading the partitions")
        return asyncio.run(hook.a_run("sinfo", check=check, what="reading the partitions"))

    if not check:
        assert run() == CommandResult(3, "partial\n", answer[2].decode(), "login1")
        return
    with pytest.raises(RemoteCommandError) as caught:
        run()
    assert type(caught.value) is RemoteCommandError
    assert str(caught.value) == (
        "reading the partitions failed on login1 with exit status 3: "
        "sinfo: error: slurm_load_partitions: Unable to contact slurm controller"
    )
    assert (caught.value.rc, caught.value.stderr) == (3, answer[2].decode())


def test_a_accounting_states_asks_sacct_once_for_every_job_and_never_squeue(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings())
    rows = "12|tao-a|FAILED|3:0|NonZeroExitCode|n1|2026-12-03T10:00:00|2026-12-03T10:01:00\n"
    rows += "13|tao-b|RUNNING|0:0|None|n2|2026-12-03T10:00:00|Unknown\n"
    rows += "99|someone-else|COMPLETED|0:0|None|n2|2026-12-03T10:00:00|2026-12-03T10:01:00\n"
    recorder = Recorder(CommandResult(0, rows, "", "login1"))
    monkeypatch.setattr(hook, "a_run", recorder.a)

    states = asyncio.run(hook.a_accounting_states(["12", "13", "12"]))

    assert {job_id: (s.native, s.exit_code, s.source) for job_id, s in states.items()} == {
        "12": ("FAILED", 3, "sacct"),
        "13": ("RUNNING", 0, "sacct"),
    }
    ((command, _),) = recorder.commands
    assert command.startswith("sacct ")
    assert "squeue" not in command
    assert asyncio.run(hook.a_accounting_states([])) == {}


def test_a_failed_accounting_query_raises_naming_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings())
    refused = CommandResult(1, "", "sacct: error: Problem talking to the database: Connection refused\n", "login1")
    monkeypatch.setattr(hook, "a_run", Recorder(refused).a)

    with pytest.raises(RemoteCommandError, match=r"sacct failed on login1 \(exit 1\): .*Connection refused"):
        asyncio.run(hook.a_accounting_states(["12"]))


# ---------------------------------------------------------------------- shared storage refusals

UNSAFE = b"UNSAFE /lustre/u/records: is a symbolic link\n"


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_command_the_storage_guard_stopped_raises_naming_the_path_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    hook = SlurmHook(settings=settings(results_dir="/lustre/u"))
    answer = (commands.UNSAFE_PATH_STATUS, b"", UNSAFE, "login1")
    monkeypatch.setattr(hook, "_run_bytes", lambda *_: answer)

    async def a_run_bytes(*_: Any) -> tuple[int, bytes, bytes, str]:
        return answer

    monkeypatch.setattr(hook, "_a_run_bytes", a_run_bytes)

    def write() -> None:
        if side == "sync":
            hook.write_file("/lustre/u/records/r.json", b"{}")
        else:
            asyncio.run(hook.a_write_file("/lustre/u/records/r.json", b"{}"))

    with pytest.raises(StoragePathError) as caught:
        write()
    message = str(caught.value)
    assert "/lustre/u/records is a symbolic link on login1" in message
    assert "nothing was written or submitted" in message
    assert "results_dir" in message


def test_exit_86_without_the_guards_line_is_an_ordinary_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings())
    monkeypatch.setattr(hook, "_run_bytes", lambda *_: (commands.UNSAFE_PATH_STATUS, b"", b"UNSAFE x\n", "login1"))

    assert hook.run("true").rc == commands.UNSAFE_PATH_STATUS


@pytest.mark.parametrize(
    ("call", "checked"),
    [
        (lambda hook: hook.write_file("/lustre/u/nccl/c.json", b"{}"), "_b /lustre/u; _c /lustre/u/nccl;"),
        (lambda hook: hook.stage_files("/lustre/u", {"jobs/j/env": (b"{}", 0o600)}), "_b /lustre/u; _c /lustre/u/jobs"),
        (lambda hook: hook.prepare_job_logs("/lustre/u/logs", "j", "12"), "_c /lustre/u/logs /lustre/u/logs/j-12;"),
        (lambda hook: hook.partition_limits(), "_c /lustre/u/.tao-slurm;"),
    ],
    ids=["write-file", "stage-files", "prepare-job-logs", "partition-cache"],
)
def test_writers_check_the_tree_from_the_connections_results_dir(
    monkeypatch: pytest.MonkeyPatch, call: Any, checked: str
) -> None:
    hook = SlurmHook(settings=settings(results_dir="/lustre/u"))
    recorder = Recorder(CommandResult(0, "", "", "login1"))
    monkeypatch.setattr(hook, "run", recorder)

    call(hook)

    ((command, _stdin),) = recorder.commands
    assert checked in command


def test_submit_stages_the_files_and_submits_in_one_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings(results_dir="/lustre/u"))
    recorder = Recorder(CommandResult(0, "42\n", "", "login1"))
    monkeypatch.setattr(hook, "run", recorder)
    files = {"jobs/j/job.sbatch": (b"#!/bin/bash\ntrue\n", 0o700), "logs": (None, 0o755)}

    assert hook.submit("/lustre/u/jobs/j/job.sbatch", "j", log_dir="/lustre/u/logs", stage=("/lustre/u", files)) == "42"

    ((command, stdin),) = recorder.commands
    assert command.index("tar -x") < command.index("sbatch --parsable --hold")
    for shell in ("sh", "bash"):
        checked = subprocess.run([shell, "-n", "-c", command], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr
    assert stdin is not None
    with tarfile.open(fileobj=io.BytesIO(stdin)) as archive:
        assert archive.getnames() == ["jobs/j/job.sbatch", "logs"]


def test_a_failed_staging_submits_nothing_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = SlurmHook(settings=settings(results_dir="/lustre/u"))
    stderr = f"tar: jobs/j: Cannot mkdir: Disk quota exceeded\n{STAGING_FAILED}\n"
    monkeypatch.setattr(hook, "run", Recorder(CommandResult(2, "", stderr, "login1")))

    with pytest.raises(RemoteCommandError) as caught:
        hook.submit("/lustre/u/jobs/j/job.sbatch", "j", log_dir="/lustre/u/logs", stage=("/lustre/u", {}))

    message = str(caught.value)
    assert "staging the job's files failed on login1 with exit status 2, so nothing was submitted" in message
    assert "Disk quota exceeded" in message
    assert STAGING_FAILED not in message


def test_a_failed_staging_run_by_a_real_shell_never_reaches_sbatch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The combined command runs in sh with a stand-in sbatch; the archive is unreadable, so tar fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/sbatch-ran\necho 42\n")
    (bin_dir / "sbatch").chmod(0o755)
    base = tmp_path / "results"
    hook = SlurmHook(settings=settings(results_dir=str(base)))

    def local(command: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes, str]:
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
        done = subprocess.run(["sh", "-c", command], input=b"not a tar archive", env=env, capture_output=True)
        return done.returncode, done.stdout, done.stderr, "local"

    monkeypatch.setattr(hook, "_run_bytes", local)

    with pytest.raises(RemoteCommandError, match=r"staging the job's files failed on local .* nothing was submitted"):
        hook.submit(
            f"{base}/jobs/j/job.sbatch", "j", log_dir=f"{base}/logs", stage=(str(base), {"logs": (None, 0o755)})
        )
    assert not (tmp_path / "sbatch-ran").exists()
