"""Smoke tests of the local SLURM test cluster, all through ssh as the cluster user.

They pin what the provider relies on: partitions and nodes, GPU jobs and accounting, exact-name
lookup, multi-node srun, submit-time refusals, cancel records, the enroot and Pyxis stand-ins and the
fault sshd's ambiguous submission. Names carry a per-run token so reruns never see old jobs.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from deferral import wait_until

from airflow_provider_tao_slurm.core.shell import join, quote

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

TOKEN = uuid.uuid4().hex[:8]
ACTIVE_STATES = {"", "PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING"}
CONTAINER_OPTIONS = (
    "--container-mounts=/srv/lustre:/srv/lustre",
    "--container-workdir=/srv/lustre",
    f"--container-name=smoke_{TOKEN}",
    f"--container-save=/srv/lustre/containers/saved_{TOKEN}.sqsh",
    "--container-env=PATH",
    "--container-mount-home",
    "--no-container-mount-home",
    "--container-remap-root",
    "--no-container-remap-root",
    "--container-writable",
    "--container-readonly",
    "--container-entrypoint",
    "--no-container-entrypoint",
)


def submit(ssh_run: SshRun, *args: str) -> str:
    """Submit with ``sbatch --parsable`` and return the job id."""
    rc, out, err = ssh_run(join(["sbatch", "--parsable", *args]))
    assert rc == 0, err
    assert re.fullmatch(r"\d+", out.strip()), out
    return out.strip()


def final_state(ssh_run: SshRun, job_id: str, timeout: float = 30) -> str:
    """Return the job's final sacct state (sacct lags squeue by seconds, so poll)."""

    def probe() -> str | None:
        _, out, _ = ssh_run(f"sacct -j {quote(job_id)} -X -n -P -o State")
        state = out.strip()
        return None if state in ACTIVE_STATES else state

    return wait_until(probe, f"final sacct state of job {job_id}", timeout)


@dataclass(frozen=True)
class FinishedJob:
    """A batch job that ran to its end."""

    job_id: str
    name: str
    state: str
    output: str


@pytest.fixture(scope="module")
def run_dir(cluster: ClusterEnv, ssh_run: SshRun) -> Iterator[str]:
    """Return this run's directory for scripts and logs on the shared dir; remove it afterwards."""
    path = f"{cluster.results_dir}/smoke_{TOKEN}"
    assert ssh_run(join(["mkdir", "-p", path]))[0] == 0
    yield path
    ssh_run(join(["rm", "-rf", path]))


@pytest.fixture(scope="module")
def gpu_job(cluster: ClusterEnv, ssh_run: SshRun, run_dir: str) -> FinishedJob:
    """Run one single-GPU batch job on the GPU partition and wait for its final state."""
    name = f"smoke_gpu_{TOKEN}"
    log = f"{run_dir}/{name}.out"
    job_id = submit(
        ssh_run,
        "-J",
        name,
        "-p",
        cluster.gpu_partition,
        "--gres=gpu:1",
        "-o",
        log,
        "--wrap",
        "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES",
    )
    state = final_state(ssh_run, job_id)
    _, output, _ = ssh_run(join(["cat", log]))
    return FinishedJob(job_id, name, state, output)


@pytest.fixture(scope="module")
def sqsh_image(cluster: ClusterEnv, ssh_run: SshRun) -> Iterator[str]:
    """Import a stand-in image with enroot into the shared containers dir; remove it afterwards."""
    path = f"{cluster.containers_dir}/smoke_{TOKEN}.sqsh"
    rc, _, err = ssh_run(join(["enroot", "import", "-o", path, f"docker://nvcr.io#nvidia/smoke:{TOKEN}"]))
    assert rc == 0, err
    yield path
    ssh_run(join(["rm", "-f", path]))


