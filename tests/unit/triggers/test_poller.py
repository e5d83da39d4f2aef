"""The shared status poller, driven by a fake async fetch function (no SSH, no SLURM); its log reads run real ``sh``."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import subprocess
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from airflow_provider_tao_slurm.core.commands import EndMarker
from airflow_provider_tao_slurm.core.logstream import LineStream, TailChunk, TailRequest, parse_tail_output, tail_script
from airflow_provider_tao_slurm.core.states import JobState, state_from_native
from airflow_provider_tao_slurm.exceptions import StatusQueryError
from airflow_provider_tao_slurm.triggers import poller as poller_module
from airflow_provider_tao_slurm.triggers.poller import (
    FIRST_ANSWER_GATHER_S,
    PollUpdate,
    StatusPoller,
    active_pollers,
    get_poller,
)

T = TypeVar("T")
INTERVAL = 0.05


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))


def running(job_id: str) -> JobState:
    return state_from_native(job_id, "RUNNING", source="squeue")


@dataclass
class FakeFetch:
    """Records every call (ids, loop time, calling task); fails or blocks when told to."""

    failures: int = 0
    block: asyncio.Event | None = None
    calls: list[tuple[list[str], float, asyncio.Task[Any] | None]] = field(default_factory=list)
    cancelled: int = 0

    async def __call__(self, ids: list[str]) -> dict[str, JobState]:
        self.calls.append((list(ids), time.monotonic(), asyncio.current_task()))
        if self.block is not None:
            try:
                await self.block.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.failures:
            self.failures -= 1
            raise OSError("connection reset by peer")
        return {job_id: running(job_id) for job_id in ids}

    def gaps(self) -> list[float]:
        times = [at for _, at, _ in self.calls]
        return [b - a for a, b in itertools.pairwise(times)]


def test_many_subscribers_share_one_fetch_per_interval() -> None:
    fetch = FakeFetch()

    async def scenario() -> tuple[list[list[PollUpdate]], int]:
        poller = StatusPoller("u@c", fetch, 30)
        queues = [poller.subscribe(job_id, INTERVAL) for job_id in ("1", "2", "3", "3", "4")]
        await asyncio.sleep(INTERVAL * 6.5)
        polls = poller.stats.polls
        for job_id, queue in zip(("1", "2", "3", "3", "4"), queues, strict=True):
            poller.unsubscribe(job_id, queue)
        return [[queue.get_nowait() for _ in range(queue.qsize())] for queue in queues], polls

    updates, polls = run(scenario())

    assert all(sorted(ids) == ["1", "2", "3", "4"] for ids, _, _ in fetch.calls)
    assert 4 <= len(fetch.calls) <= 8
    assert polls == len(fetch.calls)
    assert min(fetch.gaps()) >= INTERVAL * 0.9
    for job_id, got in zip(("1", "2", "3", "3", "4"), updates, strict=True):
        assert len(got) == 1  # the first answer; the same state again wakes nobody
        assert {u.job_id for u in got} == {job_id}
        assert all(u.state == running(job_id) and u.error is None for u in got)


@dataclass
class ScriptedFetch:
    """Answers each poll from a script: one ``{job_id: native state, JobState or None}`` per poll, the last repeated."""

    script: list[dict[str, str | JobState | None]]
    calls: int = 0

    async def __call__(self, ids: list[str]) -> dict[str, JobState]:
        answer = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return {
            job_id: native if isinstance(native, JobState) else state_from_native(job_id, native, source="squeue")
            for job_id, native in answer.items()
            if native is not None and job_id in ids
        }


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        pytest.param(
            [{"1": "PENDING"}, {"1": "PENDING"}, {"1": "RUNNING"}, {"1": "RUNNING"}],
            ["PENDING", "RUNNING"],
            id="only-changes-wake",
        ),
        pytest.param(
            [{"1": "RUNNING"}, {"1": "RUNNING"}, {"1": "COMPLETED"}],
            ["RUNNING", "COMPLETED", "COMPLETED"],
            id="terminal-repeats",
        ),
        pytest.param(
            [{"1": "RUNNING"}, {"1": "RUNNING"}, {"1": None}],
            ["RUNNING", None, None],
            id="missing-repeats",
        ),
        pytest.param(
            [{"1": "RUNNING"}, {"1": "WEIRD"}, {"1": "WEIRD"}],
            ["RUNNING", "WEIRD", "WEIRD"],
            id="unrecognised-repeats",
        ),
    ],
)
def test_a_subscriber_is_woken_only_when_a_poll_says_something_new(
    script: list[dict[str, str | None]], expected: list[str | None]
) -> None:
    """Quiet polls (the same live state again) send nothing; a missing job carries when it was last seen."""
    fetch = ScriptedFetch(script)

    async def scenario() -> tuple[list[PollUpdate], list[float]]:
        poller = StatusPoller("u@c", fetch, INTERVAL)
        queue = poller.subscribe("1", INTERVAL)
        got = [await queue.get() for _ in expected]
        polls_at = [u.polled_at for u in got]
        poller.unsubscribe("1", queue)
        return got, polls_at

    got, _ = run(scenario())

    assert [u.state.native if u.state else None for u in got] == expected
    seen = [u.polled_at for u in got if u.state is not None]
    for update in got:
        if update.state is None:  # last answered at the last poll that knew it, which may not have been sent
            assert update.last_seen is not None
            assert update.last_seen >= max(seen)
            assert update.last_seen < update.polled_at


def test_failed_fetch_is_retried_with_backoff_and_subscribers_keep_waiting() -> None:
    fetch = FakeFetch(failures=2)

    async def scenario() -> list[PollUpdate]:
        poller = StatusPoller("u@c", fetch, INTERVAL)
        queue = poller.subscribe("7", INTERVAL)
        got = [await queue.get() for _ in range(3)]
        poller.unsubscribe("7", queue)
        assert poller.stats.failures == 2
        return got

    first, second, third = run(scenario())

    assert (first.state, second.state) == (None, None)
    assert "connection reset by peer" in (first.error or "")
    assert second.error == first.error
    assert third.state == running("7")
    assert third.error is None
    backoff1, backoff2 = fetch.gaps()[:2]
    assert backoff1 >= 2 * INTERVAL * 0.9
    assert backoff2 >= 4 * INTERVAL * 0.9


def test_backoff_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poller_module, "MAX_BACKOFF_S", 0.12)
    fetch = FakeFetch(failures=4)

    async def scenario() -> None:
        poller = StatusPoller("u@c", fetch, INTERVAL)
        queue = poller.subscribe("7", INTERVAL)
        for _ in range(5):
            await queue.get()
        poller.unsubscribe("7", queue)

    run(scenario())
    assert max(fetch.gaps()) < 0.12 + INTERVAL


def test_last_unsubscribe_stops_the_loop_and_nothing_is_fetched_after() -> None:
    fetch = FakeFetch()

    async def scenario() -> tuple[int, bool, int]:
        poller = StatusPoller("u@c", fetch, INTERVAL)
        first = poller.subscribe("1", INTERVAL)
        second = poller.subscribe("2", INTERVAL)
        await first.get()
        poller.unsubscribe("1", first)
        assert poller.running
        poller.unsubscribe("2", second)
        stopped_at = len(fetch.calls)
        await asyncio.sleep(INTERVAL * 6)
        loops = [task for task in asyncio.all_tasks() if task.get_name().startswith("tao-slurm-poller")]
        return len(fetch.calls) - stopped_at, poller.running, len(loops)

    assert run(scenario()) == (0, False, 0)


def test_unsubscribe_during_a_fetch_cancels_it_and_nothing_is_fetched_after() -> None:
    fetch = FakeFetch(block=None)

    async def scenario() -> tuple[int, int]:
        fetch.block = asyncio.Event()
        poller = StatusPoller("u@c", fetch, INTERVAL)
        queue = poller.subscribe("1", INTERVAL)
        while not fetch.calls:
            await asyncio.sleep(0)
        poller.unsubscribe("1", queue)
        await asyncio.sleep(INTERVAL * 6)
        return len(fetch.calls), fetch.cancelled

    assert run(scenario()) == (1, 1)


@pytest.mark.parametrize("yields", range(6), ids=lambda n: f"yields{n}")
def test_a_loop_whose_cancel_got_lost_never_polls_next_to_its_successor(yields: int) -> None:
    # All subscribers leave and a new one arrives at once, while the old loop's sleep is just ending:
    # Python 3.11's asyncio.wait_for could swallow that cancellation and leave two loops polling.
    fetch = FakeFetch()

    async def scenario() -> set[asyncio.Task[Any] | None]:
        poller = StatusPoller("u@c", fetch, INTERVAL)
        one = poller.subscribe("1", INTERVAL)
        await one.get()
        two = poller.subscribe("2", INTERVAL)
        for _ in range(yields):
            await asyncio.sleep(0)
        poller.unsubscribe("1", one)
        poller.unsubscribe("2", two)
        three = poller.subscribe("3", INTERVAL)
        await asyncio.sleep(INTERVAL * 5)
        poller.unsubscribe("3", three)
        return {task for ids, _, task in fetch.calls if ids == ["3"]}

    assert len(run(scenario())) == 1


def test_new_job_is_polled_at_once_not_after_the_interval() -> None:
    fetch = FakeFetch()

    async def scenario() -> float:
        poller = StatusPoller("u@c", fetch, 30)
        first = poller.subscribe("1", 30)
        await first.get()
        started = time.monotonic()
        second = poller.subscribe("2", 30)
        await second.get()
        waited = time.monotonic() - started
        poller.unsubscribe("1", first)
        poller.unsubscribe("2", second)
        return waited

    assert run(scenario()) < 1
    assert [sorted(ids) for ids, _, _ in fetch.calls] == [["1"], ["2"]]  # the watched job waits for the interval


def test_jobs_subscribing_together_share_one_first_query() -> None:
    """A triggerer (re)starting hundreds of triggers: the ones that subscribe within the gather share a query."""
    fetch = FakeFetch()

    async def scenario() -> None:
        poller = StatusPoller("u@c", fetch, 30)
        first = poller.subscribe("1", 30)
        await first.get()
        queues = []
        for job_id in ("2", "3", "4"):
            queues.append(poller.subscribe(job_id, 30))
            await asyncio.sleep(FIRST_ANSWER_GATHER_S / 10)
        late = [await queue.get() for queue in queues]
        assert [update.job_id for update in late] == ["2", "3", "4"]
        queues.append(poller.subscribe("5", 30))
        await queues[-1].get()
        poller.unsubscribe("1", first)
        for job_id, queue in zip(("2", "3", "4", "5"), queues, strict=True):
            poller.unsubscribe(job_id, queue)

    run(scenario())
    assert [sorted(ids) for ids, _, _ in fetch.calls] == [["1"], ["2", "3", "4"], ["5"]]


def test_interval_is_the_smallest_of_the_current_subscribers() -> None:
    async def scenario() -> list[float]:
        poller = StatusPoller("u@c", FakeFetch(), 60)
        seen = [poller.interval]
        slow = poller.subscribe("1", 30)
        seen.append(poller.interval)
        fast = poller.subscribe("2", 5)
        seen.append(poller.interval)
        poller.unsubscribe("2", fast)
        seen.append(poller.interval)
        poller.unsubscribe("1", slow)
        seen.append(poller.interval)
        return seen

    assert run(scenario()) == [60, 30, 5, 30, 60]


def test_one_poller_per_key_and_event_loop() -> None:
    fetch = FakeFetch()

    async def scenario() -> tuple[StatusPoller, StatusPoller, StatusPoller, list[StatusPoller]]:
        a = get_poller("unit-a@one", fetch, 30)
        return a, get_poller("unit-a@one", fetch, 5), get_poller("unit-b@one", fetch, 30), active_pollers()

    first, again, other, listed = run(scenario())
    assert first is again
    assert other is not first
    assert {id(first), id(other)} <= {id(p) for p in listed}
    assert run(scenario())[0] is not first


class PartialFetch:
    """The first fetch answers only for ``answered`` (a StatusQueryError); later ones answer for everybody."""

    def __init__(self, answered: set[str]) -> None:
        self.answered = answered
        self.calls = 0

    async def __call__(self, ids: list[str]) -> dict[str, JobState]:
        self.calls += 1
        if self.calls == 1:
            states = {job_id: running(job_id) for job_id in ids if job_id in self.answered}
            unanswered = [job_id for job_id in ids if job_id not in self.answered]
            raise StatusQueryError(
                f"{len(unanswered)} of {len(ids)} job(s) unanswered on login1 (squeue exited 1: controller down)",
                states,
                unanswered,
                evidence="squeue exited 1: controller down",
            )
        return {job_id: running(job_id) for job_id in ids}


@pytest.mark.parametrize(
    ("subscribed", "answered"),
    [
        pytest.param(["1", "2"], {"1"}, id="one-of-two"),
        pytest.param(["1", "2", "3"], {"1", "3"}, id="two-of-three"),
        pytest.param(["1", "2"], set(), id="none-answered"),
        pytest.param(["1", "1", "2"], {"1"}, id="two-subscribers-of-one-answered-job"),
    ],
)
def test_a_partial_poll_delivers_answered_states_and_an_error_to_the_unanswered(
    subscribed: list[str], answered: set[str]
) -> None:
    fetch = PartialFetch(answered)

    async def scenario() -> tuple[list[PollUpdate], list[PollUpdate], int]:
        poller = StatusPoller("u@c", fetch, 30)
        queues = [poller.subscribe(job_id, INTERVAL) for job_id in subscribed]
        first = [await queue.get() for queue in queues]
        while poller.stats.polls < 3:
            await asyncio.sleep(INTERVAL / 4)
        second = [queue.get_nowait() for queue in queues if not queue.empty()]
        failures = poller.stats.failures
        for job_id, queue in zip(subscribed, queues, strict=True):
            poller.unsubscribe(job_id, queue)
        return first, second, failures

    first, second, failures = run(scenario())

    assert failures == 1
    for job_id, update in zip(subscribed, first, strict=True):
        assert update.job_id == job_id
        if job_id in answered:
            assert (update.state, update.error) == (running(job_id), None)
        else:
            assert update.state is None  # unanswered: never "not found" without an error
            assert "unanswered" in (update.error or "")
            assert "controller down" in (update.error or "")
    # the next polls answer everybody: only the jobs that were unanswered hear something new
    assert sorted(u.job_id for u in second) == sorted(job_id for job_id in subscribed if job_id not in answered)
    assert all(u.state == running(u.job_id) and u.error is None for u in second)


# ---------------------------------------------------------------------- live logs


@dataclass
class LocalLogs:
    """The real batched log read, run by this machine's ``sh`` on local files; records each call's files."""

    calls: list[list[str]] = field(default_factory=list)
    fail: int = 0

    async def __call__(self, requests: list[TailRequest]) -> list[TailChunk]:
        self.calls.append([request.path for request in requests])
        if self.fail:
            self.fail -= 1
            raise OSError("channel closed")
        script, nonce = tail_script(requests)
        done = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True, check=True)
        return parse_tail_output(done.stdout, len(requests), nonce)


def test_one_log_read_per_poll_for_every_started_job_and_none_for_pending_ones(tmp_path: Path) -> None:
    """Three running jobs and one pending: each poll is one state fetch plus ONE log read of the running jobs' files."""
    logs = LocalLogs()
    for job_id in ("1", "2", "3"):
        (tmp_path / f"{job_id}.out").write_bytes(f"job {job_id} line\n".encode())

    async def fetch(ids: list[str]) -> dict[str, JobState]:
        states = {job_id: running(job_id) for job_id in ids}
        states["4"] = state_from_native("4", "PENDING", source="squeue", reason="Priority")
        return states

    async def scenario() -> dict[str, list[str]]:
        poller = StatusPoller("u@c", fetch, 30, logs)
        queues = {
            job_id: poller.subscribe(job_id, INTERVAL, [LineStream("main.out", str(tmp_path / f"{job_id}.out"))])
            for job_id in ("1", "2", "3", "4")
        }
        await asyncio.sleep(INTERVAL * 4.5)
        for job_id, queue in queues.items():
            poller.unsubscribe(job_id, queue)
        return {
            job_id: [line for _ in range(queue.qsize()) for line in queue.get_nowait().lines]
            for job_id, queue in queues.items()
        }

    lines = run(scenario())

    assert len(logs.calls) >= 3
    assert all(sorted(paths) == [str(tmp_path / f"{i}.out") for i in ("1", "2", "3")] for paths in logs.calls)
    assert lines == {
        "1": ["main.out | job 1 line"],
        "2": ["main.out | job 2 line"],
        "3": ["main.out | job 3 line"],
        "4": [],
    }


