"""Before the GPU, without a cluster: preflight, dataset check and image import.

Validation must happen in ``execute()`` before any SSH: those tests replace ``SlurmHook`` with a class
that fails the test when it is even created. The other tests give the operator a :class:`LocalHook`,
a real :class:`SlurmHook` whose commands run in a local bash instead of over SSH, with stand-ins
for the SLURM tools on ``PATH``: the real command builders, parsers, lock protocol and conversion
script run for real against a temporary directory.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_tao_slurm.core import conversion
from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.conversion import (
    ConversionJob,
    LockAction,
    LockState,
    conversion_job_name,
    held_lock_action,
    owner_of_job,
    render_conversion_script,
)
from airflow_provider_tao_slurm.core.images import parse_image
from airflow_provider_tao_slurm.core.mounts import Mount
from airflow_provider_tao_slurm.core.states import state_from_native
from airflow_provider_tao_slurm.exceptions import (
    ImageConversionError,
    ImageReferenceError,
    MissingPathsError,
    PreflightError,
    RemoteCommandError,
    ResourceError,
    SlurmConnectionError,
    StoragePathError,
    TemplateRenderError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.preflight import SlurmPreflightOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator

#: The enroot step of the preflight, as srun is given it.
ENROOT_STEP = "sh -c echo '#tao-slurm-step-started'; exec \"$@\" sh enroot version"
OWNER = "0123456789abcdef"
OTHER = "fedcba9876543210"
VALID_SQSH = b"hsqs" + bytes(4092)
SRUN_HELP = (
    "Usage: srun [OPTIONS...] executable [args...]\n"
    "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"
    "      --container-mounts=SRC:DST[:FLAGS][,SRC:DST...]\n"
    "      --no-container-mount-home\n"
)
#: ``scontrol show config``'s preemption lines (a release with PreemptParameters).
PREEMPTION = (
    "PreemptMode             = REQUEUE\nPreemptParameters       = {}\n"
    "PreemptType             = preempt/partition_prio\nSlurmctldParameters     = (null)\n"
)
STUBS = {
    "sbatch": 'printf \'%s\\n\' "$*" >> "$STUBS/sbatch.calls"; echo 4242',
    "scontrol": 'if [ "$*" = "show config" ]; then echo "PlugStackConfig         = $STUBS/plugstack.conf"; '
    'cat "$STUBS/preemption.conf" 2>/dev/null; fi',
    "scancel": 'printf \'%s\\n\' "$*" >> "$STUBS/scancel.calls"; exit 0',
    "squeue": 'cat "$STUBS/squeue.out" 2>/dev/null; exit 0',
    "sacct": 'cat "$STUBS/sacct.out" 2>/dev/null; exit 0',
    # a step given as ``sh -c SCRIPT`` (the GPU node check) runs here, as on a node; others print srun-probe.out
    # (srun-refused.err: srun finds no node for the step, or the site refuses it; the step never starts)
    "srun": 'if [ "$1" = --help ]; then cat "$STUBS/srun-help.out"; else printf \'%s\\n\' "$*" >> "$STUBS/srun.calls"; '
    'if [ -f "$STUBS/srun-refused.err" ]; then cat "$STUBS/srun-refused.err" >&2; exit 1; fi; '
    'while [ "${1#--}" != "$1" ]; do shift; done; if [ "$1" = sh ]; then exec "$@"; fi; '
    'cat "$STUBS/srun-probe.out"; fi',
    "enroot": 'cat "$STUBS/srun-probe.out"',
    "sinfo": 'cat "$STUBS/sinfo.out"',
    "sacctmgr": 'cat "$STUBS/sacctmgr.out"',
}


class LocalHook(SlurmHook):
    """A :class:`SlurmHook` whose commands run in a local bash instead of over SSH; it records every command."""

    def __init__(self, settings: ClusterSettings, env: dict[str, str]) -> None:
        super().__init__("local", settings=settings)
        self.env = env
        self.commands: list[str] = []

    def get_conn(self) -> Any:
        self._host = "localhost"

    def _run_bytes(self, command: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes, str]:
        self.get_conn()
        self.commands.append(command)
        proc = subprocess.run(
            ["bash", "-c", command], input=stdin or b"", capture_output=True, env=self.env, timeout=60
        )
        return proc.returncode, proc.stdout, proc.stderr, "localhost"


class NoHook:
    """Stands in for ``SlurmHook`` where validation must fail first: creating it fails the test."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a SlurmHook was created before the inputs were validated")


@pytest.fixture
def no_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("airflow_provider_tao_slurm.hooks.slurm.SlurmHook", NoHook)


