"""Fault suite: a login host whose clock is ten minutes off, and a login sshd with OpenSSH's default limits.

Both are real login sshds of the harness (``tests/cluster/harness.py``): the "skewed" one preloads
libfaketime into every session, so ``date`` and the SLURM clients there run ten minutes ahead of the
worker, the controller and the shared storage (whose files keep the kernel's time, as a file server's
clock does); the "limits" one has ``MaxStartups 10:30:100`` and ``MaxSessions 10``, as a login host
nobody tuned for Airflow.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import (
    SECRET_SOURCE,
    conn,
    connection_json,
    dag_id,
    image,
    record_of,
    secret_value,
    sensor_for,
    submit,
    submit_op,
)
from deferral import context, defer, first_event, resume, run_async

from airflow_provider_tao_slurm.core import commands, conversion
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.hooks.slurm import PARTITION_CACHE_NAME, PARTITION_CACHE_S, SlurmHook, async_pool
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["conn", "dag_id", "image", "secret_value"]

#: Deferred sensors behind the default-limits sshd.
SENSORS = 200


def skewed_seconds(cluster: ClusterEnv, ssh_run: SshRun) -> int:
    """How far the skewed login host's ``date`` is from this machine's clock (seconds)."""
    _, out, _ = ssh_run("date +%s", port=cluster.skewed_port)
    return int(out) - int(time.time())


@pytest.fixture
def skewed(cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch, secret_value: str) -> str:
    """``slurm_default`` pointing at the skewed login host (the worker's clock stays right)."""
    monkeypatch.setenv(SECRET_SOURCE, secret_value)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster, port=cluster.skewed_port))
    return "slurm_default"


def test_a_fresh_conversion_lock_reads_fresh_on_a_login_host_ten_minutes_ahead(
    skewed: str, cluster: ClusterEnv, ssh_run: SshRun, record_property: Any
) -> None:
    """A conversion lock is taken (no job recorded yet: its owner is still submitting), then read through the
    login host whose clock is 10 minutes ahead of the storage's. Expected: its age reads as seconds, so another
    run waits for it (with the login host's clock it would read 600 s old: past the 300 s submit grace, broken
    as abandoned, and the image converted twice)."""
    skew = skewed_seconds(cluster, ssh_run)
    assert 590 <= skew <= 610, f"the skewed login host is {skew} s off"
    lock = conversion.lock_dir(f"{cluster.containers_dir}/skew-{time.monotonic_ns()}.sqsh")
    hook = SlurmHook(skewed)
    try:
        taken = conversion.parse_lock(hook.run(conversion.acquire_lock(lock, "a" * 16), check=True).stdout)
        seen = conversion.parse_lock(hook.run(conversion.acquire_lock(lock, "b" * 16), check=True).stdout)
        hook.run(conversion.remove_lock(lock, "a" * 16), check=True)
    finally:
        hook.close()
    assert taken.acquired
    assert (seen.acquired, seen.owner, seen.job_id) == (False, "a" * 16, None)
    assert 0 <= seen.age_seconds < 10, seen
    assert conversion.held_lock_action(seen, None) is conversion.LockAction.WAIT
    record_property("login clock skew (s)", skew)
    record_property("lock age read through the skewed host (s)", seen.age_seconds)


def test_the_partition_cache_written_a_moment_ago_is_used_on_a_login_host_ten_minutes_ahead(
    skewed: str, cluster: ClusterEnv, ssh_run: SshRun
) -> None:
    """The shared partition cache is written now with a marker partition, then the partitions are read through
    the skewed login host. Expected: the cache is fresh (the marker is there); with the login host's clock its
    age would read as 600 s, no longer below the 600 s cache life, and sinfo would be asked again."""
    cache = f"{cluster.results_dir}/.tao-slurm/{PARTITION_CACHE_NAME}"
    _, real, _ = ssh_run(commands.sinfo_partitions())
    ssh_run(
        f"mkdir -p -- {quote(cache.rsplit('/', 1)[0])} && "
        f"printf '%s\\n' {quote(real.strip())} 'skewmark|1:00:00|(null)' > {quote(cache)}"
    )
    hook = SlurmHook(skewed)
    try:
        names = [p.name for p in hook.partition_limits()]
    finally:
        hook.close()
        ssh_run(f"rm -f -- {quote(cache)}")
    assert "skewmark" in names, names
    assert PARTITION_CACHE_S == 600


