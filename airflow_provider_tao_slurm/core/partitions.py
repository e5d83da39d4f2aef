"""The cluster's partitions as ``sinfo -a`` shows them, and what a job may ask of them.

A site's shape is read from the cluster, never assumed: each partition's ``MaxTime`` in every form
SLURM prints (``M:SS`` for the sub-hour debug partitions most sites have) and its ``DefaultTime``, whether it is the
default, hidden partitions (``-a``), the GPUs per node and GPU types of its nodes (GRES), their CPUs
and memory, whether the partition is up, and whether it is open to every user (``AllowGroups``,
``RootOnly``). One partition whose line cannot be read never fails a job that does not use it: it is
kept with a ``problem`` that a job asking for it is refused with, and the hook names it in a warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from airflow_provider_tao_slurm.core.resources import (
    MAX_GPUS_PER_NODE,
    Resources,
    default_cpus_per_task,
    format_duration,
    layout_gpus,
    parse_slurm_time,
    whole_node,
)
from airflow_provider_tao_slurm.exceptions import ResourceError

#: ``sinfo`` output format read by :func:`parse_sinfo_partitions`: ``name[*]|time limit|GRES|availability|
#: CPUs per node|memory MB per node|AllowGroups|RootOnly|default time``. (The hook's partition cache is named
#: after it: change ``hooks.slurm.PARTITION_CACHE_NAME`` with it.)
SINFO_FORMAT = "%P|%l|%G|%a|%c|%m|%g|%r|%L"
#: sinfo's ``%a`` for a partition that runs jobs; ``down`` queues them without starting any, ``drain``
#: and ``inact`` take none.
UP = "up"

_GRES_SPLIT_RE = re.compile(r",(?![^(]*\))")
_GPU_GRES_RE = re.compile(r"gpu(?::([^:(]+))?(?::(\d+))?(?:\(.*\))?")
#: sinfo's CPUs (``8``) or memory (``8192``, in MB; a suffixed size from a wrapper) per node; ``+`` when
#: the nodes of the line differ and this is the smallest (sinfo without ``-e``).
_AMOUNT_RE = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)(\+?)", re.IGNORECASE)
_MB_PER_UNIT = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
#: What sinfo prints for a value it does not have.
_NO_VALUE = frozenset({"", "(null)", "n/a"})


@dataclass(frozen=True)
class NodeShape:
    """The nodes of one sinfo line of a partition: GPUs, CPUs and memory of each.

    :param gpus: GPUs per node (0: none).
    :param cpus: CPUs per node (``None``: not known).
    :param memory_mb: memory per node in MB (``None``: not known).
    :param at_least: sinfo printed ``8+``: the nodes differ and these are the smallest; some have more,
        so nothing is refused on these figures (a default made from them fits every node).
    """

    gpus: int
    cpus: int | None
    memory_mb: int | None
    at_least: bool = False

    def holds(self, cpus: int, memory_mb: int | None) -> bool:
        """Whether a node of this shape can hold one task of ``cpus`` CPUs and ``memory_mb`` MB (``None``: any)."""
        if self.at_least:
            return True
        cpus_fit = self.cpus is None or cpus <= self.cpus
        return cpus_fit and (memory_mb is None or self.memory_mb is None or memory_mb <= self.memory_mb)


@dataclass(frozen=True)
class Partition:
    """A partition as the cluster reports it.

    :param name: partition name (without sinfo's ``*`` default marker).
    :param max_time_hours: ``MaxTime`` in hours, ``None`` when unlimited.
    :param is_default: the cluster's default partition.
    :param gpus_per_node: the most GPUs one of its nodes has (0: no GPU node).
    :param gpu_types: the GPU types its nodes have (typed GRES), sorted: sinfo's line order changes with node states.
    :param problem: why sinfo's line for it could not be read (``None`` when it could); a job that
        asks for the partition is refused with it, other jobs are not affected.
    :param state: sinfo's availability (``%a``): :data:`UP`, ``down``, ``drain`` or ``inact``.
    :param allow_groups: the only groups that may submit there (``AllowGroups``; empty: every group).
    :param root_only: only root may submit there (``RootOnly=YES``).
    :param shapes: its node shapes with their CPUs and memory (one per sinfo line that had them), sorted.
    :param default_time_hours: ``DefaultTime`` in hours, the limit of a job that asks no ``--time`` (``None``:
        none set, such a job gets ``MaxTime``).
    """

    name: str
    max_time_hours: float | None
    is_default: bool = False
    gpus_per_node: int = 0
    gpu_types: tuple[str, ...] = ()
    problem: str | None = None
    state: str = UP
    allow_groups: tuple[str, ...] = ()
    root_only: bool = False
    shapes: tuple[NodeShape, ...] = ()
    default_time_hours: float | None = None

    @property
    def job_limit_hours(self) -> float | None:
        """The limit of a job that asks no ``--time`` here: ``DefaultTime`` when set, else ``MaxTime`` (None: none)."""
        return self.default_time_hours if self.default_time_hours is not None else self.max_time_hours

    @property
    def has_gpus(self) -> bool:
        """True when at least one of its nodes has a GPU."""
        return self.gpus_per_node > 0

    @property
    def is_up(self) -> bool:
        """True when the partition starts jobs (sinfo's availability ``up``)."""
        return self.state == UP

    @property
    def restriction(self) -> str | None:
        """Why not every user may submit there (``RootOnly``, ``AllowGroups``), ``None`` when anyone may."""
        if self.root_only:
            return "only root may submit there (RootOnly=YES)"
        if self.allow_groups:
            return f"only groups {', '.join(self.allow_groups)} may submit there (AllowGroups)"
        return None

    def describe(self) -> str:
        """``polar (4 h, 4 GPUs/node: a100, h100, 8 CPUs/node, 8192 MB/node)`` for messages (``, DOWN`` when not up)."""
        limit = "no time limit" if self.max_time_hours is None else format_duration(self.max_time_hours)
        parts = [limit, "no GPUs"]
        if self.has_gpus:
            parts[1] = f"{self.gpus_per_node} GPUs/node" + (f": {', '.join(self.gpu_types)}" if self.gpu_types else "")
        for figure, unit in (
            (_largest(s.cpus for s in self.shapes), "CPUs"),
            (_largest(s.memory_mb for s in self.shapes), "MB"),
        ):
            if figure is not None:
                plus = "+" if any(s.at_least for s in self.shapes) else ""
                parts.append(f"{figure}{plus} {unit}/node")
        if not self.is_up:
            parts.append(self.state.upper())
        return f"{self.name} ({', '.join(parts)})"


def _largest(values: Iterable[int | None]) -> int | None:
    return max((v for v in values if v is not None), default=None)


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
    return count, tuple(sorted(types))


def _amount(text: str, what: str) -> tuple[int | None, bool]:
    """Read sinfo's CPUs or memory (MB) per node: the number and whether it is a smallest (``8+``).

    :raises ValueError: naming the text, for what is neither a number nor sinfo's "no value".
    """
    cleaned = text.strip()
    if cleaned.lower() in _NO_VALUE:
        return None, False
    match = _AMOUNT_RE.fullmatch(cleaned)
    if match is None:
        raise ValueError(f"sinfo printed the {what} {cleaned!r}, which is not a number")
    number, unit, plus = match.groups()
    value = int(float(number) * _MB_PER_UNIT[unit.upper()])
    return (value or None), bool(plus)  # 0: a partition without nodes, or a node without RealMemory


def _groups(text: str) -> tuple[str, ...]:
    """Read sinfo's ``%g``: ``all`` (every group may submit) or the ``AllowGroups`` list."""
    cleaned = text.strip()
    return () if cleaned.lower() in _NO_VALUE | {"all"} else tuple(g for g in cleaned.split(",") if g)


def _read_line(line: str) -> Partition:
    name, limit, gres, state, cpus_text, memory_text, groups, root, default = (line.split("|") + [""] * 9)[:9]
    partition = Partition(
        name.rstrip("*"),
        None,
        name.endswith("*"),
        state=state.strip().lower() or UP,
        allow_groups=_groups(groups),
        root_only=root.strip().lower() == "yes",
    )
    try:
        hours = parse_slurm_time(limit)
    except ResourceError:
        return replace(partition, problem=f"sinfo printed the time limit {limit.strip()!r}, which is not a SLURM time")
    count, types = _gpus(gres)
    partition = replace(partition, max_time_hours=hours, gpus_per_node=count, gpu_types=types)
    if default.strip().lower() not in _NO_VALUE:
        try:
            partition = replace(partition, default_time_hours=parse_slurm_time(default))
        except ResourceError:
            return replace(partition, problem=f"sinfo printed the default time {default.strip()!r}, not a SLURM time")
    try:
        cpus, cpus_more = _amount(cpus_text, "CPUs per node")
        memory, memory_more = _amount(memory_text, "memory per node")
    except ValueError as err:
        return replace(partition, problem=str(err))
    if cpus is None and memory is None:
        return partition  # a line without either adds nothing to the GPU shape
    return replace(partition, shapes=(NodeShape(count, cpus, memory, cpus_more or memory_more),))


def _shape_order(shape: NodeShape) -> tuple[int, int, int, bool]:
    """Sort key of a node shape (a figure sinfo did not know sorts first)."""
    return shape.gpus, shape.cpus or 0, shape.memory_mb or 0, shape.at_least


def _merge(first: Partition, other: Partition) -> Partition:
    """One partition seen on several sinfo lines (its nodes differ in GRES, CPUs or memory)."""
    return replace(
        first,
        gpus_per_node=max(first.gpus_per_node, other.gpus_per_node),
        gpu_types=tuple(sorted({*first.gpu_types, *other.gpu_types})),
        problem=first.problem or other.problem,
        shapes=tuple(sorted({*first.shapes, *other.shapes}, key=_shape_order)),
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
    time_hours: float,
    partitions: Sequence[str],
    known: Sequence[Partition],
    param: str = "time_hours",
    *,
    continued: bool = False,
) -> None:
    """Refuse a wall time over the ``MaxTime`` of any requested partition (SLURM would refuse it at submit).

    A continued training (``continued``: ``max_continuations`` set) naming several partitions is refused
    only for what none of them can run: each slice takes the limit of the partition it starts on
    (:func:`slice_hours`), so ``time_hours`` is its longest slice and must fit one of them.

    :raises ResourceError: naming the partition, its limit and the partitions that would allow it, or
        for a requested partition whose sinfo line could not be read.
    """
    by_name = {p.name: p for p in known}
    for name in partitions:
        partition = by_name.get(name)
        if partition is not None and partition.problem is not None:
            raise ResourceError(
                f"partition {name} cannot be checked: {partition.problem}; ask the site what its limits are, or pick "
                "another partition"
            )
    if continued and len(partitions) > 1:
        _check_longest_slice(time_hours, partitions, by_name, param)
        return
    for name in partitions:
        partition = by_name.get(name)
        if partition is None:
            continue
        limit = partition.max_time_hours
        if limit is not None and time_hours > limit + 1e-9:
            longer = [
                p.name
                for p in known
                if p.problem is None and p.is_up and (p.max_time_hours is None or p.max_time_hours >= time_hours)
            ]
            hint = f"; partitions that allow it: {', '.join(longer)}" if longer else ""
            raise ResourceError(
                f"partition {name} allows at most {format_duration(limit)}, but {param}={time_hours:g} "
                f"({format_duration(time_hours)}): lower {param} or pick a partition with a longer limit{hint}"
            )


def _check_longest_slice(
    time_hours: float, partitions: Sequence[str], by_name: Mapping[str, Partition], param: str
) -> None:
    """Refuse a continued training's longest slice that none of its partitions allows (the earliest start)."""
    limits = [by_name[name].max_time_hours if name in by_name else None for name in partitions]
    if any(limit is None or time_hours <= limit + 1e-9 for limit in limits):
        return
    longest = max(limit for limit in limits if limit is not None)
    shown = ", ".join(f"{name} {format_duration(limit or 0.0)}" for name, limit in zip(partitions, limits, strict=True))
    raise ResourceError(
        f"{param}={time_hours:g} ({format_duration(time_hours)}) is the longest slice of this continued training, but "
        f"none of its partitions allows it ({shown}); each slice takes the limit of the partition it starts on: "
        f"lower {param} to at most {longest:g} ({format_duration(longest)}), or add a partition with a longer limit"
    )


def slice_hours(time_hours: float, partitions: Sequence[str], known: Sequence[Partition]) -> dict[str, float] | None:
    """Return how long a continued training's slice runs on each of its partitions, when they differ.

    ``time_hours`` is the longest slice; a slice on a partition whose ``MaxTime`` is shorter gets that limit.
    SLURM 22.05 refuses a ``--time`` over the limit of any named partition (``EnforcePartLimits=ALL``)
    and never lowers it to the partition a job starts on (``--time-min`` does not either): such a job is
    submitted without ``--time``, takes the limit of the partition it starts on (its ``DefaultTime`` where
    the site set one, else its ``MaxTime``: :attr:`Partition.job_limit_hours`), and its batch shell lowers
    a longer limit to ``time_hours`` (:func:`~airflow_provider_tao_slurm.core.continuation.cap_time_limit`).

    :returns: ``{partition: slice hours}`` in the order named, or ``None`` when every partition allows
        ``time_hours`` (the job asks ``--time`` as any job does) or only one is named.
    """
    if len(partitions) < 2:
        return None
    by_name = {p.name: p for p in known}
    limits = {name: by_name[name].max_time_hours if name in by_name else None for name in partitions}
    if all(limit is None or limit + 1e-9 >= time_hours for limit in limits.values()):
        return None
    given = {name: by_name[name].job_limit_hours if name in by_name else None for name in partitions}
    return {name: time_hours if limit is None else min(limit, time_hours) for name, limit in given.items()}


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
    hosts = [s for p in chosen for s in p.shapes if s.gpus >= gpus_per_node]
    cpus = resources.cpus_per_task
    if resources.cpus_default and any(s.cpus for s in hosts):
        cpus = min(default_cpus_per_task(gpus_per_node, s.cpus, s.gpus) for s in hosts if s.cpus)
    if hosts and not any(s.holds(cpus, resources.mem_mb) for s in hosts):
        raise ResourceError(_no_node_holds(resources, cpus, gpus_per_node, hosts, shapes))
    return replace(
        resources,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus,
        exclusive=whole_node(gpus_per_node, max((p.gpus_per_node for p in chosen), default=None)),
        partition=",".join(partitions),
        layout_total=None,
        cpus_default=False,
    )


def _no_node_holds(resources: Resources, cpus: int, gpus_per_node: int, hosts: Sequence[NodeShape], shapes: str) -> str:
    """Write the refusal of a task no node can hold: what the nodes have and the values that fit."""
    most_cpus = _largest(s.cpus for s in hosts)
    most_memory = _largest(s.memory_mb for s in hosts)
    fixes = []
    if most_cpus is not None and cpus > most_cpus:
        default = min(default_cpus_per_task(gpus_per_node, s.cpus, s.gpus) for s in hosts if s.cpus)
        fixes.append(
            f"cpus_per_task={cpus} (one task per node) is more than the {most_cpus} CPUs of its nodes with "
            f"{gpus_per_node} GPU(s): ask for at most {most_cpus}, or leave cpus_per_task out ({default} from the "
            "node shape)"
        )
    if resources.mem_mb is not None and most_memory is not None and resources.mem_mb > most_memory:
        fixes.append(
            f"mem_mb={resources.mem_mb} is more than the {most_memory} MB of its nodes: ask for at most "
            f"{most_memory}, or leave mem_mb out (the partition's default)"
        )
    if not fixes:  # each fits some node, but no node both
        fixes.append(f"no node has both cpus_per_task={cpus} and mem_mb={resources.mem_mb}: lower one")
    return (
        f"the job cannot start on {shapes}: {'; '.join(fixes)}. SLURM would keep it PENDING (BadConstraints) "
        "forever, so it is not submitted"
    )


def skip_reason(partition: Partition, time_hours: float) -> str | None:
    """Why the automatic choice of a conversion partition passes over ``partition`` (``None``: usable).

    Usable means a job submitted there can start: its sinfo line was read, it is up (a ``down``
    partition queues jobs and starts none, ``drain`` and ``inact`` take none), every user may submit
    there, and its limit allows ``time_hours``.

    Who may submit is read from the same sinfo line (``%g`` AllowGroups, ``%r`` RootOnly), not asked
    per user: whether this user is in one of the groups would take another command, and sinfo
    without ``-a`` (which leaves out the partitions a user's groups may not use) also leaves out the
    ``Hidden=YES`` partitions the provider must see. So a partition open to some groups only is never
    chosen automatically; a member names it in the connection's ``conversion_partition`` extra.
    ``AllowAccounts``/``AllowQos`` are not in sinfo's output: sbatch refuses a job there at once
    ("Invalid account or account/partition combination"), an error naming the cause, never a job
    that pends.
    """
    if partition.problem is not None:
        return partition.problem
    if not partition.is_up:
        return f"it is {partition.state.upper()}"
    if partition.restriction is not None:
        return partition.restriction
    limit = partition.max_time_hours
    if limit is not None and limit + 1e-9 < time_hours:
        return f"it allows at most {format_duration(limit)}, the conversion asks for {format_duration(time_hours)}"
    return None


def skipped_cpu_partitions(known: Sequence[Partition], time_hours: float) -> list[str]:
    """Return the partitions without GPUs that the automatic conversion choice passes over, ``name: reason`` each."""
    return [
        f"{p.name}: {reason}" for p in known if not p.has_gpus and (reason := skip_reason(p, time_hours)) is not None
    ]


def cpu_partition(known: Sequence[Partition], cluster: str, time_hours: float) -> str:
    """Return the partition a conversion goes to when none is configured: a usable one whose nodes have no GPUs.

    The cluster's default partition is taken when it has no GPUs and is usable; otherwise the first
    usable partition without GPUs in sinfo's order (:func:`skip_reason`: up, open to every user, a
    limit that allows ``time_hours``). A GPU partition is never chosen: an image conversion there
    holds a GPU node for minutes without using its GPUs.

    :raises ResourceError: when no partition without GPUs is usable, naming each one and why it was
        passed over, and the fix (the connection's ``conversion_partition`` extra, or ``partition=``).
    """
    usable = [p for p in known if not p.has_gpus and skip_reason(p, time_hours) is None]
    usable.sort(key=lambda p: not p.is_default)
    if usable:
        return usable[0].name
    skipped = skipped_cpu_partitions(known, time_hours)
    raise ResourceError(
        f"no conversion partition is configured and cluster {cluster!r} has no usable partition without GPUs for "
        f"{format_duration(time_hours)} (passed over: {'; '.join(skipped) or 'none: it has no CPU partition'}); "
        "image conversion never runs on a GPU partition: set the connection's conversion_partition extra (or "
        "partition= on EnrootImportOperator) to a CPU partition you may use"
    )


def unavailable(partitions: Sequence[str], known: Sequence[Partition]) -> list[Partition]:
    """Return the partitions among ``partitions`` that are not up (``down``, ``drain`` or ``inact``)."""
    by_name = {p.name: p for p in known}
    return [by_name[name] for name in partitions if name in by_name and not by_name[name].is_up]


def choose_partitions(
    requested: Sequence[str], known: Sequence[Partition], cluster: str, time_hours: float, *, cpu_only: bool = False
) -> tuple[str, ...]:
    """Return the partitions a job goes to: ``requested``, else the cluster's default.

    A CPU job (``cpu_only``: an image conversion) that requests none goes to a usable partition
    without GPUs (:func:`cpu_partition`) instead of the default. A conversion whose requested
    partitions are none of them up is refused (it would pend, or be refused by sbatch); a GPU job's
    partitions that are not up are the caller's warning (:func:`unavailable`): a site's maintenance
    may end.

    :raises ResourceError: as :func:`resolve_partitions` and :func:`cpu_partition` do, and for a
        conversion on partitions that are not up, naming their state and the usable ones.
    """
    if cpu_only and not requested:
        return (cpu_partition(known, cluster, time_hours),)
    chosen = resolve_partitions(requested, known, cluster)
    down = unavailable(chosen, known)
    if cpu_only and len(down) == len(chosen):
        usable = [p.name for p in known if not p.has_gpus and skip_reason(p, time_hours) is None]
        raise ResourceError(
            f"the conversion partition {', '.join(f'{p.name} is {p.state.upper()}' for p in down)} on cluster "
            f"{cluster!r}: a conversion there would never start; ask the site when it is back, or set the "
            "connection's conversion_partition extra (or partition= on EnrootImportOperator) to a partition that is "
            f"up (usable without GPUs: {', '.join(usable) or 'none'})"
        )
    return chosen
