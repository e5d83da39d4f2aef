"""Benchmark 1: status polling at scale, the shared poller against one SSH connection per job and per-job squeue.

For N = 1, 100, 1000 held jobs on the local test cluster, N triggers run in one event loop the way
Airflow's triggerer runs them (rebuilt from ``serialize()``, ``greenback.ensure_portal()``, then
``async for event in trigger.run()``), each mode in a fresh worker process:

- ``shared``: N :class:`SlurmJobTrigger` s (one shared poller, one pooled connection);
- ``baseline``: N of the SSH provider's own ``SSHRemoteJobTrigger`` (the trigger of its
  ``SSHRemoteJobOperator``, unchanged; counted around its methods by :func:`_count_ssh_trigger`), each
  pointed at its job's exit-code file and log, as users would watch a batch job with it. It never asks the
  scheduler, so it is the baseline of every figure but the scheduler's;
- ``perjob``: the per-job scheduler pattern, the baseline of the scheduler figures: N
  :class:`_perjob_trigger.PerJobSqueueTrigger` s, each asking about its own job every interval
  (``squeue -h -t all -j <id>``, then ``sacct`` once squeue no longer shows it: the provider's
  ``a_get_states`` on one id) over the same pooled connection, so only the number of scheduler queries differs.
  Its scheduler job queries are counted in a window of :data:`WINDOWS` intervals (sdiag + sacctmgr), less the
  other users' background measured in an equal window right before its triggers start, and on the client
  (the ``squeue`` and ``sacct`` commands it sent), as the shared poller's are.

What the real trigger does (apache-airflow-providers-ssh 7.0.1,
``airflow/providers/ssh/triggers/ssh_remote_job.py``, "ssh_remote_job.py" below): it opens its own
connection with ``SSHHookAsync`` (:129-138, no client-side throttle) and holds it for its whole loop
(:248-259, closed at :323-325); each poll runs ``test -s <exit_code_file> && cat <exit_code_file> || true``
(:168-183, ``utils/remote_job.py``:386-394), then ``stat -c%s <log> ... || echo 0`` (:185-196,
``remote_job.py``:356-364) and, when the log grew, ``tail -c +<offset+1> <log> | head -c <chunk>`` (:198-220,
``remote_job.py``:314-325); it sleeps ``poll_interval`` (:317) and ends when the exit-code file holds a number
(:296-312). A failed connection or command closes the connection and waits ``min(2^(k-1), 30) * (1 + U(0, 1))``
seconds (:150-153, :264-272, :286-290); more than ``max_reconnect_attempts`` (5) failures in a row end it with an
error event (:260-263, :288-289, :319-322). It never asks the scheduler.

Can it watch a SLURM batch job? Only the end a job's script reaches itself. Pointed at the provider's
exit-code file (``handle["exit_code_path"]``: the batch script writes the step's exit code there, a temporary
file renamed into place, after the step; ``templates/slurm/single_node.sbatch.j2``) and the job's log, it sees
a job that runs its script to the end. An end that runs no line of the script writes no file, and the
trigger then polls until the task's timeout: a job cancelled while pending or held (never started), a cancel
or time limit before the step starts (the TERM trap exits 143), SIGKILL after ``KillWait`` (a step that
ignores SIGTERM), a node failure, the batch shell killed for memory; a requeued job removes the file when it
starts again and the trigger cannot tell a rerun from a wait. So it measures the cost of watching N jobs
per job (connections, commands, CPU, the login node, the start storm: its loop does not depend on what the
files hold), and the latency of the ends it can see: the held jobs here never run, so when the end phase
cancels a batch it writes their exit-code files the way the script does, and latency is measured from that
write. Its jobs' logs are empty (a running job that wrote nothing since the last poll): its cheapest poll, two
commands; a job writing lines costs a third.

Both talk to the test cluster's login sshd with OpenSSH's default limits (``MaxStartups 10:30:100``,
``MaxSessions 10``), which runs in a cgroup of its own (:class:`_common.LoginCgroup`): the CPU time
and peak memory of sshd, its sessions and the commands they run are measured apart from
everything else on the machine.

Each worker starts its N triggers at once (the start storm): the time until every job's state is known,
connection attempts, and attempts the login host refused (a baseline trigger gives up after more than 5
failures in a row, so its job's state is then never known; the provider's jobs never known are those no status
query had answered with a state by the end of the start, which the shared poller's first query covering every
job ends). Recovery after a real triggerer restart
(``airflow triggerer`` SIGKILLed and a new one started) is measured by ``benchmarks/restart.py``.

Per mode and N: after every trigger has its first answer, a window of :data:`WINDOWS` poll
intervals measures scheduler queries (slurmctld ``sdiag`` and slurmdbd ``sacctmgr show stats``
counters, reset at the window's start; they include any other cluster user's traffic, which the
shared and per-job runs also measure in an equal window before their triggers start), status commands sent
(and by program: ``squeue``, ``sacct``),
SSH connections opened, the triggerer's CPU seconds (``time.process_time()`` of the event-loop
process) and the machine's CPU seconds (``/proc/stat``, every process: sshd, squeue, slurmctld,
...). The shared poller's own scheduler queries are then counted exactly: during
:data:`ATTRIBUTED_POLLS` further polls the counters are reset right before and read right after
each of its commands (the smallest count is kept). Memory per trigger is the process's RSS growth
from before the triggers were created to the end of the warm-up, divided by N. Then every job is
cancelled, in 10 batches spread over one interval, and the latency from the return of each
``scancel`` (run locally as root; the jobs ended just before it returned; baseline: from the write of the
batch's exit-code files right after it) to its trigger's event is recorded.

Usage: ``python benchmarks/poller.py [--sizes 1,100,1000] [--interval 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _common  # before Airflow: isolated Airflow home and the bench connections
from _common import Figure
from airflow.providers.ssh.triggers.ssh_remote_job import _CONNECTION_ERRORS, SSHRemoteJobTrigger

from airflow_provider_tao_slurm.core.shell import join

#: The code this benchmark measures (the triggerer's side: the trigger, its shared poller, the hook and what they use);
#: report.py counts the commits that changed it since.
MEASURES = (
    "airflow_provider_tao_slurm/triggers",
    "airflow_provider_tao_slurm/hooks",
    "airflow_provider_tao_slurm/lifecycle",
    "airflow_provider_tao_slurm/core",
    "airflow_provider_tao_slurm/exceptions.py",
)

if TYPE_CHECKING:
    from airflow.triggers.base import TriggerEvent

# Both patterns meet the login sshd with OpenSSH's default limits (connections are looked up when used).
_common.point_connections_at(int(_common.CLUSTER["limits_port"]))

#: Poll intervals per measuring window.
WINDOWS = 3
#: Shared mode: polls whose scheduler queries are counted with the counters reset around each command;
#: the smallest count is reported (other users' queries can only add to it).
ATTRIBUTED_POLLS = 3
#: Jobs are cancelled in this many batches spread over one interval (fewer when N is smaller).
CANCEL_BATCHES = 10
WARMUP_TIMEOUT_S = 240.0
#: At N >= 1000 the login node may spend this share of one core on the watch (CPU seconds per interval over
#: the interval): the login node serves every user of the cluster, so watching thousands of jobs should
#: be lost in its noise (the per-job baseline used about 60% of a core at N = 1000).
LOGIN_CPU_SHARE = 0.01
#: Flat per-job cost: at a shared-only size (N = 5000) each cost divided by N may be at most this many
#: times the same cost per job at the largest size measured with a baseline (N = 1000): a job costs no
#: more when five times as many are watched; the 25% is room for run-to-run noise on a small machine.
FLAT_LIMIT = 1.25
#: The costs that grow with N, compared per job: (what, result key of the whole cost, display scale, unit).
PER_JOB_COSTS = (
    ("triggerer CPU per interval", "cpu_s_per_interval", 1e6, "us"),
    ("login node CPU per interval", "login_cpu_s_per_interval", 1e6, "us"),
    ("start storm: time until every state is known", "warmup_s", 1e3, "ms"),
    ("RSS growth", "rss_growth_bytes", 1 / 1024, "KB"),
)


@dataclass
class Counters:
    """What the worker counts on the client side.

    :ivar commands: the baseline triggers' commands (the provider's are counted where they go out,
        by :class:`_common.SentCommands`).
    """

    commands: int = 0
    connections: int = 0
    connect_failures: int = 0
    command_failures: int = 0
    first_polls: int = 0
    gave_up: int = 0


COUNTERS = Counters()
#: Set whenever something the orchestration waits for happened (a poll, a first answer, an event).
PROGRESS = asyncio.Event()
#: Completion times and sizes of the status queries (the shared poller's batched ones; per job: one id each).
POLLS: list[tuple[float, int]] = []
#: Jobs a status query answered for, and those whose answer was a state (not UNKNOWN).
ANSWERED: set[str] = set()
KNOWN: set[str] = set()


#: The ends the baseline sees: each watched job's exit-code file holds this, written as the batch script does.
BASELINE_EXIT_CODE = "0"
#: The event status each mode's trigger sends for such an end.
EXPECTED_STATUS = {"shared": "terminal", "baseline": "success", "perjob": "terminal"}


def job_files(directory: str, job_id: str) -> tuple[str, str]:
    """The exit-code file and log the baseline trigger watches for ``job_id`` under ``directory``."""
    return f"{directory}/{job_id}/exit_codes", f"{directory}/{job_id}/main.out"


def _count_ssh_trigger() -> None:
    """Count what the SSH provider's own ``SSHRemoteJobTrigger`` does, around its methods (its loop is unchanged).

    Connections and connection failures at ``_connect``, commands and command failures at ``_run_command``,
    a trigger's first complete poll when ``_read_log_chunk`` (a poll's last step) returns, giving up at
    ``_error_event``.
    """
    trigger = SSHRemoteJobTrigger
    connect, run_command, read_log_chunk, error_event = (
        trigger._connect,
        trigger._run_command,
        trigger._read_log_chunk,
        trigger._error_event,
    )
    polled: set[str] = set()

    async def counted_connect(self: SSHRemoteJobTrigger) -> Any:
        try:
            conn = await connect(self)
        except _CONNECTION_ERRORS:
            COUNTERS.connect_failures += 1
            raise
        COUNTERS.connections += 1
        return conn

    async def counted_run_command(self: SSHRemoteJobTrigger, conn: Any, command: str) -> tuple[int, str, str]:
        try:
            result = await run_command(self, conn, command)
        except _CONNECTION_ERRORS:
            COUNTERS.command_failures += 1
            raise
        COUNTERS.commands += 1
        return result

    async def counted_read_log_chunk(self: SSHRemoteJobTrigger, conn: Any) -> tuple[str, int]:
        result = await read_log_chunk(self, conn)
        if self.job_id not in polled:
            polled.add(self.job_id)
            COUNTERS.first_polls += 1
            PROGRESS.set()
        return result

    def counted_error_event(self: SSHRemoteJobTrigger, message: str) -> TriggerEvent:
        COUNTERS.gave_up += 1
        PROGRESS.set()
        return error_event(self, message)

    trigger._connect = counted_connect  # type: ignore[method-assign]
    trigger._run_command = counted_run_command  # type: ignore[method-assign]
    trigger._read_log_chunk = counted_read_log_chunk  # type: ignore[method-assign]
    trigger._error_event = counted_error_event  # type: ignore[method-assign]


def _write_exit_codes(directory: str, job_ids: list[str]) -> None:
    """Write each job's exit-code file as the batch script does at its end: a temporary file, then a rename."""
    for job_id in job_ids:
        exit_code_file = Path(job_files(directory, job_id)[0])
        tmp = exit_code_file.with_name(f"{exit_code_file.name}.tmp")
        tmp.write_text(f"{BASELINE_EXIT_CODE}\n")
        tmp.replace(exit_code_file)


