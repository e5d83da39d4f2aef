"""Fault suite, the network side: a black-holed first login host, a host key rotated under open connections.

Both faults are real and on the cluster's side (``tests/cluster/harness.py``): the black hole is a daemon
on the login port of another loopback address (127.0.0.3) that accepts TCP connections and never sends a
byte, as a login host whose sshd hangs or a middlebox that swallows the traffic; the rotating sshd is a
second login sshd with its own host key, which ``harness.py rotate-host-key`` replaces before restarting
it. Each case runs the provider's sync side (paramiko through the SSH provider's SSHHook, as operators
do) and its async side (the asyncssh pool, as triggers do), measures what matters, and checks it against
evidence taken outside the provider: OpenSSH's ``ssh-keyscan``, the server's ``$SSH_CONNECTION``, ``ss``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import connection_json, harness
from deferral import run_async, wait_until

from airflow_provider_tao_slurm.exceptions import HostKeyError, SlurmConnectionError
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook, async_pool

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv

pytestmark = pytest.mark.cluster

#: The connection's ``conn_timeout`` extra in these cases (seconds).
CONN_TIMEOUT = 3.0
#: How much longer than ``conn_timeout`` a failover may take (the second host's handshake, scheduling).
MARGIN_S = 1.5
SIDES = ["sync", "async"]


# ---------------------------------------------------------------------- evidence from outside the provider


def black_hole_is_silent(cluster: ClusterEnv, wait_s: float = 1.0) -> bool:
    """Whether the black hole accepts a TCP connection and then sends nothing (not even EOF) for ``wait_s``."""
    with socket.create_connection((cluster.black_hole_host, cluster.black_hole_port), timeout=2) as sock:
        sock.settimeout(wait_s)
        try:
            sock.recv(1)
        except TimeoutError:
            return True
    return False


def black_hole_sockets_held(cluster: ClusterEnv) -> int:
    """How many TCP connections this process still holds to the black hole (``ss -p``)."""
    out = subprocess.run(
        ["ss", "-tnpH", "dst", f"{cluster.black_hole_host}:{cluster.black_hole_port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(f"pid={os.getpid()}," in line for line in out.splitlines())


def server_side(stdout: str) -> str:
    """``address:port`` the SSH client connected to, as the server's ``$SSH_CONNECTION`` has it."""
    _client, _client_port, address, port = stdout.split()
    return f"{address}:{port}"


