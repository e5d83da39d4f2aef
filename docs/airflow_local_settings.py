"""An ``airflow_local_settings.py`` that loads the provider's operator classes once per Airflow process.

Every Airflow process imports ``airflow_local_settings`` (from ``$AIRFLOW_HOME/config``) when it
starts, the DAG processor included, and the DAG processor forks a parsing process for each DAG file:
the classes imported here are already loaded in every parsing process, which no longer imports them
for each file. See "What a DAG file costs" in ``docs/getting-started.md``.
"""

from __future__ import annotations

# [START preload_operators]
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.operators.preflight import SlurmPreflightOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

# Imported to be loaded before the DAG processor forks its parsing processes; nothing here uses them.
__all__ = [
    "EnrootImportOperator",
    "NcclProbeOperator",
    "SbatchSubmitOperator",
    "SlurmJobSensor",
    "SlurmPreflightOperator",
    "StageDatasetCheckOperator",
]
# [END preload_operators]
