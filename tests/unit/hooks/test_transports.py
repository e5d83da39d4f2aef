"""The two transports share one failover loop and one reading of the connection's SSH options.

No SSH server is needed: the per-host connects are stand-ins, and the options are checked as each
library is handed them (the SSH provider's ``SSHHook`` for paramiko, ``asyncssh.connect``'s keywords).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.exceptions import (
    ConnectionConfigError,
    HostKeyError,
    KeyFilePermissionError,
    SlurmConnectionError,
)
from airflow_provider_tao_slurm.hooks import slurm, transport
from airflow_provider_tao_slurm.hooks.async_transport import _asyncssh_options, async_pool
from airflow_provider_tao_slurm.hooks.failover import connect_first, connect_first_blocking, host_failure
from airflow_provider_tao_slurm.hooks.options import KEEPALIVE_S, SshOptions, ssh_options
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

HOST_KEY = (
    Ed25519PrivateKey.generate()
    .public_key()
    .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    .decode()
)


def settings(**changes: Any) -> ClusterSettings:
    values: dict[str, Any] = {"hosts": ("a", "b", "c"), "user": "alice", "cluster_name": "polaris"}
    return ClusterSettings(**{**values, **changes})


def down(host: str) -> SlurmConnectionError:
    return SlurmConnectionError(f"{host} port 22 unreachable (Connection refused)", [(host, f"{host} refused")])


# ---------------------------------------------------------------------- one failover loop


def failover(side: str, hosts: tuple[str, ...], connect: Callable[[str], str]) -> tuple[str, str]:
    """The failover loop as the paramiko side (blocking) or the asyncssh side (awaited) runs it."""
    if side == "sync":
        return connect_first_blocking("polaris", hosts, connect)

    async def a_connect(host: str) -> str:
        await asyncio.sleep(0)
        return connect(host)

    return asyncio.run(connect_first("polaris", hosts, a_connect))


@pytest.mark.parametrize("side", ["sync", "async"])
def test_hosts_are_tried_in_order_and_the_one_that_answered_is_returned(
    side: str, caplog: pytest.LogCaptureFixture
) -> None:
    tried: list[str] = []

    def connect(host: str) -> str:
        tried.append(host)
        if host == "a":
            raise down(host)
        return f"connection to {host}"

    caplog.set_level(logging.WARNING)
    assert failover(side, ("a", "b", "c"), connect) == ("b", "connection to b")
    assert tried == ["a", "b"]
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [
        "Login host failed, trying the next one: a port 22 unreachable (Connection refused)",
        "Connected to b after 1 failed login host(s)",
    ]


@pytest.mark.parametrize("side", ["sync", "async"])
@pytest.mark.parametrize(
    ("kinds", "expected"),
    [((HostKeyError, HostKeyError), HostKeyError), ((HostKeyError, SlurmConnectionError), SlurmConnectionError)],
    ids=["same-class", "mixed"],
)
def test_no_host_answering_lists_every_host(
    side: str, kinds: tuple[type[SlurmConnectionError], ...], expected: type[SlurmConnectionError]
) -> None:
    def connect(host: str) -> str:
        raise kinds[("a", "b").index(host)](f"{host} failed", [(host, f"{host} failed")])

    with pytest.raises(SlurmConnectionError) as caught:
        failover(side, ("a", "b"), connect)
    assert type(caught.value) is expected
    assert caught.value.failures == [("a", "a failed"), ("b", "b failed")]
    assert str(caught.value) == "no login host of cluster 'polaris' answered: a failed; b failed"


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_bad_setting_stops_the_failover_at_once(side: str) -> None:
    tried: list[str] = []

    def connect(host: str) -> str:
        tried.append(host)
        raise ConnectionConfigError("host_key is not a valid ssh-ed25519 key")

    with pytest.raises(ConnectionConfigError):
        failover(side, ("a", "b"), connect)
    assert tried == ["a"]


def test_the_blocking_failover_runs_inside_an_event_loop() -> None:
    """The sync hook may be called from a coroutine (a deferrable operator's code): the loop is not disturbed."""

    async def inside() -> tuple[str, str]:
        return connect_first_blocking("polaris", ("a",), lambda host: f"connection to {host}")

    assert asyncio.run(inside()) == ("a", "connection to a")


@dataclass
class FakeTransport:
    active: bool = True

    def is_active(self) -> bool:
        return self.active


@dataclass
class FakeClient:
    host: str
    transport: FakeTransport

    def get_transport(self) -> FakeTransport:
        return self.transport

    def close(self) -> None:
        self.transport.active = False


def test_the_sync_hook_remembers_the_host_that_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[str] = []

    def connect(options: SshOptions) -> FakeClient:
        tried.append(options.host)
        if options.host == "a":
            raise down("a")
        return FakeClient(options.host, FakeTransport())

    def exec_channel(client: FakeClient, command: str, stdin: bytes | None, timeout: float | None) -> Any:
        return 0, f"{command} on {client.host}\n".encode(), b""

    monkeypatch.setattr(slurm, "connect", connect)
    monkeypatch.setattr(slurm, "_exec_channel", exec_channel)
    hook = SlurmHook(settings=settings())

    first = hook.run("hostname")
    assert (first.stdout, first.host, hook.active_host) == ("hostname on b\n", "b", "b")
    assert hook.run("true").host == "b"
    assert tried == ["a", "b"], "the answering host's connection is kept"
    hook.close()
    assert hook.active_host is None


@dataclass
class FakeProcessResult:
    exit_status: int | None
    exit_signal: Any
    stdout: bytes
    stderr: bytes


class FakeProcess:
    def __init__(self, result: FakeProcessResult) -> None:
        self.result = result

    async def wait(self) -> FakeProcessResult:
        return self.result

    def close(self) -> None:
        pass


class FakeConnection:
    def __init__(self, host: str) -> None:
        self.host = host
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    async def create_process(self, command: str, **_: Any) -> FakeProcess:
        return FakeProcess(FakeProcessResult(0, None, f"{command} on {self.host}\n".encode(), b""))


def test_the_async_pool_remembers_the_host_that_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[tuple[str, dict[str, Any]]] = []

    async def fake_connect(host: str, **options: Any) -> FakeConnection:
        tried.append((host, options))
        if host == "a":
            raise ConnectionRefusedError(111, "Connect call failed")
        return FakeConnection(host)

    monkeypatch.setattr(asyncssh, "connect", fake_connect)
    hook = SlurmHook(settings=settings())

    async def scenario() -> list[Any]:
        try:
            return [await hook.a_run("hostname"), await hook.a_run("true"), async_pool().opened]
        finally:
            await async_pool().close_all()

    opened = async_pool().opened
    first, second, now_opened = asyncio.run(scenario())
    assert (first.stdout, first.host, second.host) == ("hostname on b\n", "b", "b")
    assert [host for host, _ in tried] == ["a", "b"]
    assert now_opened - opened == 1


# ---------------------------------------------------------------------- one reading of the SSH options


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    key = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.BestAvailableEncryption(b"open sesame"),
    )
    path = tmp_path / "id_ed25519"
    path.write_bytes(key)
    path.chmod(0o600)
    return str(path)


