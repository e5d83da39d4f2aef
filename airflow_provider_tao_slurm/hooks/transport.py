"""The sync transport: paramiko, through the SSH provider's :class:`~airflow.providers.ssh.hooks.ssh.SSHHook`.

:func:`connect` opens one login host's connection from its :class:`~.options.SshOptions` (a pinned
host key must be the one the server presents; Nagle's algorithm is turned off), and
:func:`_exec_channel` runs one command on it. Failing over between hosts is
:func:`~.failover.connect_first_blocking`'s job; paramiko is imported only when a connection is made.
"""

from __future__ import annotations

import logging
import math
import selectors
import shlex
import socket
import time
from typing import TYPE_CHECKING

from airflow_provider_tao_slurm.exceptions import CommandTimeoutError, ConnectionLostError
from airflow_provider_tao_slurm.hooks.failover import host_failure

if TYPE_CHECKING:
    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook

    from airflow_provider_tao_slurm.hooks.options import SshOptions

# paramiko logs every connection ("Connected (version 2.0 ...)", "Authentication ... successful!") at INFO:
# the task log is for the job, so only its warnings and errors are kept (as for asyncssh, see async_transport).
logging.getLogger("paramiko.transport").setLevel(logging.WARNING)


def connect(options: SshOptions) -> paramiko.SSHClient:
    """Connect to one login host.

    The TCP connect, the SSH banner and the authentication each get ``connect_timeout``, and a pinned
    host key must be the one the server presents.

    :raises SlurmConnectionError: (or a subclass) naming the host and why.
    """
    import paramiko

    try:
        client = _ssh_hook(options).get_conn()
        if options.host_key is not None:
            _check_pinned_key(client, options.host, options.host_key)
        _send_without_delay(client)
        return client
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise host_failure(options, exc) from None


def _ssh_hook(options: SshOptions) -> SSHHook:
    """Build an SSH provider hook for one login host, ``options`` spelt in its terms.

    The provider passes no passphrase with a key file, so an encrypted key file is read here and
    handed over as key text, with its passphrase.
    """
    from airflow.providers.ssh.hooks.ssh import SSHHook

    key_text = options.private_key
    if options.key_file and options.passphrase:
        with open(options.key_file) as key:
            key_text = key.read()
    ssh = SSHHook(
        remote_host=options.host,
        username=options.user,
        key_file=None if key_text else options.key_file,
        port=options.port,
        conn_timeout=math.ceil(options.connect_timeout),  # int(0.5) would be 0: a non-blocking connect
        cmd_timeout=options.command_timeout,
        banner_timeout=options.connect_timeout,  # the SSH provider waits 30 s for a silent host's banner
        auth_timeout=math.ceil(options.connect_timeout),
        keepalive_interval=options.keepalive_s,
        conn_retry_attempts=1,
        no_host_key_check=not options.verify_host_key,
        host_proxy_cmd=shlex.join(options.proxy_argv) if options.proxy_argv else None,
    )
    ssh.look_for_keys = False
    if key_text:
        ssh.pkey = ssh._pkey_from_private_key(key_text, passphrase=options.passphrase)
    if options.host_key is not None:
        ssh.host_key = options.host_key
    return ssh


def _check_pinned_key(client: paramiko.SSHClient, host: str, pinned: paramiko.PKey) -> None:
    """Close ``client`` unless its server presented the ``pinned`` host key.

    SSHHook pins the key next to ``~/.ssh/known_hosts``, and paramiko prefers the known_hosts entry: a
    host listed there is checked against that entry only, so the pin alone cannot be trusted to hold.

    :raises paramiko.BadHostKeyException: when the server's key is not the pinned one.
    :raises paramiko.SSHException: when the connection closed before its key could be checked.
    """
    import paramiko

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


def _exec_channel(
    client: paramiko.SSHClient, command: str, stdin: bytes | None, timeout: float | None
) -> tuple[int, bytes, bytes]:
    """Run one command on a new channel of ``client``; returns ``(rc, stdout, stderr)`` as raw bytes.

    :raises ConnectionLostError: when the channel closes without an exit status.
    :raises CommandTimeoutError: when the command does not finish within ``timeout`` (it may still run).
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
                raise CommandTimeoutError(f"remote command did not finish within {timeout:.0f} s")
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
