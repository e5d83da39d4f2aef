"""The execution block: order, exit codes, leader scope, supporting files — run for real with bash."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from airflow_provider_tao_slurm.core.execution import (
    HELPERS_DIR,
    SupportingFile,
    build_step_command,
    canonical_sha256,
    manifest,
    parse_child_exit_codes,
    parse_execution,
    primary_command,
    relative_path,
)
from airflow_provider_tao_slurm.exceptions import ValidationError


def run_step(tmp_path: Path, block: dict, command: str, task: int = 0) -> tuple[int, list[str], dict]:
    out = tmp_path / "order.txt"
    codes = tmp_path / "codes.jsonl"
    script = build_step_command(parse_execution(block), command.replace("OUT", str(out)), str(codes))
    script = script.replace("OUT", str(out))
    result = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": "/usr/bin:/bin", "SLURM_PROCID": str(task)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    order = out.read_text().split() if out.exists() else []
    return result.returncode, order, parse_child_exit_codes(codes.read_text() if codes.exists() else "")


BLOCK = {
    "pre_commands": ["echo pre >> OUT"],
    "post_commands": ["echo post >> OUT", {"command": "echo leader >> OUT", "scope": "leader"}],
}


def test_order_pre_primary_post(tmp_path: Path) -> None:
    rc, order, codes = run_step(tmp_path, BLOCK, "echo primary >> OUT")
    assert rc == 0
    assert order == ["pre", "primary", "post", "leader"]
    assert codes == {"task 0": {"pre_0": 0, "primary": 0, "post_0": 0, "post_1": 0}}


def test_failed_primary_skips_post_and_keeps_its_exit_code(tmp_path: Path) -> None:
    rc, order, codes = run_step(tmp_path, BLOCK, "echo primary >> OUT; exit 3")
    assert rc == 3
    assert order == ["pre", "primary"]
    assert codes["task 0"] == {"pre_0": 0, "primary": 3}


def test_failed_pre_command_stops_before_primary(tmp_path: Path) -> None:
    block = {"pre_commands": ["exit 7"], "post_commands": ["echo post >> OUT"]}
    rc, order, codes = run_step(tmp_path, block, "echo primary >> OUT")
    assert (rc, order, codes["task 0"]) == (7, [], {"pre_0": 7})


def test_leader_scoped_post_runs_only_on_task_zero(tmp_path: Path) -> None:
    rc, order, _ = run_step(tmp_path, BLOCK, "echo primary >> OUT", task=1)
    assert rc == 0
    assert order == ["pre", "primary", "post"]


def test_hostile_commands_stay_data(tmp_path: Path) -> None:
    block = {"pre_commands": ["echo '$(touch CANARY)' `echo x` >> OUT"]}
    rc, order, _ = run_step(tmp_path, block, "echo ok >> OUT")
    assert rc == 0
    assert not (tmp_path / "CANARY").exists()
    assert order[0] == "$(touch"


def test_torchrun_launcher_maps_processes_per_node() -> None:
    ex = parse_execution({"distributed": {"launcher": "torchrun", "processes_per_node": 4}}, gpus_per_node=4)
    text = primary_command(ex, "train.py --spec /x")
    assert text.startswith("torchrun ")
    assert "--nproc-per-node=4" in text
    assert '--node-rank="${TAO_NODE_RANK:-${SLURM_NODEID:-0}}"' in text
    assert text.endswith(" train.py --spec /x")
    assert primary_command(parse_execution(None), "train.py") == "train.py"


FAKE_TORCHRUN = '#!/bin/bash\nprintf "%s\\n" "$@" > "$ARGS"\n'


def run_torchrun(
    tmp_path: Path, block: dict, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the step of ``block`` with bash, a stand-in ``torchrun`` on PATH recording its arguments."""
    (tmp_path / "torchrun").write_text(FAKE_TORCHRUN)
    (tmp_path / "torchrun").chmod(0o755)
    args = tmp_path / "args"
    script = build_step_command(parse_execution(block), "train.py", str(tmp_path / "codes"))
    result = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "ARGS": str(args), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result, args.read_text().splitlines() if args.exists() else []


RENDEZVOUS = {"MASTER_ADDR": "n1", "MASTER_PORT": "41234", "TAO_NODE_COUNT": "2", "TAO_NODE_RANK": "1"}


