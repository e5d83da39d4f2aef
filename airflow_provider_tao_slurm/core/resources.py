"""Resource requests of a GPU job: defaults, validation and SLURM time formats.

TAO conventions: 1 node, 4 GPUs, a 4 h wall limit and a program timeout derived
from it (:func:`program_timeout_seconds`: 3.8 h for 4 h; the program must stop before SLURM kills the
job), requeue on. A job that asks for every GPU of its nodes asks for them exclusively
(:func:`whole_node`, against the partition's node size read from the cluster). A total GPU count is
laid out as whole nodes of the partition's own shape, and the CPUs per task not given default to
the node's share for the job's GPUs (16, the TAO default, only where the node shape is unknown)
(:func:`~airflow_provider_tao_slurm.core.partitions.fit_gpus`).

Every duration shown to a user is written by :func:`format_duration` (``45 s``, ``1 min``,
``1 h 30 min``, ``2 d``), never as a fraction of an hour.

Nothing here knows a site: no partition name is built in. The partition comes from the operator or
the connection, else it is the cluster's default partition; the time limit checked is the requested
partition's own ``MaxTime`` as ``sinfo`` reports it
(:func:`~airflow_provider_tao_slurm.core.partitions.check_partition_limits`), and the
connection's ``max_time_hours`` is an optional stricter site rule. The sbatch options sites rely on
(QOS, constraint, reservation, GPU type, a validated mapping of the rest) become ``#SBATCH`` lines
(:func:`site_options`).

The parameters every submitting operator takes (partition, account, CPUs, memory, wall time, GPU
type and the site options) are checked by one function, :func:`check_job_parameters`, so each has
one rule and one message whichever operator takes it; :func:`gpu_resources` adds a GPU job's layout
and timing rules.

:func:`requested_gpu_hours` is what one job of a request can cost before it is submitted (nodes x GPUs
per node x wall time); :func:`gpu_hours_request` adds what a continued training (``max_continuations``)
can cost at most, one such slice per job of the chain.

``PartitionLimit`` and ``check_partition_limits`` are the previous release's names of
:class:`~airflow_provider_tao_slurm.core.partitions.Partition` and
:func:`~airflow_provider_tao_slurm.core.partitions.check_partition_limits`, deprecated: they go in the
next release.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import DEFAULT_TIMEOUT_HOURS as DEFAULT_TIMEOUT_HOURS
from airflow_provider_tao_slurm.core.storage import display_value
from airflow_provider_tao_slurm.exceptions import ResourceError, ValidationError

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.partitions import Partition

DEFAULT_NUM_NODES = 1
DEFAULT_GPUS_PER_NODE = 4
#: The seed's node size: the layout of a ``total_gpus`` request until the partition's own is known.
MAX_GPUS_PER_NODE = 8
#: CPUs per task where the node shape is unknown (the TAO default); with a known shape the default is
#: the node's CPUs for the job's share of its GPUs (:func:`default_cpus_per_task`).
DEFAULT_CPUS_PER_TASK = 16
DEFAULT_TIME_HOURS = 4.0
#: The margin between the wall limit and the program timeout derived from it: a twentieth of the wall
#: time, at least :data:`PROGRAM_MARGIN_MIN_S` seconds (see :func:`program_timeout_seconds`).
PROGRAM_MARGIN_FRACTION = 0.05
#: The least margin: after the program the batch script writes its exit code, leaves its end marker
#: and asks ``scontrol`` (for at most 10 s) whether the credentials file can go.
PROGRAM_MARGIN_MIN_S = 15

MAX_HOURS = 366 * 24.0
"""Sanity cap on any time request (one year)."""

_MAX_NAME_CHARS = 128
_NAME_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")
_NODE_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*(?:\[([0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*)\])?")
_LIST_SPLIT_RE = re.compile(r",(?![^\[]*\])")
_RANGE_RE = re.compile(r"([0-9]+)-([0-9]+)")
_DIGITS_RE = re.compile(r"[0-9]+")
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "NONE"})


@dataclass(frozen=True)
class Resources:
    """A validated resource request; build it with :func:`build_resources`.

    ``partition`` is the value for ``sbatch --partition`` (comma separated when several partitions
    are allowed; SLURM starts the job in the first one that can run it).
    """

    num_nodes: int
    gpus_per_node: int
    cpus_per_task: int
    time_hours: float
    timeout_hours: float
    partition: str
    account: str | None = None
    exclusive: bool = False
    requeue: bool = True
    exclude_nodes: tuple[str, ...] = ()
    mem_mb: int | None = None
    gpu_type: str | None = None
    sbatch_extra: tuple[str, ...] = ()
    #: A ``total_gpus`` request still to be laid out on the partition's node shape (``None``: laid out).
    layout_total: int | None = None
    #: ``cpus_per_task`` was not given: :data:`DEFAULT_CPUS_PER_TASK` until the node shape is known, then
    #: :func:`default_cpus_per_task` (``fit_gpus`` sets it and clears this).
    cpus_default: bool = False

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes."""
        return self.num_nodes * self.gpus_per_node

    @property
    def slurm_time(self) -> str:
        """The wall limit for ``sbatch --time``, e.g. ``04:00:00`` or ``1-02:00:00``."""
        return hours_to_slurm_time(self.time_hours)

    @property
    def timeout_seconds(self) -> int:
        """The program timeout in whole seconds, for ``timeout <seconds> <command>``: what was checked."""
        return _seconds("timeout_hours", self.timeout_hours)

    @property
    def is_multi_node(self) -> bool:
        """True when the job spans more than one node."""
        return self.num_nodes > 1

    @property
    def needs_nccl_probe(self) -> bool:
        """True for multi-node jobs and for single-node jobs with more than one GPU."""
        return self.is_multi_node or self.gpus_per_node > 1


