"""NCCL probe planning: candidate environments, the probe command, its verdict, the per-cluster cache.

Pure. Before a multi-node job (or a single-node job with several GPUs) runs, a tiny job all-reduces
once over the same shape of GPUs with the probe program
(:mod:`airflow_provider_tao_slurm.probes.nccl_probe`). A hang (the job's own timeout fires) or a
failed collective moves on to the next candidate environment; the first environment that works
is cached per cluster on shared storage and handed to the real job.

The rendezvous math (global world size and rank from the TAO variables) lives in the probe
program, because it runs standalone inside the training image; this module only reads the
markers the probe prints.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.core.storage import display_value, resolve_cluster_path
from airflow_provider_tao_slurm.exceptions import ValidationError
from airflow_provider_tao_slurm.probes.nccl_probe import FAILED_MARKER, OK_MARKER, SETUP_ERROR_MARKER

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.layout import JobLayout
    from airflow_provider_tao_slurm.core.resources import Resources

#: Tried in order when the operator is given no ``candidate_envs``: nothing, then NCCL without
#: peer-to-peer transport, then also without InfiniBand and with sockets off loopback/docker.
DEFAULT_CANDIDATE_ENVS: tuple[Mapping[str, str], ...] = (
    {},
    {"NCCL_P2P_DISABLE": "1"},
    {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo,docker"},
)
#: The probe job's wall limit is its program timeout plus this, so a probe that ignores the
#: timeout's SIGTERM is still ended by SLURM.
WALL_GRACE_S = 120
#: Exit status of ``timeout`` when it stopped the program.
TIMEOUT_EXIT = 124
PROBE_FILE = "nccl_probe.py"
CACHE_DIR = "nccl"
CACHE_VERSION = 1
MIN_TIMEOUT_S = 10

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSAFE_NAME_RE = re.compile(r"[^A-Za-z0-9_.-]+")


class Verdict(StrEnum):
    """How one probe job ended."""

    OK = "ok"
    #: the job's timeout (or wall limit) stopped a hung collective: try the next environment.
    TIMEOUT = "timeout"
    #: the collective failed or gave a wrong sum: try the next environment.
    FAILED = "failed"
    #: the probe could not start (no torch, bad rendezvous variables): no environment can help.
    SETUP_ERROR = "setup_error"
    #: cancelled, preempted, node failure or lost: not a verdict on the environment.
    ABORTED = "aborted"

    @property
    def next_candidate_may_help(self) -> bool:
        """True for the verdicts that say the NCCL settings were wrong."""
        return self in (Verdict.TIMEOUT, Verdict.FAILED)


@dataclass(frozen=True)
class ProbeOutcome:
    """The verdict on one probe job and the evidence for it."""

    verdict: Verdict
    detail: str


@dataclass(frozen=True)
class CachedEnv:
    """A cache entry: the working environment and where it was proven."""

    env: dict[str, str]
    probed_at: str
    slurm_job_id: str
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class ProbeAttempt:
    """One candidate environment and the job that tries it.

    :param index: the candidate's position in ``candidate_envs``.
    :param env: the NCCL environment it tries.
    :param layout: where the probe job's script, logs and exit code live.
    :param script: the rendered batch script.
    """

    index: int
    env: dict[str, str]
    layout: JobLayout
    script: str

    @property
    def job_name(self) -> str:
        """The probe job's name (its layout's job id)."""
        return self.layout.job_id


@dataclass(frozen=True)
class ProbePlan:
    """Everything the probe needs, computed without SSH (and again, identically, on resume)."""

    resources: Resources
    cluster: str
    scope: str
    cache_path: str
    attempts: tuple[ProbeAttempt, ...]

    @property
    def world_size(self) -> int:
        """How many GPUs the probe spans."""
        return self.resources.total_gpus


def candidate_envs(given: Sequence[Mapping[str, Any]] | None) -> list[dict[str, str]]:
    """The environments to try, in order.

    :param given: the operator's ``candidate_envs``, or ``None`` for :data:`DEFAULT_CANDIDATE_ENVS`.
    :returns: copies of the environments.
    :raises ValidationError: for an empty list, a non-mapping entry, a bad variable name or a
        non-string value.
    """
    if given is None:
        return [dict(env) for env in DEFAULT_CANDIDATE_ENVS]
    if isinstance(given, str | bytes | Mapping) or not isinstance(given, Sequence) or not given:
        raise ValidationError(
            f"candidate_envs={display_value(given)} must be a non-empty list of dicts, e.g. "
            '[{}, {"NCCL_P2P_DISABLE": "1"}]; pass None for the defaults'
        )
    envs: list[dict[str, str]] = []
    for index, env in enumerate(given):
        if not isinstance(env, Mapping):
            raise ValidationError(f"candidate_envs[{index}] is a {type(env).__name__}; give a dict of variables")
        for name, value in env.items():
            if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
                raise ValidationError(
                    f"candidate_envs[{index}] name {display_value(name)} is not an environment variable name "
                    "([A-Za-z_][A-Za-z0-9_]*)"
                )
            if not isinstance(value, str):
                raise ValidationError(
                    f"candidate_envs[{index}][{name!r}] is a {type(value).__name__}; give the value as a string"
                )
        envs.append(dict(env))
    return envs


def probe_scope(nodes: int) -> str:
    """The cache scope: a multi-node environment (network) is kept apart from a single-node one."""
    return "multi-node" if nodes > 1 else "single-node"


def cache_path(results_dir: str, cluster_name: str, scope: str) -> str:
    """Where the working environment of a cluster is cached: ``<results_dir>/nccl/<cluster>.<scope>.json``.

    :param results_dir: the connection's shared base directory.
    :param cluster_name: the connection's cluster name (unsafe characters become ``_``).
    :param scope: :func:`probe_scope`.
    :raises ValidationError: for a results dir that is not an absolute cluster path, or an empty name.
    """
    base = resolve_cluster_path(results_dir, param="results_dir")
    name = _UNSAFE_NAME_RE.sub("_", cluster_name).strip("._")
    if not name:
        raise ValidationError(f"cluster_name {display_value(cluster_name)} is empty; set the connection's cluster_name")
    return f"{base}/{CACHE_DIR}/{name}.{scope}.json"


def cache_text(
    env: Mapping[str, str],
    *,
    cluster_name: str,
    scope: str,
    nodes: int,
    gpus_per_node: int,
    slurm_job_id: str,
    now: str,
) -> str:
    """Serialise a cache entry (JSON, sorted keys, one line).

    :param now: ISO-8601 UTC time of the successful probe.
    """
    return (
        json.dumps(
            {
                "version": CACHE_VERSION,
                "cluster": cluster_name,
                "scope": scope,
                "env": dict(env),
                "probed_at": now,
                "slurm_job_id": slurm_job_id,
                "nodes": nodes,
                "gpus_per_node": gpus_per_node,
            },
            sort_keys=True,
        )
        + "\n"
    )


def parse_cache(text: str, *, cluster_name: str, scope: str) -> CachedEnv:
    """Read a cache entry written by :func:`cache_text`.

    :raises ValidationError: when the text is not a cache entry of this version, cluster and scope,
        or its environment is not a dict of strings (the caller probes again).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"the NCCL cache is not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        raise ValidationError(f"the NCCL cache is not a version-{CACHE_VERSION} entry")
    if data.get("cluster") != cluster_name or data.get("scope") != scope:
        raise ValidationError(
            f"the NCCL cache is for {data.get('cluster')!r}/{data.get('scope')!r}, not {cluster_name!r}/{scope!r}"
        )
    env = data.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValidationError("the NCCL cache's env is not a dict of strings")
    return CachedEnv(
        env=env,
        probed_at=str(data.get("probed_at")),
        slurm_job_id=str(data.get("slurm_job_id")),
        nodes=int(data.get("nodes") or 0),
        gpus_per_node=int(data.get("gpus_per_node") or 0),
    )


