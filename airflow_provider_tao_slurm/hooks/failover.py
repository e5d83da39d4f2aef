"""Login-host failover, one loop for both transports, and why a login host failed, in words.

:func:`connect_first` tries the configured login hosts in order and returns the first that answered
with its connection, so the caller remembers which host it is on; when none answers, the error
lists every host and why. The asyncssh pool awaits it; the paramiko side runs the very same loop
through :func:`connect_first_blocking`. Each transport's connect to one host reports its failure
with :func:`host_failure`, so a host fails the same way whichever library tried it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from airflow_provider_tao_slurm.exceptions import (
    HostKeyError,
    SlurmAuthenticationError,
    SlurmConnectionError,
)

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.hooks.options import SshOptions

log = logging.getLogger(__name__)

Connection = TypeVar("Connection")

#: What paramiko says when a host ran out of time: the session never negotiated (``start_client`` gave up),
#: no SSH banner within ``banner_timeout``, no answer to authentication within ``auth_timeout``.
_PARAMIKO_TIMEOUTS = ("No existing session", "Error reading SSH protocol banner", "Authentication timeout.")


async def connect_first(
    cluster_name: str,
    hosts: Sequence[str],
    connect: Callable[[str], Awaitable[Connection]],
) -> tuple[str, Connection]:
    """Connect to the first of ``hosts`` that answers, trying them in order.

    :param cluster_name: the cluster, for the error.
    :param connect: connects to one host; raises :class:`SlurmConnectionError` (or a subclass) with that
        host's ``failures`` when it does not answer. Any other error (a bad setting) ends the loop.
    :returns: the host that answered and its connection.
    :raises SlurmConnectionError: (the class every host failed with, when they agree) naming every host and why.
    """
    failures: list[tuple[str, str]] = []
    kinds: set[type[SlurmConnectionError]] = set()
    for host in hosts:
        try:
            connection = await connect(host)
        except SlurmConnectionError as exc:
            failures.extend(exc.failures)
            kinds.add(type(exc))
            log.warning("Login host failed, trying the next one: %s", exc)
            continue
        if failures:
            log.warning("Connected to %s after %d failed login host(s)", host, len(failures))
        return host, connection
    raise _no_host_answered(cluster_name, failures, kinds)


def connect_first_blocking(
    cluster_name: str,
    hosts: Sequence[str],
    connect: Callable[[str], Connection],
) -> tuple[str, Connection]:
    """:func:`connect_first` for a blocking ``connect``: the same loop, run to its end without an event loop.

    ``connect`` is wrapped in a coroutine that never suspends, so the loop's coroutine finishes on its
    first step: no event loop is needed (or disturbed, when the caller runs inside one).
    """

    async def connect_now(host: str) -> Connection:
        return connect(host)

    steps = connect_first(cluster_name, hosts, connect_now)
    try:
        steps.send(None)
    except StopIteration as done:
        answer: tuple[str, Connection] = done.value
        return answer
    steps.close()
    raise RuntimeError("a blocking connect suspended the failover loop")


def host_failure(options: SshOptions, exc: BaseException) -> SlurmConnectionError:
    """One login host's failed connect (paramiko or asyncssh) as the error :func:`connect_first` expects."""
    message, kind = _describe_connect_error(
        options.host,
        options.port,
        exc,
        timeout=options.connect_timeout,
        pinned=options.host_key is not None,
    )
    return kind(message, [(options.host, message)])


def _no_host_answered(
    cluster_name: str, failures: Sequence[tuple[str, str]], kinds: set[type[SlurmConnectionError]]
) -> SlurmConnectionError:
    """Return the error for a failover that ran out of login hosts: the common error class, every host and why."""
    kind = kinds.pop() if len(kinds) == 1 else SlurmConnectionError
    detail = "; ".join(reason for _, reason in failures)
    return kind(f"no login host of cluster {cluster_name!r} answered: {detail}", failures)


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
