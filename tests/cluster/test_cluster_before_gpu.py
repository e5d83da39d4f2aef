"""Before the GPU, on the local SLURM test cluster: preflight, dataset check and image import.

Deferrable operators run without a scheduler: ``execute`` raises ``TaskDeferred``; the trigger is
rebuilt from its ``serialize()`` output (as the triggerer does) and run until its first event in one
background event loop shared by the whole module (like one triggerer process); then
``execute_complete`` gets the event. Image names carry a per-run token, so reruns never hit an old
cache file; the files, locks, scripts and logs of this module are removed at the end. The Enroot
stand-in's pull delay is set to 1 s for the module (restored afterwards).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from clusterkit import Triggerer, connection_json, harness, require_alone
from deferral import wait_until

from airflow_provider_tao_slurm.core.images import parse_image, sqsh_cache_name
from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.exceptions import (
    ImageConversionError,
    ImageReferenceError,
    MissingPathsError,
    PreflightError,
    StoragePathError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.preflight import SlurmPreflightOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("slurm_connection_env")]

TOKEN = uuid.uuid4().hex[:8]
CANARY = f"/tmp/tao-canary-{TOKEN}"
REGISTRY_SECRET = f"robot-key-{TOKEN}-do-not-log"


@pytest.fixture(scope="module")
def triggerer() -> Iterator[Triggerer]:
    runner = Triggerer()
    yield runner
    runner.close()


@pytest.fixture(scope="module", autouse=True)
def fast_enroot(cluster: ClusterEnv) -> Iterator[None]:
    """Set the Enroot stand-in's pull delay to 1 s for this module; restore the knob file afterwards."""
    knobs = Path(cluster.enroot_conf)
    original = knobs.read_text()
    set_delay(cluster, 1)
    yield
    knobs.write_text(original)


def set_delay(cluster: ClusterEnv, seconds: int) -> None:
    knobs = Path(cluster.enroot_conf)
    lines = [line for line in knobs.read_text().splitlines() if not line.startswith("DELAY=")]
    knobs.write_text("\n".join([f"DELAY={seconds}", *lines]) + "\n")


@pytest.fixture(scope="module", autouse=True)
def cleanup(cluster: ClusterEnv, ssh_run: SshRun) -> Iterator[None]:
    """Remove this run's images, locks, datasets, conversion scripts and logs; check the canary never appeared."""
    yield
    rc, _, err = ssh_run(
        f"rm -rf -- {quote(cluster.containers_dir)}/*{TOKEN}* {quote(cluster.results_dir)}/ds-{TOKEN}; "
        f"for j in $(grep -l {TOKEN} {quote(cluster.results_dir)}/jobs/tao-enroot-*/sbatch/*.sbatch 2>/dev/null); do "
        'n=${j%/sbatch/*}; n=${n##*/}; rm -rf -- "${j%/sbatch/*}" ' + f'{quote(cluster.results_dir)}/logs/"$n"-*; done'
    )
    assert rc == 0, err
    assert not Path(CANARY).exists()


@pytest.fixture
def credentials_restored(ssh_run: SshRun) -> Iterator[None]:
    """Keep the cluster user's Enroot credentials file as it was before the test."""
    rc, before, _ = ssh_run("cat ~/.config/enroot/.credentials")
    yield
    if rc == 0:
        ssh_run("umask 077 && cat > ~/.config/enroot/.credentials", stdin=before)
    else:
        ssh_run("rm -f ~/.config/enroot/.credentials")


@pytest.fixture
def registry_conn(monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection holding a (fake) registry key in its password field."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_TEST_REGISTRY",
        json.dumps({"conn_type": "generic", "login": "robot", "password": REGISTRY_SECRET}),
    )
    return "test_registry"


def counting_hook(monkeypatch: pytest.MonkeyPatch) -> tuple[SlurmHook, list[str]]:
    """A real hook on ``slurm_default`` that records every command it sends."""
    hook = SlurmHook()
    sent: list[str] = []
    run_bytes = hook._run_bytes

    def record(command: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes, str]:
        sent.append(command)
        return run_bytes(command, stdin, timeout)

    monkeypatch.setattr(hook, "_run_bytes", record)
    return hook, sent