class Cluster:
    """A temporary "cluster": shared dirs, a HOME, SLURM stand-ins and a :class:`LocalHook` on them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results = root / "results"
        self.containers = root / "containers"
        self.home = root / "home"
        self.stubs = root / "stubs"
        for directory in (self.results, self.containers, self.home, self.stubs, root / "bin"):
            directory.mkdir()
        for tool, body in STUBS.items():
            script = root / "bin" / tool
            script.write_text(f"#!/bin/sh\nSTUBS={self.stubs}\n{body}\n")
            script.chmod(0o755)
        self.stub("srun-help.out", SRUN_HELP)
        self.stub("srun-probe.out", "3.4.1\n")
        self.stub("plugstack.conf", f"include {self.stubs}/plugstack.conf.d/*.conf\n")
        (self.stubs / "plugstack.conf.d").mkdir()
        self.stub("plugstack.conf.d/pyxis.conf", "required /usr/local/lib/slurm/spank_pyxis.so\n")
        self.stub("sinfo.out", "polar*|4:00:00|gpu:a100:4\ncpu_long|7-00:00:00|(null)\n")
        self.stub("sacctmgr.out", "unit|gpu_proj|alice||normal\n")
        self.stub("preemption.conf", PREEMPTION.format("send_user_signal"))
        settings = ClusterSettings(
            hosts=("login1",),
            user="alice",
            partitions=("polar",),
            account="gpu_proj",
            results_dir=str(self.results),
            conversion_partition="cpu_long",
            cluster_name="unit",
        )
        # The GPU node check reads the site's Enroot mounts here, not the machine's /etc/enroot.
        self.mounts_d = self.stubs / "enroot" / "mounts.d"
        self.mounts_d.mkdir(parents=True)
        env = {
            "PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(self.home),
            "ENROOT_SYSCONF_PATH": str(self.stubs / "enroot"),
        }
        self.hook = LocalHook(settings, env)

    def stub(self, name: str, text: str) -> None:
        (self.stubs / name).write_text(text)

    def calls(self, tool: str) -> list[str]:
        path = self.stubs / f"{tool}.calls"
        return path.read_text().splitlines() if path.exists() else []

    def attach(self, operator: Any) -> Any:
        operator.__dict__["hook"] = self.hook
        return operator


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def importer(cluster: Cluster, image: str, **kwargs: Any) -> EnrootImportOperator:
    operator = EnrootImportOperator(task_id="import", image=image, containers_dir=str(cluster.containers), **kwargs)
    return cluster.attach(operator)


# ------------------------------------------------------------------ validation before any SSH

REFUSED_BEFORE_SSH: list[tuple[str, Callable[[], Any], type[Exception]]] = [
    ("paths-file-uri", lambda: StageDatasetCheckOperator(task_id="t", paths=["file:///data/coco"]), StoragePathError),
    ("paths-relative", lambda: StageDatasetCheckOperator(task_id="t", paths={"train": "data/coco"}), StoragePathError),
    ("paths-s3", lambda: StageDatasetCheckOperator(task_id="t", paths=["s3://bucket/coco"]), StoragePathError),
    ("paths-lustre-host", lambda: StageDatasetCheckOperator(task_id="t", paths=["lustre://h/x"]), StoragePathError),
    (
        "paths-injection",
        lambda: StageDatasetCheckOperator(task_id="t", paths=["/data/$(touch canary)"]),
        StoragePathError,
    ),
    ("paths-one-string", lambda: StageDatasetCheckOperator(task_id="t", paths="/data/coco"), StoragePathError),
    ("paths-empty", lambda: StageDatasetCheckOperator(task_id="t", paths={}), StoragePathError),
    (
        "paths-one-bad-of-two",
        lambda: StageDatasetCheckOperator(task_id="t", paths=["/data/ok", "file:///x"]),
        StoragePathError,
    ),
    (
        "image-semicolon",
        lambda: EnrootImportOperator(task_id="t", image="nvcr.io/x;touch canary:1"),
        ImageReferenceError,
    ),
    ("image-substitution", lambda: EnrootImportOperator(task_id="t", image="$(touch canary)"), ImageReferenceError),
    ("image-backticks", lambda: EnrootImportOperator(task_id="t", image="nvcr.io#x`id`:1"), ImageReferenceError),
    ("image-file-uri", lambda: EnrootImportOperator(task_id="t", image="file:///c/x.sqsh"), ImageReferenceError),
    ("image-relative-sqsh", lambda: EnrootImportOperator(task_id="t", image="c/x.sqsh"), ImageReferenceError),
    ("image-option", lambda: EnrootImportOperator(task_id="t", image="-rf"), ImageReferenceError),
    ("image-dotdot", lambda: EnrootImportOperator(task_id="t", image="/c/../etc/x.sqsh"), ImageReferenceError),
    ("image-credentials", lambda: EnrootImportOperator(task_id="t", image="u:p@nvcr.io#x:1"), ImageReferenceError),
    (
        "sqsh-path-with-sqsh-image",
        lambda: EnrootImportOperator(task_id="t", image="/c/x.sqsh", sqsh_path="/c/y.sqsh"),
        ValidationError,
    ),
    (
        "poll-interval-zero",
        lambda: EnrootImportOperator(task_id="t", image="x:1", poll_interval_seconds=0),
        ValidationError,
    ),
    (
        "deferrable-text",
        lambda: EnrootImportOperator(task_id="t", image="x:1", deferrable="yes"),  # type: ignore[arg-type]
        ValidationError,
    ),
    ("preflight-partition", lambda: SlurmPreflightOperator(task_id="t", partitions="polar;id"), ResourceError),
    (
        "preflight-conversion-partition",
        lambda: SlurmPreflightOperator(task_id="t", conversion_partition="cpu long"),
        ResourceError,
    ),
    ("preflight-results-dir", lambda: SlurmPreflightOperator(task_id="t", results_dir="results"), StoragePathError),
    ("preflight-account", lambda: SlurmPreflightOperator(task_id="t", account="$(id)"), ValidationError),
    ("preflight-pyxis-option", lambda: SlurmPreflightOperator(task_id="t", pyxis_options=["-x"]), ValidationError),
    ("preflight-wait", lambda: SlurmPreflightOperator(task_id="t", enroot_wait_seconds=0), ValidationError),
    ("preflight-image", lambda: SlurmPreflightOperator(task_id="t", image="x;id"), ImageReferenceError),
    (
        "preflight-secret-env-name",
        lambda: SlurmPreflightOperator(task_id="t", registry_secret_env="NGC KEY"),
        ValidationError,
    ),
    (
        "preflight-two-secrets",
        lambda: SlurmPreflightOperator(task_id="t", registry_conn_id="ngc", registry_secret_env="NGC_KEY"),
        ValidationError,
    ),
]


@pytest.mark.usefixtures("no_hook")
@pytest.mark.parametrize(
    ("build", "error"), [case[1:] for case in REFUSED_BEFORE_SSH], ids=[case[0] for case in REFUSED_BEFORE_SSH]
)
def test_invalid_input_is_refused_before_the_hook_exists(
    build: Callable[[], Any], error: type[Exception], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error):
        build().execute({})
    assert not list(tmp_path.rglob("canary"))


def test_file_uri_error_names_the_entry_and_the_fix(no_hook: None) -> None:
    with pytest.raises(StoragePathError) as info:
        StageDatasetCheckOperator(task_id="t", paths={"train": "/ok", "val": "file:///home/me/val"}).execute({})
    assert "paths['val']" in str(info.value)
    assert "copy the data to Lustre" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"cpus_per_task": 0}, ResourceError),
        ({"mem_mb": "7200"}, ResourceError),
        ({"time_hours": 0}, ResourceError),
        ({"partition": "cpu;long"}, ValidationError),
        ({"account": "$(id)"}, ValidationError),
        ({"sqsh_path": "/c/x.img"}, ValidationError),
        ({"sqsh_path": "c/x.sqsh"}, StoragePathError),
        ({"containers_dir": "/c/../etc"}, StoragePathError),
    ],
    ids=["cpus", "mem-text", "time", "partition", "account", "sqsh-suffix", "sqsh-relative", "containers-dotdot"],
)
def test_import_refuses_bad_job_values_before_any_command(
    cluster: Cluster, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    operator = cluster.attach(EnrootImportOperator(task_id="t", image="nvcr.io#nvidia/x:1", **kwargs))
    with pytest.raises(error):
        operator.execute({})
    assert cluster.hook.commands == []


# ------------------------------------------------------------------ StageDatasetCheckOperator


def test_dataset_check_returns_resolved_paths_in_the_given_shape(cluster: Cluster) -> None:
    (cluster.root / "train").mkdir()
    (cluster.root / "val.json").write_text("{}")
    paths = {"train": f"lustre://{cluster.root}/train/", "val": f"slurm://login1{cluster.root}//val.json"}
    result = cluster.attach(StageDatasetCheckOperator(task_id="t", paths=paths)).execute({})
    assert result == {"train": f"{cluster.root}/train", "val": f"{cluster.root}/val.json"}
    as_list = cluster.attach(StageDatasetCheckOperator(task_id="t", paths=[f"{cluster.root}/./train"])).execute({})
    assert as_list == [f"{cluster.root}/train"]
    assert len(cluster.hook.commands) == 2


def test_dataset_check_lists_every_missing_path_after_one_round_trip(cluster: Cluster) -> None:
    (cluster.root / "train").mkdir()
    paths = {"train": f"{cluster.root}/train", "val": f"{cluster.root}/val", "test": f"lustre://{cluster.root}/test"}
    with pytest.raises(MissingPathsError) as info:
        cluster.attach(StageDatasetCheckOperator(task_id="t", paths=paths)).execute({})
    assert info.value.missing == [f"{cluster.root}/val", f"{cluster.root}/test"]
    assert f"paths['val'] = {cluster.root}/val" in str(info.value)
    assert f"paths['test'] = {cluster.root}/test" in str(info.value)
    assert "train" not in str(info.value).split("\n", 1)[1]
    assert len(cluster.hook.commands) == 1


# ------------------------------------------------------------------ core: conversion script and lock


def _job(**changes: Any) -> ConversionJob:
    values: dict[str, Any] = {
        "job_name": conversion_job_name(OWNER),
        "image": parse_image("nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt"),
        "target": "/lustre/containers/nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh",
        "partition": "cpu_long",
        "account": "gpu_proj",
        "cpus": 4,
        "mem_mb": 7200,
        "time_minutes": 150,
        "log_dir": "/lustre/u/logs",
    }
    return ConversionJob(**{**values, **changes})


def test_conversion_script_directives_and_values() -> None:
    script = render_conversion_script(_job())
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        f"#SBATCH --job-name=tao-enroot-{OWNER}",
        "#SBATCH --output=/lustre/u/logs/%x-%j/main.out",
        "#SBATCH --error=/lustre/u/logs/%x-%j/main.err",
        "#SBATCH --open-mode=append",
        "#SBATCH --partition=cpu_long",
        "#SBATCH --account=gpu_proj",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=7200M",
        "#SBATCH --time=02:30:00",
        "#SBATCH --no-requeue",
        "#SBATCH --chdir=/tmp",
    ]
    assert 'cd -- "${ENROOT_TEMP_PATH}"' in script
    assert "TAO_SLURM_SOURCE='docker://nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt'" in script
    assert 'export ENROOT_TEMP_PATH="/tmp/enroot-${SLURM_JOB_ID}"' in script
    assert 'enroot import -o "${TAO_SLURM_PARTIAL}" "${TAO_SLURM_SOURCE}"' in script
    assert "--account" not in render_conversion_script(_job(account=None))
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"job_name": "tao-x"}, ValidationError),
        ({"image": parse_image("/c/x.sqsh")}, ValidationError),
        ({"target": "/c/x.img"}, ValidationError),
        ({"target": "/c/$(id).sqsh"}, StoragePathError),
        ({"partition": "cpu long"}, ValidationError),
        ({"partition": "--wrap=id"}, ValidationError),
        ({"account": "a\nb"}, ValidationError),
        ({"cpus": 0}, ResourceError),
        ({"mem_mb": True}, ResourceError),
        ({"time_minutes": 1.5}, ResourceError),
        ({"log_dir": "/l//logs"}, ValidationError),
        ({"log_dir": "/l/lo gs"}, StoragePathError),
    ],
    ids=[
        "job-name",
        "sqsh-image",
        "target-suffix",
        "target-injection",
        "partition-space",
        "partition-option",
        "account-newline",
        "cpus",
        "mem-bool",
        "time-float",
        "log-dir-not-normalised",
        "log-dir-space",
    ],
)
def test_conversion_script_refuses(changes: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        render_conversion_script(_job(**changes))


@pytest.mark.parametrize(
    ("name", "owner"),
    [(f"tao-enroot-{OWNER}", OWNER), ("tao-enroot-0123", None), ("tao-x-0123456789abcdef", None), ("", None)],
    ids=["valid", "short", "other-prefix", "empty"],
)
def test_owner_of_job(name: str, owner: str | None) -> None:
    if owner is None:
        with pytest.raises(ValidationError):
            owner_of_job(name)
    else:
        assert owner_of_job(name) == owner
        assert conversion_job_name(owner) == name


def _state(native: str) -> Any:
    return state_from_native("77", native, source="squeue")


@pytest.mark.parametrize(
    ("lock", "job", "action"),
    [
        (LockState(False, 1, OWNER, None), None, LockAction.WAIT),
        (LockState(False, 400, OWNER, None), None, LockAction.BREAK),
        (LockState(False, 1, None, None), None, LockAction.WAIT),
        (LockState(False, 400, None, "77"), None, LockAction.BREAK),
        (LockState(False, 5, OWNER, "77"), None, LockAction.ADOPT),
        (LockState(False, 400, OWNER, "77"), None, LockAction.BREAK),
        (LockState(False, 400, OWNER, "77"), _state("PENDING"), LockAction.ADOPT),
        (LockState(False, 9, OWNER, "77"), _state("RUNNING"), LockAction.ADOPT),
        (LockState(False, 9, OWNER, "77"), _state("COMPLETED"), LockAction.FINISHED),
        (LockState(False, 9, OWNER, "77"), _state("CANCELLED by 1001"), LockAction.FINISHED),
    ],
    ids=[
        "submitting",
        "owner-died-before-submit",
        "owner-not-written-yet",
        "no-owner-for-long",
        "job-not-in-accounting-yet",
        "job-vanished",
        "job-pending-long",
        "job-running",
        "job-completed",
        "job-cancelled",
    ],
)
def test_held_lock_action(lock: LockState, job: Any, action: LockAction) -> None:
    assert held_lock_action(lock, job) == action


def _sh(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, text=True, check=False)


def test_lock_protocol_in_a_real_shell(tmp_path: Path) -> None:
    lock = conversion.lock_dir(f"{tmp_path}/new-dir/x.sqsh")
    first = _sh(conversion.acquire_lock(lock, OWNER), tmp_path)
    assert conversion.parse_lock(first.stdout) == LockState(acquired=True)
    second = conversion.parse_lock(_sh(conversion.acquire_lock(lock, OTHER), tmp_path).stdout)
    assert (second.acquired, second.owner, second.job_id) == (False, OWNER, None)
    assert 0 <= second.age_seconds < 5
    assert _sh(conversion.record_lock_job(lock, OTHER, "99"), tmp_path).returncode != 0
    assert _sh(conversion.record_lock_job(lock, OWNER, "4242"), tmp_path).returncode == 0
    assert conversion.parse_lock(_sh(conversion.acquire_lock(lock, OTHER), tmp_path).stdout).job_id == "4242"
    assert _sh(conversion.remove_lock(lock, OTHER), tmp_path).returncode == 0
    assert Path(lock).is_dir()
    assert _sh(conversion.remove_lock(lock, OWNER), tmp_path).returncode == 0
    assert not Path(lock).exists()
    assert list((tmp_path / "new-dir").iterdir()) == []


def test_lock_age_and_tampered_content(tmp_path: Path) -> None:
    lock = tmp_path / "x.sqsh.lock"
    lock.mkdir()
    (lock / "owner").write_text("$(touch canary) not-hex\n")
    (lock / "job").write_text("12; rm -rf /\n")
    old = time.time() - 1000
    os.utime(lock, (old, old))
    state = conversion.parse_lock(_sh(conversion.acquire_lock(str(lock), OWNER), tmp_path).stdout)
    assert state.acquired is False
    assert state.age_seconds >= 999
    assert state.job_id is None
    assert state.owner is None
    assert not list(tmp_path.rglob("canary"))
    assert _sh(conversion.remove_lock(str(lock), None), tmp_path).returncode == 0
    assert lock.is_dir(), "a lock that is not empty is only removed by its owner token"


@pytest.mark.parametrize(
    "stdout",
    ["", "LOCK HELD x y z", "LOCKED\n", "cannot create\n"],
    ids=["empty", "bad-age", "other-word", "error-text"],
)
def test_parse_lock_rejects(stdout: str) -> None:
    with pytest.raises(RemoteCommandError):
        conversion.parse_lock(stdout)


@pytest.mark.parametrize(
    "build",
    [
        lambda: conversion.acquire_lock("/c/x.sqsh", OWNER),
        lambda: conversion.acquire_lock("/c/x.sqsh.lock", "OWNER"),
        lambda: conversion.acquire_lock("/c/$(id).sqsh.lock", OWNER),
        lambda: conversion.record_lock_job("/c/x.sqsh.lock", OWNER, "1;id"),
        lambda: conversion.remove_lock("c/x.sqsh.lock", OWNER),
        lambda: conversion.lock_dir("/c/.sqsh"),
    ],
    ids=["not-a-lock", "owner-upper", "injection", "job-id", "relative", "no-file-name"],
)
def test_lock_builders_refuse(build: Callable[[], str]) -> None:
    with pytest.raises(ValidationError):
        build()


def test_conversion_script_runs_and_installs_only_a_valid_image(tmp_path: Path) -> None:
    """Run the rendered script with an ``enroot`` stand-in: good image installed, bad one never."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    enroot = bin_dir / "enroot"
    enroot.write_text(
        '#!/bin/sh\nout="$3"\ncase "$4" in *bad*) printf junk > "$out";; *) head -c 4096 /dev/zero | '
        'sed "1s/^/hsqs/" | head -c 4096 > "$out";; esac\necho "$ENROOT_TEMP_PATH" > "$out.tempvar"\n'
    )
    enroot.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "31"}
    results = {}
    for name in ("good", "bad"):
        target = tmp_path / f"{name}.sqsh"
        script = render_conversion_script(_job(image=parse_image(f"example.org/{name}:1"), target=str(target)))
        results[name] = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    assert results["good"].returncode == 0, results["good"].stderr
    assert (tmp_path / "good.sqsh").read_bytes()[:4] == b"hsqs"
    assert (tmp_path / "good.sqsh.tmp-31.tempvar").read_text() == "/tmp/enroot-31\n"
    assert results["bad"].returncode == 65
    assert "not a squashfs image" in results["bad"].stderr
    assert not (tmp_path / "bad.sqsh").exists()
    assert not (tmp_path / "bad.sqsh.tmp-31").exists()
    assert not Path("/tmp/enroot-31").exists()