def check_count(param: str, value: object) -> int:
    """Return ``value`` if it is a whole number of at least 1 (``bool`` is refused).

    :param param: the parameter named in the error.
    :raises ResourceError: naming the parameter, the bad value and the fix.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourceError(
            f"{param}={display_value(value)} is a {type(value).__name__}, not a whole number; "
            f"give an integer such as {param}=1"
        )
    if value < 1:
        raise ResourceError(f"{param}={value} must be at least 1; give a positive integer")
    return value


def _seconds(param: str, hours: object) -> int:
    """Validate a duration in hours and return it in whole seconds (at least 1)."""
    if isinstance(hours, bool) or not isinstance(hours, int | float):
        raise ResourceError(
            f"{param}={display_value(hours)} is a {type(hours).__name__}, not a number of hours; "
            f"give a number such as {param}=4"
        )
    if not math.isfinite(hours) or hours > MAX_HOURS:
        raise ResourceError(f"{param}={hours} is not a usable number of hours; give a finite value up to a year")
    seconds = round(hours * 3600)
    if seconds < 1:
        raise ResourceError(f"{param}={hours:g} is less than one second; give a positive number of hours")
    return seconds


def program_timeout_seconds(time_seconds: int) -> int:
    """Return the program timeout a wall time of ``time_seconds`` gets when ``timeout_hours`` is not given.

    The wall time less a margin of :data:`PROGRAM_MARGIN_FRACTION` of it, at least
    :data:`PROGRAM_MARGIN_MIN_S` (half the wall time for walls of 15 s or less): 13680 s (3.8 h) for
    4 h, 6840 s (1.9 h) for 2 h, 45 s for one minute. The margin is the time the batch script needs
    after the program ends (its exit code, its end marker, the credentials file's removal) before
    SLURM ends the job at its limit.

    :param time_seconds: the wall time in whole seconds.
    :raises ResourceError: for a wall time under 2 s, which leaves no whole second below it.
    """
    if time_seconds < 2:
        raise ResourceError(
            f"a wall time of {time_seconds} s leaves the program no timeout below it; give time_hours of at least "
            "a few seconds (SLURM grants whole minutes)"
        )
    margin = max(PROGRAM_MARGIN_MIN_S, math.ceil(time_seconds * PROGRAM_MARGIN_FRACTION))
    if margin >= time_seconds:
        margin = time_seconds // 2
    return time_seconds - margin


def seconds_as_hours(seconds: int) -> float:
    """Return the shortest number of hours that is ``seconds`` once rounded to whole seconds (as checks read it).

    For messages that suggest a value: ``45`` gives ``0.0125``, ``6840`` gives ``1.9``, ``57`` gives
    ``0.015833`` (not ``0.02``, which would be 72 s).
    """
    for places in range(2, 12):
        hours = round(seconds / 3600, places)
        if round(hours * 3600) == seconds:
            return hours
    return seconds / 3600


def default_cpus_per_task(gpus_per_node: int, node_cpus: int, node_gpus: int | None) -> int:
    """Return the CPUs per task of a GPU job that does not say: the node's CPUs for its share of the GPUs.

    One task per node, so the task gets ``node_cpus x gpus_per_node / node_gpus`` (rounded down, at
    least 1, at most ``node_cpus``): 4 of 4 GPUs on an 8-CPU node get all 8 CPUs (a whole-node job
    gets the whole node), 1 of 4 gets 2, 4 of 8 GPUs on a 64-CPU node get 32. Other jobs on the node
    get their share too, so the job never pends on CPUs its GPUs' share does not have.

    :param gpus_per_node: the GPUs the job asks for on each node.
    :param node_cpus: the CPUs of the node (sinfo ``%c``).
    :param node_gpus: the GPUs of the node; ``None`` or 0 when not known: the node's CPUs, at most
        :data:`DEFAULT_CPUS_PER_TASK`.
    """
    if not node_gpus:
        return max(1, min(node_cpus, DEFAULT_CPUS_PER_TASK))
    return max(1, min(node_cpus, node_cpus * gpus_per_node // node_gpus))


def whole_node(gpus_per_node: int, node_gpus: int | None) -> bool:
    """Whether a job of ``gpus_per_node`` GPUs on each node takes its nodes whole (``--exclusive``).

    Whole-node means the node's size: a job that asks for every GPU of the nodes it can land on takes
    them exclusively (4 of 4, 8 of 8, 16 of 16), so no other tenant's job shares them; fewer GPUs than
    that (8 of 16) share the node. This is the one rule; the batch scripts' ``#SBATCH --exclusive``
    follows it.

    :param gpus_per_node: the GPUs the job asks for on each node.
    :param node_gpus: the GPUs of the largest node the job can land on (the partitions' node size, from
        sinfo's GRES); ``None`` or 0 when it is not known.
    :returns: ``True`` for whole nodes. An unknown node size gives ``False``: the job is not made
        exclusive on a guess (it may share its nodes, and never holds GPUs it did not ask for).
    """
    return node_gpus is not None and node_gpus > 0 and gpus_per_node >= node_gpus


def _name(param: str, value: object) -> str:
    """Return ``value`` if it is a safe SLURM name (partition, account)."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or len(value) > _MAX_NAME_CHARS:
        raise ResourceError(
            f"{param}={display_value(value)} is not a valid SLURM name; use up to {_MAX_NAME_CHARS} letters, "
            "digits, '_', '.' and '-', not starting with '-'"
        )
    return value


def _items(param: str, value: object) -> list[object]:
    """Split comma separated text (not inside ``[...]``) or copy a sequence; blanks are stripped."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in _LIST_SPLIT_RE.split(value)] if value.strip() else []
    if isinstance(value, Sequence):
        return [item.strip() if isinstance(item, str) else item for item in value]
    raise ResourceError(
        f"{param}={display_value(value)} is a {type(value).__name__}; give comma separated names or a list"
    )


def parse_partitions(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Read a partition list: ``"polar,polar3"`` or ``["polar", "polar3"]``.

    :param value: comma separated names or a sequence of names; ``None``, a blank string or an empty
        sequence mean "not given" (the cluster's default partition, see :func:`resolve_partitions`).
        Blanks around names are removed, duplicates dropped.
    :returns: the partition names, in the given order (empty when none was given).
    :raises ResourceError: for an empty entry (a stray comma) or an unsafe name.
    """
    items = _items("partition", value)
    if not items:
        return ()
    names: list[str] = []
    for item in items:
        if item == "":
            raise ResourceError(f"partition={display_value(value)} has an empty entry; remove the stray comma")
        name = _name("partition", item)
        if name not in names:
            names.append(name)
    return tuple(names)


def _node(item: object) -> str:
    """Return ``item`` if it is a node name or a ``prefix[1-3,5]`` range with low <= high."""
    match = _NODE_RE.fullmatch(item) if isinstance(item, str) and len(item) <= _MAX_NAME_CHARS else None
    if match is None or any(int(low) > int(high) for low, high in _RANGE_RE.findall(match.group(1) or "")):
        raise ResourceError(
            f"exclude_nodes entry {display_value(item)} is not a node name; give names like 'node01' or "
            "ranges like 'node[01-04,07]' (low before high), separated by commas"
        )
    return match.group()


def layout_gpus(total: int, per_node: int, *, where: str = "") -> tuple[int, int]:
    """Lay ``total`` GPUs out as ``(num_nodes, gpus_per_node)`` on nodes of ``per_node`` GPUs.

    Up to ``per_node`` GPUs go on one node; above that the job takes whole nodes, so ``total`` must
    be a multiple of ``per_node``.

    :param where: the partitions' shape for the error (e.g. ``on polar (4 h, 4 GPUs/node)``).
    :raises ResourceError: for a total that does not fill whole nodes, naming the totals that do.
    """
    if total <= per_node:
        return 1, total
    if total % per_node:
        lower = total // per_node * per_node
        raise ResourceError(
            f"total_gpus={total} cannot be laid out on whole {per_node}-GPU nodes{' ' + where if where else ''}: "
            f"above {per_node} GPUs a job takes whole nodes; ask for a multiple of {per_node} "
            f"(total_gpus={lower} or {lower + per_node}) or set num_nodes and gpus_per_node"
        )
    return total // per_node, per_node


def _layout(total_gpus: object, num_nodes: int, gpus_per_node: int) -> tuple[int, int, int | None]:
    """``(num_nodes, gpus_per_node, total to lay out on the cluster)`` for a ``total_gpus`` request.

    Explicit ``num_nodes`` x ``gpus_per_node`` that multiply to the total are kept as given; with
    both left at their defaults the total is laid out on the partition's node shape later
    (:func:`~airflow_provider_tao_slurm.core.partitions.fit_gpus`); until then the seed's 8-GPU
    shape stands in.
    """
    total = check_count("total_gpus", total_gpus)
    if (num_nodes, gpus_per_node) != (DEFAULT_NUM_NODES, DEFAULT_GPUS_PER_NODE):
        if num_nodes * gpus_per_node != total:
            raise ResourceError(
                f"total_gpus={total} conflicts with num_nodes={num_nodes} x gpus_per_node={gpus_per_node}; "
                "give either total_gpus or num_nodes and gpus_per_node"
            )
        return num_nodes, gpus_per_node, None
    return -(-total // MAX_GPUS_PER_NODE), min(total, MAX_GPUS_PER_NODE), total


@dataclass(frozen=True)
class JobParameters:
    """The resource parameters every submitting operator takes, validated; build it with :func:`check_job_parameters`.

    ``partition`` is empty when none was given (the cluster's default partition, or for an image
    conversion a partition without GPUs, is chosen against the cluster later).
    """

    partition: tuple[str, ...]
    account: str | None
    cpus_per_task: int | None
    mem_mb: int | None
    time_hours: float
    gpu_type: str | None = None
    sbatch_extra: tuple[str, ...] = ()


def check_job_parameters(
    *,
    partition: str | Sequence[str] | None = None,
    account: str | None = None,
    cpus_per_task: int | None = None,
    mem_mb: int | None = None,
    time_hours: float = DEFAULT_TIME_HOURS,
    gpu_type: str | None = None,
    qos: str | None = None,
    constraint: str | None = None,
    reservation: str | None = None,
    sbatch_options: Mapping[str, Any] | None = None,
) -> JobParameters:
    """Validate the resource parameters that the submitting operators share.

    ``SbatchSubmitOperator``, ``NcclProbeOperator`` and ``EnrootImportOperator`` take them: one rule
    and one message per parameter, whichever operator takes it.

    :param partition: partition name(s), see :func:`parse_partitions` (``None`` or empty: not given).
    :param account: SLURM account, or ``None`` for the user's default.
    :param cpus_per_task: CPUs per task (one task per node), or ``None`` for the default from the node
        shape (:func:`default_cpus_per_task`).
    :param mem_mb: memory per node in MB, or ``None`` for the partition default.
    :param time_hours: the job's wall-time limit in hours.
    :param gpu_type: the GPU type (``--gres=gpu:<type>:<n>``), or ``None`` for any.
    :param qos: ``--qos``, see :func:`site_options`.
    :param constraint: ``--constraint``, see :func:`site_options`.
    :param reservation: ``--reservation``, see :func:`site_options`.
    :param sbatch_options: more sbatch options ``{long-name: value}``, see :func:`site_options`.
    :returns: the validated :class:`JobParameters`.
    :raises ResourceError: (or ``ValidationError`` for a site option) naming the parameter, the bad
        value and the fix.
    """
    cpus = None if cpus_per_task is None else check_count("cpus_per_task", cpus_per_task)
    _seconds("time_hours", time_hours)
    return JobParameters(
        partition=parse_partitions(partition),
        account=None if account is None else _name("account", account),
        cpus_per_task=cpus,
        mem_mb=None if mem_mb is None else check_count("mem_mb", mem_mb),
        time_hours=float(time_hours),
        gpu_type=None if gpu_type is None else _name("gpu_type", gpu_type),
        sbatch_extra=site_options(
            qos=qos, constraint=constraint, reservation=reservation, sbatch_options=sbatch_options
        ),
    )


def _program_timeout_hours(time_hours: float, timeout_hours: float | None, max_time_hours: float | None) -> float:
    """Check the wall time against the site rule and return the program timeout, lower than the wall time.

    :param time_hours: the job's wall time.
    :param timeout_hours: the program timeout; ``None``: derived from the wall time
        (:func:`program_timeout_seconds`).
    :param max_time_hours: the site's own wall-time rule (``None``: none).
    :returns: the program timeout in hours.
    :raises ResourceError: naming the parameter, the bad value and the fix.
    """
    time_s = _seconds("time_hours", time_hours)
    if timeout_hours is None:
        timeout_hours = program_timeout_seconds(time_s) / 3600
    timeout_s = _seconds("timeout_hours", timeout_hours)
    if max_time_hours is not None and time_s > _seconds("max_time_hours", max_time_hours):
        raise ResourceError(
            f"time_hours={time_hours:g} exceeds the site rule max_time_hours={max_time_hours:g} of this "
            "connection; lower time_hours (or the connection's max_time_hours)"
        )
    if timeout_s >= time_s:
        suggested = seconds_as_hours(program_timeout_seconds(time_s))
        raise ResourceError(
            f"timeout_hours={timeout_hours:g} must be lower than time_hours={time_hours:g}: the program has to "
            "stop (and save its results) before SLURM ends the job at the wall limit; "
            f"e.g. timeout_hours={suggested!r} ({round(suggested * 3600)} s), or leave it out to derive it"
        )
    return float(timeout_hours)


def gpu_resources(
    job: JobParameters,
    *,
    num_nodes: int = DEFAULT_NUM_NODES,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    timeout_hours: float | None = None,
    max_time_hours: float | None = None,
    requeue: bool = True,
    exclude_nodes: str | Sequence[str] | None = None,
    total_gpus: int | None = None,
) -> Resources:
    """Build a GPU job's request: the shared parameters ``job`` with the layout and the TAO timing rules.

    :param job: the shared parameters from :func:`check_job_parameters`.
    :param num_nodes: nodes to allocate.
    :param gpus_per_node: GPUs per node (what the partition's nodes can hold is checked against the
        cluster by :func:`~airflow_provider_tao_slurm.core.partitions.fit_gpus`, which also decides
        whether the job takes its nodes whole, :func:`whole_node`; until then it does not).
    :param timeout_hours: program timeout in hours; must be lower than ``job.time_hours``. ``None`` (the
        default): derived from the wall time, :func:`program_timeout_seconds`.
    :param max_time_hours: a site's own wall-time rule, stricter than the partition (``None``: none);
        the partition's limit is checked against the cluster.
    :param requeue: let SLURM requeue the job after a node failure or preemption.
    :param exclude_nodes: nodes to avoid: a list, or comma separated names and ``prefix[1-3,5]`` ranges.
    :param total_gpus: if given, decides the layout: with ``num_nodes``/``gpus_per_node`` at their
        defaults it is laid out on whole nodes of the partition's GPU count when the partition is
        known (``layout_total``); explicit values must multiply to it.
    :returns: the validated :class:`Resources`.
    :raises ResourceError: naming the parameter, the bad value and the fix.
    """
    nodes = check_count("num_nodes", num_nodes)
    gpus = check_count("gpus_per_node", gpus_per_node)
    layout_total = None
    if total_gpus is not None:
        nodes, gpus, layout_total = _layout(total_gpus, nodes, gpus)
    time_hours = job.time_hours
    timeout_hours = _program_timeout_hours(time_hours, timeout_hours, max_time_hours)
    if not isinstance(requeue, bool):
        raise ResourceError(f"requeue={display_value(requeue)} must be True or False")
    return Resources(
        num_nodes=nodes,
        gpus_per_node=gpus,
        cpus_per_task=DEFAULT_CPUS_PER_TASK if job.cpus_per_task is None else job.cpus_per_task,
        time_hours=time_hours,
        timeout_hours=timeout_hours,
        partition=",".join(job.partition),
        account=job.account,
        requeue=requeue,
        exclude_nodes=tuple(_node(item) for item in _items("exclude_nodes", exclude_nodes)),
        mem_mb=job.mem_mb,
        gpu_type=job.gpu_type,
        sbatch_extra=job.sbatch_extra,
        layout_total=layout_total,
        cpus_default=job.cpus_per_task is None,
    )


def build_resources(
    *,
    num_nodes: int = DEFAULT_NUM_NODES,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    cpus_per_task: int | None = None,
    time_hours: float = DEFAULT_TIME_HOURS,
    timeout_hours: float | None = None,
    partition: str | Sequence[str] | None,
    account: str | None = None,
    max_time_hours: float | None = None,
    requeue: bool = True,
    exclude_nodes: str | Sequence[str] | None = None,
    total_gpus: int | None = None,
    mem_mb: int | None = None,
    gpu_type: str | None = None,
    sbatch_extra: Sequence[str] = (),
) -> Resources:
    """Validate a whole GPU request in one call: :func:`check_job_parameters`, then :func:`gpu_resources`.

    :param sbatch_extra: further ``#SBATCH`` options, already built by :func:`site_options`.
    :returns: the validated :class:`Resources`.
    :raises ResourceError: naming the parameter, the bad value and the fix.
    """
    job = check_job_parameters(
        partition=partition,
        account=account,
        cpus_per_task=cpus_per_task,
        mem_mb=mem_mb,
        time_hours=time_hours,
        gpu_type=gpu_type,
    )
    return gpu_resources(
        replace(job, sbatch_extra=tuple(sbatch_extra)),
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        timeout_hours=timeout_hours,
        max_time_hours=max_time_hours,
        requeue=requeue,
        exclude_nodes=exclude_nodes,
        total_gpus=total_gpus,
    )


# ------------------------------------------------------------------ site options

#: ``sbatch_options`` the provider owns, or that would break isolation, accounting or the job's contract.
FORBIDDEN_SBATCH_OPTIONS = frozenset(
    {
        "job-name", "output", "error", "input", "open-mode", "chdir", "uid", "gid", "export", "export-file",
        "get-user-env", "wrap", "parsable", "quiet", "array", "dependency", "hold", "wait", "test-only",
        "clusters", "cluster-constraint", "requeue", "no-requeue", "signal", "priority", "nice", "mail-user",
        "partition", "account", "nodes", "ntasks", "ntasks-per-node", "gres", "gpus", "gpus-per-node",
        "gpus-per-task", "cpus-per-task", "cpus-per-gpu", "time", "exclusive", "exclude", "wait-all-nodes",
        "mem", "mem-per-cpu", "mem-per-gpu", "qos", "constraint", "reservation", "batch", "kill-on-invalid-dep",
    }
)  # fmt: skip
#: The dedicated parameter for an option that has one.
_DEDICATED = {
    "qos": "qos", "constraint": "constraint", "reservation": "reservation", "partition": "partition",
    "account": "account", "nodes": "num_nodes", "gres": "gpu_type / gpus_per_node", "gpus-per-node": "gpus_per_node",
    "cpus-per-task": "cpus_per_task", "time": "time_hours", "exclude": "exclude_nodes", "mem": "mem_mb",
    "requeue": "requeue", "no-requeue": "requeue",
    "exclusive": "gpus_per_node (every GPU of the partition's nodes takes them whole)",
}  # fmt: skip
#: Why a dedicated parameter is the only way, where more than ownership is at stake.
_WHY = {
    "gpus-per-node": "the job script asks for its GPUs with --gres=gpu:N, and sbatch (SLURM 26.05 and later) "
    "refuses --gres=gpu together with --gpus-per-node",
}
_OPTION_NAME = re.compile(r"(?:--)?([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
_OPTION_VALUE = re.compile(r"[A-Za-z0-9_.,:/@%+=&|*\[\]-]+")


def reserved_option(option: str, reserved: Collection[str]) -> str | None:
    """Return the reserved long option that ``--option`` sets in sbatch: itself, or the one it abbreviates.

    sbatch reads long options with ``getopt_long``, on ``#SBATCH`` lines too, and that takes any
    unambiguous start of a name: ``--gpus-per-n=2`` is ``--gpus-per-node=2``. So a name that starts a
    reserved name counts as that name (the first in sorted order when it starts several).

    :param option: a long option name without ``--``.
    :param reserved: the long option names that are refused.
    :returns: the reserved name, or ``None`` for an option that sets none of them.
    """
    if option in reserved:
        return option
    return min((name for name in reserved if name.startswith(option)), default=None)


def _option_value(option: str, value: object) -> str:
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    if text is None or not _OPTION_VALUE.fullmatch(text):
        raise ValidationError(
            f"--{option}={display_value(value)} cannot go on an #SBATCH line: give a string or number of letters, "
            "digits and _ . , : / @ % + = & | * [ ] - (no spaces or quotes)"
        )
    return text


def _check_site_option(option: str) -> None:
    """Refuse an ``sbatch_options`` name the provider owns, or one sbatch reads as such (an abbreviation).

    :raises ValidationError: naming the option, why, and the parameter to use instead.
    """
    meant = "container" if option.startswith("container") else reserved_option(option, FORBIDDEN_SBATCH_OPTIONS)
    if meant is None:
        return
    shown = f"--{option}" + (f" (sbatch takes it for --{meant})" if meant not in (option, "container") else "")
    instead = _DEDICATED.get(meant)
    why = f" ({_WHY[meant]})" if meant in _WHY else ""
    raise ValidationError(
        f"sbatch_options may not set {shown}{why}: "
        + (
            f"use the operator's {instead} parameter"
            if instead
            else "the provider sets it or it would break the job's isolation, naming or accounting; remove it"
        )
    )


def site_options(
    *,
    qos: str | None = None,
    constraint: str | None = None,
    reservation: str | None = None,
    sbatch_options: object = None,
) -> tuple[str, ...]:
    """Return the ``#SBATCH`` options a site needs beyond the provider's own, validated.

    :param qos: ``--qos``.
    :param constraint: ``--constraint`` (node features: ``h100``, ``a100&ib``, ``[r1|r2]``).
    :param reservation: ``--reservation`` (comma separated names allowed).
    :param sbatch_options: more options as ``{long-name: value}``; ``True`` for a flag. Long names
        only (``"mail-type"`` or ``"--mail-type"``); options the provider sets or that would break
        isolation (``--uid``, ``--output``, ``--job-name``, ``--export``, ``--wrap`` ...) are refused,
        and so is any abbreviation sbatch would read as one of them (:func:`reserved_option`).
    :returns: ``("--qos=high", "--constraint=h100", "--mail-type=END", ...)``.
    :raises ValidationError: naming the option and the fix.
    """
    lines: list[str] = []
    for name, value in (("qos", qos), ("constraint", constraint), ("reservation", reservation)):
        if value is not None:
            if not isinstance(value, str) or not value.strip():
                raise ValidationError(f"{name}={display_value(value)} must be a non-empty string (or None)")
            lines.append(f"--{name}={_option_value(name, value.strip())}")
    if sbatch_options is None:
        return tuple(lines)
    if not isinstance(sbatch_options, Mapping):
        raise ValidationError(
            f"sbatch_options must be a mapping {{long option name: value}}, got {type(sbatch_options).__name__}"
        )
    for key, value in sbatch_options.items():
        match = _OPTION_NAME.fullmatch(key) if isinstance(key, str) else None
        if match is None:
            raise ValidationError(
                f"sbatch_options key {display_value(key)} is not a long option name; give names such as 'mail-type' "
                "(short options like '-x' are not accepted)"
            )
        option = match.group(1)
        _check_site_option(option)
        if value is True:
            lines.append(f"--{option}")
        elif value is False or value is None:
            continue
        else:
            lines.append(f"--{option}={_option_value(option, value)}")
    return tuple(lines)


def requested_gpu_hours(num_nodes: int, gpus_per_node: int, time_hours: float) -> float:
    """Return the GPU hours a request can use: ``num_nodes * gpus_per_node * time_hours``, rounded to 4 places.

    The wall time is the most a job can run, so this is what a budget check or an approval weighs
    before submitting; what a finished job did use comes from accounting
    (:class:`~airflow_provider_tao_slurm.core.usage.JobUsage`).

    :param num_nodes: nodes requested.
    :param gpus_per_node: GPUs requested on each node.
    :param time_hours: the wall time requested, in hours.
    :raises ResourceError: for a count that is not a whole number of at least 1, or a time that is not
        a positive number of hours (as :func:`gpu_resources` refuses them).
    """
    nodes = check_count("num_nodes", num_nodes)
    gpus = check_count("gpus_per_node", gpus_per_node)
    _seconds("time_hours", time_hours)
    return round(nodes * gpus * time_hours, 4)


@dataclass(frozen=True)
class GpuHours:
    """What a request can cost in GPU hours: one slice (one SLURM job), and at most over its chain.

    :param per_slice: one job's GPU hours, :func:`requested_gpu_hours`.
    :param slices: the most jobs the request can run: ``max_continuations + 1`` (1 for a job that is
        not continued).
    :param at_most: ``slices`` times one slice, rounded to 4 places: what a budget is judged on.
    """

    num_nodes: int
    gpus_per_node: int
    time_hours: float
    per_slice: float
    slices: int
    at_most: float

    def describe(self) -> str:
        """``2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours per slice; at most 2 slices = 8 GPU hours``."""
        text = (
            f"{self.num_nodes} node(s) x {self.gpus_per_node} GPU(s) per node x {format_duration(self.time_hours)} = "
            f"{self.per_slice:g} GPU hours"
        )
        if self.slices == 1:
            return text
        return f"{text} per slice; at most {self.slices} slices = {self.at_most:g} GPU hours"


def gpu_hours_request(num_nodes: int, gpus_per_node: int, time_hours: float, max_continuations: int = 0) -> GpuHours:
    """Return what a request can cost: one slice (:func:`requested_gpu_hours`) and at most ``slices x slice``.

    A training continued from its checkpoints (``max_continuations=N``) runs up to ``N + 1`` jobs of the
    same request, each of which can use its whole wall time, so a budget limit is judged on
    :attr:`GpuHours.at_most`; for a job that is not continued the two figures are the same.

    :param max_continuations: as ``SbatchSubmitOperator(max_continuations=...)`` (0: not continued).
    :raises ResourceError: as :func:`requested_gpu_hours`, or for ``max_continuations`` that is not a
        whole number from 0.
    """
    per_slice = requested_gpu_hours(num_nodes, gpus_per_node, time_hours)
    if isinstance(max_continuations, bool) or not isinstance(max_continuations, int) or max_continuations < 0:
        raise ResourceError(
            f"max_continuations={display_value(max_continuations)} must be a whole number from 0 (not continued)"
        )
    slices = max_continuations + 1
    at_most = round(slices * num_nodes * gpus_per_node * time_hours, 4)  # from the exact slice, rounded once
    return GpuHours(num_nodes, gpus_per_node, time_hours, per_slice, slices, at_most)


_DURATION_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def format_duration(hours: float) -> str:
    """Write a duration for people, exactly to the second: ``45 s``, ``1 min``, ``1 h 30 min``, ``2 d 4 h``.

    The one form every message uses for a time limit or a wall time (never ``0.0166667 h``): whole
    days, hours, minutes and seconds, largest first, the zero ones left out.

    :param hours: a duration in hours (rounded to whole seconds; what rounds to none reads ``0 s``).
    :returns: e.g. ``1 min`` for 1/60, ``1 h 30 min`` for 1.5, ``3 h 48 min`` for 3.8, ``2 d`` for 48.
    """
    rest = max(round(hours * 3600), 0)
    parts = []
    for unit, size in _DURATION_UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count} {unit}")
    return " ".join(parts) or "0 s"


def hours_to_slurm_time(hours: float) -> str:
    """Format hours as sbatch's ``--time``: whole minutes, rounded up, ``HH:MM:00`` or ``D-HH:MM:00``.

    SLURM keeps time limits in whole minutes (a ``--time`` with seconds is rounded up by sbatch
    itself), so the text says what the job gets: never less than asked, never 0 (no limit).

    :param hours: a positive, finite number of hours (rounded to whole seconds first).
    :returns: e.g. ``04:00:00`` for 4, ``00:15:00`` for 0.25, ``00:01:00`` for 1/60 or 0.001,
        ``1-02:00:00`` for 26.
    :raises ResourceError: for a non-number, NaN, infinity, or less than one second.
    """
    minutes = -(-_seconds("hours", hours) // 60)
    days, rest = divmod(minutes, 1440)
    clock = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{clock}" if days else clock


def parse_slurm_time(text: str) -> float | None:
    """Read a SLURM time such as ``sinfo``'s partition ``MaxTime``.

    Forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; ``UNLIMITED``/``INFINITE``.

    :param text: the time text (surrounding blanks ignored, case-insensitive keywords).
    :returns: hours, or ``None`` for an unlimited time.
    :raises ResourceError: if the text is not a SLURM time.
    """
    cleaned = text.strip() if isinstance(text, str) else ""
    if cleaned.upper() in _UNLIMITED:
        return None
    days_text, dash, clock = cleaned.rpartition("-") if "-" in cleaned else ("0", "", cleaned)
    fields = clock.split(":")
    if not all(_DIGITS_RE.fullmatch(part) for part in (days_text, *fields)) or len(fields) > 3:
        raise ResourceError(
            f"cannot read the SLURM time {display_value(text)}; expected minutes, MM:SS, HH:MM:SS, D-HH, "
            "D-HH:MM, D-HH:MM:SS or UNLIMITED"
        )
    numbers = [int(part) for part in fields]
    if not dash and len(numbers) < 3:
        numbers.insert(0, 0)  # without days, "M" is minutes and "M:S" minutes:seconds
    hours, minutes, seconds = (*numbers, 0, 0)[:3]
    return (int(days_text) * 86400 + hours * 3600 + minutes * 60 + seconds) / 3600


# ------------------------------------------------------------------ the previous release's names


def check_partition_limits(
    time_hours: float, partitions: Sequence[str], known: Sequence[Partition], param: str = "time_hours"
) -> None:
    """Check partition limits: deprecated, goes in the next release; use ``core.partitions.check_partition_limits``.

    Calls it with the same arguments (``known``: partitions as
    :class:`~airflow_provider_tao_slurm.core.partitions.Partition`, which ``PartitionLimit`` now is).
    """
    from airflow_provider_tao_slurm.core import partitions as current
    from airflow_provider_tao_slurm.core.deprecated import warn_moved

    warn_moved("core.resources.check_partition_limits", "core.partitions.check_partition_limits")
    current.check_partition_limits(time_hours, partitions, known, param)


if not TYPE_CHECKING:  # mypy keeps checking every other name of the module

    def __getattr__(name: str) -> Any:
        """Give ``PartitionLimit``: deprecated, goes in the next release; use ``core.partitions.Partition``.

        The name gives that class itself (``Partition(name, max_time_hours, is_default)`` as before, with
        the node shape after them), with a ``DeprecationWarning``.
        """
        if name == "PartitionLimit":
            from airflow_provider_tao_slurm.core import partitions as current
            from airflow_provider_tao_slurm.core.deprecated import warn_moved

            warn_moved("core.resources.PartitionLimit", "core.partitions.Partition")
            return current.Partition
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