def image_name(kind: str, tag: str = "1") -> str:
    return f"example.org/tao-test/{kind}-{TOKEN}:{tag}"


def target_of(cluster: ClusterEnv, image: str) -> str:
    return f"{cluster.containers_dir}/{sqsh_cache_name(parse_image(image))}"


def imports_of(cluster: ClusterEnv, image: str) -> list[list[str]]:
    """The Enroot stand-in's evidence lines (time, host, job id, URI) for ``image``."""
    uri = parse_image(image).enroot_uri
    lines = Path(cluster.enroot_imports_log).read_text().splitlines()
    return [line.split("\t") for line in lines if line.endswith(f"\t{uri}")]


def run_import(triggerer: Triggerer, operator: EnrootImportOperator) -> tuple[str, dict[str, Any] | None]:
    """Run ``operator`` like Airflow: execute, and if it defers, trigger then execute_complete."""
    try:
        return operator.execute({}), None
    except TaskDeferred as deferred:
        trigger, method = deferred.trigger, deferred.method_name
    assert method == "execute_complete"
    event = triggerer.first_event(trigger)
    return operator.execute_complete({}, event=event), event


def sqsh_header(ssh_run: SshRun, path: str) -> str:
    rc, out, err = ssh_run(f"head -c 4 -- {quote(path)}")
    assert rc == 0, err
    return out


def importer(cluster: ClusterEnv, image: str, **kwargs: Any) -> EnrootImportOperator:
    return EnrootImportOperator(
        task_id="import", image=image, containers_dir=cluster.containers_dir, poll_interval_seconds=1, **kwargs
    )


# ------------------------------------------------------------------ preflight


def test_preflight_passes_on_the_test_cluster(cluster: ClusterEnv) -> None:
    report = SlurmPreflightOperator(task_id="preflight", image=image_name("preflight")).execute({})
    node = report["checks"]["gpu_node"].split()[3]
    assert node in cluster.nodes
    assert report["cluster"] == cluster.cluster_name
    assert report["user"] == cluster.user
    assert report["checks"] == {
        "login": f"ok: {cluster.user}@{cluster.host} with a key, no password",
        "tools": "ok: sbatch squeue sacct scancel srun",
        "pyxis": "ok: srun offers --container-image --container-mounts --no-container-mount-home",
        "results_dir": f"ok: {cluster.results_dir} is writable",
        "partitions": f"ok: GPU jobs on {cluster.gpu_partition} (4 h, 4 GPUs/node: a100, h100, 8 CPUs/node, 8192 "
        f"MB/node); conversion on {cluster.cpu_partition} (7 d, no GPUs, 8 CPUs/node, 8192 MB/node)",
        "account": f"ok: {cluster.user} may charge {cluster.account}",
        "enroot": f"ok: enroot 3.4.1 on partition {cluster.cpu_partition}",
        "gpu_node": f"ok: on node {node} of partition {cluster.gpu_partition}: Pyxis configured, enroot 3.4.1, "
        f"{cluster.results_dir} writable; site mounts from /etc/enroot/mounts.d: {cluster.shared_dir}/datasets at "
        f"/datasets (cached in {cluster.results_dir}/.tao-slurm/site-mounts.json)",
        "credentials": "ok: not needed for this image",
        "preemption": "ok: preemption does not warn the batch shell (PreemptType=preempt/partition_prio, "
        "PreemptMode=REQUEUE, no send_user_signal): the job's steps get SIGTERM and checkpoint_signal comes only "
        "before the time limit, so a training must checkpoint periodically",
    }


def _jobs_since(ssh_run: SshRun, since: str) -> list[str]:
    """``JobIDRaw|Partition`` of every job of ours that accounting has from ``since`` (the cluster's clock) on."""
    rc, out, err = ssh_run(f"sacct -X -n -P -S {quote(since)} -o JobIDRaw,Partition")
    assert rc == 0, err
    return out.split()


