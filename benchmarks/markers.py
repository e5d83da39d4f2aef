"""Benchmark 6: a job's end reaches its trigger within seconds while the scheduler is asked once per 30 s.

N = 1000 jobs are watched in one event loop by the real :class:`SlurmJobTrigger` at the recommended
30-second scheduler interval, all with their ends directory: ``N - K`` held jobs that never end and
``K`` real jobs rendered from the provider's own sbatch template (the EXIT trap included) that run
``sleep 1..3`` on the test cluster's 8 GPUs and end by themselves. The ``K`` real jobs are watched a
second time, in the same loop and by the same shared poller, by triggers WITHOUT an ends directory:
the baseline, which learns of an end from the scheduler queries alone.

Figures:

- end -> trigger event latency, per ended job: the event's arrival (``time.time()``) minus the
  marker's mtime (the moment the script ended; the login host is this machine, one clock), p50,
  p95 and max, for both watches;
- scheduler job queries while the jobs end, both daemons: slurmctld's job-info RPCs (``sdiag``) plus
  slurmdbd's job queries (``DBD_GET_JOBS_COND``, ``sacctmgr show stats``) over exactly
  :data:`WINDOW_INTERVALS` scheduler intervals (the burst): right after a status poll the jobs are
  released and the counters reset (the release's own RPCs are not counted), and the counters are read
  right after the :data:`WINDOW_INTERVALS`-th poll that follows (and once every event came); the target
  of :data:`QUERIES_TARGET` per 30 s in all is judged there, over the burst, where the marker path works
  (again after the :data:`LONG_WINDOW_INTERVALS`-th, for reference: mostly idle intervals). The server
  counters hold every user's queries: beside them, the ``squeue`` and ``sacct`` commands this process
  sent in the window (:class:`_common.SentCommands`) and how many of the ``sacct`` were accounting
  confirmations, and how many seconds the ends spread over (first to last marker);
- the login-node cost of the marker reads: the limits sshd runs in a cgroup of its own
  (:class:`_common.LoginCgroup`), and the group's CPU time is read right before and after each
  marker read (the poller runs one command at a time); in a quiet window (no job ends) that gives
  the CPU seconds per 30 s and per read, with the ends directory holding the ``K`` markers, next to
  the whole group's CPU in the window (which also holds the status query).

A marker is confirmed before its trigger fires, in batches: a marker found waits
``END_MARKER_BATCH_S``, the ends directories are listed once more, and one ``sacct`` (slurmdbd;
slurmctld is not asked) asks about every job whose marker waits; a job accounting does not show ended
yet is asked about again with the next batch or after a recheck delay; the event carries accounting's
state. Those queries are in the slurmdbd figure, and their time is in the latency. The scheduler-only
watch of the same jobs costs the window one ``sacct`` of its own (its status query asks accounting
about the jobs squeue saw end).

Usage: ``python benchmarks/markers.py [--watched 1000] [--ending 48] [--interval 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import random
import subprocess
import time
from typing import Any

import _common  # before Airflow: isolated Airflow home and the bench connections
from _common import Figure

from airflow_provider_tao_slurm.core.shell import join

#: The code this benchmark measures (the triggerer's side and the job templates (their EXIT trap writes the marker));
#: report.py counts the commits that changed it since.
MEASURES = (
    "airflow_provider_tao_slurm/triggers",
    "airflow_provider_tao_slurm/hooks",
    "airflow_provider_tao_slurm/lifecycle",
    "airflow_provider_tao_slurm/core",
    "airflow_provider_tao_slurm/exceptions.py",
    "templates",
)

# The marker reads meet the login sshd with OpenSSH's default limits, in its own cgroup.
_common.point_connections_at(int(_common.CLUSTER["limits_port"]))

QUIET_WINDOW_S = 30.0
#: Scheduler intervals in the window that counts the scheduler queries while the jobs end (the burst).
WINDOW_INTERVALS = 3
#: Scheduler intervals of the reference window: five minutes from the burst's start, mostly idle (the
#: target is judged over the burst: 48 ends spread over about 17 s, each known within 3 s (p95), take a
#: confirmation every 2-3 s while they arrive, 6 to 8 ``sacct``, beside the three status queries).
LONG_WINDOW_INTERVALS = 10
P95_TARGET_S = 3.0
#: Scheduler job queries (slurmctld and slurmdbd together) per 30 s over the burst (:data:`WINDOW_INTERVALS`).
QUERIES_TARGET = 2.0
RUN_TIMEOUT_S = 300.0


def _rebuild(trigger: Any) -> Any:
    """What the triggerer does: the trigger row holds classpath + kwargs; the class is imported."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def submit_ending_jobs(count: int, base: str, image: str) -> list[str]:
    """``count`` held jobs from the provider's single-node template, each ``sleep 1..3``; their ids."""
    from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch

    rng = random.Random(7)
    scripts = []
    for index in range(count):
        spec = SbatchSpec(
            job_name=f"bench-mk-{_common.TOKEN}-{index}",
            partition=_common.CLUSTER["gpu_partition"],
            num_nodes=1,
            gpus_per_node=1,
            cpus_per_task=1,
            time="00:10:00",
            timeout_seconds=300,
            log_dir=f"{base}/logs",
            job_dir=base,
            image=image,
            command=f"sleep {rng.uniform(1, 3):.2f}",
            exit_code_file=f"{base}/exit-{index}",
            ends_dir=f"{base}/ends",
        )
        scripts.append(render_sbatch(spec))
    _common.ssh(join(["mkdir", "-p", "--", f"{base}/ends", f"{base}/logs"]))
    submit = join(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "-e", "/dev/null"])
    ids = []
    for script in scripts:  # one ssh each: the script goes over stdin
        ids.append(_common.ssh(submit, stdin=script).strip().split(";")[0])
    return ids


