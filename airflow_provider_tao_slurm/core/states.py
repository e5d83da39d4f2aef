"""SLURM job states: the TAO state vocabulary and parsers for ``squeue``, ``sacct`` and ``sbatch`` output.

Every native SLURM state (squeue and sacct, 22.05 to 26.05) maps to one :class:`TaoState`. A state
this module does not know becomes ``UNKNOWN`` with the raw text kept: never success, never pending.
A row these parsers cannot read (a job id followed by too few columns, an exit code that is not
``status:signal``) is an error naming the command and the text, never a guess.

The format constants below are the only place the hook and the parsers agree on columns::

    squeue -h -o "$SQUEUE_FORMAT" -j <ids>
    sacct -X -n -P -o "$SACCT_FIELDS" -j <ids>
    squeue -h -o "$SQUEUE_ID_FORMAT" --name <name> -u <user>      # -> parse_jobs_by_name
    sacct -X -n -P -o "$SACCT_ID_FIELDS" --name <name> -u <user>  # -> parse_jobs_by_name
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from airflow_provider_tao_slurm.exceptions import JobLookupError, RemoteCommandError

#: Who reported a state: the scheduler, accounting, or the job's own end marker and exit-code file
#: (:func:`state_from_end_evidence`, for a job neither of the others knows any more).
Source = Literal["squeue", "sacct", "end marker"]


class TaoState(StrEnum):
    """The job states that TAO and this provider report."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    ERROR = "ERROR"
    CANCELED = "CANCELED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        """``True`` for states a job never leaves (COMPLETE, ERROR, CANCELED).

        UNKNOWN is not terminal: the caller keeps polling within its grace window, then fails loudly.
        """
        return self in (TaoState.COMPLETE, TaoState.ERROR, TaoState.CANCELED)


class ErrClass(StrEnum):
    """Why a job failed: the infrastructure (retryable) or the program (not retried)."""

    ERR_INFRA = "ERR_INFRA"
    ERR_PROGRAM = "ERR_PROGRAM"


# native state -> (TAO state, note shown in the message; "" for none)
_NATIVE: dict[str, tuple[TaoState, str]] = {
    "PENDING": (TaoState.PENDING, ""),
    "CONFIGURING": (TaoState.PENDING, "nodes are being configured"),
    "REQUEUED": (TaoState.PENDING, "requeued; the same job id will run again"),
    "REQUEUE_FED": (TaoState.PENDING, "requeued by the federation"),
    "EXPEDITING": (
        TaoState.PENDING,
        "requeued for an expedited restart (--requeue=expedite); the same job id runs again ahead of the queue",
    ),
    "REQUEUE_HOLD": (TaoState.PENDING, "held after requeue; release it with `scontrol release <id>`"),
    "RESV_DEL_HOLD": (
        TaoState.PENDING,
        "held because its reservation was deleted; release it with `scontrol release <id>`",
    ),
    "RUNNING": (TaoState.RUNNING, ""),
    "COMPLETING": (TaoState.RUNNING, "finishing"),
    "SUSPENDED": (TaoState.RUNNING, "suspended by the scheduler; it resumes on its own"),
    "STOPPED": (TaoState.RUNNING, "stopped (SIGSTOP); it continues after SIGCONT"),
    "RESIZING": (TaoState.RUNNING, "allocation is being resized"),
    "SIGNALING": (TaoState.RUNNING, "being signaled"),
    "STAGE_OUT": (TaoState.RUNNING, "staging out"),
    "COMPLETED": (TaoState.COMPLETE, ""),
    "FAILED": (TaoState.ERROR, ""),
    "TIMEOUT": (TaoState.ERROR, "wall-time limit reached"),
    "OUT_OF_MEMORY": (TaoState.ERROR, "host memory limit exceeded"),
    "DEADLINE": (TaoState.ERROR, "deadline reached"),
    "SPECIAL_EXIT": (TaoState.ERROR, "held after a RequeueExitHold exit code"),
    "NODE_FAIL": (TaoState.ERROR, "a node of the allocation failed"),
    "BOOT_FAIL": (TaoState.ERROR, "a node failed to boot"),
    "CANCELLED": (TaoState.CANCELED, ""),
    "PREEMPTED": (TaoState.CANCELED, "preempted and not requeued"),
    "REVOKED": (TaoState.CANCELED, "revoked; a sibling cluster of the federation ran it"),
}

#: Every native SLURM state this provider knows, mapped to its TAO state.
NATIVE_TO_TAO: Mapping[str, TaoState] = MappingProxyType({k: v[0] for k, v in _NATIVE.items()})

#: Native states that are infrastructure failures whatever the logs say.
INFRA_NATIVE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})

#: How long a terminal state without accounting's full row (:attr:`JobState.accounted`: a state only
#: squeue shows, or a sacct row with no End yet) waits for it: that row carries the exit code (sacct
#: lags squeue by seconds; without accounting the state at hand is used after this).
ACCOUNTING_SETTLE_S = 30.0

#: ``squeue -h -o SQUEUE_FORMAT``: id, name, state (long), reason, nodes, start, end.
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%S|%e"
#: ``sacct -X -n -P -o SACCT_FIELDS`` (allocation rows only, ``|``-separated, no padding).
SACCT_FIELDS = "JobIDRaw,JobName,State,ExitCode,Reason,NodeList,Start,End"
#: What squeue prints (exit 1) when asked about one job id it does not know: an answer, not a failure.
SQUEUE_UNKNOWN_JOB = "Invalid job id specified"
#: ``squeue -h -o SQUEUE_ID_FORMAT``: job id and owner (for reconciling by job name).
SQUEUE_ID_FORMAT = "%i|%u"
#: ``sacct -X -n -P -o SACCT_ID_FIELDS``: job id and owner (for reconciling by job name).
SACCT_ID_FIELDS = "JobIDRaw,User"

_SQUEUE_KEYS = {
    "%i": "job_id",
    "%j": "name",
    "%T": "state",
    "%r": "reason",
    "%N": "node_list",
    "%S": "start",
    "%e": "end",
}
_SACCT_KEYS = {
    "JobIDRaw": "job_id",
    "JobName": "name",
    "State": "state",
    "ExitCode": "exit_code",
    "Reason": "reason",
    "NodeList": "node_list",
    "Start": "start",
    "End": "end",
}
_SQUEUE_COLUMNS = tuple(_SQUEUE_KEYS[code] for code in SQUEUE_FORMAT.split("|"))
_SACCT_COLUMNS = tuple(_SACCT_KEYS[field] for field in SACCT_FIELDS.split(","))

_JOB_ID = re.compile(r"\d+(?:[_+][^\s.|;]+)?")
_SBATCH_REPLY = re.compile(r"(\d+)(?:;([^\s;]+))?")
_EXIT_CODE = re.compile(r"(\d+)(?::(\d+))?")
_NULL_TEXT = frozenset({"", "None", "(null)", "Unknown", "N/A"})
#: The reason SLURM gives the provider's own hold at submission (``sbatch --hold``, released once the job's
#: log directory exists). Accounting keeps it for the whole job: on a job that started and ended it says
#: nothing about how it ended.
SUBMISSION_HOLD_REASON = "JobHeldUser"
_PLACEHOLDER_NAME = "allocation"


@dataclass(frozen=True, kw_only=True)
class JobState:
    """One job's state as reported by ``squeue`` or ``sacct``.

    :param job_id: SLURM job id as printed (``123``, ``123_4``, ``123+0``).
    :param native: normalised native state (``CANCELLED`` for ``CANCELLED by 1001``).
    :param raw_state: the state text exactly as printed.
    :param tao_state: the mapped TAO state.
    :param source: ``"squeue"``, ``"sacct"`` or ``"end marker"`` (:func:`state_from_end_evidence`).
    :param exit_code: program exit status (sacct, or the job's end marker).
    :param signal: signal that ended the program, ``0`` for none (sacct only).
    :param reason: pending or failure reason, ``None`` when SLURM prints ``None``.
    :param node_list: allocated nodes, ``None`` before allocation.
    :param start: start time (expected start for pending jobs in squeue).
    :param end: end time (expected end for running jobs in squeue).
    :param name: job name; ``None`` for sacct's placeholder row.
    :param err_class: preset to ``ERR_INFRA`` for NODE_FAIL and BOOT_FAIL, else ``None``.
    :param message: human text: the state as printed, a note on it, and the reason.
    :param placeholder: ``True`` for sacct's early row (JobName ``allocation``, State PENDING) that it
        shows for a few seconds after submit, even for a job that already runs.
    :param run: which run of the job the row is (0 for the first; each requeue adds one), counted from
        ``sacct -D``'s rows (:func:`parse_sacct` with ``count_runs``); ``None`` where not counted.
    """

    job_id: str
    native: str
    raw_state: str
    tao_state: TaoState
    source: Source
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    node_list: str | None = None
    start: str | None = None
    end: str | None = None
    name: str | None = None
    err_class: ErrClass | None = None
    message: str = ""
    placeholder: bool = False
    run: int | None = None

    @property
    def is_terminal(self) -> bool:
        """``True`` when the job will not change state again (see :attr:`TaoState.is_terminal`)."""
        return self.tao_state.is_terminal

    @property
    def accounted(self) -> bool:
        """``True`` for accounting's full word on an ended job: a terminal sacct row with its end time.

        slurmdbd can hold a job's final state before slurmctld's end record reaches it (a job that
        ended while slurmdbd was down: the resent start record raises the state first); until then
        the row has no ``End`` and exit code ``0:0``, which is not the job's exit code.
        """
        return self.is_terminal and self.source == "sacct" and self.end is not None


def normalize_state(raw: str) -> str:
    """Reduce a printed SLURM state to its bare name.

    Strips padding, keeps the first whitespace-separated word and drops the ``+`` that sacct
    appends to text cut at the column width: ``"CANCELLED by 1001"``, ``"CANCELLED+"`` and
    ``"  COMPLETED "`` become ``"CANCELLED"``, ``"CANCELLED"`` and ``"COMPLETED"``.

    :param raw: the state column as printed.
    :returns: the bare state name, or ``""`` for blank text.
    """
    words = raw.split()
    return words[0].removesuffix("+") if words else ""


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    text = value.strip()
    return None if text in _NULL_TEXT else text


def _reason(native: str, reason: str | None, start: str | None) -> str | None:
    """SLURM's reason column, cleaned; the submission hold's reason is dropped from a job that started and ended."""
    reason = _clean(reason)
    ended = native in _NATIVE and _NATIVE[native][0].is_terminal
    if reason == SUBMISSION_HOLD_REASON and ended and _clean(start) is not None:
        return None
    return reason


def _mapped(native: str, shown: str, reason: str | None, *, placeholder: bool) -> tuple[TaoState, str]:
    """Map a native state to its TAO state and the message that explains it.

    :param native: the normalised native state.
    :param shown: the state column as printed, whitespace collapsed.
    :param reason: SLURM's reason column (cleaned), added to the message.
    :param placeholder: the row is sacct's placeholder right after submit (its note replaces the state's).
    :returns: the TAO state (``UNKNOWN`` for a state nobody knows) and the message.
    """
    if native in _NATIVE:
        tao_state, note = _NATIVE[native]
    else:
        tao_state = TaoState.UNKNOWN
        note = "unrecognised SLURM state; check the SLURM version and report it to the provider maintainers"
    if placeholder:
        note = "accounting placeholder row right after submit; the real state follows within seconds"
    message = shown or "(empty state)"
    if note:
        message += f": {note}"
    if reason:
        message += f" (reason: {reason})"
    return tao_state, message


def state_from_native(
    job_id: str,
    raw_state: str,
    *,
    source: Source,
    exit_code: int | None = None,
    signal: int | None = None,
    reason: str | None = None,
    node_list: str | None = None,
    start: str | None = None,
    end: str | None = None,
    name: str | None = None,
) -> JobState:
    """Build a :class:`JobState` from one row's raw fields (shared by both parsers).

    Text fields are stripped; ``None``, ``(null)``, ``Unknown``, ``N/A`` and blank become ``None``.
    An unrecognised state maps to ``UNKNOWN`` and the message keeps the raw text.

    :param job_id: SLURM job id as printed.
    :param raw_state: the state column as printed (padding, ``by <uid>`` and ``+`` allowed).
    :param source: ``"squeue"`` or ``"sacct"``.
    :param exit_code: program exit status, when known.
    :param signal: terminating signal, when known.
    :param reason: SLURM's reason column.
    :param node_list: SLURM's node list column.
    :param start: start time column.
    :param end: end time column.
    :param name: job name column.
    :returns: the parsed state.
    """
    native = normalize_state(raw_state)
    shown = " ".join(raw_state.split())
    reason = _reason(native, reason, start)
    name = _clean(name)
    placeholder = source == "sacct" and native == "PENDING" and name == _PLACEHOLDER_NAME
    tao_state, message = _mapped(native, shown, reason, placeholder=placeholder)
    return JobState(
        job_id=job_id.strip(),
        native=native,
        raw_state=raw_state,
        tao_state=tao_state,
        source=source,
        exit_code=exit_code,
        signal=signal,
        reason=reason,
        node_list=_clean(node_list),
        start=_clean(start),
        end=_clean(end),
        name=None if placeholder else name,
        err_class=ErrClass.ERR_INFRA if native in INFRA_NATIVE_STATES else None,
        message=message,
        placeholder=placeholder,
    )


def state_from_end_evidence(
    job_id: str, markers: Iterable[tuple[int, int]], exit_code_text: str | None
) -> JobState | None:
    """Return the end that a job's own files show, for a job that squeue and sacct both no longer know.

    A short ``MinJobAge`` makes slurmctld forget a finished job within seconds; when slurmdbd lags
    past the vanished-job grace, nothing else can say how the job ended. Its batch script can: its
    EXIT trap leaves an end marker ``<job>-<restart>-<exit code>.end`` when the script ends by itself
    (never after SIGTERM), and the script writes the step's exit code to its exit-code file (removed
    when a run starts). Only the two together are evidence: the marker of the latest run, and the
    exit-code file holding the same code.

    :param job_id: the SLURM job id.
    :param markers: the job's end markers, as ``(restart count, exit code)`` pairs.
    :param exit_code_text: the exit-code file's content; None when it is missing or could not be read.
    :returns: COMPLETED (exit code 0) or FAILED with that exit code, source ``"end marker"``; None
        when the files show no such end (then the job is vanished, as before).
    """
    latest = max(markers, default=None)
    if latest is None or exit_code_text is None:
        return None
    restart, code = latest
    written = exit_code_text.strip()
    if not written.isdigit() or int(written) != code:
        return None
    return state_from_native(
        job_id,
        "COMPLETED" if code == 0 else "FAILED",
        source="end marker",
        exit_code=code,
        signal=0,
        reason=f"end marker of run {restart} and exit-code file; squeue and sacct no longer know the job",
    )


def _unreadable(command: str, line: str, expected: str) -> RemoteCommandError:
    """Return the error for a reply line that cannot be read: it names the command, the text and what was expected."""
    return RemoteCommandError(
        f"{command} printed {line.strip()[:300]!r}, which this provider cannot read (expected {expected}); "
        "nothing is guessed from it: report the SLURM release and this line to the provider maintainers"
    )


def _row(line: str, columns: tuple[str, ...], command: str) -> dict[str, str] | None:
    """One ``|``-separated row as a dict (a ``|`` inside the job name is kept in the name).

    ``None`` for a line that is not a job row: blank, a step row (``12.batch``, ``12.0``), or no job
    id first (e.g. noise from shell start-up files, a header).

    :raises RemoteCommandError: for a job id followed by too few columns.
    """
    parts = line.split("|")
    if not _JOB_ID.fullmatch(parts[0].strip()):
        return None
    extra = len(parts) - len(columns)
    if extra < 0:
        raise _unreadable(command, line, f"{len(columns)} '|'-separated columns: {'|'.join(columns)}")
    name_at = columns.index("name")
    parts[name_at : name_at + extra + 1] = ["|".join(parts[name_at : name_at + extra + 1])]
    return dict(zip(columns, (part.strip() for part in parts), strict=True))


def _exit_status(text: str, line: str) -> tuple[int | None, int | None]:
    """Read sacct's ``ExitCode`` as ``(status, signal)``; ``(None, None)`` when blank (accounting has none).

    :raises RemoteCommandError: for text that is not ``status[:signal]``.
    """
    if not text.strip():
        return None, None
    match = _EXIT_CODE.fullmatch(text.strip())
    if match is None:
        raise _unreadable("sacct", line, "ExitCode as status:signal, e.g. 0:0 or 137:0")
    signal = match.group(2)
    return int(match.group(1)), None if signal is None else int(signal)


def parse_squeue(text: str) -> dict[str, JobState]:
    """Parse ``squeue -h -o SQUEUE_FORMAT`` output (any number of jobs).

    A line printed again unchanged (most of them, poll after poll) gives the same :class:`JobState`
    object without being parsed again (:func:`_squeue_line` keeps the last :data:`SQUEUE_LINE_CACHE`).

    :param text: squeue's stdout.
    :returns: job id -> state; the last row wins when an id repeats.
    :raises RemoteCommandError: for a job row that cannot be read (see :func:`_row`).
    """
    states = {}
    for line in text.splitlines():
        state = _squeue_line(line)
        if state is not None:
            states[state.job_id] = state
    return states


#: squeue lines whose parsed state is kept (more than the shared poller's 5000 watched jobs).
SQUEUE_LINE_CACHE = 8192


@functools.lru_cache(maxsize=SQUEUE_LINE_CACHE)
def _squeue_line(line: str) -> JobState | None:
    """Return the state one squeue line gives (``None`` for a line that is no job row); states are immutable."""
    row = _row(line, _SQUEUE_COLUMNS, "squeue")
    if row is None:
        return None
    return state_from_native(
        row["job_id"],
        row["state"],
        source="squeue",
        reason=row["reason"],
        node_list=row["node_list"],
        start=row["start"],
        end=row["end"],
        name=row["name"],
    )


def parse_sacct(text: str, *, count_runs: bool = False) -> dict[str, JobState]:
    """Parse ``sacct -X -n -P -o SACCT_FIELDS`` output (any number of jobs).

    With ``-D`` (or a requeued job's history) an id repeats; the last row, the newest
    incarnation, wins. Step rows (``12.batch``, ``12.extern``, ``12.0``) are ignored. With ``-D``
    every run of a requeued job has its row: ``count_runs`` sets each state's :attr:`JobState.run`
    to the number of rows before its own (the run the newest row is).

    ``ExitCode`` is kept as printed. A status above 128 is a signal: SLURM 25.11 and later print it as
    is (``137:0`` for a program killed by SIGKILL), older releases subtract 128 (``9:0``). Nothing in
    this provider decides on a status above 124, so both forms classify the same.

    :param text: sacct's stdout.
    :param count_runs: the output is ``sacct -D``'s: count the runs.
    :returns: job id -> state.
    :raises RemoteCommandError: for a job row that cannot be read (too few columns, an ``ExitCode``
        that is not ``status:signal``).
    """
    states: dict[str, JobState] = {}
    rows: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        row = _row(line, _SACCT_COLUMNS, "sacct")
        if row is None:
            continue
        exit_code, signal = _exit_status(row["exit_code"], line)
        rows[row["job_id"]] += 1
        states[row["job_id"]] = state_from_native(
            row["job_id"],
            row["state"],
            source="sacct",
            exit_code=exit_code,
            signal=signal,
            reason=row["reason"],
            node_list=row["node_list"],
            start=row["start"],
            end=row["end"],
            name=row["name"],
        )
    if count_runs:
        return {job_id: dataclasses.replace(state, run=rows[job_id] - 1) for job_id, state in states.items()}
    return states


def merge_states(squeue: Mapping[str, JobState], sacct: Mapping[str, JobState]) -> dict[str, JobState]:
    """Combine one poll's squeue and sacct results.

    squeue is authoritative while a job is live (sacct lags by seconds and shows a placeholder
    PENDING row at first). sacct's row is used for jobs squeue no longer knows, and when both
    report a terminal state of the same run (sacct carries the exit code). A requeued job keeps its
    id: while accounting still shows an earlier run's end (started before the run squeue shows ended),
    squeue's end stands alone, without an exit code, and the job is asked about again.

    :param squeue: result of :func:`parse_squeue`.
    :param sacct: result of :func:`parse_sacct`.
    :returns: job id -> state, squeue's ids first.
    """
    merged = dict(squeue)
    for job_id, state in sacct.items():
        live = merged.get(job_id)
        if live is None or (live.is_terminal and state.is_terminal and not _earlier_run(state, live)):
            merged[job_id] = state
    return merged


def _earlier_run(row: JobState, live: JobState) -> bool:
    """Whether accounting's ``row`` started before the run squeue shows (ISO times, both known)."""
    return row.start is not None and live.start is not None and row.start < live.start


def parse_sbatch_reply(stdout: str) -> tuple[str, str | None] | None:
    """Read the job id from ``sbatch --parsable`` output.

    Only the last non-empty line counts (site wrappers may print banners before it); it must be
    ``<id>`` or ``<id>;<cluster>``. Anything else is ambiguous: the caller reconciles by job name
    instead of guessing or resubmitting.

    :param stdout: sbatch's stdout.
    :returns: ``(job_id, cluster or None)``, or ``None`` when the reply holds no job id.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    match = _SBATCH_REPLY.fullmatch(lines[-1]) if lines else None
    return None if match is None else (match.group(1), match.group(2))


@dataclass(frozen=True)
class NameLookup:
    """What ``commands.jobs_by_name`` found.

    :param job_ids: ids of the user's jobs of that name, first seen first.
    :param foreign: ``(id, owner)`` of rows another user owns (never acted on; kept as evidence).
    """

    job_ids: tuple[str, ...]
    foreign: tuple[tuple[str, str], ...] = ()


_LOOKUP_RC_RE = re.compile(r"#rc (squeue|sacct) (\d+)")


def parse_jobs_by_name(stdout: str, user: str, stderr: str = "") -> NameLookup:
    """Read ``commands.jobs_by_name`` output; only rows owned by ``user`` count.

    :raises JobLookupError: when either query failed or its status line is missing (the connection
        was cut): that says nothing about whether the job exists.
    """
    rows: list[tuple[str, str]] = []
    status: dict[str, int] = {}
    for line in stdout.splitlines():
        marker = _LOOKUP_RC_RE.fullmatch(line.strip())
        if marker:
            status[marker.group(1)] = int(marker.group(2))
            continue
        job_id, _, owner = line.strip().partition("|")
        if job_id and _JOB_ID.fullmatch(job_id):
            rows.append((job_id, owner.strip()))
    failed = [f"{tool} exited {status[tool]}" for tool in ("squeue", "sacct") if status.get(tool, 0) != 0]
    failed += [f"{tool} gave no answer" for tool in ("squeue", "sacct") if tool not in status]
    if failed:
        evidence = "; ".join(failed) + (f": {stderr.strip()[-500:]}" if stderr.strip() else "")
        raise JobLookupError(
            f"looking up jobs by name failed ({evidence}); that is not the same as 'no such job', so nothing is "
            "submitted: check that slurmctld and slurmdbd answer (scontrol ping, sacct) and retry",
            evidence=evidence,
        )
    mine = tuple(dict.fromkeys(job_id for job_id, owner in rows if owner == user))
    foreign = tuple(dict.fromkeys((job_id, owner) for job_id, owner in rows if owner != user))
    return NameLookup(mine, foreign)


_TOPOLOGY_WAIT = (
    "no topology unit (switch, block) has enough free nodes together yet; it starts when one has, or ask for fewer "
    "nodes"
)
#: What a user can do about the common pending reasons (``squeue`` ``%r``), by reason prefix.
PENDING_HINTS: Mapping[str, str] = MappingProxyType(
    {
        "Priority": "other jobs are ahead in the queue; it starts when its priority is highest (no action needed)",
        "Resources": "waiting for enough free nodes/GPUs; fewer GPUs or another partition may start sooner",
        "QOSGrpMemLimit": "the QOS's group memory limit is in use; ask for less memory or wait for your group's jobs",
        "QOSGrp": "a QOS group limit (GPUs, CPUs, jobs) is reached; wait for your group's jobs or use another QOS",
        "QOSMax": "the request exceeds a per-job limit of the QOS; lower it or use another QOS",
        "AssocGrp": "your account's group limit is reached; wait for its jobs or ask the admins",
        "ReqNodeNotAvail": "a node the job needs is down, drained or reserved; drop node constraints or wait",
        "PartitionTimeLimit": "time_hours exceeds the partition's limit and the job can never start; cancel it and "
        "lower time_hours or pick a longer partition",
        "PartitionNodeLimit": "the job asks for more nodes than the partition allows; cancel it and ask for fewer",
        "BadConstraints": "no node of the partition can hold what the job asks for on one node (CPUs x tasks per node, "
        "memory, GPUs or features) and it can never start; cancel it and ask for at most what a node has "
        "(cpus_per_task left out takes it from the node shape), or pick a partition with larger nodes",
        "PartitionDown": "the partition is down: the job starts when the site brings it up; cancel it and pick "
        "another partition not to wait",
        "PartitionInactive": "the partition is inactive and starts no job; cancel it and pick another partition",
        "Reservation": "waiting for its reservation to start",
        "BeginTime": "held until its begin time (a requeued job waits about two minutes)",
        "JobHeldUser": "held by its owner; `scontrol release <id>` lets it start",
        "JobHeldAdmin": "held by an administrator; ask them",
        "Dependency": "waiting for the jobs it depends on",
        "DependencyNeverSatisfied": "its dependency can never be satisfied; cancel it",
        # SLURM 26.05 names the topology constraint where older releases said Resources.
        "Required nodes lack available resources": _TOPOLOGY_WAIT,
        "Required nodes do not fit topology": "the nodes it requires do not fit the cluster's topology; drop the node "
        "constraints",
        "No suitable topology unit found": _TOPOLOGY_WAIT,
        "Insufficient resources in topology unit": _TOPOLOGY_WAIT,
        "Weight-based selection could not satisfy": _TOPOLOGY_WAIT,
        "Exceeded maximum node limit during topology allocation": "the job asks for more nodes than one topology "
        "unit may give; ask for fewer nodes",
        "No available nodes in topology": _TOPOLOGY_WAIT,
    }
)


def pending_hint(reason: str | None) -> str | None:
    """Explain a pending reason (``None`` for a reason without a hint); the longest matching prefix wins.

    Any text is accepted: a reason a newer SLURM invents (26.05 names topology constraints, e.g.
    ``No suitable topology unit found``) has no hint unless one is listed, and never an error.
    """
    if not reason:
        return None
    matches = [key for key in PENDING_HINTS if reason.startswith(key)]
    return PENDING_HINTS[max(matches, key=len)] if matches else None