# ------------------------------------------------------------------------------------ worker side


def _rebuild(trigger: Any) -> Any:
    """What the triggerer does: the trigger row holds classpath + kwargs; the class is imported."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


async def _run_trigger(trigger: Any, events: dict[str, tuple[float, dict[str, Any]]]) -> None:
    """The triggerer's ``run_trigger`` reduced to what costs time: portal, the async loop, cleanup."""
    import greenback

    await greenback.ensure_portal()
    try:
        async for event in trigger.run():
            events[trigger.job_id if isinstance(trigger, SSHRemoteJobTrigger) else trigger.slurm_job_id] = (
                time.time(),
                event.payload,
            )
            PROGRESS.set()
    finally:
        await trigger.cleanup()


async def _wait_for(what: str, done: Any, timeout: float) -> None:
    """Wait until ``done()`` holds, re-checking it whenever the instrumentation reports progress.

    Event driven, not polled: a polling loop here would show up in the triggerer's CPU figures.
    """
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        PROGRESS.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(PROGRESS.wait(), timeout=left)


async def _warm_connection() -> None:
    """Open and close one connection so both modes start with asyncssh's lazy setup already paid."""
    from airflow.providers.ssh.hooks.ssh import SSHHookAsync

    conn = await SSHHookAsync(ssh_conn_id=_common.SSH_CONN_ID).get_conn()
    await conn.run("true", check=False)
    conn.close()
    await conn.wait_closed()


