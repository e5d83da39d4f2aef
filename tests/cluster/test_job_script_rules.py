"""The job script's own rules (issue 32, items 7 and 10b) on the real test cluster.

- Rendezvous ports: two single-node torchrun bundles run at the same time on one node (n1; in the test
  cluster both nodes even share one port space). Each job's batch script picks a free ``MASTER_PORT`` on
  the node when it starts, so both torchruns bind their store; with one fixed port the second would fail
  with EADDRINUSE. torchrun comes from the cluster's CPU PyTorch venv (the Pyxis stand-in runs commands on
  the host).
- The secret sidecar: no sensor runs. The job's own EXIT trap removes it when SLURM will not run the job
  again (success, program failure, cancel), and keeps it across ``scontrol requeue`` for the next run,
  whose own end then removes it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import (
    SHOW_SECRET,
    conn,
    dag_id,
    digest,
    final_state,
    image,
    job_names,
    remote_text,
    secret_value,
    sensor_for,
    sidecar_mode,
    squeue_field,
    start_requeued_elsewhere,
    submit,
    submit_op,
)
from deferral import context, run_deferrable, wait_until

from airflow_provider_tao_slurm.core.shell import join, quote

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["conn", "dag_id", "image", "secret_value"]

TORCH_BIN = "/opt/tao-slurm/venv/bin"
#: The training program: every torchrun worker says where its rendezvous is, leaves a mark in
#: ``MEET_DIR`` and stays until the other job's worker has left its own, so the two jobs' stores are bound
#: at the same time by construction, however long the other tests running beside keep the second job
#: pending on n1 (up to ``MEET_SECONDS``; past it the overlap assertion fails and says so).
HOLD = """import os, pathlib, time
print(f"worker rank={os.environ['RANK']} master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
meet = pathlib.Path(os.environ['MEET_DIR'])
(meet / os.environ['SLURM_JOB_ID']).touch()
deadline = time.monotonic() + float(os.environ['MEET_SECONDS'])
while len(list(meet.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
time.sleep(2)
"""
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
REMOVED = "TAO_SLURM: credentials file removed (SLURM will not run the job again)"
KEPT = "TAO_SLURM: credentials file kept for a rerun of the job"


def ended(ssh_run: SshRun, slurm_id: str) -> str:
    """The job's final state once accounting has one ('' while it lives)."""
    state = final_state(ssh_run, slurm_id)
    return state if state in ENDED else ""


def sacct_row(ssh_run: SshRun, slurm_id: str, fields: str) -> list[str]:
    """One job's ``sacct -X -P`` fields (empty until accounting has its row)."""
    _, out, _ = ssh_run(join(["sacct", "-X", "-n", "-P", "-j", slurm_id, "-o", fields, "--starttime=now-1days"]))
    lines = out.strip().splitlines()
    return lines[0].split("|") if lines else []


def test_two_single_node_torchrun_bundles_on_one_node_both_bind_their_rendezvous(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    program = f"{cluster.results_dir}/{dag_id}-hold.py"
    meet = f"{cluster.results_dir}/{dag_id}-meet"
    rc, _, err = ssh_run(
        f"mkdir -p -- {quote(cluster.results_dir)} {quote(meet)} && cat > {quote(program)}", stdin=HOLD
    )
    assert rc == 0, err
    execution = {
        "distributed": {"launcher": "torchrun"},  # one process per GPU: 1 here
        "environment": {"PATH": f"{TORCH_BIN}:/usr/local/bin:/usr/bin:/bin", "MEET_DIR": meet, "MEET_SECONDS": "240"},
    }
    try:
        runs = []
        for index in (1, 2):
            ctx = context(dag_id, f"bundle{index}", "r1")
            op = submit_op(
                image, program, task_id=f"bundle{index}", secret_env=None, execution=execution, exclude_nodes=["n2"]
            )
            runs.append((submit(op, ctx), ctx))
        results = [run_deferrable(sensor_for(handle), ctx) for handle, ctx in runs]
    finally:
        ssh_run(join(["rm", "-rf", "--", program, meet]))
    assert [result["terminal_state"] for result in results] == ["COMPLETE", "COMPLETE"]
    ports = []
    spans = []
    for handle, _ in runs:
        out = remote_text(ssh_run, f"{handle['log_dir']}/main.out")
        err = remote_text(ssh_run, f"{handle['log_dir']}/main.err")
        assert "EADDRINUSE" not in err, err[-3000:]
        announced = re.search(r"^TAO_SLURM: rendezvous 127\.0\.0\.1:(\d+), 1 GPUs$", out, re.MULTILINE)
        worker = re.search(r"^worker rank=0 master=127\.0\.0\.1:(\d+)$", out, re.MULTILINE)
        assert announced, out[-3000:]
        assert worker, out[-3000:]
        assert worker.group(1) == announced.group(1), "torchrun bound the port the script chose"
        ports.append(int(announced.group(1)))
        node, start, end = sacct_row(ssh_run, handle["slurm_job_id"], "NodeList,Start,End")
        assert node == "n1"
        spans.append((start, end))
    assert ports[0] != ports[1]
    (start1, end1), (start2, end2) = spans
    assert start1 < end2, f"the two jobs did not run at the same time: {spans}"
    assert start2 < end1, f"the two jobs did not run at the same time: {spans}"


@pytest.mark.parametrize(
    ("command", "state"),
    [
        pytest.param(f"{SHOW_SECRET}; sleep 1", "COMPLETED", id="success"),
        pytest.param(f"{SHOW_SECRET}; sleep 1; exit 3", "FAILED", id="program-failure"),
        pytest.param(f"{SHOW_SECRET}; sleep 120", "CANCELLED", id="cancelled"),
    ],
)
def test_an_unwatched_job_removes_its_sidecar_when_it_ends(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, secret_value: str, command: str, state: str
) -> None:
    """No sensor: the job's end alone removes the secret (a cancel too: SIGTERM, then the EXIT trap)."""
    handle = submit(submit_op(image, command), context(dag_id, "submit", "r1"))
    slurm_id = handle["slurm_job_id"]
    log = f"{handle['log_dir']}/main.out"
    if state == "CANCELLED":
        wait_until(lambda: "secret-digest=" in remote_text(ssh_run, log), "the job running with its secret", 90)
        assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "600"
        rc, _, err = ssh_run(join(["scancel", slurm_id]))
        assert rc == 0, err
    assert wait_until(lambda: ended(ssh_run, slurm_id), "the job's end in accounting", 120) == state
    out = remote_text(ssh_run, log)
    assert f"secret-digest={digest(secret_value)}" in out
    assert REMOVED in out.splitlines()
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


def test_a_requeued_run_keeps_the_sidecar_for_the_next_run_which_removes_it(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, secret_value: str
) -> None:
    rerun = f'{SHOW_SECRET}; if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then echo rerun; exit 0; fi; sleep 120'
    handle: dict[str, Any] = submit(submit_op(image, rerun, requeue=True), context(dag_id, "submit", "r1"))
    slurm_id = handle["slurm_job_id"]
    log = f"{handle['log_dir']}/main.out"
    wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "job running", timeout=90)
    ran_on = squeue_field(ssh_run, slurm_id, "%N")
    wait_until(lambda: "secret-digest=" in remote_text(ssh_run, log), "first run read the secret", 30)
    rc, _, err = ssh_run(join(["scontrol", "requeue", slurm_id]))
    assert rc == 0, err
    wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T") == "PENDING", "requeued (first run over)", 60)
    assert KEPT in remote_text(ssh_run, log).splitlines()
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "600"

    start_requeued_elsewhere(ssh_run, slurm_id, ran_on)
    wait_until(lambda: final_state(ssh_run, slurm_id) == "COMPLETED", "rerun completed", 120)
    lines = remote_text(ssh_run, log).splitlines()
    assert "rerun" in lines
    assert lines.count(f"secret-digest={digest(secret_value)}") == 2, "both runs had the secret"
    assert lines[-1] == REMOVED
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone"


# ---------------------------------------------------------------------- site container mounts (issue 42, item 4)


def test_the_sites_own_container_mounts_count_once_the_preflight_read_them(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness mounts /srv/lustre/datasets at /datasets in every container (Enroot's mounts.d on the nodes).

    On a results directory no preflight has cached anything in, a spec reading /datasets is refused, saying
    the site mounts are not known; after the preflight read them there, it is submitted without a
    container_mounts entry for it, and a path no mount shows is refused naming the site mounts counted.
    """
    from airflow.utils import timezone
    from clusterkit import connection_json

    from airflow_provider_tao_slurm.exceptions import ValidationError
    from airflow_provider_tao_slurm.operators.preflight import SlurmPreflightOperator

    results = f"{cluster.results_dir}/{dag_id}-site"
    rc, _, err = ssh_run(f"mkdir -p -m 700 -- {quote(results)}")
    assert rc == 0, err
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, extra={"results_dir": results}))
    site = f"{cluster.shared_dir}/datasets at /datasets"  # harness.py: ENROOT_SITE_MOUNTS
    dataset = {"dataset": {"train": "/datasets/coco/train"}}

    def op(spec: dict[str, Any]) -> Any:
        return submit_op(image, "true", spec=spec, secret_env={})

    with pytest.raises(ValidationError) as unknown:
        submit(op(dataset), context(dag_id, "unknown", "r1"))
    assert "- spec dataset.train /datasets/coco/train: no mount shows it" in str(unknown.value)
    assert "site's own container mounts (Enroot mounts.d) not known" in str(unknown.value)

    report = SlurmPreflightOperator(task_id="preflight", check_enroot=False).execute({})
    cache = f"{results}/.tao-slurm/site-mounts.json"
    assert report["checks"]["gpu_node"].endswith(f"; site mounts from /etc/enroot/mounts.d: {site} (cached in {cache})")

    handle = submit(op(dataset), context(dag_id, "counted", "r1"))
    try:
        assert handle["slurm_job_id"]
    finally:
        ssh_run(join(["scancel", handle["slurm_job_id"]]))

    with pytest.raises(ValidationError) as refused:
        submit(op({"dataset": {"train": "/nowhere/coco"}}), context(dag_id, "refused", "r1"))
    message = str(refused.value)
    assert "- spec dataset.train /nowhere/coco: no mount shows it" in message
    today = timezone.utcnow().date().isoformat()
    assert f"the site mounts {site} (site mounts read by the preflight on {today}; run SlurmPreflightOperator" in (
        message
    )


# ---------------------------------------------------------------------- the spec's datasets (issue 42, item 11)


def test_a_spec_naming_missing_data_is_refused_before_sbatch(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """No StageDatasetCheckOperator before it: a spec naming a dataset path that does not exist on shared storage
    is refused by the submit task itself, naming every missing path, before anything reaches SLURM (no job of its
    name, no GPU allocation); once the data is there, the same spec goes."""
    from airflow_provider_tao_slurm.exceptions import MissingPathsError

    base = f"{cluster.shared_dir}/datasets-{dag_id}"
    spec = {"dataset": {"train": f"{base}/coco/train", "val": f"{base}/coco/val"}}
    ssh_run(f"rm -rf -- {quote(base)}")
    with pytest.raises(MissingPathsError) as refused:
        submit(submit_op(image, "true", spec=spec, secret_env={}), context(dag_id, "missing", "r1"))
    assert refused.value.missing == [f"{base}/coco/train", f"{base}/coco/val"]
    message = str(refused.value)
    assert f"- spec dataset.train = {base}/coco/train" in message
    assert "Copy the data to shared storage" in message
    assert job_names(ssh_run, f"tao-{dag_id}.") == {}, "nothing reached SLURM"

    rc, _, err = ssh_run(f"mkdir -p -- {quote(base)}/coco/train {quote(base)}/coco/val")
    assert rc == 0, err
    try:
        handle = submit(submit_op(image, "true", spec=spec, secret_env={}), context(dag_id, "present", "r1"))
        assert job_names(ssh_run, f"tao-{dag_id}.") == {handle["slurm_job_id"]: handle["job_id"]}
        ssh_run(join(["scancel", handle["slurm_job_id"]]))
    finally:
        ssh_run(f"rm -rf -- {quote(base)}")