def test_conversion_template_placeholders_are_all_required() -> None:
    with pytest.raises(TemplateRenderError, match="TARGET"):
        conversion.render_template(conversion.CONVERSION_TEMPLATE, {"JOB_NAME": "x"})


# ------------------------------------------------------------------ EnrootImportOperator


def cached(cluster: Cluster, image: str) -> Path:
    from airflow_provider_tao_slurm.core.images import sqsh_cache_name

    return cluster.containers / sqsh_cache_name(parse_image(image))


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (VALID_SQSH, None),
        (None, "does not exist"),
        (bytes(65536), "not the squashfs magic"),
        (b"hsqs" + bytes(100), "fewer than"),
    ],
    ids=["valid", "missing", "truncated-zeros", "too-small"],
)
def test_import_of_a_sqsh_path_checks_it_and_returns_it(cluster: Cluster, content: bytes | None, error: str) -> None:
    path = cluster.containers / "given.sqsh"
    if content is not None:
        path.write_bytes(content)
    operator = importer(cluster, str(path))
    if error is None:
        assert operator.execute({}) == str(path)
    else:
        with pytest.raises(ImageConversionError, match=error):
            operator.execute({})
    assert len(cluster.hook.commands) == 1


@pytest.mark.parametrize(
    ("image", "force"),
    [("example.org/team/app:1.0", False), ("example.org/team/app:1.0", True), ("example.org/team/app", False)],
    ids=["tagged", "tagged-force-only-affects-latest", "latest-reused-without-force"],
)
def test_import_reuses_a_valid_cached_image(cluster: Cluster, image: str, force: bool) -> None:
    target = cached(cluster, image)
    target.write_bytes(VALID_SQSH)
    assert importer(cluster, image, force_reconvert_latest=force).execute({}) == str(target)
    assert cluster.calls("sbatch") == []
    assert not Path(f"{target}.lock").exists()