def test_a_job_watched_through_a_login_host_ten_minutes_ahead_has_right_windows_and_timestamps(
    skewed: str, image: str, dag_id: str, ssh_run: SshRun
) -> None:
    """A 3-second job is submitted and watched (deferred) through the skewed login host. Expected: it completes;
    the record's transitions are in order and stamped by the worker's clock (within the test's wall time, not
    10 minutes ahead); queue and run time come from the controller (0 <= queue < 120 s, 3 <= run < 120 s)."""
    started = datetime.now(UTC)
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, "sleep 3"), ctx)
    sensor = sensor_for(handle)
    deferred = defer(sensor, ctx)
    result = resume(sensor, ctx, deferred, run_async(first_event(deferred.trigger, 180)))
    ended = datetime.now(UTC)

    assert result["terminal_state"] == "COMPLETE"
    assert 0 <= result["queue_seconds"] < 120
    assert 3 <= result["elapsed_seconds"] < 120
    record = record_of(ssh_run, handle["record_path"])
    stamps = [datetime.fromisoformat(t["ts"].replace("Z", "+00:00")) for t in record["transitions"]]
    assert stamps == sorted(stamps)
    assert all(started.replace(microsecond=0) <= stamp <= ended for stamp in stamps), (started, stamps, ended)


def test_two_hundred_deferred_sensors_behind_an_sshd_with_default_limits(
    conn: str, cluster: ClusterEnv, ssh_run: SshRun, monkeypatch: pytest.MonkeyPatch, record_property: Any
) -> None:
    """200 held jobs are watched by 200 SlurmJobTriggers in one event loop (one triggerer) through a login sshd
    with OpenSSH's default MaxStartups 10:30:100 and MaxSessions 10; then all jobs are cancelled. Expected:
    every trigger fires exactly once with its job CANCELLED; the triggerer held ONE connection to that sshd
    (sampled with ss while they waited) and sshd refused none (no 'MaxStartups' drop in its log)."""
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_LIMITS", connection_json(cluster, port=cluster.limits_port))
    prefix = f"limits-{time.monotonic_ns()}"
    submit_one = join(["sbatch", "--parsable", "--hold", "-p", cluster.cpu_partition, "-o", "/dev/null"])
    _, out, err = ssh_run(
        f"for i in $(seq 1 {SENSORS}); do {submit_one} -J {quote(prefix)}-$i --wrap true || exit 1; done", timeout=300
    )
    ids = [line.split(";")[0] for line in out.split()]
    assert len(ids) == SENSORS, err
    log = f"{cluster.state_dir}/log/sshd-limits.log"
    log_size = _size(log)

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        triggers = [
            SlurmJobTrigger(slurm_conn_id="slurm_limits", slurm_job_id=slurm_id, job_name="", poll_interval=2)
            for slurm_id in ids
        ]
        tasks = [asyncio.ensure_future(first_event(trigger, 240)) for trigger in triggers]
        await asyncio.sleep(8)
        connections = _established(cluster.host, cluster.limits_port)
        await asyncio.to_thread(subprocess.run, ["scancel", *ids], check=True, capture_output=True)
        events = await asyncio.gather(*tasks)
        await async_pool().close_all()
        return [event.payload for event in events], connections

    try:
        events, connections = run_async(scenario())
    finally:
        subprocess.run(["scancel", *ids], check=False, capture_output=True)
    assert [e["slurm_job_id"] for e in events] == ids
    assert {(e["status"], e["state"]["native"]) for e in events} == {("terminal", "CANCELLED")}, events[:3]
    assert connections == 1
    new_log = _read_from(log, log_size)
    assert "MaxStartups" not in new_log, new_log[-2000:]
    assert "drop connection" not in new_log, new_log[-2000:]
    record_property("sensors", SENSORS)
    record_property("connections to the login sshd", connections)


def _established(host: str, port: int) -> int:
    """TCP connections established to ``host:port`` (``ss``)."""
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", "dst", f"{host}:{port}"], capture_output=True, text=True, check=True
    ).stdout
    return len(out.splitlines())


def _size(path: str) -> int:
    try:
        with open(path, "rb") as handle:
            return handle.seek(0, 2)
    except FileNotFoundError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def test_the_skewed_and_limited_login_hosts_are_what_they_claim(cluster: ClusterEnv, ssh_run: SshRun) -> None:
    """The two harness sshds themselves: the skewed one's date is 10 minutes ahead while a file it creates is
    stamped with the storage's time; the limits one runs with OpenSSH's defaults (``sshd -T``)."""
    _, out, _ = ssh_run(
        f"d={quote(cluster.results_dir)}; t=$d/.skew-$$; : > $t; echo $(date +%s) $(stat -c %Y $t); rm -f $t",
        port=cluster.skewed_port,
    )
    now, mtime = (int(x) for x in out.split())
    assert 590 <= now - mtime <= 610
    config = subprocess.run(
        ["/usr/sbin/sshd", "-T", "-f", f"{cluster.state_dir}/ssh/sshd_limits_config"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Keywords in lower case up to OpenSSH 10.0, as written in sshd_config from 10.6.
    settings = {key.lower(): value for key, _, value in (line.partition(" ") for line in config.splitlines())}
    assert (settings["maxstartups"], settings["maxsessions"]) == ("10:30:100", "10")
    assert cluster.login_clock_skew == "+10m"