def test_a_failed_log_read_loses_nothing(tmp_path: Path) -> None:
    """The first log read fails: the states still arrive, and the next read shows the lines (once)."""
    logs = LocalLogs(fail=1)
    log = tmp_path / "main.out"
    log.write_bytes(b"a\nb\n")
    fetch = FakeFetch()

    async def scenario() -> list[PollUpdate]:
        poller = StatusPoller("u@c", fetch, 30, logs)
        queue = poller.subscribe("1", INTERVAL, [LineStream("main.out", str(log))])
        await asyncio.sleep(INTERVAL * 3.5)
        poller.unsubscribe("1", queue)
        assert poller.stats.log_failures == 1
        return [queue.get_nowait() for _ in range(queue.qsize())]

    updates = run(scenario())

    assert updates[0].state == running("1")
    assert updates[0].lines == ()
    assert [line for update in updates for line in update.lines] == ["main.out | a", "main.out | b"]


def test_the_batch_budget_shrinks_each_files_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With many files, no read asks for more than the batch budget in all: each file gets its share."""
    monkeypatch.setattr(poller_module, "MAX_LOG_BYTES_PER_POLL", 4096)
    logs = LocalLogs()
    paths = []
    for job_id in range(8):
        path = tmp_path / f"{job_id}.out"
        path.write_bytes(b"z " * 1500 + b"\nlast\n")  # a cut base64-only line would withhold "last"
        paths.append(path)
    asked: list[int] = []

    async def reader(requests: list[TailRequest]) -> list[TailChunk]:
        asked.extend(request.max_bytes for request in requests)
        return await logs(requests)

    async def scenario() -> list[str]:
        poller = StatusPoller("u@c", FakeFetch(), 30, reader)
        queues = [poller.subscribe(str(i), INTERVAL, [LineStream("main.out", str(p))]) for i, p in enumerate(paths)]
        await asyncio.sleep(INTERVAL * 1.5)
        for i, queue in enumerate(queues):
            poller.unsubscribe(str(i), queue)
        return [line for queue in queues for _ in range(queue.qsize()) for line in queue.get_nowait().lines]

    lines = run(scenario())

    assert set(asked) == {poller_module.MIN_LOG_BYTES_PER_FILE}
    assert lines.count("main.out | last") == 8
    assert sum("skipped" in line for line in lines) == 8


# ------------------------------------------------------------------ end markers


@dataclass
class FakeEnds:
    """Lists end markers from a scripted list of answers per read (an Exception fails that read)."""

    answers: list[Any] = field(default_factory=list)
    reads: list[tuple[dict[str, float], float]] = field(default_factory=list)

    async def __call__(self, since: Any) -> list[EndMarker]:
        self.reads.append((dict(since), time.monotonic()))
        answer = self.answers.pop(0) if len(self.answers) > 1 else (self.answers[0] if self.answers else [])
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


def marker(
    job_id: str, restart: int = 0, code: int = 0, directory: str = "/r/ends", mtime: float = 1000.0
) -> EndMarker:
    return EndMarker(directory, job_id, restart, code, mtime)


@dataclass
class FakeAccounting:
    """sacct's scripted answers per call (the last repeats; an Exception fails that call)."""

    answers: list[Any] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    async def __call__(self, ids: list[str]) -> dict[str, JobState]:
        self.calls.append(list(ids))
        self.times.append(time.monotonic())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return {job_id: state for job_id, state in answer.items() if job_id in ids}


