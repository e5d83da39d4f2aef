"""Image conversion to ``.sqsh``: the conversion batch script and the lock that makes it happen once.

A registry image is converted by a batch job on a CPU partition (template
``enroot_import.sbatch.j2``): ``enroot import`` into ``<target>.tmp-<job id>`` with node-local,
job-unique temp paths, then a check of the squashfs magic and size, then an atomic rename.

Concurrent imports of one image convert once thanks to a lock directory on shared storage,
``<target>.lock``, created with ``mkdir`` (atomic, also on Lustre). It holds ``owner`` (a random
token of the run that created it, also part of the conversion job's name
``tao-enroot-<token>``) and, once submitted, ``job`` (the SLURM job id). Whoever finds the lock
held adopts that job id and waits for the same job. A lock is only ever removed by a command that
first checks its owner token, so a run never removes a lock it did not judge stale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from airflow_provider_tao_slurm.core.commands import SQUASHFS_MAGIC_HEX
from airflow_provider_tao_slurm.core.images import MIN_SQSH_BYTES, ImageRef
from airflow_provider_tao_slurm.core.resources import hours_to_slurm_time
from airflow_provider_tao_slurm.core.shell import quote, storage_now
from airflow_provider_tao_slurm.core.storage import display_value, resolve_cluster_path
from airflow_provider_tao_slurm.core.templates import check_sbatch_option, render_template
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, ResourceError, ValidationError

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.states import JobState

CONVERSION_TEMPLATE = "enroot_import.sbatch.j2"
#: Conversion jobs are named ``tao-enroot-<owner token>``.
CONVERSION_JOB_PREFIX = "tao-enroot-"
#: A lock without a job id is being submitted for at most this long; after it, it is stale.
LOCK_SUBMIT_GRACE_S = 300
#: A lock whose job neither squeue nor sacct knows is trusted this long (sacct lags after submit).
LOCK_NOT_FOUND_GRACE_S = 300

_OWNER_RE = re.compile(r"[0-9a-f]{16}")
_JOB_ID_RE = re.compile(r"[0-9]+")
_SBATCH_WORD_RE = re.compile(r"[A-Za-z0-9_.-]+")
_LOCK_RE = re.compile(r"LOCK (ACQUIRED|HELD (-?[0-9]+) (\S+) (\S+))")


def _owner(owner: str) -> str:
    if not isinstance(owner, str) or not _OWNER_RE.fullmatch(owner):
        raise ValidationError(
            f"lock owner {display_value(owner)} must be 16 lower-case hex digits (secrets.token_hex(8))"
        )
    return owner


def conversion_job_name(owner: str) -> str:
    """Return the SLURM job name of the conversion started by lock owner ``owner``.

    :param owner: 16 lower-case hex digits.
    :returns: ``tao-enroot-<owner>``.
    :raises ValidationError: for any other owner token.
    """
    return CONVERSION_JOB_PREFIX + _owner(owner)


def owner_of_job(job_name: str) -> str:
    """Return the lock owner token inside a conversion job name (inverse of :func:`conversion_job_name`).

    :raises ValidationError: when ``job_name`` is not a conversion job name.
    """
    if not isinstance(job_name, str) or not job_name.startswith(CONVERSION_JOB_PREFIX):
        raise ValidationError(
            f"{display_value(job_name)} is not a conversion job name ({CONVERSION_JOB_PREFIX}<token>)"
        )
    return _owner(job_name[len(CONVERSION_JOB_PREFIX) :])


def sqsh_target(path: str, *, param: str = "sqsh_path") -> str:
    """Validate the absolute ``.sqsh`` path a conversion writes.

    :param path: an absolute path (or ``lustre://`` / ``slurm://`` URI) ending in ``.sqsh``.
    :param param: the parameter name used in errors.
    :returns: the normalised path.
    :raises StoragePathError: for a path that is not a safe absolute cluster path.
    :raises ValidationError: when it does not end in ``.sqsh``.
    """
    resolved = resolve_cluster_path(path, param=param)
    if not resolved.endswith(".sqsh") or resolved.rsplit("/", 1)[1] == ".sqsh":
        raise ValidationError(f"{param}={display_value(path)} must name a file ending in .sqsh, e.g. /lustre/x.sqsh")
    return resolved


def lock_dir(target: str) -> str:
    """Return the lock directory of a conversion target: ``<target>.lock``."""
    return sqsh_target(target, param="target") + ".lock"


@dataclass(frozen=True, kw_only=True)
class ConversionJob:
    """Inputs of one conversion batch script; :func:`render_conversion_script` validates them.

    :param job_name: ``tao-enroot-<owner>`` (see :func:`conversion_job_name`).
    :param image: the registry image to convert.
    :param target: absolute ``.sqsh`` path on shared storage.
    :param partition: the CPU partition.
    :param account: the SLURM account, or ``None`` for the user's default.
    :param cpus: CPUs of the one task.
    :param mem_mb: memory in MB (enroot downloads layers in parallel and needs it).
    :param time_minutes: wall-time limit in minutes.
    :param log_dir: absolute base log directory; logs go to ``<log_dir>/%x-%j/main.out|err``.
    :param sbatch_extra: the site's ``#SBATCH`` options (QOS, reservation, ...) from ``resources.site_options``.
    """

    job_name: str
    image: ImageRef
    target: str
    partition: str
    account: str | None
    cpus: int
    mem_mb: int
    time_minutes: int
    log_dir: str
    sbatch_extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConversionPlan:
    """Where and how one image is converted, decided before anything is submitted.

    :param image: the registry image.
    :param target: absolute ``.sqsh`` path on shared storage.
    :param lock: the target's lock directory (:func:`lock_dir`).
    :param partition: the CPU partition(s), comma-separated, or ``None`` before they are chosen.
    :param account: the SLURM account, or ``None`` for the user's default.
    :param results_dir: the connection's shared base directory (scripts and logs go under it).
    """

    image: ImageRef
    target: str
    lock: str
    partition: str | None
    account: str | None
    results_dir: str


@dataclass(frozen=True)
class SubmittedConversion:
    """A conversion job this run submitted or adopted from the lock's owner.

    :param job_id: the SLURM job id.
    :param job_name: ``tao-enroot-<owner>``.
    :param submitted_at: when it was submitted (epoch seconds; an adopted job's age is subtracted).
    :param adopted: another run submitted it (and owns it): this run never cancels it.
    """

    job_id: str
    job_name: str
    submitted_at: float
    adopted: bool = False


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ResourceError(f"{name}={display_value(value)} must be a whole number of at least 1")
    return value


def _sbatch_word(name: str, value: str) -> str:
    if not isinstance(value, str) or not _SBATCH_WORD_RE.fullmatch(value) or value.startswith("-"):
        raise ValidationError(
            f"{name}={display_value(value)} cannot go on an #SBATCH line; use letters, digits, '_', '.' and '-'"
        )
    return value


def _extra(option: str) -> str:
    check_sbatch_option(option)
    return option


def render_conversion_script(job: ConversionJob) -> str:
    """Render the conversion batch script.

    :param job: the conversion's inputs.
    :returns: the script text.
    :raises ValidationError: (or a subclass) for any unsafe or impossible value.
    :raises TemplateRenderError: if the template cannot be rendered.
    """
    owner_of_job(job.job_name)
    if job.image.kind != "registry":
        raise ValidationError(
            f"image {display_value(job.image.raw)} is already a .sqsh file; there is nothing to convert"
        )
    log_dir = resolve_cluster_path(job.log_dir, param="log_dir")
    if log_dir != job.log_dir:
        raise ValidationError(f"log_dir={display_value(job.log_dir)} is not normalised; use {log_dir!r}")
    target = sqsh_target(job.target, param="target")
    minutes = _positive("time_minutes", job.time_minutes)
    values: dict[str, object] = {
        "JOB_NAME": job.job_name,
        "PARTITION": _sbatch_word("partition", job.partition),
        "ACCOUNT": "" if job.account is None else _sbatch_word("account", job.account),
        "CPUS": _positive("cpus", job.cpus),
        "MEM_MB": _positive("mem_mb", job.mem_mb),
        "TIME": hours_to_slurm_time(minutes / 60),
        "LOG_DIR": log_dir,
        "TARGET": quote(target),
        "SOURCE": quote(job.image.enroot_uri),
        "MAGIC_HEX": SQUASHFS_MAGIC_HEX,
        "MIN_BYTES": MIN_SQSH_BYTES,
        "SBATCH_EXTRA": [_extra(option) for option in job.sbatch_extra],
    }
    return render_template(CONVERSION_TEMPLATE, values)


# ------------------------------------------------------------------ the lock


@dataclass(frozen=True)
class LockState:
    """What :func:`acquire_lock` found.

    :param acquired: this run created the lock and owns it.
    :param age_seconds: seconds since the lock directory last changed (a file was added), when held.
    :param owner: the holder's owner token, ``None`` when not (yet) written or unreadable.
    :param job_id: the holder's conversion job id, ``None`` before it is recorded.
    """

    acquired: bool
    age_seconds: int = 0
    owner: str | None = None
    job_id: str | None = None


def acquire_lock(lock: str, owner: str) -> str:
    """Create the lock directory atomically (and its parent), or report who holds it.

    Prints ``LOCK ACQUIRED``, or ``LOCK HELD <age seconds> <owner|-> <job id|->``; read it with
    :func:`parse_lock`. Exits non-zero when the lock can be neither created nor found.

    :param lock: absolute lock directory, from :func:`lock_dir`.
    :param owner: this run's token (16 hex digits).
    :returns: the command line.
    """
    path = quote(_lock(lock))
    parent = quote(lock.rsplit("/", 1)[0] or "/")
    return (
        f"mkdir -p -- {parent} && if mkdir -- {path} 2>/dev/null; then "
        f"printf '%s\\n' {quote(_owner(owner))} > {path}/owner && echo 'LOCK ACQUIRED'; "
        f"elif [ -d {path} ]; then o=$(head -c 64 -- {path}/owner 2>/dev/null); "
        f"j=$(head -c 32 -- {path}/job 2>/dev/null); "
        "case $o in ''|*[!0-9a-f]*) o=-;; esac; case $j in ''|*[!0-9]*) j=-;; esac; "
        f"{storage_now(lock.rsplit('/', 1)[0] or '/')}; m=$(stat -c %Y -- {path} 2>/dev/null || echo $now); "
        'echo "LOCK HELD $((now - m)) $o $j"; '
        f"else echo 'cannot create the lock directory '{path} >&2; exit 1; fi"
    )


def parse_lock(stdout: str) -> LockState:
    """Parse :func:`acquire_lock` output (its last ``LOCK`` line).

    :raises RemoteCommandError: when there is no ``LOCK`` line.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.startswith("LOCK ")]
    match = _LOCK_RE.fullmatch(lines[-1]) if lines else None
    if match is None:
        raise RemoteCommandError(f"the lock command printed {stdout[-200:]!r} instead of a LOCK line; run it again")
    if match.group(1) == "ACQUIRED":
        return LockState(acquired=True)
    owner, job_id = match.group(3), match.group(4)
    return LockState(
        acquired=False,
        age_seconds=max(0, int(match.group(2))),
        owner=owner if _OWNER_RE.fullmatch(owner) else None,
        job_id=job_id if _JOB_ID_RE.fullmatch(job_id) else None,
    )


def record_lock_job(lock: str, owner: str, job_id: str) -> str:
    """Write the conversion's job id into the lock, only if ``owner`` still holds it.

    :returns: the command line; exit status 0 when written, non-zero when the lock is not ours.
    :raises ValidationError: for a bad owner token or job id.
    """
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise ValidationError(f"SLURM job id {display_value(job_id)} must be digits")
    path = quote(_lock(lock))
    temp = quote(f"{lock}/.job.{_owner(owner)}")
    return (
        f'[ "$(head -c 64 -- {path}/owner 2>/dev/null)" = {quote(owner)} ] && '
        f"printf '%s\\n' {quote(job_id)} > {temp} && mv -f -- {temp} {path}/job"
    )


def remove_lock(lock: str, owner: str | None) -> str:
    """Remove the lock if ``owner`` holds it; with ``owner=None`` only an empty lock directory goes.

    The lock is first renamed to ``<lock>.gone.<owner>`` (atomic), so a racing remover fails
    instead of removing a newer lock. A lock held by someone else is left alone (exit status 0).

    :returns: the command line; non-zero exit status when a matching lock could not be removed.
    """
    path = quote(_lock(lock))
    if owner is None:
        return f"rmdir -- {path} 2>/dev/null || true"
    gone = quote(f"{lock}.gone.{_owner(owner)}")
    return (
        f'if [ "$(head -c 64 -- {path}/owner 2>/dev/null)" = {quote(owner)} ]; then '
        f"mv -- {path} {gone} && rm -rf -- {gone}; fi"
    )


def _lock(lock: str) -> str:
    if not isinstance(lock, str) or not lock.endswith(".sqsh.lock"):
        raise ValidationError(f"lock {display_value(lock)} must be a .sqsh path followed by .lock (see lock_dir)")
    sqsh_target(lock[: -len(".lock")], param="lock")
    return lock


class LockAction(StrEnum):
    """What to do about a lock someone else holds."""

    ADOPT = "adopt"
    """Its conversion job is queued or running (or just submitted): wait for that job."""
    WAIT = "wait"
    """Its owner is still submitting: look again in a moment."""
    FINISHED = "finished"
    """Its job is over: check the target again; remove the lock before converting."""
    BREAK = "break"
    """It is stale (its owner died before submitting, or its job vanished): remove it."""


def held_lock_action(
    lock: LockState,
    job: JobState | None,
    *,
    submit_grace_s: float = LOCK_SUBMIT_GRACE_S,
    not_found_grace_s: float = LOCK_NOT_FOUND_GRACE_S,
) -> LockAction:
    """Decide what to do about a held lock.

    :param lock: the lock as :func:`parse_lock` read it (not acquired).
    :param job: the state of ``lock.job_id``, ``None`` when unknown or not recorded yet.
    :param submit_grace_s: how long a lock may lack its owner or job id before it is stale.
    :param not_found_grace_s: how long a recorded job may be unknown to SLURM before the lock is stale.
    :returns: the action.
    """
    if lock.owner is None or lock.job_id is None:
        return LockAction.WAIT if lock.age_seconds < submit_grace_s else LockAction.BREAK
    if job is None:
        return LockAction.ADOPT if lock.age_seconds < not_found_grace_s else LockAction.BREAK
    return LockAction.FINISHED if job.is_terminal else LockAction.ADOPT