@pytest.mark.alone  # every job of the user from the start of each run on is counted: no other test may submit
@pytest.mark.parametrize(
    ("check_enroot", "check_gpu_node", "submits"),
    [(False, False, ()), (False, True, ("gpu",)), (True, False, ("cpu",)), (True, True, ("cpu", "gpu"))],
    ids=["reads-only", "gpu-node-step", "enroot-step", "both-steps"],
)
def test_the_preflight_submits_a_step_only_for_check_enroot_and_check_gpu_node(
    check_enroot: bool, check_gpu_node: bool, submits: tuple[str, ...], cluster: ClusterEnv, ssh_run: SshRun
) -> None:
    """docs/releases.md says which preflight options submit anything. Expected, in sacct: no job at all with both
    steps off, one job on the conversion (CPU) partition for ``check_enroot``, one on the GPU partition for
    ``check_gpu_node``. Before, the docs said the preflight only reads with ``check_gpu_node=False``, while
    ``check_enroot`` (on by default) still ran its step."""
    rc, since, err = ssh_run("date +%Y-%m-%dT%H:%M:%S")
    assert rc == 0, err
    report = SlurmPreflightOperator(
        task_id="preflight", check_enroot=check_enroot, check_gpu_node=check_gpu_node
    ).execute({})
    partitions = {"cpu": cluster.cpu_partition, "gpu": cluster.gpu_partition}
    expected = sorted(partitions[kind] for kind in submits)
    seen: list[str] = []
    deadline = time.monotonic() + 15  # a job reaches accounting a moment after it ends
    while time.monotonic() < deadline:
        seen = sorted(row.split("|")[1] for row in _jobs_since(ssh_run, since.strip()))
        if len(seen) >= len(expected) and (expected or time.monotonic() > deadline - 12):
            break
        time.sleep(0.5)
    assert seen == expected, (seen, report["checks"])
    assert ("enroot" in report["checks"], "gpu_node" in report["checks"]) == (check_enroot, check_gpu_node)


@pytest.fixture
def gpu_nodes_without_pyxis(cluster: ClusterEnv) -> Iterator[None]:
    """The GPU nodes' job steps lose Pyxis; the login host's srun keeps offering its options."""
    try:
        for node in cluster.nodes:
            harness("pyxis-off", node)
        yield
    finally:
        for node in cluster.nodes:
            harness("pyxis-on", node)


@pytest.mark.usefixtures("gpu_nodes_without_pyxis")
@pytest.mark.alone
def test_preflight_finds_gpu_nodes_without_pyxis_behind_a_login_host_with_it(cluster: ClusterEnv) -> None:
    """The login host's srun offers Pyxis' options (as before), but the GPU nodes do not load it, and one dataset
    root does not exist. Expected: the login-host check passes and the GPU-node check fails naming the node, the
    partition and the fix, and the missing dataset root; the conversion partition's check still passes."""
    absent = f"{cluster.shared_dir}/datasets-{TOKEN}/absent"
    with pytest.raises(PreflightError) as info:
        SlurmPreflightOperator(task_id="preflight", dataset_paths=[cluster.results_dir, absent]).execute({})
    (problem,) = info.value.problems
    node = problem.split(" on node ", 1)[1].split()[0]
    assert node in cluster.nodes
    where = f"on node {node} of partition {cluster.gpu_partition}"
    assert problem == (
        f"gpu_node: Pyxis is not in the SPANK plugin configuration {where} (/etc/slurm/plugstack.conf and the files it "
        "includes), though the login host's srun offers its options: a GPU job there would run its command outside "
        f"the container; ask the cluster admins to install Pyxis on the GPU nodes; {absent} cannot be read {where} "
        "(shared storage not mounted there?); fix dataset_paths or the mounts"
    )


