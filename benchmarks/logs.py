"""Benchmark 5: live log lines for N watched jobs, one batched read per interval vs one read per job.

For N = 100 and 1000 running-job stand-ins (a log directory per job on the shared storage holding
``main.out``, ``main.err`` and ``status.json``, created by one ssh command as the cluster user),
every interval each job appends two lines to ``main.out`` and one TAO entry to ``status.json``
(written by this process on the shared storage, as running jobs would). Then, per interval:

- ``streamed`` (the provider): the shared poller's log read, :meth:`SlurmHook.a_tail_many` over the
  pooled asyncssh connection, ALL 3N files in ONE command, each file through a
  :class:`LineStream` (cursor files written beside the logs, lines cleaned and redacted), then each
  job's lines logged as its trigger logs them (:func:`show_lines`: a record per job and poll);
- ``baseline`` (per job, as the SSH provider's remote-job trigger reads output): one
  tail-from-offset command per file per interval (3N commands, over the same pooled connection,
  as many at once as the pool allows), each line logged as a record of its own;
- ``status`` (for scale): the status poll the streamed read rides along with
  (:meth:`SlurmHook.a_get_states` of N held jobs), so the extra cost of live lines reads as a share
  of what watching already costs.

The lines go to a logger that renders each record as a JSON line, as the triggerer writes a
trigger's log (:data:`LINES_LOG`, to ``/dev/null``). Figures per interval (median over
:data:`INTERVALS`): commands sent (counted where they go out, on the pooled connection:
:class:`_common.SentCommands`), wall time, this process's CPU (the triggerer's side; target
:data:`CPU_TARGET_S` at N = 1000), the machine's CPU (every process: sshd, sh, tail, squeue,
slurmctld ...), bytes, lines and log records produced.

Usage: ``python benchmarks/logs.py [--sizes 100,1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import _common  # before Airflow: isolated Airflow home and the bench connections
import structlog
from _common import Figure

from airflow_provider_tao_slurm.core.logstream import LineStream, show_lines
from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook, async_pool

#: The code this benchmark measures (the live-log read: the hook's batched tail, LineStream and show_lines); report.py
#: counts the commits that changed it since.
MEASURES = (
    "airflow_provider_tao_slurm/core/logstream.py",
    "airflow_provider_tao_slurm/core/commands",
    "airflow_provider_tao_slurm/hooks",
    "airflow_provider_tao_slurm/lifecycle/following.py",
)

#: Measured intervals per mode (after one warm-up interval).
INTERVALS = 5
FILES = ("main.out", "main.err", "status.json")
#: Triggerer CPU per interval for N = 1000 jobs' lines (3000 new lines), read to logged.
CPU_TARGET_S = 0.3


class _CountedHandler(logging.FileHandler):
    """Writes records to ``/dev/null`` as JSON lines (as the triggerer writes a trigger's log) and counts them."""

    def __init__(self) -> None:
        super().__init__(os.devnull)
        self.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.JSONRenderer(),
                ]
            )
        )
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        super().emit(record)


#: The task log the lines go to.
LINES_LOG = logging.getLogger("tao_slurm.bench.live_lines")
LINES_LOG.propagate = False
LINES_LOG.setLevel(logging.INFO)
RECORDS = _CountedHandler()
LINES_LOG.addHandler(RECORDS)


def make_job_dirs(base: str, n: int) -> list[str]:
    """``n`` job log directories with empty logs, created by ONE ssh command as the cluster user."""
    _common.ssh(
        f'umask 022; for i in $(seq 1 {int(n)}); do d={quote(base)}/job-$i; mkdir -p "$d" && '
        ': > "$d/main.out" && : > "$d/main.err" && : > "$d/status.json" || exit 1; done',
        timeout=600,
    )
    return [f"{base}/job-{i}" for i in range(1, n + 1)]


def write_interval(dirs: list[str], tick: int) -> int:
    """What N running jobs write in one interval (two log lines and a status entry each); returns the bytes."""
    written = 0
    for number, job_dir in enumerate(dirs, 1):
        lines = f"[job {number}] step {tick}: loss=0.{tick:04d} lr=0.001\n[job {number}] step {tick} done\n"
        entry = json.dumps({"status": "RUNNING", "epoch": tick, "max_epoch": 100, "loss": 0.5}) + "\n"
        with open(f"{job_dir}/main.out", "a") as out:
            out.write(lines)
        with open(f"{job_dir}/status.json", "a") as status:
            status.write(entry)
        written += len(lines) + len(entry)
    return written


async def measure(
    label: str, dirs: list[str], sent: _common.SentCommands, once: Callable[[int], Awaitable[tuple[int, int]]]
) -> dict[str, Any]:
    """Run ``once(tick)`` (it returns bytes and lines read) for a warm-up and :data:`INTERVALS` intervals;
    per-interval figures, with the commands ``sent`` and the log records written while it ran."""
    rounds: list[dict[str, float]] = []
    for tick in range(INTERVALS + 1):
        await asyncio.to_thread(write_interval, dirs, tick)
        cpu, machine, wall = time.process_time(), _common.machine_cpu_seconds(), time.perf_counter()
        commands, records = sent.count, RECORDS.count
        size, lines = await once(tick)
        figures = {
            "commands": sent.count - commands,
            "records": RECORDS.count - records,
            "wall_s": time.perf_counter() - wall,
            "process_cpu_s": time.process_time() - cpu,
            "machine_cpu_s": _common.machine_cpu_seconds() - machine,
            "bytes": size,
            "lines": lines,
        }
        if tick:  # the first round is the warm-up (connection, cursor files)
            rounds.append(figures)
    summary = {key: _common.median([r[key] for r in rounds]) for key in rounds[0]}
    print(f"  {label:<9} {json.dumps({k: round(v, 4) for k, v in summary.items()})}", flush=True)
    return {"median": summary, "rounds": rounds}


