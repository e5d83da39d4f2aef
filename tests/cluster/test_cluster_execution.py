"""Issue 11 on the real cluster: the execution block's order, exit codes, leader scope, supporting files."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from deferral import context, run_deferrable

from airflow_provider_tao_slurm.core.records import from_json, mint_job_id
from airflow_provider_tao_slurm.core.shell import join
from airflow_provider_tao_slurm.exceptions import JobFailedError, SubmissionError, ValidationError
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

TOKEN = uuid.uuid4().hex[:6]
SMALL = {"gpus_per_node": 1, "cpus_per_task": 1, "time_hours": 0.25, "timeout_hours": 0.2}


@pytest.fixture(scope="module")
def image(cluster: ClusterEnv, ssh_run: SshRun) -> str:
    path = f"{cluster.containers_dir}/execution-{TOKEN}.sqsh"
    rc, _, err = ssh_run(join(["enroot", "import", "-o", path, "docker://nvcr.io#nvidia/exec-test:1"]), timeout=120)
    assert rc == 0, err
    yield path
    ssh_run(join(["rm", "-f", path]))


def submit_and_wait(ctx: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], Any]:
    handle = SbatchSubmitOperator(task_id="submit", **SMALL, **kwargs).execute(ctx)
    sensor = SlurmJobSensor(task_id="wait", job=handle, poke_interval=1)
    try:
        return handle, run_deferrable(sensor, ctx)
    except JobFailedError as exc:
        return handle, exc


def record(handle: dict[str, Any]) -> Any:
    text = SlurmHook().read_file(handle["record_path"])
    assert text is not None
    return from_json(text)


def test_order_and_success(slurm_connection_env: str, image: str, cluster: ClusterEnv, ssh_run: SshRun) -> None:
    ctx = context(f"exec_order_{TOKEN}", "submit", f"run-{uuid.uuid4().hex[:6]}")
    out = "{results_dir}/order.txt"
    handle, result = submit_and_wait(
        ctx,
        image=image,
        command=f'echo primary >> {out}; echo \'{{"a": {{"b": 1}}}}\' ${{HOME:+home}} {{job_id}} > {{results_dir}}/b',
        execution={
            "pre_commands": [f"mkdir -p {{results_dir}} && echo pre >> {out}"],
            "post_commands": [f"echo post >> {out}", {"command": f"echo leader >> {out}", "scope": "leader"}],
        },
    )
    assert isinstance(result, dict), result
    _, order, _ = ssh_run(join(["cat", f"{handle['results_dir']}/order.txt"]))
    assert order.split() == ["pre", "primary", "post", "leader"]
    _, braces, _ = ssh_run(join(["cat", f"{handle['results_dir']}/b"]))
    assert braces.strip() == f'{{"a": {{"b": 1}}}} home {handle["job_id"]}'
    rec = record(handle)
    assert rec.terminal_state == "COMPLETE"
    assert rec.exit_codes["children"] == {"task 0": {"pre_0": 0, "primary": 0, "post_0": 0, "post_1": 0}}
    assert len(rec.bundle_sha256 or "") == 64


def test_failed_primary_skips_post_and_keeps_its_exit_code(
    slurm_connection_env: str, image: str, ssh_run: SshRun
) -> None:
    ctx = context(f"exec_fail_{TOKEN}", "submit", f"run-{uuid.uuid4().hex[:6]}")
    out = "{results_dir}/order.txt"
    handle, result = submit_and_wait(
        ctx,
        image=image,
        command=f"echo primary >> {out}; exit 3",
        execution={
            "pre_commands": [f"mkdir -p {{results_dir}} && echo pre >> {out}"],
            "post_commands": [f"echo post >> {out}"],
        },
    )
    assert isinstance(result, JobFailedError)
    assert result.err_class == "ERR_PROGRAM"
    _, order, _ = ssh_run(join(["cat", f"{handle['results_dir']}/order.txt"]))
    assert order.split() == ["pre", "primary"]
    rec = record(handle)
    assert rec.terminal_state == "ERROR"
    assert rec.exit_codes["job"] == 3
    assert rec.exit_codes["children"]["task 0"] == {"pre_0": 0, "primary": 3}


def test_leader_post_command_runs_once_in_a_two_node_job(
    slurm_connection_env: str, image: str, ssh_run: SshRun
) -> None:
    ctx = context(f"exec_leader_{TOKEN}", "submit", f"run-{uuid.uuid4().hex[:6]}")
    out = "{results_dir}/leader.txt"
    handle, result = submit_and_wait(
        ctx,
        image=image,
        num_nodes=2,
        nccl_env={},
        command="mkdir -p {results_dir}",
        execution={"post_commands": [{"command": f'echo "leader $(hostname)" >> {out}', "scope": "leader"}]},
    )
    assert isinstance(result, dict), result
    _, text, _ = ssh_run(join(["cat", f"{handle['results_dir']}/leader.txt"]))
    assert len(text.splitlines()) == 1
    assert sorted(record(handle).exit_codes["children"]) == ["task 0", "task 1"]


def _bundle(tmp_path: Path, content: bytes) -> dict[str, Any]:
    (tmp_path / "helpers").mkdir(exist_ok=True)
    (tmp_path / "helpers" / "prep.py").write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    return {"supporting_files": [{"source": "helpers/prep.py", "destination": "prep.py", "sha256": digest}]}


class CountingHook(SlurmHook):
    """A real hook that counts the remote commands it sends."""

    commands: list[str] = []

    def run(self, command: str, **kwargs: Any) -> Any:
        type(self).commands.append(command)
        return super().run(command, **kwargs)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([{"source": "helpers/prep.py", "sha256": "0" * 64}], "stale or tampered"),
        ([{"source": "/etc/passwd", "sha256": "0" * 64}], "is absolute"),
        ([{"source": "../outside.py", "sha256": "0" * 64}], "'..'"),
    ],
    ids=["checksum-mismatch", "absolute", "dotdot"],
)
def test_bad_supporting_files_are_refused_before_anything_is_staged(
    slurm_connection_env: str, image: str, tmp_path: Path, files: list[dict[str, str]], message: str
) -> None:
    _bundle(tmp_path, b"print('prep')\n")
    op = SbatchSubmitOperator(
        task_id="submit", image=image, command="true", execution={"supporting_files": files},
        bundle_root=str(tmp_path), **SMALL,
    )  # fmt: skip
    op.hook = CountingHook()  # type: ignore[misc]
    CountingHook.commands = []
    with pytest.raises(ValidationError, match=message):
        op.execute(context(f"exec_bad_{TOKEN}", "submit", f"run-{uuid.uuid4().hex[:6]}"))
    assert CountingHook.commands == []


def test_supporting_files_manifest_reused_and_never_overwritten(
    slurm_connection_env: str, image: str, tmp_path: Path, cluster: ClusterEnv, ssh_run: SshRun
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:6]}"
    dag = f"exec_bundle_{TOKEN}"

    def submit(bundle: dict[str, Any], try_number: int, **extra: Any) -> dict[str, Any]:
        op = SbatchSubmitOperator(
            task_id="submit", image=image, command="python3 inputs/action-helpers/prep.py", execution=bundle,
            bundle_root=str(tmp_path), **{**SMALL, **extra},
        )  # fmt: skip
        return op.execute(context(dag, "submit", run_id, try_number=try_number))

    bundle = _bundle(tmp_path, b"print('prep v1')\n")
    # Try 1 stages everything, then sbatch refuses it (bad account): no job exists.
    with pytest.raises(SubmissionError):
        submit(bundle, 1, account="nosuchacct")
    helpers = f"{cluster.results_dir}/jobs/{mint_job_id(dag, 'submit', run_id)}/inputs/action-helpers"
    _, stamp, _ = ssh_run(join(["stat", "-c", "%Y", f"{helpers}/prep.py"]))
    # Try 2 brings a different bundle for the same job dir: refused, the staged files stay as they were.
    with pytest.raises(ValidationError, match="different bundle"):
        submit(_bundle(tmp_path, b"print('prep v2')\n"), 2)
    _, content, _ = ssh_run(join(["cat", f"{helpers}/prep.py"]))
    assert content == "print('prep v1')\n"
    # Try 3 brings the first bundle again: its identical manifest is reused (files not rewritten).
    time.sleep(1.1)
    handle = submit(_bundle(tmp_path, b"print('prep v1')\n"), 3)
    assert f"{handle['job_dir']}/inputs/action-helpers" == helpers
    _, again, _ = ssh_run(join(["stat", "-c", "%Y", f"{helpers}/prep.py"]))
    assert again == stamp
    _, text, _ = ssh_run(join(["cat", f"{helpers}/manifest.json"]))
    entries = json.loads(text)["files"]
    assert [(e["source"], e["destination"], e["size"]) for e in entries] == [
        ("helpers/prep.py", "inputs/action-helpers/prep.py", 17)
    ]
    ssh_run(join(["scancel", handle["slurm_job_id"]]))
