"""NCCL probe: the probe program's rendezvous math, dry run and backends, candidates, command, verdict, cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.nccl import (
    DEFAULT_CANDIDATE_ENVS,
    CachedEnv,
    CacheKey,
    SeenVersions,
    Verdict,
    cache_key,
    cache_path,
    cache_text,
    candidate_envs,
    check_backend,
    check_max_age,
    judge_probe,
    lookup_cache,
    probe_command,
    probe_scope,
)
from airflow_provider_tao_slurm.exceptions import StoragePathError, ValidationError
from airflow_provider_tao_slurm.probes import nccl_probe
from airflow_provider_tao_slurm.probes.nccl_probe import (
    Rendezvous,
    driver_version,
    expected_sum,
    nccl_version_text,
    rendezvous,
)

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
    assert printed["backend"] == "nccl"
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


# ---------------------------------------------------------------------------------------------- backends

FAKE_TORCH = {
    "__init__.py": (
        "from torch import cuda, version\n"
        "__version__ = '9.9.9+fake'\n"
        "def device(*args):\n    return args\n"
        "class _Tensor:\n"
        "    def __init__(self, value):\n        self.value = value\n"
        "    def item(self):\n        return self.value\n"
        "def tensor(values, device=None):\n    return _Tensor(values[0])\n"
    ),
    "version.py": "import os\ncuda = os.environ.get('FAKE_CUDA') or None\n",
    "cuda/__init__.py": (
        "import os\n"
        "def is_available():\n    return bool(os.environ.get('FAKE_CUDA'))\n"
        "def device_count():\n    return int(os.environ.get('FAKE_GPUS', '0'))\n"
        "def set_device(device):\n    pass\n"
    ),
    "cuda/nccl.py": (
        "import os\n"
        "def version():\n"
        "    if not os.environ.get('FAKE_CUDA'):\n        raise AttributeError('no _nccl_version')\n"
        "    return (2, 21, 5)\n"
    ),
    "distributed/__init__.py": (
        "import os\n"
        "def is_nccl_available():\n    return bool(os.environ.get('FAKE_CUDA'))\n"
        "def init_process_group(backend, **kwargs):\n    print('FAKE init_process_group', backend, flush=True)\n"
        "def all_reduce(value):\n    pass\n"
        "def destroy_process_group():\n    pass\n"
    ),
}


@pytest.fixture
def fake_torch(tmp_path: Path) -> Path:
    """A ``torch`` that runs one process's all-reduce; ``FAKE_CUDA`` (its CUDA build) turns its GPUs on."""
    for name, text in FAKE_TORCH.items():
        path = tmp_path / "torch" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("args", "env", "rc", "lines", "absent"),
    [
        pytest.param(
            ["--backend", "nccl"],
            {"SLURM_JOB_PARTITION": "polar"},
            4,
            [
                "TAO_NCCL_PROBE_NO_CUDA: rank 0 host ",
                " partition polar: backend nccl needs CUDA but torch 9.9.9+fake (CUDA build none, driver ",
            ],
            ["FAKE init_process_group", "TAO_NCCL_PROBE_OK"],
            id="nccl-without-cuda-refuses-and-runs-nothing",
        ),
        pytest.param(
            [],
            {},
            4,
            ["TAO_NCCL_PROBE_NO_CUDA: rank 0 host ", "partition none: backend nccl needs CUDA"],
            ["FAKE init_process_group", "TAO_NCCL_PROBE_OK"],
            id="nccl-is-the-default",
        ),
        pytest.param(
            ["--backend", "gloo"],
            {"SLURM_JOB_PARTITION": "cpu"},
            0,
            [
                "FAKE init_process_group gloo",
                "TAO_NCCL_PROBE_OK world=1 nodes=1 gpus_per_node=1 backend=gloo sum=1 nccl=none driver=",
                " cuda=none torch=9.9.9+fake partition=cpu",
            ],
            ["TAO_NCCL_PROBE_NO_CUDA"],
            id="gloo-cpu-test-passes-and-says-so",
        ),
        pytest.param(
            ["--backend", "nccl"],
            {"FAKE_CUDA": "12.1", "FAKE_GPUS": "1", "SLURM_JOB_PARTITION": "polar"},
            0,
            [
                "FAKE init_process_group nccl",
                "TAO_NCCL_PROBE_OK world=1 nodes=1 gpus_per_node=1 backend=nccl sum=1 nccl=2.21.5 driver=",
                " cuda=12.1 torch=9.9.9+fake partition=polar",
            ],
            ["TAO_NCCL_PROBE_NO_CUDA"],
            id="nccl-with-cuda-states-the-nccl-version",
        ),
        pytest.param(
            ["--backend", "nccl"],
            {"FAKE_CUDA": "12.1", "FAKE_GPUS": "0"},
            2,
            ["TAO_NCCL_PROBE_SETUP_ERROR: rank 0 ", "LOCAL_RANK=0 but the container sees 0 GPU(s)"],
            ["FAKE init_process_group"],
            id="fewer-gpus-than-processes",
        ),
    ],
)
def test_probe_backends(
    args: list[str], env: dict[str, str], rc: int, lines: list[str], absent: list[str], fake_torch: Path
) -> None:
    """The probe runs the backend it is told: NCCL needs CUDA (no silent gloo), gloo is a CPU test."""
    proc = run_probe_file(args, env, fake_torch)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    for line in lines:
        assert line in proc.stdout
    for word in absent:
        assert word not in proc.stdout


