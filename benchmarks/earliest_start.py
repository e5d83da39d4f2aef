"""Benchmark: the earliest start. Queue wait of jobs naming one busy partition against jobs naming it and a free one.

Another user (the cluster's second user, ``slurmother``) fills the GPU partition: one whole-node job on each
of its nodes, each holding it for :data:`HOLD_S` seconds, as a busy partition of a shared site does. Then, in
the same moment and one ssh command, this run submits ``N`` short jobs naming only that partition and ``N``
naming it and the CPU partition (free: its node is not one of the GPU partition's). The test cluster's GPU
partitions all share the same two nodes, so the free partition beside the busy one is the CPU partition,
and the jobs ask no GPU (one CPU, a few seconds). SLURM starts a job naming several partitions on the first
that takes it; a continued training's slices do the same (``partition="preemptible,regular"``, see the docs'
"Long trainings" page).

Figures: the queue wait of each job (accounting's ``Start - Submit``), median and p95, for both sets, and
the ratio of the medians; the partitions the several-partition jobs ran on.

Usage: ``python benchmarks/earliest_start.py [--jobs 8] [--hold 40]``.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from typing import Any

import _common  # before Airflow: isolated Airflow home
from _common import CLUSTER, TOKEN, Figure, cancel_by_prefix, cancel_jobs, median, percentile, ssh

from airflow_provider_tao_slurm.core.shell import join

#: Seconds the other user's jobs hold the busy partition's nodes.
HOLD_S = 40
#: Jobs per set.
JOBS = 8
PREFIX = f"bench-earliest-{TOKEN}"
LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def as_other(argv: list[str]) -> str:
    """Run a SLURM command as the cluster's second user on this machine (the login host); its stdout."""
    proc = subprocess.run(
        ["runuser", "-u", CLUSTER["other_user"], "--", *argv],
        cwd=CLUSTER["other_dir"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} as {CLUSTER['other_user']}: {proc.stderr.strip()}")
    return proc.stdout


def fill_partition(partition: str, hold_s: int) -> list[str]:
    """The other user's whole-node jobs on every node of ``partition``, running; their ids."""
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-p", partition, "-o", "%N"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    ids = [
        as_other(
            ["sbatch", "--parsable", "-p", partition, "-w", node, "--exclusive", "-t", "5", "-J", f"{PREFIX}-fill",
             "-o", "/dev/null", "--wrap", f"sleep {hold_s}"]
        ).strip().split(";")[0]
        for node in dict.fromkeys(nodes)
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%T"], capture_output=True, text=True, timeout=60, check=False
        ).stdout.split()
        if states and all(state == "RUNNING" for state in states):
            return ids
        time.sleep(0.5)
    cancel_jobs(ids)
    raise RuntimeError(f"the other user's jobs on {partition} did not start within 120 s (other jobs on its nodes?)")


def submit_both(busy: str, free: str, count: int) -> None:
    """``count`` jobs naming ``busy`` and ``count`` naming ``busy,free``, interleaved, in one ssh command."""
    lines = []
    for i in range(count):
        for kind, partitions in (("one", busy), ("any", f"{busy},{free}")):
            lines.append(
                join(["sbatch", "--parsable", "-p", partitions, "-t", "1", "-c", "1", "-J", f"{PREFIX}-{kind}-{i}",
                      "-o", "/dev/null", "--wrap", "sleep 2"])
            )  # fmt: skip
    ssh(" && ".join(lines))


def accounting(count: int, timeout: float) -> list[dict[str, str]]:
    """This run's ended jobs from sacct (name, submit, start, partition), waiting until all ``2 * count`` ended."""
    command = join(
        ["sacct", "-X", "-n", "-P", "-S", "now-1hours", "-o", "JobName,Submit,Start,Partition,State", "--name",
         ",".join(f"{PREFIX}-{kind}-{i}" for kind in ("one", "any") for i in range(count))]
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        rows = [dict(zip(("name", "submit", "start", "partition", "state"), line.split("|"), strict=True))
                for line in ssh(command).splitlines() if line.strip()]  # fmt: skip
        ended = [row for row in rows if row["state"].split()[0] not in LIVE]
        if len(ended) >= 2 * count or time.monotonic() > deadline:
            return ended
        time.sleep(1)


def waits(rows: list[dict[str, str]], kind: str) -> list[float]:
    """Queue waits in seconds of the jobs of one set (``one`` or ``any``)."""
    from datetime import datetime

    return [
        (datetime.fromisoformat(row["start"]) - datetime.fromisoformat(row["submit"])).total_seconds()
        for row in rows
        if row["name"].startswith(f"{PREFIX}-{kind}-") and row["start"] not in ("Unknown", "None", "")
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--hold", type=int, default=HOLD_S)
    args = parser.parse_args()
    busy, free = CLUSTER["gpu_partition"], CLUSTER["cpu_partition"]
    fillers: list[str] = []
    try:
        fillers = fill_partition(busy, args.hold)
        submit_both(busy, free, args.jobs)
        rows = accounting(args.jobs, timeout=args.hold + 120)
    finally:
        cancel_by_prefix(PREFIX)
        cancel_jobs(fillers)
    one, several = waits(rows, "one"), waits(rows, "any")
    ran_on = sorted({row["partition"] for row in rows if row["name"].startswith(f"{PREFIX}-any-")})
    ratio = median(one) / median(several) if several and median(several) > 0 else float("inf")
    figures = [
        Figure(f"queue wait, -p {busy} (busy): median / p95 s", f"{median(one):.0f} / {percentile(one, 95):.0f}"),
        Figure(
            f"queue wait, -p {busy},{free}: median / p95 s",
            f"{median(several):.0f} / {percentile(several, 95):.0f}",
            target="< the busy partition's",
            ok=median(several) < median(one),
        ),
        Figure("median wait, one partition / several", f"{ratio:.1f}x" if ratio != float("inf") else "inf"),
        Figure("several-partition jobs ran on", ", ".join(ran_on) or "none"),
        Figure("jobs per set (ended)", f"{len(one)} / {len(several)} of {args.jobs}"),
    ]
    title = f"The earliest start: {args.jobs} jobs naming a busy partition vs. it and a free one (held {args.hold} s)"
    _common.print_figures(title, figures)
    details: dict[str, Any] = {"one_partition_waits_s": one, "several_partitions_waits_s": several, "rows": rows}
    path = _common.write_result("earliest_start", title, figures, details)
    print(f"  written: {path}")
    return 0 if len(one) == len(several) == args.jobs else 1


if __name__ == "__main__":
    raise SystemExit(main())
