"""Security suite (issue 10): hostile and bad input over every user-facing parameter.

Every value here carries shell metacharacters, quotes, newlines, globs, leading dashes, unicode, huge
lengths or emptiness, and every injection attempt would create the canary file. Each value is either

- refused before any remote command, with an error naming the parameter (``test_refused``: the SSH
  layer is watched at paramiko's connect/exec and asyncssh's connect, and must see nothing), or
- accepted and passed quoted (``test_accepted_values_arrive_byte_exact``): one real job carries all of
  them at once and writes back what it received, which must equal what was given, byte for byte.

At the end the canary must not exist, and the job must have written nothing outside its own
directories under a results base of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncssh
import paramiko
import pytest
import yaml
from clusterkit import SECRET_SOURCE, connection_json, digest, jobs_named, record_of, remote_text, sensor_for, submit
from deferral import context, defer, first_event, resume, run_async

from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.core.storage import display_value
from airflow_provider_tao_slurm.exceptions import (
    ConnectionConfigError,
    ImageReferenceError,
    ResourceError,
    SecretLeakError,
    StoragePathError,
    TemplateRenderError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import PARTITION_CACHE_NAME, SlurmHook
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.operators.preflight import SlurmPreflightOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

TOKEN = uuid.uuid4().hex[:8]
#: Fixed, so that a canary left by an injection in any earlier run fails every later run too.
CANARY = "/tmp/tao-rl-canary"
TOUCH = f"touch {CANARY}"
SQSH = "/srv/lustre/containers/reliability.sqsh"
CTX = context("rl-hostile", "train", "r1")
LONG = "x" * 5000


# ---------------------------------------------------------------------- the refused table


@dataclass(frozen=True)
class Case:
    """One bad value: which parameter, the value, how it is used, and the error it must raise first."""

    case_id: str
    parameter: str
    value: Any
    action: Callable[[], Any]
    error: type[Exception]
    mentions: str
    connection: dict[str, Any] = field(default_factory=dict)


def submit_with(**kwargs: Any) -> Callable[[], Any]:
    """Run ``SbatchSubmitOperator(...).execute`` with small valid defaults overridden by ``kwargs``."""
    args: dict[str, Any] = {
        "image": SQSH,
        "command": "true",
        "gpus_per_node": 1,
        "cpus_per_task": 1,
        "time_hours": 0.1,
        "timeout_hours": 0.05,
    }
    args.update(kwargs)
    return lambda: SbatchSubmitOperator(task_id="train", **args).execute(CTX)


def import_with(**kwargs: Any) -> Callable[[], Any]:
    """Run ``EnrootImportOperator(...).execute``; the image defaults to a valid registry reference."""
    args: dict[str, Any] = {"image": "nvcr.io#nvidia/tao:5.5.0"}
    args.update(kwargs)
    return lambda: EnrootImportOperator(task_id="import", **args).execute(CTX)


def probe_with(**kwargs: Any) -> Callable[[], Any]:
    """Run ``NcclProbeOperator(...).execute`` for a two-node job."""
    args: dict[str, Any] = {"image": SQSH, "num_nodes": 2, "gpus_per_node": 1}
    args.update(kwargs)
    return lambda: NcclProbeOperator(task_id="probe", **args).execute(CTX)


def check_paths(paths: Any) -> Callable[[], Any]:
    """Run ``StageDatasetCheckOperator(paths=...).execute``."""
    return lambda: StageDatasetCheckOperator(task_id="check", paths=paths).execute(CTX)


def preflight_with(**kwargs: Any) -> Callable[[], Any]:
    """Run ``SlurmPreflightOperator(...).execute``."""
    return lambda: SlurmPreflightOperator(task_id="preflight", **kwargs).execute(CTX)


def sense(job: Any) -> Callable[[], Any]:
    """Run ``SlurmJobSensor(job=...).execute``."""
    return lambda: SlurmJobSensor(task_id="wait", job=job).execute(CTX)


def hook_run() -> Any:
    """What every operator does first with a connection: build the hook's settings, then run a command."""
    return SlurmHook().run("true")


