"""``SbatchSubmitOperator``: validation before any SSH, secrets kept out of everything staged, retries adopt."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import SETTINGS, FakeSlurmHook, FakeTaskStateStore

from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import from_json, mark, mint_job_id, to_json
from airflow_provider_tao_slurm.core.states import TaoState, state_from_native
from airflow_provider_tao_slurm.exceptions import (
    AmbiguousSubmissionError,
    ConnectionConfigError,
    ImageReferenceError,
    MissingPathsError,
    ResourceError,
    SecretLeakError,
    StatusQueryError,
    SubmissionStopped,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW, SlurmHook
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator

IMAGE = "/lustre/containers/tao.sqsh"
SECRET = "s3cr3t-value-9f8e7d"
JOB_ID = mint_job_id("dag", "submit", "run1")
LAYOUT = JobLayout("/lustre/u", JOB_ID)


def ctx(try_number: int = 1) -> dict[str, Any]:
    return {
        "ti": SimpleNamespace(
            dag_id="dag", task_id="submit", run_id="run1", map_index=-1, try_number=try_number, stats_tags={}
        )
    }


def operator(hook: Any, **kwargs: Any) -> SbatchSubmitOperator:
    kwargs.setdefault("image", IMAGE)
    kwargs.setdefault("gpus_per_node", 1)  # more GPUs need a probed nccl_env
    kwargs.setdefault("command", "python train.py --out {results_dir}")
    op = SbatchSubmitOperator(task_id="submit", **kwargs)
    op.__dict__["hook"] = hook
    return op


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> SlurmHook:
    """A real hook on explicit settings whose every attempt to connect fails the test."""

    def refuse(self: SlurmHook) -> Any:
        raise AssertionError("SSH was attempted before the input was validated")

    monkeypatch.setattr(SlurmHook, "get_conn", refuse)
    return SlurmHook(settings=SETTINGS)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param(
            {"image": "nvcr.io/nvidia/tao/tao-toolkit:5.0.0-pyt"}, ImageReferenceError, "EnrootImportOperator", id="reg"
        ),
        pytest.param({"image": "docker://nvcr.io#nvidia/x:1"}, ImageReferenceError, "EnrootImportOperator", id="uri"),
        pytest.param({"num_nodes": 2}, ValidationError, "NcclProbeOperator", id="multi-node-without-nccl-env"),
        pytest.param(
            {"gpus_per_node": 2}, ValidationError, "hangs happen inside a node too", id="one-node-two-gpus-no-nccl-env"
        ),
        pytest.param({"secret_env": {"T": "s3cr3t"}}, ValidationError, r"secret_env\[T\] holds a literal", id="lit"),
        pytest.param({"sbatch_options": {"uid": 0}}, ValidationError, "may not set --uid", id="sbatch-uid"),
        pytest.param({"qos": "a b"}, ValidationError, "no spaces", id="qos"),
        pytest.param({"gpu_type": "h100;x"}, ResourceError, "gpu_type", id="gpu-type"),
        pytest.param({"time_hours": 2, "timeout_hours": 2}, ResourceError, "timeout_hours=2 must be lower", id="to"),
        pytest.param({"env": {"1BAD": "x"}}, ValidationError, "'1BAD' is not a valid environment", id="env-digit"),
        pytest.param({"env": {"BAD-NAME": "x"}}, ValidationError, "'BAD-NAME' is not a valid", id="env-dash"),
        pytest.param({"env": {"": "x"}}, ValidationError, "env name '' is not a valid", id="env-empty"),
        pytest.param({"env": {"N": 3}}, ValidationError, r"env\['N'\] must be a string", id="env-value"),
        pytest.param({"secret_env": {"MY TOKEN": "x"}}, ValidationError, "secret_env name 'MY TOKEN'", id="secret"),
        pytest.param(
            {"num_nodes": 2, "nccl_env": {"NCCL IB": "1"}}, ValidationError, "nccl_env name 'NCCL IB'", id="nccl"
        ),
        pytest.param({"command": "  "}, ValidationError, "command is empty", id="command"),
        pytest.param({"spec": "a: ["}, ValidationError, "spec is not valid YAML", id="spec-yaml"),
        pytest.param({"spec": "[1, 2]"}, ValidationError, "spec must be a mapping", id="spec-list"),
        pytest.param({"secret_env": {"T": "env:TAO_UNSET_VAR_X"}}, ValidationError, "not set on the worker", id="e"),
    ],
)
def test_bad_input_is_refused_in_execute_before_any_ssh(
    no_ssh: SlurmHook, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    op = operator(no_ssh, **kwargs)

    with pytest.raises(error, match=match):
        op.execute(ctx())


def test_missing_results_dir_is_a_connection_problem(no_ssh: SlurmHook) -> None:
    hook = SlurmHook(settings=ClusterSettings(hosts=("login",), user="u", partitions=("polar",)))

    with pytest.raises(ConnectionConfigError, match="no results_dir"):
        operator(hook).execute(ctx())


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"command": f"curl -H 'X-Key: {SECRET}' https://example.org"}, id="command"),
        pytest.param({"env": {"NOTE": f"pre-{SECRET}"}}, id="env"),
        pytest.param({"spec": {"train": {"note": SECRET}}}, id="spec"),
        pytest.param({"command": "echo {job_id}", "env": {"X": "{results_dir}" + SECRET}}, id="bound-env"),
    ],
)
def test_secret_value_outside_the_sidecar_is_refused(kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAO_TEST_SRC", SECRET)
    hook = SubmitHook()
    op = operator(hook, secret_env={"HF_TOKEN": "env:TAO_TEST_SRC"}, **kwargs)

    with pytest.raises(SecretLeakError) as leak:
        op.execute(ctx())

    assert SECRET not in str(leak.value)
    assert "secret_env" in str(leak.value)
    assert (hook.staged, hook.submits) == ([], [])  # refused before anything reached the cluster


def test_literal_credential_in_command_is_refused() -> None:
    hook = SubmitHook()
    op = operator(hook, command="HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789 python train.py")

    with pytest.raises(SecretLeakError, match="HF_TOKEN") as leak:
        op.execute(ctx())

    assert "hf_abcdefghij" not in str(leak.value)
    assert (hook.staged, hook.submits) == ([], [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"time_hours": 5, "timeout_hours": 4.5}, "partition polar allows at most 4 h", id="default-4h"),
        pytest.param({"partition": "grizzly"}, "partition grizzly does not exist on cluster 'mini'", id="unknown"),
        pytest.param(
            {"partition": "polar_long", "time_hours": 49, "timeout_hours": 48.5},
            "partition polar_long allows at most 2 d",
            id="long-over",
        ),
        pytest.param(
            {"gpus_per_node": 8, "nccl_env": {}},
            "gpus_per_node=8 cannot start on polar (4 h, 4 GPUs/node): no node there has more than 4 GPUs",
            id="more-gpus-than-a-node-has",
        ),
        pytest.param(
            {"total_gpus": 10, "gpus_per_node": 4, "nccl_env": {}},
            "total_gpus=10 cannot be laid out on whole 4-GPU nodes on polar",
            id="total-not-whole-nodes",
        ),
    ],
)
def test_the_partitions_own_limit_is_checked_before_anything_is_staged(kwargs: dict[str, Any], message: str) -> None:
    hook = SubmitHook()
    with pytest.raises(ResourceError, match=re.escape(message)):
        operator(hook, **kwargs).execute(ctx())
    assert (hook.staged, hook.submits) == ([], [])


TORCHRUN_8 = {"distributed": {"launcher": "torchrun", "processes_per_node": 8}}


def test_a_bundle_whose_processes_per_node_disagree_with_the_gpus_is_refused_before_anything_is_staged(
    no_ssh: SlurmHook,
) -> None:
    """Asked directly (one node x 2 GPUs) it is refused before any SSH; through total_gpus=8 it is refused once the
    cluster lays the job out as 2 nodes x 4 GPUs, still before anything is staged."""
    with pytest.raises(ValidationError, match="processes_per_node is 8"):
        operator(no_ssh, gpus_per_node=2, nccl_env={}, execution=TORCHRUN_8).execute(ctx())
    hook = SubmitHook()
    with pytest.raises(ValidationError, match=r"processes_per_node is 8.*gpus_per_node=4"):
        operator(hook, total_gpus=8, gpus_per_node=4, nccl_env={}, execution=TORCHRUN_8).execute(ctx())
    assert (hook.staged, hook.submits) == ([], [])


def test_total_gpus_is_laid_out_on_the_partitions_nodes() -> None:
    """polar's nodes have 4 GPUs: 8 GPUs are 2 whole nodes, taken exclusively (every GPU of each node)."""
    hook = SubmitHook()
    operator(hook, total_gpus=8, gpus_per_node=4, nccl_env={}).execute(ctx())
    script = staged_text(hook, LAYOUT.script_path)
    assert ("#SBATCH --nodes=2\n" in script, "#SBATCH --exclusive\n" in script) == (True, True)
    assert "#SBATCH --gres=gpu:4\n" in script