def scanned_host_key(cluster: ClusterEnv) -> str:
    """The rotating sshd's ed25519 host key as OpenSSH's ssh-keyscan sees it: ``ssh-ed25519 AAAA...``."""
    proc = subprocess.run(
        ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(cluster.rotating_port), cluster.host],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = [line.split() for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1, f"ssh-keyscan of port {cluster.rotating_port}: {proc.stdout!r} {proc.stderr!r}"
    return " ".join(lines[0][1:3])


def reset_sessions(cluster: ClusterEnv, server_port: int) -> None:
    """Reset every TCP connection to the server port on the server side (``ss -K``), as a login-host reboot does."""
    subprocess.run(["ss", "-K", "-t", "src", f"{cluster.host}:{server_port}"], check=True, capture_output=True)


def file_digest(path: Path) -> str:
    """sha256 of a file's content, or ``absent``."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


# ---------------------------------------------------------------------- a black-holed login host


def connect_timed(side: str) -> tuple[float, str, str]:
    """Connect the ``slurm_default`` hook (sync or async side) and run ``echo $SSH_CONNECTION``; returns the
    seconds until connected, the host the hook reports and the server side of ``$SSH_CONNECTION``."""
    command = "echo $SSH_CONNECTION"
    if side == "sync":
        hook = SlurmHook()
        try:
            started = time.monotonic()
            hook.get_conn()
            elapsed = time.monotonic() - started
            result = hook.run(command, check=True)
        finally:
            hook.close()
        return elapsed, result.host, server_side(result.stdout)

    async def scenario() -> tuple[float, str, str]:
        hook = SlurmHook()
        settings = await hook.a_settings()
        started = time.monotonic()
        await async_pool().connection(settings)
        elapsed = time.monotonic() - started
        result = await hook.a_run(command)
        return elapsed, result.host, server_side(result.stdout)

    return run_async(scenario())


def fail_timed(side: str) -> tuple[float, SlurmConnectionError]:
    """Connect the ``slurm_default`` hook (sync or async side), which must fail; the seconds and the error."""
    hook = SlurmHook()
    started = time.monotonic()
    try:
        with pytest.raises(SlurmConnectionError) as caught:
            hook.run("true") if side == "sync" else run_async(hook.a_run("true"))
    finally:
        hook.close()
    return time.monotonic() - started, caught.value


@pytest.mark.parametrize("side", SIDES)
def test_black_holed_first_login_host_fails_over_within_conn_timeout(
    conn: str, side: str, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch, record_property: Any
) -> None:
    """The connection listed the black hole (127.0.0.3 on the login port: it accepts TCP and never sends a
    byte) before the real login host, with conn_timeout=3; the hook connected (sync: paramiko via SSHHook;
    async: the asyncssh pool) and ran ``echo $SSH_CONNECTION``. Expected: the hook waits on the silent host
    no longer than conn_timeout (not paramiko's 30 s banner wait or asyncssh's 2 min login timeout), then
    connects to the second host, where the command runs (the server's $SSH_CONNECTION says so), and it keeps
    no socket to the black hole afterwards."""
    assert black_hole_is_silent(cluster), "the black hole answered: it must accept and stay silent"
    assert cluster.black_hole_port == cluster.port  # one port for every host of a connection
    hosts = f"{cluster.black_hole_host},{cluster.host}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_SLURM_DEFAULT",
        connection_json(cluster, host=hosts, extra={"conn_timeout": CONN_TIMEOUT}),
    )

    elapsed, host, served_by = connect_timed(side)
    after = time.monotonic()
    wait_until(
        lambda: black_hole_sockets_held(cluster) == 0, "the socket to the black hole closed", timeout=5, every=0.1
    )
    lingered = time.monotonic() - after

    record_property(
        "detail",
        f"{side}: connected to the second host {elapsed:.2f} s after the start (conn_timeout={CONN_TIMEOUT:g} s); "
        f"the command ran on {served_by}; the black-hole socket was closed {lingered:.1f} s after that",
    )
    assert CONN_TIMEOUT - 0.2 <= elapsed < CONN_TIMEOUT + MARGIN_S  # waited on the black hole, then failed over
    assert host == cluster.host
    assert served_by == f"{cluster.host}:{cluster.port}"


@pytest.mark.parametrize("side", SIDES)
def test_black_hole_alone_fails_within_conn_timeout_naming_host_and_timeout(
    conn: str, side: str, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch, record_property: Any
) -> None:
    """The connection listed only the black hole (it accepts TCP and never speaks), conn_timeout=3; the hook
    tried to run a command (sync and async sides). Expected: a plain SlurmConnectionError (not a host-key or
    authentication error) within conn_timeout, whose text names the host, its port and the timeout, and says
    it accepted no SSH handshake, not that it is unreachable."""
    assert black_hole_is_silent(cluster), "the black hole answered: it must accept and stay silent"
    monkeypatch.setenv(
        "AIRFLOW_CONN_SLURM_DEFAULT",
        connection_json(cluster, host=cluster.black_hole_host, extra={"conn_timeout": CONN_TIMEOUT}),
    )

    elapsed, error = fail_timed(side)
    wait_until(
        lambda: black_hole_sockets_held(cluster) == 0, "the socket to the black hole closed", timeout=5, every=0.1
    )

    text = str(error)
    record_property("detail", f"{side}: failed after {elapsed:.2f} s: {text.split(':', 1)[1].split(';')[0].strip()}")
    assert type(error) is SlurmConnectionError
    assert [host for host, _ in error.failures] == [cluster.black_hole_host]
    assert elapsed < CONN_TIMEOUT + MARGIN_S
    assert f"{cluster.black_hole_host} port {cluster.black_hole_port} did not answer" in text
    assert f"conn_timeout={CONN_TIMEOUT:g} s" in text
    assert "unreachable" not in text


# ---------------------------------------------------------------------- a host key rotated under open connections


def test_host_key_rotated_while_connections_are_open_refuses_new_connections(
    conn: str, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, record_property: Any
) -> None:
    """With the rotating sshd's key pinned (host_key extra, taken with ssh-keyscan), a sync hook connection
    and a pooled async connection were opened and used; then the server's host key was replaced and that
    sshd restarted (harness rotate-host-key), and both connections were reset on the server side (a
    login-host reboot). HOME pointed to an empty directory; later its ~/.ssh/known_hosts listed the NEW key.
    Expected: the open connections keep working until the reset (their key was checked when they opened);
    every NEW connection after it, sync and async, even with the new key in ~/.ssh/known_hosts, is refused
    with a HostKeyError saying the host key CHANGED (no silent trust, no fallback to known_hosts), and
    nothing is written to any known_hosts file; with the new key pinned instead, both sides connect."""
    monkeypatch.setenv("HOME", str(tmp_path))
    harness_known_hosts = Path(cluster.known_hosts)
    known_before = file_digest(harness_known_hosts)
    pinned = scanned_host_key(cluster)

    def use(host_key: str) -> None:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SLURM_DEFAULT",
            connection_json(
                cluster,
                port=cluster.rotating_port,
                extra={"host_key": host_key, "conn_timeout": 5, "cluster_name": "mini-rotating"},
            ),
        )

    async def refused(sync_hook: SlurmHook) -> tuple[str, str]:
        """Both sides' errors for a new connection (the sync hook reconnects, the pool opens anew)."""
        with pytest.raises(HostKeyError) as sync_error:
            await asyncio.to_thread(sync_hook.run, "echo after")
        with pytest.raises(HostKeyError) as async_error:
            await SlurmHook().a_run("echo after")
        return str(sync_error.value), str(async_error.value)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        sync_hook = SlurmHook()
        async_hook = SlurmHook()
        try:
            assert (await asyncio.to_thread(sync_hook.run, "echo before")).stdout.strip() == "before"
            assert (await async_hook.a_run("echo before")).stdout.strip() == "before"
            opened = async_pool().opened

            await asyncio.to_thread(harness, "rotate-host-key")
            seen["rotated"] = await asyncio.to_thread(scanned_host_key, cluster)
            seen["still_sync"] = (await asyncio.to_thread(sync_hook.run, "echo still")).stdout.strip()
            seen["still_async"] = (await async_hook.a_run("echo still")).stdout.strip()
            seen["reconnects_before_reset"] = async_pool().opened - opened

            await asyncio.to_thread(reset_sessions, cluster, cluster.rotating_port)
            transport = sync_hook._client.get_transport() if sync_hook._client is not None else None
            await asyncio.to_thread(
                wait_until, lambda: transport is None or not transport.is_active(), "sync connection reset", 10, 0.1
            )
            seen["sync_error"], seen["async_error"] = await refused(sync_hook)
            seen["home_after_refusal"] = sorted(p.name for p in tmp_path.iterdir())

            ssh_dir = tmp_path / ".ssh"
            ssh_dir.mkdir(mode=0o700)
            known_hosts = ssh_dir / "known_hosts"
            known_hosts.write_text(f"[{cluster.host}]:{cluster.rotating_port} {seen['rotated']}\n")
            listed = file_digest(known_hosts)
            seen["sync_error_known"], seen["async_error_known"] = await refused(SlurmHook())
            seen["known_hosts_unchanged"] = file_digest(known_hosts) == listed
            seen["ssh_dir"] = sorted(p.name for p in ssh_dir.iterdir())
            known_hosts.unlink()

            use(seen["rotated"])
            await async_pool().close_all()
            seen["repinned_sync"] = (await asyncio.to_thread(SlurmHook().run, "echo repinned")).stdout.strip()
            seen["repinned_async"] = (await SlurmHook().a_run("echo repinned")).stdout.strip()
        finally:
            sync_hook.close()
        return seen

    use(pinned)
    seen = run_async(scenario())

    record_property(
        "detail",
        f"key ...{pinned[-8:]} rotated to ...{seen['rotated'][-8:]}; open connections still answered "
        f"(sync {seen['still_sync']!r}, async {seen['still_async']!r}); new connections refused: "
        f"sync {seen['sync_error'].split(': ', 1)[1].split(' (')[0]!r}, "
        f"async {seen['async_error'].split(': ', 1)[1].split(' (')[0]!r}, also with the new key in "
        f"~/.ssh/known_hosts; known_hosts files unchanged; the new key pinned: both sides connected",
    )
    assert seen["rotated"] != pinned
    assert (seen["still_sync"], seen["still_async"], seen["reconnects_before_reset"]) == ("still", "still", 0)
    new_key = seen["rotated"].split()[1]
    for side in ("sync_error", "async_error", "sync_error_known", "async_error_known"):
        assert f"host key of {cluster.host} CHANGED" in seen[side], side
        assert "otherwise someone may be intercepting the connection" in seen[side], side
    for side in ("sync_error", "sync_error_known"):  # paramiko names the key it was offered and the pinned one
        assert f"got '{new_key}', expected '{pinned.split()[1]}'" in seen[side], side
    assert seen["home_after_refusal"] == []  # no ~/.ssh, no known_hosts written
    assert seen["known_hosts_unchanged"]
    assert seen["ssh_dir"] == ["known_hosts"]
    assert file_digest(harness_known_hosts) == known_before
    assert (seen["repinned_sync"], seen["repinned_async"]) == ("repinned", "repinned")