HANDLE = {
    "job_id": "tao-rl-1",
    "slurm_job_id": "1",
    "job_dir": "/srv/lustre/j",
    "results_dir": "/srv/lustre/r",
    "record_path": "/srv/lustre/r.json",
    "results_base": "/srv/lustre",
}

S, E, D, N, P, J, C = (
    "SbatchSubmitOperator",
    "EnrootImportOperator",
    "StageDatasetCheckOperator",
    "NcclProbeOperator",
    "SlurmPreflightOperator",
    "SlurmJobSensor",
    "connection",
)
RUNNERS: dict[str, Callable[..., Callable[[], Any]]] = {
    S: submit_with,
    E: import_with,
    D: check_paths,
    N: probe_with,
    P: preflight_with,
    J: sense,
}


def refused(case_id: str, target: str, value: Any, error: type[Exception], mentions: str, **extra: Any) -> Case:
    """A case giving ``value`` to ``target``: ``Operator.param``, ``connection.field`` or ``connection.extra.key``."""
    owner, _, parameter = target.partition(".")
    if owner == C:
        key, _, extra_key = parameter.partition(".")
        change = {"extra": {extra_key: value}} if extra_key else {key: value}
        return Case(case_id, target, value, hook_run, error, mentions, change)
    return Case(case_id, target, value, RUNNERS[owner](**{parameter: value}, **extra), error, mentions)