def test_site_options_reach_the_script_and_the_default_partition_is_the_clusters() -> None:
    hook = SubmitHook()
    hook.settings = dataclasses.replace(SETTINGS, partitions=())
    handle = operator(
        hook,
        time_hours=10,
        timeout_hours=9.5,
        partition="polar_long",
        qos="long_qos",
        constraint="h100&ib",
        reservation="maint",
        gpu_type="h100",
        sbatch_options={"mail-type": "END", "comment": "run-42"},
    ).execute(ctx())
    script = staged_text(hook, LAYOUT.script_path)
    for line in (
        "#SBATCH --partition=polar_long",
        "#SBATCH --gres=gpu:h100:1",
        "#SBATCH --qos=long_qos",
        "#SBATCH --constraint=h100&ib",
        "#SBATCH --reservation=maint",
        "#SBATCH --mail-type=END",
        "#SBATCH --comment=run-42",
    ):
        assert f"{line}\n" in script
    assert handle["partition"] == "polar_long"

    other = SubmitHook()
    other.settings = dataclasses.replace(SETTINGS, partitions=())
    assert operator(other).execute(ctx())["partition"] == "polar"  # the cluster's default partition


# ---------------------------------------------------------------------- staging and submission


class SubmitHook(FakeSlurmHook):
    """The shared fake on this module's cluster; a job lookup must ask every login host."""

    def __init__(self) -> None:
        super().__init__(settings=SETTINGS)
        self.next_job_id = 701

    def find_jobs_by_name(
        self, job_name: str, *, all_hosts: bool = False, since: str = DEFAULT_SACCT_WINDOW
    ) -> list[str]:
        assert all_hosts
        return super().find_jobs_by_name(job_name, all_hosts=all_hosts, since=since)