@pytest.fixture
def fast_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers read every 0.02 s, batched for 0.01 s, rechecked after 0.01 s (doubling)."""
    monkeypatch.setattr(poller_module, "END_MARKER_INTERVAL_S", 0.02)
    monkeypatch.setattr(poller_module, "END_MARKER_BATCH_S", 0.01)
    monkeypatch.setattr(poller_module, "END_MARKER_RECHECK_S", 0.01)


def ended(
    job_id: str,
    native: str = "COMPLETED",
    code: int = 0,
    end: str | None = "2026-12-04T05:08:30",
    *,
    signal: int = 0,
    run: int = 0,
) -> JobState:
    """Accounting's row of an ended job, as ``sacct -D`` gives it (``run``: which run of the job it is)."""
    state = state_from_native(job_id, native, source="sacct", exit_code=code, signal=signal, end=end)
    return dataclasses.replace(state, run=run)


@pytest.mark.usefixtures("fast_markers")
def test_end_markers_are_read_between_status_queries_and_each_subscriber_gets_its_own_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fetch = FakeFetch()
    ends = FakeEnds([[], OSError("connection reset"), [marker("1", code=3), marker("2", directory="/other/ends")]])
    # sacct first lags (still RUNNING), then fails once, then shows the end.
    accounting = FakeAccounting([{"1": running("1")}, OSError("slurmdbd down"), {"1": ended("1", "FAILED", 3)}])

    async def scenario() -> tuple[list[PollUpdate], list[PollUpdate], StatusPoller]:
        poller = StatusPoller("u@c", fetch, 30, read_ends=ends, confirm_ends=accounting)
        one = poller.subscribe("1", 3600, end_dir="/r/ends")
        two = poller.subscribe("2", 3600, end_dir="/r/ends")
        await asyncio.sleep(0.3)
        got = [[q.get_nowait() for _ in range(q.qsize())] for q in (one, two)]
        poller.unsubscribe("1", one)
        poller.unsubscribe("2", two)
        return got[0], got[1], poller

    one, two, poller = run(scenario())

    assert len(fetch.calls) == 1, "the scheduler is asked once per (hour-long) interval"
    assert len(ends.reads) >= 5
    assert poller.stats.end_failures == 1
    assert (poller.stats.end_confirms, poller.stats.end_confirm_failures) == (2, 1)
    assert accounting.calls == [["1"]] * 3, "only the marked job is asked about, until accounting shows its end"
    assert [u.state.native for u in one if u.state] == ["RUNNING", "FAILED"]  # the marker once, though listed again
    assert (one[-1].state.source, one[-1].state.exit_code) == ("sacct", 3)  # type: ignore[union-attr]
    assert [u.state.native for u in two if u.state] == ["RUNNING"], "a marker in another directory is not its own"
    # After the first listing, only markers up to END_MARKER_SLACK_S older than the newest are listed again.
    assert ends.reads[0][0] == {"/r/ends": 0.0}
    assert ends.reads[-1][0] == {"/r/ends": 1000.0 - poller_module.END_MARKER_SLACK_S}


