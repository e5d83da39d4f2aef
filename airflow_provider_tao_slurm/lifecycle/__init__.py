"""The job-lifecycle layer: between the hook and the operators, it owns a job's life.

- :mod:`.events`: the typed :class:`JobHandle` (the submit task's XCom) and :class:`JobEvent`
  (what the trigger yields), each with ``to_dict``/``from_dict``;
- :mod:`.jobs`: :class:`JobLifecycle`: the record store, submit-once and adoption (own jobs only;
  a failed lookup is never "no job"), infrastructure resubmission, cancel, vanished and
  unrecognised jobs, sidecar removal, log tails;
- :mod:`.support`: Airflow-side helpers the operators and the sensor share (secret references).

The names below are imported on first use: a DAG file importing an operator (which imports
:mod:`.support` and :mod:`.links`) loads neither the job records nor the hook.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.lifecycle.events import EventStatus, JobEvent, JobHandle, Observation
    from airflow_provider_tao_slurm.lifecycle.jobs import Attempt, JobLifecycle

__all__ = ["Attempt", "EventStatus", "JobEvent", "JobHandle", "JobLifecycle", "Observation"]

_HOMES = {
    "Attempt": "jobs",
    "EventStatus": "events",
    "JobEvent": "events",
    "JobHandle": "events",
    "JobLifecycle": "jobs",
    "Observation": "events",
}


def __getattr__(name: str) -> Any:
    """Import one of :data:`__all__` from its module on first access."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