def marker_times(ends: str) -> dict[str, float]:
    """``{slurm job id: marker mtime}`` of every marker in ``ends``."""
    out = _common.ssh(join(["find", ends, "-maxdepth", "1", "-name", "*.end", "-printf", "%f %T@\\n"]))
    return {name.split("-", 1)[0]: float(mtime) for name, mtime in (line.split() for line in out.splitlines())}


async def measure(held: list[str], ending: list[str], ends: str, interval: float) -> dict[str, Any]:
    """Watch every job, let the ending ones run, and return the raw measurements."""
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook, async_pool
    from airflow_provider_tao_slurm.triggers.poller import active_pollers
    from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

    login = _common.LoginCgroup.attach()  # before the pooled connection opens: its session is in the group
    sent = _common.SentCommands(async_pool())
    read_cpu = [0.0]
    original = SlurmHook.a_end_markers

    async def timed_read(self: SlurmHook, since: Any) -> Any:
        before = login.cpu_seconds() if login else 0.0
        try:
            return await original(self, since)
        finally:
            read_cpu[0] += (login.cpu_seconds() - before) if login else 0.0

    SlurmHook.a_end_markers = timed_read  # type: ignore[method-assign]

    now = time.time()
    marked = {
        job_id: _rebuild(
            SlurmJobTrigger(
                _common.SLURM_CONN_ID, job_id, f"bench-{job_id}", interval, submitted_at=now, end_marker_dir=ends
            )
        )
        for job_id in held + ending
    }
    baseline = {
        job_id: _rebuild(SlurmJobTrigger(_common.SLURM_CONN_ID, job_id, f"bench-{job_id}", interval, submitted_at=now))
        for job_id in ending
    }
    seen: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {"marker": {}, "baseline": {}}

    async def run(kind: str, trigger: Any) -> None:
        async for event in trigger.run():
            seen[kind][trigger.slurm_job_id] = (time.time(), event.payload)

    tasks = [asyncio.create_task(run("marker", t)) for t in marked.values()]
    tasks += [asyncio.create_task(run("baseline", t)) for t in baseline.values()]
    try:
        deadline = time.monotonic() + 240
        while not active_pollers() or active_pollers()[0].stats.polls < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the first scheduler query did not come back")
            await asyncio.sleep(0.5)
        poller = active_pollers()[0]
        await asyncio.sleep(2 * 2.0)  # the first marker reads are done

        # Quiet window: nothing ends; the marker reads and the login node's cost of them.
        reads0, polls0, read_cpu0 = poller.stats.end_reads, poller.stats.polls, read_cpu[0]
        login0 = login.cpu_seconds() if login else 0.0
        await asyncio.sleep(QUIET_WINDOW_S)
        quiet = {
            "seconds": QUIET_WINDOW_S,
            "marker_reads": poller.stats.end_reads - reads0,
            "status_polls": poller.stats.polls - polls0,
            "marker_login_cpu_s": (read_cpu[0] - read_cpu0) if login else None,
            "login_cpu_s": (login.cpu_seconds() - login0) if login else None,
        }

        # The ending jobs run: the scheduler's counters from right after a status poll, over whole intervals.
        polls1 = poller.stats.polls
        while poller.stats.polls == polls1:
            await asyncio.sleep(0.05)
        polls1 = poller.stats.polls
        programs1 = dict(sent.programs)
        confirms1 = poller.stats.end_confirms + poller.stats.end_confirm_failures
        released = time.monotonic()
        await asyncio.to_thread(_common.ssh, join(["scontrol", "release", ",".join(ending)]))
        await asyncio.to_thread(_common.reset_rpc_counts)  # the benchmark's own release is not counted
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while (
            len(seen["marker"]) < len(ending)
            or len(seen["baseline"]) < len(ending)
            or poller.stats.polls < polls1 + WINDOW_INTERVALS
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"events: {len(seen['marker'])} marker, {len(seen['baseline'])} baseline")
            await asyncio.sleep(0.05)
        ending_window = await _window(poller, sent, released, polls1, programs1, confirms1)
        while poller.stats.polls < polls1 + LONG_WINDOW_INTERVALS:
            await asyncio.sleep(0.05)
        long_window = await _window(poller, sent, released, polls1, programs1, confirms1)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        SlurmHook.a_end_markers = original  # type: ignore[method-assign]
    markers = await asyncio.to_thread(marker_times, ends)
    latency = {
        kind: {job_id: at - markers[job_id] for job_id, (at, _payload) in events.items() if job_id in markers}
        for kind, events in seen.items()
    }
    sources = {
        kind: sorted({payload["state"]["source"] for _at, payload in events.values()}) for kind, events in seen.items()
    }
    wrong = [j for j, (_at, p) in seen["marker"].items() if p["state"]["native"] != "COMPLETED"]
    ended = [markers[job_id] for job_id in ending if job_id in markers]
    return {
        "ends_spread_s": max(ended) - min(ended) if ended else None,
        "quiet": quiet,
        "ending": ending_window,
        "long": long_window,
        "latency": latency,
        "sources": sources,
        "not_completed": wrong,
        "markers": len(markers),
    }


