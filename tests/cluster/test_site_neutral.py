"""Right on any site (issue 15), proven on the real test cluster.

The test cluster is set up like a second site: a default 4-hour GPU partition ``polar``, a 48-hour
partition ``polar_long`` over the same nodes, node features (n1 ``a100,ib``, n2 ``h100,ib``), a QOS
``long_qos``, typed GPUs (n1 ``a100``, n2 ``h100``), a partition ``polar_16g`` of one 16-GPU node (n4)
beside the 4-GPU ones, and reservations the tests make as an admin would. Nothing in the provider knows any
of these names: every limit and default is read from the cluster.
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import time
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import (
    as_other,
    conn,
    connection_json,
    dag_id,
    image,
    record_of,
    remote_text,
    secret_value,
    sensor_for,
    submit,
    submit_op,
)
from deferral import context, defer, first_event, resume, run_async, wait_until

from airflow_provider_tao_slurm.core.partitions import NodeShape, Partition
from airflow_provider_tao_slurm.core.shell import join
from airflow_provider_tao_slurm.exceptions import JobFailedError, ResourceError, ValidationError
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["conn", "dag_id", "image", "secret_value"]


def sacct_fields(ssh_run: SshRun, slurm_id: str, fields: str) -> list[str]:
    """``sacct -X -n -P -o FIELDS`` of one job, split on ``|``; waits (up to 2 minutes: slurmdbd lags behind a
    busy suite) until the row is complete."""
    command = join(["sacct", "-X", "-n", "-P", "-j", slurm_id, "-o", fields, "--starttime=now-1days"])
    deadline = time.monotonic() + 120
    while True:  # right after a short job sacct may still show a placeholder row (no partition, QOS Unknown)
        _, out, _ = ssh_run(command)
        row = out.strip().splitlines()[0].split("|") if out.strip() else []
        if (row and "" not in row and "Unknown" not in row) or time.monotonic() > deadline:
            return row
        time.sleep(1)


def run_to_end(handle: dict[str, Any], ctx: dict[str, Any], **sensor_kwargs: Any) -> Any:
    """Watch the job with the sensor until it is settled; the sensor's return value."""
    sensor = sensor_for(handle, **sensor_kwargs)
    deferred = defer(sensor, ctx)
    return resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 180)))