async def measure(mode: str, job_ids: list[str], interval: float, files: str | None = None) -> dict[str, Any]:
    """Run N triggers of ``mode`` over ``job_ids`` and return the raw measurements.

    :param files: baseline: the directory of the jobs' exit-code files and logs (:func:`job_files`).
    """
    from _perjob_trigger import STATS as PERJOB
    from _perjob_trigger import PerJobSqueueTrigger

    from airflow_provider_tao_slurm.core.states import TaoState
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook, async_pool
    from airflow_provider_tao_slurm.triggers.poller import active_pollers
    from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

    n = len(job_ids)
    wanted = set(job_ids)
    pool = async_pool()
    sent = _common.SentCommands(pool)

    def commands() -> int:
        """Status commands sent: the provider's through the pool, the baseline triggers' counted by them."""
        return sent.count + COUNTERS.commands

    attributed: list[dict[str, int]] = []

    async def bracketed(send: Callable[[], Awaitable[Any]]) -> Any:
        await asyncio.to_thread(_common.reset_rpc_counts)  # bracket this one command with the counters
        try:
            return await send()
        finally:
            attributed.append(_common.summarize_rpcs(await asyncio.to_thread(_common.rpc_counts)))

    original_get_states = SlurmHook.a_get_states

    async def recorded_get_states(self: SlurmHook, job_ids: Any, **kwargs: Any) -> Any:
        ids = list(job_ids)
        states = await original_get_states(self, ids, **kwargs)
        POLLS.append((time.monotonic(), len(ids)))
        ANSWERED.update(states)
        KNOWN.update(job_id for job_id, state in states.items() if state.tao_state != TaoState.UNKNOWN)
        PROGRESS.set()
        return states

    SlurmHook.a_get_states = recorded_get_states  # type: ignore[method-assign]
    await _warm_connection()
    background: dict[str, float] = {}
    if mode != "baseline":  # other users' scheduler traffic in a window of the same length, before we start
        await asyncio.to_thread(_common.reset_rpc_counts)
        await asyncio.sleep(WINDOWS * interval)
        quiet = _common.summarize_rpcs(await asyncio.to_thread(_common.rpc_counts))
        background = {k: v / WINDOWS for k, v in quiet.items()}
    await asyncio.to_thread(_common.rpc_counts)  # starts the helper thread before the memory baseline
    login = _common.LoginCgroup.attach()
    gc.collect()
    rss0 = _common.rss_bytes()
    login_start = login.cpu_seconds() if login else float("nan")
    cpu_start, t_start = time.process_time(), time.monotonic()

    now = time.time()
    if mode == "shared":
        triggers = [
            _rebuild(SlurmJobTrigger(_common.SLURM_CONN_ID, job_id, f"bench-{job_id}", interval, submitted_at=now))
            for job_id in job_ids
        ]
    elif mode == "perjob":
        triggers = [_rebuild(PerJobSqueueTrigger(_common.SLURM_CONN_ID, job_id, interval)) for job_id in job_ids]
    else:
        assert files is not None, "the baseline watches files"
        _count_ssh_trigger()
        triggers = [
            _rebuild(
                SSHRemoteJobTrigger(
                    ssh_conn_id=_common.SSH_CONN_ID,
                    remote_host=None,
                    job_id=job_id,
                    job_dir=f"{files}/{job_id}",
                    log_file=job_files(files, job_id)[1],
                    exit_code_file=job_files(files, job_id)[0],
                    remote_os="posix",
                    poll_interval=interval,  # type: ignore[arg-type]  # seconds; asyncio.sleep takes a float
                )
            )
            for job_id in job_ids
        ]
    events: dict[str, tuple[float, dict[str, Any]]] = {}
    tasks = [asyncio.create_task(_run_trigger(t, events)) for t in triggers]

    def polls() -> int:
        return len(POLLS)

    try:
        if mode == "shared":
            await _wait_for("a poll covering every job", lambda: any(size == n for _, size in POLLS), WARMUP_TIMEOUT_S)
        elif mode == "perjob":
            await _wait_for(
                "every job's first answer (or its trigger giving up)",
                lambda: len(ANSWERED & wanted) + PERJOB["gave_up"] >= n,
                WARMUP_TIMEOUT_S,
            )
        else:
            await _wait_for(
                "every trigger's first poll (or its giving up)",
                lambda: COUNTERS.first_polls + COUNTERS.gave_up >= n,
                WARMUP_TIMEOUT_S,
            )
        warmup_s = time.monotonic() - t_start
        warmup_cpu_s = time.process_time() - cpu_start
        warmup_login_cpu_s = (login.cpu_seconds() if login else float("nan")) - login_start
        stats = [p.stats for p in active_pollers()]
        if mode == "shared":
            warmup_attempts = pool.opened + sum(s.failures for s in stats)
            warmup_refused = sum(s.failures for s in stats)
        elif mode == "perjob":
            warmup_attempts = pool.opened + PERJOB["failures"]
            warmup_refused = PERJOB["failures"]
        else:
            warmup_attempts = COUNTERS.connections + COUNTERS.connect_failures
            warmup_refused = COUNTERS.connect_failures
        # Never known: the SSH triggers that gave up; the provider's: jobs no status query answered with a state
        # by the end of the warm-up (the shared poller's warm-up ends at its first query covering every job).
        warmup_unknown = COUNTERS.gave_up if mode == "baseline" else n - len(KNOWN & wanted)
        gc.collect()
        rss1 = _common.rss_bytes()

        # ---- steady window: WINDOWS poll intervals, nothing ends
        if mode == "shared":
            target = polls() + 1
            await _wait_for("the next poll", lambda: polls() >= target, 4 * interval + 60)
        await asyncio.to_thread(_common.reset_rpc_counts)
        commands0, machine0, programs0 = commands(), _common.machine_cpu_seconds(), dict(sent.programs)
        if login:
            login.reset_peak()
        login0 = login.cpu_seconds() if login else float("nan")
        cpu0, wall0 = time.process_time(), time.monotonic()
        if mode == "shared":
            target = polls() + WINDOWS
            await _wait_for("the measured polls", lambda: polls() >= target, WINDOWS * (4 * interval + 60))
        else:
            await asyncio.sleep(WINDOWS * interval)
        cpu1, wall1 = time.process_time(), time.monotonic()
        commands1, machine1, programs1 = commands(), _common.machine_cpu_seconds(), dict(sent.programs)
        login1 = login.cpu_seconds() if login else float("nan")
        login_peak = login.peak_bytes() if login else None
        rpcs = await asyncio.to_thread(_common.rpc_counts)

        # ---- shared: the scheduler queries of single polls, counters reset around each command
        per_poll: list[int] = []
        if mode == "shared":
            for _ in range(ATTRIBUTED_POLLS):
                attributed.clear()
                sent.around = bracketed
                target = polls() + 1
                await _wait_for("an attributed poll", lambda t=target: polls() >= t, 4 * interval + 60)
                sent.around = None
                per_poll.append(sum(a["ctld_job_queries"] + a["dbd_job_queries"] for a in attributed))

        # ---- end phase: cancel every job, spread over one interval; latency scancel -> event
        order = list(job_ids)
        random.shuffle(order)
        batches = min(n, CANCEL_BATCHES)
        cancelled_at: dict[str, float] = {}
        scancel_s: list[float] = []
        end_commands0, end_polls0 = commands(), polls()
        phase = time.time()
        for k in range(batches):
            batch = order[k::batches]
            await asyncio.sleep(max(0.0, phase + (k + random.random()) * interval / batches - time.time()))
            issued = time.time()
            await asyncio.to_thread(_common.cancel_jobs, batch)
            if files is not None:  # the baseline sees an end by its exit-code file, written as the job's script does
                await asyncio.to_thread(_write_exit_codes, files, batch)
            done = time.time()  # the jobs ended between issued and done; done is the tighter bound
            scancel_s.append(done - issued)
            cancelled_at.update(dict.fromkeys(batch, done))
        end_timeout = 6 * interval + 60
        try:
            await _wait_for("every trigger's event", lambda: len(events) >= n, end_timeout)
        except TimeoutError:
            print(f"warning: {n - len(events)} of {n} events missing after {end_timeout:.0f} s", file=sys.stderr)
        end_commands, end_polls = commands() - end_commands0, polls() - end_polls0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.close_all()

    latencies = [at - cancelled_at[job_id] for job_id, (at, _) in events.items() if job_id in cancelled_at]
    wrong = [job_id for job_id, (_, payload) in events.items() if payload.get("status") != EXPECTED_STATUS[mode]]
    pollers_stats = [asdict(p.stats) for p in active_pollers()]
    return {
        "mode": mode,
        "n": n,
        "interval_s": interval,
        "windows": WINDOWS,
        "window_wall_s": wall1 - wall0,
        "warmup_s": warmup_s,
        "warmup_cpu_s": warmup_cpu_s,
        "warmup_login_cpu_s": warmup_login_cpu_s,
        "warmup_connection_attempts": warmup_attempts,
        "warmup_refused": warmup_refused,
        "warmup_states_never_known": warmup_unknown,
        "login_cpu_s_per_interval": (login1 - login0) / WINDOWS,
        "login_peak_bytes": login_peak,
        "rss_growth_bytes": rss1 - rss0,
        "rss_per_trigger_bytes": (rss1 - rss0) / n,
        "cpu_s_per_interval": (cpu1 - cpu0) / WINDOWS,
        "machine_cpu_s_per_interval": (machine1 - machine0) / WINDOWS,
        "commands_per_interval": (commands1 - commands0) / WINDOWS,
        "programs_per_interval": {
            program: (count - programs0.get(program, 0)) / WINDOWS
            for program, count in programs1.items()
            if count != programs0.get(program, 0)
        },
        "rpcs": rpcs,
        "rpc_summary_per_interval": {k: v / WINDOWS for k, v in _common.summarize_rpcs(rpcs).items()},
        "background_rpc_summary_per_interval": background,
        "attributed_job_queries_per_poll": per_poll,
        "end_phase_commands": end_commands,
        "end_phase_polls": end_polls,
        "connections_opened": COUNTERS.connections if mode == "baseline" else pool.opened,
        "connect_failures": COUNTERS.connect_failures,
        "poll_failures": sum(s["failures"] for s in pollers_stats) + COUNTERS.command_failures + PERJOB["failures"],
        "gave_up": COUNTERS.gave_up + PERJOB["gave_up"],
        "scancel_max_s": max(scancel_s),
        "events": len(events),
        "wrong_events": wrong[:5],
        "latency_median_s": _common.median(latencies),
        "latency_p95_s": _common.percentile(latencies, 95),
        "latency_max_s": max(latencies) if latencies else float("nan"),
        "poll_durations_s": [round(d, 3) for s in pollers_stats for d in s["durations"]][-8:],
    }