def test_probe_refuses_an_unknown_backend(fake_torch: Path) -> None:
    proc = run_probe_file(["--backend", "mpi"], {}, fake_torch)
    assert proc.returncode == 2
    assert "invalid choice: 'mpi'" in proc.stderr


@pytest.mark.parametrize(
    ("text", "version"),
    [
        pytest.param(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
            "GCC version:  gcc version 12.2.0",
            "535.104.05",
            id="proprietary",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)",
            "550.54.15",
            id="open-module",
        ),
        pytest.param("NVRM version: NVIDIA UNIX aarch64 Kernel Module  560.35.03  Fri Aug 16", "560.35.03", id="arm"),
        pytest.param("", None, id="no-driver"),
    ],
)
def test_driver_version(text: str, version: str | None) -> None:
    assert driver_version(text) == version


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ((2, 18, 1), "2.18.1"),
        ((2, 21, 5, "+cuda12.4"), "2.21.5"),
        (21803, "2.18.3"),
        (2708, "2.7.8"),
        (0, None),
        (None, None),
        ("2.18", None),
    ],
    ids=["tuple", "tuple-suffix", "packed-2.9-on", "packed-before-2.9", "zero", "none", "text"],
)
def test_nccl_version_text(value: object, text: str | None) -> None:
    assert nccl_version_text(value) == text


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
        "/lustre/r/jobs/j/inputs/nccl_probe.py --backend nccl"
    )


