"""End markers: the empty files a batch script's EXIT trap leaves when the script ends by itself.

One command lists the new markers of many ends directories; the shared poller reads them instead of
asking the scheduler about every job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_provider_tao_slurm.core.commands.values import _absolute, _absolute_all
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import ValidationError

#: An end marker's name: ``<slurm job id>-<restart count>-<exit code>.end`` (an empty file the batch
#: script's EXIT trap leaves in ``<results_dir>/ends`` when the script ends by itself).
_END_MARKER_RE = re.compile(r"^(\d+)-(\d+)-(\d+)\.end (\d+(?:\.\d*)?)$")
_END_DIR_TAG = "== tao-slurm ends "


@dataclass(frozen=True)
class EndMarker:
    """One end marker: which job's script ended, in which run, with which exit code, and when.

    :ivar directory: the ends directory it was found in.
    :ivar slurm_job_id: the job.
    :ivar restart: ``SLURM_RESTART_COUNT`` of the run that wrote it (0 for the first run).
    :ivar exit_code: the batch script's exit status.
    :ivar mtime: the marker's modification time, in the file system's clock.
    """

    directory: str
    slurm_job_id: str
    restart: int
    exit_code: int
    mtime: float


def end_markers(since: Mapping[str, float]) -> str:
    """One command listing, per ends directory, the markers modified after ``since[directory]`` (epoch s).

    ``find`` only stats the directory's entries and prints the new names; a directory that does not
    exist yet lists nothing.
    """
    parts = []
    for index, (directory, after) in enumerate(since.items()):
        newer = f"@{max(0, int(after))}"
        find = join(["find", directory, "-maxdepth", "1", "-name", "*.end", "-newermt", newer, "-printf", "%f %T@\\n"])
        parts.append(f"echo {quote(_END_DIR_TAG + str(index))}; {find} 2>/dev/null")
    return "; ".join([*parts, "true"])


def parse_end_markers(stdout: str, directories: Sequence[str]) -> list[EndMarker]:
    """Return the markers :func:`end_markers` listed; lines that are not well-formed markers are ignored."""
    markers: list[EndMarker] = []
    directory: str | None = None
    for line in stdout.splitlines():
        if line.startswith(_END_DIR_TAG):
            index = line[len(_END_DIR_TAG) :]
            directory = directories[int(index)] if index.isdigit() and int(index) < len(directories) else None
            continue
        match = _END_MARKER_RE.match(line)
        if directory is None or match is None:
            continue
        job, restart, code, mtime = match.groups()
        markers.append(EndMarker(directory, job, int(restart), int(code), float(mtime)))
    return markers


def remove_end_markers(directory: str, slurm_job_id: str, also: Sequence[str] = ()) -> str:
    """Remove every end marker of one job (all its runs) and the files ``also`` (e.g. its secret sidecar).

    :raises ValidationError: for an id that is not a plain number, or a relative path.
    """
    if not slurm_job_id.isdigit():
        raise ValidationError(f"SLURM job id {slurm_job_id!r} has no end markers (only plain numeric ids do)")
    files = join(_absolute_all(also)) + " " if also else ""
    return f"rm -f -- {files}{quote(_absolute(directory, 'ends directory'))}/{slurm_job_id}-*.end"
