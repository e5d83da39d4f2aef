"""The shared status poller: one batched squeue/sacct query per cluster per interval.

Every :class:`~airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger` of one cluster
account in a triggerer process subscribes its job id here. One background task per (cluster
account, event loop) asks the cluster about ALL subscribed jobs in one go over the hook's pooled
SSH connection, and fans the answers out to the subscribers. A failed poll is retried with
backoff; subscribers get an error notice but keep waiting. A poll that answered for some jobs
only (controller or accounting down) gives the answered jobs their state and the others an
error notice: a job a failed query could not speak for is never reported gone.

Subscribers may bring :class:`~airflow_provider_tao_slurm.core.logstream.LineStream` s (the job's
``main.out``, ``main.err``, ``status.json``): after the status query, ONE more command reads what
every started job appended to its files since the last poll, and each subscriber gets its new lines
with the job's state. A job that floods its log is cut at its per-poll byte budget (and the whole
read at :data:`MAX_LOG_BYTES_PER_POLL`), so it cannot starve the others.

End markers: a subscriber may name its job's ends directory (``<results_dir>/ends``), where the
batch script's EXIT trap leaves ``<job>-<restart>-<exit code>.end`` when the script ends by itself.
Every :data:`END_MARKER_INTERVAL_S` seconds ONE ``find`` lists the new markers of all watched
directories over the same connection. Accounting (``sacct``: slurmdbd; slurmctld is not asked)
confirms them in batches: a marker found waits :data:`END_MARKER_BATCH_S`, the directories are listed
once more, and ONE ``sacct`` asks about every job whose marker waits (the new ones and the ones
accounting did not show ended yet); a confirmation that would go out just before the status query
rides on it instead (that query's ``sacct`` answers the ended jobs). A job accounting shows ended (its
final state with its end time) the way its script's own exit ends it (:data:`ENDED_BY_ITS_SCRIPT`),
with the marker's exit code, gets accounting's state and its last log lines at once, so a job's end
reaches its trigger within seconds while the scheduler is asked once per interval (30 s suits a real
cluster) plus one ``sacct`` per batch of ends, for what no trap can report: cancellation, preemption,
requeue, a node failure, a killed step. A marker is only a reason to ask accounting
early: a run that received SIGTERM leaves none, a run that SLURM requeued after its script ended is
not ended in accounting, and with accounting down nothing is confirmed, so the scheduler queries
decide as without markers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tao_slurm.core.commands import EndMarker
from airflow_provider_tao_slurm.core.logstream import LineStream, TailChunk, TailRequest
from airflow_provider_tao_slurm.core.states import JobState, TaoState
from airflow_provider_tao_slurm.exceptions import StatusQueryError

log = logging.getLogger(__name__)

#: Backoff after a failed poll: doubles up to this many seconds.
MAX_BACKOFF_S = 60.0

#: The most bytes one batched log read returns; each file's budget shrinks to fit when many jobs are read.
MAX_LOG_BYTES_PER_POLL = 32 << 20
#: ... but never below this many bytes per file.
MIN_LOG_BYTES_PER_FILE = 1024

#: Seconds a job that just subscribed waits before its first status query: the triggers a triggerer starts
#: together (hundreds after a restart) are answered by one query each such moment, not one per trigger,
#: and only the new jobs are asked (the others wait for the interval's query).
FIRST_ANSWER_GATHER_S = 0.25
#: Seconds between two reads of the end markers while some subscriber has an ends directory.
END_MARKER_INTERVAL_S = 2.0
#: Markers up to this many seconds older than the newest one seen are listed again (a marker written
#: late, or by a host whose clock lags, is not missed; each subscriber still gets it once).
END_MARKER_SLACK_S = 60.0
#: Seconds a marker found waits before accounting is asked about it: the markers found meanwhile go in
#: the same ``sacct`` (the directories are listed once more right before it), and slurmdbd, which learns
#: of an end a moment after the script's EXIT trap ran, has it. Short against the marker interval: the
#: batch trades at most this much latency for one accounting query per batch of ends.
END_MARKER_BATCH_S = 0.6
#: Seconds before accounting is asked again about a marker it answered for without confirming it (it
#: lags, or SLURM requeued the job); doubles with each such answer up to :data:`END_MARKER_INTERVAL_S`.
END_MARKER_RECHECK_S = 0.5
#: A marker accounting does not confirm within this many seconds (a requeued run, accounting down) is
#: dropped: the scheduler queries decide that job's end.
END_MARKER_CONFIRM_S = 30.0
#: The ends a script's own exit gives; accounting showing one of them confirms a marker. Any other end
#: (NODE_FAIL, PREEMPTED, CANCELLED, TIMEOUT, ...) is the scheduler's to report: squeue knows whether
#: SLURM requeues the job, which accounting may not show yet.
ENDED_BY_ITS_SCRIPT = frozenset({"COMPLETED", "FAILED", "OUT_OF_MEMORY"})


def _confirms(state: JobState, marker: EndMarker) -> bool:
    """Whether accounting's end is the one the marker's run left.

    That is the job's newest run, ended as its script ends it (no signal), with the marker's exit code.
    A requeued job keeps its id, and its rows (``sacct -D``) hold every run: only the newest run's end is
    the job's, and only when it is the marker's run. A run SLURM is restarting can show a transient end
    (seen under load: FAILED, its script SIGTERMed, ``0:15``, while a planted or stale marker of that run
    said 0); an end by a signal, with another exit code, or of another run is not this marker's, and the
    scheduler queries decide.
    """
    return (
        state.native in ENDED_BY_ITS_SCRIPT
        and not state.signal
        and state.exit_code == marker.exit_code
        and state.run == marker.restart
    )


def _superseded(state: JobState | None, marker: EndMarker) -> bool:
    """Whether accounting already shows a later run of the job than the marker's (SLURM requeued it)."""
    return state is not None and state.run is not None and state.run > marker.restart


