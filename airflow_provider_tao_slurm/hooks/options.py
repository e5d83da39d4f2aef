"""The connection's settings in SSH terms, decided once for both transports.

Which key (a key file, refused when others can read it, or key text, each with its passphrase), how
the login host's key is trusted (pinned with ``host_key``, from ``~/.ssh/known_hosts``, or not at
all), the timeouts, keepalive and jump host: :func:`ssh_options` decides all of it for one login host.
The paramiko transport (:mod:`~airflow_provider_tao_slurm.hooks.transport`) and the asyncssh one
(:mod:`~airflow_provider_tao_slurm.hooks.async_transport`) only spell the same
:class:`SshOptions` in their library's terms.
"""

from __future__ import annotations

import base64
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_tao_slurm.core.config import ClusterSettings, proxy_argv
from airflow_provider_tao_slurm.exceptions import ConnectionConfigError, KeyFilePermissionError

if TYPE_CHECKING:
    import paramiko

    #: A host key type login hosts use, as paramiko holds it.
    PinnedKey = paramiko.RSAKey | paramiko.ECDSAKey | paramiko.Ed25519Key

log = logging.getLogger(__name__)

#: Seconds between SSH keepalives on an idle connection (both transports).
KEEPALIVE_S = 30


@dataclass(frozen=True)
class SshOptions:
    """How to reach, authenticate to and trust one login host.

    :param host: the login host.
    :param port: its SSH port.
    :param user: the SLURM user logging in.
    :param key_file: the private key file (mode checked), or None.
    :param private_key: the private key text, or None (a secret: not in ``repr``).
    :param passphrase: the passphrase of an encrypted key, file or text (a secret: not in ``repr``).
    :param verify_host_key: False only with ``no_host_key_check``.
    :param host_key: the pinned host key; None to trust ``~/.ssh/known_hosts`` (when verifying).
    :param connect_timeout: seconds for the TCP connect, the SSH banner and the authentication each.
    :param command_timeout: seconds one remote command may take.
    :param proxy_argv: the jump host command for this host (``proxy_command`` expanded), or None.
    :param keepalive_s: seconds between keepalives.
    """

    host: str
    port: int
    user: str
    key_file: str | None
    private_key: str | None = field(repr=False)
    passphrase: str | None = field(repr=False)
    verify_host_key: bool
    host_key: PinnedKey | None
    connect_timeout: float
    command_timeout: float
    proxy_argv: tuple[str, ...] | None
    keepalive_s: int = KEEPALIVE_S

    @property
    def known_hosts_name(self) -> str:
        """The host as a known_hosts line names it: ``host``, or ``[host]:port`` off port 22."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


def ssh_options(s: ClusterSettings, host: str) -> SshOptions:
    """Return the SSH options for one login host of ``s``.

    :raises KeyFilePermissionError: for a key file that is missing or readable by group or others.
    :raises ConnectionConfigError: for a pinned host key that is not a usable key.
    """
    if s.key_file:
        check_key_file(s.key_file)
    if s.no_host_key_check:
        log.warning(
            "Host key checking is OFF for %s (no_host_key_check): connections are open to man-in-the-middle attacks",
            host,
        )
    return SshOptions(
        host=host,
        port=s.port,
        user=s.user,
        key_file=s.key_file,
        private_key=s.private_key,
        passphrase=s.private_key_passphrase,
        verify_host_key=not s.no_host_key_check,
        host_key=_pinned_host_key(s.host_key) if s.host_key else None,
        connect_timeout=s.conn_timeout,
        command_timeout=s.cmd_timeout,
        proxy_argv=tuple(proxy_argv(s.proxy_command, host, s.port, s.user)) if s.proxy_command else None,
    )


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


def _pinned_host_key(host_key: str) -> PinnedKey:
    """Return the pinned ``host_key`` extra (``<type> <base64>``, as in known_hosts) as a paramiko key.

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