async def _window(
    poller: Any, sent: Any, released: float, polls1: int, programs1: dict[str, int], confirms1: int
) -> dict[str, Any]:
    """The scheduler's counters (reset right after the release) and this process's commands since the release."""
    rpcs = _common.summarize_rpcs(await asyncio.to_thread(_common.rpc_counts))
    polls = poller.stats.polls - polls1
    return {
        "seconds": time.monotonic() - released,
        "status_polls": polls,
        "intervals": polls,
        **rpcs,
        "sent_squeue": sent.programs["squeue"] - programs1.get("squeue", 0),
        "sent_sacct": sent.programs["sacct"] - programs1.get("sacct", 0),
        "confirmations": poller.stats.end_confirms + poller.stats.end_confirm_failures - confirms1,
    }


def _queries_per_30(window: dict[str, Any], interval: float) -> tuple[float, float]:
    """slurmctld's and slurmdbd's job queries per 30 s over ``window``."""
    per_30 = 30.0 / (window["intervals"] * interval)
    return window["ctld_job_queries"] * per_30, window["dbd_job_queries"] * per_30


def _sent(window: dict[str, Any]) -> str:
    return (
        f"sent by this process: {window['sent_squeue']} squeue, {window['sent_sacct']} sacct "
        f"({window['confirmations']} accounting confirmations) in {window['intervals']} intervals"
    )