def staged_text(hook: FakeSlurmHook, path: str) -> str:
    content = hook.staged_files[path][0]
    assert content is not None
    return content.decode()


def test_first_try_stages_everything_with_the_secret_only_in_the_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAO_TEST_SRC", SECRET)
    hook = SubmitHook()
    op = operator(
        hook,
        secret_env={"HF_TOKEN": "env:TAO_TEST_SRC"},
        env={"OUT": "{results_dir}/out"},
        spec={"train": {"epochs": 2}},
        exclude_nodes=["n3"],
        gpus_per_node=1,
    )

    handle = op.execute(ctx())

    assert hook.submits == [(LAYOUT.script_path, JOB_ID, LAYOUT.log_dir, ())]
    assert handle["job_id"] == JOB_ID
    assert handle["slurm_job_id"] == "701"
    assert handle["log_dir"] == LAYOUT.job_log_dir("701")
    assert handle["sidecar_path"] == LAYOUT.sidecar_path
    assert handle["exclude_nodes"] == ["n3"]
    assert SECRET not in json.dumps(handle)
    assert hook.staged_files[LAYOUT.sidecar_path] == (f"export HF_TOKEN={SECRET}\n".encode(), 0o600)
    assert hook.staged_files[LAYOUT.script_path][1] == 0o700
    script = staged_text(hook, LAYOUT.script_path)
    assert "#SBATCH --exclude=n3" in script
    assert f"TAO_SLURM_ENV_FILE={LAYOUT.sidecar_path}" in script
    assert json.loads(staged_text(hook, LAYOUT.env_path)) == {"OUT": f"{LAYOUT.results_dir}/out"}
    for path, (content, _mode) in hook.staged_files.items():
        assert path == LAYOUT.sidecar_path or SECRET.encode() not in (content or b""), path
    record = from_json(hook.files[LAYOUT.record_path])
    assert (record.state, record.backend_ref, record.terminal_state) == (TaoState.RUNNING, "701", None)
    assert SECRET not in hook.files[LAYOUT.record_path]


