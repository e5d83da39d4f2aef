"""Tables for ``core/config.py``: cluster settings from a ``tao_slurm`` connection or ``SLURM_*`` variables."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.config import (
    DEFAULT_CMD_TIMEOUT,
    DEFAULT_CONN_TIMEOUT,
    ENV_VARS,
    ClusterSettings,
    proxy_argv,
    settings_from_connection,
    settings_from_env,
)
from airflow_provider_tao_slurm.exceptions import ConnectionConfigError

SOURCE = "connection 'slurm_default'"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHizv4LM5izojF0uyDI1wPcG52jNsYD89gh3hjRU3ygW"
MINIMAL = ClusterSettings(hosts=("login1",), user="alice", cluster_name="login1")


def from_connection(host: Any = "login1", login: Any = "alice", port: Any = None, **extra: Any) -> ClusterSettings:
    return settings_from_connection(host=host, login=login, port=port, extra=extra, source=SOURCE)


# ---------------------------------------------------------------------- valid connections


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, MINIMAL),
        ({"host": " login1 , login2,, "}, dataclasses.replace(MINIMAL, hosts=("login1", "login2"))),
        ({"host": "[fd00::1]"}, dataclasses.replace(MINIMAL, hosts=("[fd00::1]",), cluster_name="[fd00::1]")),
        ({"host": "10.0.0.5", "port": 2222}, dataclasses.replace(MINIMAL, hosts=("10.0.0.5",), port=2222,
                                                                  cluster_name="10.0.0.5")),
        ({"port": 0}, MINIMAL),
        ({"login": " svc$ "}, dataclasses.replace(MINIMAL, user="svc$")),
        ({"key_file": "/home/alice/id"}, dataclasses.replace(MINIMAL, key_file="/home/alice/id")),
        ({"key_file": ""}, MINIMAL),
        ({"private_key": "PEM", "private_key_passphrase": "pw"},
         dataclasses.replace(MINIMAL, private_key="PEM", private_key_passphrase="pw")),
        ({"host_key": f"  {HOST_KEY}\n"}, dataclasses.replace(MINIMAL, host_key=HOST_KEY)),
        ({"host_key": "   "}, MINIMAL),
        ({"no_host_key_check": "true"}, dataclasses.replace(MINIMAL, no_host_key_check=True)),
        ({"no_host_key_check": True}, dataclasses.replace(MINIMAL, no_host_key_check=True)),
        ({"no_host_key_check": " ON "}, dataclasses.replace(MINIMAL, no_host_key_check=True)),
        ({"no_host_key_check": "false"}, MINIMAL),
        ({"no_host_key_check": "0"}, MINIMAL),
        ({"partition": "polar, grizzly"}, dataclasses.replace(MINIMAL, partitions=("polar", "grizzly"))),
        ({"partition": ["polar", " grizzly "]}, dataclasses.replace(MINIMAL, partitions=("polar", "grizzly"))),
        ({"partition": " , "}, MINIMAL),
        ({"account": " gpu_proj "}, dataclasses.replace(MINIMAL, account="gpu_proj")),
        ({"account": "  "}, MINIMAL),
        ({"results_dir": " /lustre/alice "}, dataclasses.replace(MINIMAL, results_dir="/lustre/alice")),
        ({"container_mounts": "/lustre:/lustre,/data:/data:ro"},
         dataclasses.replace(MINIMAL, container_mounts="/lustre:/lustre,/data:/data:ro")),
        ({"conversion_partition": "cpu"}, dataclasses.replace(MINIMAL, conversion_partition="cpu")),
        ({"max_time_hours": "2.5"}, dataclasses.replace(MINIMAL, max_time_hours=2.5)),
        ({"max_time_hours": ""}, MINIMAL),
        ({"conn_timeout": 3, "cmd_timeout": "30"}, dataclasses.replace(MINIMAL, conn_timeout=3.0, cmd_timeout=30.0)),
        ({"cluster_name": " polaris "}, dataclasses.replace(MINIMAL, cluster_name="polaris")),
        ({"rpc_bucket_size": "30", "rpc_refill_rate": 2},
         dataclasses.replace(MINIMAL, rpc_bucket_size=30, rpc_refill_rate=2.0)),
        ({"rpc_refill_rate": "0"}, dataclasses.replace(MINIMAL, rpc_refill_rate=0.0)),
    ],
    ids=[
        "minimal",
        "host-list-with-blanks",
        "ipv6-literal",
        "ip-and-port",
        "port-0-means-22",
        "machine-account-user",
        "key-file",
        "empty-key-file",
        "private-key",
        "host-key-stripped",
        "blank-host-key",
        "no-check-text",
        "no-check-bool",
        "no-check-on",
        "no-check-false",
        "no-check-zero",
        "partition-text",
        "partition-list",
        "blank-partition-means-default",
        "account",
        "blank-account",
        "results-dir",
        "container-mounts",
        "conversion-partition",
        "max-time-text",
        "max-time-blank",
        "timeouts",
        "cluster-name",
        "rpc-budget",
        "no-pacing",
    ],
)  # fmt: skip
def test_valid_connection(fields: dict[str, Any], expected: ClusterSettings) -> None:
    host = fields.pop("host", "login1")
    login = fields.pop("login", "alice")
    port = fields.pop("port", None)
    assert from_connection(host, login, port, **fields) == expected


def test_defaults() -> None:
    assert (
        MINIMAL.port,
        MINIMAL.partitions,
        MINIMAL.conversion_partition,
        MINIMAL.max_time_hours,
        MINIMAL.conn_timeout,
        MINIMAL.cmd_timeout,
        MINIMAL.no_host_key_check,
    ) == (
        22,
        (),  # no partition name built in: the cluster's default partition
        None,  # conversion: the connection's, else the cluster's default partition
        None,  # no site rule: the partition's own MaxTime is checked
        DEFAULT_CONN_TIMEOUT,
        DEFAULT_CMD_TIMEOUT,
        False,
    )


# ---------------------------------------------------------------------- invalid connections


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"host": None}, "no login host: set the connection's host (comma separated for failover)"),
        ({"host": " , "}, "no login host: set the connection's host (comma separated for failover)"),
        ({"host": "login1,bad host"}, "login host 'bad host' is not a valid host name"),
        ({"host": "-oProxyCommand=touch /tmp/x"}, "login host '-oProxyCommand=touch /tmp/x' is not a valid host name"),
        ({"host": "login1."}, "login host 'login1.' is not a valid host name"),
        ({"login": None}, "no SLURM user: set the connection's login"),
        ({"login": "  "}, "no SLURM user: set the connection's login"),
        ({"login": "al ice"}, "user 'al ice' is not a valid user name"),
        ({"login": "-oX"}, "user '-oX' is not a valid user name"),
        ({"key_file": "/k", "private_key": "PEM"}, "both key_file and private_key are set: keep only one"),
        ({"host_key": HOST_KEY, "no_host_key_check": "true"},
         "host_key is pinned but no_host_key_check is true: remove no_host_key_check"),
        ({"partition": "polar;reboot"}, "partition 'polar;reboot' may only contain letters, digits, '_', '.' and '-'"),
        ({"partition": "polar,-x"}, "partition '-x' may only contain letters, digits, '_', '.' and '-'"),
        ({"conversion_partition": "cpu long"},
         "conversion_partition 'cpu long' may only contain letters, digits, '_', '.' and '-'"),
        ({"account": "$(id)"}, "account '$(id)' may only contain letters, digits, '_', '.' and '-'"),
        ({"results_dir": "lustre/alice"}, "results_dir 'lustre/alice' must be an absolute path on the cluster"),
        ({"max_time_hours": "four"}, "max_time_hours='four' is not a number"),
        ({"max_time_hours": 0}, "max_time_hours must be greater than 0"),
        ({"conn_timeout": -1}, "conn_timeout must be greater than 0"),
        ({"cmd_timeout": "nan"}, "cmd_timeout must be greater than 0"),
        ({"cmd_timeout": [1]}, "cmd_timeout=[1] is not a number"),
        ({"port": "ssh"}, "port 'ssh' is not a number"),
        ({"rpc_bucket_size": "2.5"}, "rpc_bucket_size='2.5' is not a whole number"),
        ({"rpc_bucket_size": 0}, "rpc_bucket_size must be at least 1"),
        ({"rpc_refill_rate": "fast"}, "rpc_refill_rate='fast' is not a number"),
        ({"rpc_refill_rate": -1}, "rpc_refill_rate must be 0 (no pacing) or more tokens per second"),
        ({"rpc_refill_rate": "nan"}, "rpc_refill_rate must be 0 (no pacing) or more tokens per second"),
    ],
    ids=[
        "no-host",
        "blank-host-list",
        "host-with-space",
        "host-as-ssh-option",
        "host-trailing-dot",
        "no-login",
        "blank-login",
        "login-with-space",
        "login-as-ssh-option",
        "two-keys",
        "pinned-and-unchecked",
        "partition-shell",
        "partition-option",
        "conversion-partition-space",
        "account-substitution",
        "relative-results-dir",
        "max-time-text",
        "max-time-zero",
        "negative-timeout",
        "nan-timeout",
        "list-timeout",
        "named-port",
        "fractional-bucket",
        "empty-bucket",
        "rate-text",
        "negative-rate",
        "nan-rate",
    ],
)  # fmt: skip
def test_invalid_connection_names_the_problem(fields: dict[str, Any], problem: str) -> None:
    host = fields.pop("host", "login1")
    login = fields.pop("login", "alice")
    port = fields.pop("port", None)
    with pytest.raises(ConnectionConfigError) as caught:
        from_connection(host, login, port, **fields)
    assert str(caught.value) == f"{SOURCE} is not usable: {problem}"


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConnectionConfigError) as caught:
        from_connection(None, None, "x", results_dir="rel", cmd_timeout="0")
    assert str(caught.value) == (
        f"{SOURCE} is not usable: no login host: set the connection's host (comma separated for failover); "
        "no SLURM user: set the connection's login; results_dir 'rel' must be an absolute path on the cluster; "
        "cmd_timeout must be greater than 0; port 'x' is not a number"
    )


def test_errors_never_show_the_private_key() -> None:
    with pytest.raises(ConnectionConfigError) as caught:
        from_connection(key_file="/k", private_key="-----BEGIN OPENSSH PRIVATE KEY-----SECRETBODY")
    assert "SECRETBODY" not in str(caught.value)


# ---------------------------------------------------------------------- SLURM_* variables


FULL_ENV = {
    "SLURM_USER": "alice",
    "SLURM_HOSTNAME": "login1,login2",
    "SSH_KEY_PATH": "/home/alice/.ssh/id_ed25519",
    "SLURM_PARTITION": "polar",
    "SLURM_ACCOUNT": "gpu_proj",
    "SLURM_BASE_RESULTS_DIR": "/lustre/alice",
    "SLURM_CONTAINER_MOUNTS": "/lustre:/lustre",
}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            FULL_ENV,
            ClusterSettings(
                hosts=("login1", "login2"),
                user="alice",
                key_file="/home/alice/.ssh/id_ed25519",
                partitions=("polar",),
                account="gpu_proj",
                results_dir="/lustre/alice",
                container_mounts="/lustre:/lustre",
                cluster_name="login1",
            ),
        ),
        ({"SLURM_USER": "alice", "SLURM_HOSTNAME": "login1"}, MINIMAL),
        ({**dict.fromkeys(ENV_VARS, ""), "SLURM_USER": "alice", "SLURM_HOSTNAME": "login1"}, MINIMAL),
        ({"SLURM_USER": "alice", "SLURM_HOSTNAME": "login1", "HOME": "/home/alice", "SLURM_JOB_ID": "7"}, MINIMAL),
    ],
    ids=["all-variables", "required-only", "empty-variables-ignored", "unrelated-variables-ignored"],
)
def test_settings_from_env(env: dict[str, str], expected: ClusterSettings) -> None:
    assert settings_from_env(env) == expected


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"SLURM_USER": "alice"}, "no login host"),
        ({"SLURM_HOSTNAME": "login1"}, "no SLURM user"),
        ({**FULL_ENV, "SLURM_BASE_RESULTS_DIR": "results"}, "results_dir 'results' must be an absolute path"),
        ({**FULL_ENV, "SLURM_PARTITION": "polar grizzly"}, "partition 'polar grizzly' may only contain"),
    ],
    ids=["no-hostname", "no-user", "relative-results-dir", "partition-with-space"],
)
def test_settings_from_env_errors_name_the_environment(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConnectionConfigError) as caught:
        settings_from_env(env)
    assert str(caught.value).startswith(f"the SLURM_* environment variables is not usable: {problem}")


# ---------------------------------------------------------------------- the settings object


def test_settings_identity_and_secrets() -> None:
    settings = ClusterSettings(
        hosts=("login1", "login2"),
        user="alice",
        private_key="-----BEGIN OPENSSH PRIVATE KEY-----SECRETBODY",
        private_key_passphrase="PASSPHRASE",
        partitions=("grizzly", "polar"),
        cluster_name="polaris",
    )
    assert settings.partitions[0] == "grizzly"
    assert settings.pool_key == "alice@polaris"
    assert "SECRETBODY" not in repr(settings)
    assert "PASSPHRASE" not in repr(settings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.user = "bob"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("port", "key_file", "message"),
    [
        (-1, None, "port -1 is outside 1-65535"),
        (70000, None, "port 70000 is outside 1-65535"),
        (22, "~/.ssh/id_ed25519", "must be an absolute path"),
    ],
    ids=["negative-port", "huge-port", "tilde-key"],
)
def test_connection_port_and_key_file_checks(port: int, key_file: str | None, message: str) -> None:
    extra = {"key_file": key_file} if key_file else {}
    with pytest.raises(ConnectionConfigError, match=message):
        settings_from_connection(host="login1", login="u", port=port, extra=extra, source="connection 'x'")


def test_env_errors_name_the_variables() -> None:
    with pytest.raises(ConnectionConfigError, match=r"set SLURM_HOSTNAME.*set SLURM_USER"):
        settings_from_env({})


# ---------------------------------------------------------------------- jump host (proxy_command)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("ssh -W bastion", "proxy_command must contain %h (and usually %p)"),
        ("ssh -W %h:%p 'bastion", "proxy_command is not a valid command line (No closing quotation)"),
        ("ssh -W %h:%p bastion\nid", "proxy_command must be one line"),
    ],
    ids=["no-host-token", "bad-quoting", "two-lines"],
)
def test_a_bad_proxy_command_is_refused(command: str, problem: str) -> None:
    with pytest.raises(ConnectionConfigError, match=re.escape(problem)):
        from_connection(proxy_command=command)


@pytest.mark.parametrize(
    ("command", "host", "argv"),
    [
        (
            "ssh -W %h:%p -p 2222 jump@bastion",
            "login1",
            ["ssh", "-W", "login1:22", "-p", "2222", "jump@bastion"],
        ),
        (
            "nc -X connect -x 'proxy host:3128' %h %p",
            "login2.example.org",
            ["nc", "-X", "connect", "-x", "proxy host:3128", "login2.example.org", "22"],
        ),
        ("ssh -l %r -W %h:%p b --comment=100%%", "l", ["ssh", "-l", "alice", "-W", "l:22", "b", "--comment=100%"]),
    ],
    ids=["ssh-w", "quoted-argument", "user-and-percent"],
)
def test_proxy_command_expands_per_login_host_without_a_shell(command: str, host: str, argv: list[str]) -> None:
    settings = from_connection(proxy_command=command)
    assert settings.proxy_command == command
    assert proxy_argv(command, host, settings.port, settings.user) == argv
