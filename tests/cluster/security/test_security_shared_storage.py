"""Security suite (issue 19): another user of the shared file system plants links and files in our results tree.

Each test gives the submit task its own results tree (``results_dir`` of the connection) under the
cluster user's ``/srv/lustre/slurmuser`` and lets the second user, ``slurmother``, plant something
there: through a hole the cluster user opened (a world-writable directory), or left behind after the
hole was closed again. Then the real submit task runs over SSH. Expected: a ``StoragePathError``
naming the path and the fix before anything is written or submitted; no job; nothing written into
the other user's directory; the cluster user's own file a link pointed to unchanged; the secret in no
file. A link left at the very name of a file we write is replaced, never written through.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from clusterkit import as_other, conn, connection_json, dag_id, image, jobs_named, secret_value, submit, submit_op
from deferral import context

from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import mint_job_id
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import StoragePathError

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["conn", "dag_id", "image", "secret_value"]


@dataclass
class Tree:
    """Our results tree, the other user's directory, and a file of ours a planted link points at."""

    root: str
    theirs: str
    victim: str
    ssh_run: SshRun
    cluster: ClusterEnv

    def ours(self, command: str) -> None:
        rc, out, err = self.ssh_run(command)
        assert rc == 0, f"{command}: {out}{err}"

    def other(self, command: str) -> None:
        rc, out, err = as_other(self.cluster, command)
        assert rc == 0, f"{command}: {out}{err}"

    def listing(self, path: str) -> list[str]:
        _rc, out, _err = self.ssh_run(f"ls -A -- {quote(path)} 2>/dev/null")
        return out.split()


VICTIM_TEXT = "the cluster user's own file"


@pytest.fixture
def tree(cluster: ClusterEnv, ssh_run: SshRun, conn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    """A fresh results tree (ours, 755) as the connection's results_dir, and the other user's directory."""
    tag = uuid.uuid4().hex[:8]
    root = f"{cluster.results_dir}/storage-{tag}"
    theirs = f"{cluster.other_dir}/planted-{tag}"
    victim = f"{cluster.results_dir}/storage-{tag}.victim"
    made = Tree(root, theirs, victim, ssh_run, cluster)
    made.ours(f"mkdir -m 755 -- {quote(root)} && printf %s {quote(VICTIM_TEXT)} > {quote(victim)}")
    made.other(f"mkdir -m 755 -- {quote(theirs)}")
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, extra={"results_dir": root}))
    yield made
    ssh_run(f"chmod -R u+rwX -- {quote(root)} 2>/dev/null; rm -rf -- {quote(root)} {quote(victim)}")
    as_other(cluster, f"rm -rf -- {quote(theirs)}; find {quote(root)} -user $(id -u) -delete 2>/dev/null")


def _open_base(t: Tree, name: str) -> str:
    t.ours(f"chmod 1777 -- {quote(t.root)}")
    return f"{t.root}: is writable by other users"


def _jobs_linked_to_theirs(t: Tree, name: str) -> str:
    t.ours(f"chmod 1777 -- {quote(t.root)}")
    t.other(f"ln -s -- {quote(t.theirs)} {quote(t.root + '/jobs')}")
    t.ours(f"chmod 755 -- {quote(t.root)}")  # the hole is closed again; the link stays
    return f"{t.root}/jobs: is a symbolic link"


def _records_dir_of_theirs(t: Tree, name: str) -> str:
    t.ours(f"chmod 1777 -- {quote(t.root)}")
    t.other(f"mkdir -m 777 -- {quote(t.root + '/records')}")
    t.ours(f"chmod 755 -- {quote(t.root)}")
    return f"{t.root}/records: is owned by another user"


def _logs_group_writable(t: Tree, name: str) -> str:
    t.ours(f"mkdir -m 775 -- {quote(t.root + '/logs')}")
    return f"{t.root}/logs: is writable by other users"


