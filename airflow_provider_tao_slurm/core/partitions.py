"""The cluster's partitions as ``sinfo -a`` shows them, and what a job may ask of them.

A site's shape is read from the cluster, never assumed: each partition's ``MaxTime`` in every form
SLURM prints (``M:SS`` for the sub-hour debug partitions most sites have), whether it is the
default, hidden partitions (``-a``), and the GPUs per node and GPU types of its nodes (GRES). One
partition whose line cannot be read never fails a job that does not use it: it is kept with a
``problem`` that a job asking for it is refused with, and the hook names it in a warning.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from airflow_provider_tao_slurm.core.resources import (
    MAX_GPUS_PER_NODE,
    Resources,
    layout_gpus,
    parse_slurm_time,
    whole_node,
)
from airflow_provider_tao_slurm.exceptions import ResourceError

#: ``sinfo`` output format read by :func:`parse_sinfo_partitions`: ``name[*]|time limit|GRES``.
SINFO_FORMAT = "%P|%l|%G"

_GRES_SPLIT_RE = re.compile(r",(?![^(]*\))")
_GPU_GRES_RE = re.compile(r"gpu(?::([^:(]+))?(?::(\d+))?(?:\(.*\))?")


@dataclass(frozen=True)
class Partition:
    """A partition as the cluster reports it.

    :param name: partition name (without sinfo's ``*`` default marker).
    :param max_time_hours: ``MaxTime`` in hours, ``None`` when unlimited.
    :param is_default: the cluster's default partition.
    :param gpus_per_node: the most GPUs one of its nodes has (0: no GPU node).
    :param gpu_types: the GPU types its nodes have (typed GRES), in sinfo's order.
    :param problem: why sinfo's line for it could not be read (``None`` when it could); a job that
        asks for the partition is refused with it, other jobs are not affected.
    """

    name: str
    max_time_hours: float | None
    is_default: bool = False
    gpus_per_node: int = 0
    gpu_types: tuple[str, ...] = ()
    problem: str | None = None

    @property
    def has_gpus(self) -> bool:
        """True when at least one of its nodes has a GPU."""
        return self.gpus_per_node > 0

    def describe(self) -> str:
        """``polar (4 h, 4 GPUs/node: a100, h100)`` for messages."""
        limit = "no time limit" if self.max_time_hours is None else f"{self.max_time_hours:g} h"
        gpus = "no GPUs"
        if self.has_gpus:
            gpus = f"{self.gpus_per_node} GPUs/node" + (f": {', '.join(self.gpu_types)}" if self.gpu_types else "")
        return f"{self.name} ({limit}, {gpus})"


def _gpus(gres: str) -> tuple[int, tuple[str, ...]]:
    """GPUs on one node and their types from sinfo's GRES text (``gpu:a100:4(S:0-1),gpu:h100:2``)."""
    count = 0
    types: list[str] = []
    for item in _GRES_SPLIT_RE.split(gres.strip()):
        match = _GPU_GRES_RE.fullmatch(item.strip())
        if match is None:
            continue  # another GRES (mps, shard, license), or "(null)" for none
        kind, number = match.groups()
        if number is None and kind is not None and kind.isdigit():
            kind, number = None, kind  # "gpu:4" has a count and no type
        count += int(number) if number is not None else 1
        if kind is not None and kind not in types:
            types.append(kind)
    return count, tuple(types)


def _read_line(line: str) -> Partition:
    name, _, rest = line.partition("|")
    limit, _, gres = rest.partition("|")
    bare = name.rstrip("*")
    try:
        hours = parse_slurm_time(limit)
    except ResourceError:
        return Partition(bare, None, name.endswith("*"), problem=f"sinfo printed the time limit {limit.strip()!r}")
    count, types = _gpus(gres)
    return Partition(bare, hours, name.endswith("*"), count, types)


def _merge(first: Partition, other: Partition) -> Partition:
    """One partition seen on several sinfo lines (its nodes differ in GRES)."""
    return replace(
        first,
        gpus_per_node=max(first.gpus_per_node, other.gpus_per_node),
        gpu_types=first.gpu_types + tuple(t for t in other.gpu_types if t not in first.gpu_types),
        problem=first.problem or other.problem,
    )


def parse_sinfo_partitions(stdout: str) -> tuple[list[Partition], list[str]]:
    """Read ``sinfo -a -h -o`` :data:`SINFO_FORMAT` output.

    sinfo prints one line per partition and node shape, so a partition whose nodes differ in GPUs
    has several lines; they are merged (the largest node shape, every GPU type).

    :param stdout: sinfo's stdout; blank lines are skipped.
    :returns: the partitions in sinfo's order (an unreadable time limit kept as the partition's
        ``problem``), and the lines that name no partition at all (for a warning).
    """
    found: dict[str, Partition] = {}
    unreadable: list[str] = []
    for line in stdout.splitlines():
        text = line.strip()
        if not text:
            continue
        if "|" not in text or not text.partition("|")[0].rstrip("*"):
            unreadable.append(text)
            continue
        partition = _read_line(text)
        known = found.get(partition.name)
        found[partition.name] = partition if known is None else _merge(known, partition)
    return list(found.values()), unreadable


def resolve_partitions(requested: Sequence[str], known: Sequence[Partition], cluster: str) -> tuple[str, ...]:
    """Return the partitions a job asks for: ``requested``, else the cluster's default partition.

    :raises ResourceError: for a partition the cluster does not have (listing those it has), or when
        nothing was requested and the cluster has no default partition.
    """
    names = [p.name for p in known]
    if not requested:
        default = next((p.name for p in known if p.is_default), None)
        if default is None:
            raise ResourceError(
                f"no partition given and cluster {cluster!r} has no default partition; pass partition=... or set "
                f"the connection's partition extra (partitions: {', '.join(names) or 'none visible'})"
            )
        return (default,)
    unknown = [name for name in requested if name not in names]
    if unknown:
        raise ResourceError(
            f"partition {', '.join(unknown)} does not exist on cluster {cluster!r} (sinfo -a shows: "
            f"{', '.join(names) or 'none'}); fix partition (or the connection's partition extra)"
        )
    return tuple(requested)


def check_partition_limits(
    time_hours: float, partitions: Sequence[str], known: Sequence[Partition], param: str = "time_hours"
) -> None:
    """Refuse a wall time over the ``MaxTime`` of any requested partition (SLURM would refuse it at submit).

    :raises ResourceError: naming the partition, its limit and the partitions that would allow it, or
        for a requested partition whose sinfo line could not be read.
    """
    by_name = {p.name: p for p in known}
    for name in partitions:
        partition = by_name.get(name)
        if partition is None:
            continue
        if partition.problem is not None:
            raise ResourceError(
                f"partition {name} cannot be checked: {partition.problem}, which is not a SLURM time; ask the site "
                "what its limit is, or pick another partition"
            )
        limit = partition.max_time_hours
        if limit is not None and time_hours > limit + 1e-9:
            longer = [
                p.name
                for p in known
                if p.problem is None and (p.max_time_hours is None or p.max_time_hours >= time_hours)
            ]
            hint = f"; partitions that allow it: {', '.join(longer)}" if longer else ""
            raise ResourceError(
                f"partition {name} allows at most {limit:g} h, but {param}={time_hours:g}: lower {param} or pick "
                f"a partition with a longer limit{hint}"
            )


def fit_gpus(resources: Resources, partitions: Sequence[str], known: Sequence[Partition]) -> Resources:
    """Lay a GPU request out on the node shape of the partitions the job goes to.

    ``total_gpus`` (``resources.layout_total``) becomes whole nodes of the smallest GPU count among
    ``partitions`` (the seed's 8-GPU layout only where the nodes have 8). A request no node can hold
    (more GPUs per node than any node has, a GPU type none has, GPUs on a partition without any) is
    refused before anything is submitted. A job that asks for every GPU of the largest node it can
    land on takes its nodes whole (``exclusive``, :func:`~airflow_provider_tao_slurm.core.resources.whole_node`);
    where no partition of the job is in ``known`` its node size is unknown and it does not.

    :param resources: the validated request, its partition not yet resolved.
    :param partitions: the partitions the job goes to (from :func:`resolve_partitions`).
    :param known: the cluster's partitions.
    :returns: ``resources`` with the layout fitted and ``partition`` set to ``partitions``.
    :raises ResourceError: naming the partition's node shape and the fix.
    """
    by_name = {p.name: p for p in known}
    chosen = [by_name[name] for name in partitions if name in by_name]
    gpu_partitions = [p.describe() for p in known if p.has_gpus and p.problem is None]
    without = [p.name for p in chosen if not p.has_gpus]
    if without:
        raise ResourceError(
            f"partition {', '.join(without)} has no GPUs (sinfo shows no gpu GRES on its nodes), but the job asks "
            f"for GPUs; pick a GPU partition: {'; '.join(gpu_partitions) or 'none visible'}"
        )
    per_node = min((p.gpus_per_node for p in chosen), default=MAX_GPUS_PER_NODE)
    shapes = ", ".join(p.describe() for p in chosen)
    num_nodes, gpus_per_node = resources.num_nodes, resources.gpus_per_node
    if resources.layout_total is not None:
        num_nodes, gpus_per_node = layout_gpus(resources.layout_total, per_node, where=f"on {shapes}")
    elif gpus_per_node > per_node:
        larger = [p.describe() for p in known if p.gpus_per_node >= gpus_per_node and p.problem is None]
        raise ResourceError(
            f"gpus_per_node={gpus_per_node} cannot start on {shapes}: no node there has more than {per_node} GPUs; "
            f"ask for at most {per_node} per node and more nodes (total_gpus={num_nodes * gpus_per_node} lays "
            f"them out for you)" + (f", or pick a partition with larger nodes: {'; '.join(larger)}" if larger else "")
        )
    types = {t for p in chosen for t in p.gpu_types}
    if resources.gpu_type is not None and types and resources.gpu_type not in types:
        raise ResourceError(
            f"gpu_type={resources.gpu_type!r}: no node of {shapes} has that GPU type; use one of "
            f"{', '.join(sorted(types))} or pick a partition that has it"
        )
    return replace(
        resources,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        exclusive=whole_node(gpus_per_node, max((p.gpus_per_node for p in chosen), default=None)),
        partition=",".join(partitions),
        layout_total=None,
    )


def cpu_partition(known: Sequence[Partition], cluster: str, time_hours: float) -> str:
    """Return the partition a conversion goes to when none is configured: one whose nodes have no GPUs.

    The cluster's default partition is taken when it has no GPUs; otherwise the first partition
    without GPUs (in sinfo's order) whose limit allows ``time_hours``. A GPU partition is never
    chosen: an image conversion there holds a GPU node for minutes without using its GPUs.

    :raises ResourceError: when no partition without GPUs fits, naming the CPU partitions there are
        and the fix (the connection's ``conversion_partition`` extra, or ``partition=``).
    """
    usable = [
        p
        for p in known
        if not p.has_gpus and p.problem is None and (p.max_time_hours is None or p.max_time_hours + 1e-9 >= time_hours)
    ]
    usable.sort(key=lambda p: not p.is_default)
    if usable:
        return usable[0].name
    cpu = [p.describe() for p in known if not p.has_gpus]
    raise ResourceError(
        f"no conversion partition is configured and cluster {cluster!r} has no partition without GPUs that allows "
        f"{time_hours:g} h (partitions without GPUs: {'; '.join(cpu) or 'none'}); image conversion never runs on a "
        "GPU partition: set the connection's conversion_partition extra (or partition= on EnrootImportOperator) to "
        "a CPU partition"
    )


def choose_partitions(
    requested: Sequence[str], known: Sequence[Partition], cluster: str, time_hours: float, *, cpu_only: bool = False
) -> tuple[str, ...]:
    """Return the partitions a job goes to: ``requested``, else the cluster's default.

    A CPU job (``cpu_only``: an image conversion) that requests none goes to a partition without GPUs
    (:func:`cpu_partition`) instead of the default.

    :raises ResourceError: as :func:`resolve_partitions` and :func:`cpu_partition` do.
    """
    if cpu_only and not requested:
        return (cpu_partition(known, cluster, time_hours),)
    return resolve_partitions(requested, known, cluster)
