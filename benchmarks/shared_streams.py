"""Benchmark: Airflow 3.3's shared trigger streams vs the provider's :class:`StatusPoller`, in-process.

Issue 34, item 2. No cluster and no SSH: one event loop, a counting fake of the four hook calls the
shared poller makes (``a_get_states``, ``a_tail_many``, ``a_end_markers``, ``a_accounting_states``;
each command waits :data:`LATENCY_S` as if it went to the login node). For N = 10, 100, 1000 watched
jobs of ONE cluster account (every job RUNNING, appending one line to its ``main.out`` per interval,
its batch script leaving an end marker in one shared ends directory when it ends), three ways to
watch them run side by side, each in a fresh event loop:

- ``a poller``: the provider as it is. N :class:`SlurmJobTrigger` s driven as the triggerer drives a
  trigger (``greenback.ensure_portal()``, ``async for event in trigger.run()``, ``cleanup()``): each
  subscribes its job, its live log and its ends directory to the cluster's shared poller
  (``get_poller(...).subscribe(...)``, as ``SlurmJobTrigger.run`` does).
- ``b stream+registry``: the most faithful use of Airflow's shared streams for the same job. The same
  trigger as a :class:`~airflow.triggers.base.BaseEventTrigger` (``SlurmJobTrigger`` +
  ``BaseEventTrigger``: the triggerer routes ANY ``BaseEventTrigger`` with a non-None
  ``shared_stream_key()`` through the shared stream, a deferred task's trigger included), driven through
  Airflow's own :class:`~airflow.triggers.shared_stream.SharedStreamManager` exactly as
  ``TriggerRunner.run_trigger`` drives it (``subscribe`` -> ``filter_shared_stream`` -> ``unsubscribe``).
  ``open_shared_stream(cls, kwargs)`` is given ONE trigger's kwargs and nothing about the group's
  members, so to batch the job ids, follow every job's log from its own offset and read the ends
  directories of all members, the subscribers register themselves in a class-level registry
  (:class:`_Registry`) that the stream reads: the poller's subscription table, kept outside Airflow's
  API. Every raw event goes to every member's queue (the fast path broadcasts), each member filters.
- ``c stream only``: what the shared-stream API gives without that side channel. The key holds what
  the stream may use (connection, interval, ends directory); the stream lists every job of the
  account (``squeue --me``, one command) each interval and the ends directory of its key every marker
  interval; everything that needs the member's own state (its log offsets, accounting for its job)
  the member asks on its own.

Per mode and N: after every trigger's first answer (a triggerer (re)start: N triggers start at once;
the time to the last first answer and the commands it took are kept), a window of :data:`WINDOW`
status polls counts the hook calls and the commands (squeue, sacct, tail, find) per poll interval
and the subscriber wake-ups (queue items taken: a poller update, or a raw stream event), and times,
per poll, the event loop's CPU (``time.process_time()``) from one status command to the next and the
wall time from the status command's start to the last subscriber's handling of that poll (the poll
cycle). Then :data:`JOINERS` triggers start at spread moments of one interval (a new deferral
mid-stream; time to its first answer), and every job ends at a random moment of one interval
(seeded, the same in every mode): event latency is the time from the job's end (its marker written,
accounting and squeue updated at once) to its trigger's event, and the end phase's wake-ups are
counted per job. Each figure is the median of :data:`REPEATS` runs, the modes interleaved. A last run
per mode, at the smallest N of 100 or more, fails ONE status query: the triggers that fail with it
(a failed poll is no evidence) are counted, with ``b`` both guarded (errors become events) and as
the shared-stream contract reads ("yield forever, or raise").

Cadences are scaled down so that the whole run takes under a minute: poll interval
:data:`INTERVAL_S`, end-marker read every :data:`MARKER_INTERVAL_S` (30 s and 2 s on a real cluster).
All modes use the same ones; ratios are against ``a`` measured in the same run.

Usage: ``python benchmarks/shared_streams.py [--sizes 10,100,1000] [--interval 0.25] [--latency 0.005] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


def _isolated_airflow_home() -> None:
    """An empty Airflow home, before Airflow is imported (nothing of the machine's Airflow is read)."""
    home = tempfile.mkdtemp(prefix="tao-slurm-bench-airflow-")
    os.environ["AIRFLOW_HOME"] = home
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home}/airflow.db"
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")


_isolated_airflow_home()

import greenback  # noqa: E402
import structlog  # noqa: E402
from airflow.triggers.base import BaseEventTrigger, TriggerEvent  # noqa: E402
from airflow.triggers.shared_stream import SharedStreamManager  # noqa: E402