@pytest.mark.parametrize(("gpus", "nproc"), [("8", "8"), ("1", "1")])
def test_processes_per_node_left_out_is_one_per_gpu_of_the_node(tmp_path: Path, gpus: str, nproc: str) -> None:
    result, args = run_torchrun(
        tmp_path, {"distributed": {"launcher": "torchrun"}}, {**RENDEZVOUS, "TAO_GPUS_PER_NODE": gpus}
    )
    assert result.returncode == 0, result.stderr
    assert args == [
        "--nnodes=2",
        f"--nproc-per-node={nproc}",
        "--node-rank=1",
        "--master-addr=n1",
        "--master-port=41234",
        "train.py",
    ]
    assert parse_execution({"distributed": {"launcher": "torchrun"}}, gpus_per_node=8).processes_per_node is None


@pytest.mark.parametrize(("ppn", "gpus"), [(4, 2), (1, 4), (8, 1)])
def test_processes_per_node_that_disagrees_with_gpus_per_node_is_refused(ppn: int, gpus: int) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_execution({"distributed": {"launcher": "torchrun", "processes_per_node": ppn}}, gpus_per_node=gpus)
    message = str(refused.value)
    assert f"processes_per_node is {ppn}" in message
    assert f"gpus_per_node={gpus}" in message
    assert f"Set processes_per_node to {gpus}, or leave it out" in message


@pytest.mark.parametrize("unset", ["MASTER_ADDR", "MASTER_PORT"])
def test_torchrun_never_falls_back_to_a_fixed_rendezvous(tmp_path: Path, unset: str) -> None:
    """No 127.0.0.1:29500 default: the sbatch script chose a free port; without it the step fails, naming it."""
    text = primary_command(parse_execution({"distributed": {"launcher": "torchrun"}}), "train.py")
    assert "29500" not in text
    env = {key: value for key, value in RENDEZVOUS.items() if key != unset}
    result, args = run_torchrun(tmp_path, {"distributed": {"launcher": "torchrun"}}, env)
    assert result.returncode != 0
    assert args == []
    assert f"{unset}: unset: the sbatch script exports it" in result.stderr


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("x", "must be a mapping"),
        ({"nope": 1}, "unknown keys"),
        ({"pre_commands": "echo"}, "must be a list"),
        ({"post_commands": [{"command": "x", "scope": "rank1"}]}, "scope"),
        ({"post_commands": [""]}, "is empty"),
        ({"distributed": {"launcher": "mpirun"}}, "launcher"),
        ({"distributed": {"launcher": "torchrun", "processes_per_node": 0}}, "processes_per_node"),
        ({"environment": {"1BAD": "x"}}, "environment"),
        ({"supporting_files": [{"source": "/etc/passwd", "sha256": "0" * 64}]}, "is absolute"),
        ({"supporting_files": [{"source": "a/../../b", "sha256": "0" * 64}]}, "'..'"),
        ({"supporting_files": [{"source": "a b", "sha256": "0" * 64}]}, "may only use"),
        ({"supporting_files": [{"source": "a.py", "sha256": "xyz"}]}, "64-hex"),
        (
            {"supporting_files": [{"source": "a.py", "sha256": "0" * 64}, {"source": "a.py", "sha256": "1" * 64}]},
            "same destination",
        ),
        ({"completion": {"child_exit_code_path": "../x"}}, "'..'"),
    ],
)
def test_parse_execution_rejects(block: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_execution(block)  # type: ignore[arg-type]


def test_relative_path_normalises() -> None:
    assert relative_path("./a//b/./c.py", "x") == "a/b/c.py"


def test_manifest_verifies_hashes() -> None:
    content = b"print('hi')\n"
    good = SupportingFile("helpers/a.py", "a.py", hashlib.sha256(content).hexdigest())
    data = json.loads(manifest([(good, content)]))
    assert data == {
        "files": [{"source": "helpers/a.py", "destination": f"{HELPERS_DIR}/a.py", "sha256": good.sha256, "size": 12}]
    }
    bad = SupportingFile("helpers/a.py", "a.py", "0" * 64)
    with pytest.raises(ValidationError, match="stale or tampered"):
        manifest([(bad, content)])


def test_canonical_sha256_ignores_key_order() -> None:
    assert canonical_sha256({"a": 1, "b": [1, 2]}) == canonical_sha256({"b": [1, 2], "a": 1})
    assert canonical_sha256({"a": 1}) != canonical_sha256({"a": 2})