@pytest.fixture
def busy_gpu_partition(cluster: ClusterEnv, ssh_run: SshRun) -> Iterator[list[str]]:
    """Every node of the GPU partition taken by another job (whole nodes), as on a busy site; cancelled afterwards."""
    require_alone("every node of the GPU partition held")
    name = f"busy-{TOKEN}"
    ids = []
    try:
        for node in cluster.nodes:
            rc, out, err = ssh_run(
                f"sbatch --parsable --partition={quote(cluster.gpu_partition)} --nodelist={quote(node)} --exclusive "
                f"--time=10 --job-name={quote(name)} --output=/dev/null --wrap='sleep 600'"
            )
            assert rc == 0, err
            ids.append(out.strip())
        wait_until(
            lambda: ssh_run(f"squeue -h -j {','.join(ids)} -o %T")[1].split() == ["RUNNING"] * len(ids),
            "the GPU nodes taken",
        )
        yield ids
    finally:
        ssh_run(f"scancel {' '.join(ids)}" if ids else "true")


@pytest.mark.alone
def test_preflight_on_a_busy_gpu_partition_says_not_verified_and_passes(
    cluster: ClusterEnv, busy_gpu_partition: list[str]
) -> None:
    """Every GPU node is taken: the GPU-node step cannot start within its wait, so nothing was seen there. Expected:
    the preflight passes; its gpu_node check reads "not verified" with srun's reason; the other checks are as on
    an idle cluster (the conversion partition's enroot step runs on its CPU node)."""
    report = SlurmPreflightOperator(task_id="preflight", enroot_wait_seconds=3).execute({})
    gpu_node = report["checks"]["gpu_node"]
    assert gpu_node.startswith(
        f"not verified: the one-minute CPU step found no free node on partition {cluster.gpu_partition} within 3 s "
        "or was refused there (srun: "
    ), gpu_node
    assert gpu_node.endswith(
        "a busy partition is normal: run the preflight again when a node is free, or raise enroot_wait_seconds"
    )
    assert report["checks"]["enroot"] == f"ok: enroot 3.4.1 on partition {cluster.cpu_partition}"


BAD_ACCOUNT = {"account": f"noacct{TOKEN}"}
READ_ONLY_DIR = {"results_dir": "/srv/lustre/.harness"}
# The Pyxis check asks `srun --help` for the options Pyxis registers. Asking for one more option
# than the installed plugin provides is how a cluster without (or with an older) Pyxis looks to
# the check, without touching the shared plugstack configuration that other tests rely on.
NO_SUCH_PYXIS_OPTION = {"pyxis_options": ["--container-image", "--container-tao-selftest"]}


@pytest.mark.parametrize(
    ("kwargs", "problems"),
    [
        (BAD_ACCOUNT, ["account"]),
        (READ_ONLY_DIR, ["results_dir", "gpu_node"]),  # not writable from the login host, nor from the GPU node
        (NO_SUCH_PYXIS_OPTION, ["pyxis"]),
        ({**BAD_ACCOUNT, **READ_ONLY_DIR, **NO_SUCH_PYXIS_OPTION}, ["pyxis", "results_dir", "account", "gpu_node"]),
    ],
    ids=["wrong-account", "results-dir-not-writable", "pyxis-option-missing", "all-three-at-once"],
)
def test_preflight_reports_every_problem_with_its_fix(kwargs: dict[str, Any], problems: list[str]) -> None:
    with pytest.raises(PreflightError) as info:
        # The enroot step needs a free CPU node; it is covered by the passing preflight above.
        SlurmPreflightOperator(task_id="preflight", check_enroot=False, **kwargs).execute({})
    assert [problem.split(":", 1)[0] for problem in info.value.problems] == problems
    text = str(info.value)
    if "account" in problems:
        assert f"has no association with account noacct{TOKEN}" in text
    if "results_dir" in problems:
        assert "/srv/lustre/.harness is not a directory that slurmuser can write; create it" in text
    if "pyxis" in problems:
        assert "srun does not offer --container-tao-selftest" in text
        assert "install the Pyxis SPANK plugin" in text


