"""Defaults that operator and sensor signatures name, in a module that imports nothing.

Operator and sensor modules are imported whenever a DAG file is parsed, and the default values in
their signatures are evaluated then; keeping those values here lets those modules name them without
importing the modules that use them (resource builders, log streams, job events, the hook, remote commands).
The hook, the resource builders, the log streams, the job events and the remote commands take their
values from here, so each value has one definition.
"""

from __future__ import annotations

#: The ``tao_slurm`` connection used when none is named (the hook's ``default_conn_name``).
DEFAULT_CONN_ID = "slurm_default"
#: The program's own timeout in hours that the 4 h default wall limit gets: ``timeout_hours`` itself
#: defaults to ``None``, derived from ``time_hours``
#: (:func:`~airflow_provider_tao_slurm.core.resources.program_timeout_seconds`).
DEFAULT_TIMEOUT_HOURS = 3.8
#: Bytes read per file per poll unless the sensor says otherwise.
DEFAULT_BYTES_PER_POLL = 16384
#: How long a job may be unknown to both squeue and sacct after submit (sacct lags by seconds).
DEFAULT_NOT_FOUND_GRACE_S = 300.0
#: How long the scheduler may report a state this provider does not know before the task fails.
DEFAULT_UNRECOGNISED_GRACE_S = 600.0
#: Default wall time of an image conversion job (``EnrootImportOperator(time_hours=...)``); the preflight
#: picks a conversion partition that allows it.
CONVERSION_TIME_HOURS = 2.0
#: The Pyxis options of ``srun`` that the provider's batch scripts rely on (checked by the preflight).
PYXIS_SRUN_OPTIONS = ("--container-image", "--container-mounts", "--no-container-mount-home")
#: How long a cached NCCL environment is trusted (``NcclProbeOperator(cache_max_age_hours=...)``): a week.
DEFAULT_NCCL_CACHE_MAX_AGE_HOURS = 7 * 24.0
#: Airflow task state store key of the submit task's job handle (``SbatchSubmitOperator.external_id_key``;
#: renaming it breaks in-flight retries).
SUBMITTED_JOB_KEY = "slurm_job"
#: Airflow task state store key of the job a sensor watches: ``{"root": <submitted slurm_job_id>, "handle": ...}``.
WATCHED_JOB_STORE_KEY = "watched_job"