def _say_dropped(marker: EndMarker, state: JobState | None, other_end: bool) -> None:
    """Say why a marker is dropped unconfirmed: accounting shows another end (``other_end``), or none in time."""
    if other_end:
        log.debug(
            "SLURM job %s shows %s, not run %d's end as its marker says (exit code %d): the scheduler "
            "queries report it",
            marker.slurm_job_id,
            state,
            marker.restart,
            marker.exit_code,
        )
        return
    log.info(
        "SLURM job %s's end marker (run %d, exit code %d) is not confirmed by accounting within %.0f s "
        "(requeued, or accounting down): the scheduler queries decide",
        marker.slurm_job_id,
        marker.restart,
        marker.exit_code,
        END_MARKER_CONFIRM_S,
    )


@dataclass
class _Waiting:
    """An end marker waiting for accounting's word, for one subscriber.

    :ivar marker: the marker.
    :ivar found: when it was found (``time.monotonic()``).
    :ivar due: when accounting is to be asked about it (every waiting marker goes in that query).
    :ivar answers: how many answers of accounting did not confirm it yet (the recheck backoff).
    """

    marker: EndMarker
    found: float
    due: float
    answers: int = 0


StatesFetcher = Callable[[list[str]], Coroutine[Any, Any, dict[str, JobState]]]
LogReader = Callable[[list[TailRequest]], Coroutine[Any, Any, list[TailChunk]]]
EndsReader = Callable[[Mapping[str, float]], Coroutine[Any, Any, list[EndMarker]]]


@dataclass(frozen=True)
class PollUpdate:
    """What one poll said about one job: its state (None when no command knows it yet) and its new log lines.

    A subscriber is sent an update only when it says something new: a state that differs from the
    last one it was sent, a terminal, unrecognised or missing state, an error, or log lines. A job
    that keeps running costs its trigger nothing per poll; ``last_seen`` says when a poll last
    answered with the job's state (so a job that goes missing is timed from then, not from the last
    update sent).
    """

    job_id: str
    state: JobState | None
    polled_at: float
    error: str | None = None
    lines: tuple[str, ...] = ()
    last_seen: float | None = None