@pytest.mark.alone
def test_sinfo_shows_partitions_with_idle_nodes(cluster: ClusterEnv, ssh_run: SshRun, wide_partition: str) -> None:
    def partitions() -> dict[str, dict[str, str]]:
        rc, out, err = ssh_run("sinfo -h -N -o '%P %N %T'")
        assert rc == 0, err
        seen: dict[str, dict[str, str]] = {}
        for line in out.splitlines():
            partition, node, state = line.split()
            seen.setdefault(partition, {})[node] = state
        return seen

    idle = dict.fromkeys(cluster.nodes, "idle")
    wanted = {
        f"{cluster.gpu_partition}*": idle,
        cluster.long_partition: idle,
        cluster.cpu_partition: dict.fromkeys(cluster.cpu_nodes, "idle"),
        cluster.down_partition: dict.fromkeys(cluster.cpu_nodes, "idle"),  # the partition is down, not its node
        cluster.debug_partition: idle,
        cluster.short_partition: idle,
        cluster.urgent_partition: idle,
        wide_partition: dict.fromkeys(cluster.wide_nodes, "idle"),
    }  # the hidden partition only with -a
    deadline = time.monotonic() + 20  # a job of an earlier run may still be finishing
    while (seen := partitions()) != wanted and time.monotonic() < deadline:
        time.sleep(0.5)
    assert seen == wanted


def test_a_second_site_shape_limits_features_typed_gpus_and_qos(
    cluster: ClusterEnv, ssh_run: SshRun, wide_partition: str
) -> None:
    """The cluster looks like another site: each partition's MaxTime in sinfo's every form (sub-hour ones as M:SS),
    a hidden partition, a CPU partition without GPUs, a partition of 16-GPU nodes beside the 4-GPU ones, node
    features, GPU types, the QOS."""
    rc, out, err = ssh_run("sinfo -a -h -o '%P %l %G'")
    assert rc == 0, err
    limits = {partition: (limit, gres) for partition, limit, gres in (line.split() for line in set(out.splitlines()))}
    assert {name: limit for name, (limit, _) in limits.items()} == {
        f"{cluster.gpu_partition}*": "4:00:00",
        cluster.long_partition: "2-00:00:00",
        cluster.cpu_partition: "7-00:00:00",
        cluster.down_partition: "7-00:00:00",
        cluster.debug_partition: "30:00",
        cluster.short_partition: "1:00",
        cluster.hidden_partition: "1-00:00:00",
        cluster.urgent_partition: "1:00:00",
        wide_partition: "4:00:00",
    }
    assert limits[cluster.cpu_partition][1] == "(null)"
    (wide_node,) = cluster.wide_nodes
    assert limits[wide_partition][1] == f"gpu:{cluster.gpu_types[wide_node]}:{cluster.wide_gpus_per_node}"
    rc, out, err = ssh_run("sinfo -h -o '%P'")
    assert cluster.hidden_partition not in out.split(), "hidden from a plain sinfo"
    rc, out, err = ssh_run("sinfo -h -N -p " + cluster.gpu_partition + " -o '%N %f %G'")
    assert rc == 0, err
    nodes = {node: (features, gres) for node, features, gres in (line.split() for line in out.splitlines())}
    assert nodes == {
        node: (",".join(cluster.node_features[node]), f"gpu:{cluster.gpu_types[node]}:{cluster.gpus_per_node}")
        for node in cluster.nodes
    }
    rc, out, err = ssh_run(f"sacctmgr -n -P show assoc where user={cluster.user} format=qos")
    assert rc == 0, err
    assert cluster.qos in out.strip().split(",")


def test_gpu_batch_job_completes_with_a_gpu(ssh_run: SshRun, gpu_job: FinishedJob) -> None:
    assert gpu_job.state == "COMPLETED"
    assert re.fullmatch(r"CUDA_VISIBLE_DEVICES=\d\n", gpu_job.output)
    _, tres, _ = ssh_run(f"sacct -j {gpu_job.job_id} -X -n -P -o AllocTRES")
    assert "gres/gpu=1" in tres


def test_lookup_by_exact_name_only(ssh_run: SshRun, gpu_job: FinishedJob) -> None:
    def lookup(name: str) -> str:
        _, out, _ = ssh_run(join(["sacct", "-S", "now-1hours", f"--name={name}", "-X", "-n", "-P", "-o", "JobID"]))
        return out.strip()

    assert wait_until(lambda: lookup(gpu_job.name), f"sacct --name={gpu_job.name}") == gpu_job.job_id
    assert lookup(gpu_job.name[:-3]) == ""


