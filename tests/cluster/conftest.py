"""Fixtures for tests against the local SLURM test cluster built by ``tests/cluster/harness.py``.

``cluster`` describes the running cluster (read from ``<state>/cluster.json``) and fails the test,
never skips it, when the cluster is not up. ``ssh_run`` runs a command on the login node as the
cluster user through the real OpenSSH client with strict host-key checking.

``slurm_settings``, ``slurm_hook`` and ``slurm_connection_env`` give the provider's own view of the
same cluster: settings with the pinned host key, a :class:`SlurmHook` on them, and the
``slurm_default`` Airflow connection (as ``AIRFLOW_CONN_SLURM_DEFAULT``) for operators.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Generator, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
from clusterkit import ALONE, TEST_KIND_ENV
from demo import SUITE_RPC_BUDGET

from airflow_provider_tao_slurm.core.config import ClusterSettings, settings_from_connection

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

CLUSTER_JSON = Path("/var/lib/slurmtest/cluster.json")
NOT_UP = "the local SLURM test cluster is not up: run `python3 tests/cluster/harness.py up` (or make test)"


#: Modules whose tests share an expensive module fixture (a DAG run, an Airflow stack, a cluster-wide setting):
#: side by side (make test) all of such a module's tests go to one worker, so the fixture runs once.
ONE_WORKER_MODULES = frozenset(
    f"tests/cluster/{name}.py"
    for name in (
        "test_airflow_ui",
        "test_cluster_before_gpu",
        "test_example_approval",
        "test_example_dags",
        "test_example_pipeline",
        "test_multinode",
        "test_smoke",
        "security/test_security_secrets",
        "security/test_security_hostile_input",
    )
)
#: Tests that share something only with a module of :data:`ONE_WORKER_MODULES`, given that module's worker so
#: they never overlap: the whole-node test and the Airflow UI's runs both use the 16-GPU node's partition.
SAME_WORKER_AS = {
    "tests/cluster/test_site_neutral.py::test_whole_node_follows_the_sixteen_gpu_node_shape": (
        "tests/cluster/test_airflow_ui.py"
    ),
}
SLOW = "slow"


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``alone`` and ``slow`` markers."""
    config.addinivalue_line(
        "markers",
        f"{ALONE}: changes the shared test cluster for every job on it (a daemon restarted or stopped, a node or "
        "partition changed, every GPU held, a setting of the cluster user's shared by every job): make test runs "
        "these one at a time, after the others ran side by side",
    )
    config.addinivalue_line(
        "markers",
        f"{SLOW}: takes a minute or more (a DAG run, a training over several slices): side by side such tests "
        "start first, so no worker is left with one at the end; one at a time they come last",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests for the verdicts to come soonest: side by side (xdist) the slow ones first, so the
    workers end together; one at a time the slow ones last. The order is the same in every worker."""
    side_by_side = hasattr(config, "workerinput")
    items.sort(key=lambda item: (item.get_closest_marker(SLOW) is None) == side_by_side)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each test a unit of work of its own, but a module of :data:`ONE_WORKER_MODULES` one unit (with the tests
    :data:`SAME_WORKER_AS` gives it), in collection order (:func:`pytest_collection_modifyitems`'s)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ClusterScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in ONE_WORKER_MODULES:
                return module
            return SAME_WORKER_AS.get(nodeid.split("[", 1)[0], nodeid)

    return ClusterScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Say in the environment, for the whole of the test's setup, call and teardown, whether it runs alone
    (:func:`clusterkit.harness` refuses a fault to a test that runs beside others)."""
    os.environ[TEST_KIND_ENV] = ALONE if item.get_closest_marker(ALONE) else "beside"
    try:
        return (yield)
    finally:
        os.environ.pop(TEST_KIND_ENV, None)


@dataclass(frozen=True)
class ClusterEnv:
    """The environment JSON written by ``harness.py up`` / ``harness.py env``.

    The fields with a default came later: a ``cluster.json`` from an older harness lacks them, and a test
    that needs one fails, naming the fix (``harness.py up``).
    """

    host: str
    port: int
    fault_port: int
    bastion_port: int
    rotating_port: int
    limits_port: int
    skewed_port: int
    login_clock_skew: str
    postgres_port: int
    black_hole_host: str
    black_hole_port: int
    closed_port: int
    user: str
    uid: int
    other_user: str
    other_uid: int
    other_dir: str
    key_file: str
    known_hosts: str
    host_key: str
    shared_dir: str
    results_dir: str
    containers_dir: str
    cluster_name: str
    account: str
    gpu_partition: str
    long_partition: str
    cpu_partition: str
    debug_partition: str
    short_partition: str
    hidden_partition: str
    down_partition: str
    urgent_partition: str
    qos: str
    node_features: dict[str, list[str]]
    gpu_types: dict[str, str]
    nodes: tuple[str, ...]
    cpu_nodes: tuple[str, ...]
    gpus_per_node: int
    state_dir: str
    enroot_conf: str
    enroot_imports_log: str
    pyxis_registry_log: str
    fault_sbatch_log: str
    #: The partition of the 16-GPU node alone, its node(s) and their GPUs ("" / () / 0: an older harness).
    wide_partition: str = ""
    wide_nodes: tuple[str, ...] = ()
    wide_gpus_per_node: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClusterEnv:
        """The environment from ``cluster.json``'s object: node lists as tuples, a later field it lacks at its default.

        :raises TypeError: when ``data`` lacks a field without a default.
        """
        given = {field.name: data[field.name] for field in fields(cls) if field.name in data}
        for name in ("nodes", "cpu_nodes", "wide_nodes"):
            if name in given:
                given[name] = tuple(given[name])
        return cls(**given)


class SshRun(Protocol):
    """Signature of the ``ssh_run`` fixture."""

    def __call__(
        self, command: str, *, port: int | None = None, stdin: str | None = None, timeout: float = 60
    ) -> tuple[int, str, str]:
        """Run ``command`` on the login node; return ``(rc, stdout, stderr)``."""
        ...


@pytest.fixture(scope="session")
def cluster() -> ClusterEnv:
    """Return the running cluster's environment; fail (never skip) when it is not up."""
    try:
        data = json.loads(CLUSTER_JSON.read_text())
    except (OSError, ValueError) as exc:
        problem = f"{CLUSTER_JSON}: {exc}"
    else:
        problem = ""
    if problem:
        pytest.fail(f"{NOT_UP} ({problem})", pytrace=False)
    missing = [field.name for field in fields(ClusterEnv) if field.name not in data and field.default is MISSING]
    if missing:
        pytest.fail(f"{NOT_UP} ({CLUSTER_JSON} lacks {', '.join(missing)})", pytrace=False)
    env = ClusterEnv.from_json(data)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        if sock.connect_ex((env.host, env.port)) != 0:
            pytest.fail(f"{NOT_UP} (nothing listens on {env.host}:{env.port})", pytrace=False)
    return env


@pytest.fixture(scope="session")
def wide_partition(cluster: ClusterEnv) -> str:
    """The partition of the 16-GPU node alone; fails (never skips) when ``cluster.json`` comes from a harness
    that did not make that node yet."""
    if not cluster.wide_partition:
        pytest.fail(
            f"{NOT_UP} ({CLUSTER_JSON} names no wide_partition: a cluster without the 16-GPU node)", pytrace=False
        )
    return cluster.wide_partition


@pytest.fixture(scope="session")
def ssh_run(cluster: ClusterEnv) -> SshRun:
    """Return a function running a shell command as the cluster user over real OpenSSH.

    The client reads no config files, uses only the harness key, ``BatchMode=yes`` and
    ``StrictHostKeyChecking=yes`` against the harness's known_hosts file. ``port`` defaults to the
    login sshd (pass ``cluster.fault_port`` for the fault one); ``stdin`` is fed to the command.
    """

    def run(
        command: str, *, port: int | None = None, stdin: str | None = None, timeout: float = 60
    ) -> tuple[int, str, str]:
        argv = [
            "ssh",
            "-F",
            "none",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={cluster.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            "-i",
            cluster.key_file,
            "-p",
            str(port or cluster.port),
            f"{cluster.user}@{cluster.host}",
            command,
        ]
        proc = subprocess.run(
            argv,
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return proc.returncode, proc.stdout, proc.stderr

    return run


def connection_fields(cluster: ClusterEnv) -> dict[str, Any]:
    """The ``host``, ``login``, ``port`` and ``extra`` of a ``tao_slurm`` connection to the test cluster."""
    return {
        "host": cluster.host,
        "login": cluster.user,
        "port": cluster.port,
        "extra": {
            "key_file": cluster.key_file,
            "host_key": cluster.host_key,
            "partition": cluster.gpu_partition,
            "account": cluster.account,
            "results_dir": cluster.results_dir,
            "container_mounts": f"{cluster.shared_dir}:{cluster.shared_dir}",
            "conversion_partition": cluster.cpu_partition,
            "cluster_name": cluster.cluster_name,
            **SUITE_RPC_BUDGET,
        },
    }


@pytest.fixture(scope="session")
def slurm_settings(cluster: ClusterEnv) -> ClusterSettings:
    """Return the provider's settings for the test cluster's login sshd, host key pinned."""
    return settings_from_connection(**connection_fields(cluster), source="the local SLURM test cluster")


@pytest.fixture
def slurm_hook(slurm_settings: ClusterSettings) -> Iterator[SlurmHook]:
    """Return a :class:`SlurmHook` on :func:`slurm_settings`; its connection is closed afterwards."""
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

    hook = SlurmHook(settings=slurm_settings)
    yield hook
    hook.close()


@pytest.fixture
def slurm_connection_env(cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch) -> str:
    """Define the ``slurm_default`` Airflow connection for the test cluster; return its id."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_SLURM_DEFAULT", json.dumps({"conn_type": "tao_slurm", **connection_fields(cluster)})
    )
    return "slurm_default"