#: How many recent poll durations the stats keep (a triggerer runs for months).
STATS_WINDOW = 256


@dataclass
class _Stats:
    polls: int = 0
    failures: int = 0
    log_reads: int = 0
    log_failures: int = 0
    log_bytes: int = 0
    end_reads: int = 0
    end_failures: int = 0
    end_confirms: int = 0
    end_confirm_failures: int = 0
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))


class StatusPoller:
    """Poll many jobs of one cluster account with one query per interval.

    :param key: identity of the cluster account (one poller per key and event loop).
    :param fetch: coroutine returning the states of a list of job ids in one batched call.
    :param interval: seconds between polls while nobody is subscribed; subscribers bring their own
        interval and the smallest one among the current subscribers wins.
    :param read_logs: coroutine reading many files from offsets in one batched call (log streaming).
    :param read_ends: coroutine listing the new end markers of many ends directories in one call;
        while a subscriber names an ends directory, it runs every :data:`END_MARKER_INTERVAL_S`
        seconds, between the status queries.
    :param confirm_ends: coroutine returning accounting's states of many jobs in one call (``sacct``);
        without it markers are not read.
    """

    def __init__(
        self,
        key: str,
        fetch: StatesFetcher,
        interval: float,
        read_logs: LogReader | None = None,
        read_ends: EndsReader | None = None,
        confirm_ends: StatesFetcher | None = None,
    ) -> None:
        self.key = key
        self._fetch = fetch
        self._read_logs = read_logs
        self._read_ends = read_ends
        self._confirm_ends = confirm_ends
        self._default_interval = interval
        self._subscribers: dict[str, set[asyncio.Queue[PollUpdate]]] = {}
        self._intervals: dict[asyncio.Queue[PollUpdate], float] = {}
        self._streams: dict[asyncio.Queue[PollUpdate], tuple[str, tuple[LineStream, ...]]] = {}
        self._sent: dict[asyncio.Queue[PollUpdate], JobState] = {}
        self._seen: dict[str, float] = {}
        self._answered: set[str] = set()
        self._end_dirs: dict[asyncio.Queue[PollUpdate], str] = {}
        self._ends_since: dict[str, float] = {}
        self._next_run: dict[asyncio.Queue[PollUpdate], int] = {}
        self._unconfirmed: dict[asyncio.Queue[PollUpdate], _Waiting] = {}
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

    def subscribe(
        self,
        job_id: str,
        interval: float,
        streams: Sequence[LineStream] = (),
        end_dir: str | None = None,
    ) -> asyncio.Queue[PollUpdate]:
        """Watch ``job_id`` (and follow ``streams`` once it started); updates arrive on the returned queue.

        Starts the poll loop if needed. The poller advances the streams' offsets as it reads them.
        With ``end_dir``, the job's end marker there, once accounting confirms the end, ends the
        watch within seconds, between the status queries.
        """
        queue: asyncio.Queue[PollUpdate] = asyncio.Queue()
        self._subscribers.setdefault(job_id, set()).add(queue)
        self._intervals[queue] = interval
        if streams:
            self._streams[queue] = (job_id, tuple(streams))
        if end_dir is not None:
            self._end_dirs[queue] = end_dir
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"tao-slurm-poller-{self.key}")
        self._wake.set()
        return queue

    def unsubscribe(self, job_id: str, queue: asyncio.Queue[PollUpdate]) -> None:
        """Stop watching; the loop is cancelled when nobody is subscribed any more."""
        self._intervals.pop(queue, None)
        self._streams.pop(queue, None)
        self._sent.pop(queue, None)
        self._end_dirs.pop(queue, None)
        self._next_run.pop(queue, None)
        self._unconfirmed.pop(queue, None)
        queues = self._subscribers.get(job_id)
        if queues is None:
            return
        queues.discard(queue)
        if not queues:
            del self._subscribers[job_id]
            self._seen.pop(job_id, None)
            self._answered.discard(job_id)
        if not self._subscribers and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self) -> None:
        # Only the poller's current task may poll: a loop whose cancellation got lost (Python 3.11's
        # asyncio.wait_for can swallow one) must not keep polling next to its successor.
        me = asyncio.current_task()
        backoff = self.interval
        next_status = next_ends = time.monotonic()
        read_at = next_ends - END_MARKER_INTERVAL_S
        while self._subscribers and self._task is me:
            self._wake.clear()
            failing = backoff > self.interval
            due = time.monotonic() >= next_status
            if due or (not failing and self._unanswered()):
                if not due:  # new jobs only: the ones subscribing meanwhile join this query
                    await asyncio.sleep(FIRST_ANSWER_GATHER_S)
                ids = list(self._subscribers) if due else self._unanswered()
                self._answered.update(ids)
                if await self._poll_status(ids):
                    backoff = self.interval
                else:
                    backoff = min(max(backoff, self.interval) * 2, MAX_BACKOFF_S)
                if due or backoff > self.interval:
                    next_status = time.monotonic() + backoff
                failing = backoff > self.interval
            deadline = next_status
            if self._end_dirs and self._read_ends is not None and self._confirm_ends is not None:
                if time.monotonic() >= next_ends:
                    await self._read_end_markers()
                    read_at = time.monotonic()
                    next_ends = read_at + END_MARKER_INTERVAL_S
                confirm = min((waiting.due for waiting in self._unconfirmed.values()), default=None)
                if confirm is not None and next_status <= confirm + END_MARKER_BATCH_S:
                    confirm = next_status  # rides on the status query, whose sacct answers the ended jobs
                elif confirm is not None and time.monotonic() >= confirm:
                    if time.monotonic() - read_at >= END_MARKER_BATCH_S / 2:
                        await self._read_end_markers()  # the markers that appeared meanwhile join the batch
                        read_at = time.monotonic()
                        next_ends = read_at + END_MARKER_INTERVAL_S
                    await self._confirm_end_markers()
                    confirm = min((waiting.due for waiting in self._unconfirmed.values()), default=None)
                deadline = min(deadline, next_ends, next_ends if confirm is None else confirm)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    if failing:  # a failing cluster is not asked early, not even for a new job
                        await asyncio.sleep(backoff)
                    await self._sleep_until_new_subscriber()

    async def _poll_status(self, ids: list[str]) -> bool:
        """One batched status query for ``ids``, published; False when it failed as a whole."""
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
            return False
        self.stats.polls += 1
        self.stats.durations.append(time.monotonic() - started)
        lines = await self._follow_logs(states)
        self._publish([i for i in ids if i not in unanswered], states, lines=lines)
        return True

    def _unanswered(self) -> list[str]:
        """Return the watched jobs no status query asked about yet (they subscribed since the last one)."""
        return [job_id for job_id in self._subscribers if job_id not in self._answered]

    async def _sleep_until_new_subscriber(self) -> None:
        """Return early when a job no query asked about yet subscribes (first answer comes fast)."""
        while True:
            await self._wake.wait()
            if self._unanswered():
                return
            self._wake.clear()

    async def _read_end_markers(self) -> None:
        """List the new end markers of every watched ends directory in one command.

        A marker waits for accounting's word (:meth:`_confirm_end_markers`, :data:`END_MARKER_BATCH_S`
        after it was found) for each subscriber that watches its job in that directory and has not
        dealt with that run yet. A failed listing is tried again at the next read (the status polls go
        on regardless).
        """
        assert self._read_ends is not None
        directories = sorted(set(self._end_dirs.values()))
        since = {directory: self._ends_since.get(directory, 0.0) for directory in directories}
        try:
            markers = await self._read_ends(since)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.end_failures += 1
            log.warning("end marker read on %s failed (read again in %s s): %s", self.key, END_MARKER_INTERVAL_S, exc)
            return
        self.stats.end_reads += 1
        found = time.monotonic()
        for marker in markers:
            self._ends_since[marker.directory] = max(
                self._ends_since.get(marker.directory, 0.0), marker.mtime - END_MARKER_SLACK_S
            )
            for queue in self._subscribers.get(marker.slurm_job_id, ()):
                if (
                    self._end_dirs.get(queue) == marker.directory
                    and marker.restart >= self._next_run.get(queue, 0)
                    and queue not in self._unconfirmed
                ):
                    self._unconfirmed[queue] = _Waiting(marker, found, found + END_MARKER_BATCH_S)

    async def _confirm_end_markers(self) -> None:
        """Ask accounting, in one command, about every job whose marker waits; a job it shows ended is sent.

        Every waiting marker goes in the query, due or not (one ``sacct`` per batch of ends): accounting's
        answer confirms, keeps waiting or drops each marker (:meth:`_judge_waiting`), and each confirmed
        job's subscriber is sent its end (:meth:`_send_confirmed`).
        """
        states, answered = await self._ask_accounting()
        await self._send_confirmed(self._judge_waiting(states, answered))

    async def _ask_accounting(self) -> tuple[dict[str, JobState], bool]:
        """Return accounting's states of every job whose marker waits, and whether accounting answered.

        A failed query is no answer (no states): it is counted and said at debug level only, the status
        queries go on regardless.
        """
        assert self._confirm_ends is not None
        ids = sorted({waiting.marker.slurm_job_id for waiting in self._unconfirmed.values()})
        try:
            states = await self._confirm_ends(ids)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.end_confirm_failures += 1
            log.debug("accounting could not confirm %d end marker(s) on %s: %s", len(ids), self.key, exc)
            return {}, False
        self.stats.end_confirms += 1
        return states, True

    def _judge_waiting(
        self, states: Mapping[str, JobState], answered: bool
    ) -> dict[asyncio.Queue[PollUpdate], JobState]:
        """Judge every waiting marker by accounting's ``states``; return the subscribers whose job it confirms.

        A marker is dropped (that run is not asked about again) when accounting shows an end no script's
        own exit gives (:data:`ENDED_BY_ITS_SCRIPT`) or an exit code other than the marker's, or when it is
        still unconfirmed after :data:`END_MARKER_CONFIRM_S` seconds: a requeued job runs again and leaves a
        new marker; with accounting down the scheduler queries decide. Accounting lists every run of a
        requeued job (``sacct -D``): a marker whose run is not the newest accounting shows is dropped at once
        (:func:`_confirms`, :func:`_superseded`). A marker accounting answered for without an end is asked
        about again after :data:`END_MARKER_RECHECK_S`, doubling per answer; after a failed query
        (``answered`` False) its markers are asked about again after :data:`END_MARKER_INTERVAL_S`.
        """
        now = time.monotonic()
        confirmed: dict[asyncio.Queue[PollUpdate], JobState] = {}
        for queue, waiting in list(self._unconfirmed.items()):
            marker = waiting.marker
            state = states.get(marker.slurm_job_id)
            ended = state is not None and state.accounted and not _superseded(state, marker)
            if not ended and not _superseded(state, marker) and now - waiting.found < END_MARKER_CONFIRM_S:
                if answered:
                    waiting.answers += 1
                    waiting.due = now + min(END_MARKER_RECHECK_S * 2 ** (waiting.answers - 1), END_MARKER_INTERVAL_S)
                else:
                    waiting.due = now + END_MARKER_INTERVAL_S
                continue
            del self._unconfirmed[queue]
            self._next_run[queue] = marker.restart + 1
            if ended and state is not None and _confirms(state, marker):
                confirmed[queue] = state
            else:
                _say_dropped(marker, state, ended or _superseded(state, marker))
        return confirmed

    async def _send_confirmed(self, confirmed: Mapping[asyncio.Queue[PollUpdate], JobState]) -> None:
        """Send each confirmed subscriber accounting's end of its job, with the job's last log lines.

        Accounting's state, so that the record agrees with accounting; the lines of all of them are read in
        one more command.
        """
        if not confirmed:
            return
        lines = await self._follow_logs({state.job_id: state for state in confirmed.values()}, confirmed)
        wall = time.time()
        for queue, state in confirmed.items():
            self._sent[queue] = state
            self._seen[state.job_id] = wall
            queue.put_nowait(PollUpdate(state.job_id, state, wall, lines=tuple(lines.get(queue, ())), last_seen=wall))

    async def _follow_logs(
        self, states: dict[str, JobState], only: Collection[asyncio.Queue[PollUpdate]] | None = None
    ) -> dict[asyncio.Queue[PollUpdate], list[str]]:
        """Read the new bytes of every started job's streams in one command; the new lines per subscriber.

        A job still pending has no logs yet and is not read. A failed read leaves the offsets where
        they were (the next poll reads the same bytes) and gives no lines.

        :param only: read these subscribers' streams only (the ones about to be sent an update).
        """
        followed = [
            (queue, stream)
            for queue, (job_id, streams) in self._streams.items()
            if (state := states.get(job_id)) is not None
            and state.tao_state is not TaoState.PENDING
            and (only is None or queue in only)
            for stream in streams
        ]
        if not followed or self._read_logs is None:
            return {}
        share = max(MIN_LOG_BYTES_PER_FILE, MAX_LOG_BYTES_PER_POLL // len(followed))
        requests = [stream.request(share) for _queue, stream in followed]
        try:
            chunks = await self._read_logs(requests)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.log_failures += 1
            log.warning("log read of %d file(s) on %s failed (read again next poll): %s", len(requests), self.key, exc)
            return {}
        self.stats.log_reads += 1
        lines: dict[asyncio.Queue[PollUpdate], list[str]] = {}
        for (queue, stream), chunk in zip(followed, chunks, strict=True):
            self.stats.log_bytes += len(chunk.data)
            lines.setdefault(queue, []).extend(stream.feed(chunk))
        return lines

    def _publish(
        self,
        ids: list[str],
        states: dict[str, JobState],
        error: str | None = None,
        lines: Mapping[asyncio.Queue[PollUpdate], list[str]] | None = None,
    ) -> None:
        now = time.time()
        for job_id in ids:
            state = states.get(job_id)
            if state is not None:
                self._seen[job_id] = now
            for queue in list(self._subscribers.get(job_id, ())):
                new = tuple(lines.get(queue, ())) if lines else ()
                if (
                    error is None
                    and not new
                    and state is not None
                    and ((sent := self._sent.get(queue)) is state or sent == state)
                    and not state.is_terminal
                    and state.tao_state is not TaoState.UNKNOWN
                ):
                    continue  # nothing new for this subscriber: it is not woken
                if state is not None:
                    self._sent[queue] = state
                    if state.accounted:  # the status query answered what a waiting marker would have asked
                        self._unconfirmed.pop(queue, None)
                queue.put_nowait(PollUpdate(job_id, state, now, error, new, self._seen.get(job_id)))


#: event loop -> cluster account key -> poller (a new loop never gets an old loop's poller).
_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, StatusPoller]] = weakref.WeakKeyDictionary()


def get_poller(
    key: str,
    fetch: StatesFetcher,
    interval: float,
    read_logs: LogReader | None = None,
    read_ends: EndsReader | None = None,
    confirm_ends: StatesFetcher | None = None,
) -> StatusPoller:
    """Return the poller of ``key`` in the running event loop (created on first use)."""
    pollers = _POLLERS.setdefault(asyncio.get_running_loop(), {})
    poller = pollers.get(key)
    if poller is None:
        poller = pollers[key] = StatusPoller(key, fetch, interval, read_logs, read_ends, confirm_ends)
    else:
        poller._read_logs = poller._read_logs or read_logs
        poller._read_ends = poller._read_ends or read_ends
        poller._confirm_ends = poller._confirm_ends or confirm_ends
    return poller


def active_pollers() -> list[StatusPoller]:
    """Every poller of the running event loop (benchmarks and tests)."""
    return list(_POLLERS.get(asyncio.get_running_loop(), {}).values())
