"""Benchmark: the earliest start of the provider's continued trainings on a busy site.

Another tenant (the cluster's second user, ``slurmother``) holds every node of one GPU partition, the busy one
(``debug``: the two 4-GPU nodes), with a whole-node job on each (``--exclusive``) for :data:`HOLDS` seconds in
turn. Right after the other tenant's jobs run, this process submits three trainings with the provider's own
:class:`SbatchSubmitOperator`, one after the other, each a continued training (``max_continuations=1``,
two-minute slices, one GPU): naming the busy partition and the free one (the 16-GPU node's, ``polar_16g``) in
that order (:data:`MODES` ``two``), naming the free partition alone (``free``) and naming the busy one alone
(``busy``, which waits for the other tenant). The two GPU partitions have different limits (30 minutes and
4 hours): the two-partition training is submitted to both and starts on whichever takes it first, with that
partition's limit (the docs' "Long trainings" page; ``tests/cluster/test_long_trainings.py``'s
``test_a_training_naming_a_busy_and_a_free_partition_starts_on_the_free_one``).

Per hold and training: the start delay, from the moment ``execute`` began (the submission included) to the first
slice's start, the start marker its batch script leaves as it starts (``<job dir>/slices/<id>.start``: its
mtime; the login host is this machine, one clock), and the partition it runs on (``squeue``). Then every
training and the other tenant's jobs are cancelled. Figures: the start delay of each training per hold, the
partition, the ratio busy alone / two partitions (information), and a target on the two-partition training: it
starts on the free partition, within :data:`SLACK_S` of the training that names the free partition alone.

Usage: ``python benchmarks/earliest_start.py [--holds 20,40,80]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import _common  # before Airflow: isolated Airflow home and the bench connections
from _common import CLUSTER, TOKEN, Figure, cancel_by_prefix, cancel_jobs
from airflow.sdk.bases.operator import ExecutorSafeguard
from submit import FakeTaskInstance, MemoryStateStore

from airflow_provider_tao_slurm.core.shell import join
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator

#: The code this benchmark measures (the submit path of a continued training: the operator, the lifecycle, the
#: hook, core and the job templates); report.py counts the commits that changed it since.
MEASURES = (
    "airflow_provider_tao_slurm/operators",
    "airflow_provider_tao_slurm/lifecycle",
    "airflow_provider_tao_slurm/hooks",
    "airflow_provider_tao_slurm/core",
    "airflow_provider_tao_slurm/exceptions.py",
    "templates",
)

#: Seconds the other tenant's jobs hold the busy partition, one round each.
HOLDS = (20, 40, 80)
#: The trainings of a round, in the order they are submitted: what each names (``{busy}``, ``{free}``).
MODES = {"two": "{busy},{free}", "free": "{free}", "busy": "{busy}"}
#: How much later than the free partition alone the two-partition training may start (the scheduler's passes).
SLACK_S = 5.0
#: How long after the hold ends a training may take to start before the round gives up on it.
START_TIMEOUT_S = 120.0
#: The training: one GPU, one CPU, two-minute slices, one continuation; the program runs until cancelled.
TRAINING: dict[str, Any] = {
    "command": "sleep 600",
    "gpus_per_node": 1,
    "cpus_per_task": 1,
    "time_hours": 2 / 60,
    "max_continuations": 1,
    "network_arch": "custom",
}
DAG_ID = f"bench_earliest_{TOKEN}"
#: The other tenant's jobs are named ``<FILL_PREFIX>-<node>``.
FILL_PREFIX = f"bench-earliest-{TOKEN}-fill"


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


def squeue(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """``{job id: (state, partition)}`` of live jobs (the local client, as root: no RPC of the cluster user)."""
    out = subprocess.run(
        ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%P"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    rows = (line.split("|") for line in out.splitlines() if line.count("|") == 2)
    return {job_id: (state, partition) for job_id, state, partition in rows}


def fill_partition(partition: str, hold_s: int) -> tuple[list[str], float]:
    """The other tenant's whole-node job on every node of ``partition``, running, each for ``hold_s`` seconds.

    :returns: their ids, and when all were seen running (``time.time()``).
    """
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-p", partition, "-o", "%N"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    ids = [
        as_other(
            ["sbatch", "--parsable", "-p", partition, "-w", node, "--exclusive", "-t", "5", "-J",
             f"{FILL_PREFIX}-{node}", "-o", "/dev/null", "--wrap", f"sleep {hold_s}"]
        ).strip().split(";")[0]
        for node in dict.fromkeys(nodes)
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = squeue(ids)
        if len(states) == len(ids) and all(state == "RUNNING" for state, _ in states.values()):
            return ids, time.time()
        time.sleep(0.5)
    cancel_jobs(ids)
    raise RuntimeError(f"the other tenant's jobs on {partition} did not start within 120 s (other jobs on its nodes?)")


def submit_training(image: str, partition: str, name: str) -> tuple[float, dict[str, Any]]:
    """One continued training by ``SbatchSubmitOperator.execute`` (as a worker runs it); when it began, its handle."""
    operator = SbatchSubmitOperator(
        task_id=name, slurm_conn_id=_common.SLURM_CONN_ID, image=image, partition=partition, **TRAINING
    )
    ti = FakeTaskInstance(DAG_ID, name, f"earliest_{name}")
    sentinel = {f"{SbatchSubmitOperator.__name__}__sentinel": ExecutorSafeguard.sentinel_value}
    began = time.time()
    try:
        return began, dict(operator.execute({"ti": ti, "task_state_store": MemoryStateStore()}, **sentinel))
    finally:
        operator.hook.close()


def cancel_trainings() -> None:
    """Cancel every live job of this run's trainings (named ``tao-<DAG_ID>.<task>-...``), handles or not."""
    listing = subprocess.run(
        ["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=120, check=False
    ).stdout
    cancel_jobs(
        [
            i
            for i, _, name in (line.partition(" ") for line in listing.splitlines())
            if name.startswith(f"tao-{DAG_ID}.")
        ]
    )


def start_markers(job_dirs: list[str]) -> dict[str, float]:
    """``{job dir: mtime}`` of each job directory's first slice start marker (``slices/*.start``), one ssh command."""
    command = " ; ".join(
        join(["find", f"{directory}/slices", "-maxdepth", "1", "-name", "*.start", "-printf", f"{directory} %T@\\n"])
        + " 2>/dev/null"
        for directory in job_dirs
    )
    started: dict[str, float] = {}
    for line in _common.ssh(f"{command} ; true").splitlines():
        directory, _, mtime = line.rpartition(" ")
        if directory in job_dirs and directory not in started:
            started[directory] = float(mtime)
    return started


def run_round(image: str, busy: str, free: str, hold_s: int, paths: list[str]) -> dict[str, Any]:
    """One hold: the other tenant's jobs, the three trainings, each one's first slice start; then cancel them all.

    :param paths: each training's directories and record are added to it (to be removed at the end).
    """
    fillers, held_at = fill_partition(busy, hold_s)
    trainings: dict[str, dict[str, Any]] = {}
    try:
        for mode, names in MODES.items():
            partition = names.format(busy=busy, free=free)
            began, handle = submit_training(image, partition, f"{mode}_{hold_s}")
            trainings[mode] = {"partition_named": partition, "began": began, "handle": handle}
            paths += [handle["job_dir"], handle["results_dir"], handle["log_dir"], handle["record_path"]]
        dirs = {mode: t["handle"]["job_dir"] for mode, t in trainings.items()}
        ids = {mode: str(t["handle"]["slurm_job_id"]) for mode, t in trainings.items()}
        deadline = held_at + hold_s + START_TIMEOUT_S
        started: dict[str, float] = {}
        partitions: dict[str, str] = {}
        while len(started) < len(dirs) and time.time() < deadline:
            found = start_markers([d for mode, d in dirs.items() if mode not in started])
            live = squeue(list(ids.values()))
            for mode, directory in dirs.items():
                if directory in found and mode not in started:
                    started[mode] = found[directory]
                    partitions[mode] = live.get(ids[mode], ("", "gone"))[1]
            time.sleep(0.5)
    finally:
        cancel_jobs([str(t["handle"]["slurm_job_id"]) for t in trainings.values()])
        cancel_jobs(fillers)
    for mode, training in trainings.items():
        training["start_delay_s"] = started[mode] - training["began"] if mode in started else None
        training["ran_on"] = partitions.get(mode)
    return {
        "hold_s": hold_s,
        "fillers": fillers,
        "held_at": held_at,
        "hold_left_at_busy_submission_s": held_at + hold_s - trainings["busy"]["began"]
        if "busy" in trainings
        else None,
        "trainings": trainings,
    }


def _delay(training: dict[str, Any]) -> str:
    delay = training["start_delay_s"]
    return (
        f"not started within the round ({START_TIMEOUT_S:.0f} s after the hold)" if delay is None else f"{delay:.1f} s"
    )


def figures_for(rounds: list[dict[str, Any]], busy: str, free: str) -> list[Figure]:
    """The figures of every round: each training's start delay, where it ran, the ratio, the target."""
    figures: list[Figure] = []
    for done in rounds:
        hold, t = done["hold_s"], done["trainings"]
        two, alone, waits = t["two"], t["free"], t["busy"]
        ok = (
            two["start_delay_s"] is not None
            and alone["start_delay_s"] is not None
            and two["start_delay_s"] <= alone["start_delay_s"] + SLACK_S
            and two["ran_on"] == free
        )
        ratio = (
            f"{waits['start_delay_s'] / two['start_delay_s']:.1f}x"
            if waits["start_delay_s"] is not None and two["start_delay_s"]
            else "n/a"
        )
        left = done["hold_left_at_busy_submission_s"]
        figures += [
            Figure(
                f"hold {hold} s: first slice starts, naming {busy},{free} (the busy one first)",
                f"{_delay(two)}, on {two['ran_on'] or 'none'}",
                f"{free} alone: {_delay(alone)}",
                f"on {free}, <= {free} alone + {SLACK_S:g} s",
                ok,
            ),
            Figure(f"hold {hold} s: first slice starts, naming {free} alone", _delay(alone)),
            Figure(
                f"hold {hold} s: first slice starts, naming {busy} alone (another tenant holds it)",
                f"{_delay(waits)}, on {waits['ran_on'] or 'none'}",
                "the other tenant's jobs end " + (f"{left:.0f} s after its submission" if left is not None else "?"),
            ),
            Figure(f"hold {hold} s: start delay, {busy} alone / {busy},{free}", ratio),
        ]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--holds", default=",".join(str(h) for h in HOLDS), help="seconds the busy partition is held")
    args = parser.parse_args()
    holds = [int(h) for h in args.holds.split(",") if h]
    busy, free = CLUSTER["debug_partition"], CLUSTER.get("wide_partition")
    if not free:
        sys.exit("cluster.json names no wide_partition (the 16-GPU node's): run `make cluster-up` with this harness")
    image = _common.sqsh_image()
    rounds: list[dict[str, Any]] = []
    paths = [image]
    started = time.monotonic()
    try:
        for hold_s in holds:
            rounds.append(run_round(image, busy, free, hold_s, paths))
    finally:
        cancel_by_prefix(FILL_PREFIX)
        cancel_trainings()
        _common.remove_remote(paths)
    figures = figures_for(rounds, busy, free)
    title = (
        f"The earliest start: a continued training naming {busy} (held by another tenant) and {free}, against "
        f"either alone (benchmarks/earliest_start.py)"
    )
    _common.print_figures(title, figures)
    details: dict[str, Any] = {
        "busy": busy,
        "free": free,
        "training": TRAINING,
        "rounds": rounds,
        "wall_s": time.monotonic() - started,
    }
    path = _common.write_result("earliest_start", title, figures, details, measures=MEASURES)
    print(f"  written: {path}")
    return 0 if all(t["start_delay_s"] is not None for r in rounds for t in r["trainings"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