def test_single_node_command() -> None:
    command = probe_command("/r/p.py", nodes=1, gpus_per_node=8, python="/opt/venv/bin/python", backend="gloo")
    assert command == (
        "export TAO_NODE_COUNT=1 TAO_GPUS_PER_NODE=8 TAO_NODE_RANK=0; "
        "exec /opt/venv/bin/python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=8 /r/p.py "
        "--backend gloo"
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
            "--master-port=29500 /tmp/it's here/p.py --backend nccl",
            id="multi-node-from-template-env",
        ),
        pytest.param(
            1,
            {},
            "-m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 /tmp/it's here/p.py --backend nccl "
            "TAO=1/2/0",
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
    ("path", "python", "backend", "message"),
    [
        ("p.py", "python3", "nccl", "must be absolute"),
        ("/p.py", " ", "nccl", "python is empty"),
        ("/p.py", "python3", "nccl; touch /tmp/x", "must be 'nccl'"),
    ],
    ids=["relative", "blank-python", "backend-injection"],
)
def test_command_refuses(path: str, python: str, backend: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        probe_command(path, nodes=2, gpus_per_node=1, python=python, backend=backend)


@pytest.mark.parametrize("value", ["NCCL", "mpi", "", None, 1], ids=["upper", "mpi", "empty", "none", "int"])
def test_check_backend_refuses(value: object) -> None:
    with pytest.raises(ValidationError, match="only a CPU test cluster without CUDA"):
        check_backend(value)


# ---------------------------------------------------------------------------------------------- verdict

OK_LOG = (
    "TAO_NCCL_PROBE: rank 0/2 ...\nTAO_NCCL_PROBE_OK world=2 nodes=2 gpus_per_node=1 backend=nccl sum=3 "
    "nccl=2.18.1 driver=535.104.05 cuda=12.1 torch=2.3.0 partition=polar\n"
)
GLOO_LOG = (
    "TAO_NCCL_PROBE_OK world=2 nodes=2 gpus_per_node=1 backend=gloo sum=3 nccl=none driver=none cuda=none "
    "torch=2.3.0+cpu partition=polar\n"
)
NO_CUDA_LOG = (
    "TAO_NCCL_PROBE_NO_CUDA: rank 1 host n2 partition polar: backend nccl needs CUDA but torch 2.3.0+cpu "
    "(CUDA build none, driver none) sees no GPU; CUDA_VISIBLE_DEVICES=(unset)\n"
)
NO_CUDA_HINT = "CUDA is not available in the container on partition polar ("


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
    outcome = judge_probe(native_state=native, exit_code=exit_code, log_text=log, world_size=2, partition="polar")
    assert outcome.verdict is verdict
    assert detail in outcome.detail


@pytest.mark.parametrize(
    ("required", "native", "exit_code", "log", "verdict", "detail"),
    [
        pytest.param("nccl", "COMPLETED", 0, GLOO_LOG, Verdict.NO_CUDA, NO_CUDA_HINT, id="gloo-when-nccl-required"),
        pytest.param("gloo", "COMPLETED", 0, GLOO_LOG, Verdict.OK, "backend=gloo sum=3", id="gloo-when-cpu-test"),
        pytest.param("nccl", "COMPLETED", 0, OK_LOG, Verdict.OK, "backend=nccl sum=3", id="nccl"),
        pytest.param(
            "gloo", "COMPLETED", 0, OK_LOG, Verdict.FAILED, "told backend gloo but ran nccl", id="nccl-when-gloo-told"
        ),
        pytest.param(
            "nccl",
            "COMPLETED",
            0,
            OK_LOG.replace(" backend=nccl", ""),
            Verdict.NO_CUDA,
            "the probe ran backend none",
            id="ok-line-without-backend",
        ),
        pytest.param("nccl", "FAILED", 1, NO_CUDA_LOG, Verdict.NO_CUDA, NO_CUDA_HINT, id="probe-found-no-cuda"),
        pytest.param(
            "nccl",
            "FAILED",
            124,
            "TAO_NCCL_PROBE: rank 0/2 ...\n" + NO_CUDA_LOG + "TAO_SLURM: program stopped by timeout after 120 s\n",
            Verdict.NO_CUDA,
            "rank 1 host n2 partition polar: backend nccl needs CUDA",
            id="one-node-without-cuda-the-other-hung",
        ),
    ],
)
def test_judge_probe_backend(
    required: str, native: str, exit_code: int, log: str, verdict: Verdict, detail: str
) -> None:
    """NCCL required: a gloo result or a probe without CUDA is refused, with the fix; gloo passes a CPU test only."""
    outcome = judge_probe(
        native_state=native, exit_code=exit_code, log_text=log, world_size=2, backend=required, partition="polar"
    )
    assert outcome.verdict is verdict
    assert detail in outcome.detail
    if verdict is Verdict.NO_CUDA:
        for fix in ("check the image", "the GPU request", "--container-image", "backend='gloo' is only for a CPU test"):
            assert fix.lower() in outcome.detail.lower()


def test_judge_probe_reads_the_versions_seen() -> None:
    outcome = judge_probe(native_state="COMPLETED", exit_code=0, log_text=OK_LOG, world_size=2)
    assert outcome.seen == SeenVersions(
        nccl="2.18.1", driver="535.104.05", cuda="12.1", torch="2.3.0", partition="polar"
    )
    gloo = judge_probe(native_state="COMPLETED", exit_code=0, log_text=GLOO_LOG, world_size=2, backend="gloo")
    assert (gloo.seen.nccl, gloo.seen.driver, gloo.seen.known) == (None, None, False)


@pytest.mark.parametrize(
    ("verdict", "retry"),
    [
        (Verdict.OK, False),
        (Verdict.TIMEOUT, True),
        (Verdict.FAILED, True),
        (Verdict.SETUP_ERROR, False),
        (Verdict.ABORTED, False),
        (Verdict.NO_CUDA, False),
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


def key(**overrides: Any) -> CacheKey:
    values: dict[str, Any] = {
        "cluster_name": "mini",
        "partitions": ["polar"],
        "nodes": 2,
        "backend": "nccl",
        "image": "/lustre/c/pytorch.sqsh",
    }
    values.update(overrides)
    return cache_key(values["cluster_name"], values["partitions"], values["nodes"], values["backend"], values["image"])


@pytest.mark.parametrize(
    ("results_dir", "cluster", "partitions", "expected"),
    [
        ("/lustre/u", "mini", ["polar"], "/lustre/u/nccl/mini.polar.json"),
        ("lustre:///lustre/u/", "login1.example.org", ["gpu"], "/lustre/u/nccl/login1.example.org.gpu.json"),
        ("/lustre/u", "[::1] a/b", ["polar"], "/lustre/u/nccl/1_a_b.polar.json"),
        ("/lustre/u", "mini", ["polar4", "polar", "polar4"], "/lustre/u/nccl/mini.polar+polar4.json"),
    ],
    ids=["plain", "uri-and-host-name", "unsafe-characters", "several-partitions-sorted"],
)
def test_cache_path(results_dir: str, cluster: str, partitions: list[str], expected: str) -> None:
    assert cache_path(results_dir, key(cluster_name=cluster, partitions=partitions)) == expected


@pytest.mark.parametrize(
    ("results_dir", "cluster", "partitions", "error"),
    [
        ("relative/dir", "mini", ["polar"], StoragePathError),
        ("/lustre/u", "..", ["polar"], ValidationError),
        ("/lustre/u", "mini", [".."], ValidationError),
    ],
    ids=["relative", "empty-name", "empty-partition"],
)
def test_cache_path_refuses(results_dir: str, cluster: str, partitions: list[str], error: type[Exception]) -> None:
    with pytest.raises(error):
        cache_path(results_dir, key(cluster_name=cluster, partitions=partitions))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, ("mini", ("polar",), "multi-node", "nccl", "multi-node/nccl")),
        ({"nodes": 1}, ("mini", ("polar",), "single-node", "nccl", "single-node/nccl")),
        ({"backend": "gloo", "partitions": ["b", "a"]}, ("mini", ("a", "b"), "multi-node", "gloo", "multi-node/gloo")),
    ],
    ids=["multi-node", "single-node", "gloo-and-partitions"],
)
def test_cache_key(overrides: dict[str, Any], expected: tuple[Any, ...]) -> None:
    k = key(**overrides)
    assert (k.cluster, k.partitions, k.scope, k.backend, k.entry_name) == expected