@pytest.mark.usefixtures("fast_markers")
@pytest.mark.parametrize("counted", [1, None], ids=["accounting-shows-run-1", "accounting-lags"])
def test_a_marker_accounting_does_not_confirm_is_dropped_and_the_next_runs_marker_counts(
    monkeypatch: pytest.MonkeyPatch, counted: int | None
) -> None:
    """Run 0's marker, then SLURM requeued the job (accounting: PENDING; ``sacct -D`` counts run 1, or not yet):
    run 0 is dropped (at once when accounting shows the later run, else after the confirm window) and never
    asked about again; run 1's marker, once accounting shows run 1's end, ends the watch."""
    monkeypatch.setattr(poller_module, "END_MARKER_CONFIRM_S", 0.1 if counted is None else 3600)
    ends = FakeEnds([[marker("1", restart=0)]])
    requeued = dataclasses.replace(state_from_native("1", "PENDING", source="sacct", reason="BeginTime"), run=counted)
    accounting = FakeAccounting([{"1": requeued}])

    async def scenario() -> list[PollUpdate]:
        poller = StatusPoller("u@c", FakeFetch(), 30, read_ends=ends, confirm_ends=accounting)
        queue = poller.subscribe("1", 3600, end_dir="/r/ends")
        await asyncio.sleep(0.3)
        asked = len(accounting.calls)
        await asyncio.sleep(0.1)
        assert len(accounting.calls) == asked, "a dropped run's marker is not asked about again"
        assert queue.qsize() == 1  # the first poll's RUNNING only
        ends.answers = [[marker("1", restart=0), marker("1", restart=1, code=0)]]
        accounting.answers = [{"1": ended("1", run=1)}]
        await asyncio.sleep(0.2)
        poller.unsubscribe("1", queue)
        return [queue.get_nowait() for _ in range(queue.qsize())]

    updates = run(scenario())
    assert [(u.state.source, u.state.native) for u in updates if u.state] == [
        ("squeue", "RUNNING"),
        ("sacct", "COMPLETED"),
    ]


