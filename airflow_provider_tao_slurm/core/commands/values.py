"""What every command builder shares: the checks of the values it puts into a command line.

Each check returns the value (or a normalised copy) so a builder can use it inline, and raises
:class:`~airflow_provider_tao_slurm.exceptions.ValidationError` naming the value and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from airflow_provider_tao_slurm.core.records import check_slurm_job_id
from airflow_provider_tao_slurm.exceptions import ValidationError

_STARTTIME_RE = re.compile(r"now-\d+(?:seconds|minutes|hours|days|weeks)?|(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})")
_MODE_RE = re.compile(r"[0-7]{3,4}")
_TOOL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_MACHINE_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d{1,5})?")
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*")


def _absolute(path: str, what: str = "path") -> str:
    """Check that ``path`` is absolute (so no path can be mistaken for an option)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValidationError(f"{what} {path!r} is not absolute; give the full cluster path starting with '/'")
    return path


def _absolute_all(paths: Sequence[str], what: str = "path") -> list[str]:
    """Check a non-empty list of absolute paths (a lone string is refused, not split into characters)."""
    if isinstance(paths, str) or not paths:
        raise ValidationError(f"pass a non-empty list of {what}s, not {paths!r}")
    return [_absolute(path, what) for path in paths]


def _slurm_job_ids(job_ids: Sequence[str], *, allow_empty: bool = False) -> list[str]:
    """SLURM job ids, duplicates dropped, order kept."""
    if isinstance(job_ids, str) or not (job_ids or allow_empty):
        raise ValidationError(f"pass a non-empty list of SLURM job ids, not {job_ids!r}")
    return list(dict.fromkeys(check_slurm_job_id(job_id) for job_id in job_ids))


def _starttime(starttime: str) -> str:
    """Check a sacct ``--starttime``: ``now-<n><unit>`` or a valid ``YYYY-MM-DDTHH:MM:SS``."""
    match = _STARTTIME_RE.fullmatch(starttime) if isinstance(starttime, str) else None
    valid = match is not None
    if match is not None and match.group(1):
        try:
            datetime.fromisoformat(match.group(1))
        except ValueError:
            valid = False
    if not valid:
        raise ValidationError(f"sacct start time {starttime!r} must look like 'now-2days' or '2024-05-01T00:00:00'")
    return starttime


def _mode(mode: str) -> str:
    """Check an octal file mode such as ``600``."""
    if not isinstance(mode, str) or not _MODE_RE.fullmatch(mode):
        raise ValidationError(f"file mode {mode!r} must be 3 or 4 octal digits, e.g. '600'")
    return mode


def _names(values: Sequence[str], pattern: re.Pattern[str], what: str) -> list[str]:
    """Check a non-empty list of names, each matching ``pattern`` whole."""
    if isinstance(values, str) or not values:
        raise ValidationError(f"pass a non-empty list of {what}s, not {values!r}")
    for value in values:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValidationError(f"{what} {value!r} has characters a {what} cannot have")
    return list(values)


def _machine(machine: str) -> str:
    """Check a registry host name (``host`` or ``host:port``); return it lower case."""
    return _names([machine], _MACHINE_RE, "registry host name")[0].lower()


def _count(value: int, what: str, minimum: int) -> int:
    """Check an integer (not a bool) of at least ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValidationError(f"{what} must be an integer of at least {minimum}, not {value!r}")
    return value
