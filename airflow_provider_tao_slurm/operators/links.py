"""The extra links' first import path, kept so that DAGs and serialized DAGs naming it still load.

The links live in :mod:`airflow_provider_tao_slurm.lifecycle.links`, shared by
:class:`~airflow_provider_tao_slurm.operators.sbatch_submit.SbatchSubmitOperator` and
:class:`~airflow_provider_tao_slurm.sensors.slurm_job.SlurmJobSensor`.
"""

from __future__ import annotations

from airflow_provider_tao_slurm.lifecycle.links import SlurmJobLogsLink, SlurmJobResultsLink

__all__ = ["SlurmJobLogsLink", "SlurmJobResultsLink"]
