"""Fault suite (issue 10): three DAG runs at once on the same image and dataset.

Three worker threads each run one DAG run's chain (dataset check -> image import -> submit -> sensor),
as three Airflow workers would; every deferred step goes to one shared triggerer event loop. The
image is new (a per-run tag), so it must be converted, and the three runs race for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from clusterkit import Triggerer, image, jobs_named, record_of, sensor_for, submit_op
from deferral import context

from airflow_provider_tao_slurm.core.images import parse_image
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

    from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["image"]


def drive(op: BaseOperator, ctx: Any, triggerer: Triggerer) -> Any:
    """Run ``op`` like Airflow: execute, and while it defers, the trigger on the shared loop then the resume."""
    try:
        try:
            return op.execute(ctx)
        except TaskDeferred as first:
            deferred = first
        while True:
            event = triggerer.first_event(deferred.trigger)
            try:
                return getattr(op, deferred.method_name)(ctx, event=event, **(deferred.kwargs or {}))
            except TaskDeferred as again:
                deferred = again
    finally:
        op.hook.close()  # type: ignore[attr-defined]


def test_three_concurrent_dag_runs_share_one_conversion(
    conn: str, cluster: ClusterEnv, ssh_run: SshRun, dag_id: str, record_property: Any
) -> None:
    """Three DAG runs of one DAG were started at the same moment, each checking the same dataset, importing
    the same not-yet-converted registry image, then submitting and watching its training job. Expected: the
    image is converted exactly once (the other runs wait for that conversion and reuse its .sqsh), the three
    runs get the same .sqsh path, three GPU jobs with three job names run, and three job records end
    COMPLETE; one SLURM job per run."""
    token = uuid.uuid4().hex[:8]
    image = f"example.org/reliability/concurrent-{token}:1"
    dataset = f"{cluster.results_dir}/rl-dataset-{token}"
    assert ssh_run(f"mkdir -p {quote(dataset)} && echo labels > {quote(dataset)}/labels.txt")[0] == 0
    triggerer = Triggerer()

    def dag_run(index: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
        ctx = context(dag_id, "train", f"run{index}")
        StageDatasetCheckOperator(task_id="check", paths=[dataset]).execute(ctx)
        importer = EnrootImportOperator(
            task_id="import", image=image, containers_dir=cluster.containers_dir, poll_interval_seconds=1
        )
        sqsh = drive(importer, ctx, triggerer)
        submitter = submit_op(sqsh, f"cat {dataset}/labels.txt; sleep 1", secret_env=None)
        handle = drive(submitter, ctx, triggerer)
        return sqsh, handle, drive(sensor_for(handle), ctx, triggerer)

    try:
        with ThreadPoolExecutor(3) as workers:
            runs = list(workers.map(dag_run, range(3)))
    finally:
        triggerer.close()
        sqsh_file = f"{cluster.containers_dir}/*concurrent-{token}*"
        ssh_run(f"rm -rf -- {quote(dataset)} {sqsh_file}")

    uri = parse_image(image).enroot_uri
    conversions = [line for line in Path(cluster.enroot_imports_log).read_text().splitlines() if line.endswith(uri)]
    handles = [handle for _, handle, _ in runs]
    record_property(
        "detail", f"conversions={len(conversions)}; distinct jobs={len({h['slurm_job_id'] for h in handles})}"
    )
    assert len(conversions) == 1
    assert len({sqsh for sqsh, _, _ in runs}) == 1
    assert len({h["job_id"] for h in handles}) == len({h["slurm_job_id"] for h in handles}) == 3
    for handle in handles:
        assert jobs_named(ssh_run, handle["job_id"]) == [handle["slurm_job_id"]]
        assert record_of(ssh_run, handle["record_path"])["terminal_state"] == "COMPLETE"
    assert [result["terminal_state"] for _, _, result in runs] == ["COMPLETE"] * 3


#: DAG runs in which a zombie try and its retry submit at the same moment.
RACES = 4
#: How long a try waits at the barrier for the other one (both normally arrive within a second or two).
BARRIER_TIMEOUT_S = 120


def test_a_zombie_try_and_its_retry_submitting_at_once_leave_one_job(
    conn: str, image: str, ssh_run: SshRun, dag_id: str, record_property: Any
) -> None:
    """In each of 4 DAG runs, try 1 (a zombie: its worker still runs it) and try 2 (its retry) of the same
    submit task call ``execute`` at the same moment, in two threads with their own SSH connections. The race
    is forced: each try waits at a barrier right before its submitting round trip (staging, ``sbatch
    --hold``, the twin check, the release) until the other try gets there too, so both have looked for a job
    of their name, found none, and both run sbatch. Expected: two jobs were submitted under that name in
    every run (both tries reached sbatch before the twin was resolved); both tries return the same SLURM
    job, the oldest, which alone was released; the other was cancelled while still held (it never ran);
    the job completes."""

    outcomes: list[dict[str, Any]] = []
    for race in range(RACES):
        run_id = f"race{race}"
        barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT_S)
        arrived: dict[int, float] = {}

        def one_try(
            try_number: int,
            run_id: str = run_id,
            barrier: threading.Barrier = barrier,
            arrived: dict[int, float] = arrived,
        ) -> dict[str, Any]:
            op: SbatchSubmitOperator = submit_op(image, "sleep 2")
            submit = op.hook.submit

            def submit_when_both_are_here(*args: Any, **kwargs: Any) -> str:
                arrived[try_number] = time.monotonic()
                barrier.wait()
                return submit(*args, **kwargs)

            op.hook.submit = submit_when_both_are_here  # type: ignore[method-assign]
            try:
                return dict(op.execute(context(dag_id, "submit", run_id, try_number=try_number)))
            finally:
                op.hook.close()

        with ThreadPoolExecutor(max_workers=2) as pool:
            zombie, retry = pool.map(one_try, (1, 2))
        assert zombie["slurm_job_id"] == retry["slurm_job_id"], (zombie, retry)
        assert zombie["job_id"] == retry["job_id"]
        ids = jobs_named(ssh_run, zombie["job_id"])
        _, listing, _ = ssh_run(join(["squeue", "-h", "-t", "all", f"--name={zombie['job_id']}", "-o", "%i|%T|%N|"]))
        rows = {row[0]: row[1:] for row in (line.split("|") for line in listing.split())}
        outcomes.append(
            {
                "run": run_id,
                "job": zombie["slurm_job_id"],
                "submitted": ids,
                "states": {i: rows.get(i, ["gone"])[0] for i in ids},
                "apart_s": abs(arrived[1] - arrived[2]),
            }
        )
        record_property(  # before the checks: a failed run shows what happened in each race so far
            "races",
            "; ".join(
                f"{o['run']}: tries at the barrier {o['apart_s']:.2f} s apart, submitted "
                f"{', '.join(f'{i} ({state})' for i, state in o['states'].items())}, kept {o['job']}"
                for o in outcomes
            ),
        )
        assert len(ids) == 2, f"both tries reached sbatch, so two jobs carry the name: {rows}"
        assert zombie["slurm_job_id"] == min(ids, key=int), "the oldest job is kept"
        others = [i for i in ids if i != zombie["slurm_job_id"]]
        assert all(rows[i][0] == "CANCELLED" and not rows[i][1] for i in others), rows  # never given a node
        assert rows[zombie["slurm_job_id"]][0] != "CANCELLED", rows

    sensor = sensor_for(retry)  # the last race's job
    assert drive(sensor, context(dag_id, "wait", f"race{RACES - 1}"), Triggerer())["terminal_state"] == "COMPLETE"
    record_property(
        "detail",
        f"in {RACES} of {RACES} runs both tries reached sbatch (two jobs under the name; the tries came to the "
        f"barrier at most {max(o['apart_s'] for o in outcomes):.2f} s apart): the older job kept, the newer "
        "cancelled while held",
    )