def probe_command(probe_path: str, *, nodes: int, gpus_per_node: int, python: str) -> str:
    """The shell command each node runs: torchrun (``python -m torch.distributed.run``) on the probe.

    Multi-node, the sbatch template has exported the TAO rendezvous (``TAO_NODE_COUNT``,
    ``TAO_GPUS_PER_NODE``, ``TAO_NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), which torchrun
    keeps while it sets its own ``WORLD_SIZE`` and ``RANK``. Single-node, the command exports the
    TAO values itself and torchrun runs ``--standalone`` (a free local port).

    :param probe_path: absolute path of the staged probe program.
    :param python: the image's Python with PyTorch.
    """
    if not probe_path.startswith("/"):
        raise ValidationError(f"probe path {probe_path!r} must be absolute")
    if not isinstance(python, str) or not python.strip():
        raise ValidationError("python is empty; give the image's Python, e.g. python3")
    launcher = f"exec {quote(python)} -m torch.distributed.run"
    if nodes > 1:
        return (
            f'{launcher} --nnodes="$TAO_NODE_COUNT" --nproc-per-node="$TAO_GPUS_PER_NODE" '
            '--node-rank="$TAO_NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" '
            f"{quote(probe_path)}"
        )
    return (
        f"export TAO_NODE_COUNT=1 TAO_GPUS_PER_NODE={gpus_per_node} TAO_NODE_RANK=0; "
        f"{launcher} --standalone --nnodes=1 --nproc-per-node={gpus_per_node} {quote(probe_path)}"
    )


