"""The submit request: validated once into a frozen value, bound to a job, rendered and staged from the layout."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any

import pytest
from fakes import SETTINGS

from airflow_provider_tao_slurm.core.continuation import DEFAULT_CHECKPOINT_GLOBS
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import from_json
from airflow_provider_tao_slurm.core.request import (
    DEFAULT_PARTITION_PLACEHOLDER,
    BoundRequest,
    SubmitRequest,
    SupportingFiles,
    bind_request,
    check_env_names,
    submit_request,
)
from airflow_provider_tao_slurm.exceptions import (
    ConnectionConfigError,
    ImageReferenceError,
    ResourceError,
    SecretLeakError,
    ValidationError,
)

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.config import ClusterSettings
    from airflow_provider_tao_slurm.core.execution import Execution

SQSH = "/lustre/containers/tao.sqsh"
LAYOUT = JobLayout("/lustre/u", "tao-job-1")
SECRET = "s3cr3t-value-9f8e7d"
SHA = "0" * 64
#: The operator's defaults, as ``SbatchSubmitOperator`` passes them.
DEFAULTS: dict[str, Any] = {
    "image": SQSH,
    "command": "python train.py --out {results_dir} --spec {config_path}",
    "num_nodes": 1,
    "gpus_per_node": 1,
    "cpus_per_task": 16,
    "time_hours": 4.0,
    "timeout_hours": 3.8,
    "partition": None,
    "account": None,
    "container_mounts": None,
    "spec": None,
    "env": None,
    "secret_env": None,
    "nccl_env": None,
    "requeue": True,
    "exclude_nodes": None,
    "network_arch": None,
    "action": "train",
    "mem_mb": None,
    "execution": None,
    "qos": None,
    "constraint": None,
    "reservation": None,
    "gpu_type": None,
    "total_gpus": None,
    "sbatch_options": None,
    "master_port": None,
    "max_continuations": 0,
    "checkpoint_glob": None,
    "checkpoint_signal": None,
    "signal_grace_seconds": None,
}


def no_files(execution: Execution) -> SupportingFiles | None:
    return None


def request(settings: ClusterSettings = SETTINGS, reader: Any = no_files, **changes: Any) -> SubmitRequest:
    return submit_request(
        settings=settings,
        conn_id="slurm_default",
        secret_sources=("env", "conn", "var"),
        read_supporting_files=reader,
        **{**DEFAULTS, **changes},
    )


def bound(**changes: Any) -> BoundRequest:
    return bind_request(request(**changes), LAYOUT)


def test_the_request_takes_the_connections_defaults_and_is_frozen() -> None:
    made = request(env={"A": "1"}, secret_env={"TOKEN": "env:SRC"})

    assert (made.image, made.results_base, made.cluster) == (SQSH, "/lustre/u", "mini")
    assert (made.resources.partition, made.resources.account) == ("polar", "acct")
    assert (made.container_mounts, made.mounts_origin) == ("/lustre:/lustre", "connection 'slurm_default'")
    assert (made.network_arch, made.action, made.execution_block, made.bundle_sha256) == ("tao", "train", None, None)
    assert made.continuation.slice_script(LAYOUT) is None
    assert made.continuation.handle_globs == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.command = "rm -rf /"  # type: ignore[misc]
    with pytest.raises(TypeError):
        made.env["A"] = "2"  # type: ignore[index]
    with pytest.raises(TypeError):
        made.secret_env["TOKEN"] = SECRET  # type: ignore[index]


def test_a_parameter_left_out_or_misnamed_is_refused_as_a_signature_would() -> None:
    left_out = {name: value for name, value in DEFAULTS.items() if name != "requeue"}

    with pytest.raises(TypeError, match=r"missing keyword arguments \['requeue'\], unexpected ones \['requeu'\]"):
        submit_request(
            settings=SETTINGS,
            conn_id="slurm_default",
            secret_sources=("env",),
            read_supporting_files=no_files,
            **left_out,
            requeu=True,
        )


def test_the_operators_own_values_win() -> None:
    made = request(partition="polar_long", account="other", container_mounts="/lustre/u:/lustre/u")

    assert (made.resources.partition, made.resources.account) == ("polar_long", "other")
    assert (made.container_mounts, made.mounts_origin) == ("/lustre/u:/lustre/u", "the operator")


def test_a_bundle_gives_the_command_the_environment_and_the_files() -> None:
    block = {"command": "run.sh", "environment": {"A": "bundle", "B": 2}, "supporting_files": []}
    files = SupportingFiles({"run.sh": b"echo hi\n"}, '{"files": []}')
    seen: list[Execution] = []

    def reader(execution: Execution) -> SupportingFiles:
        seen.append(execution)
        return files

    made = request(reader=reader, command=None, execution=block, env={"A": "operator"})

    assert seen == [made.execution]
    assert (made.command, made.supporting_files, dict(made.env)) == ("run.sh", files, {"A": "operator", "B": "2"})
    assert made.bundle_sha256 is not None
    assert made.bundle_sha256 != request(reader=reader, command=None, execution={**block, "command": "x"}).bundle_sha256


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        pytest.param({"image": "nvcr.io#nvidia/x:1"}, ImageReferenceError, "EnrootImportOperator", id="registry"),
        pytest.param({"cpus_per_task": 0}, ResourceError, "cpus_per_task=0 must be at least 1", id="cpus"),
        pytest.param({"num_nodes": 2}, ValidationError, "put NcclProbeOperator upstream", id="nccl-env-missing"),
        pytest.param({"secret_env": {"T": "plain"}}, ValidationError, r"secret_env\[T\] holds a literal", id="lit"),
        pytest.param({"secret_env": {"T": "ssm:key"}}, ValidationError, r"secret_env\[T\] holds a literal", id="kind"),
        pytest.param({"command": " "}, ValidationError, "command is empty", id="command"),
        pytest.param({"command": "a\x00b"}, ValidationError, "NUL byte", id="nul"),
        pytest.param({"network_arch": ""}, ValidationError, "must be a TAO network", id="network-arch"),
        pytest.param({"env": {"1X": "a"}}, ValidationError, "env name '1X'", id="env-name"),
        pytest.param({"max_continuations": -1}, ValidationError, "max_continuations=-1", id="continuations"),
    ],
)
def test_bad_values_are_refused(changes: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        request(**changes)


def test_no_results_dir_is_the_connections_problem() -> None:
    with pytest.raises(ConnectionConfigError, match="connection 'slurm_default' has no results_dir"):
        request(settings=dataclasses.replace(SETTINGS, results_dir=None))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"A-B": "1"}, "'A-B' is not a valid environment variable name"),
        ({"A": 1}, r"env\['A'\] must be a string \(got int\); quote it"),
        ({"A": "a\x00"}, "NUL byte"),
    ],
)
def test_check_env_names(env: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        check_env_names(env, "env")


def test_binding_fills_the_tokens_from_the_layout() -> None:
    job = bound(env={"OUT": "{results_dir}/out"}, spec={"train": {"out": "{results_dir}", "id": "{job_id}"}})

    assert job.command == f"python train.py --out {LAYOUT.results_dir} --spec {LAYOUT.spec_path}"
    assert dict(job.env) == {"OUT": f"{LAYOUT.results_dir}/out"}
    assert job.spec == {"train": {"out": LAYOUT.results_dir, "id": LAYOUT.job_id}}
    assert json.loads(job.env_text) == dict(job.env)
    assert LAYOUT.results_dir in job.spec_text
    assert (job.child_exit_code_path, job.sidecar_path) == (None, None)


def test_a_bundle_wraps_the_command_and_its_exit_codes_go_to_the_job_dir() -> None:
    job = bound(execution={"pre_commands": ["mkdir -p {results_dir}"]})

    assert job.child_exit_code_path == LAYOUT.in_job_dir("exit_codes.children")
    assert f"mkdir -p {LAYOUT.results_dir}" in job.command
    assert job.child_exit_code_path in job.command


def test_binding_refuses_a_container_that_cannot_see_the_job() -> None:
    with pytest.raises(ValidationError, match="the job's container cannot see"):
        bound(container_mounts="/scratch:/scratch")


def test_the_draft_script_stands_in_for_the_default_partition_and_refuses_secrets() -> None:
    no_partition = dataclasses.replace(SETTINGS, partitions=())
    job = bind_request(request(settings=no_partition), LAYOUT)

    assert f"#SBATCH --partition={DEFAULT_PARTITION_PLACEHOLDER}\n" in job.draft_script([])
    with pytest.raises(SecretLeakError, match="a secret_env value appears in spec") as leak:
        bound(spec={"note": SECRET}).draft_script([SECRET])
    assert SECRET not in str(leak.value)


def test_the_placed_layout_is_checked_against_the_bundle() -> None:
    torchrun = {"distributed": {"launcher": "torchrun", "processes_per_node": 8}}
    made = request(total_gpus=8, gpus_per_node=4, nccl_env={}, execution=torchrun)
    placed = dataclasses.replace(made.resources, num_nodes=2, gpus_per_node=4, layout_total=None)

    with pytest.raises(ValidationError, match="processes_per_node is 8 but the job has gpus_per_node=4"):
        made.check_layout(placed)


def test_a_slice_takes_its_paths_from_the_layout() -> None:
    made = request(max_continuations=2, time_hours=0.5, timeout_hours=0.45)
    script = made.continuation.slice_script(LAYOUT)

    assert script is not None
    assert (script.slices_dir, script.results_dir, script.grace_seconds) == (LAYOUT.slices_dir, LAYOUT.results_dir, 180)
    assert made.continuation.handle_globs == DEFAULT_CHECKPOINT_GLOBS


def test_the_record_is_opened_for_the_bound_job() -> None:
    job = bound(spec={"a": 1}, secret_env={"T": "env:X"})
    record = job.open_record(now="2026-01-01T00:00:00Z", retry_of=None, secrets=[SECRET])

    assert (record.job_id, record.job_name, record.image) == (LAYOUT.job_id, LAYOUT.job_id, SQSH)
    assert (record.results_dir, record.job_dir, record.log_dir) == (LAYOUT.results_dir, LAYOUT.job_dir, LAYOUT.log_dir)
    assert record.config_sha256 == hashlib.sha256(job.spec_text.encode()).hexdigest()
    assert job.sidecar_path == LAYOUT.sidecar_path


ORIGIN = {"dag_id": "dag", "task_id": "t", "run_id": "run1", "map_index": -1}


def staged(job: BoundRequest, secrets: dict[str, str], helpers: bool) -> dict[str, tuple[bytes | None, int]]:
    record = job.open_record(now="2026-01-01T00:00:00Z", retry_of=None, secrets=list(secrets.values()))
    return job.files(
        script="#!/bin/bash\n",
        record=record,
        secrets=secrets,
        resources=job.request.resources,
        origin=ORIGIN,
        helpers=helpers,
    )


def test_every_staged_name_comes_from_the_layout() -> None:
    files = SupportingFiles({"run.sh": b"echo hi\n"}, '{"files": []}')
    job = bind_request(request(reader=lambda execution: files, execution={}), LAYOUT)

    names = staged(job, {"TOKEN": SECRET}, helpers=True)

    expected = [
        LAYOUT.results_dir,
        LAYOUT.log_dir,
        LAYOUT.ends_dir,
        LAYOUT.spec_path,
        LAYOUT.env_path,
        LAYOUT.script_path,
        LAYOUT.record_path,
        LAYOUT.sidecar_path,
        LAYOUT.helper_path("run.sh"),
        LAYOUT.helpers_manifest_path,
        LAYOUT.meta_path,
    ]
    assert list(names) == [LAYOUT.staged_name(path) for path in expected]
    assert names[LAYOUT.staged_name(LAYOUT.sidecar_path)] == (f"export TOKEN={SECRET}\n".encode(), 0o600)
    assert names[LAYOUT.staged_name(LAYOUT.script_path)] == (b"#!/bin/bash\n", 0o700)
    assert names[LAYOUT.staged_name(LAYOUT.helper_path("run.sh"))] == (b"echo hi\n", 0o644)
    record_text = names[LAYOUT.staged_name(LAYOUT.record_path)][0]
    assert record_text is not None
    assert from_json(record_text.decode()).job_id == LAYOUT.job_id
    meta = names[LAYOUT.staged_name(LAYOUT.meta_path)][0]
    assert meta is not None
    assert json.loads(meta) == {
        **ORIGIN,
        "job_id": LAYOUT.job_id,
        "image": SQSH,
        "nodes": 1,
        "gpus_per_node": 1,
        "partition": "polar",
        "secret_names": ["TOKEN"],
    }


def test_no_sidecar_without_secrets_and_no_helpers_when_they_are_reused() -> None:
    files = SupportingFiles({"run.sh": b"echo hi\n"}, '{"files": []}')
    job = bind_request(request(reader=lambda execution: files, execution={}), LAYOUT)

    names = staged(job, {}, helpers=False)

    assert LAYOUT.staged_name(LAYOUT.sidecar_path) not in names
    assert not any(name.startswith(LAYOUT.staged_name(LAYOUT.helpers_dir)) for name in names)


def test_a_path_outside_the_base_has_no_staged_name() -> None:
    with pytest.raises(ValidationError, match="is not under the results base dir"):
        LAYOUT.staged_name("/lustre/other/x")
    with pytest.raises(ValidationError):
        LAYOUT.staged_name("/lustre/u")
