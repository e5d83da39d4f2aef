"""The job-lifecycle layer: between the hook and the operators, it owns a job's life.

- :mod:`.events`: the typed :class:`JobHandle` (the submit task's XCom) and :class:`JobEvent`
  (what the trigger yields), each with ``to_dict``/``from_dict``;
- :mod:`.jobs`: :class:`JobLifecycle`: the record store, submit-once and adoption (own jobs only;
  a failed lookup is never "no job"), infrastructure resubmission, cancel, vanished and
  unrecognised jobs, sidecar removal, log tails;
- :mod:`.support`: Airflow-side helpers the operators and the sensor share (secret references).
"""

from __future__ import annotations

from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent, JobHandle, Observation
from airflow_provider_tao_slurm.lifecycle.jobs import Attempt, JobLifecycle

__all__ = ["Attempt", "EventStatus", "JobEvent", "JobHandle", "JobLifecycle", "Observation"]
