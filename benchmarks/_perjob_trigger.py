"""The per-job scheduler pattern for ``benchmarks/poller.py``: one trigger per job, each asking the scheduler itself.

Per-job SLURM triggers (one trigger per watched job, as Airflow's SLURM-over-SSH triggers commonly are) ask the
scheduler about their own job at every poll: ``squeue -j <id>``, and accounting (``sacct -j <id>``) once
``squeue`` no longer shows the job. :class:`PerJobSqueueTrigger` does exactly that with the provider's own hook
(:meth:`SlurmHook.a_get_states` on its one job id: ``squeue -h -t all -j <id>``, then ``sacct`` when squeue did
not answer for it) over the provider's pooled connection, so that against the shared poller only the number of
scheduler queries differs (not the connections, the commands' text or their parsing). A failed poll is tried
again at the next interval; after more than :data:`MAX_FAILURES` in a row the trigger gives up with an error
event, as the SSH provider's trigger does.

The worker process of ``poller.py`` imports this module by the classpath :meth:`serialize` returns (``benchmarks/``
is on its path), as the triggerer imports any trigger; :data:`STATS` counts failed polls and triggers that gave up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

#: Failed polls in a row after which a trigger gives up (the SSH provider's trigger: more than 5).
MAX_FAILURES = 5
#: Failed polls and triggers that gave up, in this process.
STATS = {"failures": 0, "gave_up": 0}


class PerJobSqueueTrigger(BaseTrigger):
    """Watches one SLURM job by asking the scheduler about it every ``poll_interval`` seconds.

    :param slurm_conn_id: the ``tao_slurm`` connection.
    :param slurm_job_id: the SLURM job id.
    :param poll_interval: seconds between two polls.
    """

    def __init__(self, slurm_conn_id: str, slurm_job_id: str, poll_interval: float) -> None:
        super().__init__()
        self.slurm_conn_id = slurm_conn_id
        self.slurm_job_id = slurm_job_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and keyword arguments the triggerer rebuilds the trigger from."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "slurm_conn_id": self.slurm_conn_id,
                "slurm_job_id": self.slurm_job_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until the job's state is terminal (one ``terminal`` event) or too many polls failed (``error``)."""
        hook = SlurmHook(self.slurm_conn_id)
        failures = 0
        while True:
            try:
                states = await hook.a_get_states([self.slurm_job_id])
            except Exception as exc:  # a poll that got no answer: the next interval asks again
                STATS["failures"] += 1
                failures += 1
                if failures > MAX_FAILURES:
                    STATS["gave_up"] += 1
                    yield TriggerEvent(
                        {
                            "status": "error",
                            "slurm_job_id": self.slurm_job_id,
                            "message": f"{type(exc).__name__}: {exc}",
                        }
                    )
                    return
            else:
                failures = 0
                state = states.get(self.slurm_job_id)
                if state is not None and state.tao_state.is_terminal:
                    yield TriggerEvent({"status": "terminal", "slurm_job_id": self.slurm_job_id, "state": state.native})
                    return
            await asyncio.sleep(self.poll_interval)
