"""Following a job's logs live: one :class:`LiveLogs` for the sensor (sync) and the trigger (async)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from airflow_provider_tao_slurm.core.logstream import TailChunk, TailRequest
from airflow_provider_tao_slurm.core.secrets import REDACTED
from airflow_provider_tao_slurm.lifecycle.following import LiveLogs

LOG = logging.getLogger("following")
DESCRIPTIONS = [
    {"label": "main.out", "path": "/logs/main.out", "cursor_path": "/logs/.live.main.out.offset"},
    {"label": "main.err", "path": "/logs/main.err", "cursor_path": "/logs/.live.main.err.offset"},
]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def test_resolved_secrets_redact_the_followed_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOLLOWING_TOKEN", "tok-1f3a9c5e7b")
    live = LiveLogs("on this worker")

    secrets = live.secrets(LOG, "42", {"HF_TOKEN": "env:FOLLOWING_TOKEN"}, "/logs")
    streams = live.follow(DESCRIPTIONS, secrets, 1024)

    assert secrets == ["tok-1f3a9c5e7b"]
    assert streams is live.streams
    assert [(s.label, s.cursor_path, s.max_bytes) for s in streams] == [
        ("main.out", "/logs/.live.main.out.offset", 1024),
        ("main.err", "/logs/.live.main.err.offset", 1024),
    ]
    assert streams[0].feed(TailChunk(offset=0, data=b"tok-1f3a9c5e7b\n")) == [f"main.out | {REDACTED}"]


@pytest.mark.parametrize("resolve", ["sync", "async"])
def test_a_secret_that_does_not_resolve_withholds_the_lines_said_once_per_job(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, resolve: str
) -> None:
    """The sensor (sync) and the trigger (async) say the same, once per job, and follow nothing."""
    monkeypatch.delenv("FOLLOWING_MISSING", raising=False)
    live = LiveLogs("in the triggerer")
    refs = {"HF_TOKEN": "env:FOLLOWING_MISSING", "OTHER": "env:FOLLOWING_MISSING"}

    def secrets(job: str) -> list[str] | None:
        if resolve == "sync":
            return live.secrets(LOG, job, refs, "/logs/main.out")
        return asyncio.run(live.a_secrets(LOG, job, refs, "/logs/main.out"))

    with caplog.at_level(logging.WARNING, logger="following"):
        assert [secrets("42"), secrets("42"), secrets("43")] == [None, None, None]

    said = warnings(caplog)
    assert len(said) == 4  # two lines for each of the two jobs
    assert said[0].startswith("Cannot resolve secret_env[HF_TOKEN], secret_env[OTHER] in the triggerer (")
    assert "the live lines of SLURM job 42 are withheld" in said[0]
    assert "they stay in /logs/main.out" in said[1]
    assert "SLURM job 43" in said[2]
    assert live.follow(DESCRIPTIONS, None, 1024) == []
    assert live.shown_offsets() == {}


class Reader:
    """One batched read: each request answered from ``files`` (bytes from its offset), or a failure."""

    def __init__(self, files: dict[str, bytes], error: Exception | None = None) -> None:
        self.files = files
        self.error = error
        self.calls: list[list[TailRequest]] = []

    def __call__(self, requests: list[TailRequest]) -> Sequence[TailChunk[bytes]]:
        self.calls.append(requests)
        if self.error is not None:
            raise self.error
        chunks: list[TailChunk[bytes]] = []
        for request in requests:
            data = self.files.get(request.path)
            offset = request.offset or 0
            chunks.append(TailChunk(missing=True) if data is None else TailChunk(offset=offset, data=data[offset:]))
        return chunks


def test_new_lines_are_shown_in_one_record_and_their_offsets_kept(caplog: pytest.LogCaptureFixture) -> None:
    live = LiveLogs("on this worker")
    live.follow(DESCRIPTIONS, [], 1024)
    reader = Reader({"/logs/main.out": b"epoch 1\nepoch 2\nepo"})

    with caplog.at_level(logging.INFO, logger="following"):
        live.show_new_lines(LOG, reader)

    assert [record.getMessage() for record in caplog.records] == ["main.out | epoch 1\nmain.out | epoch 2"]
    assert len(reader.calls) == 1
    assert live.shown_offsets() == {"main.out": 16}


def test_a_failed_read_is_said_and_read_again_from_the_same_offsets(caplog: pytest.LogCaptureFixture) -> None:
    live = LiveLogs("on this worker")
    live.follow(DESCRIPTIONS, [], 1024)
    failing = Reader({}, OSError("connection reset"))

    with caplog.at_level(logging.INFO, logger="following"):
        live.show_new_lines(LOG, failing)
        live.show_new_lines(LOG, Reader({"/logs/main.err": b"oops\n"}))

    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["Reading the job's logs failed (read again next poll): connection reset", "main.err | oops"]
    assert live.shown_offsets() == {"main.err": 5}


def test_no_streams_read_nothing() -> None:
    reader = Reader({})
    LiveLogs("on this worker").show_new_lines(LOG, reader)
    assert reader.calls == []