def test_ssh_options_read_the_connection_once_for_one_host(key_file: str) -> None:
    s = settings(
        port=2222,
        key_file=key_file,
        private_key_passphrase="open sesame",
        host_key=f"{HOST_KEY} admin@cluster",
        conn_timeout=2.5,
        cmd_timeout=30,
        proxy_command="ssh -W %h:%p jump@bastion",
    )
    options = ssh_options(s, "b")
    assert (options.host, options.port, options.user, options.key_file) == ("b", 2222, "alice", key_file)
    assert (options.connect_timeout, options.command_timeout, options.keepalive_s) == (2.5, 30, KEEPALIVE_S)
    assert options.verify_host_key
    assert options.host_key is not None
    assert f"{options.host_key.get_name()} {options.host_key.get_base64()}" == HOST_KEY
    assert options.proxy_argv == ("ssh", "-W", "b:2222", "jump@bastion")
    assert options.known_hosts_name == "[b]:2222"
    assert "open sesame" not in repr(options)


def test_ssh_options_refuse_an_open_key_file_and_a_bad_pinned_key(key_file: str) -> None:
    Path(key_file).chmod(0o644)
    with pytest.raises(KeyFilePermissionError, match="chmod 600"):
        ssh_options(settings(key_file=key_file), "a")
    with pytest.raises(ConnectionConfigError, match="host_key is not a valid ssh-ed25519 key"):
        ssh_options(settings(host_key="ssh-ed25519 not*base64"), "a")


