"""Acceptance tests of ``SlurmHook`` (issue 4) against the local SLURM test cluster, over real SSH.

Every test talks to the harness's sshd (127.0.0.1, key-only, strict host keys) and real SLURM
22.05 daemons. Faults are real too: a refusing address, a closed port, the "fault" sshd whose
``sbatch`` submits and then cuts the session, a stopped slurmctld/slurmdbd, a restarted sshd and a
server-side socket reset (``ss -K``). Job names carry a per-run token so reruns never meet old jobs.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import shlex
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
import pytest
from clusterkit import harness
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from deferral import wait_until

from airflow_provider_tao_slurm.core.commands import SUBMISSION_RPCS
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.core.states import TaoState
from airflow_provider_tao_slurm.exceptions import (
    CommandTimeoutError,
    ConnectionLostError,
    HostKeyError,
    KeyFilePermissionError,
    SlurmConnectionError,
    StatusQueryError,
)
from airflow_provider_tao_slurm.hooks.slurm import CommandResult, LogChunk, SlurmHook, async_pool
from airflow_provider_tao_slurm.lifecycle import submission

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.config import ClusterSettings
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

TOKEN = uuid.uuid4().hex[:8]
REFUSING_HOST = "127.0.0.2"  # loopback answers for all of 127/8, but sshd listens on 127.0.0.1 only
UNKNOWN_JOB_ID = "99999999"


def jobs_named(ssh_run: SshRun, name: str) -> tuple[list[str], list[str]]:
    """Ids of the jobs named exactly ``name``: (squeue -t all, sacct), asked through OpenSSH."""
    _, live, _ = ssh_run(join(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i"]))
    _, past, _ = ssh_run(join(["sacct", "-X", "-n", "-P", "-S", "now-1hours", f"--name={name}", "-o", "JobIDRaw"]))
    return live.split(), past.split()


def other_ed25519_key() -> str:
    """A freshly generated ed25519 public key (``ssh-ed25519 AAAA...``), not the cluster's."""
    return Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


@pytest.fixture(scope="module")
def run_dir(cluster: ClusterEnv, ssh_run: SshRun) -> Iterator[str]:
    """This run's directory on the shared file system; removed afterwards."""
    path = f"{cluster.results_dir}/hooktest_{TOKEN}"
    assert ssh_run(join(["mkdir", "-p", path]))[0] == 0
    yield path
    ssh_run(join(["rm", "-rf", path]))


def _stage_script(ssh_run: SshRun, cluster: ClusterEnv, path: str, log_dir: str, body: str) -> str:
    script = "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --partition={cluster.cpu_partition}",
            "#SBATCH --time=10",
            f"#SBATCH --output={log_dir}/%x-%j/main.out",
            f"#SBATCH --error={log_dir}/%x-%j/main.err",
            body,
        ]
    )
    assert ssh_run(f"cat > {quote(path)}", stdin=script + "\n")[0] == 0
    return path


@pytest.fixture(scope="module")
def sleep_script(cluster: ClusterEnv, ssh_run: SshRun, run_dir: str) -> str:
    """A staged batch script that sleeps for 5 minutes (cancelled by the tests)."""
    return _stage_script(ssh_run, cluster, f"{run_dir}/sleep.sbatch", f"{run_dir}/logs", "sleep 300")


@pytest.fixture(scope="module")
def quick_script(cluster: ClusterEnv, ssh_run: SshRun, run_dir: str) -> str:
    """A staged batch script that prints one line and exits 0."""
    return _stage_script(ssh_run, cluster, f"{run_dir}/quick.sbatch", f"{run_dir}/logs", 'echo "done $SLURM_JOB_ID"')


@pytest.fixture(scope="module")
def finished_job(slurm_settings: ClusterSettings, quick_script: str, run_dir: str) -> str:
    """A job that COMPLETED and that sacct already knows as such."""
    hook = SlurmHook(settings=slurm_settings)
    try:
        job_id = hook.submit(quick_script, f"hook_{TOKEN}_finished", log_dir=f"{run_dir}/logs")
        wait_until(
            lambda: (
                (s := hook.get_states([job_id]).get(job_id)) is not None
                and s.source == "sacct"
                and s.tao_state is TaoState.COMPLETE
            ),
            f"job {job_id} COMPLETED in sacct",
            timeout=60,
        )
    finally:
        hook.close()
    return job_id


