"""Benchmark 4: time to detect, from a job's end on the cluster to the Airflow task finishing.

A tiny DAG (``SbatchSubmitOperator`` submitting ``sleep 3``, then a deferrable ``SlurmJobSensor``
with ``poke_interval=2``) runs under ``dag.test()``, which runs the trigger in-line. Per run the
figure is the sensor task's ``end_date`` minus the job's ``End`` in ``sacct``. ``End`` has a
resolution of one second and is truncated, so the job really ended in ``[End, End + 1 s)`` and the
true latency lies in ``(figure - 1 s, figure]``: the figure is an upper bound. The baseline is the
poll interval itself (what an ideal poller would need at worst).

Usage: ``python benchmarks/detect.py [--runs 3]``.
"""

from __future__ import annotations

import argparse
import os
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import _common  # before Airflow: isolated Airflow home and the bench connections
from _common import Figure

from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import mint_job_id
from airflow_provider_tao_slurm.core.shell import join

#: The code this benchmark measures (the whole provider (submit, job, sensor and trigger) and the job templates);
#: report.py counts the commits that changed it since.
MEASURES = (
    "airflow_provider_tao_slurm",
    "templates",
)

DAG_ID = "bench_detect"
POKE_INTERVAL = 2
JOB_SECONDS = 3
RUN_TIMEOUT_S = 180
DAG_FILE = '''"""Benchmark DAG: submit a short job and wait for it (written by benchmarks/detect.py)."""
from airflow.sdk import DAG

from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

with DAG(dag_id={dag_id!r}, schedule=None) as dag:
    submit = SbatchSubmitOperator(
        task_id="submit",
        slurm_conn_id={conn_id!r},
        image={image!r},
        command="sleep {seconds}",
        gpus_per_node=1,
        cpus_per_task=1,
        time_hours=0.25,
        timeout_hours=0.2,
    )
    SlurmJobSensor(
        task_id="wait", slurm_conn_id={conn_id!r}, job=submit.output, poke_interval={poke}, deferrable=True
    )
'''


def _timeout(signum: int, frame: Any) -> None:
    raise TimeoutError(f"dag.test() did not finish within {RUN_TIMEOUT_S} s (an in-line trigger never fired?)")


def sacct_end(job_name: str) -> tuple[str, str, float]:
    """``(job id, state, End as epoch seconds)`` of the job named ``job_name``."""
    out = _common.ssh(
        join(["sacct", "-X", "-n", "-P", f"--name={job_name}", "-o", "JobIDRaw,State,End", "--starttime=now-1hours"])
    )
    job_id, state, end = out.strip().splitlines()[-1].split("|")
    return job_id, state, datetime.fromisoformat(end).timestamp()  # naive = this machine's local time, as sacct's


def main() -> None:
    """Run the DAG ``--runs`` times, print and store the figures, clean up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    image = _common.sqsh_image()
    dags_dir = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])  # set by _common before Airflow was imported
    dags_dir.mkdir(parents=True, exist_ok=True)
    (dags_dir / "bench_detect.py").write_text(
        DAG_FILE.format(
            dag_id=DAG_ID, conn_id=_common.SLURM_CONN_ID, image=image, seconds=JOB_SECONDS, poke=POKE_INTERVAL
        )
    )

    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.db import resetdb

    resetdb()
    dag = DagBag(dag_folder=str(dags_dir)).dags[DAG_ID]
    runs: list[dict[str, Any]] = []
    leftovers: list[str] = [image]
    signal.signal(signal.SIGALRM, _timeout)
    try:
        for _ in range(args.runs):
            signal.alarm(RUN_TIMEOUT_S)
            dag_run = dag.test()
            signal.alarm(0)
            tis = {ti.task_id: ti for ti in dag_run.get_task_instances()}
            job_name = mint_job_id(DAG_ID, "submit", dag_run.run_id, -1)
            layout = JobLayout(_common.CLUSTER["results_dir"], job_name)
            leftovers += [layout.job_dir, layout.results_dir, layout.record_path]
            job_id, state, end = sacct_end(job_name)
            leftovers.append(layout.job_log_dir(job_id))
            wait = tis["wait"]
            runs.append(
                {
                    "run_id": dag_run.run_id,
                    "dag_run_state": str(dag_run.state),
                    "slurm_job_id": job_id,
                    "sacct_state": state,
                    "sacct_end": end,
                    "sensor_start": wait.start_date.timestamp(),
                    "sensor_end": wait.end_date.timestamp(),
                    "latency_upper_s": wait.end_date.timestamp() - end,
                }
            )
    finally:
        signal.alarm(0)
        _common.remove_remote(leftovers)

    latencies = [r["latency_upper_s"] for r in runs]
    target = POKE_INTERVAL + 2
    ok_runs = [r for r in runs if r["dag_run_state"] == "success" and r["sacct_state"] == "COMPLETED"]
    figures = [
        Figure(
            "DAG runs succeeded (job COMPLETED)",
            f"{len(ok_runs)}/{len(runs)}",
            "",
            f"{len(runs)}/{len(runs)}",
            len(ok_runs) == len(runs),
        ),
        Figure(
            "job End (sacct) -> sensor task end, median (upper bound)",
            f"{_common.median(latencies):.2f} s",
            f"poll interval {POKE_INTERVAL} s",
        ),
        Figure(
            "job End (sacct) -> sensor task end, max (upper bound)",
            f"{max(latencies):.2f} s",
            f"poll interval {POKE_INTERVAL} s, ratio {max(latencies) / POKE_INTERVAL:.2f}x",
            f"<= {target} s",
            max(latencies) <= target,
        ),
        Figure("  same, lower bound (sacct End is truncated to 1 s)", f"{max(latencies) - 1:.2f} s"),
    ]
    title = f"Time to detect under dag.test(), {len(runs)} runs (benchmarks/detect.py)"
    _common.print_figures(title, figures)
    _common.write_result("detect", title, figures, {"runs": runs, "poke_interval_s": POKE_INTERVAL}, measures=MEASURES)


if __name__ == "__main__":
    main()
