"""Trainings longer than one allocation: slices, checkpoints and the rules that continue or stop them.

A training submitted with ``max_continuations=N`` runs as a chain of SLURM jobs ("slices") of the
same batch script, results directory, spec, secrets and resources. A slice that ends TIMEOUT (or
PREEMPTED when SLURM did not requeue it) and wrote a new checkpoint during its run is followed by
the next slice; the program resumes from its checkpoints (TAO's trainers do by themselves).

What the batch script does for a slice (rendered from :class:`SliceScript`): it asks SLURM for
``--signal=B:USR1@<grace>``, traps it outside the container and leaves ``<slices>/<id>.ending``
(forwarding a signal to the program only when the user named one it handles), leaves
``<slices>/<id>.start`` when it starts (the "newer than" reference for checkpoints), and exports
:data:`SLICE_ENV` and :data:`LATEST_CHECKPOINT_ENV` to the program. ``<id>`` is
``<SLURM job id>-<restart count>``.

Names: slice 1 is the submit task's job (the training's name, ``tao-<dag>.<task>-<digest>``); slice
``N`` is ``<that name>-s<N>`` (:func:`slice_job_id`), so ``squeue`` shows the training with its slice
number, and a retried sensor finds the slice an earlier try started by that name.

Pure: no I/O. The lifecycle layer runs the commands and decides with :func:`continuation_verdict`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao_slurm.core.records import check_job_id
from airflow_provider_tao_slurm.core.resources import format_duration
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.core.storage import display_value
from airflow_provider_tao_slurm.exceptions import ValidationError

#: TAO's checkpoint file names (PyTorch ``.pth``, Lightning ``.ckpt``, TF ``.tlt``/``.hdf5``).
DEFAULT_CHECKPOINT_GLOBS = ("*.pth", "*.ckpt", "*.tlt", "*.hdf5")
#: The slice number (1 for the first job of the chain), exported to the program.
SLICE_ENV = "TAO_SLURM_SLICE"
#: The newest checkpoint under the results directory when the slice started ("" when none).
LATEST_CHECKPOINT_ENV = "TAO_SLURM_LATEST_CHECKPOINT"
#: The signal SLURM sends the batch shell before the slice's time limit.
SLICE_SIGNAL = "USR1"
#: Signals a program may ask to be sent before the limit (``checkpoint_signal``): srun turns a TERM or HUP it
#: receives into killing the step, and a background srun ignores INT, so only the user signals pass.
FORWARDABLE_SIGNALS = frozenset({"USR1", "USR2"})
#: Bounds of the warning before the limit, in seconds (SLURM may send it up to 60 s early).
MIN_GRACE_S = 10
MAX_GRACE_S = 600
#: ``timeout``'s exit status when it stopped the program (the batch script runs it with the program timeout).
PROGRAM_TIMEOUT_EXIT = 124
_GLOB_RE = re.compile(r"[A-Za-z0-9_.*?\[\]-]+")
_MAX_CONTINUATIONS = 1000


@dataclass(frozen=True)
class SliceScript:
    """What a batch script needs to run as one slice of a chain.

    :param slices_dir: where the script leaves ``<id>.start`` and ``<id>.ending`` (under the job dir).
    :param grace_seconds: ``--signal=B:USR1@<grace_seconds>``.
    :param results_dir: the training's results directory, searched for the latest checkpoint.
    :param checkpoint_globs: the checkpoint file name patterns (for the latest-checkpoint variable).
    :param checkpoint_signal: a signal to forward to the program at the warning, or ``None``.
    :param stop_at_timeout: the program runs under its own timeout (``timeout_hours`` was given), which
        ends the slice before SLURM's limit (exit 124, continued as TIMEOUT is); ``False`` (the default):
        the slice runs until SLURM's limit.
    :param partition_limit: the training names several partitions whose limits differ (the earliest
        start, :func:`~airflow_provider_tao_slurm.core.partitions.slice_hours`): the script asks no
        ``--time``, so each slice takes the limit of the partition it starts on, and its batch shell lowers
        a longer one to this slice length (``sbatch --time`` form, :func:`cap_time_limit`); ``None``: the
        script asks ``--time`` as any job does.
    :param grace_from_limit: with ``partition_limit``, the warning fits the slice the partition gives (a
        tenth of its limit, :data:`MIN_GRACE_S` to :data:`MAX_GRACE_S`, as :func:`grace_seconds`):
        ``grace_seconds`` is then the longest slice's, when SLURM warns, and the batch shell of a shorter
        slice defers that warning to its own time (a preemption's warning is never deferred).
    """

    slices_dir: str
    grace_seconds: int
    results_dir: str
    checkpoint_globs: tuple[str, ...] = DEFAULT_CHECKPOINT_GLOBS
    checkpoint_signal: str | None = None
    stop_at_timeout: bool = False
    partition_limit: str | None = None
    grace_from_limit: bool = False


def cap_time_limit(slurm_time: str) -> str:
    """Return the batch shell's command that lowers its job's time limit to ``slurm_time`` (when longer).

    A user may lower the limit of a running job, never raise it: on a partition whose limit is already
    ``slurm_time`` or shorter, ``scontrol`` refuses and that shorter limit holds. SLURM's warning signal
    (``--signal``) follows the new end. When the update fails and the limit slurmctld shows is longer (or
    slurmctld cannot say), the slice script keeps the length itself (``TAO_SLURM_OWN_LIMIT``): its own warning,
    then the program's ``timeout`` at the slice's end (exit 124, continued as a TIMEOUT is).
    """
    return f'scontrol update "JobId=${{SLURM_JOB_ID}}" {quote(f"TimeLimit={slurm_time}")}'


def check_max_continuations(value: object) -> int:
    """``max_continuations``: a whole number from 0 (no continuation, TIMEOUT is an ERROR).

    :raises ValidationError: naming the value and the fix.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_CONTINUATIONS:
        raise ValidationError(
            f"max_continuations={display_value(value)} must be a whole number from 0 (TIMEOUT is an error) to "
            f"{_MAX_CONTINUATIONS}, e.g. max_continuations=5 for up to six slices"
        )
    return value


def check_checkpoint_globs(value: object) -> tuple[str, ...]:
    """``checkpoint_glob``: a file name pattern or a list of them (``None``: TAO's checkpoint names).

    :raises ValidationError: for an empty list or a pattern with a path or characters a name glob has not.
    """
    if value is None:
        return DEFAULT_CHECKPOINT_GLOBS
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else None
    if not items or not all(isinstance(item, str) and _GLOB_RE.fullmatch(item) for item in items):
        raise ValidationError(
            f"checkpoint_glob={display_value(value)} must be a file name pattern or a list of them, such as "
            "'*.pth' or ['*.pth', '*.ckpt'] (letters, digits, _ . - and * ? [ ]; no directory)"
        )
    return tuple(dict.fromkeys(str(item) for item in items))


def check_checkpoint_signal(value: object) -> str | None:
    """``checkpoint_signal``: a signal the program handles, forwarded before the limit (``None``: none).

    :raises ValidationError: for a signal that is not one of :data:`FORWARDABLE_SIGNALS`.
    """
    if value is None:
        return None
    name = value.upper().removeprefix("SIG") if isinstance(value, str) else None
    if name not in FORWARDABLE_SIGNALS:
        raise ValidationError(
            f"checkpoint_signal={display_value(value)} must be one of {', '.join(sorted(FORWARDABLE_SIGNALS))} "
            "(a signal your program handles by saving a checkpoint; srun kills the step on TERM and HUP and a "
            "background srun ignores INT), or None"
        )
    return name


def grace_seconds(time_hours: float, override: object = None) -> int:
    """How long before a slice's limit the batch shell is warned: a tenth of the slice, 10 s to 10 min.

    :param override: ``signal_grace_seconds`` given by the user (checked, not clamped).
    :raises ValidationError: for an override that is not a whole number of seconds shorter than the slice.
    """
    slice_s = round(time_hours * 3600)
    if override is None:
        return max(MIN_GRACE_S, min(MAX_GRACE_S, slice_s // 10))
    if isinstance(override, bool) or not isinstance(override, int) or not 1 <= override < max(slice_s, 2):
        raise ValidationError(
            f"signal_grace_seconds={display_value(override)} must be a whole number of seconds from 1 to less than "
            f"the slice ({slice_s} s)"
        )
    return override


def slice_marker(slurm_job_id: str, restart: int, kind: str) -> str:
    """``<slurm job id>-<restart>.<kind>``: the file a slice leaves in the slices directory (start, ending)."""
    return f"{slurm_job_id}-{restart}.{kind}"


def slice_job_id(first_job_id: str, slice_number: int) -> str:
    """Name slice ``slice_number`` of the training whose first job is ``first_job_id`` (its job id and SLURM name).

    Slice 1 keeps the submit task's id; slice ``N`` (from 2) is ``<first_job_id>-s<N>``: the training's
    name with the slice number, the same on every try (the adoption by name finds it), one job per name.

    :raises ValidationError: for a slice number below 2 or a first id that is not a job id.
    """
    if isinstance(slice_number, bool) or not isinstance(slice_number, int) or slice_number < 2:
        raise ValidationError(f"slice number {slice_number!r} must be a whole number from 2 (slice 1 is the first job)")
    return check_job_id(f"{check_job_id(first_job_id, 'first job id')}-s{slice_number}", "slice job id")


def spec_checkpoint_interval(spec: Mapping[str, Any] | None) -> str | None:
    """Return the checkpoint interval a TAO spec sets (``train.checkpoint_interval`` and its unit), for messages.

    :returns: e.g. ``"5 epoch"``, ``"2000 step"``, ``"5"`` without a unit; ``None`` when the spec sets none.
    """
    train = spec.get("train") if isinstance(spec, Mapping) else None
    value = train.get("checkpoint_interval") if isinstance(train, Mapping) else None
    if value is None or isinstance(value, bool) or not isinstance(value, int | float | str) or str(value) == "":
        return None
    unit = train.get("checkpoint_interval_unit") if isinstance(train, Mapping) else None
    return f"{value} {unit}" if isinstance(unit, str) and unit else str(value)


def find_names(globs: Sequence[str]) -> list[str]:
    """``find`` arguments matching any of ``globs``: ``-name a -o -name b`` (inside ``(`` ``)``)."""
    return [word for glob in globs for word in ("-o", "-name", glob)][1:]


def new_checkpoints(results_dir: str, slices_dir: str, slurm_job_id: str, globs: Sequence[str]) -> str:
    """List the checkpoints under ``results_dir`` newer than the slice's start marker, newest last.

    The marker is that of the job's last run (the highest restart count: a requeued job starts
    again). Prints ``START`` when there is one (``NOSTART`` when not: the slice never started its
    script), ``WARNED`` when that run also left its ending marker (SLURM's warning before the limit
    arrived), then one ``<mtime> <path>`` line per checkpoint written after the start. A ``find``
    that fails exits non-zero: a failed read is never "no checkpoint".

    :param results_dir: the results directory (absolute).
    :param slices_dir: the directory of the slice markers (absolute).
    :param slurm_job_id: the slice's SLURM job id.
    :param globs: file name patterns (:func:`check_checkpoint_globs`).
    :returns: the command line; read it with :func:`parse_new_checkpoints`.
    :raises ValidationError: for a SLURM job id that is not a number.
    """
    if not slurm_job_id.isdigit():
        raise ValidationError(f"SLURM job id {slurm_job_id!r} is not a number")
    find = join(["find", results_dir, "-type", "f", "(", *find_names(globs), ")", "-newer"])
    return (
        f's=; b=-1; for f in {quote(slices_dir)}/{slurm_job_id}-*.start; do [ -e "$f" ] || continue; '
        'r=${f##*-}; r=${r%.start}; case $r in ""|*[!0-9]*) continue;; esac; '
        'if [ "$r" -gt "$b" ]; then b=$r; s=$f; fi; done; '
        'if [ -z "$s" ]; then echo NOSTART; exit 0; fi; echo START; '
        'if [ -e "${s%.start}.ending" ]; then echo WARNED; fi; '
        f"out=$({find} \"$s\" -printf '%T@ %p\\n') || exit $?; printf '%s\\n' \"$out\" | sort -n"
    )


@dataclass(frozen=True)
class SliceEnd:
    """What a slice left behind, from :func:`new_checkpoints`.

    :param started: its batch script started (left its start marker).
    :param warned: the batch shell got SLURM's warning before the limit (left its ending marker).
    :param checkpoints: the checkpoints written during the slice, oldest first.
    """

    started: bool
    warned: bool
    checkpoints: list[str]


def parse_new_checkpoints(stdout: str) -> SliceEnd:
    """Read :func:`new_checkpoints`' output."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    started = bool(lines) and lines[0] == "START"
    rest = lines[1:] if started else []
    warned = bool(rest) and rest[0] == "WARNED"
    paths = [line.split(" ", 1)[1] for line in rest[1 if warned else 0 :] if " " in line]
    return SliceEnd(started, warned, paths)


def ends_slice(native: str, exit_code: int | None) -> bool:
    """Whether a job's end is a slice's time running out (continued when the chain allows it).

    TIMEOUT (SLURM's limit), PREEMPTED (a terminal one: SLURM did not requeue the job), and exit code
    124 of a FAILED job (the program's own ``timeout`` stopped it before the limit).
    """
    return native in ("TIMEOUT", "PREEMPTED") or (native == "FAILED" and exit_code == PROGRAM_TIMEOUT_EXIT)


@dataclass(frozen=True)
class Verdict:
    """Whether a slice's end continues the chain.

    :param go_on: submit the next slice.
    :param reason: the message for the task log and the record (the stop rule's fix when not).
    """

    go_on: bool
    reason: str


def continuation_verdict(
    *,
    native: str,
    slice_number: int,
    max_continuations: int,
    time_hours: float,
    checkpoints: Sequence[str],
    last_checkpoint: str | None,
    elapsed_seconds: float | None = None,
    checkpoint_interval: str | None = None,
    listings: int = 1,
    listed_over_seconds: float = 0.0,
) -> Verdict:
    """Apply the stop rules of a chain, once a slice ended ``native`` (TIMEOUT, or PREEMPTED not requeued).

    :param slice_number: the slice that ended (1 for the first).
    :param checkpoints: checkpoints written during the slice (oldest first), from the last listing.
    :param last_checkpoint: the newest checkpoint of any earlier slice, for the message.
    :param elapsed_seconds: how long the slice ran (accounting), for the message; ``None`` when unknown.
    :param checkpoint_interval: the spec's checkpoint interval (:func:`spec_checkpoint_interval`), or ``None``.
    :param listings: how many times the checkpoints were listed before this verdict (shared storage lags).
    :param listed_over_seconds: the seconds those listings spanned.
    """
    if not checkpoints:
        return Verdict(False, _no_checkpoint(native, slice_number, time_hours, last_checkpoint, elapsed_seconds,
                                             checkpoint_interval, listings, listed_over_seconds))  # fmt: skip
    if slice_number > max_continuations:
        return Verdict(
            False,
            f"slice {slice_number} ended {native} and max_continuations={max_continuations} is used up; the last "
            f"checkpoint is {checkpoints[-1]}: raise max_continuations, or resume from it by hand",
        )
    return Verdict(
        True,
        f"slice {slice_number} ended {native} after writing {len(checkpoints)} checkpoint(s); "
        f"slice {slice_number + 1} of at most {max_continuations + 1} resumes from {checkpoints[-1]}",
    )


def _no_checkpoint(
    native: str,
    slice_number: int,
    time_hours: float,
    last_checkpoint: str | None,
    elapsed_seconds: float | None,
    checkpoint_interval: str | None,
    listings: int,
    listed_over_seconds: float,
) -> str:
    """Write the stop message of a slice without a checkpoint: what it saw (slice length, interval), the fix."""
    hours = format_duration(time_hours)
    ran = f"ran {format_duration(elapsed_seconds / 3600)} of its {hours}" if elapsed_seconds is not None else ""
    interval = (
        f"the spec's checkpoint interval is {checkpoint_interval}"
        if checkpoint_interval
        else "the spec sets no checkpoint interval"
    )
    seen = f"no new checkpoint in {listings} listing(s)" + (
        f" over {format_duration(listed_over_seconds / 3600)}" if listings > 1 else ""
    )
    last = f"; the last checkpoint is {last_checkpoint}" if last_checkpoint else ""
    if native == "PREEMPTED":
        return (
            f"the {hours} slice {slice_number} was preempted before its first checkpoint"
            + (f" ({ran})" if ran else "")
            + f"; {seen}, {interval}: nothing newer to resume from, so the chain stops. Run it where it is not "
            "preempted (requeue=True lets SLURM rerun a preempted job itself), then clear the task" + last
        )
    return (
        f"the {hours} slice {slice_number} ended {native} and wrote no checkpoint: lower the training's checkpoint "
        f"interval (TAO: train.checkpoint_interval; {interval}) so it saves within a slice"
        + (f" (this one {ran})" if ran else "")
        + f", or raise time_hours; {seen}{last}"
    )