def test_srun_on_two_nodes_prints_two_hostnames(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    rc, out, err = ssh_run(f"srun -N2 -n2 -l -p {cluster.gpu_partition} --input=none hostname")
    assert rc == 0, err
    hosts = {line.split(": ", 1)[1] for line in out.splitlines()}
    assert hosts == set(cluster.nodes)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-p", "polar", "--time=05:00:00"],
            "Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
        ),
        (
            ["-A", "nosuchacct"],
            "Batch job submission failed: Invalid account or account/partition combination specified",
        ),
    ],
    ids=["time-over-partition-limit", "unknown-account"],
)
def test_submission_is_refused(ssh_run: SshRun, args: list[str], message: str) -> None:
    rc, out, err = ssh_run(join(["sbatch", "--parsable", *args, "--wrap", "true"]))
    assert (rc, out) == (1, "")
    assert message in err


def test_scancel_is_recorded_with_the_uid(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    job_id = submit(
        ssh_run, "-J", f"smoke_cancel_{TOKEN}", "-p", cluster.cpu_partition, "-o", "/dev/null", "--wrap", "sleep 120"
    )
    wait_until(lambda: ssh_run(f"squeue -j {job_id} -h -o %T")[1].strip() == "RUNNING", f"job {job_id} RUNNING")
    assert ssh_run(f"scancel {job_id}")[0] == 0
    assert final_state(ssh_run, job_id) == f"CANCELLED by {cluster.uid}"


def test_enroot_import_writes_a_squashfs(cluster: ClusterEnv, ssh_run: SshRun, sqsh_image: str) -> None:
    rc, magic, err = ssh_run(join(["head", "-c", "4", sqsh_image]))
    assert (rc, magic) == (0, "hsqs"), err
    evidence = Path(cluster.enroot_imports_log).read_text().splitlines()
    assert any(line.endswith(f"\t-\tdocker://nvcr.io#nvidia/smoke:{TOKEN}") for line in evidence)


@pytest.mark.parametrize(
    ("image", "existing_output", "message"),
    [
        (
            f"docker://nvcr.io#nvidia/nonexistent_{TOKEN}:1.0",
            False,
            f"[ERROR] URL https://nvcr.io/v2/nvidia/nonexistent_{TOKEN}/manifests/1.0 returned error code: "
            "404 Not Found",
        ),
        (f"docker://nvcr.io#nvidia/smoke:{TOKEN}", True, "[ERROR] File already exists: "),
    ],
    ids=["registry-404", "output-exists"],
)
def test_enroot_import_failures(
    cluster: ClusterEnv, ssh_run: SshRun, sqsh_image: str, image: str, existing_output: bool, message: str
) -> None:
    output = sqsh_image if existing_output else f"{cluster.containers_dir}/missing_{TOKEN}.sqsh"
    rc, _, err = ssh_run(join(["enroot", "import", "-o", output, image]))
    assert rc == 1
    assert message in err
    assert ssh_run(join(["test", "-e", output]))[0] == (0 if existing_output else 1)


@pytest.mark.parametrize(
    "command",
    [["srun", "-p", "cpu_long", "--input=none"], ["sbatch", "--test-only", "--wrap", "true"]],
    ids=["srun", "sbatch"],
)
def test_container_options_are_accepted(ssh_run: SshRun, sqsh_image: str, command: list[str]) -> None:
    tail = ["true"] if command[0] == "srun" else []
    rc, _, err = ssh_run(join([*command, f"--container-image={sqsh_image}", *CONTAINER_OPTIONS, *tail]))
    assert rc == 0, err
    assert "unrecognized option" not in err


def test_srun_with_sqsh_image_exports_pyxis_variables(cluster: ClusterEnv, ssh_run: SshRun, sqsh_image: str) -> None:
    script = 'echo "$PYXIS_CONTAINER_IMAGE|$PYXIS_CONTAINER_MOUNTS|$PYXIS_CONTAINER_NAME|$PWD"'
    rc, out, err = ssh_run(
        join(
            [
                "srun",
                "-p",
                cluster.cpu_partition,
                "--input=none",
                f"--container-image={sqsh_image}",
                "--container-mounts=/srv/lustre:/srv/lustre",
                "--no-container-mount-home",
                "--container-workdir=/srv/lustre",
                "--container-name=smoke",
                "bash",
                "-c",
                script,
            ]
        )
    )
    assert rc == 0, err
    assert out == f"{sqsh_image}|/srv/lustre:/srv/lustre|smoke|/srv/lustre\n"


def test_sbatch_script_with_container_options(ssh_run: SshRun, sqsh_image: str, run_dir: str) -> None:
    name = f"smoke_pyxis_{TOKEN}"
    script_path = f"{run_dir}/{name}.sbatch"
    log = f"{run_dir}/{name}.out"
    script = "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name={name}",
            f"#SBATCH --output={log}",
            "#SBATCH --gres=gpu:1",
            f"#SBATCH --container-image={sqsh_image}",
            "#SBATCH --container-mounts=/srv/lustre:/srv/lustre",
            "#SBATCH --no-container-mount-home",
            'echo "batch $PYXIS_CONTAINER_IMAGE"',
            f"srun --input=none --container-image={sqsh_image} --container-mounts=/srv/lustre:/srv/lustre "
            "--no-container-mount-home bash -c 'echo \"step $PYXIS_CONTAINER_IMAGE $PYXIS_CONTAINER_MOUNTS\"'",
        ]
    )
    assert ssh_run(f"cat > {quote(script_path)}", stdin=script + "\n")[0] == 0
    job_id = submit(ssh_run, script_path)
    assert final_state(ssh_run, job_id) == "COMPLETED"
    assert ssh_run(join(["cat", log]))[1] == f"batch {sqsh_image}\nstep {sqsh_image} /srv/lustre:/srv/lustre\n"