def _staging_target_linked(t: Tree, name: str) -> str:
    job_dir = JobLayout(t.root, name).job_dir
    t.ours(f"mkdir -m 1777 -- {quote(t.root + '/jobs')}")
    t.other(f"ln -s -- {quote(t.theirs)} {quote(job_dir)}")
    t.ours(f"chmod 700 -- {quote(t.root + '/jobs')}")
    return f"{job_dir}: is a symbolic link"


def _partition_cache_linked(t: Tree, name: str) -> str:
    t.ours(f"chmod 1777 -- {quote(t.root)}")
    t.other(f"ln -s -- {quote(t.theirs)} {quote(t.root + '/.tao-slurm')}")
    t.ours(f"chmod 755 -- {quote(t.root)}")
    return f"{t.root}/.tao-slurm: is a symbolic link"


PLANTS: dict[str, Callable[[Tree, str], str]] = {
    "results-dir-world-writable": _open_base,
    "jobs-linked-to-the-other-users-dir": _jobs_linked_to_theirs,
    "records-dir-of-the-other-user": _records_dir_of_theirs,
    "logs-group-writable": _logs_group_writable,
    "staging-target-linked": _staging_target_linked,
    "partition-cache-linked": _partition_cache_linked,
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_plant_in_the_results_tree_stops_the_submit_before_anything_is_written(
    plant: str, tree: Tree, image: str, dag_id: str, secret_value: str, ssh_run: SshRun
) -> None:
    """The other user planted a link or a directory (or the tree was left open). The submit task ran.
    Expected: StoragePathError naming the path, its problem and the fix; no job; nothing in the other
    user's directory; no secret sidecar anywhere; the secret in no file of the tree."""
    name = mint_job_id(dag_id, "submit", "r1")
    expected = PLANTS[plant](tree, name)

    with pytest.raises(StoragePathError) as refused:
        submit(submit_op(image, "sleep 1"), context(dag_id, "submit", "r1"))

    message = str(refused.value)
    assert expected.replace(":", "") in message
    assert "nothing was written or submitted" in message
    assert "results_dir" in message
    assert jobs_named(ssh_run, name) == []
    assert tree.listing(tree.theirs) == []
    rc, out, _err = ssh_run(
        f"find {quote(tree.root)} -name .secrets.env; grep -rlF -- {quote(secret_value)} {quote(tree.root)}"
    )
    assert out.split() == [], f"sidecar or secret found (rc {rc}): {out}"


def test_a_link_left_at_the_sidecars_name_is_replaced_not_written_through(
    tree: Tree, image: str, dag_id: str, secret_value: str, ssh_run: SshRun
) -> None:
    """While the job's directory was open, the other user left a link at the sidecar's name pointing at a
    file of the cluster user's; the directory was closed again before the submit task ran. Expected: the
    job is submitted; the sidecar is our own regular file, mode 600, holding the secret; the file the link
    pointed at is unchanged."""
    name = mint_job_id(dag_id, "submit", "r1")
    layout = JobLayout(tree.root, name)
    tree.ours(f"mkdir -p -m 700 -- {quote(layout.job_dir)} && chmod 1777 -- {quote(layout.job_dir)}")
    tree.other(f"ln -s -- {quote(tree.victim)} {quote(layout.sidecar_path)}")
    tree.ours(f"chmod 700 -- {quote(layout.job_dir)}")

    handle = submit(submit_op(image, "sleep 30"), context(dag_id, "submit", "r1"))
    try:
        rc, out, err = ssh_run(f"stat -c '%F|%a|%U' -- {quote(layout.sidecar_path)}; cat -- {quote(tree.victim)}")
        assert rc == 0, err
        kind, victim = out.split("\n", 1)
        assert kind == f"regular file|600|{tree.cluster.user}"
        assert victim == VICTIM_TEXT
        _rc, sidecar, _err = ssh_run(f"cat -- {quote(layout.sidecar_path)}")
        assert secret_value in sidecar or quote(secret_value) in sidecar
    finally:
        ssh_run(join(["scancel", handle["slurm_job_id"]]))