def test_no_host_key_check_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert not ssh_options(settings(no_host_key_check=True), "a").verify_host_key
    assert "Host key checking is OFF for a" in caplog.text


def spelt_by_both(options: SshOptions) -> tuple[Any, dict[str, Any]]:
    """``options`` as the SSH provider's hook (paramiko) and as ``asyncssh.connect``'s keywords."""
    return transport._ssh_hook(options), _asyncssh_options(options)


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "known-hosts"])
def test_both_transports_get_the_same_key_host_key_timeouts_and_keepalive(key_file: str, pinned: bool) -> None:
    s = settings(
        key_file=key_file,
        private_key_passphrase="open sesame",
        host_key=HOST_KEY if pinned else None,
        conn_timeout=0.5,
        proxy_command="ssh -W %h:%p jump@bastion",
    )
    ssh, spelt = spelt_by_both(ssh_options(s, "b"))

    assert (ssh.remote_host, ssh.username, ssh.port) == ("b", "alice", 22)
    assert (spelt["username"], spelt["port"]) == ("alice", 22)
    # the encrypted key file is unlocked with the passphrase on both sides
    assert isinstance(ssh.pkey, paramiko.Ed25519Key)
    assert (ssh.key_file, ssh.look_for_keys) == (None, False)
    assert (spelt["client_keys"], spelt["passphrase"]) == ([key_file], "open sesame")
    # one connect timeout for the TCP connect, the banner and the authentication (never 0: non-blocking)
    assert (ssh.conn_timeout, ssh.banner_timeout, ssh.auth_timeout) == (1, 0.5, 1)
    assert spelt["connect_timeout"] == 0.5
    assert ssh.keepalive_interval == spelt["keepalive_interval"] == KEEPALIVE_S
    assert ssh.host_proxy_cmd == "ssh -W b:22 jump@bastion"
    assert spelt["proxy_command"] == ["ssh", "-W", "b:22", "jump@bastion"]
    assert ssh.no_host_key_check is False
    if pinned:
        assert f"{ssh.host_key.get_name()} {ssh.host_key.get_base64()}" == HOST_KEY
        assert isinstance(spelt["known_hosts"], asyncssh.SSHKnownHosts)
    else:
        assert ssh.host_key is None
        assert "known_hosts" not in spelt, "asyncssh reads ~/.ssh/known_hosts by default"


def test_both_transports_skip_the_host_key_check_only_when_told() -> None:
    ssh, spelt = spelt_by_both(ssh_options(settings(no_host_key_check=True), "a"))
    assert ssh.no_host_key_check is True
    assert spelt["known_hosts"] is None
    assert "client_keys" not in spelt


def test_a_plain_key_file_is_left_to_each_library() -> None:
    options = SshOptions(
        host="a",
        port=22,
        user="alice",
        key_file="/keys/id_ed25519",
        private_key=None,
        passphrase=None,
        verify_host_key=True,
        host_key=None,
        connect_timeout=10,
        command_timeout=120,
        proxy_argv=None,
    )
    ssh, spelt = spelt_by_both(options)
    assert (ssh.key_file, ssh.pkey) == ("/keys/id_ed25519", None)
    assert (spelt["client_keys"], spelt["passphrase"]) == (["/keys/id_ed25519"], None)
    assert "proxy_command" not in spelt
    assert ssh.host_proxy_cmd is None


def test_a_failed_host_is_described_alike_for_both_libraries() -> None:
    options = ssh_options(settings(host_key=HOST_KEY), "b")
    for exc in (
        paramiko.BadHostKeyException("b", options.host_key, options.host_key),
        asyncssh.HostKeyNotVerifiable("x"),
    ):
        error = host_failure(options, exc)
        assert type(error) is HostKeyError
        assert error.failures == [("b", str(error))]
        assert str(error).startswith("host key of b CHANGED")