@pytest.mark.parametrize("made", [True, False], ids=["sbatch-made-the-job", "no-job-yet"])
def test_ctrl_c_mid_submission_leaves_no_job_and_no_secret(made: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``airflow dags test`` stopped while sbatch runs: the job of that name (if any) is cancelled, the staged
    sidecar removed, and the interrupt goes on."""
    monkeypatch.setenv("TAO_TEST_SECRET", SECRET)
    hook = SubmitHook()
    hook.submit_error = KeyboardInterrupt()  # type: ignore[assignment]
    if made:
        hook.found[JOB_ID] = ["777"]

    with pytest.raises(KeyboardInterrupt):
        operator(hook, secret_env={"TOKEN": "env:TAO_TEST_SECRET"}).execute(ctx())

    assert hook.cancels == ([(["777"], JOB_ID)] if made else [])
    assert hook.commands[-1] == f"rm -f -- {LAYOUT.sidecar_path}"


def test_a_kill_mid_submission_stops_it_and_undoes_it_and_is_nothing_afterwards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM (the Task SDK calls ``on_kill``) while sbatch runs: the submission stops and is undone; once the
    job is submitted, a kill leaves it to the sensor."""
    monkeypatch.setenv("TAO_TEST_SECRET", SECRET)
    hook = SubmitHook()
    hook.found[JOB_ID] = ["777"]
    op = operator(hook, secret_env={"TOKEN": "env:TAO_TEST_SECRET"})
    submit = hook.submit

    def killed_while_sbatch_runs(*args: Any, **kwargs: Any) -> str:
        submit(*args, **kwargs)
        op.on_kill()  # what the SIGTERM handler does, here mid-round trip
        raise AssertionError("on_kill let the submission go on")

    monkeypatch.setattr(hook, "submit", killed_while_sbatch_runs)

    with pytest.raises(SubmissionStopped):
        op.execute(ctx())

    assert hook.cancels == [(["777"], JOB_ID)]
    assert hook.commands[-1] == f"rm -f -- {LAYOUT.sidecar_path}"
    op.on_kill()  # after the submission: nothing of this task's to stop


def test_retried_try_adopts_the_job_and_keeps_its_record() -> None:
    hook = SubmitHook()
    first = operator(hook).execute(ctx())
    opened = replace(from_json(hook.files[LAYOUT.record_path]), submitted_at="2026-01-01T00:00:00Z")
    opened.transitions[0] = replace(opened.transitions[0], ts="2026-01-01T00:00:00Z")
    hook.files[LAYOUT.record_path] = to_json(opened)
    hook.found[JOB_ID] = [first["slurm_job_id"]]
    hook.staged.clear()

    second = operator(hook).execute(ctx(try_number=2))

    assert hook.submits == [(LAYOUT.script_path, JOB_ID, LAYOUT.log_dir, ())]
    assert hook.staged == []
    # the first try may have died before releasing its held job: the adopting try releases it
    assert hook.released == [(LAYOUT.log_dir, JOB_ID, first["slurm_job_id"])]
    assert hook.commands == []
    assert second["slurm_job_id"] == first["slurm_job_id"]
    assert second["job_id"] == first["job_id"]
    record = from_json(hook.files[LAYOUT.record_path])
    assert record.submitted_at == opened.submitted_at
    assert record.transitions == opened.transitions


def test_retried_try_after_a_crash_before_sbatch_submits_once() -> None:
    hook = SubmitHook()

    handle = operator(hook).execute(ctx(try_number=2))

    assert hook.submits == [(LAYOUT.script_path, JOB_ID, LAYOUT.log_dir, ())]
    assert handle["job_id"] == JOB_ID


def test_retried_try_after_the_job_ended_submits_a_new_job() -> None:
    hook = SubmitHook()
    operator(hook).execute(ctx())
    ended = mark(
        from_json(hook.files[LAYOUT.record_path]),
        TaoState.ERROR,
        now="2026-01-01T00:00:00Z",
        message="FAILED",
        source="sensor",
    )
    hook.files[LAYOUT.record_path] = to_json(ended)

    handle = operator(hook).execute(ctx(try_number=2))

    new_id = mint_job_id("dag", "submit", "run1", try_number=2)
    assert handle["job_id"] == new_id
    assert hook.submits[-1][1] == new_id
    assert from_json(hook.files[JobLayout("/lustre/u", new_id).record_path]).retry_of == JOB_ID


def test_retried_try_with_two_jobs_of_its_name_stops() -> None:
    hook = SubmitHook()
    operator(hook).execute(ctx())
    hook.found[JOB_ID] = ["701", "702"]

    with pytest.raises(AmbiguousSubmissionError, match="cancel the extra ones"):
        operator(hook).execute(ctx(try_number=2))

    assert len(hook.submits) == 1


# ---------------------------------------------------------------------- the task state store (issue 34, item 1)


def stored_ctx(store: FakeTaskStateStore, try_number: int = 1) -> dict[str, Any]:
    return {**ctx(try_number), "task_state_store": store}


def settled(hook: FakeSlurmHook, path: str) -> None:
    record = mark(from_json(hook.files[path]), TaoState.ERROR, now=NOW_TS, message="FAILED", source="sensor")
    hook.files[path] = to_json(record)


NOW_TS = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("native", "lookups_by_name"),
    [
        pytest.param("RUNNING", 0, id="running-reattached-through-the-store"),
        pytest.param("PENDING", 0, id="pending-reattached-through-the-store"),
        pytest.param("COMPLETED", 0, id="ended-unsettled-is-already-succeeded"),
        pytest.param("FAILED", 0, id="failed-unsettled-is-reattached-for-the-sensor-to-settle"),
        pytest.param(None, 1, id="unknown-to-slurm-falls-back-to-the-name"),
    ],
)
def test_a_retry_reattaches_to_the_job_its_earlier_try_stored(native: str | None, lookups_by_name: int) -> None:
    hook, store = SubmitHook(), FakeTaskStateStore()
    first = operator(hook).execute(stored_ctx(store))
    assert store.values["slurm_job"] == first
    if native is not None:
        hook.states[first["slurm_job_id"]] = state_from_native(first["slurm_job_id"], native, source="squeue")
    hook.found[JOB_ID] = [first["slurm_job_id"]]
    hook.lookups.clear()

    second = operator(hook).execute(stored_ctx(store, try_number=2))

    assert second == first
    assert len(hook.submits) == 1
    assert len(hook.lookups) == lookups_by_name
    assert hook.polls[-1] == [first["slurm_job_id"]]