def _marker_line(log_text: str, marker: str) -> str | None:
    lines = [line.strip() for line in log_text.splitlines() if marker in line]
    return lines[-1] if lines else None


def judge_probe(*, native_state: str, exit_code: int | None, log_text: str, world_size: int) -> ProbeOutcome:
    """Decide how a finished probe job went, from its SLURM state, exit code and log.

    :param native_state: the job's final SLURM state (``COMPLETED``, ``FAILED``, ``TIMEOUT``, ...).
    :param exit_code: the job's exit code (the step's: 124 when ``timeout`` stopped it).
    :param log_text: the end of the job's ``main.out`` and ``main.err``.
    :param world_size: the number of processes the probe had to span.
    :returns: the verdict and its evidence.
    """
    ok_line = _marker_line(log_text, OK_MARKER)
    if native_state == "COMPLETED":
        if ok_line is not None and f" world={world_size} " in f"{ok_line} ":
            return ProbeOutcome(Verdict.OK, ok_line)
        return ProbeOutcome(
            Verdict.FAILED,
            f"the job completed but its log has no '{OK_MARKER} world={world_size}' line"
            + (f" (it has: {ok_line})" if ok_line else ""),
        )
    setup_line = _marker_line(log_text, SETUP_ERROR_MARKER)
    if setup_line is not None:
        return ProbeOutcome(Verdict.SETUP_ERROR, setup_line)
    if native_state == "TIMEOUT" or exit_code == TIMEOUT_EXIT:
        return ProbeOutcome(
            Verdict.TIMEOUT,
            "the all-reduce did not finish before the timeout (hung collective)"
            if exit_code == TIMEOUT_EXIT
            else "SLURM stopped the job at its wall limit (hung collective)",
        )
    if native_state in ("FAILED", "OUT_OF_MEMORY"):
        failed_line = _marker_line(log_text, FAILED_MARKER)
        return ProbeOutcome(Verdict.FAILED, failed_line or f"the job ended {native_state} with exit code {exit_code}")
    return ProbeOutcome(Verdict.ABORTED, f"the job ended {native_state or 'unseen'} (exit code {exit_code})")
