"""A submit task whose first try loses its worker right after the job is submitted and stored.

Used by ``tests/cluster/test_task_state_store.py`` only (its ``dags_folder``): the image and command
come from the run's conf.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor


class SubmitThenLoseTheWorker(SbatchSubmitOperator):
    """Try 1's task process is SIGKILLed once the job is submitted and its handle is in the task state store."""

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, Any]:
        if context["ti"].try_number == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().get_job_result(external_id, context)


with DAG("tao_store_reattach", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    submit = SubmitThenLoseTheWorker(
        task_id="submit",
        image="{{ dag_run.conf['image'] }}",
        command="{{ dag_run.conf['command'] }}",
        network_arch="custom",
        gpus_per_node=1,
        cpus_per_task=1,
        time_hours=0.1,
        timeout_hours=0.05,
        retries=1,
        retry_delay=timedelta(seconds=2),
    )
    SlurmJobSensor(task_id="watch", job=submit.output, deferrable=True, poke_interval=2)