async def watch_one_marked_job(ends: FakeEnds, accounting: FakeAccounting) -> list[PollUpdate]:
    """Job 1 watched with its ends directory for 0.3 s (scheduler queries far apart): every update sent."""
    poller = StatusPoller("u@c", FakeFetch(), 30, read_ends=ends, confirm_ends=accounting)
    queue = poller.subscribe("1", 3600, end_dir="/r/ends")
    await asyncio.sleep(0.3)
    poller.unsubscribe("1", queue)
    return [queue.get_nowait() for _ in range(queue.qsize())]


@pytest.mark.usefixtures("fast_markers")
def test_an_end_no_script_gives_is_left_to_the_scheduler_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accounting shows NODE_FAIL beside a marker (the node died; SLURM may requeue the job, which squeue
    knows first): the marker is dropped at once, nothing is sent, and accounting is not asked again."""
    ends = FakeEnds([[marker("1", code=129)]])
    accounting = FakeAccounting([{"1": ended("1", "NODE_FAIL", 0)}])

    updates = run(watch_one_marked_job(ends, accounting))
    assert [(u.state.source, u.state.native) for u in updates if u.state] == [("squeue", "RUNNING")]
    assert accounting.calls == [["1"]]


@pytest.mark.usefixtures("fast_markers")
def test_a_final_state_without_its_end_record_does_not_confirm_a_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that ended while slurmdbd was down: once slurmdbd is back, its row shows the final state a
    moment before the end record arrives, with exit code 0:0 and no End. Only the full row confirms."""
    ends = FakeEnds([[marker("1", code=3)], []])
    accounting = FakeAccounting(
        [OSError("slurmdbd down"), {"1": ended("1", "FAILED", 0, end=None)}, {"1": ended("1", "FAILED", 3)}]
    )

    updates = run(watch_one_marked_job(ends, accounting))
    sent = [(u.state.source, u.state.native, u.state.exit_code) for u in updates if u.state]
    assert sent == [("squeue", "RUNNING", None), ("sacct", "FAILED", 3)]
    assert len(accounting.calls) == 3


