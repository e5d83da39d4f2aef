"""``make demo``: run the single-node example DAG end to end on the local SLURM test cluster.

1. Read the cluster description written by ``tests/cluster/harness.py up``.
2. Stage the demo assets on shared storage as the cluster user, over SSH: the training program
   (``dags/programs/tao_like_train.py`` → ``/srv/lustre/demo/tao_like_train.py``) and two small
   datasets (``/srv/lustre/demo/data/train`` and ``val``).
3. Use an isolated Airflow home (``<repo>/.airflow-home``) with the repo's ``dags/`` folder and the
   ``slurm_default`` connection given as ``AIRFLOW_CONN_SLURM_DEFAULT``; ``airflow db migrate``.
4. ``airflow dags test example_tao_singlenode`` (a new DAG run each time), output streamed.
5. Print a summary gathered from Airflow's database (run and task states, XCom) and from the
   cluster (``sacct``, the job record, ``status.json``, checkpoints); exit 1 if the run failed.

``tests/cluster/test_example_dags.py`` imports this module and runs the DAG the same way.
``python tests/cluster/demo.py facts DAG_ID`` (run inside the Airflow environment) prints the
latest run's facts as JSON; the demo and the tests call it as a subprocess so that their own
process never binds to the demo's Airflow database.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import CLUSTER_JSON, ssh_argv

from airflow_provider_tao_slurm.core.images import parse_image
from airflow_provider_tao_slurm.core.shell import join, quote

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "example_tao_singlenode"
MULTINODE_DAG_ID = "example_tao_multinode"
#: The test cluster has no CUDA: its NCCL probe is a CPU test, and the DAG run says so.
MULTINODE_CONF = {"probe_backend": "gloo"}
TASKS = ("check_datasets", "import_image", "submit", "wait")
DEFAULT_HOME = REPO / ".airflow-home"
DEMO_DIR = "/srv/lustre/demo"
PROGRAM = REPO / "dags" / "programs" / "tao_like_train.py"
#: Files of the demo datasets (relative to ``DEMO_DIR``) and their contents.
DATASET_FILES = {
    **{f"data/train/sample_{i:03d}.txt": f"train sample {i} label {i % 3}\n" for i in range(8)},
    **{f"data/val/sample_{i:03d}.txt": f"val sample {i} label {i % 3}\n" for i in range(2)},
    "data/labels.txt": "cat\ndog\nbird\n",
}
#: ``airflow dags test`` is killed after this long (an inline trigger has no timeout of its own).
DAG_TEST_TIMEOUT_S = 480.0


class DemoError(Exception):
    """A demo step failed; the message says which and what to do."""


# --------------------------------------------------------------------------------------------------
# the cluster


def load_cluster(path: Path = CLUSTER_JSON) -> dict[str, Any]:
    """Read the cluster description written by ``harness.py up``.

    :raises DemoError: when the cluster is not up.
    """
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise DemoError(f"{path}: {exc}; start the cluster with `python3 tests/cluster/harness.py up`") from None


def ssh(
    cluster: Mapping[str, Any], command: str, *, stdin: bytes | None = None, timeout: float = 60
) -> tuple[int, str]:
    """Run ``command`` on the login node as the cluster user (the harness's OpenSSH client command line).

    :returns: ``(exit status, stdout + stderr)``.
    """
    argv = [*ssh_argv(int(cluster["port"])), command]
    proc = subprocess.run(
        argv,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")


def _demo_members() -> dict[str, bytes]:
    return {PROGRAM.name: PROGRAM.read_bytes(), **{k: v.encode() for k, v in DATASET_FILES.items()}}


def _demo_tarball(members: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


#: Stages the tarball on stdin under the directory ``$1`` unless its stamp ``$1/.assets`` already says ``$2``
#: (the members' digest). Each file is unpacked beside its place and renamed into it, so a job or a test that
#: reads one (cluster tests stage the same assets side by side) never sees it half written.
_STAGE = r"""set -e
demo=$1 digest=$2
mkdir -p -- "$demo"
if [ "$(cat -- "$demo/.assets" 2>/dev/null)" = "$digest" ]; then cat > /dev/null; exit 0; fi
staging=$(mktemp -d -- "$demo/.staging.XXXXXX")
trap 'rm -rf -- "$staging"' EXIT
tar -xzf - -C "$staging"
(cd -- "$staging" && find . -type f) | while IFS= read -r path; do
    mkdir -p -- "$demo/${path%/*}"
    mv -f -- "$staging/$path" "$demo/$path"
done
printf '%s\n' "$digest" > "$staging/.assets"
mv -f -- "$staging/.assets" "$demo/.assets"
"""


def stage_assets(cluster: Mapping[str, Any]) -> None:
    """Put the training program and the demo datasets under ``/srv/lustre/demo``, as the cluster user (nothing
    to do when they are there already, as staged by this checkout).

    :raises DemoError: when the upload fails.
    """
    members = _demo_members()
    digest = hashlib.sha256(json.dumps({k: v.hex() for k, v in sorted(members.items())}).encode()).hexdigest()
    command = join(["bash", "-c", _STAGE, "stage", DEMO_DIR, digest])
    rc, output = ssh(cluster, command, stdin=_demo_tarball(members))
    if rc != 0:
        raise DemoError(f"staging the demo assets in {DEMO_DIR} as {cluster['user']} failed (rc {rc}): {output}")


#: The test cluster's connections pace their RPCs (every submission runs the pacing) with a budget no test
#: spends: the suite is one cluster user submitting hundreds of jobs back to back. The pacing's own tests
#: and the benchmarks (a sweep's storm, as users run it) use budgets of their own.
SUITE_RPC_BUDGET = {"rpc_bucket_size": 100000, "rpc_refill_rate": 1000}


def connection_uri_json(cluster: Mapping[str, Any]) -> str:
    """The ``slurm_default`` connection for the test cluster, as ``AIRFLOW_CONN_SLURM_DEFAULT`` JSON."""
    return json.dumps(
        {
            "conn_type": "tao_slurm",
            "host": cluster["host"],
            "port": cluster["port"],
            "login": cluster["user"],
            "extra": {
                "key_file": cluster["key_file"],
                "host_key": cluster["host_key"],
                "partition": cluster["gpu_partition"],
                "account": cluster["account"],
                "results_dir": cluster["results_dir"],
                "container_mounts": f"{cluster['shared_dir']}:{cluster['shared_dir']}",
                "conversion_partition": cluster["cpu_partition"],
                "cluster_name": cluster["cluster_name"],
                **SUITE_RPC_BUDGET,
            },
        }
    )


def evidence_rows(path: str) -> list[list[str]]:
    """The tab-separated lines of a stand-in evidence log (none when it does not exist yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [line.split("\t") for line in text.splitlines()]


# --------------------------------------------------------------------------------------------------
# Airflow


def airflow_settings(cluster: Mapping[str, Any], home: Path) -> dict[str, str]:
    """The Airflow variables of the demo: isolated home, the repo's DAGs, the connection."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The example sensor's one retry re-settles the same job: on the demo cluster it need not wait
        # Airflow's default 5 minutes first.
        "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "5",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW_CONN_SLURM_DEFAULT": connection_uri_json(cluster),
    }


#: Listening ports for the Airflow servers a test starts are picked here, below Linux's ephemeral range
#: (32768-60999 by default): a port picked from that range can become the source port of any outgoing
#: connection before the server binds it ("address already in use", seen in CI).
LISTEN_PORTS = range(24000, 32000)


def free_port() -> int:
    """A TCP port nothing listens on now, outside the ephemeral range (for an Airflow server to bind)."""
    harness_ports = {int(v) for k, v in json.loads(CLUSTER_JSON.read_text()).items() if k.endswith("_port")}
    for port in random.sample(LISTEN_PORTS, 200):
        if port in harness_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS}")


def prepare_airflow(
    cluster: Mapping[str, Any], home: Path, extra_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Create the Airflow home, write ``<home>/demo.env`` (for the UI) and migrate the database.

    :param extra_env: more variables for the Airflow processes (e.g. a test's secret).
    :returns: the environment for Airflow subprocesses: this process's, less every inherited
        ``AIRFLOW*`` variable, plus the demo's settings and ``extra_env``.
    :raises DemoError: when the migration fails.
    """
    home.mkdir(parents=True, exist_ok=True)
    settings = airflow_settings(cluster, home)
    (home / "demo.env").write_text("".join(f"export {key}={quote(value)}\n" for key, value in settings.items()))
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env = {**inherited, **settings, **(extra_env or {})}
    proc = subprocess.run(
        [airflow_bin(), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        raise DemoError(f"airflow db migrate failed (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return env


def airflow_bin() -> str:
    """The ``airflow`` executable next to this Python."""
    return str(Path(sys.executable).parent / "airflow")


def run_dag(
    env: Mapping[str, str], conf: Mapping[str, Any] | None = None, *, echo: bool = True, dag_id: str = DAG_ID
) -> tuple[int, str]:
    """``airflow dags test <dag_id>`` in ``env``; stream its output when ``echo``.

    :returns: ``(exit status, the whole output)``.
    """
    argv = [airflow_bin(), "dags", "test", dag_id]
    if conf:
        argv += ["--conf", json.dumps(conf)]
    lines: list[str] = []
    with subprocess.Popen(
        argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stdout is not None
        watchdog = threading.Timer(DAG_TEST_TIMEOUT_S, proc.kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            rc = proc.wait()
        finally:
            watchdog.cancel()
    if rc == -signal.SIGKILL:
        lines.append(f"demo: airflow dags test ran over {DAG_TEST_TIMEOUT_S:.0f} s and was stopped\n")
        print(lines[-1], end="", file=sys.stderr)
    return rc, "".join(lines)


def airflow_facts(env: Mapping[str, str], dag_id: str = DAG_ID) -> dict[str, Any]:
    """The latest run of ``dag_id`` as Airflow recorded it (see :func:`print_facts`).

    :raises DemoError: when the facts cannot be read.
    """
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "facts", dag_id],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise DemoError(f"reading the DAG run from Airflow's database failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def print_facts(dag_id: str) -> int:
    """Print the latest run of ``dag_id`` as one JSON line (run, task states, return values, rendered fields)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.dagrun import DagRun
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(1)).first()
        if run is None:
            print(json.dumps({"run_id": None}))
            return 0
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id)
        ).all()
        rows: list[Any] = list(
            session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag_id, key="return_value"))
        )
        events = session.execute(
            select(AssetModel.uri, AssetEvent.source_task_id, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run.run_id)
        ).all()
        facts = {
            "run_id": run.run_id,
            "state": str(run.state),
            "tasks": {ti.task_id: str(ti.state) for ti in tis},
            "xcom": {row.task_id: XComModel.deserialize_value(row) for row in rows},
            "asset_events": [{"uri": uri, "task_id": task_id, "extra": extra} for uri, task_id, extra in events],
            "rendered": {
                ti.task_id: RenderedTaskInstanceFields.get_templated_fields(ti, session=session) for ti in tis
            },
        }
    print(json.dumps(facts, default=str))
    return 0


# --------------------------------------------------------------------------------------------------
# one demo run


@dataclass
class DemoRun:
    """Everything one DAG run left behind, gathered from Airflow and from the cluster."""

    rc: int
    output: str
    airflow: dict[str, Any]
    handle: dict[str, Any] = field(default_factory=dict)
    sacct: dict[str, str] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)
    status_lines: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    conversions: list[dict[str, str]] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """True when the DAG run succeeded."""
        return self.rc == 0 and self.airflow.get("state") == "success"


SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Partition", "AllocTRES", "NodeList", "Elapsed")


def sacct_row(cluster: Mapping[str, Any], slurm_job_id: str) -> dict[str, str]:
    """``sacct -X`` facts of one job (empty when accounting has no row)."""
    command = join(["sacct", "-j", slurm_job_id, "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS)])
    rc, output = ssh(cluster, command)
    rows = [line.split("|") for line in output.splitlines() if line.startswith(f"{slurm_job_id}|")]
    return dict(zip(SACCT_FIELDS, rows[0], strict=True)) if rc == 0 and rows else {}


def read_remote(cluster: Mapping[str, Any], path: str) -> str | None:
    """A file on the cluster, read as the cluster user (None when it does not exist)."""
    rc, output = ssh(cluster, f"cat -- {quote(path)} 2>/dev/null")
    return output if rc == 0 else None


def gather(
    cluster: Mapping[str, Any], rc: int, output: str, facts: dict[str, Any], new_imports: list[list[str]]
) -> DemoRun:
    """Collect the cluster side of a finished run: conversions, sacct, record, status.json, checkpoints.

    :param new_imports: the enroot evidence-log lines written while the DAG ran.
    """
    run = DemoRun(rc=rc, output=output, airflow=facts)
    image = (facts.get("rendered", {}).get("import_image") or {}).get("image")
    if isinstance(image, str) and parse_image(image).kind == "registry":
        uri = parse_image(image).enroot_uri
        for row in new_imports:
            if len(row) >= 4 and row[3] == uri:
                partition = sacct_row(cluster, row[2]).get("Partition", "?") if row[2].isdigit() else "-"
                run.conversions.append({"slurm_job_id": row[2], "host": row[1], "uri": uri, "partition": partition})
    handle = facts.get("xcom", {}).get("submit")
    if not isinstance(handle, dict):
        return run
    run.handle = handle
    run.sacct = sacct_row(cluster, str(handle["slurm_job_id"]))
    record = read_remote(cluster, handle["record_path"])
    run.record = json.loads(record) if record else {}
    status = read_remote(cluster, f"{handle['results_dir']}/status.json") or ""
    run.status_lines = [json.loads(line) for line in status.splitlines() if line.startswith("{")]
    rc_ls, listing = ssh(cluster, f"ls -1 -- {quote(handle['results_dir'] + '/checkpoints')} 2>/dev/null")
    run.checkpoints = listing.split() if rc_ls == 0 else []
    return run


def run_demo(
    cluster: Mapping[str, Any], env: Mapping[str, str], conf: Mapping[str, Any] | None = None, *, echo: bool = True
) -> DemoRun:
    """Run the DAG once (assets staged, Airflow prepared) and gather what it did."""
    before = len(evidence_rows(cluster["enroot_imports_log"]))
    rc, output = run_dag(env, conf, echo=echo)
    new_imports = evidence_rows(cluster["enroot_imports_log"])[before:]
    return gather(cluster, rc, output, airflow_facts(env), new_imports)


# --------------------------------------------------------------------------------------------------
# summary


def summary(run: DemoRun, cluster: Mapping[str, Any], home: Path) -> str:
    """A short readable account of the run, from the gathered facts."""
    facts = run.airflow
    lines = ["", "=" * 100, "SUMMARY", "=" * 100]
    lines.append(f"DAG run      {DAG_ID} / {facts.get('run_id')}: {str(facts.get('state')).upper()}")
    tasks = facts.get("tasks", {})
    lines.append("tasks        " + ", ".join(f"{t}={tasks.get(t, 'not run')}" for t in TASKS))
    xcom = facts.get("xcom", {})
    if "check_datasets" in xcom:
        lines.append(f"datasets     {json.dumps(xcom['check_datasets'])}")
    if "import_image" in xcom:
        if run.conversions:
            how = "converted in this run: " + ", ".join(
                f"SLURM job {c['slurm_job_id']} on partition {c['partition']}" for c in run.conversions
            )
        else:
            how = "reused: already converted, no enroot import in this run"
        lines.append(f"image        {xcom['import_image']} ({how})")
    handle = run.handle
    if handle:
        sacct = run.sacct
        lines.append(f"SLURM job    {handle['slurm_job_id']} (name {handle['job_id']})")
        if sacct:
            lines.append(
                f"  sacct      state {sacct['State']}, exit {sacct['ExitCode']}, partition {sacct['Partition']}, "
                f"nodes {sacct['NodeList']}, elapsed {sacct['Elapsed']}, TRES {sacct['AllocTRES']}"
            )
        if run.record:
            transitions = run.record.get("transitions", [])
            states = " -> ".join(t["state"] for t in transitions)
            lines.append(f"  record     {handle['record_path']}")
            lines.append(f"             {states} (terminal {run.record.get('terminal_state')})")
            if run.record.get("err_class"):
                lines.append(f"             {run.record['err_class']}: {transitions[-1]['message']}")
        lines.append(f"  logs       {handle['log_dir']}/main.out and main.err")
        last = run.status_lines[-1] if run.status_lines else {}
        lines.append(f"  results    {handle['results_dir']}")
        lines.append(
            f"             status.json: {len(run.status_lines)} lines, last {last.get('status')} "
            f"({last.get('message', 'missing')})"
        )
        lines.append(f"             checkpoints: {', '.join(run.checkpoints) or 'none'}")
        lines.append(
            f"  look       ssh -i {cluster['key_file']} -o UserKnownHostsFile={cluster['known_hosts']} "
            f"-p {cluster['port']} {cluster['user']}@{cluster['host']} cat {handle['log_dir']}/main.out"
        )
    failed = [t for t in TASKS if tasks.get(t) == "failed"]
    if failed:
        lines.append(f"FAILED       {', '.join(failed)}: see the task output above (search for 'error')")
    lines.append(f"Airflow home {home} (task logs: printed above; runs started from the UI log under {home / 'logs'})")
    lines.append(f"Airflow UI   set -a; . {home / 'demo.env'}; set +a; {airflow_bin()} standalone")
    lines.append("             then open http://localhost:8080 (login: see the password it prints)")
    lines.append("=" * 100)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo (no arguments) or print the facts of the latest run (``facts DAG_ID``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["facts"] and len(args) == 2:
        return print_facts(args[1])
    if args:
        print("usage: demo.py  |  demo.py facts DAG_ID", file=sys.stderr)
        return 2
    try:
        cluster = load_cluster()
        print(f"demo: staging the training program and datasets in {DEMO_DIR} as {cluster['user']}", flush=True)
        stage_assets(cluster)
        print(f"demo: Airflow home {DEFAULT_HOME}; migrating its database", flush=True)
        env = prepare_airflow(cluster, DEFAULT_HOME)
        print(f"demo: airflow dags test {DAG_ID}", flush=True)
        run = run_demo(cluster, env)
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    print(summary(run, cluster, DEFAULT_HOME))
    if not run.succeeded:
        return 1
    return run_multinode(env)


def run_multinode(env: Mapping[str, str]) -> int:
    """Run the multi-node example (NCCL probe, then a 2-node job) and print its outcome."""
    print(f"demo: airflow dags test {MULTINODE_DAG_ID}", flush=True)
    try:
        rc, _ = run_dag(env, MULTINODE_CONF, dag_id=MULTINODE_DAG_ID)
        facts = airflow_facts(env, MULTINODE_DAG_ID)
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    xcom = facts.get("xcom", {})
    handle = xcom.get("submit") or {}
    print(f"DAG run      {MULTINODE_DAG_ID}: {str(facts.get('state')).upper()}")
    print(f"tasks        {', '.join(f'{t}={s}' for t, s in (facts.get('tasks') or {}).items())}")
    print(f"NCCL env     {json.dumps(xcom.get('nccl_probe'))} (probed once per cluster, then cached)")
    if handle:
        print(f"SLURM job    {handle.get('slurm_job_id')} on 2 nodes; logs {handle.get('log_dir')}")
    return 0 if rc == 0 and facts.get("state") == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