def test_airflows_resumable_job_metrics_count_each_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decisions go through ResumableJobMixin, so Airflow's own ``resumable_job.*`` counters see them."""
    from airflow.sdk.bases import resumablejobmixin

    counted: list[str] = []
    monkeypatch.setattr(resumablejobmixin.stats, "incr", lambda name, *args, **kwargs: counted.append(name))
    hook, store = SubmitHook(), FakeTaskStateStore()
    first = operator(hook).execute(stored_ctx(store))
    hook.states[first["slurm_job_id"]] = state_from_native(first["slurm_job_id"], "RUNNING", source="squeue")

    operator(hook).execute(stored_ctx(store, try_number=2))

    assert counted == [
        "resumable_job.fresh_submit",
        "resumable_job.reconnect_attempt",
        "resumable_job.reconnect_success",
    ]


def test_a_retry_after_the_sensor_settled_the_stored_job_submits_a_fresh_one() -> None:
    hook, store = SubmitHook(), FakeTaskStateStore()
    first = operator(hook).execute(stored_ctx(store))
    settled(hook, LAYOUT.record_path)

    second = operator(hook).execute(stored_ctx(store, try_number=2))

    assert second["job_id"] == mint_job_id("dag", "submit", "run1", try_number=2)
    assert second["retry_of"] == first["job_id"]
    assert store.values["slurm_job"] == second
    assert len(hook.submits) == 2


