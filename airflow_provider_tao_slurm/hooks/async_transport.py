"""The async transport: asyncssh, one pooled connection per cluster account and event loop.

Every trigger of a triggerer shares its cluster account's connection (:func:`async_pool`), at most
:data:`ASYNC_MAX_SESSIONS` commands at a time on it. A dropped connection is opened again, failing
over between login hosts with :func:`~.failover.connect_first`; the options each host gets are
:func:`~.options.ssh_options`'s, as on the sync side. asyncssh is imported only when a connection is made.
"""

from __future__ import annotations

import asyncio
import logging
import random
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.exceptions import CommandTimeoutError, ConnectionLostError
from airflow_provider_tao_slurm.hooks.failover import connect_first, host_failure
from airflow_provider_tao_slurm.hooks.options import SshOptions, ssh_options

if TYPE_CHECKING:
    import asyncssh

    from airflow_provider_tao_slurm.core.config import ClusterSettings


def import_asyncssh() -> None:
    """Import asyncssh without the deprecation warnings it sets off in ``cryptography`` for DSA keys.

    asyncssh names DSA types when it is imported, and ``cryptography`` warns about each name: six warning
    lines in the log of every process that watches a job, about a key type the provider never uses.
    Only that warning, and only during the import, is silenced.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DSA is deprecated")
        import asyncssh  # noqa: F401


#: Concurrent channels on one pooled async connection (sshd's MaxSessions defaults to 10).
ASYNC_MAX_SESSIONS = 8


@dataclass
class _Pooled:
    """One cluster account's pooled connection in one event loop, and the login host it goes to."""

    lock: asyncio.Lock
    sessions: asyncio.Semaphore
    conn: asyncssh.SSHClientConnection | None = None
    host: str = ""


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
        """Return the account's open connection, connecting (with failover) when there is none."""
        entry = self._entry(s)
        async with entry.lock:
            if entry.conn is not None and not entry.conn.is_closed():
                return entry.conn
            entry.host, entry.conn = await _async_connect(s)
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
        :raises CommandTimeoutError: when the command does not finish within ``timeout`` (it may still run).
        """
        import_asyncssh()
        import asyncssh

        delay = 0.5
        for attempt in range(4):
            conn = await self.connection(s)
            entry = self._entry(s)
            async with entry.sessions:
                try:
                    process = await conn.create_process(command, input=stdin, encoding=None)
                except (OSError, asyncssh.Error) as exc:
                    conn.close()
                    failure = exc
                else:
                    return await _finish(process, timeout, entry.host)
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
        raise CommandTimeoutError(f"remote command did not finish within {timeout} s on {host}") from None
    if result.exit_status is None and result.exit_signal is None:
        raise ConnectionLostError(
            f"the SSH connection to {host} dropped before the command's reply arrived; it may or may not have "
            "taken effect"
        )
    rc = result.exit_status if result.exit_status is not None else -1
    return rc, _raw(result.stdout), _raw(result.stderr), host


def _raw(data: bytes | str | None) -> bytes:
    """Return a command's output as bytes (asyncssh types it loosely)."""
    if isinstance(data, str):
        return data.encode()
    return data or b""


async def _async_connect(s: ClusterSettings) -> tuple[str, asyncssh.SSHClientConnection]:
    """Connect to the first login host of ``s`` that answers: that host and its connection."""
    import_asyncssh()
    import asyncssh

    # asyncssh logs every channel and command at INFO: it would bury the trigger's own lines in the task log.
    asyncssh.set_log_level(logging.WARNING)

    async def connect_host(host: str) -> asyncssh.SSHClientConnection:
        options = ssh_options(s, host)
        spelt = _asyncssh_options(options)
        try:
            return await asyncssh.connect(host, **spelt)
        except (OSError, asyncssh.Error) as exc:
            raise host_failure(options, exc) from None

    return await connect_first(s.cluster_name, s.hosts, connect_host)


def _asyncssh_options(options: SshOptions) -> dict[str, Any]:
    """``options`` spelt as :func:`asyncssh.connect`'s keyword arguments."""
    import asyncssh

    spelt: dict[str, Any] = {
        "username": options.user,
        "port": options.port,
        "connect_timeout": options.connect_timeout,
        "keepalive_interval": options.keepalive_s,
    }
    if options.proxy_argv:
        spelt["proxy_command"] = list(options.proxy_argv)
    if options.key_file:
        spelt["client_keys"] = [options.key_file]
        spelt["passphrase"] = options.passphrase
    elif options.private_key:
        spelt["client_keys"] = [asyncssh.import_private_key(options.private_key, options.passphrase)]
    if not options.verify_host_key:
        spelt["known_hosts"] = None
    elif options.host_key is not None:
        pinned = f"{options.known_hosts_name} {options.host_key.get_name()} {options.host_key.get_base64()}\n"
        spelt["known_hosts"] = asyncssh.import_known_hosts(pinned)
    return spelt


_ASYNC_POOL = _AsyncConnectionPool()


def async_pool() -> _AsyncConnectionPool:
    """Return the process-wide async connection pool (shared by every trigger in a triggerer)."""
    return _ASYNC_POOL