@pytest.mark.usefixtures("fast_markers")
def test_an_end_with_another_exit_code_than_the_markers_does_not_confirm_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A requeued job's row showed a transient FAILED (exit 143: the SIGTERM'd run) beside a marker of exit
    code 0 (seen in CI under load): not that run's end, so the marker is dropped and nothing is sent."""
    ends = FakeEnds([[marker("1", code=0)]])
    accounting = FakeAccounting([{"1": ended("1", "FAILED", 143)}])

    updates = run(watch_one_marked_job(ends, accounting))
    assert [(u.state.source, u.state.native) for u in updates if u.state] == [("squeue", "RUNNING")]
    assert accounting.calls == [["1"]]


async def watch_marked_jobs(
    ids: list[str],
    ends: FakeEnds,
    accounting: FakeAccounting,
    seconds: float,
    fetch: Any = None,
    interval: float = 3600,
) -> dict[str, list[PollUpdate]]:
    """Jobs ``ids`` watched with their ends directory for ``seconds``: every update each was sent."""
    poller = StatusPoller("u@c", fetch or FakeFetch(), 30, read_ends=ends, confirm_ends=accounting)
    queues = {job_id: poller.subscribe(job_id, interval, end_dir="/r/ends") for job_id in ids}
    await asyncio.sleep(seconds)
    for job_id, queue in queues.items():
        poller.unsubscribe(job_id, queue)
    return {job_id: [queue.get_nowait() for _ in range(queue.qsize())] for job_id, queue in queues.items()}