def test_a_failed_status_query_of_the_stored_job_is_no_answer() -> None:
    hook, store = SubmitHook(), FakeTaskStateStore()
    first = operator(hook).execute(stored_ctx(store))
    hook.poll_error = StatusQueryError("squeue exited 1", {}, [first["slurm_job_id"]])

    with pytest.raises(StatusQueryError):
        operator(hook).execute(stored_ctx(store, try_number=2))

    assert len(hook.submits) == 1


def test_without_durable_nothing_is_stored_and_a_retry_adopts_by_name() -> None:
    hook, store = SubmitHook(), FakeTaskStateStore()
    first = operator(hook, durable=False).execute(stored_ctx(store))
    hook.found[JOB_ID] = [first["slurm_job_id"]]

    second = operator(hook, durable=False).execute(stored_ctx(store, try_number=2))

    assert store.values == {}
    assert second["slurm_job_id"] == first["slurm_job_id"]
    assert len(hook.submits) == 1


# ---------------------------------------------------------------------- TAO action or plain job (issue 32, item 5)

TAO_SQSH = "/lustre/containers/nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh"
PLAIN_SQSH = "/lustre/containers/docker.io+library+pytorch+2.3.sqsh"


@pytest.mark.parametrize(
    ("kwargs", "network_arch"),
    [
        pytest.param({"image": TAO_SQSH}, "tao", id="tao-image-cache-name"),
        pytest.param({"image": "/lustre/containers/tao.sqsh"}, "tao", id="tao-sqsh"),
        pytest.param(
            {"image": PLAIN_SQSH, "command": "classification_pyt train -e {config_path}"},
            "classification_pyt",
            id="tao-entry-point",
        ),
        pytest.param({"image": PLAIN_SQSH, "command": "tao model dino train -e {config_path}"}, "dino", id="launcher"),
        pytest.param({"image": PLAIN_SQSH}, "custom", id="plain-container-job"),
        pytest.param({"image": TAO_SQSH, "network_arch": "custom"}, "custom", id="plain-program-says-so"),
        pytest.param({"image": PLAIN_SQSH, "network_arch": "yolo_v4"}, "yolo_v4", id="explicit-network"),
    ],
)
def test_a_tao_job_is_recorded_as_a_tao_action_unless_it_says_custom(kwargs: dict[str, Any], network_arch: str) -> None:
    hook = SubmitHook()

    operator(hook, **kwargs).execute(ctx())

    assert from_json(hook.files[LAYOUT.record_path]).network_arch == network_arch


@pytest.mark.parametrize("network_arch", ["", "  ", 3])
def test_an_empty_network_arch_is_refused_before_any_ssh(no_ssh: SlurmHook, network_arch: Any) -> None:
    with pytest.raises(ValidationError, match=r"network_arch=.* must be a TAO network .* or 'custom'"):
        operator(no_ssh, network_arch=network_arch).execute(ctx())


# ---------------------------------------------------------------------- container mounts (issue 32, item 6)

RESULTS_DIR = LAYOUT.results_dir
JOB_DIR = LAYOUT.job_dir


