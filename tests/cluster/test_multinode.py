"""Acceptance tests of issue 7 (multi-node) against the local 2-node SLURM test cluster.

The NCCL probe runs for real: torchrun from the cluster's CPU PyTorch venv starts one probe per
node on ``n1`` and ``n2`` (127.0.1.1 and 127.0.1.2), which all-reduce over gloo. The cluster has no
CUDA, so every probe here says it is a CPU test (``backend="gloo"``); one test checks that the
default, ``nccl``, is refused at once with the reason instead of passing on gloo. The operator runs
the way the worker and the triggerer drive it: ``execute()`` raises ``TaskDeferred``, the trigger
(rebuilt from ``serialize()``) runs on an asyncio loop until its event, which goes to
``execute_complete()`` with the deferral's kwargs, until the operator returns.

The hang is real too, and injected on the cluster's side (the shipped probe has no test switch): the
harness's fault switch (``/srv/lustre/.harness/faults``) makes the TaskProlog export
``SLURMTEST_FAULT=nccl_hang_unless_p2p_disable``, and the torch venv's start-up hook then keeps global
rank 0 out of every ``all_reduce`` unless ``NCCL_P2P_DISABLE=1``. The switch is on only inside
``clusterkit.fault_listed``, which keeps the words other tests list there side by side. The probe tests use
their own results directory (so their own NCCL cache); the DAG test runs ``airflow dags test
example_tao_multinode`` like ``make demo``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from clusterkit import fault_listed
from deferral import first_event, run_async
from demo import MULTINODE_CONF, REPO, load_cluster, prepare_airflow, stage_assets

from airflow_provider_tao_slurm.core.records import mint_job_id
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import NcclProbeError
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TOKEN = uuid.uuid4().hex[:6]
CONN_ID = "nccl_probe_test"
FAULT = "nccl_hang_unless_p2p_disable"
PROBE_TIMEOUT_S = 20
DAG_ID = "example_tao_multinode"
DAG_TIMEOUT_S = 420
LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}
RENDEZVOUS = re.compile(
    r"^(?P<label>\d+): rendezvous host=(?P<host>\S+) WORLD_SIZE=(?P<world>\S*) NODE_RANK=(?P<rank>\S*) "
    r"NUM_GPU_PER_NODE=(?P<gpus>\S*) MASTER_ADDR=(?P<addr>\S*) MASTER_PORT=(?P<port>\S*) nccl=\[(?P<nccl>[^]]*)\]$",
    re.MULTILINE,
)


# ---------------------------------------------------------------------- helpers


def context(dag_id: str, run_id: str) -> dict[str, Any]:
    """The slice of an Airflow context the operator reads."""
    return {
        "ti": SimpleNamespace(
            dag_id=dag_id, task_id="nccl_probe", run_id=run_id, map_index=-1, try_number=1, stats_tags={}
        )
    }


def drive(op: NcclProbeOperator, ctx: dict[str, Any]) -> tuple[dict[str, str], list[TaskDeferred]]:
    """Run the operator to its end through every deferral; return its result and the deferrals."""
    deferrals: list[TaskDeferred] = []
    step: Any = lambda: op.execute(ctx)  # noqa: E731 - the next call to make, replaced after each deferral
    while True:
        try:
            return step(), deferrals
        except TaskDeferred as deferral:
            deferrals.append(deferral)
            classpath, kwargs = deferral.trigger.serialize()
            assert classpath == "airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger"
            event = run_async(first_event(SlurmJobTrigger(**kwargs), timeout=240))
            step = lambda d=deferral, e=event: op.execute_complete(ctx, event=e.payload, **d.kwargs)  # noqa: E731


def sacct_row(ssh_run: SshRun, slurm_id: str) -> dict[str, str]:
    """``sacct -X`` State, ExitCode, NodeList, AllocTRES and QOS of one job (waits for accounting to have it).

    slurmdbd may show a job's end before its QOS (seen under load: ``Unknown`` for a moment): a row counts
    once its state is final and its QOS known.
    """
    fields = ("State", "ExitCode", "NodeList", "AllocTRES", "QOS")
    deadline = time.monotonic() + 30
    while True:
        _, out, _ = ssh_run(join(["sacct", "-X", "-n", "-P", "-j", slurm_id, "-o", ",".join(fields)]))
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        known = bool(rows) and rows[0][0].split()[0] not in LIVE and rows[0][4] not in ("", "Unknown")
        if known or time.monotonic() > deadline:
            return dict(zip(fields, rows[0], strict=True)) if rows else {}
        time.sleep(1)


def live_jobs(ssh_run: SshRun, names: list[str]) -> list[str]:
    """``id state`` of every job with one of these exact names that is not finished."""
    _, out, _ = ssh_run(join(["squeue", "-h", "-t", "all", f"--name={','.join(names)}", "-o", "%i %T"]))
    return [line for line in out.splitlines() if line.split()[1:] and line.split()[1] in LIVE]


def probe_processes(job_names: list[str]) -> list[str]:
    """Command lines of processes still running a probe of these jobs (the nodes are this machine)."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "nccl_probe.py" in line and any(n in line for n in job_names)]