def test_cache_key_refuses_a_bad_backend() -> None:
    with pytest.raises(ValidationError, match="backend='cpu'"):
        key(backend="cpu")


NOW = "2026-01-10T00:00:00Z"
DRIVER_535 = SeenVersions(nccl="2.18.1", driver="535.104.05", cuda="12.1", torch="2.3.0", partition="polar")


def proven(
    env: dict[str, str] | None = None,
    *,
    at: str = "2026-01-09T00:00:00Z",
    job: str = "42",
    seen: SeenVersions = DRIVER_535,
    **overrides: Any,
) -> CachedEnv:
    values: dict[str, Any] = {"nodes": 2, "gpus_per_node": 1, "backend": "nccl", "image": "/lustre/c/pytorch.sqsh"}
    values.update(overrides)
    return CachedEnv(
        env={"NCCL_P2P_DISABLE": "1"} if env is None else env, probed_at=at, slurm_job_id=job, seen=seen, **values
    )


def test_cache_round_trip() -> None:
    text = cache_text(None, key(), proven())
    data = json.loads(text)
    assert (data["version"], data["cluster"], data["partitions"]) == (2, "mini", ["polar"])
    assert data["entries"]["multi-node/nccl"] == {
        "env": {"NCCL_P2P_DISABLE": "1"},
        "backend": "nccl",
        "image": "/lustre/c/pytorch.sqsh",
        "probed_at": "2026-01-09T00:00:00Z",
        "slurm_job_id": "42",
        "nodes": 2,
        "gpus_per_node": 1,
        "seen": {"nccl": "2.18.1", "driver": "535.104.05", "cuda": "12.1", "torch": "2.3.0", "partition": "polar"},
    }
    assert data["latest"]["driver"] == "535.104.05"
    found = lookup_cache(text, key(), now=NOW, max_age_hours=168)
    assert (found.entry, found.reason) == (proven(), "")


