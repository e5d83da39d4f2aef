"""Which nodes an infrastructure resubmission avoids, and whether the partition can still run the job.

Pure: the job-lifecycle layer feeds it the failed job's allocation, the verdict of
:func:`~airflow_provider_tao_slurm.core.failures.classify` and ``sinfo``'s node rows.

The rule: exclude what the evidence names (the nodes of a NODE_FAIL/BOOT_FAIL that the scheduler
now shows down, drained or failing; the nodes a hardware log line names), the whole allocation
only when the evidence names none, and never so many nodes that the partition can no longer fit
the job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_tao_slurm.core.states import INFRA_NATIVE_STATES, JobState

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.commands import NodeRow
    from airflow_provider_tao_slurm.core.failures import Classification


@dataclass(frozen=True)
class Exclusion:
    """The nodes a resubmission avoids and why.

    :param nodes: nodes to add to the job's exclude list (this failure's only).
    :param why: which evidence named them, in words.
    """

    nodes: tuple[str, ...]
    why: str


def _named(node: str, text: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(node)}(?![\w-]|\.\w)", text) is not None


def nodes_to_exclude(
    state: JobState, verdict: Classification, allocation: Sequence[str], rows: Sequence[NodeRow]
) -> Exclusion:
    """Return the failed nodes, as precisely as the evidence allows.

    :param state: the failed job's final state.
    :param verdict: the classification (its ``evidence`` is searched for node names).
    :param allocation: the job's nodes (its hostlist expanded).
    :param rows: ``sinfo`` node rows (:func:`~airflow_provider_tao_slurm.core.commands.parse_node_states`).
    """
    allocation = list(dict.fromkeys(allocation))
    if not allocation:
        return Exclusion((), "the job had no nodes yet: nothing to exclude")
    if not verdict.blames_node:
        return Exclusion((), f"the evidence shows no node at fault ({verdict.evidence})")
    if state.native in INFRA_NATIVE_STATES:
        broken = [node for node in allocation if any(r.name == node and not r.usable for r in rows)]
        if broken:
            return Exclusion(tuple(broken), f"{state.native}: the scheduler shows {', '.join(broken)} unusable")
    named = [node for node in allocation if _named(node, verdict.evidence)]
    if named:
        return Exclusion(tuple(named), f"named by the evidence ({verdict.evidence})")
    return Exclusion(tuple(allocation), "the evidence names no node: the whole allocation")


def remaining_nodes(partitions: Sequence[str], excluded: Sequence[str], rows: Sequence[NodeRow]) -> list[str]:
    """Return the nodes of ``partitions`` outside ``excluded``, each once, in sinfo's order.

    A node that is down now still counts (it may come back): what matters is whether a job with
    this exclude list could ever start, which is what sbatch itself checks.
    """
    wanted = set(partitions)
    avoid = set(excluded)
    return list(dict.fromkeys(row.name for row in rows if row.partition in wanted and row.name not in avoid))