def read_remote(ssh_run: SshRun, path: str) -> str:
    rc, out, err = ssh_run(f"cat -- {quote(path)}")
    assert rc == 0, f"{path}: {err}"
    return out


def cache_entry(ssh_run: SshRun, cluster: ClusterEnv, results_dir: str, entry: str) -> dict[str, Any]:
    """One entry of the probe's cache file of the GPU partition (``multi-node/gloo``, ...)."""
    cache = json.loads(read_remote(ssh_run, f"{results_dir}/nccl/mini.{cluster.gpu_partition}.json"))
    assert (cache["version"], cache["partitions"]) == (2, [cluster.gpu_partition])
    return dict(cache["entries"][entry])


def job_log(ssh_run: SshRun, deferral: TaskDeferred, results_dir: str) -> str:
    trigger = deferral.trigger
    return read_remote(ssh_run, f"{results_dir}/logs/{trigger.job_name}-{trigger.slurm_job_id}/main.out")


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster_json(cluster: ClusterEnv) -> dict[str, Any]:
    """The harness's environment JSON (the torch venv and the fault switch are not in ClusterEnv)."""
    path = Path(cluster.state_dir) / "cluster.json"
    data = dict(json.loads(path.read_text()))
    missing = [key for key in ("torch_python", "fault_switch") if key not in data]
    assert not missing, f"{path} lacks {missing}: run `python3 tests/cluster/harness.py up`"
    return data


@pytest.fixture(scope="module")
def image(cluster: ClusterEnv, ssh_run: SshRun) -> str:
    """A real squashfs made once by the Enroot stand-in (reused while its magic is right)."""
    path = f"{cluster.containers_dir}/nccl-probe-test.sqsh"
    _, magic, _ = ssh_run(f"head -c 4 -- {quote(path)} 2>/dev/null")
    if magic != "hsqs":
        ssh_run(f"rm -f -- {quote(path)}")
        rc, _, err = ssh_run(join(["enroot", "import", "-o", path, "docker://nvcr.io#nvidia/pytorch:24.01-py3"]))
        assert rc == 0, err
    return path


@pytest.fixture(scope="module")
def results_dir(cluster: ClusterEnv) -> str:
    """A results base (and so an NCCL cache) of this module run only."""
    return f"{cluster.results_dir}/nccl-test-{TOKEN}"