#: What the previous provider release wrote (``<cluster>.<scope>.json``, version 1).
V1_ENTRY = (
    '{"cluster": "mini", "env": {"NCCL_P2P_DISABLE": "1"}, "gpus_per_node": 1, "nodes": 2, '
    '"probed_at": "2026-01-02T03:04:05Z", "scope": "multi-node", "slurm_job_id": "42", "version": 1}\n'
)


def later_probe(seen: SeenVersions, nodes: int = 1) -> str:
    """The cache after a single-node probe of the same partition saw ``seen``, following the multi-node entry."""
    first = cache_text(None, key(), proven())
    return cache_text(first, key(nodes=nodes), proven({}, at="2026-01-09T12:00:00Z", job="77", seen=seen))


@pytest.mark.parametrize(
    ("text", "lookup", "reason"),
    [
        pytest.param(None, {}, "no cache file yet", id="no-file"),
        pytest.param("{not json", {}, "not JSON", id="not-json"),
        pytest.param("[1, 2]", {}, "not a JSON object", id="not-an-object"),
        pytest.param(V1_ENTRY, {}, "version-1 entry of another provider release", id="v1-entry-of-the-old-release"),
        pytest.param(cache_text(None, key(cluster_name="other"), proven()), {}, "for cluster 'other'", id="cluster"),
        pytest.param(cache_text(None, key(partitions=["p2"]), proven()), {}, "partitions ['p2']", id="partition"),
        pytest.param(cache_text(None, key(nodes=1), proven()), {}, "no multi-node entry for backend nccl", id="scope"),
        pytest.param(
            cache_text(None, key(backend="gloo"), proven(backend="gloo")),
            {},
            "no multi-node entry for backend nccl",
            id="cpu-test-entry-never-answers-nccl",
        ),
        pytest.param(
            cache_text(None, key(), proven(image="/lustre/c/old.sqsh")),
            {},
            "proven with image '/lustre/c/old.sqsh', this probe runs '/lustre/c/pytorch.sqsh'",
            id="other-image",
        ),
        pytest.param(
            cache_text(None, key(), proven(at="2026-01-02T23:00:00Z")),
            {},
            "proven 169.0 h ago (SLURM job 42), more than cache_max_age_hours=168",
            id="expired-after-a-week",
        ),
        pytest.param(
            cache_text(None, key(), proven()),
            {"max_age_hours": 12},
            "proven 24.0 h ago (SLURM job 42), more than cache_max_age_hours=12",
            id="shorter-max-age",
        ),
        pytest.param(
            cache_text(None, key(), proven(at="yesterday")), {}, "has no readable time ('yesterday')", id="bad-time"
        ),
        pytest.param(
            later_probe(replace(DRIVER_535, driver="550.54.15")),
            {},
            "a later probe (SLURM job '77' at '2026-01-09T12:00:00Z') saw driver 535.104.05 -> 550.54.15",
            id="driver-changed",
        ),
        pytest.param(
            later_probe(replace(DRIVER_535, nccl="2.21.5", driver="550.54.15")),
            {},
            "saw driver 535.104.05 -> 550.54.15, nccl 2.18.1 -> 2.21.5",
            id="driver-and-nccl-changed",
        ),
        pytest.param(
            cache_text(None, key(), proven()).replace('"NCCL_P2P_DISABLE": "1"', '"NCCL_P2P_DISABLE": 1'),
            {},
            "entry is malformed",
            id="int-value",
        ),
    ],
)
def test_cache_misses(text: str | None, lookup: dict[str, Any], reason: str) -> None:
    """Every unusable entry is a miss with its reason, never an exception."""
    found = lookup_cache(text, key(), now=NOW, max_age_hours=lookup.get("max_age_hours", 168))
    assert found.entry is None
    assert reason in found.reason