@pytest.mark.parametrize(
    ("setup", "options", "message"),
    [
        (
            "true",
            ["--container-image=/srv/lustre/containers/absent_{token}.sqsh"],
            "pyxis: [ERROR] No such file or directory: /srv/lustre/containers/absent_{token}.sqsh",
        ),
        (
            "printf 'not squashfs' > /srv/lustre/containers/text_{token}.sqsh",
            ["--container-image=/srv/lustre/containers/text_{token}.sqsh"],
            "pyxis: [ERROR] Invalid image format: /srv/lustre/containers/text_{token}.sqsh (not a squashfs file)",
        ),
        (
            "true",
            ["--container-image={image}", "--container-mounts=/srv/lustre/absent_{token}:/data"],
            "pyxis: [ERROR] No such file or directory: /srv/lustre/absent_{token} (container mount source)",
        ),
    ],
    ids=["missing-image", "not-squashfs", "missing-mount-source"],
)
def test_bad_container_fails_the_step(
    cluster: ClusterEnv, ssh_run: SshRun, sqsh_image: str, setup: str, options: list[str], message: str
) -> None:
    values = {"token": TOKEN, "image": sqsh_image}
    srun = join(["srun", "-p", cluster.cpu_partition, "--input=none", *(o.format(**values) for o in options), "true"])
    rc, _, err = ssh_run(f"{setup.format(**values)} && {srun}")
    ssh_run(join(["rm", "-f", f"{cluster.containers_dir}/text_{TOKEN}.sqsh"]))
    assert rc == 1
    assert message.format(**values) in err
    assert "task 0: Exited with exit code 1" in err


def test_registry_image_in_a_gpu_job_leaves_evidence(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    image = f"nvcr.io#nvidia/registry_smoke:{TOKEN}"
    rc, out, err = ssh_run(
        join(
            [
                "srun",
                "-p",
                cluster.gpu_partition,
                "--gres=gpu:1",
                "--input=none",
                f"--container-image={image}",
                "bash",
                "-c",
                "echo $SLURM_JOB_ID $(hostname)",
            ]
        )
    )
    assert rc == 0, err
    job_id, node = out.split()
    records = [line.split("\t")[1:] for line in Path(cluster.pyxis_registry_log).read_text().splitlines()]
    assert [job_id, "0", node, image] in records


def test_fault_sshd_submits_but_cuts_the_reply(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    rc, out, _ = ssh_run("command -v sbatch", port=cluster.fault_port)
    assert (rc, out) == (0, f"{cluster.state_dir}/faultbin/sbatch\n")
    name = f"smoke_fault_{TOKEN}"
    rc, out, _ = ssh_run(
        join(["sbatch", "--parsable", "-J", name, "-p", cluster.cpu_partition, "-o", "/dev/null", "--wrap", "sleep 1"]),
        port=cluster.fault_port,
    )
    assert (rc, out) == (255, "")
    found = wait_until(
        lambda: ssh_run(join(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i"]))[1].split(),
        f"job named {name} in squeue",
    )
    assert len(found) == 1
    replies = [line.split("\t")[1:] for line in Path(cluster.fault_sbatch_log).read_text().splitlines()]
    assert ["0", found[0]] in replies