@pytest.mark.parametrize(
    ("connection_mounts", "kwargs", "unseen", "fix"),
    [
        pytest.param(None, {}, [JOB_DIR, RESULTS_DIR], "'/lustre:/lustre'", id="no-mounts"),
        pytest.param(
            "/scratch:/scratch", {}, [JOB_DIR, RESULTS_DIR], "'/scratch:/scratch,/lustre:/lustre'", id="not-mounted"
        ),
        pytest.param(
            "/lustre:/mnt/lustre", {}, [JOB_DIR, RESULTS_DIR], "'/lustre:/mnt/lustre,/lustre:/lustre'", id="elsewhere"
        ),
        pytest.param(
            "/lustre:/lustre",
            {"container_mounts": "/lustre/u/jobs:/lustre/u/jobs"},
            [RESULTS_DIR, "(from the operator)"],
            "'/lustre/u/jobs:/lustre/u/jobs,/lustre:/lustre'",
            id="the-operators-mounts-win",
        ),
        pytest.param(
            "/lustre:/lustre",
            {"spec": {"dataset": {"train": "/datasets/coco/train", "val": "/lustre/data/val"}}},
            ["spec dataset.train /datasets/coco/train"],
            "'/lustre:/lustre,/datasets:/datasets'",
            id="dataset-outside-the-mounts",
        ),
    ],
)
def test_a_job_whose_container_cannot_see_its_files_is_refused_before_anything_is_staged(
    connection_mounts: str | None, kwargs: dict[str, Any], unseen: list[str], fix: str
) -> None:
    hook = SubmitHook()
    hook.settings = dataclasses.replace(SETTINGS, container_mounts=connection_mounts)

    with pytest.raises(ValidationError, match="the job's container cannot see") as refused:
        operator(hook, **kwargs).execute(ctx())

    message = str(refused.value)
    assert all(path in message for path in unseen), message
    assert "/lustre/data/val" not in message
    assert f"container_mounts={fix}" in message
    assert (hook.staged, hook.submits, hook.files) == ([], [], {})


def test_a_job_without_mounts_is_refused_after_the_partition_read_alone() -> None:
    """The site's own mounts come back with the partition table: the refusal costs no round trip of its own."""
    hook = SubmitHook()
    hook.settings = dataclasses.replace(SETTINGS, container_mounts="/scratch:/scratch")

    with pytest.raises(ValidationError, match=re.escape(f"- results directory {RESULTS_DIR}: no mount shows it")):
        operator(hook).execute(ctx())

    assert len(hook.path_checks) == 1
    assert (hook.staged, hook.submits, hook.files) == ([], [], {})


@pytest.mark.parametrize(
    ("connection_mounts", "kwargs"),
    [
        pytest.param("/lustre:/lustre", {"spec": {"dataset": {"train": "/lustre/data/train"}}}, id="same-path"),
        pytest.param(
            "/lustre/u:/lustre/u:ro,/lustre/datasets:/data",
            {"spec": {"dataset": ["/data/coco"], "train": {"model": "/opt/in/the/image.pth"}}},
            id="dataset-where-the-spec-reads-it",
        ),
        pytest.param("/lustre/u", {}, id="path-alone"),
        pytest.param(None, {"container_mounts": "/lustre:/lustre"}, id="operator-mounts"),
    ],
)
def test_mounts_that_show_the_jobs_files_are_accepted(connection_mounts: str | None, kwargs: dict[str, Any]) -> None:
    hook = SubmitHook()
    hook.settings = dataclasses.replace(SETTINGS, container_mounts=connection_mounts)

    handle = operator(hook, **kwargs).execute(ctx())

    assert hook.submits == [(LAYOUT.script_path, JOB_ID, LAYOUT.log_dir, ())]
    assert handle["results_dir"] == RESULTS_DIR


# ---------------------------------------------------------------------- the spec's datasets exist (issue 42, item 11)

DATASETS = {"train": "/lustre/data/train", "val": ["/lustre/data/val", "/lustre/data/val2"], "out": "{results_dir}/tf"}