CASES = [
    # SbatchSubmitOperator.image
    refused("image-semicolon", f"{S}.image", f"{SQSH};{TOUCH}", ImageReferenceError, "image"),
    refused("image-command-substitution", f"{S}.image", f"/srv/lustre/$({TOUCH}).sqsh", ImageReferenceError, "image"),
    refused("image-backticks", f"{S}.image", f"/srv/lustre/`{TOUCH}`.sqsh", ImageReferenceError, "image"),
    refused("image-and-and", f"{S}.image", f"{SQSH} && {TOUCH}", ImageReferenceError, "image"),
    refused("image-newline", f"{S}.image", f"{SQSH}\n{TOUCH}", ImageReferenceError, "image"),
    refused("image-space", f"{S}.image", "/srv/lustre/my image.sqsh", ImageReferenceError, "image"),
    refused("image-quote", f"{S}.image", "/srv/lustre/it's.sqsh", ImageReferenceError, "image"),
    refused("image-glob", f"{S}.image", "/srv/lustre/*.sqsh", ImageReferenceError, "image"),
    refused("image-leading-dash", f"{S}.image", "-oProxyCommand.sqsh", ImageReferenceError, "'-'"),
    refused("image-relative", f"{S}.image", "containers/x.sqsh", ImageReferenceError, "relative"),
    refused("image-dotdot", f"{S}.image", "/srv/lustre/../../etc/x.sqsh", ImageReferenceError, ".."),
    refused("image-registry", f"{S}.image", "nvcr.io#nvidia/tao:5", ImageReferenceError, "EnrootImportOperator"),
    refused("image-empty", f"{S}.image", "", ImageReferenceError, "empty"),
    refused("image-unicode", f"{S}.image", "/srv/lustre/bild-\u00e4.sqsh", ImageReferenceError, "image"),
    refused("image-very-long", f"{S}.image", f"/{LONG}.sqsh", ImageReferenceError, "longer"),
    # SbatchSubmitOperator.command
    refused("command-empty", f"{S}.command", "", ValidationError, "command is empty"),
    refused("command-blank", f"{S}.command", " \n\t", ValidationError, "command is empty"),
    refused("command-nul", f"{S}.command", "echo a\x00b", ValidationError, "command contains a NUL"),
    # GPU, node, CPU and memory counts
    refused("gpus-shell", f"{S}.gpus_per_node", f"4; {TOUCH}", ResourceError, "gpus_per_node"),
    refused("gpus-zero", f"{S}.gpus_per_node", 0, ResourceError, "gpus_per_node"),
    refused("gpus-negative", f"{S}.gpus_per_node", -1, ResourceError, "gpus_per_node"),
    refused("gpus-fraction", f"{S}.gpus_per_node", 1.5, ResourceError, "gpus_per_node"),
    refused("gpus-bool", f"{S}.gpus_per_node", True, ResourceError, "gpus_per_node"),
    refused("nodes-zero", f"{S}.num_nodes", 0, ResourceError, "num_nodes"),
    refused("nodes-text", f"{S}.num_nodes", "2", ResourceError, "num_nodes"),
    refused("cpus-substitution", f"{S}.cpus_per_task", "$(nproc)", ResourceError, "cpus_per_task"),
    refused("mem-text", f"{S}.mem_mb", "1G", ResourceError, "mem_mb"),
    refused("mem-zero", f"{S}.mem_mb", 0, ResourceError, "mem_mb"),
    # times
    refused("time-text", f"{S}.time_hours", "4", ResourceError, "time_hours"),
    refused("time-slurm-format", f"{S}.time_hours", "04:00:00", ResourceError, "time_hours"),
    refused("time-nan", f"{S}.time_hours", float("nan"), ResourceError, "time_hours"),
    refused("time-infinite", f"{S}.time_hours", float("inf"), ResourceError, "time_hours"),
    refused("time-zero", f"{S}.time_hours", 0, ResourceError, "time_hours"),
    refused("time-negative", f"{S}.time_hours", -1, ResourceError, "time_hours"),
    refused("timeout-not-below-time", f"{S}.timeout_hours", 0.1, ResourceError, "timeout_hours"),
    # partition and account names
    refused("partition-semicolon", f"{S}.partition", f"polar;{TOUCH}", ResourceError, "partition"),
    refused("partition-and-and", f"{S}.partition", f"polar && {TOUCH}", ResourceError, "partition"),
    refused("partition-substitution", f"{S}.partition", f"$({TOUCH})", ResourceError, "partition"),
    refused("partition-backticks", f"{S}.partition", f"`{TOUCH}`", ResourceError, "partition"),
    refused("partition-space", f"{S}.partition", "polar cpu_long", ResourceError, "partition"),
    refused("partition-leading-dash", f"{S}.partition", "--uid=0", ResourceError, "partition"),
    refused("partition-newline-directive", f"{S}.partition", "polar\n#SBATCH --uid=0", ResourceError, "partition"),
    refused("partition-empty-entry", f"{S}.partition", "polar,,cpu_long", ResourceError, "empty entry"),
    refused("partition-glob", f"{S}.partition", "pol*", ResourceError, "partition"),
    refused("partition-unicode", f"{S}.partition", "p\u00f8lar", ResourceError, "partition"),
    refused("partition-very-long", f"{S}.partition", "p" * 200, ResourceError, "partition"),
    refused("account-semicolon", f"{S}.account", f"gpu_proj;{TOUCH}", ResourceError, "account"),
    refused("account-quote", f"{S}.account", "gpu'proj", ResourceError, "account"),
    refused("account-newline", f"{S}.account", "gpu_proj\nx", ResourceError, "account"),
    refused("account-leading-dash", f"{S}.account", "--uid=0", ResourceError, "account"),
    # nodes to exclude
    refused("exclude-semicolon", f"{S}.exclude_nodes", f"n1;{TOUCH}", ResourceError, "exclude_nodes"),
    refused("exclude-substitution", f"{S}.exclude_nodes", [f"$({TOUCH})"], ResourceError, "exclude_nodes"),
    refused("exclude-space", f"{S}.exclude_nodes", "n1 n2", ResourceError, "exclude_nodes"),
    refused("exclude-leading-dash", f"{S}.exclude_nodes", "-n1", ResourceError, "exclude_nodes"),
    refused("exclude-reversed-range", f"{S}.exclude_nodes", "n[2-1]", ResourceError, "exclude_nodes"),
    # environment names and values
    refused("env-name-space", f"{S}.env", {"A B": "1"}, ValidationError, "env name"),
    refused("env-name-digit", f"{S}.env", {"1A": "1"}, ValidationError, "env name"),
    refused("env-name-semicolon", f"{S}.env", {f"A;{TOUCH}": "1"}, ValidationError, "env name"),
    refused("env-name-substitution", f"{S}.env", {f"$({TOUCH})": "1"}, ValidationError, "env name"),
    refused("env-name-newline", f"{S}.env", {"A\nB": "1"}, ValidationError, "env name"),
    refused("env-name-empty", f"{S}.env", {"": "1"}, ValidationError, "env name"),
    refused("env-name-dash", f"{S}.env", {"A-B": "1"}, ValidationError, "env name"),
    refused("env-name-unicode", f"{S}.env", {"\u00c4": "1"}, ValidationError, "env name"),
    refused("env-name-reserved-slurm", f"{S}.env", {"SLURM_JOB_ID": "1"}, ValidationError, "SLURM_JOB_ID"),
    refused("env-name-reserved-rendezvous", f"{S}.env", {"MASTER_ADDR": "n1"}, ValidationError, "MASTER_ADDR"),
    refused("env-value-not-text", f"{S}.env", {"EPOCHS": 3}, ValidationError, "string"),
    refused("env-value-nul", f"{S}.env", {"A": "a\x00b"}, ValidationError, "env['A'] contains a NUL"),
    refused(
        "env-value-literal-credential", f"{S}.env", {"WANDB_API_KEY": "0123456789abcdef0123"}, SecretLeakError, "env"
    ),
    # secrets
    refused("secret-name-substitution", f"{S}.secret_env", {f"$({TOUCH})": "x"}, ValidationError, "secret_env"),
    refused("secret-value-empty", f"{S}.secret_env", {"TOKEN": ""}, ValidationError, "literal"),
    refused("secret-value-literal", f"{S}.secret_env", {"TOKEN": "s3cr3t-v4lue"}, ValidationError, "literal"),
    refused("secret-source-unset", f"{S}.secret_env", {"TOKEN": "env:RL_NOT_SET"}, ValidationError, "RL_NOT_SET"),
    refused(
        "secret-value-in-command",
        f"{S}.command",
        "echo s3cr3t-v4lue",
        SecretLeakError,
        "secret_env value",
        secret_env={"TOKEN": "env:RL_TOKEN_VALUE"},
    ),
    refused("nccl-env-name-substitution", f"{S}.nccl_env", {f"$({TOUCH})": "1"}, ValidationError, "nccl_env"),
    refused("multi-node-without-nccl-env", f"{S}.num_nodes", 2, ValidationError, "NcclProbeOperator"),
    # spec, mounts, flags
    refused("spec-yaml-list", f"{S}.spec", "- a\n- b", ValidationError, "spec"),
    refused("spec-invalid-yaml", f"{S}.spec", "a: [b", ValidationError, "spec"),
    refused("command-template-placeholder", f"{S}.command", "run @@COMMAND@@", TemplateRenderError, "@@COMMAND@@"),
    refused("mounts-blank", f"{S}.container_mounts", "  ", ValidationError, "container_mounts"),
    refused("requeue-text", f"{S}.requeue", "yes", ResourceError, "requeue"),
    # EnrootImportOperator
    refused("import-image-semicolon", f"{E}.image", f"nvcr.io#x:1;{TOUCH}", ImageReferenceError, "image"),
    refused("import-image-space", f"{E}.image", "nvcr.io#nvidia/x y:1", ImageReferenceError, "image"),
    refused("import-image-leading-dash", f"{E}.image", "-oProxyCommand=x:1", ImageReferenceError, "image"),
    refused("import-image-file-uri", f"{E}.image", "file:///srv/x.sqsh", ImageReferenceError, "file://"),
    refused("import-image-web-url", f"{E}.image", "https://nvcr.io/x:1", ImageReferenceError, "web URL"),
    refused("import-image-unicode", f"{E}.image", "nvcr.io#nvidia/\u00e4:1", ImageReferenceError, "image"),
    refused("import-image-empty", f"{E}.image", "", ImageReferenceError, "empty"),
    refused("import-sqsh-path-relative", f"{E}.sqsh_path", "x.sqsh", StoragePathError, "sqsh_path"),
    refused(
        "import-sqsh-path-substitution", f"{E}.sqsh_path", f"/srv/lustre/$({TOUCH}).sqsh", StoragePathError, "sqsh_path"
    ),
    refused("import-containers-dir-space", f"{E}.containers_dir", "/srv/my images", StoragePathError, "containers_dir"),
    refused("import-partition-semicolon", f"{E}.partition", f"cpu_long;{TOUCH}", ValidationError, "partition"),
    refused("import-cpus-per-task-text", f"{E}.cpus_per_task", "4", ResourceError, "cpus_per_task"),
    refused("import-mem-negative", f"{E}.mem_mb", -1, ResourceError, "mem_mb"),
    refused("import-time-hours-zero", f"{E}.time_hours", 0, ResourceError, "time_hours"),
    refused(
        "import-poll-interval-nan", f"{E}.poll_interval_seconds", float("nan"), ValidationError, "poll_interval_seconds"
    ),
    # StageDatasetCheckOperator.paths
    refused("paths-substitution", f"{D}.paths", [f"/srv/lustre/$({TOUCH})"], StoragePathError, "paths"),
    refused("paths-backticks", f"{D}.paths", [f"/srv/lustre/`{TOUCH}`"], StoragePathError, "paths"),
    refused("paths-semicolon", f"{D}.paths", [f"/srv/lustre;{TOUCH}"], StoragePathError, "paths"),
    refused("paths-newline", f"{D}.paths", [f"/srv/lustre\n{TOUCH}"], StoragePathError, "paths"),
    refused("paths-space", f"{D}.paths", ["/srv/lustre/my data"], StoragePathError, "paths"),
    refused("paths-quote", f"{D}.paths", ["/srv/lustre/it's"], StoragePathError, "paths"),
    refused("paths-glob", f"{D}.paths", ["/srv/lustre/*"], StoragePathError, "paths"),
    refused("paths-dotdot", f"{D}.paths", ["/srv/lustre/../../etc"], StoragePathError, ".."),
    refused("paths-tilde", f"{D}.paths", ["~/data"], StoragePathError, "paths"),
    refused("paths-leading-dash", f"{D}.paths", ["-rf"], StoragePathError, "paths"),
    refused("paths-empty", f"{D}.paths", [""], StoragePathError, "paths"),
    refused("paths-unicode", f"{D}.paths", ["/srv/lustre/d\u00e4ten"], StoragePathError, "paths"),
    refused("paths-s3", f"{D}.paths", ["s3://bucket/data"], StoragePathError, "s3"),
    refused("paths-very-long", f"{D}.paths", [f"/srv/{LONG}"], StoragePathError, "paths"),
    # NcclProbeOperator
    refused("probe-image-registry", f"{N}.image", "nvcr.io#x:1", ImageReferenceError, "image"),
    refused("probe-num-nodes-zero", f"{N}.num_nodes", 0, ValidationError, "num_nodes"),
    refused("probe-timeout-text", f"{N}.timeout_seconds", "120", ValidationError, "timeout_seconds"),
    refused(
        "probe-candidate-name-substitution", f"{N}.candidate_envs", [{f"$({TOUCH})": "1"}], ValidationError, "candidate"
    ),
    refused("probe-python-empty", f"{N}.python", " ", ValidationError, "python"),
    # SlurmPreflightOperator
    refused("preflight-partitions-semicolon", f"{P}.partitions", f"polar;{TOUCH}", ResourceError, "partition"),
    refused(
        "preflight-results-dir-substitution", f"{P}.results_dir", f"/srv/$({TOUCH})", StoragePathError, "results_dir"
    ),
    refused("preflight-secret-env-name", f"{P}.registry_secret_env", "A;B", ValidationError, "registry_secret_env"),
    # SlurmJobSensor.job (the handle)
    refused(
        "sensor-slurm-id-injection",
        f"{J}.job",
        {**HANDLE, "slurm_job_id": f"1;{TOUCH}"},
        ValidationError,
        "slurm_job_id",
    ),
    refused("sensor-job-not-a-handle", f"{J}.job", f"$({TOUCH})", ValidationError, "job"),
    refused("sensor-job-id-injection", f"{J}.job", {**HANDLE, "job_id": f"x;{TOUCH}"}, ValidationError, "job_id"),
    # the connection (and the SLURM_* variables that stand in for it)
    refused("conn-host-semicolon", f"{C}.host", f"127.0.0.1;{TOUCH}", ConnectionConfigError, "host"),
    refused("conn-host-substitution", f"{C}.host", f"$({TOUCH})", ConnectionConfigError, "host"),
    refused("conn-host-option", f"{C}.host", f"-oProxyCommand={TOUCH}", ConnectionConfigError, "host"),
    refused("conn-login-semicolon", f"{C}.login", "slurmuser;id", ConnectionConfigError, "user"),
    refused("conn-login-space", f"{C}.login", "slurm user", ConnectionConfigError, "user"),
    # Airflow itself rejects a connection whose port is not a number: it reports it as undefined
    refused("conn-port-text", f"{C}.port", "22;id", ConnectionConfigError, "no Airflow connection 'slurm_default'"),
    refused("conn-partition-backticks", f"{C}.extra.partition", f"`{TOUCH}`", ConnectionConfigError, "partition"),
    refused("conn-account-substitution", f"{C}.extra.account", f"$({TOUCH})", ConnectionConfigError, "account"),
    refused("conn-results-dir-relative", f"{C}.extra.results_dir", "results", ConnectionConfigError, "results_dir"),
    refused("conn-key-file-relative", f"{C}.extra.key_file", "id_ed25519", ConnectionConfigError, "key_file"),
]