async def run_size(n: int, sent: _common.SentCommands) -> dict[str, Any]:
    """The three modes for ``n`` jobs; ``sent`` counts the pooled connection's commands."""
    hook = SlurmHook(_common.SLURM_CONN_ID)
    base = f"{_common.CLUSTER['results_dir']}/bench-logs-{_common.TOKEN}-{n}"
    dirs = await asyncio.to_thread(make_job_dirs, base, n)
    held = await asyncio.to_thread(_common.create_held_jobs, f"bench-logs-{_common.TOKEN}-{n}", n)
    streams = [
        LineStream(name, f"{job_dir}/{name}", f"{job_dir}/.live-bench.{name}.offset")
        for job_dir in dirs
        for name in FILES
    ]
    offsets = dict.fromkeys((f"{job_dir}/{name}" for job_dir in dirs for name in FILES), 0)

    async def streamed(_tick: int) -> tuple[int, int]:
        chunks = await hook.a_tail_many([stream.request() for stream in streams])
        lines = [stream.feed(chunk) for stream, chunk in zip(streams, chunks, strict=True)]
        for job in range(0, len(lines), len(FILES)):  # each job's trigger logs its lines of the poll
            show_lines(LINES_LOG, [line for stream_lines in lines[job : job + len(FILES)] for line in stream_lines])
        return sum(len(chunk.data) for chunk in chunks), sum(map(len, lines))

    async def per_job(_tick: int) -> tuple[int, int]:
        async def one(path: str) -> tuple[int, int]:
            chunk = await hook.a_read_log(path, offsets[path])
            offsets[path] = chunk.next_offset
            for line in chunk.data.splitlines():
                LINES_LOG.info("%s", line)
            return len(chunk.data.encode()), chunk.data.count("\n")

        answers = await asyncio.gather(*(one(path) for path in offsets))
        return sum(size for size, _ in answers), sum(lines for _, lines in answers)

    async def status(_tick: int) -> tuple[int, int]:
        states = await hook.a_get_states(held)
        return 0, len(states)

    try:
        print(f"\n== N = {n} jobs ({3 * n} files streamed)", flush=True)
        results = {
            "status": await measure("status", dirs, sent, status),
            "streamed": await measure("streamed", dirs, sent, streamed),
            "baseline": await measure("baseline", dirs, sent, per_job),
        }
    finally:
        await async_pool().close_all()
        _common.cancel_jobs(held)
        await asyncio.to_thread(_common.remove_remote, [base])
    return results


def figures_for(n: int, result: dict[str, Any]) -> list[Figure]:
    """The printed figures for one N; targets apply at N = 1000."""
    s, b, q = (result[mode]["median"] for mode in ("streamed", "baseline", "status"))
    at_target = n == 1000
    return [
        Figure(
            f"N={n}: log-read commands per interval",
            f"{s['commands']:.0f}",
            f"{b['commands']:.0f}",
            "1" if at_target else "",
            s["commands"] == 1 if at_target else None,
        ),
        Figure(f"N={n}: log read wall time per interval", f"{s['wall_s']:.3f} s", f"{b['wall_s']:.3f} s"),
        Figure(
            f"N={n}: triggerer CPU per interval for the lines (read, cleaned, logged)",
            f"{s['process_cpu_s']:.3f} s",
            f"{b['process_cpu_s']:.3f} s",
            f"<= {CPU_TARGET_S} s" if at_target else "",
            s["process_cpu_s"] <= CPU_TARGET_S if at_target else None,
        ),
        Figure(
            f"N={n}: machine CPU per interval (login side + triggerer)",
            f"{s['machine_cpu_s']:.2f} s",
            f"{b['machine_cpu_s']:.2f} s",
        ),
        Figure(
            f"N={n}: extra wall time of live lines vs the status poll alone",
            f"{s['wall_s'] / q['wall_s']:.2f}x of {q['wall_s']:.3f} s" if q["wall_s"] else "n/a",
        ),
        Figure(
            f"N={n}: lines shown per interval (main.out + status.json)",
            f"{s['lines']:.0f} ({s['bytes'] / 1024:.0f} KB)",
            f"{b['lines']:.0f}",
        ),
        Figure(f"N={n}: task-log records per interval", f"{s['records']:.0f}", f"{b['records']:.0f}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="100,1000", help="comma-separated job counts")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    details: dict[str, Any] = {}
    figures: list[Figure] = []
    sent = _common.SentCommands(async_pool())
    for n in sizes:
        result = asyncio.run(run_size(n, sent))
        details[str(n)] = result
        figures += figures_for(n, result)
    _common.print_figures("Live log lines: one batched read vs one read per job", figures)
    path = _common.write_result("logs", "Live log lines at scale", figures, details, measures=MEASURES)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