@pytest.mark.alone
@pytest.mark.usefixtures("credentials_restored")
def test_preflight_asks_for_ngc_credentials_only_while_the_image_must_be_converted(
    cluster: ClusterEnv, ssh_run: SshRun
) -> None:
    """No Enroot credentials on the cluster: for an NGC image without a converted copy the preflight fails, saying
    the image must be converted; once its copy is in the image cache, the same preflight passes ("not needed
    now")."""
    assert ssh_run("rm -f ~/.config/enroot/.credentials")[0] == 0
    image = f"nvcr.io#nvidia/tao-test/preflight-{TOKEN}:1"
    target = target_of(cluster, image)

    def preflight() -> dict[str, Any]:
        operator = SlurmPreflightOperator(
            task_id="preflight",
            image=image,
            containers_dir=cluster.containers_dir,  # the image cache the module's imports use
            check_enroot=False,
            check_gpu_node=False,
        )
        return operator.execute({})

    with pytest.raises(PreflightError) as info:
        preflight()
    (problem,) = info.value.problems
    assert problem.startswith(
        "credentials: no Enroot credentials for nvcr.io, authn.nvidia.com in ~/.config/enroot/.credentials, and the "
        f"image must be converted (no usable copy in {cluster.containers_dir}); pass registry_conn_id"
    ), problem
    try:
        rc, _, err = ssh_run(f"{{ printf hsqs; head -c 4092 /dev/zero; }} > {quote(target)}")
        assert rc == 0, err
        text = preflight()["checks"]["credentials"]
        assert text.startswith(f"ok: not needed now: {image} is converted already ({target}); credentials"), text
    finally:
        ssh_run(f"rm -f {quote(target)}")


@pytest.mark.alone
@pytest.mark.usefixtures("credentials_restored")
def test_preflight_installs_registry_credentials_from_a_connection(ssh_run: SshRun, registry_conn: str) -> None:
    operator = SlurmPreflightOperator(
        task_id="preflight", image="registry.example.org/team/app:1", registry_conn_id=registry_conn, check_enroot=False
    )
    report = operator.execute({})
    assert report["checks"]["credentials"] == "ok: present for registry.example.org (installed now)"
    assert REGISTRY_SECRET not in json.dumps(report)
    rc, out, err = ssh_run("stat -c %a ~/.config/enroot/.credentials && cat ~/.config/enroot/.credentials")
    assert rc == 0, err
    mode, *lines = out.splitlines()
    assert mode == "600"
    assert f"machine registry.example.org login robot password {REGISTRY_SECRET}" in lines


# ------------------------------------------------------------------ StageDatasetCheckOperator


@pytest.fixture(scope="module")
def dataset(cluster: ClusterEnv, ssh_run: SshRun) -> str:
    base = f"{cluster.results_dir}/ds-{TOKEN}"
    rc, _, err = ssh_run(f"mkdir -p {base}/train/images && echo '{{}}' > {base}/val.json")
    assert rc == 0, err
    return base