def _deferred(operator: EnrootImportOperator) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as info:
        operator.execute({})
    return info.value


@pytest.mark.parametrize(
    ("existing", "force"),
    [(None, False), (bytes(8192), False), (VALID_SQSH, True)],
    ids=["missing", "invalid-file-replaced", "latest-forced"],
)
def test_import_submits_a_conversion_and_defers(cluster: Cluster, existing: bytes | None, force: bool) -> None:
    image = "nvcr.io/nvidia/app"
    target = cached(cluster, image)
    if existing is not None:
        target.write_bytes(existing)
    deferred = _deferred(importer(cluster, image, force_reconvert_latest=force, poll_interval_seconds=3))
    path, kwargs = deferred.trigger.serialize()
    assert path == "airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger"
    assert kwargs["slurm_job_id"] == "4242"
    assert kwargs["poll_interval"] == 3.0
    assert kwargs["cancel_on_kill"] is True  # this run's own conversion: a user kill cancels it
    owner = owner_of_job(kwargs["job_name"])
    assert deferred.method_name == "execute_complete"
    (call,) = cluster.calls("sbatch")
    script = cluster.results / "jobs" / kwargs["job_name"] / "sbatch" / f"job_{kwargs['job_name']}.sbatch"
    assert call == f"--parsable --hold --export=ALL --job-name={kwargs['job_name']} {script}"
    assert f"TAO_SLURM_TARGET={target}" in script.read_text()
    assert "#SBATCH --partition=cpu_long" in script.read_text()
    assert (Path(f"{target}.lock") / "owner").read_text() == f"{owner}\n"
    assert (Path(f"{target}.lock") / "job").read_text() == "4242\n"
    assert (cluster.results / "logs" / f"{kwargs['job_name']}-4242").is_dir()


