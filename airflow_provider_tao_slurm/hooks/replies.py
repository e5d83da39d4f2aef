"""What the hook makes of the cluster's replies: results, checked exit statuses, file and log reads, polls.

Pure of SSH: each function takes what a command returned (exit status, stdout, stderr, login host)
and either gives the caller its answer or raises the typed error that says what failed. Both sides of
:class:`~airflow_provider_tao_slurm.hooks.slurm.SlurmHook` (sync and async) read replies only here.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.logstream import TailChunk, parse_tail_output
from airflow_provider_tao_slurm.core.secrets import redact_text
from airflow_provider_tao_slurm.core.states import (
    SQUEUE_UNKNOWN_JOB,
    JobState,
    merge_states,
    parse_sacct,
    parse_squeue,
)
from airflow_provider_tao_slurm.exceptions import (
    RemoteCommandError,
    RemoteReadError,
    StatusQueryError,
    StoragePathError,
)


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one remote command: exit status, decoded stdout and stderr, and the host used."""

    rc: int
    stdout: str
    stderr: str
    host: str = ""


def _result(rc: int, out: bytes, err: bytes, host: str, *, check: bool = False, what: str = "command") -> CommandResult:
    """Build a command's result, its stderr redacted.

    :param check: raise on a non-zero exit status.
    :param what: a short description of the command, for that error.
    :raises StoragePathError: for a command that :func:`~airflow_provider_tao_slurm.core.commands.secure_dirs`
        stopped (whatever ``check``): nothing was written (or submitted) after the check.
    :raises RemoteCommandError: with ``check``, for a non-zero exit status.
    """
    stderr = redact_text(err.decode("utf-8", "replace"))
    unsafe = commands.UNSAFE_PATH_RE.search(stderr) if rc == commands.UNSAFE_PATH_STATUS else None
    if unsafe is not None:
        path, reason = unsafe.groups()
        raise StoragePathError(
            f"{path} {reason} on {host}, so another user could plant links or files where this task writes "
            "(secrets, records, scripts); nothing was written or submitted. Make every directory from results_dir "
            f"down yours and writable by you only (e.g. chmod go-w -- {shlex.quote(path)}, or remove a planted "
            "link), or set the connection's results_dir to a directory only you can write"
        )
    if check and rc != 0:
        raise RemoteCommandError(
            f"{what} failed on {host} with exit status {rc}: {stderr.strip()[-2000:]}", rc=rc, stderr=stderr
        )
    return CommandResult(rc, out.decode("utf-8", "replace"), stderr, host)


def _file_text(result: CommandResult, path: str) -> str | None:
    """Return the text :func:`~airflow_provider_tao_slurm.core.commands.read_file` read; None only for no file.

    :raises RemoteReadError: when the read failed otherwise (the file may well exist).
    """
    if result.rc == commands.MISSING_FILE_STATUS:
        return None
    if result.rc != 0:
        reason = result.stderr.strip()[-2000:] or "no error message"
        raise RemoteReadError(
            f"reading {path} failed on {result.host} with exit status {result.rc}: {reason}; a failed read is "
            "not 'no file': nothing is taken as missing, read it again once the file system answers",
            path,
            rc=result.rc,
            stderr=result.stderr,
        )
    return result.stdout


def _utf8_complete(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary (drops a cut-off character)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # ASCII or the lead byte of a multi-byte character
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


def _log_chunk(stdout: bytes, offset: int) -> TailChunk[str]:
    """Parse ``tail_bytes`` output; a character cut at the end waits for the next read (unless nothing else fits)."""
    header, newline, body = stdout.partition(b"\n")
    size, length = commands.parse_tail((header + newline).decode("utf-8", "replace"))
    body = body[:length]
    keep = _utf8_complete(body) or len(body)
    next_offset, restarted = commands.next_offset(offset, size, keep)
    return TailChunk(
        size=size or 0,
        data=body[:keep].decode("utf-8", "replace"),
        next_offset=next_offset,
        restarted=restarted,
    )


def _tail_chunks(rc: int, out: bytes, err: bytes, host: str, count: int, nonce: str) -> list[TailChunk[bytes]]:
    """Parse a batched log read; a failed shell is an error, not "no new lines"."""
    if rc != 0:
        stderr = redact_text(err.decode("utf-8", "replace"))
        raise RemoteCommandError(
            f"log read on {host} exited {rc}: {stderr.strip()[-500:]}; it is read again next poll",
            rc=rc,
            stderr=stderr,
        )
    return parse_tail_output(out, count, nonce)


def _check_scancel(result: CommandResult) -> None:
    """Accept ``scancel -Q``'s silent exit 1 (a name filter matched no live job: finished, unknown or not ours).

    :raises RemoteCommandError: when scancel printed an error.
    """
    if result.rc != 0 and result.stderr.strip():
        raise RemoteCommandError(
            f"scancel failed on {result.host} with exit status {result.rc}: {result.stderr.strip()[-2000:]}; "
            "check that slurmctld is up (scontrol ping) and cancel again",
            rc=result.rc,
            stderr=result.stderr,
        )


def _answer(
    result: CommandResult | None, parse: Callable[[str], dict[str, JobState]], tool: str
) -> tuple[dict[str, JobState], str | None]:
    """Read one status query's reply: its states and ``None``, or no states and what failed.

    A failed query and a reply that cannot be read (the parser's error names the text) are both no
    answer. squeue's "Invalid job id specified" (asked about one id it does not know) is an answer:
    not in the queue. sacct exits 1 on any error from SLURM 24.05 on, rows or not: no answer either.
    """
    if result is None:
        return {}, None
    if result.rc != 0:
        if tool == "squeue" and SQUEUE_UNKNOWN_JOB in result.stderr:
            return {}, None
        return {}, f"{tool} exited {result.rc}: {result.stderr.strip()[-300:]}"
    try:
        return parse(result.stdout), None
    except RemoteCommandError as exc:
        return {}, str(exc)


def _needs_sacct(ids: list[str], squeue: CommandResult) -> list[str]:
    """Return the ids squeue did not answer for (or saw finish): sacct has their final state and exit code."""
    live, _failure = _answer(squeue, parse_squeue, "squeue")
    return [i for i in ids if i not in live or live[i].is_terminal]


def _combine_poll(ids: Sequence[str], squeue: CommandResult, sacct: CommandResult | None) -> dict[str, JobState]:
    """Merge one squeue and one sacct answer; squeue wins for live jobs, sacct fills in the rest.

    A failed or unreadable reply is not an answer (see :func:`_answer`): then every job that the
    other did not answer for is "unanswered", never "not found".

    :raises StatusQueryError: when some job was left unanswered (e.g. controller or accounting down).
    """
    wanted = set(ids)
    live, squeue_failure = _answer(squeue, parse_squeue, "squeue")
    finished, sacct_failure = _answer(sacct, parse_sacct, "sacct")
    states = {job_id: state for job_id, state in merge_states(live, finished).items() if job_id in wanted}
    failures = [failure for failure in (squeue_failure, sacct_failure) if failure]
    unanswered = [job_id for job_id in ids if job_id not in states] if failures else []
    if unanswered:
        evidence = "; ".join(failures)
        raise StatusQueryError(
            f"{len(unanswered)} of {len(ids)} job(s) unanswered on {squeue.host} ({evidence}); they are not taken "
            "as gone: check that slurmctld and slurmdbd are up (scontrol ping)",
            states,
            unanswered,
            evidence=evidence,
        )
    return states