def worker(mode: str, interval: float, output: Path) -> None:
    """Read the job ids (and the baseline's files directory) from stdin, measure, write the measurements as JSON."""
    import logging

    for name in ("asyncssh", "airflow_provider_tao_slurm", "airflow.providers.ssh"):
        logging.getLogger(name).setLevel(logging.WARNING)
    jobs = json.loads(sys.stdin.read())
    result = asyncio.run(measure(mode, jobs["job_ids"], interval, jobs["files"]))
    output.write_text(json.dumps(result))


# ------------------------------------------------------------------------------ orchestrator side


def _create_job_files(directory: str, job_ids: list[str]) -> None:
    """The baseline's files, in one ssh command as the cluster user: a directory and an empty log per job.

    An empty log (a running job that wrote nothing since the last poll) is the SSH trigger's cheapest
    poll: two commands (exit code, log size); a job writing lines adds a third (``tail``).
    """
    _common.ssh(
        f"mkdir -p -- {join([directory])} && cd -- {join([directory])} && ids=$(cat) && mkdir -- $ids && "
        'for i in $ids; do : > "$i/main.out"; done',
        stdin="\n".join(job_ids),
    )


def run_mode(mode: str, n: int, interval: float) -> dict[str, Any]:
    """Create N held jobs, measure one worker over them, cancel what is left."""
    job_ids = _common.create_held_jobs(f"bench-{_common.TOKEN}-{mode}{n}", n)
    files = f"{_common.CLUSTER['results_dir']}/bench-{_common.TOKEN}-files{n}" if mode == "baseline" else None
    jobs = json.dumps({"job_ids": job_ids, "files": files})
    log_path = _common.OUT_DIR / f"poller-{mode}-{n}.log"
    out_path = _common.OUT_DIR / f"poller-{mode}-{n}.json"
    out_path.unlink(missing_ok=True)
    try:
        if files is not None:
            _create_job_files(files, job_ids)
        with log_path.open("w") as log:
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", mode, "--interval", str(interval), "--output", str(out_path)],
                input=jobs,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=900,
                check=False,
            )
    finally:
        _common.cancel_jobs(job_ids)
        if files is not None:
            _common.remove_remote([files])
    if proc.returncode != 0 or not out_path.exists():
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{mode} worker for N={n} failed (rc {proc.returncode}); {log_path}:\n{tail}")
    return dict(json.loads(out_path.read_text()))