def _hold_lock(target: Path, owner: str, job: str | None, age: float = 0) -> Path:
    lock = Path(f"{target}.lock")
    lock.mkdir()
    (lock / "owner").write_text(f"{owner}\n")
    if job is not None:
        (lock / "job").write_text(f"{job}\n")
    if age:
        os.utime(lock, (time.time() - age, time.time() - age))
    return lock


SQUEUE_ROW = "77|tao-enroot-{owner}|{state}|None|n1|2026-01-01T00:00:00|2026-01-01T02:00:00\n"
SACCT_ROW = "77|tao-enroot-{owner}|{state}|{exit}|None|n1|2026-01-01T00:00:00|2026-01-01T00:01:00\n"


def test_import_adopts_the_running_conversion_of_another_run(cluster: Cluster) -> None:
    image = "nvcr.io/nvidia/app:2"
    lock = _hold_lock(cached(cluster, image), OTHER, "77", age=30)
    cluster.stub("squeue.out", SQUEUE_ROW.format(owner=OTHER, state="RUNNING"))
    _, kwargs = _deferred(importer(cluster, image)).trigger.serialize()
    assert (kwargs["slurm_job_id"], kwargs["job_name"]) == ("77", f"tao-enroot-{OTHER}")
    assert time.time() - 40 < kwargs["submitted_at"] < time.time() - 20
    assert kwargs["cancel_on_kill"] is False  # the other run's: killing this task leaves it running
    assert cluster.calls("sbatch") == []
    assert (lock / "owner").read_text() == f"{OTHER}\n"


class Killed(Exception):
    """The task was killed while it waited in the worker."""


@pytest.mark.parametrize("adopted", [True, False], ids=["another-runs-conversion-left-running", "own-cancelled"])
def test_killing_an_import_waiting_in_the_worker_cancels_only_its_own_conversion(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, adopted: bool
) -> None:
    image = "nvcr.io/nvidia/app:9"
    if adopted:
        _hold_lock(cached(cluster, image), OTHER, "77", age=30)
        cluster.stub("squeue.out", SQUEUE_ROW.format(owner=OTHER, state="RUNNING"))
    operator = importer(cluster, image, deferrable=False)

    def killed_while_waiting(*_: Any, **__: Any) -> Any:
        operator.on_kill()  # Airflow calls on_kill when a user marks the running task failed
        raise Killed

    monkeypatch.setattr(JobLifecycle, "wait_until_ended", killed_while_waiting)
    with pytest.raises(Killed):
        operator.execute({})

    if adopted:
        assert cluster.calls("scancel") == []
    else:
        (call,) = cluster.calls("scancel")  # by id and exact name: the conversion this task submitted
        assert "4242" in call.split()
        assert "--name=tao-enroot-" in call


@pytest.mark.parametrize(
    ("sacct", "age"),
    [("FAILED", 30), ("COMPLETED", 30), (None, 4000)],
    ids=["previous-job-failed", "previous-job-completed-without-a-valid-file", "job-vanished"],
)
def test_import_removes_a_stale_lock_and_converts(cluster: Cluster, sacct: str | None, age: float) -> None:
    image = "nvcr.io/nvidia/app:3"
    lock = _hold_lock(cached(cluster, image), OTHER, "77", age=age)
    if sacct is not None:
        cluster.stub("sacct.out", SACCT_ROW.format(owner=OTHER, state=sacct, exit="1:0"))
    _, kwargs = _deferred(importer(cluster, image)).trigger.serialize()
    assert kwargs["slurm_job_id"] == "4242"
    assert (lock / "owner").read_text() == f"{owner_of_job(kwargs['job_name'])}\n"
    assert len(cluster.calls("sbatch")) == 1