@pytest.fixture
def ssh_activity(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every SSH connect and remote command this process attempts (paramiko and asyncssh) during the test."""
    seen: list[str] = []
    connect, exec_command = paramiko.SSHClient.connect, paramiko.Channel.exec_command

    def record_connect(client: paramiko.SSHClient, hostname: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(f"connect {hostname}")
        return connect(client, hostname, *args, **kwargs)

    def record_exec(channel: paramiko.Channel, command: str | bytes) -> Any:
        seen.append(f"exec {command!r}")
        return exec_command(channel, command)

    async def refuse_async(host: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(f"asyncssh connect {host}")
        raise AssertionError("no async SSH connection may be opened by a refused input")

    monkeypatch.setattr(paramiko.SSHClient, "connect", record_connect)
    monkeypatch.setattr(paramiko.Channel, "exec_command", record_exec)
    monkeypatch.setattr(asyncssh, "connect", refuse_async)
    return seen


@pytest.mark.parametrize("case", CASES, ids=[case.case_id for case in CASES])
def test_refused(
    case: Case,
    conn: str,
    cluster: ClusterEnv,
    ssh_activity: list[str],
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    """The value was given to the parameter and the task (or hook) was run. Expected: refused before any
    SSH connection or remote command, with an error that names the parameter or the problem."""
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, **case.connection))
    monkeypatch.setenv("RL_TOKEN_VALUE", "s3cr3t-v4lue")  # the secret that case "secret-value-in-command" leaks
    with pytest.raises(case.error) as refused:
        case.action()
    message = str(refused.value)
    record_property("parameter", case.parameter)
    record_property("value", display_value(case.value, 80))
    record_property("outcome", f"refused: {type(refused.value).__name__}: {' '.join(message.split())[:200]}")
    assert case.mentions in message, message
    assert ssh_activity == []
    assert not Path(CANARY).exists()


# ---------------------------------------------------------------------- the accepted values, run for real

HOSTILE_TEXT = {
    "RL_QUOTES": "it's \"quoted\" and 'single' and \\backslash\\",
    "RL_SUBSTITUTION": f"$({TOUCH}) and ${{HOME}} and $HOME",
    "RL_BACKTICKS": f"`{TOUCH}`",
    "RL_SEPARATORS": f"a; {TOUCH} && {TOUCH} || {TOUCH} | cat & wait",
    "RL_NEWLINES": f"line one\n{TOUCH}\n\nlast line",
    "RL_GLOB": "* ? [a-z] ~ /srv/lustre/*",
    "RL_LEADING_DASH": "--help -rf --uid=0",
    "RL_UNICODE": "\u00fcn\u00efc\u00f6d\u00e9 \u2603 \U0001f642 \u00a0nbsp",
    "RL_EMPTY": "",
    "RL_BRACES": "{results_dir} {job_id} {not_a_token} ${x:-y} {a,b}",
    "RL_LONG": "0123456789" * 2000,
}
#: The command is shell code by contract (it runs under ``bash -c``); its hostile text sits inside the
#: command's own single quotes, so every layer in between must pass it unchanged for the canary to stay away.
LITERAL = f'"; {TOUCH}; echo " $({TOUCH}) `{TOUCH}` && {TOUCH} * \u2603'
SECRET_LITERAL = f"s3cr3t'\"$({TOUCH})`{TOUCH}`;&&|*\u2603\n-end"
WRITE_BACK = (
    'out={results_dir}/received && mkdir -p "$out" && '
    + " && ".join(f'printf %s "${name}" > "$out/{name}"' for name in HOSTILE_TEXT)
    + f' && printf %s {quote(LITERAL)} > "$out/LITERAL"'
    + ' && printf %s "$PYXIS_CONTAINER_MOUNTS" > "$out/MOUNTS"'
    + ' && cp {config_path} "$out/spec.yaml"'
    + ' && printf %s "$RL_SECRET" | sha256sum | cut -c1-16 > "$out/SECRET_DIGEST"'
)
MOUNTS = f"/srv/lustre:/srv/lustre,/srv/lustre/containers:/mnt/x $({TOUCH});`{TOUCH}`"
SPEC = {"train": {"note": LITERAL, "values": list(HOSTILE_TEXT.values())[:6], "path": "{results_dir}/out"}}
HOSTILE_RUN_ID = f"manual__{TOKEN} $({TOUCH});`{TOUCH}`\n&&"  # unique per run: the job name derives from it


@pytest.fixture(scope="module")
def results_base(cluster: ClusterEnv, ssh_run: SshRun) -> Iterator[str]:
    """A results base of this module's own, so that every file the job wrote can be accounted for."""
    base = f"{cluster.results_dir}/rl-hostile-{TOKEN}"
    yield base
    ssh_run(f"rm -rf -- {quote(base)}")


def test_accepted_values_arrive_byte_exact(
    conn: str,
    image: str,
    ssh_run: SshRun,
    cluster: ClusterEnv,
    results_base: str,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    """One real job carried every value that is accepted rather than refused: hostile env values (quotes,
    $( ), backticks, ; && ||, newlines, globs, leading dashes, unicode, empty, 20 kB), a hostile literal
    inside the command, hostile spec strings, a hostile secret_env value, hostile container_mounts, a
    hostile DAG run id (it feeds the job name) and hostile network_arch/action texts. The job wrote back
    what it received. Expected: everything arrived byte for byte, the job name is safe, the record keeps
    the texts, the canary never appeared, and every file under the results base belongs to the job."""
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, extra={"results_dir": results_base}))
    monkeypatch.setenv(SECRET_SOURCE, SECRET_LITERAL)
    ctx = context("rl-hostile", "train", f"{HOSTILE_RUN_ID} {TOKEN}")  # a job name of its own per run
    op = SbatchSubmitOperator(
        task_id="train",
        image=image,
        command=WRITE_BACK,
        env=HOSTILE_TEXT,
        spec=SPEC,
        secret_env={"RL_SECRET": f"env:{SECRET_SOURCE}"},
        container_mounts=MOUNTS,
        network_arch=f"arch;$({TOUCH})",
        action=f"train`{TOUCH}`",
        gpus_per_node=1,
        cpus_per_task=1,
        time_hours=0.1,
        timeout_hours=0.05,
    )
    handle = submit(op, ctx)
    sensor = sensor_for(handle, require_status_json=False)  # a shell program, not a TAO action: no status.json
    deferred = defer(sensor, ctx)
    result = resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 120)))
    received = f"{handle['results_dir']}/received"

    def got(name: str) -> str:
        return remote_text(ssh_run, f"{received}/{name}")

    assert result["terminal_state"] == "COMPLETE"
    bound = HOSTILE_TEXT["RL_BRACES"].replace("{results_dir}", handle["results_dir"])
    expected = {**HOSTILE_TEXT, "RL_BRACES": bound.replace("{job_id}", handle["job_id"])}  # the documented tokens
    assert {name: got(name) for name in HOSTILE_TEXT} == expected
    assert got("LITERAL") == LITERAL
    assert got("MOUNTS") == MOUNTS
    assert yaml.safe_load(got("spec.yaml")) == {
        "train": {**SPEC["train"], "path": f"{handle['results_dir']}/out"}
    }  # only the documented token was bound
    assert got("SECRET_DIGEST").strip() == digest(SECRET_LITERAL)
    assert handle["job_id"].startswith("tao-rl-hostile.train-")
    assert jobs_named(ssh_run, handle["job_id"]) == [handle["slurm_job_id"]]
    record = record_of(ssh_run, handle["record_path"])
    assert (record["network_arch"], record["action"]) == (f"arch;$({TOUCH})", f"train`{TOUCH}`")
    assert ssh_run(f"test -e {quote(CANARY)}")[0] != 0
    assert not Path(CANARY).exists()

    job, slurm_id = handle["job_id"], handle["slurm_job_id"]
    allowed = (f"jobs/{job}", f"results/{job}", f"logs/{job}-{slurm_id}", f"records/{job}.json")
    _, listing, _ = ssh_run(f"cd -- {quote(results_base)} && find . -mindepth 1")
    paths = [line.removeprefix("./") for line in listing.splitlines()]
    # + the sinfo cache; ends/ holds no marker once the job settled
    provider = ("jobs", "results", "logs", "records", "ends", ".tao-slurm", f".tao-slurm/{PARTITION_CACHE_NAME}")
    strays = [p for p in paths if p not in provider and not p.startswith(allowed)]
    record_property("detail", f"{len(paths)} paths under the results base, all the job's")
    assert paths
    assert strays == []


def test_canary_never_appeared(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    """After all hostile cases: no file named like the canary exists anywhere the cluster user or a job
    can write (/tmp, /var/tmp, the user's home, the shared file system)."""
    rc, out, err = ssh_run(
        f"find /tmp /var/tmp ~ {quote(cluster.shared_dir)} -xdev -name {quote(Path(CANARY).name + '*')} "
        "2>/dev/null; true"
    )
    assert rc == 0, err
    assert out == ""
    assert not Path(CANARY).exists()