def _kb(value: float) -> str:
    return f"{value / 1024:.1f} KB"


def _ratio(ours: float, base: float) -> str:
    return f"{ours / base:.3f}x" if base else "n/a"


def _scheduler_queries(summary: dict[str, float]) -> float:
    return summary["ctld_job_queries"] + summary["dbd_job_queries"]


def figures_for(
    n: int, shared: dict[str, Any], base: dict[str, Any], perjob: dict[str, Any], interval: float
) -> list[Figure]:
    """The printed figures for one N; targets apply at N = 1000.

    Two baselines, each named in the baseline column: the scheduler rows compare with the per-job pattern
    (``perjob``: a trigger per job asking ``squeue -j`` itself, over the same pooled connection), measured on the
    same cluster in a window of its own; the SSH provider's ``SSHRemoteJobTrigger`` (``base``), which never asks the
    scheduler, is the baseline of the other rows (connections, commands, CPU, memory, latency, the start storm).
    """
    at_target = n == 1000
    sq, pq = shared["rpc_summary_per_interval"], perjob["rpc_summary_per_interval"]
    s_queries, p_queries = _scheduler_queries(sq), _scheduler_queries(pq)
    s_bg = _scheduler_queries(shared["background_rpc_summary_per_interval"])
    p_bg = _scheduler_queries(perjob["background_rpc_summary_per_interval"])
    p_own = max(0.0, p_queries - p_bg)  # the per-job pattern's own: its window less the background just before it

    def row(name: str, ours: float, theirs: float, fmt: str, target: str = "", ok: bool | None = None) -> Figure:
        return Figure(
            f"N={n} {name}",
            format(ours, fmt),
            f"SSH trigger: {format(theirs, fmt)}, ratio {_ratio(ours, theirs)}",
            target if at_target else "",
            ok if at_target else None,
        )

    def sent(run: dict[str, Any]) -> float:
        return sum(run.get("programs_per_interval", {}).get(program, 0.0) for program in ("squeue", "sacct"))

    lat_target = interval + 2
    s_rss, b_rss = shared["rss_per_trigger_bytes"], base["rss_per_trigger_bytes"]
    own = min(shared["attributed_job_queries_per_poll"])
    end_per_poll = shared["end_phase_commands"] / max(1, shared["end_phase_polls"])
    return [
        Figure(
            f"N={n} scheduler job queries/interval, cluster-wide window (sdiag+sacctmgr)",
            f"{s_queries:.1f} (other users' background {s_bg:.1f})",
            f"per-job squeue: {p_queries:.1f} (other users' background {p_bg:.1f}), "
            f"ratio {_ratio(s_queries, p_queries)}",
        ),
        Figure(
            f"N={n} scheduler job queries/interval of the poller (sdiag+sacctmgr around its commands)",
            f"{own}",
            f"per-job squeue: {p_own:.1f} (its window less the background before it), ratio {_ratio(own, p_own)}",
            "<= 2" if at_target else "",
            own <= 2 if at_target else None,
        ),
        Figure(
            f"N={n} scheduler job queries/interval sent, counted on the client (squeue + sacct commands)",
            f"{sent(shared):.1f}",
            f"per-job squeue: {sent(perjob):.1f}, ratio {_ratio(sent(shared), sent(perjob))}",
        ),
        Figure(
            f"N={n} status commands per poll while jobs end (client: squeue + sacct)",
            f"{end_per_poll:.1f}",
            "SSH trigger: 2 file commands per job per poll (exit code, log size)",
            "<= 2" if at_target else "",
            end_per_poll <= 2 if at_target else None,
        ),
        Figure(
            f"N={n} slurmctld RPCs/interval, all types, cluster-wide window",
            f"{sq['ctld_rpcs']:.1f}",
            f"per-job squeue: {pq['ctld_rpcs']:.1f}, ratio {_ratio(sq['ctld_rpcs'], pq['ctld_rpcs'])}",
        ),
        row(
            "status commands sent/interval (client)",
            shared["commands_per_interval"],
            base["commands_per_interval"],
            ".1f",
        ),
        row(
            "SSH connections opened",
            shared["connections_opened"],
            base["connections_opened"],
            "d",
            "1",
            shared["connections_opened"] == 1,
        ),
        row(
            "triggerer CPU s/interval",
            shared["cpu_s_per_interval"],
            base["cpu_s_per_interval"],
            ".3f",
            "<= 0.05",
            shared["cpu_s_per_interval"] <= 0.05,
        ),
        row(
            "machine CPU s/interval (all processes)",
            shared["machine_cpu_s_per_interval"],
            base["machine_cpu_s_per_interval"],
            ".2f",
        ),
        Figure(
            f"N={n} RSS growth per trigger",
            _kb(s_rss),
            f"SSH trigger: {_kb(b_rss)}, ratio {_ratio(s_rss, b_rss)}",
            "< 50 KB" if at_target else "",
            s_rss < 50 * 1024 if at_target else None,
        ),
        row(
            "latency job end (scancel; baseline: exit-code file written) -> event, median s",
            shared["latency_median_s"],
            base["latency_median_s"],
            ".2f",
        ),
        row(
            "latency job end (scancel; baseline: exit-code file written) -> event, p95 s",
            shared["latency_p95_s"],
            base["latency_p95_s"],
            ".2f",
            f"<= {lat_target:g}",
            shared["latency_p95_s"] <= lat_target and shared["events"] == n,
        ),
        Figure(
            f"N={n} events received (correct)",
            f"{shared['events']}/{n} ({shared['events'] - len(shared['wrong_events'])})",
            f"SSH trigger: {base['events']}/{n} ({base['events'] - len(base['wrong_events'])}); per-job squeue: "
            f"{perjob['events']}/{n} ({perjob['events'] - len(perjob['wrong_events'])})",
        ),
        Figure(
            f"N={n} failed polls (cluster restarts by others) / slowest scancel s",
            f"{shared['poll_failures']} / {shared['scancel_max_s']:.2f}",
            f"SSH trigger: {base['poll_failures']} / {base['scancel_max_s']:.2f}",
        ),
        *start_and_login_figures(n, shared, base),
    ]


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MB"


