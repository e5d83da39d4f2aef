"""Observing subclasses of the two triggers for ``benchmarks/restart.py``, imported by a real ``airflow triggerer``.

The trigger rows the benchmark inserts name these classes; the triggerer imports this module (``benchmarks/``
on its ``PYTHONPATH``) and runs them as it runs any trigger. They change nothing the triggers do: each
records, into the file named by ``$TAO_BENCH_PROBE`` (one per triggerer process, appended line by line),
when a trigger started running and when its job's state was first known:

- ``start <job id> <t>``: the triggerer began the trigger's ``run()``;
- ``known <job id> <t>``: shared mode, the shared poller's status query answered for the job (recorded
  around :meth:`SlurmHook.a_get_states`, which the poller calls for every poll); baseline, the SSH
  trigger's first complete poll (its last step, ``_read_log_chunk``, returned);
- ``gaveup <job id> <t>``: the SSH trigger gave up (its job's state is then never known).

``t`` is ``time.monotonic()`` (``CLOCK_MONOTONIC``: one clock for every process of the machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from airflow.providers.ssh.triggers.ssh_remote_job import SSHRemoteJobTrigger

from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

#: The environment variable naming the probe file.
PROBE_ENV = "TAO_BENCH_PROBE"


def record(kind: str, job_ids: Iterable[str]) -> None:
    """Append one ``<kind> <job id> <t>`` line per job to the probe file, in one write."""
    now = time.monotonic()
    lines = "".join(f"{kind} {job_id} {now:.6f}\n" for job_id in job_ids)
    if lines:
        fd = os.open(os.environ[PROBE_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)


_get_states = SlurmHook.a_get_states


async def _observed_get_states(self: SlurmHook, job_ids: Iterable[str], **kwargs: Any) -> Any:
    states = await _get_states(self, job_ids, **kwargs)
    record("known", states)
    return states


SlurmHook.a_get_states = _observed_get_states  # type: ignore[method-assign]


class ObservedSlurmJobTrigger(SlurmJobTrigger):
    """The provider's trigger (shared poller), recording when it starts; its job's answers are recorded above."""

    async def run(self) -> AsyncIterator[Any]:
        """Record the start, then run the provider's trigger unchanged."""
        record("start", [self.slurm_job_id])
        async for event in super().run():
            yield event


class ObservedSSHRemoteJobTrigger(SSHRemoteJobTrigger):
    """The SSH provider's trigger, recording its start, its first complete poll and its giving up."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The parent's kwargs under this class's path (the parent names itself)."""
        return f"{__name__}.{type(self).__qualname__}", super().serialize()[1]

    async def run(self) -> AsyncIterator[Any]:
        """Record the start, then run the SSH provider's trigger unchanged."""
        record("start", [self.job_id])
        async for event in super().run():
            yield event

    async def _read_log_chunk(self, conn: Any) -> tuple[str, int]:
        result = await super()._read_log_chunk(conn)
        if not getattr(self, "_known", False):
            self._known = True
            record("known", [self.job_id])
        return result

    def _error_event(self, message: str) -> Any:
        record("gaveup", [self.job_id])
        return super()._error_event(message)