from airflow_provider_tao_slurm.core.commands import EndMarker  # noqa: E402
from airflow_provider_tao_slurm.core.config import ClusterSettings  # noqa: E402
from airflow_provider_tao_slurm.core.logstream import LineStream, TailChunk, TailRequest  # noqa: E402
from airflow_provider_tao_slurm.core.states import JobState, TaoState, state_from_native  # noqa: E402
from airflow_provider_tao_slurm.triggers import poller as poller_module  # noqa: E402
from airflow_provider_tao_slurm.triggers import slurm_job as trigger_module  # noqa: E402
from airflow_provider_tao_slurm.triggers.poller import ENDED_BY_ITS_SCRIPT, MAX_BACKOFF_S  # noqa: E402
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger  # noqa: E402

#: Seconds every fake command takes (the SSH round trip and the command's own time, made small).
LATENCY_S = 0.005
#: Poll interval of every trigger (30 s on a real cluster).
INTERVAL_S = 0.25
#: End-marker read interval (the poller's END_MARKER_INTERVAL_S, 2 s on a real cluster): a fifth of the interval.
MARKER_INTERVAL_S = 0.05
#: Runs per mode and N; each figure is the median over them.
REPEATS = 2
#: Status polls in the measuring window.
WINDOW = 5
#: Triggers that start mid-stream, at these fractions of one interval after a status poll.
JOINERS = (0.15, 0.5, 0.85)
ENDS_DIR = "/bench/results/ends"
CONN_ID = "bench_slurm"
MODES = ("a poller", "b stream+registry", "c stream only")


# ------------------------------------------------------------------------------------------- fake cluster