@pytest.mark.parametrize(
    ("text", "max_age"),
    [
        pytest.param(cache_text(None, key(), proven(at="2026-01-03T01:00:00Z")), 168, id="six-days-old"),
        pytest.param(cache_text(None, key(), proven(at="2025-12-01T00:00:00Z")), 24 * 60, id="longer-max-age"),
        pytest.param(later_probe(DRIVER_535), 168, id="later-probe-saw-the-same-versions"),
        pytest.param(later_probe(SeenVersions(torch="2.3.0+cpu")), 168, id="later-cpu-test-saw-nothing"),
        pytest.param(
            later_probe(replace(DRIVER_535, cuda="12.4", torch="2.4.0")), 168, id="cuda-and-torch-are-not-compared"
        ),
    ],
)
def test_cache_hits(text: str, max_age: float) -> None:
    found = lookup_cache(text, key(), now=NOW, max_age_hours=max_age)
    assert found.entry is not None
    assert found.entry.env == {"NCCL_P2P_DISABLE": "1"}


def test_cache_text_keeps_the_other_entries_and_replaces_its_own() -> None:
    both = later_probe(DRIVER_535)
    again = cache_text(both, key(), proven({"NCCL_IB_DISABLE": "1"}, job="99"))
    entries = json.loads(again)["entries"]
    assert sorted(entries) == ["multi-node/nccl", "single-node/nccl"]
    assert (entries["multi-node/nccl"]["env"], entries["single-node/nccl"]["env"]) == ({"NCCL_IB_DISABLE": "1"}, {})
    assert json.loads(again)["latest"]["slurm_job_id"] == "99"


@pytest.mark.parametrize("previous", [None, "{broken", V1_ENTRY], ids=["none", "broken", "v1"])
def test_cache_text_replaces_an_unreadable_file(previous: str | None) -> None:
    data = json.loads(cache_text(previous, key(), proven()))
    assert (data["version"], sorted(data["entries"])) == (2, ["multi-node/nccl"])


def test_a_probe_that_saw_nothing_keeps_the_latest_observation() -> None:
    data = json.loads(later_probe(SeenVersions(torch="2.3.0+cpu")))
    assert (data["latest"]["driver"], data["latest"]["slurm_job_id"]) == ("535.104.05", "42")


@pytest.mark.parametrize("value", [0, -1, "168", True, float("inf"), None], ids=str)
def test_check_max_age_refuses(value: object) -> None:
    with pytest.raises(ValidationError, match="must be a positive number of hours"):
        check_max_age(value)


def test_check_max_age_takes_hours() -> None:
    assert (check_max_age(168), check_max_age(0.5)) == (168.0, 0.5)