@pytest.fixture
def probe_conn(slurm_connection_env: str, results_dir: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A connection like ``slurm_default`` whose results_dir is :func:`results_dir`."""
    conn = json.loads(os.environ[f"AIRFLOW_CONN_{slurm_connection_env.upper()}"])
    conn["extra"]["results_dir"] = results_dir
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    return CONN_ID


def probe_op(image: str, cluster_json: dict[str, Any], conn_id: str, **kwargs: Any) -> NcclProbeOperator:
    kwargs.setdefault("num_nodes", 2)
    kwargs.setdefault("gpus_per_node", 1)
    kwargs.setdefault("backend", "gloo")  # the test cluster has no CUDA: a CPU test, said explicitly
    return NcclProbeOperator(
        task_id="nccl_probe",
        image=image,
        python=cluster_json["torch_python"],
        poll_interval_seconds=1,
        slurm_conn_id=conn_id,
        **kwargs,
    )


# ---------------------------------------------------------------------- the probe


def test_probe_all_reduces_across_both_nodes_with_gloo(
    ssh_run: SshRun, cluster: ClusterEnv, image: str, cluster_json: dict[str, Any], probe_conn: str, results_dir: str
) -> None:
    op = probe_op(image, cluster_json, probe_conn, timeout_seconds=60, force_reprobe=True)
    env, deferrals = drive(op, context(f"nccl{TOKEN}-gloo", "run1"))
    assert env == {}
    assert len(deferrals) == 1
    log = job_log(ssh_run, deferrals[0], results_dir)
    ranks = sorted(
        re.findall(r"^(?:\d+: )?TAO_NCCL_PROBE: rank (\d)/2 node (\d)/2 local 0/1 host (\S+) backend (\S+)", log, re.M)
    )
    assert ranks == [("0", "0", "n1", "gloo"), ("1", "1", "n2", "gloo")]
    ok = re.search(
        r"^(?:\d+: )?TAO_NCCL_PROBE_OK world=2 nodes=2 gpus_per_node=1 backend=gloo sum=3 "
        r"nccl=none driver=none cuda=none torch=\S+ partition=(\S+)$",
        log,
        re.M,
    )
    assert ok is not None, log
    assert ok.group(1) == cluster.gpu_partition
    # The ranks above are the evidence of the two nodes: on a loaded CI machine, sacct once gave this job's
    # NodeList as ``n1`` although both ranks had run, one on each node.
    row = sacct_row(ssh_run, deferrals[0].trigger.slurm_job_id)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0")
    entry = cache_entry(ssh_run, cluster, results_dir, "multi-node/gloo")
    assert (entry["env"], entry["slurm_job_id"], entry["backend"], entry["image"]) == (
        {},
        deferrals[0].trigger.slurm_job_id,
        "gloo",
        image,
    )
    assert entry["seen"]["partition"] == cluster.gpu_partition


def test_single_node_probe_with_two_gpus_and_site_options(
    ssh_run: SshRun, cluster: ClusterEnv, image: str, cluster_json: dict[str, Any], probe_conn: str, results_dir: str
) -> None:
    """One node, two GPUs, with the site's QOS and a constraint plus GPU type only n2 has."""
    op = probe_op(
        image,
        cluster_json,
        probe_conn,
        num_nodes=1,
        gpus_per_node=2,
        timeout_seconds=60,
        force_reprobe=True,
        qos=cluster_json["qos"],
        constraint=cluster_json["node_features"]["n2"][0],
        gpu_type=cluster_json["gpu_types"]["n2"],
    )
    env, deferrals = drive(op, context(f"nccl{TOKEN}-1x2", "run1"))
    assert (env, len(deferrals)) == ({}, 1)
    log = job_log(ssh_run, deferrals[0], results_dir)
    ranks = sorted(
        re.findall(r"^(?:\d+: )?TAO_NCCL_PROBE: rank (\d)/2 node 0/1 local (\d)/2 host (\S+) backend gloo", log, re.M)
    )
    assert [(rank, local) for rank, local, _ in ranks] == [("0", "0"), ("1", "1")]
    assert {host for _, _, host in ranks} == {"n2"}
    row = sacct_row(ssh_run, deferrals[0].trigger.slurm_job_id)
    assert (row["QOS"], row["NodeList"]) == (cluster_json["qos"], "n2")
    assert f"gres/gpu:{cluster_json['gpu_types']['n2']}=2" in row["AllocTRES"] or "gres/gpu=2" in row["AllocTRES"]
    assert "TAO_NCCL_PROBE_OK world=2 nodes=1 gpus_per_node=2 backend=gloo sum=3" in log
    entry = cache_entry(ssh_run, cluster, results_dir, "single-node/gloo")
    assert (entry["env"], entry["nodes"], entry["gpus_per_node"]) == ({}, 1, 2)


def test_hang_times_out_is_cancelled_and_the_next_env_is_cached(
    ssh_run: SshRun, cluster: ClusterEnv, image: str, cluster_json: dict[str, Any], probe_conn: str, results_dir: str
) -> None:
    with fault_listed(Path(cluster_json["fault_switch"]), FAULT):
        op = probe_op(image, cluster_json, probe_conn, timeout_seconds=PROBE_TIMEOUT_S, force_reprobe=True)
        started = time.monotonic()
        env, deferrals = drive(op, context(f"nccl{TOKEN}-hang", "run1"))
        took = time.monotonic() - started
    assert env == {"NCCL_P2P_DISABLE": "1"}
    assert len(deferrals) == 2
    assert took > PROBE_TIMEOUT_S
    hung, passed = (d.trigger for d in deferrals)
    names = [hung.job_name, passed.job_name]

    hung_log = job_log(ssh_run, deferrals[0], results_dir)
    assert f"SLURMTEST fault {FAULT}: rank 0 stays out of the all-reduce" in hung_log
    assert f"TAO_SLURM: program stopped by timeout after {PROBE_TIMEOUT_S} s" in hung_log
    assert "TAO_NCCL_PROBE_OK" not in hung_log
    assert sacct_row(ssh_run, hung.slurm_job_id)["ExitCode"] == "124:0"

    passed_log = job_log(ssh_run, deferrals[1], results_dir)
    assert passed_log.count('settings {"NCCL_P2P_DISABLE": "1"}') == 2
    assert "TAO_NCCL_PROBE_OK world=2" in passed_log
    assert sacct_row(ssh_run, passed.slurm_job_id)["State"] == "COMPLETED"

    assert live_jobs(ssh_run, names) == []
    assert probe_processes(names) == []
    entry = cache_entry(ssh_run, cluster, results_dir, "multi-node/gloo")
    assert (entry["env"], entry["slurm_job_id"]) == ({"NCCL_P2P_DISABLE": "1"}, passed.slurm_job_id)

    # The next run (the switch is off again, which must not matter) answers from the cache.
    ctx = context(f"nccl{TOKEN}-hang", "run2")
    again, deferrals_again = drive(probe_op(image, cluster_json, probe_conn, timeout_seconds=PROBE_TIMEOUT_S), ctx)
    assert (again, deferrals_again) == ({"NCCL_P2P_DISABLE": "1"}, [])
    first_name = mint_job_id(f"nccl{TOKEN}-hang", "nccl_probe", "run2", -1, try_number=1)
    _, listed, _ = ssh_run(join(["sacct", "-X", "-n", "-P", "-S", "now-1hours", f"--name={first_name}", "-o", "JobID"]))
    _, queued, _ = ssh_run(join(["squeue", "-h", "-t", "all", f"--name={first_name}", "-o", "%i"]))
    assert (listed.strip(), queued.strip()) == ("", "")


def test_nccl_required_on_a_cluster_without_cuda_fails_at_once(
    ssh_run: SshRun, cluster: ClusterEnv, image: str, cluster_json: dict[str, Any], probe_conn: str, results_dir: str
) -> None:
    """The default backend proves NCCL: on this CUDA-less cluster the probe says so, and nothing passes on gloo."""
    op = probe_op(image, cluster_json, probe_conn, timeout_seconds=60, force_reprobe=True, backend="nccl")
    with pytest.raises(NcclProbeError) as info:
        drive(op, context(f"nccl{TOKEN}-nocuda", "run1"))
    message = str(info.value)
    assert f"CUDA is not available in the container on partition {cluster.gpu_partition}" in message
    assert "--container-image" in message
    assert "backend='gloo' is only for a CPU test cluster" in message
    names = [mint_job_id(f"nccl{TOKEN}-nocuda", "nccl_probe", "run1", -1, try_number=1)]
    query = join(["sacct", "-X", "-n", "-P", "-S", "now-1hours", f"--name={names[0]}", "-o", "JobID"])
    deadline = time.monotonic() + 30  # slurmdbd may list a job a moment after it ended (seen under load)
    while True:
        listed = ssh_run(query)[1].split()
        if listed or time.monotonic() > deadline:
            break
        time.sleep(1)
    (slurm_id,) = listed  # one probe job: no other NCCL candidate was tried
    log = read_remote(ssh_run, f"{results_dir}/logs/{names[0]}-{slurm_id}/main.out")
    assert log.count("TAO_NCCL_PROBE_NO_CUDA: rank ") == 2  # both nodes said it
    assert "TAO_NCCL_PROBE_OK" not in log
    assert live_jobs(ssh_run, names) == []
    assert probe_processes(names) == []
    _, cached, _ = ssh_run(f"cat -- {quote(f'{results_dir}/nccl/mini.{cluster.gpu_partition}.json')} 2>/dev/null")
    assert "multi-node/nccl" not in cached


# ---------------------------------------------------------------------- the DAG


@dataclasses.dataclass(frozen=True)
class DagRun:
    rc: int
    output: str
    facts: dict[str, Any]


@pytest.fixture(scope="module")
def dag_run(cluster: ClusterEnv, cluster_json: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> DagRun:
    """``airflow dags test example_tao_multinode`` with the hang switched on and a forced probe."""
    info = dataclasses.asdict(cluster)
    assert load_cluster()["port"] == cluster.port
    stage_assets(info)
    env = prepare_airflow(info, tmp_path_factory.mktemp("airflow-home"))
    conf = {
        **MULTINODE_CONF,  # the test cluster has no CUDA: the DAG run says its probe is a CPU test
        "force_probe": True,
        "probe_timeout_seconds": PROBE_TIMEOUT_S,
        "probe_python": cluster_json["torch_python"],
    }
    argv = [str(Path(sys.executable).parent / "airflow"), "dags", "test", DAG_ID, "--conf", json.dumps(conf)]
    with fault_listed(Path(cluster_json["fault_switch"]), FAULT):
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=DAG_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False
        )
    facts = subprocess.run(
        [sys.executable, str(REPO / "tests" / "cluster" / "demo.py"), "facts", DAG_ID],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = [line for line in facts.stdout.splitlines() if line.startswith("{")]
    return DagRun(rc=proc.returncode, output=proc.stdout + proc.stderr, facts=json.loads(lines[-1]))


def test_multinode_dag_trains_on_both_nodes_with_the_probed_env(dag_run: DagRun, ssh_run: SshRun) -> None:
    facts = dag_run.facts
    assert (dag_run.rc, facts["state"]) == (0, "success"), dag_run.output[-6000:]
    assert facts["tasks"] == dict.fromkeys(
        ("preflight", "check_datasets", "import_image", "nccl_probe", "submit", "wait"), "success"
    )
    assert facts["xcom"]["nccl_probe"] == {"NCCL_P2P_DISABLE": "1"}
    assert "timeout (SLURM job" in dag_run.output  # the forced probe hung once, then passed

    handle = facts["xcom"]["submit"]
    row = sacct_row(ssh_run, str(handle["slurm_job_id"]))
    assert (row["State"], row["NodeList"]) == ("COMPLETED", "n[1-2]")
    assert "node=2" in row["AllocTRES"]
    assert "gres/gpu=2" in row["AllocTRES"]

    log = read_remote(ssh_run, f"{handle['log_dir']}/main.out")
    # every node's line carries its rank (srun --label): the same line from two nodes is told apart
    seen = sorted(
        (m["host"], m["rank"], m["world"], m["gpus"], m["addr"], m["port"], m["nccl"])
        for m in RENDEZVOUS.finditer(log)
        if m["label"] == m["rank"]
    )
    announced = re.search(r"^TAO_SLURM: rendezvous n1:(\d+), ", log, re.MULTILINE)
    assert announced, log[-3000:]
    port = announced.group(1)  # found free on n1 when the job started: nodes are shared, so never a fixed 29500
    assert seen == [
        ("n1", "0", "2", "1", "n1", port, "NCCL_P2P_DISABLE=1"),
        ("n2", "1", "2", "1", "n1", port, "NCCL_P2P_DISABLE=1"),
    ]
    script = read_remote(ssh_run, handle["script_path"])
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --wait-all-nodes=1",
        "#SBATCH --gres=gpu:1",
    ):
        assert line in script.splitlines()
    assert "export NCCL_P2P_DISABLE=1" in script.splitlines()
    assert facts["xcom"]["wait"]["terminal_state"] == "COMPLETE"