def _storm(run: dict[str, Any]) -> str:
    return f"{run['warmup_connection_attempts']} / {run['warmup_refused']}"


def start_and_login_figures(n: int, shared: dict[str, Any], base: dict[str, Any] | None) -> list[Figure]:
    """The start storm (N triggers started at once by one process) and the login node's own cost.

    The time to every state after a real triggerer restart, and its target, are ``benchmarks/restart.py``'s.
    """

    def pair(key: str, fmt: str) -> tuple[str, str]:
        ours = format(shared[key], fmt)
        if base is None:
            return ours, ""
        return ours, f"SSH trigger: {format(base[key], fmt)}, ratio {_ratio(shared[key], base[key])}"

    unknown = shared["warmup_states_never_known"]
    login_target = LOGIN_CPU_SHARE * shared["interval_s"]
    login_cpu = shared["login_cpu_s_per_interval"]
    return [
        Figure(f"N={n} start storm: time until every job's state is known, s", *pair("warmup_s", ".2f")),
        Figure(
            f"N={n} start storm: connection attempts / refused or failed (login sshd MaxStartups 10:30:100)",
            _storm(shared),
            "" if base is None else f"SSH trigger: {_storm(base)}",
        ),
        Figure(
            f"N={n} start storm: jobs whose state was never known (SSH trigger: gave up; the provider: no state in "
            "its answers by the end of the start)",
            f"{unknown}",
            "" if base is None else f"SSH trigger: {base['warmup_states_never_known']}",
            "0",
            unknown == 0,
        ),
        Figure(
            f"N={n} start storm: login node CPU s (sshd + commands, own cgroup)", *pair("warmup_login_cpu_s", ".2f")
        ),
        Figure(
            f"N={n} login node CPU s/interval (sshd + commands, own cgroup)",
            *pair("login_cpu_s_per_interval", ".3f"),
            f"<= {login_target:.2f} ({LOGIN_CPU_SHARE:.0%} of one core: a login node serves every user)"
            if n >= 1000
            else "",
            None if n < 1000 or math.isnan(login_cpu) else login_cpu <= login_target,
        ),
        Figure(
            f"N={n} login node peak memory in the window (sshd + commands, own cgroup)",
            _mb(shared["login_peak_bytes"]),
            "" if base is None else f"SSH trigger: {_mb(base['login_peak_bytes'])}",
        ),
    ]