def figures_for(raw: dict[str, Any], n: int, k: int, interval: float) -> list[Figure]:
    """The printed figures of one run."""
    marker = list(raw["latency"]["marker"].values())
    base = list(raw["latency"]["baseline"].values())
    p95, base_p95 = _common.percentile(marker, 95), _common.percentile(base, 95)
    ending, quiet, long = raw["ending"], raw["quiet"], raw["long"]
    ctld, dbd = _queries_per_30(ending, interval)
    long_ctld, long_dbd = _queries_per_30(long, interval)
    spread = raw["ends_spread_s"]
    reads = quiet["marker_reads"]
    login = quiet["marker_login_cpu_s"]
    return [
        Figure(
            f"N={n}: job end -> trigger event p95 ({k} jobs ending)",
            f"{p95:.2f} s",
            f"{base_p95:.2f} s (scheduler queries alone, {interval:.0f} s interval)",
            f"<= {P95_TARGET_S:.0f} s",
            p95 <= P95_TARGET_S,
        ),
        Figure(
            f"N={n}: job end -> trigger event p50 / max",
            f"{_common.median(marker):.2f} / {max(marker):.2f} s",
            f"{_common.median(base):.2f} / {max(base):.2f} s",
        ),
        Figure(
            f"N={n}: scheduler job queries (slurmctld + slurmdbd) per 30 s, burst ({ending['intervals']} intervals)",
            f"{ctld + dbd:.2f}",
            f"slurmctld {ctld:.2f} + slurmdbd {dbd:.2f}; {_sent(ending)}; "
            f"{k} ends over {'?' if spread is None else f'{spread:.1f}'} s",
            f"<= {QUERIES_TARGET:.0f}",
            ctld + dbd <= QUERIES_TARGET,
        ),
        Figure(
            f"N={n}: scheduler job queries (slurmctld + slurmdbd) per 30 s, {long['intervals']} intervals from it "
            "(mostly idle; for reference)",
            f"{long_ctld + long_dbd:.2f}",
            f"slurmctld {long_ctld:.2f} + slurmdbd {long_dbd:.2f}; {_sent(long)}",
        ),
        Figure(
            f"N={n}: marker reads per 30 s (quiet window)",
            f"{reads * 30.0 / quiet['seconds']:.1f}",
            f"status polls {quiet['status_polls'] * 30.0 / quiet['seconds']:.1f} per 30 s",
        ),
        Figure(
            f"N={n}: login-node CPU of the marker reads per 30 s (per read)",
            "not measured"
            if login is None
            else f"{login * 30.0 / quiet['seconds']:.3f} s ({login / max(reads, 1) * 1000:.1f} ms)",
            "not measured"
            if quiet["login_cpu_s"] is None
            else f"whole login sshd {quiet['login_cpu_s'] * 30.0 / quiet['seconds']:.3f} s per 30 s "
            f"(with the status query); {raw['markers']} markers in the directory",
        ),
        Figure(
            f"N={n}: events from the end marker / states right",
            f"{len(raw['latency']['marker'])}/{k} ({', '.join(raw['sources']['marker'])}); "
            f"{k - len(raw['not_completed'])}/{k} COMPLETED",
            f"scheduler-only watch: from {', '.join(raw['sources']['baseline'])}",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watched", type=int, default=1000)
    parser.add_argument("--ending", type=int, default=48)
    parser.add_argument("--interval", type=float, default=30.0)
    args = parser.parse_args()
    n, k = args.watched, args.ending
    base = f"{_common.CLUSTER['results_dir']}/bench-markers-{_common.TOKEN}"
    prefix = f"bench-mkheld-{_common.TOKEN}"
    image = _common.sqsh_image()
    held: list[str] = []
    ending: list[str] = []
    try:
        held = _common.create_held_jobs(prefix, n - k)
        ending = submit_ending_jobs(k, base, image)
        raw = asyncio.run(measure(held, ending, f"{base}/ends", args.interval))
    finally:
        _common.cancel_jobs(held + ending)
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            _common.remove_remote([base, image])
    title = f"End markers: job end -> trigger event at N={n} watched jobs, scheduler interval {args.interval:.0f} s"
    figures = figures_for(raw, n, k, args.interval)
    _common.print_figures(title, figures)
    _common.write_result(
        "markers",
        title,
        figures,
        {"watched": n, "ending": k, "interval_s": args.interval, **raw},
        measures=MEASURES,
    )


if __name__ == "__main__":
    main()