class FakeCluster:
    """One cluster account in memory, answering the hook's async calls after :attr:`latency` each.

    ``calls`` counts hook calls by name, ``commands`` the remote commands they would run (a status query
    is one ``squeue``, plus one ``sacct`` when some job is no longer in squeue).
    """

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.settings = ClusterSettings(hosts=("login",), user="bench", cluster_name=f"bench-{uuid.uuid4().hex[:8]}")
        self.running: set[str] = set()
        self.ended: dict[str, float] = {}
        self.logs: dict[str, bytearray] = {}
        self.markers: list[EndMarker] = []
        self.calls: Counter[str] = Counter()
        self.commands: Counter[str] = Counter()
        self.status_starts: list[float] = []
        self.status_cpu: list[float] = []
        self.status_event = asyncio.Event()
        self.fail_status = 0

    @staticmethod
    def log_path(job_id: str) -> str:
        return f"/bench/jobs/{job_id}/main.out"

    def start(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self.running.add(job_id)
            self.logs[self.log_path(job_id)] = bytearray()

    def end(self, job_ids: Iterable[str]) -> None:
        """The jobs' scripts exit 0: out of squeue, COMPLETED in accounting, a marker in the ends directory."""
        now, wall = time.monotonic(), time.time()
        for job_id in job_ids:
            self.running.discard(job_id)
            self.ended[job_id] = now
            self.markers.append(EndMarker(ENDS_DIR, job_id, 0, 0, wall))

    async def write_logs(self, interval: float) -> None:
        """Every running job prints one line per interval (forever; cancelled at the end)."""
        step = 0
        while True:
            step += 1
            for job_id in self.running:
                self.logs[self.log_path(job_id)] += f"epoch 1 step {step} loss {1 / step:.6f} lr 0.001\n".encode()
            await asyncio.sleep(interval)

    async def _command(self, kind: str) -> None:
        self.commands[kind] += 1
        await asyncio.sleep(self.latency)

    def _squeue_state(self, job_id: str) -> JobState:
        return state_from_native(job_id, "RUNNING", source="squeue", node_list="n1")

    def _sacct_state(self, job_id: str) -> JobState:
        if job_id in self.ended:
            return state_from_native(
                job_id, "COMPLETED", source="sacct", exit_code=0, signal=0, node_list="n1", end="2026-01-01T00:00:00"
            )
        return state_from_native(job_id, "RUNNING", source="sacct", node_list="n1")

    async def _status_started(self) -> None:
        self.status_starts.append(time.monotonic())
        self.status_cpu.append(time.process_time())
        self.status_event.set()
        await self._command("squeue")
        if self.fail_status:
            self.fail_status -= 1
            raise RuntimeError("ssh: connection to the login node lost (injected)")


class FakeHook:
    """The hook's four async calls the shared poller makes, plus ``squeue --me`` for the stream-only mode."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    async def a_settings(self) -> ClusterSettings:
        return self.cluster.settings

    async def a_get_states(self, job_ids: Iterable[str], *, since: str = "") -> dict[str, JobState]:
        c = self.cluster
        c.calls["a_get_states"] += 1
        ids = list(dict.fromkeys(job_ids))
        await c._status_started()
        states = {job_id: c._squeue_state(job_id) for job_id in ids if job_id in c.running}
        rest = [job_id for job_id in ids if job_id not in c.running]
        if rest:
            await c._command("sacct")
            states.update({job_id: c._sacct_state(job_id) for job_id in rest if job_id in c.ended})
        return states

    async def a_user_states(self) -> dict[str, JobState]:
        """``squeue --me``: every job of the account still known to the scheduler (no job ids asked)."""
        c = self.cluster
        c.calls["a_user_states"] += 1
        await c._status_started()
        return {job_id: c._squeue_state(job_id) for job_id in c.running}

    async def a_accounting_states(self, job_ids: Iterable[str], *, since: str = "") -> dict[str, JobState]:
        c = self.cluster
        c.calls["a_accounting_states"] += 1
        await c._command("sacct")
        return {job_id: c._sacct_state(job_id) for job_id in job_ids if job_id in c.ended or job_id in c.running}

    async def a_tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk[bytes]]:
        c = self.cluster
        c.calls["a_tail_many"] += 1
        await c._command("tail")
        chunks: list[TailChunk[bytes]] = []
        for request in requests:
            data = c.logs.get(request.path)
            if data is None:
                chunks.append(TailChunk(missing=True, data=b""))
                continue
            offset = request.offset or 0
            if offset > len(data):
                offset = 0
            new = len(data) - offset
            skipped = max(0, new - request.max_bytes)
            chunks.append(TailChunk(offset=offset, skipped=skipped, data=bytes(data[offset + skipped :])))
        return chunks

    async def a_end_markers(self, since: Mapping[str, float]) -> list[EndMarker]:
        c = self.cluster
        c.calls["a_end_markers"] += 1
        await c._command("find")
        return [m for m in c.markers if m.directory in since and m.mtime > int(since[m.directory])]


# ------------------------------------------------------------------------------------------ instrumentation


@dataclass
class Probe:
    """What the triggers did, seen from outside: first answers, subscriber wake-ups, events, failures."""

    first_state: dict[str, float] = field(default_factory=dict)
    observes: int = 0
    raw_events: int = 0
    recording: bool = False
    handled_at: list[float] = field(default_factory=list)
    events: dict[str, float] = field(default_factory=dict)
    failed: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)


PROBE = Probe()
_REAL_OBSERVE = trigger_module.observe


def _observed(watch: Any, rules: Any, **kwargs: Any) -> Any:
    """``lifecycle.watch.observe`` as every mode calls it, recording when each job got its first state."""
    now = time.monotonic()
    PROBE.observes += 1
    if PROBE.recording:
        PROBE.handled_at.append(now)
    if kwargs.get("state") is not None and watch.slurm_job_id not in PROBE.first_state:
        PROBE.first_state[watch.slurm_job_id] = now
        PROBE.progress.set()
    return _REAL_OBSERVE(watch, rules, **kwargs)


trigger_module.observe = _observed
HOOK: FakeHook | None = None


def _bench_hook(self: SlurmJobTrigger) -> FakeHook:
    assert HOOK is not None
    return HOOK


SlurmJobTrigger._hook = _bench_hook  # type: ignore[method-assign]


def _changed(sent: JobState | None, state: JobState | None, lines: Sequence[str]) -> bool:
    """The poller's rule for waking a subscriber: new lines, a new state, a terminal or unknown one."""
    return bool(lines or state is None or sent != state or state.is_terminal or state.tao_state is TaoState.UNKNOWN)


# ------------------------------------------------------------------------- b: shared stream + side registry


@dataclass
class _Member:
    job_id: str
    interval: float
    streams: tuple[LineStream, ...]
    end_dir: str | None


@dataclass
class _Registry:
    """The subscription table the stream needs and Airflow does not give it: who is in the group."""

    members: dict[int, _Member] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: int = 0

    def add(self, member: _Member) -> int:
        self.tokens += 1
        self.members[self.tokens] = member
        self.changed.set()
        return self.tokens


REGISTRIES: dict[Hashable, _Registry] = {}


@dataclass(frozen=True)
class Snapshot:
    """One raw event of the registry stream: states of the jobs asked, new lines per member."""

    polled_at: float
    asked: frozenset[str]
    states: Mapping[str, JobState]
    lines: Mapping[int, tuple[str, ...]]
    last_seen: Mapping[str, float]
    error: str | None = None
    to: frozenset[int] | None = None


class RegistryStreamTrigger(SlurmJobTrigger, BaseEventTrigger):
    """``SlurmJobTrigger`` on a shared stream whose members register their job, logs and ends directory."""

    #: Errors become events (``False``: the stream raises, as the shared-stream contract reads).
    GUARDED: ClassVar[bool] = True

    def shared_stream_key(self) -> Hashable | None:
        return (type(self).__name__, self.slurm_conn_id)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        hook = cls(**kwargs)._hook()
        registry = REGISTRIES.setdefault((cls.__name__, kwargs["slurm_conn_id"]), _Registry())
        failing = 0.0
        next_status = next_ends = time.monotonic()
        polled: set[str] = set()
        seen: dict[str, float] = {}
        ends_since: dict[str, float] = {}
        next_run: dict[int, int] = {}
        unconfirmed: dict[int, tuple[EndMarker, float]] = {}
        while True:
            registry.changed.clear()
            if not registry.members:  # nobody registered yet (or any more): nothing to ask about
                await registry.changed.wait()
                continue
            members = dict(registry.members)
            ids = {m.job_id for m in members.values()}
            interval = min((m.interval for m in members.values()), default=float(kwargs["poll_interval"]))
            if ids and (time.monotonic() >= next_status or (not failing and ids - polled)):
                polled = ids
                snapshot = await cls._status(hook, members, sorted(ids), seen)
                failing = min(max(failing, interval) * 2, MAX_BACKOFF_S) if snapshot.error else 0.0
                next_status = time.monotonic() + (failing or interval)
                yield snapshot
            dirs = sorted({m.end_dir for m in members.values() if m.end_dir})
            if dirs and time.monotonic() >= next_ends:
                next_ends = time.monotonic() + MARKER_INTERVAL_S
                markers = await cls._guard(hook.a_end_markers({d: ends_since.get(d, 0.0) for d in dirs}), [])
                for marker in markers:
                    ends_since[marker.directory] = max(ends_since.get(marker.directory, 0.0), marker.mtime - 60)
                    for token, m in members.items():
                        if (
                            m.job_id == marker.slurm_job_id
                            and m.end_dir == marker.directory
                            and marker.restart >= next_run.get(token, 0)
                            and token not in unconfirmed
                        ):
                            unconfirmed[token] = (marker, time.monotonic())
            for token in [t for t in unconfirmed if t not in registry.members]:
                del unconfirmed[token]
            if unconfirmed:
                confirmed = await cls._confirm(hook, members, unconfirmed, next_run, seen)
                if confirmed is not None:
                    yield confirmed
            deadline = min(next_status, next_ends) if dirs else next_status
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    while True:  # early poll for a job that was not in the last one (not while failing)
                        await registry.changed.wait()
                        if not failing and {m.job_id for m in registry.members.values()} - polled:
                            break
                        registry.changed.clear()

    @classmethod
    async def _guard(cls, call: Any, failed: Any) -> Any:
        """Await ``call``; a failure is ``failed`` (GUARDED) or raised, ending the group."""
        try:
            return await call
        except Exception:
            if not cls.GUARDED:
                raise
            return failed

    @classmethod
    async def _status(
        cls, hook: FakeHook, members: dict[int, _Member], ids: list[str], seen: dict[str, float]
    ) -> Snapshot:
        polled_at = time.time()
        try:
            states = await hook.a_get_states(ids)
        except Exception as exc:
            if not cls.GUARDED:
                raise
            return Snapshot(polled_at, frozenset(ids), {}, {}, dict(seen), error=str(exc))
        for job_id in states:
            seen[job_id] = polled_at
        lines = await cls._lines(hook, members, states)
        return Snapshot(polled_at, frozenset(ids), states, lines, dict(seen))

    @classmethod
    async def _lines(
        cls, hook: FakeHook, members: Mapping[int, _Member], states: Mapping[str, JobState]
    ) -> dict[int, tuple[str, ...]]:
        """One batched read of every started member's streams, each from its own offset."""
        followed = [
            (token, stream)
            for token, m in members.items()
            if (state := states.get(m.job_id)) is not None and state.tao_state is not TaoState.PENDING
            for stream in m.streams
        ]
        if not followed:
            return {}
        share = max(poller_module.MIN_LOG_BYTES_PER_FILE, poller_module.MAX_LOG_BYTES_PER_POLL // len(followed))
        chunks = await cls._guard(hook.a_tail_many([stream.request(share) for _t, stream in followed]), None)
        if chunks is None:
            return {}
        lines: dict[int, list[str]] = {}
        for (token, stream), chunk in zip(followed, chunks, strict=True):
            lines.setdefault(token, []).extend(stream.feed(chunk))
        return {token: tuple(found) for token, found in lines.items()}

    @classmethod
    async def _confirm(
        cls,
        hook: FakeHook,
        members: Mapping[int, _Member],
        unconfirmed: dict[int, tuple[EndMarker, float]],
        next_run: dict[int, int],
        seen: dict[str, float],
    ) -> Snapshot | None:
        """One ``sacct`` for every waiting marker; the members whose end accounting shows get one snapshot."""
        ids = sorted({marker.slurm_job_id for marker, _found in unconfirmed.values()})
        states = await cls._guard(hook.a_accounting_states(ids), {})
        now = time.monotonic()
        confirmed: dict[int, JobState] = {}
        for token, (marker, found) in list(unconfirmed.items()):
            state = states.get(marker.slurm_job_id)
            ended = state is not None and state.accounted
            if not ended and now - found < poller_module.END_MARKER_CONFIRM_S:
                continue
            del unconfirmed[token]
            next_run[token] = marker.restart + 1
            if ended and state is not None and state.native in ENDED_BY_ITS_SCRIPT:
                confirmed[token] = state
        if not confirmed:
            return None
        polled_at = time.time()
        by_job = {state.job_id: state for state in confirmed.values()}
        lines = await cls._lines(hook, {t: members[t] for t in confirmed if t in members}, by_job)
        for job_id in by_job:
            seen[job_id] = polled_at
        return Snapshot(polled_at, frozenset(by_job), by_job, lines, dict(seen), to=frozenset(confirmed))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        registry = REGISTRIES.setdefault((type(self).__name__, self.slurm_conn_id), _Registry())
        streams = await self._line_streams()
        token = registry.add(_Member(self.slurm_job_id, self.poll_interval, tuple(streams), self.end_marker_dir))
        watch, rules = self._watch()
        sent: JobState | None = None
        try:
            async for snapshot in shared_stream:
                PROBE.raw_events += 1
                if self.slurm_job_id not in snapshot.asked or (snapshot.to is not None and token not in snapshot.to):
                    continue
                state = snapshot.states.get(self.slurm_job_id)
                lines = snapshot.lines.get(token, ())
                if snapshot.error is None and not _changed(sent, state, lines):
                    continue
                sent = state if state is not None else sent
                last_seen = snapshot.last_seen.get(self.slurm_job_id)
                watch, event = self._take(watch, rules, snapshot.polled_at, state, lines, snapshot.error, last_seen)
                if event is not None:
                    yield event
                    return
        finally:
            registry.members.pop(token, None)

    # -- what SlurmJobTrigger.run does per update, shared by b and c

    def _watch(self) -> tuple[Any, Any]:
        watch = trigger_module.Watch.start(
            self.slurm_job_id,
            self.job_name,
            submitted_at=self.submitted_at,
            last_state=self.last_state,
            last_reason=self.last_reason,
        )
        return watch, trigger_module.WatchRules(self.not_found_grace, self.unrecognised_grace)

    def _take(
        self,
        watch: Any,
        rules: Any,
        polled_at: float,
        state: JobState | None,
        lines: Sequence[str],
        error: str | None,
        last_seen: float | None,
    ) -> tuple[Any, TriggerEvent | None]:
        """What ``SlurmJobTrigger.run`` does with one update: log the lines, observe, the event at the end."""
        for line in lines:
            self.log.info("%s", line)
        step = trigger_module.observe(watch, rules, polled_at=polled_at, state=state, error=error, last_seen=last_seen)
        for note in step.notes:
            self.log.log(note.level, "%s", note.message)
        if step.event is None:
            return step.watch, None
        event = trigger_module.replace(step.event, log_offsets=self._live.shown_offsets())
        return step.watch, TriggerEvent(event.to_dict())


class RaisingRegistryStreamTrigger(RegistryStreamTrigger):
    """``b`` as the shared-stream contract reads: a failed command raises out of ``open_shared_stream``."""

    GUARDED: ClassVar[bool] = False


# ------------------------------------------------------------------------------- c: shared stream only


class StreamOnlyTrigger(RegistryStreamTrigger):
    """``SlurmJobTrigger`` on a shared stream that knows only its key: ``squeue --me`` and one ends directory."""

    def shared_stream_key(self) -> Hashable | None:
        return (type(self).__name__, self.slurm_conn_id, self.poll_interval, self.end_marker_dir)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        hook = cls(**kwargs)._hook()
        interval, ends = float(kwargs["poll_interval"]), kwargs["end_marker_dir"]
        failing = 0.0
        next_status = next_ends = time.monotonic()
        since = 0.0
        while True:
            if time.monotonic() >= next_status:
                polled_at = time.time()
                try:
                    states = await hook.a_user_states()
                except Exception as exc:
                    failing = min(max(failing, interval) * 2, MAX_BACKOFF_S)
                    next_status = time.monotonic() + failing
                    yield ("error", polled_at, str(exc))
                else:
                    failing = 0.0
                    next_status = time.monotonic() + interval
                    yield ("states", polled_at, states)
            if ends and time.monotonic() >= next_ends:
                next_ends = time.monotonic() + MARKER_INTERVAL_S
                with contextlib.suppress(Exception):
                    markers = await hook.a_end_markers({ends: since})
                    if markers:
                        since = max(since, max(m.mtime for m in markers) - 60)
                        yield ("markers", time.time(), markers)
            deadline = min(next_status, next_ends) if ends else next_status
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        await self._line_streams()
        watch, rules = self._watch()
        sent: JobState | None = None
        seen: float | None = None
        next_run = 0
        async for kind, polled_at, payload in shared_stream:
            PROBE.raw_events += 1
            error: str | None = None
            if kind == "error":
                state, error, lines = None, payload, []
            elif kind == "states":
                state = payload.get(self.slurm_job_id)
                if state is None:  # not in squeue: this member asks accounting about its job on its own
                    with contextlib.suppress(Exception):
                        state = (await hook.a_accounting_states([self.slurm_job_id])).get(self.slurm_job_id)
                lines = await self._own_lines(hook, state)
            else:
                mine = [
                    m
                    for m in payload
                    if m.slurm_job_id == self.slurm_job_id
                    and m.directory == self.end_marker_dir
                    and m.restart >= next_run
                ]
                if not mine:
                    continue
                state = None
                with contextlib.suppress(Exception):
                    state = (await hook.a_accounting_states([self.slurm_job_id])).get(self.slurm_job_id)
                if state is None or not state.accounted:
                    continue  # asked again when the marker is listed again
                next_run = mine[0].restart + 1
                if state.native not in ENDED_BY_ITS_SCRIPT:
                    continue
                lines = await self._own_lines(hook, state)
            if state is not None:
                seen = polled_at
            if error is None and not _changed(sent, state, lines):
                continue
            sent = state if state is not None else sent
            watch, event = self._take(watch, rules, polled_at, state, lines, error, seen)
            if event is not None:
                yield event
                return

    async def _own_lines(self, hook: FakeHook, state: JobState | None) -> list[str]:
        """This member's own read of its own streams (the stream does not know them): one command."""
        streams = self._live.streams
        if not streams or state is None or state.tao_state is TaoState.PENDING:
            return []
        try:
            chunks = await hook.a_tail_many([stream.request() for stream in streams])
        except Exception:
            return []
        return [line for stream, chunk in zip(streams, chunks, strict=True) for line in stream.feed(chunk)]


# ------------------------------------------------------------------------------------------------- driver


TRIGGERS: dict[str, type[SlurmJobTrigger]] = {
    "a poller": SlurmJobTrigger,
    "b stream+registry": RegistryStreamTrigger,
    "b stream+registry, raising": RaisingRegistryStreamTrigger,
    "c stream only": StreamOnlyTrigger,
}


def _trigger(mode: str, job_id: str, interval: float) -> SlurmJobTrigger:
    """A trigger as the sensor defers with it (live ``main.out``, ends directory), rebuilt from serialize()."""
    made = SlurmJobTrigger(
        CONN_ID,
        job_id,
        f"bench-{job_id}",
        poll_interval=interval,
        log_streams=[{"label": "main.out", "path": FakeCluster.log_path(job_id), "cursor_path": None}],
        end_marker_dir=ENDS_DIR,
    )
    return TRIGGERS[mode](**made.serialize()[1])


async def _run_trigger(manager: SharedStreamManager, trigger_id: int, trigger: SlurmJobTrigger) -> None:
    """``TriggerRunner.run_trigger`` reduced to what costs time: portal, shared stream or run(), cleanup."""
    await greenback.ensure_portal()
    key = trigger.shared_stream_key() if isinstance(trigger, BaseEventTrigger) else None
    try:
        if key is not None and isinstance(trigger, BaseEventTrigger):
            events = trigger.filter_shared_stream(manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key))
        else:
            events = trigger.run()
        async for _event in events:
            PROBE.events[trigger.slurm_job_id] = time.monotonic()
            PROBE.progress.set()
    except asyncio.CancelledError:
        raise
    except Exception:
        PROBE.failed += 1
        PROBE.progress.set()
    finally:
        if key is not None:
            await manager.unsubscribe(trigger_id, key)
        await trigger.cleanup()


async def _wait_for(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        PROBE.progress.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(PROBE.progress.wait(), timeout=left)


async def _next_status(cluster: FakeCluster) -> float:
    cluster.status_event.clear()
    await asyncio.wait_for(cluster.status_event.wait(), timeout=30)
    return cluster.status_starts[-1]


def _quiet_manager() -> SharedStreamManager:
    quiet = structlog.wrap_logger(None, wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    return SharedStreamManager(log=quiet)


def _fresh(n: int, latency: float) -> tuple[FakeCluster, list[str]]:
    """A new fake cluster, hook, probe and registry for one measurement; the ids of its N jobs."""
    global HOOK, PROBE
    PROBE = Probe()
    REGISTRIES.clear()
    cluster = FakeCluster(latency)
    HOOK = FakeHook(cluster)
    return cluster, [str(100000 + i) for i in range(n)]


async def measure(mode: str, n: int, interval: float, latency: float) -> dict[str, Any]:
    """Run N triggers of ``mode`` through a restart, a window, joiners and their ends; the raw figures."""
    cluster, jobs = _fresh(n, latency)
    joiners = [str(900000 + i) for i in range(len(JOINERS))]
    cluster.start(jobs + joiners)
    writer = asyncio.create_task(cluster.write_logs(interval))
    manager = _quiet_manager()
    ids = iter(range(1, 1 << 30))
    tasks: list[asyncio.Task[None]] = []
    try:
        # A triggerer (re)start: N triggers start at once.
        t0 = time.monotonic()
        tasks += [asyncio.create_task(_run_trigger(manager, next(ids), _trigger(mode, j, interval))) for j in jobs]
        await _wait_for("every first answer", lambda: all(j in PROBE.first_state for j in jobs), 60)
        restart_s = max(PROBE.first_state[j] for j in jobs) - t0
        restart_commands = sum(cluster.commands.values())

        # The window: WINDOW status polls, all jobs running and printing.
        start = await _next_status(cluster)
        first = len(cluster.status_starts) - 1
        calls0, commands0, raw0, obs0 = (
            Counter(cluster.calls),
            Counter(cluster.commands),
            PROBE.raw_events,
            PROBE.observes,
        )
        PROBE.recording, PROBE.handled_at = True, []
        starts = [start]
        for _ in range(WINDOW):
            starts.append(await _next_status(cluster))
        PROBE.recording = False
        marks = cluster.status_cpu[first:]
        cpu = [end - begin for begin, end in itertools.pairwise(marks)]
        calls = sum((cluster.calls - calls0).values())
        commands = cluster.commands - commands0
        cycles = []
        for begin, end in itertools.pairwise(starts):
            handled = [t for t in PROBE.handled_at if begin <= t < end]
            cycles.append(max(handled) - begin if handled else float("nan"))
        wakeups = PROBE.observes - obs0 if mode == "a poller" else PROBE.raw_events - raw0

        # New deferrals mid-stream.
        begin = await _next_status(cluster)
        joined: dict[str, float] = {}

        async def join(job_id: str, after: float) -> None:
            await asyncio.sleep(max(0.0, begin + after * interval - time.monotonic()))
            joined[job_id] = time.monotonic()
            tasks.append(asyncio.create_task(_run_trigger(manager, next(ids), _trigger(mode, job_id, interval))))

        await asyncio.gather(*(join(j, f) for j, f in zip(joiners, JOINERS, strict=True)))
        await _wait_for("the joiners' first answers", lambda: all(j in PROBE.first_state for j in joiners), 30)
        join_s = [PROBE.first_state[j] - joined[j] for j in joiners]

        # Every job ends, at a random moment of one interval (seeded: the same moments in every mode).
        everyone = jobs + joiners
        rng = random.Random(n)
        ends = sorted((rng.uniform(0, interval), job_id) for job_id in everyone)
        end0, raw0, obs0 = time.monotonic(), PROBE.raw_events, PROBE.observes
        while ends:
            await asyncio.sleep(max(0.0, end0 + ends[0][0] - time.monotonic()))
            due = [job_id for at, job_id in ends if end0 + at <= time.monotonic()]
            cluster.end(due)
            ends = ends[len(due) :]
        await _wait_for("every event", lambda: len(PROBE.events) + PROBE.failed >= len(everyone), 60)
        latencies = sorted(PROBE.events[j] - cluster.ended[j] for j in everyone if j in PROBE.events)
        end_wakeups = PROBE.observes - obs0 if mode == "a poller" else PROBE.raw_events - raw0
    finally:
        writer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(writer, *tasks, return_exceptions=True)
        await manager.stop_all()
    return {
        "mode": mode,
        "n": n,
        "calls": calls / WINDOW,
        "commands": sum(commands.values()) / WINDOW,
        "command_mix": {k: v / WINDOW for k, v in sorted(commands.items())},
        "cpu_ms": 1000 * statistics.median(cpu),
        "wakeups": wakeups / WINDOW,
        "cycle_ms": 1000 * statistics.median(cycles),
        "latency_p50_ms": 1000 * _percentile(latencies, 50),
        "latency_p95_ms": 1000 * _percentile(latencies, 95),
        "end_wakeups": end_wakeups / len(everyone),
        "restart_ms": 1000 * restart_s,
        "restart_commands": restart_commands,
        "join_ms": 1000 * statistics.median(join_s),
        "failed": PROBE.failed,
    }


async def measure_fault(mode: str, n: int, interval: float, latency: float) -> dict[str, Any]:
    """N triggers of ``mode``; ONE status query fails; how many triggers failed with it, three intervals later."""
    cluster, jobs = _fresh(n, latency)
    cluster.start(jobs)
    manager = _quiet_manager()
    tasks = [asyncio.create_task(_run_trigger(manager, i, _trigger(mode, j, interval))) for i, j in enumerate(jobs)]
    try:
        await _wait_for("every first answer", lambda: all(j in PROBE.first_state for j in jobs), 60)
        await _next_status(cluster)
        cluster.fail_status = 1
        await asyncio.sleep(3 * interval)
        alive = sum(not task.done() for task in tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.stop_all()
    return {"mode": mode, "n": n, "failed": PROBE.failed, "alive": alive}


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the repeated runs of one mode and N."""
    merged = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and key != "n":
            merged[key] = statistics.median(run[key] for run in runs)
    merged["failed"] = sum(run["failed"] for run in runs)
    return merged


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5))) - 1]


# ------------------------------------------------------------------------------------------------- output

COLUMNS = (
    ("calls", "hook calls / interval", "{:.1f}"),
    ("commands", "commands / interval / cluster", "{:.1f}"),
    ("wakeups", "subscriber wake-ups / interval", "{:.0f}"),
    ("cpu_ms", "loop CPU ms / interval (p50)", "{:.1f}"),
    ("cycle_ms", "poll cycle wall ms (p50)", "{:.1f}"),
    ("latency_p50_ms", "end -> event ms p50", "{:.0f}"),
    ("latency_p95_ms", "end -> event ms p95", "{:.0f}"),
    ("end_wakeups", "wake-ups per job end", "{:.1f}"),
    ("restart_ms", "restart: all first answers ms", "{:.0f}"),
    ("restart_commands", "restart: commands", "{:.0f}"),
    ("join_ms", "new deferral: first answer ms (p50)", "{:.0f}"),
)


def print_tables(results: list[dict[str, Any]], faults: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\n== Shared trigger streams vs StatusPoller, in-process ({time.strftime('%Y-%m-%d %H:%M %Z')}; "
        f"interval {args.interval} s, marker read {MARKER_INTERVAL_S} s, {args.latency * 1000:.0f} ms per command, "
        f"one cluster account, window {WINDOW} polls, median of {args.repeats} runs)\n"
    )
    print("| mode | N | " + " | ".join(title for _k, title, _f in COLUMNS) + " |")
    print("|---|---:|" + "---:|" * len(COLUMNS))
    for r in results:
        cells = [fmt.format(r[key]) for key, _t, fmt in COLUMNS]
        print(f"| {r['mode']} | {r['n']} | " + " | ".join(cells) + " |")
    print("\nRatios against a (same run): (b)/(a) and (c)/(a)\n")
    print("| ratio | N | " + " | ".join(title for _k, title, _f in COLUMNS) + " |")
    print("|---|---:|" + "---:|" * len(COLUMNS))
    base = {r["n"]: r for r in results if r["mode"] == "a poller"}
    for r in results:
        if r["mode"] == "a poller":
            continue
        a = base[r["n"]]
        cells = [f"{r[key] / a[key]:.2f}" if a[key] else "-" for key, _t, _f in COLUMNS]
        print(f"| {r['mode'][0]}/a | {r['n']} | " + " | ".join(cells) + " |")
    print("\nCommand mix per interval (steady window)\n")
    for r in results:
        mix = ", ".join(f"{k} {v:.1f}" for k, v in r["command_mix"].items())
        print(f"- {r['mode']}, N={r['n']}: {mix}")
    if faults:
        print("\nOne failed status query (a failed poll is no evidence): triggers failed / still waiting\n")
        print("| mode | N | failed | still waiting |")
        print("|---|---:|---:|---:|")
        for f in faults:
            print(f"| {f['mode']} | {f['n']} | {f['failed']} | {f['alive']} |")
    sys.stdout.flush()


def main() -> None:
    global INTERVAL_S, MARKER_INTERVAL_S, LATENCY_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--interval", type=float, default=INTERVAL_S)
    parser.add_argument("--latency", type=float, default=LATENCY_S)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    INTERVAL_S, LATENCY_S = args.interval, args.latency
    MARKER_INTERVAL_S = round(args.interval / 5, 3)
    # The poller's cadences, scaled like the benchmark's (module constants read at each use).
    poller_module.END_MARKER_INTERVAL_S = MARKER_INTERVAL_S
    poller_module.END_MARKER_RECHECK_S = MARKER_INTERVAL_S / 4
    poller_module.END_MARKER_BATCH_S = MARKER_INTERVAL_S * 0.3
    # Figures, not log lines (every mode logs the same lines, through Airflow's structlog or logging).
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.monotonic()
    results = []
    for n in sizes:
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for _repeat in range(args.repeats):  # the modes interleaved, so a busy moment of the machine hits all
            for mode in MODES:
                runs[mode].append(asyncio.run(measure(mode, n, args.interval, args.latency)))
        results += [_median_run(runs[mode]) for mode in MODES]
        print(f"  measured N={n} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    fault_n = min((n for n in sizes if n >= 100), default=max(sizes))
    faults = [
        asyncio.run(measure_fault(mode, fault_n, args.interval, args.latency))
        for mode in ("a poller", "b stream+registry", "b stream+registry, raising", "c stream only")
    ]
    print_tables(results, faults, args)
    print(f"\n(total {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