def flat_cost_figures(n: int, shared: dict[str, Any], reference: dict[str, Any]) -> list[Figure]:
    """Each cost that grows with N, per job, at ``n`` against the ``reference`` run (a smaller N): flat or not."""
    figures = []
    for what, key, scale, unit in PER_JOB_COSTS:
        ours, theirs = shared[key] / n, reference[key] / reference["n"]
        ratio = ours / theirs if theirs else math.nan
        figures.append(
            Figure(
                f"N={n} flat per-job cost: {what}, per job, against N={reference['n']}",
                f"{ours * scale:.3g} {unit}, {ratio:.2f}x",
                f"N={reference['n']}: {theirs * scale:.3g} {unit} per job",
                f"<= {FLAT_LIMIT:g}x (a job costs no more among {n / reference['n']:g}x as many; 25% for noise)",
                None if math.isnan(ratio) else ratio <= FLAT_LIMIT,
            )
        )
    return figures


def scale_figures(n: int, shared: dict[str, Any], reference: dict[str, Any] | None) -> list[Figure]:
    """The figures of a shared-only size: still one status command per poll, what it costs, and whether each
    job costs what it did at the ``reference`` size (the largest run with a baseline; None: not compared)."""
    own = min(shared["attributed_job_queries_per_poll"])
    per_poll = shared["commands_per_interval"]
    return [
        Figure(
            f"N={n} status commands per poll (client; squeue filtered by user on the server)",
            f"{per_poll:.1f}",
            "",
            "1",
            round(per_poll, 1) == 1.0,
        ),
        Figure(
            f"N={n} scheduler job queries per poll (sdiag+sacctmgr around its commands)", f"{own}", "", "<= 2", own <= 2
        ),
        Figure(
            f"N={n} SSH connections opened",
            f"{shared['connections_opened']}",
            "",
            "1",
            shared["connections_opened"] == 1,
        ),
        Figure(f"N={n} triggerer CPU s/interval", f"{shared['cpu_s_per_interval']:.3f}"),
        Figure(
            f"N={n} RSS growth per trigger",
            _kb(shared["rss_per_trigger_bytes"]),
            "",
            "< 50 KB",
            shared["rss_per_trigger_bytes"] < 50 * 1024,
        ),
        *start_and_login_figures(n, shared, None),
        Figure(
            f"N={n} latency job end (scancel) -> event, p95 s",
            f"{shared['latency_p95_s']:.2f}",
            f"events {shared['events']}/{n}",
        ),
        *(flat_cost_figures(n, shared, reference) if reference else []),
    ]