def test_a_spec_naming_a_missing_dataset_path_is_refused_before_anything_is_staged() -> None:
    hook = SubmitHook()
    hook.absent = {"/lustre/data/val", "/lustre/data/train"}

    with pytest.raises(MissingPathsError) as refused:
        operator(hook, spec={"dataset": DATASETS}).execute(ctx())

    message = str(refused.value)
    assert refused.value.missing == ["/lustre/data/train", "/lustre/data/val"]
    assert "2 dataset path(s) do not exist on cluster 'mini'" in message
    assert "so nothing was staged or submitted" in message
    assert "- spec dataset.train = /lustre/data/train\n- spec dataset.val[0] = /lustre/data/val\n" in message
    assert "Copy the data to shared storage (Lustre) first, or correct them in the spec's dataset section" in message
    assert "val2" not in message
    assert (hook.staged, hook.submits, hook.files) == ([], [], {})
    # one round trip, the partition table's; the job's own results directory is created by staging, not checked
    assert hook.path_checks == [["/lustre/data/train", "/lustre/data/val", "/lustre/data/val2"]]


def test_a_spec_whose_datasets_exist_is_submitted_after_the_same_one_check() -> None:
    hook = SubmitHook()

    operator(hook, spec={"dataset": DATASETS}).execute(ctx())

    assert hook.path_checks == [["/lustre/data/train", "/lustre/data/val", "/lustre/data/val2"]]
    assert hook.submits == [(LAYOUT.script_path, JOB_ID, LAYOUT.log_dir, ())]


def test_a_dataset_the_container_reads_elsewhere_than_the_host_is_left_to_the_job() -> None:
    hook = SubmitHook()
    hook.settings = dataclasses.replace(SETTINGS, container_mounts="/lustre:/lustre,/lustre/datasets:/data")
    hook.absent = {"/data/coco"}

    operator(hook, spec={"dataset": {"train": "/data/coco", "val": "/lustre/v"}}).execute(ctx())

    assert hook.path_checks == [["/lustre/v"]]
    assert len(hook.submits) == 1


def test_a_retry_adopting_its_earlier_tries_job_does_not_check_the_data_again() -> None:
    hook = SubmitHook()
    first = operator(hook, spec={"dataset": DATASETS}).execute(ctx())
    hook.found[JOB_ID] = [first["slurm_job_id"]]
    hook.absent = {"/lustre/data/train"}  # gone since: the adopted job is the job's business now
    hook.path_checks.clear()

    second = operator(hook, spec={"dataset": DATASETS}).execute(ctx(try_number=2))

    assert second["slurm_job_id"] == first["slurm_job_id"]
    assert hook.path_checks == [[]]
    assert len(hook.submits) == 1


# ---------------------------------------------------------------------- trainings over several slices (issue 33)


def test_a_training_with_continuations_runs_as_a_slice_and_its_handle_carries_the_chain() -> None:
    hook = SubmitHook()
    handle = operator(hook, max_continuations=3, checkpoint_glob="*.pth", time_hours=0.5, timeout_hours=0.45).execute(
        ctx()
    )
    script = staged_text(hook, LAYOUT.script_path)
    assert "#SBATCH --signal=B:USR1@180\n" in script
    assert f"{LAYOUT.slices_dir}" in script
    assert (handle["max_continuations"], handle["slice_number"], handle["checkpoint_globs"]) == (3, 1, ["*.pth"])
    assert (handle["time_hours"], handle["slices"]) == (0.5, [])


def test_without_continuations_the_script_is_the_seeds() -> None:
    hook = SubmitHook()
    handle = operator(hook).execute(ctx())
    assert "--signal" not in staged_text(hook, LAYOUT.script_path)
    assert (handle["max_continuations"], handle["checkpoint_globs"]) == (0, [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_continuations": -1}, "max_continuations=-1 must be a whole number"),
        ({"max_continuations": 2, "checkpoint_glob": "ckpt/*.pth"}, "checkpoint_glob='ckpt/*.pth' must be"),
        ({"max_continuations": 2, "checkpoint_signal": "KILL"}, "checkpoint_signal='KILL' must be one of"),
        ({"max_continuations": 2, "signal_grace_seconds": 99999}, "signal_grace_seconds=99999 must be"),
    ],
)
def test_bad_continuation_parameters_are_refused_before_any_ssh(
    no_ssh: SlurmHook, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        operator(no_ssh, **kwargs).execute(ctx())