def sent_ends(updates: dict[str, list[PollUpdate]]) -> dict[str, tuple[str, str, int | None]]:
    """Per job, the terminal update it was sent: (source, native state, exit code)."""
    return {
        job_id: (u.state.source, u.state.native, u.state.exit_code)
        for job_id, got in updates.items()
        for u in got
        if u.state is not None and u.state.is_terminal
    }


@pytest.mark.usefixtures("fast_markers")
@pytest.mark.parametrize(
    ("reads", "answers", "calls"),
    [
        pytest.param(
            [[marker("1"), marker("2"), marker("3")]],
            [{"1": ended("1"), "2": ended("2"), "3": ended("3")}],
            [["1", "2", "3"]],
            id="found-by-one-read",
        ),
        pytest.param(
            [[marker("1"), marker("2")], [marker("1"), marker("2"), marker("3")]],
            [{"1": ended("1"), "2": ended("2"), "3": ended("3")}],
            [["1", "2", "3"]],
            id="found-by-the-read-right-before-the-query",
        ),
        pytest.param(
            [[marker("1"), marker("2")], [], [marker("3")]],
            [{"1": ended("1"), "2": running("2")}, {"2": ended("2"), "3": ended("3")}],
            [["1", "2"], ["2", "3"]],
            id="one-accounting-lags-on-asked-again-with-the-next",
        ),
    ],
)
def test_markers_that_appear_within_one_window_are_confirmed_by_one_accounting_query(
    monkeypatch: pytest.MonkeyPatch, reads: list[Any], answers: list[Any], calls: list[list[str]]
) -> None:
    """The first marker waits END_MARKER_BATCH_S; the directories are read once more right before the query,
    and every marker waiting then (new, or not confirmed yet) goes in the one sacct."""
    monkeypatch.setattr(poller_module, "END_MARKER_INTERVAL_S", 0.15)
    monkeypatch.setattr(poller_module, "END_MARKER_BATCH_S", 0.1)
    monkeypatch.setattr(poller_module, "END_MARKER_RECHECK_S", 0.1)
    ends = FakeEnds(reads)
    accounting = FakeAccounting(answers)

    updates = run(watch_marked_jobs(["1", "2", "3"], ends, accounting, 0.5))

    assert accounting.calls == calls
    assert sent_ends(updates) == {job_id: ("sacct", "COMPLETED", 0) for job_id in ("1", "2", "3")}


@pytest.mark.usefixtures("fast_markers")
def test_a_failed_accounting_query_is_no_answer_its_markers_wait_and_are_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """slurmdbd down: nothing is sent and no marker is dropped; every waiting job is asked again, one query
    per marker interval (not per recheck), and confirmed once accounting answers."""
    monkeypatch.setattr(poller_module, "END_MARKER_INTERVAL_S", 0.1)
    ends = FakeEnds([[marker("1"), marker("2", code=2)]])
    down = OSError("sacct: error: Problem talking to the database")
    accounting = FakeAccounting([down, down, down, {"1": ended("1"), "2": ended("2", "FAILED", 2)}])

    async def scenario() -> tuple[dict[str, list[PollUpdate]], int]:
        poller = StatusPoller("u@c", FakeFetch(), 30, read_ends=ends, confirm_ends=accounting)
        queues = {job_id: poller.subscribe(job_id, 3600, end_dir="/r/ends") for job_id in ("1", "2")}
        await asyncio.sleep(0.25)
        assert all(q.qsize() == 1 for q in queues.values()), "a failed query ends nothing (the first poll only)"
        await asyncio.sleep(0.35)
        for job_id, queue in queues.items():
            poller.unsubscribe(job_id, queue)
        failures = poller.stats.end_confirm_failures
        return {
            job_id: [queue.get_nowait() for _ in range(queue.qsize())] for job_id, queue in queues.items()
        }, failures

    updates, failures = run(scenario())

    assert failures == 3
    assert accounting.calls == [["1", "2"]] * 4
    assert min(b - a for a, b in itertools.pairwise(accounting.times)) >= 0.09
    assert sent_ends(updates) == {"1": ("sacct", "COMPLETED", 0), "2": ("sacct", "FAILED", 2)}