@pytest.fixture
def sent_commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every command line this process sends over any paramiko SSH channel during the test.

    Counting at the channel (what reaches the login host's sshd), not at ``SlurmHook.run``, also
    catches a command that bypassed ``run``.
    """
    sent: list[str] = []
    original = paramiko.Channel.exec_command

    def exec_command(channel: paramiko.Channel, command: str | bytes) -> None:
        sent.append(command.decode() if isinstance(command, bytes) else command)
        original(channel, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", exec_command)
    return sent


@pytest.fixture
def quiet_listener() -> Iterator[socket.socket]:
    """A local TCP listener standing in for a login host; a test asserts nobody connected to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


def nobody_connected(server: socket.socket) -> bool:
    """True when no connection is waiting on ``server``."""
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


# ---------------------------------------------------------------------- connecting


async def _a_run_once(hook: SlurmHook, command: str) -> CommandResult:
    """``a_run`` on a fresh pooled connection, closed afterwards."""
    try:
        return await hook.a_run(command)
    finally:
        await async_pool().close_all()


def run_on(side: str, hook: SlurmHook, command: str) -> CommandResult:
    """Run ``command`` through the sync side (paramiko) or the async side (asyncssh pool); close afterwards."""
    if side == "async":
        return asyncio.run(_a_run_once(hook, command))
    try:
        return hook.run(command)
    finally:
        hook.close()


def warnings_logged(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> list[str]:
    """Warning lines logged so far: the hook logs through Airflow's structlog (to the process's output,
    which capfd sees), the async pool through stdlib logging (caplog)."""
    captured = capfd.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "[warning" in line]
    return lines + [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("side", ["sync", "async"])
def test_failover_connects_to_the_next_host_and_logs_the_first_failure(
    slurm_settings: ClusterSettings,
    cluster: ClusterEnv,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    side: str,
) -> None:
    hook = SlurmHook(settings=replace(slurm_settings, hosts=(REFUSING_HOST, cluster.host)))
    caplog.set_level(logging.WARNING)
    capfd.readouterr()
    result = run_on(side, hook, "id -un")
    assert (result.rc, result.stdout, result.host) == (0, f"{cluster.user}\n", cluster.host)
    warnings = warnings_logged(capfd, caplog)
    assert any(REFUSING_HOST in w and "Connection refused" in w for w in warnings), warnings
    assert any(f"Connected to {cluster.host} after 1 failed login host" in w for w in warnings), warnings


@pytest.mark.parametrize("side", ["sync", "async"])
def test_all_hosts_down_lists_every_host_and_why(
    slurm_settings: ClusterSettings, cluster: ClusterEnv, side: str
) -> None:
    hosts = (cluster.host, REFUSING_HOST)
    hook = SlurmHook(settings=replace(slurm_settings, hosts=hosts, port=cluster.closed_port))
    with pytest.raises(SlurmConnectionError) as caught:
        run_on(side, hook, "true")
    assert type(caught.value) is SlurmConnectionError
    assert [host for host, _ in caught.value.failures] == list(hosts)
    for host, reason in caught.value.failures:
        assert f"{host} port {cluster.closed_port} unreachable (Connection refused)" in reason
        assert reason in str(caught.value)


def bastion_proxy(cluster: ClusterEnv, port: int) -> str:
    """The ``proxy_command`` extra through the test cluster's bastion sshd (OpenSSH ``-W``, strict host keys)."""
    return join(
        [
            "ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", "-i", cluster.key_file,
            "-p", str(port), "-W", "%h:%p", f"{cluster.user}@{cluster.host}",
        ]
    )  # fmt: skip


def bastion_logins(cluster: ClusterEnv) -> int:
    """Logins the bastion sshd has accepted so far (its own log)."""
    log = Path(cluster.state_dir) / "log" / "sshd-bastion.log"
    return log.read_text().count(f"Accepted publickey for {cluster.user}") if log.exists() else 0


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_login_host_behind_a_bastion_is_reached_through_proxy_command(
    slurm_settings: ClusterSettings, cluster: ClusterEnv, side: str
) -> None:
    """The bastion only forwards (no shell for anyone); the hook's connection goes through it, host keys checked."""
    shell = subprocess.run(
        [
            "ssh",
            *shlex.split(bastion_proxy(cluster, cluster.bastion_port))[1:-3],
            f"{cluster.user}@{cluster.host}",
            "id",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shell.returncode != 0, "the bastion gives no shell"
    assert "uid=" not in shell.stdout
    before = bastion_logins(cluster)
    hook = SlurmHook(settings=replace(slurm_settings, proxy_command=bastion_proxy(cluster, cluster.bastion_port)))
    result = run_on(side, hook, "id -un")
    assert (result.rc, result.stdout, result.host) == (0, f"{cluster.user}\n", cluster.host)
    wait_until(lambda: bastion_logins(cluster) == before + 1 or None, "the bastion's log of the forwarded login", 10)


def test_the_sync_connection_sends_each_packet_without_waiting_for_an_ack(slurm_settings: ClusterSettings) -> None:
    """Nagle's algorithm is off on the paramiko socket (asyncssh turns it off itself): with it on, a
    command's small packets waited for the login host's delayed ACK, 40-90 ms per command."""
    hook = SlurmHook(settings=slurm_settings)
    try:
        sock = hook.get_conn().get_transport().sock  # type: ignore[union-attr]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert hook.run("echo ok").stdout == "ok\n"
    finally:
        hook.close()


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_dead_bastion_fails_naming_the_login_host(
    slurm_settings: ClusterSettings, cluster: ClusterEnv, side: str
) -> None:
    hook = SlurmHook(settings=replace(slurm_settings, proxy_command=bastion_proxy(cluster, cluster.closed_port)))
    with pytest.raises(SlurmConnectionError) as caught:
        run_on(side, hook, "true")
    assert [host for host, _ in caught.value.failures] == [cluster.host]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604], ids=["0644", "0640", "0604"])
@pytest.mark.parametrize("side", ["sync", "async"])
def test_key_readable_by_others_is_refused_before_connecting(
    slurm_settings: ClusterSettings,
    cluster: ClusterEnv,
    tmp_path: Path,
    quiet_listener: socket.socket,
    mode: int,
    side: str,
) -> None:
    key = tmp_path / "id_ed25519"
    key.write_bytes(Path(cluster.key_file).read_bytes())
    key.chmod(mode)
    port = quiet_listener.getsockname()[1]
    hook = SlurmHook(settings=replace(slurm_settings, key_file=str(key), port=port))
    with pytest.raises(KeyFilePermissionError) as caught:
        run_on(side, hook, "true")
    assert f"chmod 600 {key}" in str(caught.value)
    assert f"{mode:o}" in str(caught.value)
    assert nobody_connected(quiet_listener)


@pytest.mark.parametrize("side", ["sync", "async"])
@pytest.mark.parametrize("pinned", [False, True], ids=["unknown-host-key", "changed-host-key"])
def test_untrusted_host_key_is_refused(
    slurm_settings: ClusterSettings, cluster: ClusterEnv, pinned: bool, side: str
) -> None:
    known_hosts = Path.home() / ".ssh" / "known_hosts"
    existed = known_hosts.exists()
    if existed:
        assert f"[{cluster.host}]:{cluster.port}" not in known_hosts.read_text()
    hook = SlurmHook(settings=replace(slurm_settings, host_key=other_ed25519_key() if pinned else None))
    with pytest.raises(HostKeyError) as caught:
        run_on(side, hook, "true")
    assert [host for host, _ in caught.value.failures] == [cluster.host]
    assert "host_key extra" in str(caught.value)
    if side == "sync":  # paramiko tells a changed key from an unknown one; asyncssh does not
        assert ("CHANGED" in str(caught.value)) == pinned
    assert known_hosts.exists() == existed  # nothing was learnt on first use


# ---------------------------------------------------------------------- jobs and states


def test_fifty_jobs_are_polled_with_one_squeue(
    slurm_hook: SlurmHook, sleep_script: str, run_dir: str, ssh_run: SshRun, sent_commands: list[str]
) -> None:
    names = [f"hook_{TOKEN}_batch{i:02d}" for i in range(50)]
    ids: list[str] = []
    try:
        for name in names:  # eligible only in an hour: they stay PENDING and use no node
            ids.append(
                slurm_hook.submit(sleep_script, name, log_dir=f"{run_dir}/logs", extra_args=["--begin=now+1hour"])
            )
        assert len(set(ids)) == 50
        sent_commands.clear()
        states = slurm_hook.get_states(ids)
        polled = list(sent_commands)
        assert set(states) == set(ids)
        assert {(s.tao_state, s.source) for s in states.values()} == {(TaoState.PENDING, "squeue")}
        assert {states[job_id].name for job_id in ids} == set(names)
        squeues = [c for c in polled if c.startswith("squeue ")]
        saccts = [c for c in polled if c.startswith("sacct ")]
        assert len(squeues) == 1
        assert len(saccts) <= 1
        assert len(polled) == len(squeues) + len(saccts), polled
        assert set(re.findall(r" -j ([\d,]+) ", squeues[0])[0].split(",")) == set(ids)
    finally:
        sent_commands.clear()
        slurm_hook.cancel(ids)
        cancels = list(sent_commands)
    assert len(cancels) == 1
    assert cancels[0].split()[:3] == ["scancel", "-Q", f"--user={slurm_hook.settings.user}"]  # our jobs only
    assert set(cancels[0].split()[3:]) == set(ids)
    _, out, _ = ssh_run(join(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%T"]))
    assert set(out.split()) == {"CANCELLED"}


@pytest.mark.alone
def test_submissions_past_the_rpc_budget_wait_for_it(
    slurm_settings: ClusterSettings, sleep_script: str, run_dir: str, ssh_run: SshRun, capfd: pytest.CaptureFixture[str]
) -> None:
    """A budget of one submission (its tokens, refilled 1 per second): the second submission takes its tokens
    on credit, waits until they are refilled before it sends anything, and says so; both jobs go once."""
    bucket = "$HOME/.tao-slurm/rpc-bucket"
    assert ssh_run(f'rm -f "{bucket}"')[0] == 0
    hook = SlurmHook(settings=replace(slurm_settings, rpc_bucket_size=SUBMISSION_RPCS, rpc_refill_rate=1.0))
    ids: list[str] = []
    try:
        took: list[float] = []
        for k in range(2):
            started = time.monotonic()
            name = f"hook_{TOKEN}_paced{k}"
            ids.append(hook.submit(sleep_script, name, log_dir=f"{run_dir}/logs", extra_args=["--begin=now+1hour"]))
            took.append(time.monotonic() - started)
        rc, out, err = ssh_run(f'cat "{bucket}"')
        assert rc == 0, err
        tokens = float(out.split()[0])
        assert tokens < 0, out  # the second submission's tokens were taken before the refill ...
        assert took[1] >= -tokens / 1.0 - 0.2, (took, out)  # ... and it waited for them
        captured = capfd.readouterr()  # the hook logs through Airflow's structlog, to the process's output
        waits = [line for line in (captured.out + captured.err).splitlines() if "RPC budget" in line]
        assert len(waits) == 1, waits
        assert f"hook_{TOKEN}_paced1 waited " in waits[0], waits
        assert len(set(ids)) == 2
        _, listed, _ = ssh_run(join(["squeue", "-h", "-j", ",".join(ids), "-o", "%j %T"]))
        assert sorted(listed.splitlines()) == [f"hook_{TOKEN}_paced{k} PENDING" for k in range(2)]
    finally:
        hook.cancel(ids)
        hook.close()
        ssh_run(f'rm -f "{bucket}"')


def site_parameters(ssh_run: SshRun) -> str:
    """slurmctld's ``SlurmctldParameters`` as the cluster user's ``scontrol show config`` prints it."""
    rc, out, err = ssh_run(join(["scontrol", "show", "config"]))
    assert rc == 0, err
    shown = [
        value.strip()
        for key, _, value in (line.partition("=") for line in out.splitlines())
        if key.strip() == "SlurmctldParameters"
    ]
    assert len(shown) == 1, out
    return shown[0]


PACING_FILES = '"$HOME/.tao-slurm/rpc-bucket" "$HOME/.tao-slurm/slurmctld-parameters"'


@pytest.mark.alone
def test_without_a_site_limiter_submissions_go_at_once(
    slurm_settings: ClusterSettings, sleep_script: str, run_dir: str, ssh_run: SshRun, capfd: pytest.CaptureFixture[str]
) -> None:
    """A connection that sets no RPC budget follows the site: with no ``rl_enable`` (the harness's default),
    four submissions in a row (28 RPCs, past the 24 a fixed budget allowed) go at once, and the site's
    answer is read once and kept beside the bucket."""
    assert ssh_run(f"rm -f {PACING_FILES}")[0] == 0
    parameters = site_parameters(ssh_run)
    assert "rl_enable" not in parameters.split(","), parameters
    hook = SlurmHook(settings=replace(slurm_settings, rpc_bucket_size=None, rpc_refill_rate=None))
    ids: list[str] = []
    try:
        for k in range(4):
            ids.append(
                hook.submit(
                    sleep_script, f"hook_{TOKEN}_free{k}", log_dir=f"{run_dir}/logs", extra_args=["--begin=now+1hour"]
                )
            )
        captured = capfd.readouterr()
        assert [line for line in (captured.out + captured.err).splitlines() if "RPC budget" in line] == []
        rc, out, err = ssh_run('cat "$HOME/.tao-slurm/slurmctld-parameters"; test ! -e "$HOME/.tao-slurm/rpc-bucket"')
        assert rc == 0, (out, err)  # read and kept; no bucket kept where nothing paces
        assert out.splitlines()[1:] == [parameters]
        assert len(set(ids)) == 4
    finally:
        hook.cancel(ids)
        hook.close()
        ssh_run(f"rm -f {PACING_FILES}")


@pytest.fixture
def site_rate_limit(ssh_run: SshRun) -> Iterator[str]:
    """slurmctld's RPC rate limiter on for one test (bucket 10, 2 per second), off again afterwards."""
    printed = subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True, check=True).stdout.split()
    major, minor = (int(part) for part in printed[-1].split(".")[:2])
    if (major, minor) < (23, 2):
        pytest.skip(f"rl_enable came in SLURM 23.02, this cluster runs {printed[-1]}: `SLURM=26.05 make matrix-here`")
    parameters = "rl_enable,rl_bucket_size=10,rl_refill_rate=2"
    harness("rate-limit", parameters)
    try:
        yield parameters
    finally:
        harness("rate-limit", "off")
        ssh_run(f"rm -f {PACING_FILES}")


@pytest.mark.alone
def test_a_site_limiter_paces_submissions_and_slowed_queries_stay_unanswered(
    slurm_settings: ClusterSettings,
    sleep_script: str,
    run_dir: str,
    ssh_run: SshRun,
    site_rate_limit: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """With ``rl_enable`` on, a connection that sets no budget paces at four fifths of the site's bucket
    (8 tokens, 1.6 per second) and says why. While another command of the same user spends the site's
    bucket, slurmctld makes the provider's squeue back off and sleep (longer at each refusal from 24.05):
    a query cut by the command timeout is an error, never an answer that the job is gone."""
    assert ssh_run(f"rm -f {PACING_FILES}")[0] == 0
    assert site_parameters(ssh_run) == site_rate_limit
    hook = SlurmHook(settings=replace(slurm_settings, rpc_bucket_size=None, rpc_refill_rate=None, cmd_timeout=2.0))
    # The answers after the flood, and the cleanup, come from a hook with the default command timeout: the
    # back-off grows with each refusal (24.05+), so the first commands after the flood may be slow.
    patient = SlurmHook(settings=replace(slurm_settings, rpc_bucket_size=None, rpc_refill_rate=None))
    ids: list[str] = []
    flood = f"/tmp/hook_{TOKEN}_flood"
    try:
        took = []
        for k in range(2):
            started = time.monotonic()
            ids.append(
                hook.submit(
                    sleep_script, f"hook_{TOKEN}_site{k}", log_dir=f"{run_dir}/logs", extra_args=["--begin=now+1hour"]
                )
            )
            took.append(time.monotonic() - started)
        captured = capfd.readouterr()
        waits = [line for line in (captured.out + captured.err).splitlines() if "RPC budget" in line]
        assert len(waits) == 1, waits  # the first took 7 of 8 tokens; the second waited 6 / 1.6 s for its own
        assert f"hook_{TOKEN}_site1 waited " in waits[0], waits
        assert "the site limits RPCs (rl_enable: bucket 10, 2 per 1 s)" in waits[0], waits
        assert "bucket of 8, 1.6 per s" in waits[0], waits
        assert took[1] >= 6 / 1.6 - 0.3, took
        # Another terminal of the same user spends the site's bucket for 20 s.
        assert (
            ssh_run(
                f"touch {flood}; for k in 1 2 3 4 5 6; do "
                f"nohup sh -c 'while [ -e {flood} ]; do squeue -h -u \"$USER\"; done' >/dev/null 2>&1 </dev/null & done"
            )[0]
            == 0
        )
        answered, errors, slowed = 0, 0, 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                states = hook.get_states(ids)
            except (StatusQueryError, CommandTimeoutError):
                errors += 1
            else:
                answered += 1  # an answer is every job's, as it is
                assert {job: state.tao_state for job, state in states.items()} == {job: TaoState.PENDING for job in ids}
            slowed += time.monotonic() - started > 1.0
        assert slowed >= 1, (answered, errors, slowed)  # the limiter did make the provider wait
        ssh_run(f"rm -f {flood}")

        def answered_again() -> bool:
            try:
                return len(patient.get_states(ids)) == 2
            except (StatusQueryError, CommandTimeoutError):
                return False

        wait_until(answered_again, "an answer once the other commands stopped", timeout=90)
    finally:
        ssh_run(f"rm -f {flood}")
        hook.close()
        try:
            patient.cancel(ids)
        finally:
            patient.close()


def test_cancel_is_idempotent_and_ends_cancelled(
    slurm_hook: SlurmHook, sleep_script: str, run_dir: str, cluster: ClusterEnv
) -> None:
    name = f"hook_{TOKEN}_cancel"
    job_id = slurm_hook.submit(sleep_script, name, log_dir=f"{run_dir}/logs")
    try:
        wait_until(
            lambda: slurm_hook.get_states([job_id])[job_id].tao_state is TaoState.RUNNING,
            f"job {job_id} RUNNING",
            timeout=60,
        )
        slurm_hook.cancel([job_id], job_name=f"{name}_not_ours")
        time.sleep(1)
        assert not slurm_hook.get_states([job_id])[job_id].is_terminal  # the name guard spared it
        slurm_hook.cancel([job_id])
        slurm_hook.cancel([job_id])
        slurm_hook.cancel([UNKNOWN_JOB_ID])
        slurm_hook.cancel([job_id, UNKNOWN_JOB_ID], job_name=name)
    finally:
        slurm_hook.cancel([job_id])
    final = wait_until(
        lambda: (s := slurm_hook.get_states([job_id])[job_id]).raw_state.startswith("CANCELLED by") and s,
        f"sacct record of cancelled job {job_id}",
    )
    assert (final.tao_state, final.raw_state, final.source) == (
        TaoState.CANCELED,
        f"CANCELLED by {cluster.uid}",
        "sacct",
    )


def test_ambiguous_submission_is_reconciled_by_exact_name(
    slurm_settings: ClusterSettings,
    cluster: ClusterEnv,
    ssh_run: SshRun,
    quick_script: str,
    run_dir: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hook's one round trip says the outcome is unknown; the lifecycle's submission finds the job by name."""
    name = f"hook_{TOKEN}_fault"
    hook = SlurmHook(settings=replace(slurm_settings, port=cluster.fault_port))
    monkeypatch.setattr(submission, "RECONCILE_TIMEOUT_S", 10)
    monkeypatch.setattr(submission, "RECONCILE_INTERVAL_S", 0.5)
    try:
        job_id = submission.submit_job(hook, quick_script, name, log_dir=f"{run_dir}/logs", log=hook.log)
    finally:
        hook.close()
    assert jobs_named(ssh_run, name)[0] == [job_id]
    replies = [line.split("\t")[1:] for line in Path(cluster.fault_sbatch_log).read_text().splitlines()]
    assert ["0", job_id] in replies  # sbatch really answered, and the session was cut before we read it
    # released (not left held), its log directory created: it runs to completion; sacct by name lags
    assert wait_until(lambda: (ids := jobs_named(ssh_run, name))[1] and ids, f"sacct row of {name}") == (
        [job_id],
        [job_id],
    )
    log = f"{run_dir}/logs/{name}-{job_id}/main.out"
    assert wait_until(lambda: ssh_run(join(["cat", log]))[1], f"output of job {job_id}") == f"done {job_id}\n"


def test_async_run_never_repeats_a_command_whose_connection_dropped(
    slurm_settings: ClusterSettings, cluster: ClusterEnv, ssh_run: SshRun
) -> None:
    name = f"hook_{TOKEN}_asyncfault"
    hook = SlurmHook(settings=replace(slurm_settings, port=cluster.fault_port))
    command = join(
        ["sbatch", "--parsable", "-J", name, "-p", cluster.cpu_partition, "-o", "/dev/null", "--wrap", "true"]
    )

    with pytest.raises(ConnectionLostError):
        asyncio.run(_a_run_once(hook, command))
    assert len(jobs_named(ssh_run, name)[0]) == 1


# ---------------------------------------------------------------------- logs and files


@pytest.fixture
def log_reader(slurm_hook: SlurmHook, request: pytest.FixtureRequest) -> Iterator[Callable[..., LogChunk]]:
    """``read(path, offset, max_bytes)`` through ``read_log`` or, on one event loop, ``a_read_log``."""
    if request.param == "sync":
        yield slurm_hook.read_log
        return
    with asyncio.Runner() as runner:
        try:
            yield lambda path, offset, max_bytes: runner.run(slurm_hook.a_read_log(path, offset, max_bytes))
        finally:
            runner.run(async_pool().close_all())


@pytest.mark.parametrize("log_reader", ["sync", "async"], indirect=True)
def test_log_is_read_by_offset_and_restarts_after_truncation(
    log_reader: Callable[..., LogChunk], ssh_run: SshRun, run_dir: str
) -> None:
    path = f"{run_dir}/{uuid.uuid4().hex}.log"
    text = "abcde€ line\nünï 🙂 €€\ntail\n"
    raw = text.encode()
    assert raw[5:8] == "€".encode()  # the first 7-byte chunk ends inside "€"
    assert ssh_run(f"cat > {quote(path)}", stdin=text)[0] == 0
    chunks = [log_reader(path, 0, 7)]
    assert chunks[0] == LogChunk(size=len(raw), data="abcde", next_offset=5)
    while chunks[-1].next_offset < len(raw):
        assert len(chunks) < len(raw), "log reading makes no progress"
        chunks.append(log_reader(path, chunks[-1].next_offset, 7))
    assert "".join(c.data for c in chunks) == text
    assert all(c.size == len(raw) and not c.restarted for c in chunks)
    starts = [0] + [c.next_offset for c in chunks[:-1]]
    held_back = [c for start, c in zip(starts, chunks, strict=True) if c.next_offset - start < min(7, len(raw) - start)]
    assert [c.data for c in held_back] == ["abcde", " 🙂 "]  # "€" then "€" cut by the 7-byte limit: read next time
    end = chunks[-1].next_offset
    assert log_reader(path, end, 7) == LogChunk(size=len(raw), data="", next_offset=end)
    # a requeued rerun truncates the output file (JobFileAppend=0) and writes it anew
    assert ssh_run(f": > {quote(path)} && printf 'rerun\\n' >> {quote(path)}")[0] == 0
    assert log_reader(path, end, 7) == LogChunk(size=6, data="", next_offset=0, restarted=True)
    assert log_reader(path, 0, 7) == LogChunk(size=6, data="rerun\n", next_offset=6)
    assert log_reader(f"{path}.missing", 0, 7) == LogChunk(size=0, data="", next_offset=0)


class ArgvSampler(threading.Thread):
    """Samples every process's command line on this machine (the login host) with ``ps -eww -o args=``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append(subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True).stdout)


@pytest.mark.alone
def test_enroot_credentials_are_private_and_never_leak(
    slurm_hook: SlurmHook,
    ssh_run: SshRun,
    cluster: ClusterEnv,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    sent_commands: list[str],
) -> None:
    secret = "nvapi-" + secrets.token_urlsafe(32)
    path = "~/.config/enroot/.credentials"
    rc, backup, _ = ssh_run(f"cat {path}")
    caplog.set_level(logging.DEBUG)
    for name in ("airflow", "paramiko", "paramiko.transport", "asyncssh", "airflow_provider_tao_slurm"):
        caplog.set_level(logging.DEBUG, logger=name)
    sshd_logs = sorted(Path(cluster.state_dir, "log").glob("sshd*.log"))
    assert sshd_logs
    try:
        sampler = ArgvSampler()
        sampler.start()
        try:
            for _ in range(40):  # install again (idempotent) until ps has seen it running
                slurm_hook.install_enroot_credentials("nvcr.io", secret)
                if any(".config/enroot/.credentials" in sample for sample in sampler.samples):
                    break
        finally:
            sampler.done.set()
            sampler.join()
        captured = capfd.readouterr()
        assert any(".config/enroot/.credentials" in sample for sample in sampler.samples), "ps never saw the install"
        assert not any(secret in sample for sample in sampler.samples)
        assert sent_commands
        assert not any(secret in command for command in sent_commands)
        assert caplog.records
        assert not any(secret in record.getMessage() for record in caplog.records)
        assert secret not in caplog.text
        assert secret not in captured.out + captured.err
        for log in sshd_logs:
            assert secret not in log.read_text(errors="replace")
        rc_now, listing, err = ssh_run(f"stat -c %a {path} && cat {path}")
        assert rc_now == 0, err
        mode, *lines = listing.splitlines()
        assert mode == "600"
        assert sorted(line for line in lines if secret in line) == [
            f"machine authn.nvidia.com login $oauthtoken password {secret}",
            f"machine nvcr.io login $oauthtoken password {secret}",
        ]
    finally:
        if rc == 0:
            ssh_run(f"umask 077 && cat > {path}", stdin=backup)
        else:
            ssh_run(f"rm -f {path}")


# ---------------------------------------------------------------------- controller down


@pytest.fixture
def controller_stopped() -> Iterator[None]:
    """Stop slurmctld; afterwards restart slurmdbd and slurmctld (the harness waits until both nodes have
    registered again; it does not require them idle, since other suites may run jobs at the same time)."""
    harness("stop-slurmctld")
    try:
        yield
    finally:
        harness("start-slurmdbd")
        harness("start-slurmctld")


@pytest.mark.alone
def test_controller_down_still_answers_from_accounting_then_fails_clearly(
    slurm_settings: ClusterSettings,
    slurm_hook: SlurmHook,
    finished_job: str,
    controller_stopped: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """squeue -j needs ~18 s to give up on a dead controller, so both polls run at once (two hooks):
    the second one's sacct is held back until slurmdbd is stopped too."""
    slurmdbd_stopped = threading.Event()
    both_down = SlurmHook(settings=slurm_settings)
    run = both_down.run

    def run_sacct_after_slurmdbd_stopped(command: str, **kwargs: Any) -> CommandResult:
        if command.startswith("sacct ") and not slurmdbd_stopped.wait(60):
            pytest.fail("slurmdbd was never stopped")
        return run(command, **kwargs)

    monkeypatch.setattr(both_down, "run", run_sacct_after_slurmdbd_stopped)
    with ThreadPoolExecutor(1) as executor:
        later = executor.submit(both_down.get_states, [finished_job])
        try:
            started = time.monotonic()
            state = slurm_hook.get_states([finished_job])[finished_job]
            waited = time.monotonic() - started
            harness("stop-slurmdbd")
        finally:
            slurmdbd_stopped.set()
        with pytest.raises(StatusQueryError) as caught:
            later.result(timeout=60)
    both_down.close()
    assert (state.tao_state, state.source, state.exit_code) == (TaoState.COMPLETE, "sacct", 0)
    assert waited > 5  # squeue really waited for the dead controller before sacct answered
    message = str(caught.value)
    assert caught.value.unanswered == [finished_job]  # not answered is never "not found"
    assert "squeue exited" in message
    assert "sacct exited" in message
    assert "slurmctld and slurmdbd" in message
    assert "Connection refused" in caught.value.evidence


# ---------------------------------------------------------------------- async side


def test_twenty_concurrent_async_polls_share_one_connection(slurm_settings: ClusterSettings, finished_job: str) -> None:
    hook = SlurmHook(settings=slurm_settings)

    async def poll_twenty() -> tuple[list[dict[str, object]], int]:
        pool = async_pool()
        before = pool.opened
        try:
            results = await asyncio.gather(*(hook.a_get_states([finished_job]) for _ in range(20)))
            return list(results), pool.opened - before
        finally:
            await pool.close_all()

    results, opened = asyncio.run(poll_twenty())
    assert opened == 1
    assert len(results) == 20
    assert all(r[finished_job].tao_state is TaoState.COMPLETE for r in results)  # type: ignore[attr-defined]


def _server_pid(local_port: int, server_port: int) -> int:
    """The sshd process serving the client socket ``127.0.0.1:local_port``."""
    out = subprocess.run(
        ["ss", "-H", "-t", "-n", "-p", "state", "established", "src", f"127.0.0.1:{server_port}", "dst",
         f"127.0.0.1:{local_port}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    pids = [int(p) for p in re.findall(r"pid=(\d+)", out)]
    assert pids, out
    return min(pids)


def _parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.alone
def test_async_pool_reconnects_after_sshd_restart(
    slurm_settings: ClusterSettings, cluster: ClusterEnv, finished_job: str
) -> None:
    hook = SlurmHook(settings=slurm_settings)
    pidfile = Path(cluster.state_dir, "run", "sshd.pid")

    async def scenario() -> tuple[int, int, int]:
        pool = async_pool()
        try:
            await hook.a_get_states([finished_job])
            old = await pool.connection(slurm_settings)
            old_port = old.get_extra_info("sockname")[1]
            opened = pool.opened
            await asyncio.to_thread(harness, "restart-sshd")
            # OpenSSH keeps established sessions across a listener restart; a real restart of the login
            # host drops them: reset the server side of our pooled connection.
            subprocess.run(
                ["ss", "-K", "-t", "src", f"127.0.0.1:{cluster.port}", "dst", f"127.0.0.1:{old_port}"], check=True
            )
            states = await hook.a_get_states([finished_job])
            assert states[finished_job].tao_state is TaoState.COMPLETE
            new = await pool.connection(slurm_settings)
            assert new is not old
            served_by = _parent_pid(_server_pid(new.get_extra_info("sockname")[1], cluster.port))
            return pool.opened - opened, served_by, int(pidfile.read_text().split()[0])
        finally:
            await pool.close_all()

    reconnects, served_by, listener = asyncio.run(scenario())
    assert reconnects == 1
    assert served_by == listener  # the new connection came from the restarted sshd


# ---------------------------------------------------------------------- test_connection


def test_connection_succeeds_through_the_default_airflow_connection(slurm_connection_env: str) -> None:
    hook = SlurmHook(slurm_connection_env)
    try:
        ok, message = hook.test_connection()
    finally:
        hook.close()
    assert ok, message
    assert "127.0.0.1" in message


@pytest.mark.parametrize("results_dir", ["/usr", f"/srv/lustre/absent_{TOKEN}/results"], ids=["read-only", "missing"])
def test_connection_reports_a_results_dir_that_is_not_writable(
    slurm_settings: ClusterSettings, results_dir: str
) -> None:
    hook = SlurmHook(settings=replace(slurm_settings, results_dir=results_dir))
    try:
        ok, message = hook.test_connection()
    finally:
        hook.close()
    assert not ok
    assert f"results_dir {results_dir} is not writable by {slurm_settings.user}" in message
    assert "set the results_dir extra" in message
