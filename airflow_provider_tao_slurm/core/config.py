"""Cluster connection settings, read from an Airflow connection or from ``SLURM_*`` variables.

Pure: the hook hands in the connection's fields (or a copy of the environment) and gets back a
validated, immutable :class:`ClusterSettings`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tao_slurm.exceptions import ConnectionConfigError

DEFAULT_CONN_TIMEOUT = 10.0
DEFAULT_CMD_TIMEOUT = 120.0

#: The environment variables users of the TAO SLURM workflow already have.
ENV_VARS = (
    "SLURM_USER",
    "SLURM_HOSTNAME",
    "SSH_KEY_PATH",
    "SLURM_PARTITION",
    "SLURM_ACCOUNT",
    "SLURM_BASE_RESULTS_DIR",
    "SLURM_CONTAINER_MOUNTS",
)

_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$|^\[[0-9A-Fa-f:.]+\]$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]*\$?$", re.IGNORECASE)


def _proxy_problem(command: str) -> str | None:
    """Return what is wrong with a ``proxy_command`` extra, or None."""
    if any(ch in command for ch in "\n\r\x00"):
        return "proxy_command must be one line"
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return f"proxy_command is not a valid command line ({exc})"
    if not argv:
        return "proxy_command is empty"
    if not any("%h" in arg for arg in argv):
        return "proxy_command must contain %h (and usually %p), e.g. 'ssh -W %h:%p bastion.example.org'"
    return None


def proxy_argv(command: str, host: str, port: int, user: str) -> list[str]:
    """Return the ``proxy_command`` extra for one login host, as argv.

    OpenSSH's ``%h``, ``%p``, ``%r`` and ``%%`` are expanded per argument (never through a shell), as
    OpenSSH's ``ProxyCommand`` does.

    :param command: the extra, already checked (see :func:`settings_from_connection`).
    """
    tokens = {"h": host, "p": str(port), "r": user, "%": "%"}
    return [re.sub(r"%([hpr%])", lambda m: tokens[m.group(1)], arg) for arg in shlex.split(command)]


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


def _split(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(item.strip() for item in items if item.strip())


@dataclass(frozen=True)
class ClusterSettings:
    """Everything the hook needs to reach and use one SLURM cluster.

    ``private_key`` and ``private_key_passphrase`` are secrets: they are excluded from ``repr``.
    """

    hosts: tuple[str, ...]
    user: str
    port: int = 22
    key_file: str | None = None
    private_key: str | None = field(default=None, repr=False)
    private_key_passphrase: str | None = field(default=None, repr=False)
    host_key: str | None = None
    no_host_key_check: bool = False
    partitions: tuple[str, ...] = ()
    account: str | None = None
    results_dir: str | None = None
    container_mounts: str | None = None
    conversion_partition: str | None = None
    max_time_hours: float | None = None
    cluster_name: str = ""
    conn_timeout: float = DEFAULT_CONN_TIMEOUT
    cmd_timeout: float = DEFAULT_CMD_TIMEOUT
    proxy_command: str | None = None
    #: The provider's RPC bucket (:func:`~airflow_provider_tao_slurm.core.commands.rpc_pacing`); None: four
    #: fifths of the site's ``rl_enable`` bucket, no pacing where the site has none.
    rpc_bucket_size: int | None = None
    rpc_refill_rate: float | None = None

    @property
    def pool_key(self) -> str:
        """Identity of the cluster account: one pooled connection and one poller per key."""
        return f"{self.user}@{self.cluster_name}"


def settings_from_connection(
    *,
    host: str | None,
    login: str | None,
    port: int | None,
    extra: Mapping[str, Any],
    source: str,
    names: Mapping[str, str] | None = None,
) -> ClusterSettings:
    """Build settings from the fields of a ``tao_slurm`` Airflow connection.

    :param source: how the user named these settings (e.g. ``connection 'slurm_default'``), used in errors.
    :param names: what to tell the user to set for ``host``, ``login`` and ``key_file`` (defaults: the
        connection's fields).
    :raises ConnectionConfigError: when a required field is missing or a value is invalid.
    """
    field_names = {"host": "the connection's host", "login": "the connection's login", "key_file": "key_file"}
    field_names.update(names or {})
    problems: list[str] = []
    hosts = _split(host)
    if not hosts:
        problems.append(f"no login host: set {field_names['host']} (comma separated for failover)")
    problems.extend(f"login host {h!r} is not a valid host name" for h in hosts if not _HOST_RE.match(h))
    user = (login or "").strip()
    if not user:
        problems.append(f"no SLURM user: set {field_names['login']}")
    elif not _USER_RE.match(user):
        problems.append(f"user {user!r} is not a valid user name")
    auth = _auth_fields(extra, field_names["key_file"], problems)
    names_ = _name_fields(extra, problems)
    numbers = _number_fields(extra, problems)
    pacing = _pacing_fields(extra, problems)
    port_number = _port(port, problems)
    if problems:
        raise ConnectionConfigError(f"{source} is not usable: " + "; ".join(problems))
    return ClusterSettings(
        hosts=hosts,
        user=user,
        port=port_number,
        **auth,
        **names_,
        max_time_hours=numbers["max_time_hours"],
        cluster_name=str(extra.get("cluster_name") or hosts[0]).strip(),
        conn_timeout=numbers["conn_timeout"] or DEFAULT_CONN_TIMEOUT,
        cmd_timeout=numbers["cmd_timeout"] or DEFAULT_CMD_TIMEOUT,
        **pacing,
    )


def _auth_fields(extra: Mapping[str, Any], key_file_name: str, problems: list[str]) -> dict[str, Any]:
    """Return the connection's key, host-key and proxy settings; what is wrong with them goes to ``problems``."""
    key_file = extra.get("key_file") or None
    private_key = extra.get("private_key") or None
    if key_file and private_key:
        problems.append("both key_file and private_key are set: keep only one")
    if key_file and not str(key_file).startswith("/"):
        problems.append(f"{key_file_name} {key_file!r} must be an absolute path (~ is not expanded)")
    host_key = (extra.get("host_key") or "").strip() or None
    no_check = _truthy(extra.get("no_host_key_check", False))
    if host_key and no_check:
        problems.append("host_key is pinned but no_host_key_check is true: remove no_host_key_check")
    proxy_command = str(extra.get("proxy_command") or "").strip() or None
    problem = _proxy_problem(proxy_command) if proxy_command is not None else None
    if problem:
        problems.append(problem)
    return {
        "key_file": str(key_file) if key_file else None,
        "private_key": str(private_key) if private_key else None,
        "private_key_passphrase": extra.get("private_key_passphrase") or None,
        "host_key": host_key,
        "no_host_key_check": no_check,
        "proxy_command": proxy_command,
    }


def _name_fields(extra: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """Return the connection's partitions, account and cluster paths; what is wrong with them goes to ``problems``."""
    partitions = _split(extra.get("partition"))
    conversion = str(extra.get("conversion_partition") or "").strip() or None
    account = (str(extra["account"]).strip() or None) if extra.get("account") else None
    for label, name in [
        *(("partition", p) for p in partitions),
        ("conversion_partition", conversion),
        ("account", account),
    ]:
        if name is not None and not _NAME_RE.match(name):
            problems.append(f"{label} {name!r} may only contain letters, digits, '_', '.' and '-'")
    results_dir = (str(extra["results_dir"]).strip() or None) if extra.get("results_dir") else None
    if results_dir is not None and not results_dir.startswith("/"):
        problems.append(f"results_dir {results_dir!r} must be an absolute path on the cluster")
    mounts = (str(extra["container_mounts"]).strip() or None) if extra.get("container_mounts") else None
    return {
        "partitions": partitions,
        "account": account,
        "results_dir": results_dir,
        "container_mounts": mounts,
        "conversion_partition": conversion,
    }


def _number_fields(extra: Mapping[str, Any], problems: list[str]) -> dict[str, float | None]:
    """``max_time_hours`` and the timeouts (positive numbers, or their defaults)."""
    numbers: dict[str, float | None] = {}
    for key, default in (
        ("max_time_hours", None),
        ("conn_timeout", DEFAULT_CONN_TIMEOUT),
        ("cmd_timeout", DEFAULT_CMD_TIMEOUT),
    ):
        raw = extra.get(key)
        try:
            numbers[key] = float(raw) if raw not in (None, "") else default
        except (TypeError, ValueError):
            problems.append(f"{key}={raw!r} is not a number")
            numbers[key] = default
        value = numbers[key]
        if value is not None and not value > 0:
            problems.append(f"{key} must be greater than 0")
    return numbers


def _pacing_fields(extra: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """``rpc_bucket_size`` (a whole number >= 1) and ``rpc_refill_rate`` (tokens per second, 0: no pacing).

    Unset (None): the site's share, read from the cluster where the site limits RPCs.
    """
    size, rate = extra.get("rpc_bucket_size"), extra.get("rpc_refill_rate")
    fields: dict[str, Any] = {"rpc_bucket_size": None, "rpc_refill_rate": None}
    if size not in (None, ""):
        try:
            fields["rpc_bucket_size"] = int(str(size))
        except ValueError:
            problems.append(f"rpc_bucket_size={size!r} is not a whole number")
        else:
            if fields["rpc_bucket_size"] < 1:
                problems.append("rpc_bucket_size must be at least 1")
    if rate not in (None, ""):
        try:
            fields["rpc_refill_rate"] = float(rate)
        except (TypeError, ValueError):
            problems.append(f"rpc_refill_rate={rate!r} is not a number")
        else:
            if not 0 <= fields["rpc_refill_rate"] < float("inf"):
                problems.append("rpc_refill_rate must be 0 (no pacing) or more tokens per second")
    return fields


def _port(port: int | None, problems: list[str]) -> int:
    """Return the SSH port (0 or empty: 22, as the SSH provider reads it)."""
    try:
        port_number = int(port) if port else 22
    except (TypeError, ValueError):
        problems.append(f"port {port!r} is not a number")
        return 22
    if not 1 <= port_number <= 65535:
        problems.append(f"port {port_number} is outside 1-65535")
        return 22
    return port_number


def settings_from_env(env: Mapping[str, str]) -> ClusterSettings:
    """Build settings from the ``SLURM_*`` environment variables (see :data:`ENV_VARS`).

    :raises ConnectionConfigError: when ``SLURM_HOSTNAME`` or ``SLURM_USER`` is missing or a value is invalid.
    """
    extra: dict[str, Any] = {
        "key_file": env.get("SSH_KEY_PATH"),
        "partition": env.get("SLURM_PARTITION"),
        "account": env.get("SLURM_ACCOUNT"),
        "results_dir": env.get("SLURM_BASE_RESULTS_DIR"),
        "container_mounts": env.get("SLURM_CONTAINER_MOUNTS"),
    }
    return settings_from_connection(
        host=env.get("SLURM_HOSTNAME"),
        login=env.get("SLURM_USER"),
        port=None,
        extra={k: v for k, v in extra.items() if v},
        source="the SLURM_* environment variables",
        names={"host": "SLURM_HOSTNAME", "login": "SLURM_USER", "key_file": "SSH_KEY_PATH"},
    )
