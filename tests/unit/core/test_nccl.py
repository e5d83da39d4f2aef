"""NCCL probe: the probe program's rendezvous math and dry run, candidates, command, verdict, cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.nccl import (
    DEFAULT_CANDIDATE_ENVS,
    Verdict,
    cache_path,
    cache_text,
    candidate_envs,
    judge_probe,
    parse_cache,
    probe_command,
    probe_scope,
)
from airflow_provider_tao_slurm.exceptions import StoragePathError, ValidationError
from airflow_provider_tao_slurm.probes import nccl_probe
from airflow_provider_tao_slurm.probes.nccl_probe import Rendezvous, expected_sum, rendezvous

PROBE = Path(str(resources.files("airflow_provider_tao_slurm.probes").joinpath("nccl_probe.py")))
TORCHRUN = {"TORCHELASTIC_RUN_ID": "none"}

# ---------------------------------------------------------------------------------------------- rendezvous math


def shape(nodes: int, gpus: int, node_rank: int, local_rank: int, launcher: str, addr: str = "n1") -> Rendezvous:
    return Rendezvous(
        nodes=nodes,
        gpus_per_node=gpus,
        node_rank=node_rank,
        local_rank=local_rank,
        world_size=nodes * gpus,
        rank=node_rank * gpus + local_rank,
        master_addr=addr,
        master_port=29500,
        launcher=launcher,
    )


def torchrun_env(nodes: int, gpus: int, node_rank: int, local_rank: int) -> dict[str, str]:
    """What a worker sees under torchrun started by the multi-node template."""
    return {
        **TORCHRUN,
        "TAO_NODE_COUNT": str(nodes),
        "TAO_GPUS_PER_NODE": str(gpus),
        "TAO_NODE_RANK": str(node_rank),
        "NUM_GPU_PER_NODE": str(gpus),
        "NODE_RANK": str(node_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(nodes * gpus),
        "RANK": str(node_rank * gpus + local_rank),
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
    }


RENDEZVOUS_CASES = [
    pytest.param(torchrun_env(2, 1, 0, 0), shape(2, 1, 0, 0, "torchrun"), id="2x1-node0"),
    pytest.param(torchrun_env(2, 1, 1, 0), shape(2, 1, 1, 0, "torchrun"), id="2x1-node1"),
    pytest.param(torchrun_env(2, 4, 1, 3), shape(2, 4, 1, 3, "torchrun"), id="2x4-node1-local3-rank7"),
    pytest.param(torchrun_env(1, 8, 0, 5), shape(1, 8, 0, 5, "torchrun"), id="1x8-local5"),
    pytest.param(torchrun_env(4, 8, 2, 6), shape(4, 8, 2, 6, "torchrun"), id="4x8-node2-local6-rank22"),
    pytest.param(
        {"WORLD_SIZE": "2", "NUM_GPU_PER_NODE": "1", "NODE_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"},
        shape(2, 1, 1, 0, "direct"),
        id="tao-direct-world-size-is-node-count",
    ),
    pytest.param(
        {"TAO_NODE_COUNT": "3", "WORLD_SIZE": "24", "TAO_GPUS_PER_NODE": "8", "SLURM_NODEID": "2", "MASTER_ADDR": "n1"},
        shape(3, 8, 2, 0, "direct"),
        id="tao-node-count-wins-slurm-nodeid-fallback",
    ),
    pytest.param(
        {
            **TORCHRUN,
            "GROUP_WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "2",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "6",
            "RANK": "5",
            "MASTER_ADDR": "n1",
        },
        shape(3, 2, 2, 1, "torchrun"),
        id="torchrun-only-uses-group-variables",
    ),
    pytest.param({}, shape(1, 1, 0, 0, "direct", addr="127.0.0.1"), id="nothing-set-one-process"),
]


@pytest.mark.parametrize(("env", "expected"), RENDEZVOUS_CASES)
def test_rendezvous_math(env: dict[str, str], expected: Rendezvous) -> None:
    assert rendezvous(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"TAO_NODE_COUNT": "2", "TAO_NODE_RANK": "2"}, "TAO_NODE_RANK=2 but the job has 2 node(s)", id="node-rank"
        ),
        pytest.param({"TAO_GPUS_PER_NODE": "2", "LOCAL_RANK": "2"}, "LOCAL_RANK=2 but a node runs 2", id="local-rank"),
        pytest.param({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number", id="not-a-number"),
        pytest.param({"TAO_NODE_COUNT": "0"}, "TAO_NODE_COUNT='0' is not a whole number of at least 1", id="zero"),
        pytest.param({"MASTER_PORT": "-1"}, "MASTER_PORT='-1'", id="bad-port"),
        pytest.param(
            {**torchrun_env(2, 1, 1, 0), "WORLD_SIZE": "4"},
            "torchrun set WORLD_SIZE=4 but TAO_NODE_COUNT x TAO_GPUS_PER_NODE gives 2",
            id="torchrun-world-mismatch",
        ),
        pytest.param(
            {**torchrun_env(2, 2, 1, 1), "RANK": "1"},
            "torchrun set RANK=1 but TAO_NODE_COUNT x TAO_GPUS_PER_NODE gives 3",
            id="torchrun-rank-mismatch",
        ),
    ],
)
def test_rendezvous_refuses(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rendezvous(env)


@pytest.mark.parametrize(("world", "total"), [(1, 1), (2, 3), (8, 36), (32, 528)], ids=["1", "2", "8", "32"])
def test_expected_sum(world: int, total: int) -> None:
    assert expected_sum(world) == total


def test_the_shipped_probe_has_no_test_switch() -> None:
    """The probe behaves the same on every cluster: no variable, word or branch for tests (the test cluster
    injects its NCCL hang from its own side, see ``tests/cluster/torch_faults.py``)."""
    source = resources.files("airflow_provider_tao_slurm.probes").joinpath("nccl_probe.py").read_text()
    for word in ("TEST_FAULT", "SLURMTEST", "hang_unless", "test fault", "time.sleep"):
        assert word.lower() not in source.lower(), word


# ---------------------------------------------------------------------------------------------- the dry run


@pytest.fixture
def poisoned_torch(tmp_path: Path) -> Path:
    """A ``torch`` package that fails on import: the dry run must never import torch."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('the dry run imported torch')\n")
    return tmp_path