def test_dataset_check_returns_the_resolved_paths(dataset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hook, sent = counting_hook(monkeypatch)
    paths = {"train": f"lustre://{dataset}/train/", "val": f"slurm://login{dataset}/val.json", "root": dataset}
    operator = StageDatasetCheckOperator(task_id="check", paths=paths)
    operator.__dict__["hook"] = hook
    assert operator.execute({}) == {"train": f"{dataset}/train", "val": f"{dataset}/val.json", "root": dataset}
    assert len(sent) == 1, "all paths are checked in one round trip"


def test_dataset_check_names_every_missing_path_in_one_error(dataset: str) -> None:
    paths = [f"{dataset}/train", f"{dataset}/test", f"lustre://{dataset}/labels.json"]
    with pytest.raises(MissingPathsError) as info:
        StageDatasetCheckOperator(task_id="check", paths=paths).execute({})
    assert info.value.missing == [f"{dataset}/test", f"{dataset}/labels.json"]
    assert f"paths[1] = {dataset}/test" in str(info.value)
    assert f"paths[2] = {dataset}/labels.json" in str(info.value)


@pytest.mark.parametrize(
    "paths",
    [["file:///srv/lustre/slurmuser"], {"train": "/srv/lustre", "val": "file:///home/me/val"}, ["relative/path"]],
    ids=["file-uri", "one-file-uri-among-good-paths", "relative"],
)
def test_dataset_check_refuses_local_paths_before_any_ssh(paths: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    hook, sent = counting_hook(monkeypatch)
    operator = StageDatasetCheckOperator(task_id="check", paths=paths)
    operator.__dict__["hook"] = hook
    with pytest.raises(StoragePathError):
        operator.execute({})
    assert sent == []
    assert hook.active_host is None, "no SSH connection was opened"


# ------------------------------------------------------------------ EnrootImportOperator


def test_first_import_converts_on_the_cpu_partition_and_the_second_reuses(
    cluster: ClusterEnv, ssh_run: SshRun, triggerer: Triggerer
) -> None:
    image = image_name("first")
    path, event = run_import(triggerer, importer(cluster, image))
    assert path == target_of(cluster, image)
    assert event is not None
    job_id = event["slurm_job_id"]
    assert sqsh_header(ssh_run, path) == "hsqs"
    # sacct keeps a placeholder row (JobName "allocation", no partition) for a few seconds after a short job
    row = wait_until(
        lambda: (
            (out := ssh_run(f"sacct -j {job_id} -X -n -P -o JobName,Partition,State,AllocCPUS,ReqMem,Timelimit")[1])
            and not out.startswith("allocation|")
            and out.strip()
        ),
        f"accounting row of job {job_id}",
    )
    assert row == f"{event['job_name']}|{cluster.cpu_partition}|COMPLETED|4|7200M|02:00:00"
    assert [line[2] for line in imports_of(cluster, image)] == [job_id], "enroot ran inside the conversion job"
    rc, _, _ = ssh_run(f"ls -d {quote(path)}.lock {quote(path)}.tmp-* /tmp/enroot-{job_id}")
    assert rc != 0, "the lock, the partial file and the node-local temp dir are gone"

    again, second_event = run_import(triggerer, importer(cluster, image))
    assert (again, second_event) == (path, None)
    assert len(imports_of(cluster, image)) == 1, "the second run submitted nothing"


def test_the_conversion_job_carries_the_site_options(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    """The site's QOS and a node-feature constraint reach the conversion job (sacct shows them)."""
    image = image_name("site-options")
    (node,) = cluster.cpu_nodes
    feature = cluster.node_features[node][0]
    importer(cluster, image, deferrable=False, qos=cluster.qos, constraint=feature).execute({})
    (row,) = imports_of(cluster, image)
    job_id = row[2]
    # slurmdbd first keeps a placeholder row (QOS Unknown, no partition); a busy suite makes it lag
    fields = wait_until(
        lambda: (
            (out := ssh_run(f"sacct -j {job_id} -X -n -P -o QOS,Partition,NodeList,State")[1].strip())
            and out.endswith("|COMPLETED")
            and "" not in out.split("|")
            and not out.startswith("Unknown|")
            and out
        ),
        f"accounting row of job {job_id}",
        timeout=120,
        every=2,
    )
    assert fields == f"{cluster.qos}|{cluster.cpu_partition}|{node}|COMPLETED"


def test_without_a_conversion_partition_conversion_goes_to_a_partition_without_gpus(
    cluster: ClusterEnv, ssh_run: SshRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection names neither partition nor conversion partition, and the cluster's default partition has
    GPUs. Expected: the preflight reports the choice, and the conversion runs on the partition whose nodes have
    no GPUs (sinfo's GRES), on its CPU node, in node-local scratch (``--chdir``); never on the GPU default."""
    conn_json = json.loads(connection_json(cluster))
    for extra in ("partition", "conversion_partition"):
        conn_json["extra"].pop(extra, None)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", json.dumps(conn_json))
    report = SlurmPreflightOperator(task_id="preflight", check_enroot=False).execute({})
    assert report["checks"]["partitions"] == (
        f"ok: GPU jobs on {cluster.gpu_partition} (4 h, 4 GPUs/node: a100, h100, 8 CPUs/node, 8192 MB/node), the "
        f"cluster's default; conversion on {cluster.cpu_partition} (7 d, no GPUs, 8 CPUs/node, 8192 MB/node), chosen "
        "as a partition without GPUs"
    )
    image = image_name("no-conversion-partition")
    importer(cluster, image, deferrable=False).execute({})
    ((_, host, job_id, _),) = imports_of(cluster, image)
    assert host in cluster.cpu_nodes
    fields = wait_until(
        lambda: (
            (out := ssh_run(f"sacct -j {job_id} -X -n -P -o Partition,NodeList,WorkDir,State")[1].strip())
            and out.endswith("|COMPLETED")
            and "" not in out.split("|")  # slurmdbd's early row has no partition and no working directory yet
            and out
        ),
        f"accounting row of job {job_id}",
        timeout=120,
        every=2,
    )
    assert fields == f"{cluster.cpu_partition}|{host}|/tmp|COMPLETED"


def test_a_truncated_file_at_the_target_is_replaced(cluster: ClusterEnv, ssh_run: SshRun, triggerer: Triggerer) -> None:
    image = image_name("damaged-target")
    target = target_of(cluster, image)
    rc, _, err = ssh_run(f"head -c 65536 /dev/zero > {quote(target)}")
    assert rc == 0, err
    path, event = run_import(triggerer, importer(cluster, image))
    assert path == target
    assert event is not None
    assert sqsh_header(ssh_run, path) == "hsqs"
    assert len(imports_of(cluster, image)) == 1


@pytest.mark.parametrize(
    ("kind", "log_line"),
    [
        ("nonexistent", "returned error code: 404 Not Found"),
        ("truncated", "was interrupted; incomplete file left at"),
    ],
    ids=["registry-404", "interrupted-conversion"],
)
def test_a_failed_conversion_fails_with_the_log_tail_and_no_image(
    cluster: ClusterEnv, ssh_run: SshRun, triggerer: Triggerer, kind: str, log_line: str
) -> None:
    image = image_name(kind)
    operator = importer(cluster, image)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute({})
    event = triggerer.first_event(deferred.value.trigger)
    assert event["state"]["native"] == "FAILED"
    with pytest.raises(ImageConversionError) as info:
        operator.execute_complete({}, event=event)
    text = str(info.value)
    assert f"SLURM job {event['slurm_job_id']}" in text
    assert log_line in text, "the tail of main.err is in the error"
    assert "no GPU job may fall back to the registry image" in text
    target = target_of(cluster, image)
    rc, _, _ = ssh_run(f"ls -d {quote(target)} {quote(target)}.lock {quote(target)}.tmp-*")
    assert rc != 0, "neither an image nor a lock nor a partial file is left"


def test_two_concurrent_runs_share_one_conversion_job(cluster: ClusterEnv, triggerer: Triggerer) -> None:
    image = image_name("concurrent")
    set_delay(cluster, 4)
    barrier = threading.Barrier(2)
    outcomes: dict[int, tuple[str, dict[str, Any] | None] | BaseException] = {}

    def one_run(index: int) -> None:
        operator = importer(cluster, image)
        try:
            operator.hook.settings  # noqa: B018 - read the connection before the race starts
            barrier.wait(10)
            outcomes[index] = run_import(triggerer, operator)
        except BaseException as exc:
            outcomes[index] = exc
        finally:
            operator.hook.close()

    threads = [threading.Thread(target=one_run, args=(index,)) for index in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
    finally:
        set_delay(cluster, 1)
    results = [outcomes[index] for index in range(2)]
    assert not [result for result in results if isinstance(result, BaseException)], results
    paths = {result[0] for result in results if not isinstance(result, BaseException)}
    assert paths == {target_of(cluster, image)}
    events = [result[1] for result in results if not isinstance(result, BaseException)]
    job_ids = [event["slurm_job_id"] if event else None for event in events]
    assert len(imports_of(cluster, image)) == 1, "exactly one enroot import ran"
    assert job_ids[0] == job_ids[1] is not None, f"both runs deferred on the same conversion job, got {job_ids}"


def test_non_deferrable_import_waits_in_the_worker(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    image = image_name("blocking")
    path = importer(cluster, image, deferrable=False).execute({})
    assert path == target_of(cluster, image)
    assert sqsh_header(ssh_run, path) == "hsqs"


def test_a_given_sqsh_path_is_checked_and_returned_as_is(
    cluster: ClusterEnv, ssh_run: SshRun, triggerer: Triggerer
) -> None:
    good = f"{cluster.containers_dir}/given-{TOKEN}.sqsh"
    run_import(triggerer, importer(cluster, image_name("given"), sqsh_path=good))
    assert run_import(triggerer, importer(cluster, good)) == (good, None)
    bad = f"{cluster.containers_dir}/bad-{TOKEN}.sqsh"
    assert ssh_run(f"head -c 8192 /dev/urandom > {bad}")[0] == 0
    with pytest.raises(ImageConversionError, match="not the squashfs magic"):
        importer(cluster, bad).execute({})
    with pytest.raises(ImageConversionError, match="does not exist"):
        importer(cluster, f"{cluster.containers_dir}/absent-{TOKEN}.sqsh").execute({})


HOSTILE: list[tuple[str, Callable[[ClusterEnv], EnrootImportOperator], type[ValidationError]]] = [
    ("semicolon", lambda c: importer(c, f"nvcr.io/x;touch {CANARY}:1"), ImageReferenceError),
    ("command-substitution", lambda c: importer(c, f"$(touch {CANARY})"), ImageReferenceError),
    ("backticks", lambda c: importer(c, f"nvcr.io#x`touch {CANARY}`:1"), ImageReferenceError),
    ("newline", lambda c: importer(c, f"nvcr.io#x:1\ntouch {CANARY}"), ImageReferenceError),
    (
        "sqsh-path",
        lambda c: importer(c, "nvcr.io#x:1", sqsh_path=f"{c.containers_dir}/$(touch {CANARY}).sqsh"),
        StoragePathError,
    ),
    (
        "containers-dir",
        lambda c: EnrootImportOperator(task_id="t", image="x:1", containers_dir=f"/srv/$(touch {CANARY})"),
        StoragePathError,
    ),
    ("partition", lambda c: importer(c, image_name("hostile"), partition=f"cpu;touch {CANARY}"), ValidationError),
]


@pytest.mark.parametrize(("build", "error"), [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_hostile_inputs_are_refused_before_any_command(
    cluster: ClusterEnv,
    ssh_run: SshRun,
    build: Callable[[ClusterEnv], EnrootImportOperator],
    error: type[ValidationError],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook, sent = counting_hook(monkeypatch)
    operator = build(cluster)
    operator.__dict__["hook"] = hook
    with pytest.raises(error):
        operator.execute({})
    assert sent == []
    assert ssh_run(f"test -e {CANARY}")[0] != 0
    assert not Path(CANARY).exists()


def test_an_odd_but_valid_image_name_is_quoted_all_the_way(
    cluster: ClusterEnv, ssh_run: SshRun, triggerer: Triggerer
) -> None:
    image = f"localhost:5000/a__b.c-d/e-{TOKEN}:T.1-x_y"
    path, event = run_import(triggerer, importer(cluster, image))
    assert path == f"{cluster.containers_dir}/localhost_5000+a__b.c-d+e-{TOKEN}+T.1-x_y.sqsh"
    assert event is not None
    assert sqsh_header(ssh_run, path) == "hsqs"
    assert [line[3] for line in imports_of(cluster, image)] == [f"docker://localhost:5000#a__b.c-d/e-{TOKEN}:T.1-x_y"]