def test_import_reuses_the_file_a_finished_conversion_left_behind_its_lock(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = "nvcr.io/nvidia/app:7"
    target = cached(cluster, image)
    lock = _hold_lock(target, OTHER, "77", age=30)
    cluster.stub("sacct.out", SACCT_ROW.format(owner=OTHER, state="COMPLETED", exit="0:0"))
    run_bytes = cluster.hook._run_bytes

    def finish_when_locking(command: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes, str]:
        if "LOCK HELD" in command:
            target.write_bytes(VALID_SQSH)
        return run_bytes(command, stdin, timeout)

    monkeypatch.setattr(cluster.hook, "_run_bytes", finish_when_locking)
    assert importer(cluster, image).execute({}) == str(target)
    assert not lock.exists()
    assert cluster.calls("sbatch") == []


def test_import_waits_for_a_lock_being_submitted_then_breaks_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = "nvcr.io/nvidia/app:4"
    lock = _hold_lock(cached(cluster, image), OTHER, None, age=conversion.LOCK_SUBMIT_GRACE_S - 30)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        os.utime(lock, (time.time() - 2 * conversion.LOCK_SUBMIT_GRACE_S,) * 2)

    clock = SimpleNamespace(sleep=sleep, monotonic=time.monotonic, time=time.time)
    monkeypatch.setattr("airflow_provider_tao_slurm.lifecycle.conversion.time", clock)
    _, kwargs = _deferred(importer(cluster, image)).trigger.serialize()
    assert sleeps == [2.0]
    assert kwargs["slurm_job_id"] == "4242"


def _event(status: str, native: str = "COMPLETED", owner: str = OWNER, **extra: Any) -> dict[str, Any]:
    tao = {"COMPLETED": "COMPLETE", "FAILED": "ERROR"}[native]
    state = {"tao_state": tao, "native": native, "exit_code": 1 if native == "FAILED" else 0, "message": native}
    return {"status": status, "slurm_job_id": "4242", "job_name": f"tao-enroot-{owner}", "state": state, **extra}


def test_execute_complete_returns_the_checked_file_and_releases_the_lock(cluster: Cluster) -> None:
    image = "nvcr.io/nvidia/app:5"
    target = cached(cluster, image)
    target.write_bytes(VALID_SQSH)
    lock = _hold_lock(target, OWNER, "4242")
    assert importer(cluster, image).execute_complete({}, event=_event("terminal")) == str(target)
    assert not lock.exists()


@pytest.mark.parametrize(
    ("event", "target", "message"),
    [
        (_event("terminal", "FAILED"), None, "ended FAILED (exit code 1)"),
        (_event("terminal"), bytes(8192), "completed, but"),
        (_event("error", message="is unknown to squeue and sacct"), None, "unknown to squeue and sacct"),
    ],
    ids=["job-failed", "completed-but-invalid-file", "job-vanished"],
)
def test_execute_complete_fails_with_the_log_tail(
    cluster: Cluster, event: dict[str, Any], target: bytes | None, message: str
) -> None:
    image = "nvcr.io/nvidia/nonexistent:5"
    path = cached(cluster, image)
    if target is not None:
        path.write_bytes(target)
    lock = _hold_lock(path, OWNER, "4242")
    logs = cluster.results / "logs" / f"tao-enroot-{OWNER}-4242"
    logs.mkdir(parents=True)
    (logs / "main.err").write_text("x" * 10000 + "\n[ERROR] URL https://nvcr.io/v2/x returned error code: 404\n")
    (logs / "main.out").write_text("TAO_SLURM: converting\n")
    with pytest.raises(ImageConversionError) as info:
        importer(cluster, image).execute_complete({}, event=event)
    text = str(info.value)
    assert message in text
    assert "404" in text
    assert "TAO_SLURM: converting" in text
    assert "x" * 4100 not in text, "only the tail of a log is quoted"
    assert "no GPU job may fall back to the registry image" in text
    assert not lock.exists()


@pytest.mark.parametrize(
    "event",
    [
        None,
        "done",
        {"status": "terminal"},
        {**_event("terminal"), "slurm_job_id": "1;id"},
        {**_event("terminal"), "job_name": "tao-enroot-$(id)"},
    ],
    ids=["none", "text", "no-job", "hostile-job-id", "foreign-job-name"],
)
def test_execute_complete_refuses_an_unusable_event_before_any_command(cluster: Cluster, event: Any) -> None:
    with pytest.raises(ImageConversionError, match="unusable event"):
        importer(cluster, "nvcr.io/nvidia/app:6").execute_complete({}, event=event)
    assert cluster.hook.commands == []


# ------------------------------------------------------------------ SlurmPreflightOperator


def preflight(cluster: Cluster, **kwargs: Any) -> SlurmPreflightOperator:
    return cluster.attach(SlurmPreflightOperator(task_id="preflight", **kwargs))


def test_preflight_passes_and_reports_each_check(cluster: Cluster) -> None:
    report = preflight(cluster, image="example.org/team/app:1").execute({})
    assert report["cluster"] == "unit"
    assert report["checks"] == {
        "login": "ok: alice@localhost with a key, no password",
        "tools": "ok: sbatch squeue sacct scancel srun",
        "pyxis": "ok: srun offers --container-image --container-mounts --no-container-mount-home",
        "results_dir": f"ok: {cluster.results} is writable",
        "partitions": "ok: GPU jobs on polar (4 h, 4 GPUs/node: a100); conversion on cpu_long (7 d, no GPUs)",
        "account": "ok: alice may charge gpu_proj",
        "preemption": "ok: preemption sends the batch shell its --signal warning (PreemptType=preempt/partition_prio, "
        "PreemptMode=REQUEUE, PreemptParameters=send_user_signal): a slice's checkpoint_signal reaches the program "
        "when it is preempted too",
        "enroot": "ok: enroot 3.4.1 on partition cpu_long",
        "gpu_node": f"ok: on node {socket.gethostname()} of partition polar: Pyxis configured, enroot 3.4.1, "
        f"{cluster.results} writable; site mounts from {cluster.mounts_d}: none (cached in "
        f"{cluster.results}/.tao-slurm/site-mounts.json)",
        "credentials": "ok: not needed for this image",
    }
    enroot, gpu_node = cluster.calls("srun")
    assert enroot == (
        "--partition=cpu_long --account=gpu_proj --nodes=1 --ntasks=1 --time=1 --immediate=60 --input=none "
        f"{ENROOT_STEP}"
    )
    assert gpu_node.startswith(
        "--partition=polar --account=gpu_proj --nodes=1 --ntasks=1 --time=1 --immediate=60 --input=none sh -c "
    )


def test_preflight_lists_every_problem_with_its_fix(cluster: Cluster) -> None:
    cluster.stub("srun-help.out", "Usage: srun [OPTIONS...]\n  -h, --help\n")
    cluster.stub("srun-probe.out", "")
    cluster.stub("sinfo.out", "polar*|4:00:00|gpu:4\n")
    cluster.stub("sacctmgr.out", "")
    operator = preflight(cluster, results_dir=f"{cluster.root}/absent", image="nvcr.io#nvidia/tao/tao-toolkit:5")
    with pytest.raises(PreflightError) as info:
        operator.execute({})
    problems = {problem.split(":", 1)[0]: problem for problem in info.value.problems}
    assert sorted(problems) == ["account", "credentials", "enroot", "partitions", "pyxis", "results_dir"]
    assert "install the Pyxis SPANK plugin" in problems["pyxis"]
    assert "--container-image, --container-mounts, --no-container-mount-home" in problems["pyxis"]
    assert f"mkdir -p {cluster.root}/absent" in problems["results_dir"]
    assert "partition cpu_long does not exist on cluster 'unit' (sinfo -a shows: polar)" in problems["partitions"]
    assert "no association with account gpu_proj" in problems["account"]
    assert "install Enroot on its nodes" in problems["enroot"]
    assert "nvcr.io, authn.nvidia.com" in problems["credentials"]
    assert "registry_conn_id" in problems["credentials"]
    assert all(problem in str(info.value) for problem in info.value.problems)
    assert cluster.calls("srun") == [
        f"--partition=cpu_long --nodes=1 --ntasks=1 --time=1 --immediate=60 --input=none {ENROOT_STEP}"
    ], "a refused account is not used for the enroot step"


BUSY = "srun: error: Unable to allocate resources: Requested nodes are busy\n"
REFUSED = "srun: error: Unable to allocate resources: job_submit/lua: a GPU is required on partition polar\n"


@pytest.mark.parametrize("srun_said", [BUSY, REFUSED, ""], ids=["busy", "site-refused", "nothing"])
def test_steps_that_never_start_are_not_verified_and_do_not_fail(
    cluster: Cluster, capfd: pytest.CaptureFixture[str], srun_said: str
) -> None:
    """A busy partition is the normal case: the enroot and GPU-node steps could not start, so nothing was seen
    there; the preflight passes with both checks reading "not verified (why)", each with a warning."""
    cluster.stub("srun-refused.err", srun_said)
    report = preflight(cluster).execute({})
    logged = "".join(capfd.readouterr())  # the operator logs through Airflow's structlog, to the process's output
    reason = srun_said.strip() or "srun exited 1 and printed nothing"
    for check, partition in (("enroot", "cpu_long"), ("gpu_node", "polar")):
        assert report["checks"][check] == (
            f"not verified: the one-minute CPU step found no free node on partition {partition} within 60 s or was "
            f"refused there ({reason}); a busy partition is normal: run the preflight again when a node is free, or "
            "raise enroot_wait_seconds"
        )
        assert f"{check} not verified: " in logged
    assert report["checks"]["results_dir"] == f"ok: {cluster.results} is writable"


def test_a_step_that_started_still_fails_on_what_it_saw(cluster: Cluster) -> None:
    """The steps ran (they printed their start line) but enroot printed nothing there: that was seen, and fails."""
    cluster.stub("srun-probe.out", "")
    with pytest.raises(PreflightError) as info:
        preflight(cluster).execute({})
    assert [problem.split(":", 1)[0] for problem in info.value.problems] == ["enroot", "gpu_node"]
    assert "install Enroot on its nodes" in info.value.problems[0]
    assert "enroot is not installed on node" in info.value.problems[1]


def test_preflight_reports_a_missing_pyxis_option_it_was_asked_for(cluster: Cluster) -> None:
    with pytest.raises(PreflightError) as info:
        preflight(cluster, pyxis_options=["--container-image", "--container-writable"]).execute({})
    assert info.value.problems == [
        "pyxis: srun does not offer --container-writable, so Pyxis is missing or too old; install the Pyxis SPANK "
        "plugin (https://github.com/NVIDIA/pyxis) on the login and compute nodes and list it in plugstack.conf"
    ]


def test_preflight_picks_a_partition_without_gpus_for_conversion_when_none_is_set(cluster: Cluster) -> None:
    cluster.hook.settings = dataclasses.replace(cluster.hook.settings, conversion_partition=None, partitions=())
    cluster.stub("sinfo.out", "gpu*|4:00:00|gpu:h100:8\ndebug|30:00|gpu:h100:8\ncpu|1-00:00:00|(null)\n")
    report = preflight(cluster).execute({})
    assert report["checks"]["partitions"] == (
        "ok: GPU jobs on gpu (4 h, 8 GPUs/node: h100), the cluster's default; "
        "conversion on cpu (1 d, no GPUs), chosen as a partition without GPUs"
    )
    assert cluster.calls("srun")[0].startswith("--partition=cpu ")


def test_preflight_refuses_a_cluster_without_a_cpu_partition_for_conversion(cluster: Cluster) -> None:
    cluster.hook.settings = dataclasses.replace(cluster.hook.settings, conversion_partition=None)
    cluster.stub("sinfo.out", "polar*|4:00:00|gpu:4\n")
    with pytest.raises(PreflightError) as info:
        preflight(cluster, check_enroot=False).execute({})
    assert info.value.problems == [
        "partitions: no conversion partition is configured and cluster 'unit' has no usable partition without GPUs "
        "for 2 h (passed over: none: it has no CPU partition); image conversion never runs on a GPU partition: set "
        "the connection's conversion_partition extra (or partition= on EnrootImportOperator) to a CPU partition you "
        "may use; fix partition / conversion_partition on the connection or the operator"
    ]


def test_preflight_refuses_a_gpu_partition_without_gpus(cluster: Cluster) -> None:
    cluster.stub("sinfo.out", "polar*|4:00:00|(null)\ncpu_long|4:00:00|(null)\n")
    with pytest.raises(PreflightError) as info:
        preflight(cluster, check_enroot=False).execute({})
    assert info.value.problems == [
        "partitions: partition polar has no GPUs (sinfo shows no gpu GRES on its nodes); set partition on the "
        "connection or the operator to a GPU partition: none visible"
    ]


def test_preflight_checks_the_gpu_node_not_the_login_host(cluster: Cluster) -> None:
    """The login host's srun offers Pyxis' options, but the GPU node's plugin configuration does not load Pyxis,
    and a dataset root is not there. Expected: one gpu_node problem naming both, with the node and partition."""
    cluster.stub("plugstack.conf.d/pyxis.conf", "# required /usr/local/lib/slurm/spank_pyxis.so (disabled)\n")
    absent = f"{cluster.root}/datasets/coco"
    with pytest.raises(PreflightError) as info:
        preflight(cluster, dataset_paths=[f"lustre://{absent}"], check_enroot=False).execute({})
    where = f"on node {socket.gethostname()} of partition polar"
    assert info.value.problems == [
        f"gpu_node: Pyxis is not in the SPANK plugin configuration {where} ({cluster.stubs}/plugstack.conf and the "
        "files it includes), though the login host's srun offers its options: a GPU job there would run its command "
        f"outside the container; ask the cluster admins to install Pyxis on the GPU nodes; {absent} cannot be read "
        f"{where} (shared storage not mounted there?); fix dataset_paths or the mounts"
    ]


def test_preflight_reads_the_site_mounts_on_the_gpu_node_and_caches_them(cluster: Cluster) -> None:
    """Enroot's mounts.d files on the node, in Enroot's order, comments and blank lines skipped; the cache
    serves the partition read of every submission (no round trip of its own)."""
    (cluster.mounts_d / "10-system.fstab").write_text("# system\n/etc/hosts /etc/hosts none x-create=file,bind\n\n")
    (cluster.mounts_d / "50-site.fstab").write_text("/srv/lustre/datasets datasets none x-create=dir,bind,ro")
    (cluster.mounts_d / "60-home.fstab").write_text("${HOME}/x ${HOME}/x none bind\n")
    (cluster.mounts_d / "README").write_text("/not/a /mount none bind\n")

    report = preflight(cluster, check_enroot=False).execute({})

    cache = cluster.results / ".tao-slurm" / "site-mounts.json"
    assert report["checks"]["gpu_node"].endswith(
        f"; site mounts from {cluster.mounts_d}: /etc/hosts at /etc/hosts, /srv/lustre/datasets at /datasets "
        f"(cached in {cache})"
    )
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    hook = LocalHook(cluster.hook.settings, cluster.hook.env)
    hook.partition_limits()
    commands_before = len(hook.commands)
    site = hook.site_mounts()
    assert len(hook.commands) == commands_before, "the partition read brought the site mounts back"
    assert site is not None
    assert site.mounts == (Mount("/etc/hosts", "/etc/hosts"), Mount("/srv/lustre/datasets", "/datasets"))
    assert site.node == socket.gethostname()
    assert site.directory == str(cluster.mounts_d)


def test_without_a_preflight_the_site_mounts_are_unknown(cluster: Cluster) -> None:
    assert cluster.hook.site_mounts() is None
    (cluster.results / ".tao-slurm").mkdir(mode=0o700)
    (cluster.results / ".tao-slurm" / "site-mounts.json").write_text("{not json")
    assert LocalHook(cluster.hook.settings, cluster.hook.env).site_mounts() is None


def test_preflight_says_an_account_it_could_not_verify(cluster: Cluster, capfd: pytest.CaptureFixture[str]) -> None:
    (cluster.root / "bin" / "sacctmgr").write_text("#!/bin/sh\necho 'Problem talking to the database' >&2\nexit 1\n")
    report = preflight(cluster).execute({})
    assert report["checks"]["account"] == "not verified: sacctmgr failed (Problem talking to the database)"
    out = capfd.readouterr()
    assert "[warning  ] Preflight on cluster unit: account gpu_proj not verified: sacctmgr failed" in out.out + out.err


def test_preflight_says_when_preemption_does_not_warn_the_batch_shell(
    cluster: Cluster, capfd: pytest.CaptureFixture[str]
) -> None:
    cluster.stub("preemption.conf", PREEMPTION.format("(null)"))
    report = preflight(cluster).execute({})
    said = (
        "preemption does not warn the batch shell (PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, no "
        "send_user_signal): the job's steps get SIGTERM and checkpoint_signal comes only before the time limit, so a "
        "training must checkpoint periodically"
    )
    assert report["checks"]["preemption"] == f"ok: {said}"
    out = capfd.readouterr()
    assert f"[warning  ] Preflight on cluster unit: {said}" in out.out + out.err
    # the preflight's read is fresh, and kept for the submissions (the RPC pacing's cache)
    assert "PreemptParameters       = (null)" in (cluster.home / ".tao-slurm" / "slurmctld-preemption").read_text()


def test_preflight_says_preemption_settings_it_could_not_read(
    cluster: Cluster, capfd: pytest.CaptureFixture[str]
) -> None:
    (cluster.stubs / "preemption.conf").unlink()
    report = preflight(cluster).execute({})
    assert report["checks"]["preemption"] == (
        "not verified: scontrol show config printed no preemption settings (exit status 1)"
    )
    out = capfd.readouterr()
    assert "Preflight on cluster unit: preemption not verified" in out.out + out.err


def test_preflight_installs_credentials_from_an_environment_variable(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_NGC_KEY", "nvapi-unit-secret-123")
    report = preflight(cluster, image="nvcr.io#nvidia/x:1", registry_secret_env="TEST_NGC_KEY").execute({})
    assert report["checks"]["credentials"] == "ok: present for nvcr.io, authn.nvidia.com (installed now)"
    credentials = cluster.home / ".config" / "enroot" / ".credentials"
    assert credentials.read_text() == (
        "machine nvcr.io login $oauthtoken password nvapi-unit-secret-123\n"
        "machine authn.nvidia.com login $oauthtoken password nvapi-unit-secret-123\n"
    )
    assert oct(credentials.stat().st_mode & 0o777) == "0o600"
    assert not any("nvapi-unit-secret-123" in command for command in cluster.hook.commands)
    assert "nvapi-unit-secret-123" not in str(report)


def test_preflight_fails_on_login_and_skips_the_rest(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise SlurmConnectionError("login1 unreachable (timed out)", [("login1", "timed out")])

    monkeypatch.setattr(cluster.hook, "get_conn", refuse)
    with pytest.raises(PreflightError) as info:
        preflight(cluster).execute({})
    (problem,) = info.value.problems
    assert problem.startswith("login: login1 unreachable (timed out) (fix the connection 'slurm_default'")
    assert cluster.hook.commands == []


def _skewed_date(tmp_path: Path, seconds: int) -> dict[str, str]:
    """A PATH whose ``date`` is ``seconds`` off (the login host's clock skewed against the storage's)."""
    bin_dir = tmp_path / "skewed-bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "date"
    fake.write_text(f"#!/bin/sh\necho $(( $(/bin/date +%s) + {seconds} ))\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("skew", [600, -600])
def test_lock_age_is_measured_by_the_storage_clock_not_the_login_hosts(tmp_path: Path, skew: int) -> None:
    """A lock taken a moment ago reads as fresh even when the login host's clock is ten minutes off
    (with the login host's clock it would read as 600 s old and be broken as abandoned)."""
    lock = conversion.lock_dir(f"{tmp_path}/x.sqsh")
    assert conversion.parse_lock(_sh(conversion.acquire_lock(lock, OWNER), tmp_path).stdout).acquired
    done = subprocess.run(
        ["sh", "-c", conversion.acquire_lock(lock, OTHER)],
        cwd=tmp_path,
        env=_skewed_date(tmp_path, skew),
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 <= conversion.parse_lock(done.stdout).age_seconds < 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["skewed-bin", "x.sqsh.lock"]  # no scratch file left


@pytest.mark.parametrize(
    ("mtime_offset", "skew", "fresh"),
    [
        pytest.param(-10, 600, True, id="fresh-while-login-clock-ahead"),
        pytest.param(-10, -600, True, id="fresh-while-login-clock-behind"),
        pytest.param(-700, 0, False, id="older-than-max-age"),
        pytest.param(3600, 0, False, id="dated-in-the-future"),
    ],
)
def test_the_partition_cache_age_uses_the_storage_clock(
    tmp_path: Path, mtime_offset: int, skew: int, fresh: bool
) -> None:
    from airflow_provider_tao_slurm.core import commands

    cache = tmp_path / "cache" / "partitions"
    cache.parent.mkdir()
    cache.write_text("cached|1:00:00\n")
    os.utime(cache, (time.time() + mtime_offset, time.time() + mtime_offset))
    env = _skewed_date(tmp_path, skew)
    (tmp_path / "skewed-bin" / "sinfo").write_text("#!/bin/sh\necho 'asked|2:00:00'\n")
    (tmp_path / "skewed-bin" / "sinfo").chmod(0o755)
    done = subprocess.run(
        ["sh", "-c", commands.sinfo_partitions_cached(str(cache), 600)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("cached|1:00:00\n" if fresh else "asked|2:00:00\n")
    assert sorted(p.name for p in cache.parent.iterdir()) == ["partitions"]


@pytest.mark.parametrize("copy", [VALID_SQSH, bytes(4096), None], ids=["converted", "truncated-copy", "no-copy"])
def test_registry_credentials_are_needed_only_to_convert(
    cluster: Cluster, capfd: pytest.CaptureFixture[str], copy: bytes | None
) -> None:
    """nvcr.io needs credentials to pull, and only a conversion pulls: while the image's converted copy is in the
    image cache, missing credentials are "not needed now" (a warning says when they will be); without a usable
    copy they fail the preflight, saying the image must be converted."""
    image = "nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt"
    cached = cluster.containers / "nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh"
    if copy is not None:
        cached.write_bytes(copy)
    operator = preflight(cluster, image=image, containers_dir=str(cluster.containers))
    if copy == VALID_SQSH:
        text = operator.execute({})["checks"]["credentials"]
        assert text.startswith(
            f"ok: not needed now: {image} is converted already ({cached}); credentials for nvcr.io, authn.nvidia.com "
            "are needed only to convert it again: pass registry_conn_id"
        )
        assert "credentials ok: not needed now" in "".join(capfd.readouterr())
        return
    with pytest.raises(PreflightError) as info:
        operator.execute({})
    assert info.value.problems == [
        "credentials: no Enroot credentials for nvcr.io, authn.nvidia.com in ~/.config/enroot/.credentials, and the "
        f"image must be converted (no usable copy in {cluster.containers}); pass registry_conn_id (a connection with "
        "the registry key as password) or registry_secret_env to install them, or add lines like 'machine nvcr.io "
        "login $oauthtoken password <key>' (mode 600) yourself"
    ]
