"""Cost and timing of a finished job, from accounting: how long it queued and ran, and its GPU hours.

Pure: :func:`usage_command` builds the one ``sacct`` line, :func:`parse_usage` reads its answer, and
:meth:`JobUsage.summary` is the sentence the sensor logs last. GPU hours come from the allocation
(``AllocTRES`` ``gres/gpu=N`` times the elapsed time), which is what the cluster charges, not from
what the program used.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from airflow_provider_tao_slurm.core.records import check_slurm_job_id
from airflow_provider_tao_slurm.core.shell import join

#: ``sacct -X -n -P -o USAGE_FIELDS``: one allocation row per job (``Partition``: the one it ran on, of those
#: it named; ``TimelimitRaw``: its time limit in minutes, as it ran).
USAGE_FIELDS = "JobIDRaw,Submit,Start,End,ElapsedRaw,AllocTRES,NodeList,ExitCode,Partition,TimelimitRaw"
_GPUS = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")
_EXIT = re.compile(r"(\d+):(\d+)")
_NO_TIME = frozenset({"", "None", "Unknown", "N/A"})


@dataclass(frozen=True)
class JobUsage:
    """What one job cost.

    :ivar queue_seconds: from submission to start (``None`` if it never started).
    :ivar elapsed_seconds: run time of the allocation.
    :ivar gpus: GPUs allocated (all nodes).
    :ivar gpu_hours: ``gpus * elapsed_seconds / 3600``, rounded to 4 places.
    :ivar node_list: the allocation's nodes as SLURM prints them (``n[1-2]``).
    :ivar exit_code: the job's exit status (``None`` when accounting has none).
    :ivar partition: the partition it ran on (of those it named; ``None`` when accounting has none).
    :ivar time_limit_seconds: its time limit as it ran (``None``: unlimited or not known).
    """

    queue_seconds: int | None
    elapsed_seconds: int
    gpus: int
    gpu_hours: float
    node_list: str | None
    exit_code: int | None
    partition: str | None = None
    time_limit_seconds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the figures as plain JSON values (for XCom and the job record)."""
        return asdict(self)

    def summary(self, slurm_job_id: str, outcome: str) -> str:
        """One line for the task log, e.g. ``SLURM job 12 COMPLETE: queued 8 s, ran 1 h 2 min on n[1-2] ...``."""
        queued = "never started" if self.queue_seconds is None else f"queued {_duration(self.queue_seconds)}"
        where = f" on {self.node_list}" if self.node_list else ""
        code = "" if self.exit_code is None else f", exit code {self.exit_code}"
        return (
            f"SLURM job {slurm_job_id} {outcome}: {queued}, ran {_duration(self.elapsed_seconds)}{where}, "
            f"{self.gpus} GPU(s) = {self.gpu_hours:g} GPU hours{code}"
        )


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def usage_command(slurm_job_id: str) -> str:
    """``sacct -X -n -P -j ID -o USAGE_FIELDS --starttime=now-400days``: the job's allocation row.

    :raises ValidationError: for an id that is not a SLURM job id.
    """
    check_slurm_job_id(slurm_job_id)
    return join(["sacct", "-X", "-n", "-P", "-j", slurm_job_id, "-o", USAGE_FIELDS, "--starttime=now-400days"])


def _time(text: str) -> datetime | None:
    text = text.strip()
    if text in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def parse_usage(stdout: str, slurm_job_id: str) -> JobUsage | None:
    """Return the usage of ``slurm_job_id`` from :func:`usage_command`'s output (``None`` when there is no row yet).

    A row whose fields do not parse counts as missing, never as zero cost.
    """
    for line in stdout.splitlines():
        fields = line.split("|")
        if len(fields) != len(USAGE_FIELDS.split(",")) or fields[0] != slurm_job_id:
            continue
        _, submit, start, _end, elapsed, tres, nodes, exit_code, partition, limit = fields
        if not elapsed.strip().isdigit():
            return None
        submitted, started = _time(submit), _time(start)
        queue = max(int((started - submitted).total_seconds()), 0) if submitted and started else None
        seconds = int(elapsed)
        gpus_match = _GPUS.search(tres.strip())
        gpus = int(gpus_match.group(1)) if gpus_match else 0
        code = _EXIT.fullmatch(exit_code.strip())
        return JobUsage(
            queue_seconds=queue,
            elapsed_seconds=seconds,
            gpus=gpus,
            gpu_hours=round(gpus * seconds / 3600, 4),
            node_list=nodes.strip() if nodes.strip() not in ("", "None assigned", "None") else None,
            exit_code=int(code.group(1)) if code else None,
            partition=partition.strip() or None,
            time_limit_seconds=int(limit) * 60 if limit.strip().isdigit() else None,
        )
    return None