def test_the_partitions_own_limit_is_read_from_the_cluster(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """A 5-hour job on the 4-hour partition, a 10-hour job on the 48-hour partition, a 49-hour one there.
    Expected: the first and third are refused before anything is staged, naming the partition and its limit
    (read from sinfo, not built in); the second is submitted with its 10-hour limit."""
    staged = f"ls {cluster.results_dir}/jobs | grep -c -F -- {dag_id} || true"
    _, before, _ = ssh_run(staged)
    with pytest.raises(ResourceError, match=r"partition polar allows at most 4 h, but time_hours=5") as short:
        submit(submit_op(image, "sleep 1", time_hours=5, timeout_hours=4.5), context(dag_id, "submit", "r1"))
    assert cluster.long_partition in str(short.value)  # names the partition that would allow it
    with pytest.raises(ResourceError, match=rf"partition {cluster.long_partition} allows at most 2 d"):
        submit(
            submit_op(image, "sleep 1", partition=cluster.long_partition, time_hours=49, timeout_hours=48),
            context(dag_id, "submit", "r2"),
        )
    _, after, _ = ssh_run(staged)
    assert after == before, "a refused job stages nothing"

    ctx = context(dag_id, "submit", "r3")
    handle = submit(
        submit_op(image, "sleep 1", partition=cluster.long_partition, time_hours=10, timeout_hours=9.5), ctx
    )
    assert run_to_end(handle, ctx)["terminal_state"] == "COMPLETE"
    partition, limit = sacct_fields(ssh_run, handle["slurm_job_id"], "Partition,Timelimit")
    assert (partition, limit) == (cluster.long_partition, "10:00:00")


def test_without_a_partition_the_clusters_default_is_used(
    image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection names no partition and no conversion partition. Expected: the job goes to the cluster's
    default partition (``polar``, marked ``*`` by sinfo), checked against its 4-hour limit."""
    conn_json = json.loads(connection_json(cluster))
    conn_json["extra"].pop("partition", None)
    conn_json["extra"].pop("conversion_partition", None)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", json.dumps(conn_json))
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 1", secret_env=None), ctx)
    assert handle["partition"] == cluster.gpu_partition
    assert sacct_fields(ssh_run, handle["slurm_job_id"], "Partition") == [cluster.gpu_partition]
    with pytest.raises(ResourceError, match=rf"partition {cluster.gpu_partition} allows at most 4 h"):
        submit(submit_op(image, "sleep 1", secret_env=None, time_hours=6, timeout_hours=5), context(dag_id, "s", "r2"))


def test_site_options_reach_sbatch_and_show_in_accounting(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """A job with the site's QOS on the long partition, a node-feature constraint only n2 has, and free
    sbatch options (a comment, a mail type). Expected: sacct shows the QOS and partition, the job ran on n2,
    the comment is the job's, and the #SBATCH lines are in the staged script."""
    ctx = context(dag_id, "submit", "r1")
    feature = "h100" if "h100" in cluster.node_features.get("n2", []) else cluster.node_features["n2"][0]
    op = submit_op(
        image,
        "sleep 1",
        partition=cluster.long_partition,
        qos=cluster.qos,
        constraint=feature,
        time_hours=6,
        timeout_hours=5.5,
        sbatch_options={"comment": "run-42", "mail-type": "NONE"},
        gpu_type=cluster.gpu_types.get("n2") or None,
    )
    handle = submit(op, ctx)
    script = remote_text(ssh_run, handle["script_path"])
    for line in (f"#SBATCH --qos={cluster.qos}", f"#SBATCH --constraint={feature}", "#SBATCH --comment=run-42"):
        assert f"{line}\n" in script
    _, comment, _ = ssh_run(join(["squeue", "-h", "-t", "all", "-j", handle["slurm_job_id"], "-o", "%k"]))
    assert comment.strip() in ("run-42", "")  # squeue forgets finished jobs after MinJobAge
    result = run_to_end(handle, ctx)
    assert result["terminal_state"] == "COMPLETE"
    qos, partition, nodes = sacct_fields(ssh_run, handle["slurm_job_id"], "QOS,Partition,NodeList")
    assert (qos, partition, nodes) == (cluster.qos, cluster.long_partition, "n2")


def test_options_the_provider_owns_are_refused_before_anything_is_staged(conn: str, image: str, dag_id: str) -> None:
    """sbatch_options that would break isolation or accounting, a QOS with a space, a literal secret."""
    for kwargs, message in (
        ({"sbatch_options": {"uid": "0"}}, "may not set --uid"),
        ({"sbatch_options": {"output": "/etc/passwd"}}, "may not set --output"),
        ({"sbatch_options": {"export": "ALL"}}, "may not set --export"),
        ({"sbatch_options": {"-J": "x"}}, "not a long option name"),
        ({"qos": "long qos"}, "no spaces"),
        ({"secret_env": {"TOKEN": "plain-text-secret"}}, "holds a literal value"),
        ({"gpus_per_node": 2}, "hangs happen inside a node too"),
    ):
        with pytest.raises(ValidationError, match=re.escape(message)):
            submit(submit_op(image, "sleep 1", **kwargs), context(dag_id, "submit", "r1"))


def test_two_multi_node_jobs_sharing_a_master_node_use_different_ports(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    """Two 2-node jobs (one GPU per node, shared nodes) run at the same time, so both have n1 as master.
    Expected: each gets a MASTER_PORT its batch script found free on n1 when it started, and they differ."""
    handles = [
        submit(
            submit_op(image, "sleep 3", num_nodes=2, nccl_env={}),
            context(dag_id, "submit", f"r{index}"),
        )
        for index in (1, 2)
    ]
    ports = []
    for index, handle in enumerate(handles, start=1):
        run_to_end(handle, context(dag_id, "submit", f"r{index}"))
        out = remote_text(ssh_run, f"{handle['log_dir']}/main.out")
        found = re.search(r"TAO_SLURM: rendezvous (\S+):(\d+),", out)
        assert found, out[-2000:]
        assert 1024 <= int(found.group(2)) <= 65535
        ports.append((found.group(1), int(found.group(2))))
    assert ports[0][1] != ports[1][1]


def test_a_tao_job_is_complete_only_when_status_json_says_success(
    conn: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    """Three TAO jobs exit 0: two with network_arch classification_pyt, one writing status.json SUCCESS, one
    writing none, and one that names no network_arch but runs a TAO image (a .sqsh with the cache name of
    nvcr.io/nvidia/tao/tao-toolkit) and writes none either. Expected: the first is COMPLETE; the other two are
    ERROR (ERR_PROGRAM) saying status.json is missing, the last one's record says network_arch 'tao' and its
    error says how a plain program opts out."""
    ok_ctx = context(dag_id, "submit", "r1")
    write_success = (
        "mkdir -p {results_dir} && "
        """echo '{"status": "SUCCESS", "message": "done"}' > {results_dir}/status.json"""
    )
    ok = submit(submit_op(image, write_success, network_arch="classification_pyt"), ok_ctx)
    assert run_to_end(ok, ok_ctx)["terminal_state"] == "COMPLETE"

    bad_ctx = context(dag_id, "submit", "r2")
    bad = submit(submit_op(image, "echo trained", network_arch="classification_pyt"), bad_ctx)
    with pytest.raises(JobFailedError, match=r"status\.json is missing"):
        run_to_end(bad, bad_ctx)
    record = record_of(ssh_run, bad["record_path"])
    assert (record["terminal_state"], record["err_class"]) == ("ERROR", "ERR_PROGRAM")

    tao_image = f"{posixpath.dirname(image)}/nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt-rl.sqsh"
    ssh_run(join(["ln", "-sfn", "--", posixpath.basename(image), tao_image]))
    default_ctx = context(dag_id, "submit", "r3")
    default = submit(submit_op(tao_image, "echo trained"), default_ctx)
    with pytest.raises(JobFailedError, match=r"(?s)status\.json is missing.*network_arch='custom'"):
        run_to_end(default, default_ctx)
    record = record_of(ssh_run, default["record_path"])
    assert (record["network_arch"], record["terminal_state"], record["err_class"]) == ("tao", "ERROR", "ERR_PROGRAM")


@pytest.mark.alone
def test_a_reservation_reaches_the_job(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """An admin reserved n2 for the cluster user (created here as root, as a site admin would). Expected: the
    job asks for it with ``#SBATCH --reservation``, the scheduler runs it in that reservation (``squeue %v``
    while it runs; sacct's Reservation column is filled only once slurmdbd has the reservation's row, which a
    busy or restarted slurmdbd delays), on n2."""
    name = f"rl_{dag_id[-10:]}"
    create = [
        "scontrol", "create", "reservation", f"ReservationName={name}", f"Users={cluster.user}",
        "Nodes=n2", "StartTime=now", "Duration=00:10:00", "Flags=IGNORE_JOBS",
    ]  # fmt: skip
    subprocess.run(create, check=True, capture_output=True, text=True, timeout=30)
    try:
        ctx = context(dag_id, "submit", "r1")
        handle = submit(submit_op(image, "sleep 6", reservation=name), ctx)
        assert f"#SBATCH --reservation={name}\n" in remote_text(ssh_run, handle["script_path"])
        query = join(["squeue", "-h", "-j", handle["slurm_job_id"], "-o", "%v|%T"])
        seen = wait_until(
            lambda: (out := ssh_run(query)[1].strip()) and out.endswith("|RUNNING") and out,
            "the job running in its reservation",
            timeout=60,
        )
        assert seen == f"{name}|RUNNING"
        assert run_to_end(handle, ctx)["terminal_state"] == "COMPLETE"
        assert sacct_fields(ssh_run, handle["slurm_job_id"], "NodeList") == ["n2"]
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName={name}"], check=False, timeout=30)


def test_total_gpus_derives_the_layout(conn: str, image: str, dag_id: str, ssh_run: SshRun) -> None:
    """``total_gpus=2`` with the layout parameters left at the operator's defaults (NCCL environment given).
    Expected: the core's TAO rule (up to 8 GPUs on one node) makes it one node with two GPUs, not the default
    four; accounting shows two GPUs on one node."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 1", gpus_per_node=4, total_gpus=2, nccl_env={}), ctx)
    assert "#SBATCH --gres=gpu:2\n" in remote_text(ssh_run, handle["script_path"])
    assert run_to_end(handle, ctx)["terminal_state"] == "COMPLETE"
    nnodes, tres = sacct_fields(ssh_run, handle["slurm_job_id"], "NNodes,AllocTRES")
    assert nnodes == "1"
    assert "gres/gpu=2" in tres.split(","), tres


def test_the_clusters_partitions_are_read_in_every_form_sinfo_prints(
    conn: str, cluster: ClusterEnv, wide_partition: str
) -> None:
    """The cluster has a 30-minute debug partition (sinfo prints ``30:00``), a one-minute one (``1:00``), a hidden
    one, a CPU partition whose node has no GPUs and a partition of one 16-GPU node; three have a one-hour
    ``DefaultTime``. Expected: every partition is read with its limit, default limit and node shape; none of them
    makes the others unreadable."""
    hook = SlurmHook()
    try:
        partitions = {p.name: p for p in hook.partition_limits(fresh=True)}
    finally:
        hook.close()
    both = ("a100", "h100")
    gpu = {"shapes": (NodeShape(4, 8, 8192),)}  # both GPU nodes: 8 CPUs, 8192 MB
    cpu = {"shapes": (NodeShape(0, 8, 8192),)}
    (wide_node,) = cluster.wide_nodes
    wide = {"shapes": (NodeShape(cluster.wide_gpus_per_node, 16, 16384),)}  # the 16-GPU node: 16 CPUs, 16384 MB
    assert partitions == {
        cluster.gpu_partition: Partition(cluster.gpu_partition, 4.0, True, 4, both, **gpu, default_time_hours=1.0),
        cluster.long_partition: Partition(cluster.long_partition, 48.0, False, 4, both, **gpu, default_time_hours=1.0),
        cluster.down_partition: Partition(cluster.down_partition, 168.0, state="down", **cpu),
        cluster.cpu_partition: Partition(cluster.cpu_partition, 168.0, **cpu, default_time_hours=1.0),
        cluster.debug_partition: Partition(cluster.debug_partition, 0.5, False, 4, both, **gpu),
        cluster.short_partition: Partition(cluster.short_partition, 1 / 60, False, 4, both, **gpu),
        cluster.hidden_partition: Partition(cluster.hidden_partition, 24.0, False, 4, both, **gpu),
        cluster.urgent_partition: Partition(cluster.urgent_partition, 1.0, False, 4, both, **gpu),
        wide_partition: Partition(
            wide_partition, 4.0, False, cluster.wide_gpus_per_node, (cluster.gpu_types[wide_node],), **wide
        ),
    }


def test_jobs_run_on_a_sub_hour_partition_and_a_hidden_one(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """A 6-minute job on the 30-minute debug partition, one on the hidden partition, and a 1-hour job on the debug
    partition. Expected: the first two run to COMPLETE on their partitions (a hidden partition is no "does not
    exist"); the third is refused before anything is staged, naming the 30-minute limit."""
    handles = {}
    for run, partition in (("r1", cluster.debug_partition), ("r2", cluster.hidden_partition)):
        ctx = context(dag_id, "submit", run)
        handles[partition] = submit(submit_op(image, "sleep 1", partition=partition), ctx)
        assert run_to_end(handles[partition], ctx)["terminal_state"] == "COMPLETE"
    for partition, handle in handles.items():
        assert sacct_fields(ssh_run, handle["slurm_job_id"], "Partition,Timelimit") == [partition, "00:06:00"]
    with pytest.raises(ResourceError, match=rf"partition {cluster.debug_partition} allows at most 30 min"):
        submit(
            submit_op(image, "sleep 1", partition=cluster.debug_partition, time_hours=1, timeout_hours=0.9),
            context(dag_id, "submit", "r3"),
        )


def test_total_gpus_is_laid_out_on_the_clusters_four_gpu_nodes(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv
) -> None:
    """``total_gpus=8`` on a partition of 4-GPU nodes, and ``gpus_per_node=8`` there. Expected: the first runs as
    two nodes x four GPUs (the seed's 8-GPU layout could not start here); the second is refused before anything is
    staged, naming the partition's node shape."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 1", gpus_per_node=4, total_gpus=8, nccl_env={}), ctx)
    assert run_to_end(handle, ctx)["terminal_state"] == "COMPLETE"
    nnodes, tres = sacct_fields(ssh_run, handle["slurm_job_id"], "NNodes,AllocTRES")
    assert (nnodes, "gres/gpu=8" in tres.split(",")) == ("2", True), tres
    with pytest.raises(ResourceError, match=rf"gpus_per_node=8 cannot start on {cluster.gpu_partition} \(4 h, 4 GPUs"):
        submit(submit_op(image, "sleep 1", gpus_per_node=8, nccl_env={}), context(dag_id, "submit", "r2"))


@pytest.mark.slow
def test_whole_node_follows_the_sixteen_gpu_node_shape(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, cluster: ClusterEnv, wide_partition: str
) -> None:
    """On the partition of the one 16-GPU node (n4): another tenant's 8-GPU job runs there, then the provider's
    8-GPU job (``gpus_per_node=8``) is submitted; the other tenant's job is cancelled and a 16-GPU job
    (``gpus_per_node=16``) follows, and while it runs the other tenant submits a one-CPU job without GPUs there.
    Expected: the 8-GPU job's script has no ``#SBATCH --exclusive``, it runs on n4 beside the other tenant's job
    (squeue shows both RUNNING there at once) and holds one CPU; the 16-GPU job's script has ``#SBATCH
    --exclusive``, it runs alone on n4 holding all 16 CPUs, and the other tenant's job stays PENDING while it runs.
    Afterwards ``gpus_per_node=16`` on the 4-GPU default partition is refused naming the 16-GPU partition."""
    (node,) = cluster.wide_nodes
    theirs: list[str] = []

    def their_job(*options: str) -> str:
        argv = [
            "sbatch", "--parsable", f"--partition={wide_partition}", "--time=2",
            f"--output={cluster.other_dir}/wide-%j.out", *options,
        ]  # fmt: skip
        rc, out, err = as_other(cluster, join(argv))
        assert rc == 0, err
        theirs.append(out.strip().split(";")[0])
        return theirs[-1]

    def queue(*slurm_ids: str) -> dict[str, str]:
        """``{job id: "STATE|nodes|reason"}`` of the jobs, from one squeue answer (all at the same instant)."""
        _, out, _ = ssh_run(join(["squeue", "-h", "-j", ",".join(slurm_ids), "-o", "%i|%T|%N|%r"]))
        return {job: rest for job, _, rest in (line.partition("|") for line in out.split())}

    running = f"RUNNING|{node}|None"
    try:
        neighbour = their_job("--gres=gpu:8", "--wrap=sleep 120")
        wait_until(lambda: queue(neighbour) == {neighbour: running}, "the other tenant's 8-GPU job on n4")
        ctx = context(dag_id, "submit", "r1")
        shared = submit(submit_op(image, "sleep 10", partition=wide_partition, gpus_per_node=8, nccl_env={}), ctx)
        script = remote_text(ssh_run, shared["script_path"])
        assert "#SBATCH --gres=gpu:8\n" in script
        assert "#SBATCH --exclusive" not in script
        both = {neighbour: running, shared["slurm_job_id"]: running}
        wait_until(lambda: queue(*both) == both, "both 8-GPU jobs running on n4 at once")
        assert run_to_end(shared, ctx)["terminal_state"] == "COMPLETE"
        nodes, cpus, tres = sacct_fields(ssh_run, shared["slurm_job_id"], "NodeList,AllocCPUS,AllocTRES")
        assert (nodes, cpus, "gres/gpu=8" in tres.split(",")) == (node, "1", True), tres
        assert as_other(cluster, join(["scancel", neighbour]))[0] == 0

        ctx = context(dag_id, "submit", "r2")
        whole = submit(submit_op(image, "sleep 20", partition=wide_partition, gpus_per_node=16, nccl_env={}), ctx)
        assert "#SBATCH --exclusive\n" in remote_text(ssh_run, whole["script_path"])
        wait_until(lambda: queue(whole["slurm_job_id"]) == {whole["slurm_job_id"]: running}, "the 16-GPU job on n4")
        # Beside a job that shares n4 it would start at once: 15 CPUs and 15 GB are free there.
        waiting = their_job("--wrap=sleep 1")
        alone = {whole["slurm_job_id"]: running, waiting: "PENDING||Resources"}
        wait_until(lambda: queue(*alone) == alone, "the other tenant's job held back (Resources) by the 16-GPU job")
        assert run_to_end(whole, ctx)["terminal_state"] == "COMPLETE"
        nodes, cpus, tres = sacct_fields(ssh_run, whole["slurm_job_id"], "NodeList,AllocCPUS,AllocTRES")
        assert (nodes, cpus, "gres/gpu=16" in tres.split(",")) == (node, "16", True), tres
    finally:
        if theirs:
            as_other(cluster, join(["scancel", *theirs]))
    with pytest.raises(ResourceError, match=rf"or pick a partition with larger nodes: {wide_partition} \(4 h, 16 GPUs"):
        submit(submit_op(image, "sleep 1", gpus_per_node=16, nccl_env={}), context(dag_id, "submit", "r3"))


def test_the_conversion_partition_passes_over_a_down_one(
    conn: str, cluster: ClusterEnv, capfd: pytest.CaptureFixture[str]
) -> None:
    """The cluster has a DOWN CPU partition (``cpu_down``) ahead of the usable one (``cpu_long``) in sinfo's order.
    Expected: with no conversion partition configured the conversion goes to ``cpu_long`` and the log names
    ``cpu_down`` as passed over, DOWN; ``cpu_down`` configured is refused with its state."""
    from airflow_provider_tao_slurm.lifecycle.support import partitions_for

    hook = SlurmHook()
    try:
        chosen = partitions_for(hook, None, 2.0, cpu_only=True)
        assert chosen == (cluster.cpu_partition,)
        assert f"passed over: {cluster.down_partition}: it is DOWN" in "".join(capfd.readouterr())
        with pytest.raises(ResourceError, match=rf"the conversion partition {cluster.down_partition} is DOWN"):
            partitions_for(hook, cluster.down_partition, 2.0, cpu_only=True)
    finally:
        hook.close()


def test_cpus_per_task_come_from_the_node_shape(conn: str, image: str, dag_id: str, ssh_run: SshRun) -> None:
    """The GPU nodes have 8 CPUs and 4 GPUs. Expected: cpus_per_task=16 is refused before sbatch, naming the 8
    CPUs and the fix; a job that leaves cpus_per_task out gets its GPUs' share of the node (1 GPU: 2 CPUs)."""
    from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator

    def job(**cpus: int) -> SbatchSubmitOperator:
        return SbatchSubmitOperator(
            task_id="submit", image=image, command="sleep 1", gpus_per_node=1, time_hours=0.1, timeout_hours=0.05,
            **cpus,
        )  # fmt: skip

    with pytest.raises(ResourceError, match=r"cpus_per_task=16 \(one task per node\) is more than the 8 CPUs") as err:
        submit(job(cpus_per_task=16), context(dag_id, "submit", "r1"))
    assert "BadConstraints" in str(err.value)
    assert "leave cpus_per_task out (2 from the node shape)" in str(err.value)
    handle = submit(job(), context(dag_id, "submit", "r2"))
    rc, out, err = ssh_run(join(["scontrol", "show", "job", "-o", handle["slurm_job_id"]]))
    assert rc == 0, err
    assert " CPUs/Task=2 " in f" {out} "