def run_probe_file(args: list[str], env: dict[str, str], pythonpath: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "HOME")}
    return subprocess.run(
        [sys.executable, str(PROBE), *args],
        env={**clean, **env, "PYTHONPATH": str(pythonpath)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(torchrun_env(2, 1, 1, 0), {"world_size": 2, "rank": 1, "nodes": 2}, id="2x1"),
        pytest.param(torchrun_env(2, 4, 1, 2), {"world_size": 8, "rank": 6, "gpus_per_node": 4}, id="2x4"),
        pytest.param(torchrun_env(1, 8, 0, 7), {"world_size": 8, "rank": 7, "node_rank": 0}, id="1x8"),
        pytest.param(torchrun_env(4, 8, 3, 7), {"world_size": 32, "rank": 31, "node_rank": 3}, id="4x8-last"),
    ],
)
def test_dry_run_prints_the_configuration_without_torch(
    env: dict[str, str], expected: dict[str, int], poisoned_torch: Path
) -> None:
    settings = {"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo", "DEMO_API_TOKEN": "hidden-value"}
    proc = run_probe_file(["--dry-run"], {**env, **settings}, poisoned_torch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = json.loads(proc.stdout)
    assert {key: printed[key] for key in expected} == expected
    assert printed["launcher"] == "torchrun"
    assert printed["master_addr"] == "n1"
    assert printed["settings"] == {"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo"}
    assert "hidden-value" not in proc.stdout


@pytest.mark.parametrize(
    ("args", "env", "rc", "marker"),
    [
        pytest.param(
            ["--dry-run"], {"TAO_NODE_COUNT": "1", "TAO_NODE_RANK": "3"}, 2, "TAO_NCCL_PROBE_SETUP_ERROR", id="bad-env"
        ),
        pytest.param([], torchrun_env(2, 1, 0, 0), 2, "TAO_NCCL_PROBE_SETUP_ERROR: cannot import torch", id="no-torch"),
    ],
)
def test_probe_setup_errors(args: list[str], env: dict[str, str], rc: int, marker: str, poisoned_torch: Path) -> None:
    proc = run_probe_file(args, env, poisoned_torch)
    assert proc.returncode == rc
    assert marker in proc.stdout


def test_probe_main_reads_a_given_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert nccl_probe.main(["--dry-run"], torchrun_env(2, 2, 1, 0)) == 0
    assert json.loads(capsys.readouterr().out)["rank"] == 2


# ---------------------------------------------------------------------------------------------- candidates


def test_default_candidates_are_copies() -> None:
    envs = candidate_envs(None)
    assert envs == [
        {},
        {"NCCL_P2P_DISABLE": "1"},
        {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo,docker"},
    ]
    envs[1]["NCCL_P2P_DISABLE"] = "0"
    assert DEFAULT_CANDIDATE_ENVS[1] == {"NCCL_P2P_DISABLE": "1"}


def test_given_candidates_kept_in_order() -> None:
    given = [{"NCCL_SOCKET_IFNAME": "ib0"}, {}]
    assert candidate_envs(given) == given


@pytest.mark.parametrize(
    ("given", "message"),
    [
        pytest.param([], "must be a non-empty list of dicts", id="empty"),
        pytest.param({"NCCL_P2P_DISABLE": "1"}, "must be a non-empty list of dicts", id="a-dict"),
        pytest.param("NCCL_P2P_DISABLE=1", "must be a non-empty list of dicts", id="a-string"),
        pytest.param([{}, "NCCL_P2P_DISABLE=1"], r"candidate_envs\[1\] is a str", id="string-entry"),
        pytest.param([{"NCCL-P2P": "1"}], "is not an environment variable name", id="bad-name"),
        pytest.param([{"NCCL_P2P_DISABLE": 1}], r"candidate_envs\[0\]\['NCCL_P2P_DISABLE'\] is a int", id="int-value"),
    ],
)
def test_bad_candidates_refused(given: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        candidate_envs(given)


# ---------------------------------------------------------------------------------------------- command


def test_multi_node_command() -> None:
    command = probe_command("/lustre/r/jobs/j/inputs/nccl_probe.py", nodes=2, gpus_per_node=4, python="python3")
    assert command == (
        'exec python3 -m torch.distributed.run --nnodes="$TAO_NODE_COUNT" --nproc-per-node="$TAO_GPUS_PER_NODE" '
        '--node-rank="$TAO_NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" '
        "/lustre/r/jobs/j/inputs/nccl_probe.py"
    )


def test_single_node_command() -> None:
    command = probe_command("/r/p.py", nodes=1, gpus_per_node=8, python="/opt/venv/bin/python")
    assert command == (
        "export TAO_NODE_COUNT=1 TAO_GPUS_PER_NODE=8 TAO_NODE_RANK=0; "
        "exec /opt/venv/bin/python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=8 /r/p.py"
    )


@pytest.mark.parametrize(
    ("nodes", "env", "argv"),
    [
        pytest.param(
            2,
            {
                "TAO_NODE_COUNT": "2",
                "TAO_GPUS_PER_NODE": "1",
                "TAO_NODE_RANK": "1",
                "MASTER_ADDR": "n1",
                "MASTER_PORT": "29500",
            },
            "-m torch.distributed.run --nnodes=2 --nproc-per-node=1 --node-rank=1 --master-addr=n1 "
            "--master-port=29500 /tmp/it's here/p.py",
            id="multi-node-from-template-env",
        ),
        pytest.param(
            1,
            {},
            "-m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 /tmp/it's here/p.py TAO=1/2/0",
            id="single-node-exports-tao-values",
        ),
    ],
)
def test_command_runs_in_bash(tmp_path: Path, nodes: int, env: dict[str, str], argv: str) -> None:
    fake_python = tmp_path / "py thon"
    fake_python.write_text(
        '#!/bin/sh\necho "$*${TAO_NODE_COUNT:+ TAO=$TAO_NODE_COUNT/$TAO_GPUS_PER_NODE/$TAO_NODE_RANK}"\n'
    )
    fake_python.chmod(0o755)
    command = probe_command("/tmp/it's here/p.py", nodes=nodes, gpus_per_node=2, python=str(fake_python))
    proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30, check=True)
    expected = argv if nodes == 1 else f"{argv} TAO=2/1/1"
    assert proc.stdout.strip() == expected


@pytest.mark.parametrize(
    ("path", "python", "message"),
    [("p.py", "python3", "must be absolute"), ("/p.py", " ", "python is empty")],
    ids=["relative", "blank-python"],
)
def test_command_refuses(path: str, python: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        probe_command(path, nodes=2, gpus_per_node=1, python=python)


# ---------------------------------------------------------------------------------------------- verdict

OK_LOG = "TAO_NCCL_PROBE: rank 0/2 ...\nTAO_NCCL_PROBE_OK world=2 nodes=2 gpus_per_node=1 backend=gloo sum=3\n"


@pytest.mark.parametrize(
    ("native", "exit_code", "log", "verdict", "detail"),
    [
        pytest.param("COMPLETED", 0, OK_LOG, Verdict.OK, "TAO_NCCL_PROBE_OK world=2 nodes=2", id="ok"),
        pytest.param(
            "COMPLETED",
            0,
            OK_LOG.replace("world=2", "world=20"),
            Verdict.FAILED,
            "(it has: TAO_NCCL_PROBE_OK world=20",
            id="other-world",
        ),
        pytest.param(
            "COMPLETED", 0, "hello\n", Verdict.FAILED, "has no 'TAO_NCCL_PROBE_OK world=2' line", id="no-marker"
        ),
        pytest.param(
            "FAILED",
            124,
            "TAO_SLURM: program stopped by timeout",
            Verdict.TIMEOUT,
            "did not finish before the timeout",
            id="timeout-124",
        ),
        pytest.param("TIMEOUT", 0, "", Verdict.TIMEOUT, "wall limit", id="wall-limit"),
        pytest.param(
            "FAILED",
            1,
            "TAO_NCCL_PROBE_SETUP_ERROR: cannot import torch (No module named 'torch')\n",
            Verdict.SETUP_ERROR,
            "cannot import torch",
            id="no-torch",
        ),
        pytest.param(
            "FAILED",
            1,
            "TAO_NCCL_PROBE_FAILED: rank 1: DistBackendError: NCCL error\n",
            Verdict.FAILED,
            "rank 1: DistBackendError: NCCL error",
            id="collective-error",
        ),
        pytest.param("OUT_OF_MEMORY", 0, "", Verdict.FAILED, "ended OUT_OF_MEMORY", id="oom"),
        pytest.param("CANCELLED", 0, "", Verdict.ABORTED, "ended CANCELLED", id="cancelled"),
        pytest.param("NODE_FAIL", 0, "", Verdict.ABORTED, "ended NODE_FAIL", id="node-fail"),
        pytest.param("NOT_FOUND", None, "", Verdict.ABORTED, "ended NOT_FOUND (exit code None)", id="vanished"),
    ],
)
def test_judge_probe(native: str, exit_code: int | None, log: str, verdict: Verdict, detail: str) -> None:
    outcome = judge_probe(native_state=native, exit_code=exit_code, log_text=log, world_size=2)
    assert outcome.verdict is verdict
    assert detail in outcome.detail


@pytest.mark.parametrize(
    ("verdict", "retry"),
    [
        (Verdict.OK, False),
        (Verdict.TIMEOUT, True),
        (Verdict.FAILED, True),
        (Verdict.SETUP_ERROR, False),
        (Verdict.ABORTED, False),
    ],
    ids=lambda v: str(v),
)
def test_which_verdicts_try_the_next_candidate(verdict: Verdict, retry: bool) -> None:
    assert verdict.next_candidate_may_help is retry


# ---------------------------------------------------------------------------------------------- cache


@pytest.mark.parametrize(
    ("nodes", "scope"), [(1, "single-node"), (2, "multi-node"), (16, "multi-node")], ids=["1", "2", "16"]
)
def test_probe_scope(nodes: int, scope: str) -> None:
    assert probe_scope(nodes) == scope


@pytest.mark.parametrize(
    ("results_dir", "cluster", "expected"),
    [
        ("/lustre/u", "mini", "/lustre/u/nccl/mini.multi-node.json"),
        ("lustre:///lustre/u/", "login1.example.org", "/lustre/u/nccl/login1.example.org.multi-node.json"),
        ("/lustre/u", "[::1] a/b", "/lustre/u/nccl/1_a_b.multi-node.json"),
    ],
    ids=["plain", "uri-and-host-name", "unsafe-characters"],
)
def test_cache_path(results_dir: str, cluster: str, expected: str) -> None:
    assert cache_path(results_dir, cluster, "multi-node") == expected


@pytest.mark.parametrize(
    ("results_dir", "cluster", "error"),
    [("relative/dir", "mini", StoragePathError), ("/lustre/u", "..", ValidationError)],
    ids=["relative", "empty-name"],
)
def test_cache_path_refuses(results_dir: str, cluster: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        cache_path(results_dir, cluster, "multi-node")


def entry(**overrides: Any) -> str:
    values: dict[str, Any] = {
        "cluster_name": "mini",
        "scope": "multi-node",
        "nodes": 2,
        "gpus_per_node": 1,
        "slurm_job_id": "42",
        "now": "2026-01-02T03:04:05Z",
    }
    values.update(overrides)
    return cache_text({"NCCL_P2P_DISABLE": "1"}, **values)


def test_cache_round_trip() -> None:
    text = entry()
    assert json.loads(text) == {
        "version": 1,
        "cluster": "mini",
        "scope": "multi-node",
        "env": {"NCCL_P2P_DISABLE": "1"},
        "probed_at": "2026-01-02T03:04:05Z",
        "slurm_job_id": "42",
        "nodes": 2,
        "gpus_per_node": 1,
    }
    cached = parse_cache(text, cluster_name="mini", scope="multi-node")
    assert (cached.env, cached.slurm_job_id, cached.probed_at, cached.nodes) == (
        {"NCCL_P2P_DISABLE": "1"},
        "42",
        "2026-01-02T03:04:05Z",
        2,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{not json", "not JSON", id="not-json"),
        pytest.param(entry().replace('"version": 1', '"version": 9'), "not a version-1 entry", id="version"),
        pytest.param(entry(cluster_name="other"), "is for 'other'/'multi-node'", id="other-cluster"),
        pytest.param(entry(scope="single-node"), "is for 'mini'/'single-node'", id="other-scope"),
        pytest.param(
            entry().replace('"NCCL_P2P_DISABLE": "1"', '"NCCL_P2P_DISABLE": 1'),
            "env is not a dict of strings",
            id="int-value",
        ),
    ],
)
def test_bad_cache_refused(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_cache(text, cluster_name="mini", scope="multi-node")
