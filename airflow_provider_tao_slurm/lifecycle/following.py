"""Following a job's logs live: the streams a waiting task shows, the secrets that redact them, what they showed.

The sensor (poking in a worker) and the trigger (deferred, read for by the shared poller) follow a job's
``main.out``, ``main.err`` and ``status.json`` through one :class:`LiveLogs`: it builds the
:class:`~airflow_provider_tao_slurm.core.logstream.LineStream` s from the stream descriptions the sensor
hands the trigger, redacting the job's secrets resolved where the task runs. When one does not resolve
there, the job's lines are withheld and the task log says so, once per job. Sync and async callers
differ only in how the secrets are resolved (:meth:`LiveLogs.secrets`, :meth:`LiveLogs.a_secrets`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tao_slurm.core.logstream import (
    LineStream,
    TailChunk,
    TailRequest,
    line_streams,
    show_lines,
    shown_offsets,
)
from airflow_provider_tao_slurm.lifecycle.support import resolve_secrets

#: One batched read of many files (``SlurmHook.tail_many``).
SyncLogReader = Callable[[list[TailRequest]], Sequence[TailChunk[bytes]]]


@dataclass
class LiveLogs:
    """What one waiting task shows of a job's logs: its line streams, and the jobs whose lines it withholds.

    :param where: where the task resolves secrets, for messages (``on this worker``, ``in the triggerer``).
    :ivar streams: the streams followed now (none before :meth:`follow`, or when the lines are withheld).
    """

    where: str
    streams: list[LineStream] = field(default_factory=list)
    _withheld: set[str] = field(default_factory=set, repr=False)

    def secrets(self, log: Any, job: str, refs: Mapping[str, str], kept_in: str) -> list[str] | None:
        """Return the job's secrets resolved here, to redact its lines; None when one does not resolve.

        :param log: the task's logger, told (once per job) why the lines are withheld.
        :param job: the job as messages name it.
        :param refs: the job's ``secret_env`` references (never values).
        :param kept_in: where the job's lines stay, for the message.
        """
        values, failed = resolve_secrets(refs)
        return self._unless_withheld(log, job, kept_in, values, failed)

    async def a_secrets(self, log: Any, job: str, refs: Mapping[str, str], kept_in: str) -> list[str] | None:
        """:meth:`secrets` for an event loop: the references are resolved in a thread (they may read the database)."""
        from asgiref.sync import sync_to_async

        values, failed = await sync_to_async(resolve_secrets)(refs)
        return self._unless_withheld(log, job, kept_in, values, failed)

    def _unless_withheld(
        self, log: Any, job: str, kept_in: str, values: list[str], failed: Mapping[str, str]
    ) -> list[str] | None:
        """Return ``values``, or None after saying (once per job) that the job's lines are withheld.

        Pattern redaction alone would show a secret that did not resolve if the job printed it, so none of
        the job's lines are shown; they stay in its files.
        """
        if not failed:
            return values
        if job not in self._withheld:
            self._withheld.add(job)
            log.warning(
                "Cannot resolve %s %s (%s): the live lines of SLURM job %s are withheld from the task log, so that "
                "a secret it prints cannot show",
                ", ".join(f"secret_env[{name}]" for name in failed),
                self.where,
                ", ".join(sorted(set(failed.values()))),
                job,
            )
            log.warning(
                "The job's lines are not lost: they stay in %s (the sensor shows each log's end, redacted, on a "
                "worker that resolves them)",
                kept_in,
            )
        return None

    def follow(
        self, descriptions: Iterable[Mapping[str, str | None]], secrets: Sequence[str] | None, max_bytes: int
    ) -> list[LineStream]:
        """Follow the files ``descriptions`` name from now on, redacting ``secrets``; none when they are None.

        :param descriptions: each ``{"label": ..., "path": ..., "cursor_path": ...}``.
        :param secrets: the job's secret values (:meth:`secrets`); None withholds the job's lines.
        :param max_bytes: bytes read per file per poll at most.
        :returns: the streams now followed.
        """
        self.streams = [] if secrets is None else line_streams(descriptions, secrets, max_bytes)
        return self.streams

    def show_new_lines(self, log: Any, read: SyncLogReader) -> None:
        """Read what the job appended to its files (one batched ``read``) and show the new lines in the task log.

        A failed read is said and shows nothing: the next one reads the same bytes again.
        """
        if not self.streams:
            return
        try:
            chunks = read([stream.request() for stream in self.streams])
        except Exception as exc:  # the next read starts from the same offsets
            log.warning("Reading the job's logs failed (read again next poll): %s", exc)
            return
        show_lines(
            log, [line for stream, chunk in zip(self.streams, chunks, strict=True) for line in stream.feed(chunk)]
        )

    def shown_offsets(self) -> dict[str, int]:
        """Per followed stream, the bytes already shown in the task log (what the end-of-log read skips)."""
        return shown_offsets(self.streams)