def main() -> None:
    """Run every size, both modes, print the figures and store them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument(
        "--scale-sizes",
        default="5000",
        help="sizes run with the shared poller only (no per-job baseline at that scale)",
    )
    parser.add_argument("--worker", choices=("shared", "baseline", "perjob"), help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.interval, args.output)
        return
    _common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    figures: list[Figure] = []
    details: dict[str, Any] = {"interval_s": args.interval, "windows": WINDOWS, "runs": []}
    started = time.monotonic()
    for n in sizes:
        base = run_mode("baseline", n, args.interval)
        perjob = run_mode("perjob", n, args.interval)
        shared = run_mode("shared", n, args.interval)
        details["runs"] += [base, perjob, shared]
        rows = figures_for(n, shared, base, perjob, args.interval)
        _common.print_figures(
            f"Status polling, N={n}, interval {args.interval:g} s (shared poller; baselines: the SSH provider's "
            "trigger, per-job squeue)",
            rows,
        )
        figures += rows
    compared = [run for run in details["runs"] if run["mode"] == "shared"]
    reference = max(compared, key=lambda run: run["n"], default=None)
    for n in [int(s) for s in args.scale_sizes.split(",") if s]:
        shared = run_mode("shared", n, args.interval)
        details["runs"].append(shared)
        rows = scale_figures(n, shared, reference)
        _common.print_figures(f"Status polling at scale, N={n}, interval {args.interval:g} s (shared poller)", rows)
        figures += rows
    details["wall_s"] = time.monotonic() - started
    _common.write_result(
        "poller", "Status polling at scale (benchmarks/poller.py)", figures, details, measures=MEASURES
    )
    print(f"\npoller.py: {details['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
