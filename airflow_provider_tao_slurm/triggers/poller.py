"""The shared status poller: one batched squeue/sacct query per cluster per interval.

Every :class:`~airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger` of one cluster
account in a triggerer process subscribes its job id here. One background task per (cluster
account, event loop) asks the cluster about ALL subscribed jobs in one go over the hook's pooled
SSH connection, and fans the answers out to the subscribers. A failed poll is retried with
backoff; subscribers get an error notice but keep waiting. A poll that answered for some jobs
only (controller or accounting down) gives the answered jobs their state and the others an
error notice: a job a failed query could not speak for is never reported gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tao_slurm.core.states import JobState
from airflow_provider_tao_slurm.exceptions import StatusQueryError

log = logging.getLogger(__name__)

#: Backoff after a failed poll: doubles up to this many seconds.
MAX_BACKOFF_S = 60.0

StatesFetcher = Callable[[list[str]], Coroutine[Any, Any, dict[str, JobState]]]


@dataclass(frozen=True)
class PollUpdate:
    """What one poll said about one job: its state, or None when no command knows it (yet)."""

    job_id: str
    state: JobState | None
    polled_at: float
    error: str | None = None


#: How many recent poll durations the stats keep (a triggerer runs for months).
STATS_WINDOW = 256


@dataclass
class _Stats:
    polls: int = 0
    failures: int = 0
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))


class StatusPoller:
    """Poll many jobs of one cluster account with one query per interval.

    :param key: identity of the cluster account (one poller per key and event loop).
    :param fetch: coroutine returning the states of a list of job ids in one batched call.
    :param interval: seconds between polls while nobody is subscribed; subscribers bring their own
        interval and the smallest one among the current subscribers wins.
    """

    def __init__(self, key: str, fetch: StatesFetcher, interval: float) -> None:
        self.key = key
        self._fetch = fetch
        self._default_interval = interval
        self._subscribers: dict[str, set[asyncio.Queue[PollUpdate]]] = {}
        self._intervals: dict[asyncio.Queue[PollUpdate], float] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.stats = _Stats()

    @property
    def interval(self) -> float:
        """Seconds between polls: the smallest interval a current subscriber asked for."""
        return min(self._intervals.values(), default=self._default_interval)

    @property
    def job_ids(self) -> list[str]:
        """The job ids currently watched."""
        return list(self._subscribers)

    @property
    def running(self) -> bool:
        """Whether the poll loop is alive."""
        return self._task is not None and not self._task.done()

    def subscribe(self, job_id: str, interval: float) -> asyncio.Queue[PollUpdate]:
        """Watch ``job_id``; updates arrive on the returned queue. Starts the poll loop if needed."""
        queue: asyncio.Queue[PollUpdate] = asyncio.Queue()
        self._subscribers.setdefault(job_id, set()).add(queue)
        self._intervals[queue] = interval
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"tao-slurm-poller-{self.key}")
        self._wake.set()
        return queue

    def unsubscribe(self, job_id: str, queue: asyncio.Queue[PollUpdate]) -> None:
        """Stop watching; the loop is cancelled when nobody is subscribed any more."""
        self._intervals.pop(queue, None)
        queues = self._subscribers.get(job_id)
        if queues is None:
            return
        queues.discard(queue)
        if not queues:
            del self._subscribers[job_id]
        if not self._subscribers and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self) -> None:
        # Only the poller's current task may poll: a loop whose cancellation got lost (Python 3.11's
        # asyncio.wait_for can swallow one) must not keep polling next to its successor.
        me = asyncio.current_task()
        backoff = self.interval
        while self._subscribers and self._task is me:
            self._wake.clear()
            ids = list(self._subscribers)
            started = time.monotonic()
            unanswered: list[str] = []
            try:
                states = await self._fetch(ids)
            except asyncio.CancelledError:
                raise
            except StatusQueryError as partial:
                # Some jobs were answered: they get their state; the rest an error notice, never "gone".
                self.stats.failures += 1
                log.warning(
                    "status poll on %s left %d of %d job(s) unanswered: %s",
                    self.key,
                    len(partial.unanswered),
                    len(ids),
                    partial,
                )
                unanswered = partial.unanswered
                self._publish(unanswered, {}, error=str(partial))
                states = partial.states
            except Exception as exc:
                self.stats.failures += 1
                log.warning("status poll of %d job(s) on %s failed (retrying): %s", len(ids), self.key, exc)
                self._publish(ids, {}, error=str(exc))
                backoff = min(max(backoff, self.interval) * 2, MAX_BACKOFF_S)
                await asyncio.sleep(backoff)
                continue
            backoff = self.interval
            self.stats.polls += 1
            self.stats.durations.append(time.monotonic() - started)
            self._publish([i for i in ids if i not in unanswered], states)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._sleep_until_new_subscriber(ids)

    async def _sleep_until_new_subscriber(self, polled: list[str]) -> None:
        """Return early when a job that was not in the last poll subscribes (first answer comes fast)."""
        while True:
            await self._wake.wait()
            if set(self._subscribers) - set(polled):
                return
            self._wake.clear()

    def _publish(self, ids: list[str], states: dict[str, JobState], error: str | None = None) -> None:
        now = time.time()
        for job_id in ids:
            update = PollUpdate(job_id, states.get(job_id), now, error)
            for queue in list(self._subscribers.get(job_id, ())):
                queue.put_nowait(update)


#: event loop -> cluster account key -> poller (a new loop never gets an old loop's poller).
_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, StatusPoller]] = weakref.WeakKeyDictionary()


def get_poller(key: str, fetch: StatesFetcher, interval: float) -> StatusPoller:
    """The poller of ``key`` in the running event loop (created on first use)."""
    pollers = _POLLERS.setdefault(asyncio.get_running_loop(), {})
    poller = pollers.get(key)
    if poller is None:
        poller = pollers[key] = StatusPoller(key, fetch, interval)
    return poller


def active_pollers() -> list[StatusPoller]:
    """Every poller of the running event loop (benchmarks and tests)."""
    return list(_POLLERS.get(asyncio.get_running_loop(), {}).values())