@pytest.mark.usefixtures("fast_markers")
@pytest.mark.parametrize(
    ("accounted", "sent"),
    [
        pytest.param(ended("1", "FAILED", 143), ("sacct", "FAILED", 143), id="another-exit-code"),
        pytest.param(ended("1", "NODE_FAIL", 0), ("sacct", "NODE_FAIL", 0), id="an-end-no-script-gives"),
        # the run SLURM is restarting, its script SIGTERMed (0:15; seen under load before the requeue shows)
        pytest.param(ended("1", "FAILED", 0, signal=15), ("sacct", "FAILED", 0), id="ended-by-a-signal"),
        # a requeued job's newest run ended as a script ends, but it is run 1: the marker is run 0's
        pytest.param(ended("1", run=1), ("sacct", "COMPLETED", 0), id="another-run"),
    ],
)
def test_a_mismatching_end_leaves_the_job_to_the_scheduler_queries_the_batch_confirms_the_rest(
    accounted: JobState, sent: tuple[str, str, int]
) -> None:
    """Job 1's marker says exit code 0 but accounting shows another end: in the batch with job 2, only job 2
    is sent its end; job 1's marker is dropped (not asked about again) and the next status query reports it."""
    ends = FakeEnds([[marker("1", code=0), marker("2")]])
    accounting = FakeAccounting([{"1": accounted, "2": ended("2")}])
    fetch = ScriptedFetch([{"1": "RUNNING", "2": "RUNNING"}, {"1": accounted, "2": "RUNNING"}])

    updates = run(watch_marked_jobs(["1", "2"], ends, accounting, 0.45, fetch, interval=0.3))

    assert accounting.calls == [["1", "2"]]
    assert sent_ends(updates) == {"1": sent, "2": ("sacct", "COMPLETED", 0)}
    assert fetch.calls == 2  # job 1's end came from the second status query


def test_a_confirmation_due_right_before_the_status_query_rides_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A marker found 0.2 s before the status query: no sacct of its own; the query answers the ended job."""
    monkeypatch.setattr(poller_module, "END_MARKER_INTERVAL_S", 0.25)
    monkeypatch.setattr(poller_module, "END_MARKER_BATCH_S", 0.15)
    ends = FakeEnds([[], [marker("1")]])
    accounting = FakeAccounting([{"1": ended("1")}])
    fetch = ScriptedFetch([{"1": "RUNNING"}, {"1": ended("1")}])

    updates = run(watch_marked_jobs(["1"], ends, accounting, 0.6, fetch, interval=0.45))

    assert accounting.calls == []
    assert sent_ends(updates) == {"1": ("sacct", "COMPLETED", 0)}


@pytest.mark.usefixtures("fast_markers")
def test_a_marker_accounting_keeps_answering_without_an_end_is_asked_again_less_and_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A requeued run's marker (accounting: PENDING) until the confirm window ends: rechecks double."""
    monkeypatch.setattr(poller_module, "END_MARKER_INTERVAL_S", 1.0)
    monkeypatch.setattr(poller_module, "END_MARKER_RECHECK_S", 0.02)
    monkeypatch.setattr(poller_module, "END_MARKER_CONFIRM_S", 10.0)
    ends = FakeEnds([[marker("1")]])
    accounting = FakeAccounting([{"1": state_from_native("1", "PENDING", source="sacct", reason="BeginTime")}])

    updates = run(watch_marked_jobs(["1"], ends, accounting, 0.7))

    gaps = [b - a for a, b in itertools.pairwise(accounting.times)]
    assert 4 <= len(accounting.calls) <= 7, gaps  # 0.02, 0.04, 0.08, 0.16, 0.32: not 35 at a fixed 0.02 s
    assert all(later > earlier * 1.5 for earlier, later in itertools.pairwise(gaps)), gaps
    assert sent_ends(updates) == {}


def test_no_marker_reads_without_an_ends_directory() -> None:
    ends = FakeEnds()

    async def scenario() -> None:
        poller = StatusPoller("u@c", FakeFetch(), 30, read_ends=ends)
        queue = poller.subscribe("1", INTERVAL)
        await asyncio.sleep(INTERVAL * 4)
        poller.unsubscribe("1", queue)

    run(scenario())
    assert ends.reads == []
