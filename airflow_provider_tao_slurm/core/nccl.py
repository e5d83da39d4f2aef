"""NCCL probe planning: candidate environments, the probe command, its verdict, the per-cluster cache.

Pure. Before a multi-node job (or a single-node job with several GPUs) runs, a tiny job all-reduces
once over the same shape of GPUs with the probe program
(:mod:`airflow_provider_tao_slurm.probes.nccl_probe`). A hang (the job's own timeout fires) or a
failed collective moves on to the next candidate environment; the first environment that works
is cached on shared storage and handed to the real job.

The probe is told its backend: ``nccl`` (the default, for GPU partitions) or ``gloo`` (only for a
CPU test cluster). A probe told ``nccl`` that finds no CUDA in the container, or any result that
did not come from NCCL, is refused at once (:attr:`Verdict.NO_CUDA`): no NCCL setting can help.

The cache (:func:`cache_path`, :func:`lookup_cache`, :func:`cache_text`): one file per cluster and
partition(s), ``<results_dir>/nccl/<cluster>.<partition>.json``, with one entry per node-count
scope (multi-node or single-node) and backend. An entry is used only while it is younger than the
operator's ``cache_max_age_hours``, was proven with the same image (the NCCL library ships in the
image), and agrees with the driver and NCCL versions that the latest probe of the file saw: every
probe prints the versions it sees, each entry keeps its own, and the file keeps the latest. So a
probe of one scope that meets a new driver invalidates the other scope's entry, with no extra job
and no read from the compute nodes; what no probe has seen yet is bounded by the expiry. Anything
else in the file (another version of the provider, a broken file) is a miss, never an error.

The rendezvous math (global world size and rank from the TAO variables) lives in the probe
program, because it runs standalone inside the training image; this module only reads the
markers the probe prints.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import DEFAULT_NCCL_CACHE_MAX_AGE_HOURS
from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.core.storage import display_value, resolve_cluster_path
from airflow_provider_tao_slurm.exceptions import ValidationError
from airflow_provider_tao_slurm.probes.nccl_probe import (
    BACKENDS,
    FAILED_MARKER,
    GLOO,
    NCCL,
    NO_CUDA_MARKER,
    OK_MARKER,
    SETUP_ERROR_MARKER,
    UNSEEN,
)

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
#: Version 1 (one file per cluster and scope, no backend, versions or expiry) is read as a miss.
CACHE_VERSION = 2
MIN_TIMEOUT_S = 10
#: The versions whose change (between an entry and a later probe) invalidates the entry.
COMPARED_VERSIONS = ("driver", "nccl")

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSAFE_NAME_RE = re.compile(r"[^A-Za-z0-9_.-]+")
_FIELD_RE = re.compile(r"([a-z_]+)=(\S+)")


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
    #: NCCL was required but the container has no CUDA (or the result did not come from NCCL): no
    #: environment can help; the image, the GPU request or the container is wrong.
    NO_CUDA = "no_cuda"

    @property
    def next_candidate_may_help(self) -> bool:
        """True for the verdicts that say the NCCL settings were wrong."""
        return self in (Verdict.TIMEOUT, Verdict.FAILED)


@dataclass(frozen=True)
class SeenVersions:
    """What a probe saw on rank 0's node (``None``: it could not see it, e.g. no driver on a CPU test)."""

    nccl: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    #: the partition the probe job ran on (``SLURM_JOB_PARTITION``).
    partition: str | None = None

    @classmethod
    def from_fields(cls, fields: Mapping[str, object]) -> SeenVersions:
        """Read the probe's ``name=value`` fields (or a cache entry's dict); ``none`` and non-text are unseen."""
        values = {}
        for name in ("nccl", "driver", "cuda", "torch", "partition"):
            value = fields.get(name)
            values[name] = value if isinstance(value, str) and value and value != UNSEEN else None
        return cls(**values)

    @property
    def known(self) -> bool:
        """True when the probe saw a driver or an NCCL version (a CPU test sees neither)."""
        return any(getattr(self, name) for name in COMPARED_VERSIONS)

    def changes_from(self, earlier: SeenVersions) -> list[str]:
        """``driver 535.104.05 -> 550.54.15`` for each compared version both saw, and that differs."""
        changes = []
        for name in COMPARED_VERSIONS:
            before, now = getattr(earlier, name), getattr(self, name)
            if before and now and before != now:
                changes.append(f"{name} {before} -> {now}")
        return changes

    def describe(self) -> str:
        """``NCCL 2.18.1, driver 535.104.05, CUDA 12.1, torch 2.3.0`` (what was seen), for logs."""
        labels = (("NCCL", self.nccl), ("driver", self.driver), ("CUDA", self.cuda), ("torch", self.torch))
        parts = [f"{label} {value}" for label, value in labels if value]
        return ", ".join(parts) or "no NCCL, driver or CUDA version seen"


@dataclass(frozen=True)
class ProbeOutcome:
    """The verdict on one probe job and the evidence for it.

    :ivar seen: the versions the probe reported (known only for :attr:`Verdict.OK`).
    """

    verdict: Verdict
    detail: str
    seen: SeenVersions = field(default_factory=SeenVersions)


@dataclass(frozen=True)
class CacheKey:
    """What a cached environment answers for.

    :ivar cluster: the connection's cluster name.
    :ivar partitions: the partition(s) the probe was submitted to, sorted.
    :ivar scope: :func:`probe_scope` (multi-node or single-node).
    :ivar backend: ``nccl``, or ``gloo`` for a CPU test (their entries never answer for each other).
    :ivar image: the ``.sqsh`` the probe ran (the NCCL library ships in it).
    """

    cluster: str
    partitions: tuple[str, ...]
    scope: str
    backend: str
    image: str

    @property
    def entry_name(self) -> str:
        """The entry's name inside the partition's cache file: ``multi-node/nccl``."""
        return f"{self.scope}/{self.backend}"

    def describe(self) -> str:
        """``cluster 'mini', partition polar, multi-node, backend nccl`` for logs."""
        return f"cluster {self.cluster!r}, partition {','.join(self.partitions)}, {self.scope}, backend {self.backend}"


@dataclass(frozen=True)
class CachedEnv:
    """A cache entry: the working environment and where, when and with what it was proven."""

    env: dict[str, str]
    probed_at: str
    slurm_job_id: str
    nodes: int
    gpus_per_node: int
    backend: str = NCCL
    image: str = ""
    seen: SeenVersions = field(default_factory=SeenVersions)


@dataclass(frozen=True)
class CacheLookup:
    """A cache read: the usable entry, or ``None`` and why not (a miss is never an error)."""

    entry: CachedEnv | None
    reason: str = ""


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
    key: CacheKey
    cache_path: str
    attempts: tuple[ProbeAttempt, ...]

    @property
    def world_size(self) -> int:
        """How many GPUs the probe spans."""
        return self.resources.total_gpus

    @property
    def cluster(self) -> str:
        """The connection's cluster name."""
        return self.key.cluster

    @property
    def backend(self) -> str:
        """The backend the probe is told to use."""
        return self.key.backend


def check_backend(value: object) -> str:
    """Return the probe's backend: ``nccl`` (GPU partitions) or ``gloo`` (only a CPU test cluster without CUDA).

    :raises ValidationError: for anything else.
    """
    if value not in BACKENDS:
        raise ValidationError(
            f"backend={display_value(value)} must be {NCCL!r} (the default: GPU partitions, proves NCCL) or "
            f"{GLOO!r} (only a CPU test cluster without CUDA, e.g. the local test cluster of make demo)"
        )
    return str(value)


def check_max_age(value: object) -> float:
    """``cache_max_age_hours``: a positive number of hours.

    :raises ValidationError: for anything else (``force=True`` probes regardless of the cache).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ValidationError(
            f"cache_max_age_hours={display_value(value)} must be a positive number of hours "
            f"(default {DEFAULT_NCCL_CACHE_MAX_AGE_HOURS:g}, a week); use force=True to probe regardless of the cache"
        )
    return float(value)


def candidate_envs(given: Sequence[Mapping[str, Any]] | None) -> list[dict[str, str]]:
    """Return the environments to try, in order.

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
    """Return the cache scope: a multi-node environment (network) is kept apart from a single-node one."""
    return "multi-node" if nodes > 1 else "single-node"


def cache_key(cluster_name: str, partitions: Sequence[str], nodes: int, backend: str, image: str) -> CacheKey:
    """Return the key of a probe's cache entry.

    :param cluster_name: the connection's cluster name.
    :param partitions: the partition(s) the probe is submitted to (order does not matter).
    :param nodes: the job's node count (gives the scope, :func:`probe_scope`).
    :param backend: :func:`check_backend`.
    :param image: the ``.sqsh`` path of the probe's image.
    """
    return CacheKey(
        cluster=cluster_name,
        partitions=tuple(sorted(set(partitions))),
        scope=probe_scope(nodes),
        backend=check_backend(backend),
        image=image,
    )


def _safe_name(text: str) -> str:
    return _UNSAFE_NAME_RE.sub("_", text).strip("._")


def cache_path(results_dir: str, key: CacheKey) -> str:
    """Return the cache file of a cluster and its partition(s): ``<results_dir>/nccl/<cluster>.<partition>.json``.

    Several partitions are joined with ``+`` (``polar+polar3``); characters unsafe in a file name
    become ``_``.

    :param results_dir: the connection's shared base directory.
    :param key: :func:`cache_key`.
    :raises ValidationError: for a results dir that is not an absolute cluster path, or an empty name.
    """
    base = resolve_cluster_path(results_dir, param="results_dir")
    name = _safe_name(key.cluster)
    if not name:
        raise ValidationError(f"cluster_name {display_value(key.cluster)} is empty; set the connection's cluster_name")
    partitions = "+".join(_safe_name(partition) for partition in key.partitions)
    if not partitions or not all(_safe_name(partition) for partition in key.partitions):
        raise ValidationError(f"partition {display_value(key.partitions)} has no usable name for the NCCL cache")
    return f"{base}/{CACHE_DIR}/{name}.{partitions}.json"


def _entry_dict(entry: CachedEnv) -> dict[str, Any]:
    return {
        "env": dict(entry.env),
        "backend": entry.backend,
        "image": entry.image,
        "probed_at": entry.probed_at,
        "slurm_job_id": entry.slurm_job_id,
        "nodes": entry.nodes,
        "gpus_per_node": entry.gpus_per_node,
        "seen": asdict(entry.seen),
    }


def _cache_file(text: str | None, key: CacheKey) -> tuple[dict[str, Any] | None, str]:
    """Return the parsed cache file of ``key``'s cluster and partitions, or ``None`` and why it cannot be used."""
    if text is None:
        return None, "no cache file yet"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"the cache file is not JSON ({exc.msg})"
    if not isinstance(data, dict):
        return None, "the cache file is not a JSON object"
    if data.get("version") != CACHE_VERSION:
        return None, (
            f"the cache file is a version-{display_value(data.get('version'))} entry of another provider release, "
            f"not version {CACHE_VERSION}"
        )
    if data.get("cluster") != key.cluster or data.get("partitions") != list(key.partitions):
        return None, (
            f"the cache file is for cluster {display_value(data.get('cluster'))}, partitions "
            f"{display_value(data.get('partitions'))}"
        )
    if not isinstance(data.get("entries"), dict):
        return None, "the cache file has no entries"
    return data, ""


def _parse_entry(raw: object) -> CachedEnv | None:
    if not isinstance(raw, dict):
        return None
    env, seen = raw.get("env"), raw.get("seen")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    texts = [raw.get(name) for name in ("backend", "image", "probed_at", "slurm_job_id")]
    nodes, gpus_per_node = raw.get("nodes"), raw.get("gpus_per_node")
    if not all(isinstance(t, str) for t in texts) or not isinstance(nodes, int) or not isinstance(gpus_per_node, int):
        return None
    backend, image, probed_at, slurm_job_id = (str(t) for t in texts)
    return CachedEnv(
        env=dict(env),
        probed_at=probed_at,
        slurm_job_id=slurm_job_id,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        backend=backend,
        image=image,
        seen=SeenVersions.from_fields(seen if isinstance(seen, dict) else {}),
    )


def _time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def lookup_cache(text: str | None, key: CacheKey, *, now: str, max_age_hours: float) -> CacheLookup:
    """Find the usable entry for ``key`` in a cache file's text; never raises.

    :param text: the cache file (``None``: there is none).
    :param now: the current ISO-8601 UTC time.
    :param max_age_hours: entries proven longer ago are stale.
    :returns: the entry, or ``None`` and the reason: no or unreadable file (including one written by
        another provider release), no entry for the key, another image, too old, or a later probe of
        the same partition saw another driver or NCCL version.
    """
    data, reason = _cache_file(text, key)
    if data is None:
        return CacheLookup(None, reason)
    raw = data["entries"].get(key.entry_name)
    if raw is None:
        return CacheLookup(None, f"the cache file has no {key.scope} entry for backend {key.backend}")
    entry = _parse_entry(raw)
    if entry is None or entry.backend != key.backend:
        return CacheLookup(None, f"the cache's {key.entry_name} entry is malformed")
    if entry.image != key.image:
        return CacheLookup(
            None,
            f"the cached environment was proven with image {display_value(entry.image)}, this probe runs "
            f"{display_value(key.image)} (the NCCL library ships in the image)",
        )
    proven, current = _time(entry.probed_at), _time(now)
    if proven is None or current is None:
        return CacheLookup(None, f"the cache's {key.entry_name} entry has no readable time ({entry.probed_at!r})")
    age_hours = (current - proven).total_seconds() / 3600
    if age_hours > max_age_hours:
        return CacheLookup(
            None,
            f"the cached environment was proven {age_hours:.1f} h ago (SLURM job {entry.slurm_job_id}), more than "
            f"cache_max_age_hours={max_age_hours:g}",
        )
    latest = data.get("latest")
    if isinstance(latest, dict):
        changes = SeenVersions.from_fields(latest).changes_from(entry.seen)
        if changes:
            return CacheLookup(
                None,
                f"the cluster changed since the cached environment was proven: a later probe (SLURM job "
                f"{display_value(latest.get('slurm_job_id'))} at {display_value(latest.get('probed_at'))}) saw "
                + ", ".join(changes),
            )
    return CacheLookup(entry)


def cache_text(previous: str | None, key: CacheKey, entry: CachedEnv) -> str:
    """Return the cache file with ``entry`` stored for ``key`` (JSON, sorted keys, one line).

    The other entries of a readable ``previous`` file are kept; when ``entry`` saw a driver or an
    NCCL version it also becomes the file's ``latest`` observation, which every other entry is then
    checked against (:func:`lookup_cache`). An unreadable ``previous`` file is replaced.

    :param previous: the cache file as it is now (``None``: none).
    :param key: the entry's key.
    :param entry: the proven environment.
    """
    data, _ = _cache_file(previous, key)
    entries = dict(data["entries"]) if data is not None else {}
    entries[key.entry_name] = _entry_dict(entry)
    latest = data.get("latest") if data is not None else None
    if entry.seen.known:
        latest = {**asdict(entry.seen), "probed_at": entry.probed_at, "slurm_job_id": entry.slurm_job_id}
    return (
        json.dumps(
            {
                "version": CACHE_VERSION,
                "cluster": key.cluster,
                "partitions": list(key.partitions),
                "latest": latest,
                "entries": entries,
            },
            sort_keys=True,
        )
        + "\n"
    )


def probe_command(probe_path: str, *, nodes: int, gpus_per_node: int, python: str, backend: str = NCCL) -> str:
    """Return the shell command each node runs: torchrun (``python -m torch.distributed.run``) on the probe.

    Multi-node, the sbatch template has exported the TAO rendezvous (``TAO_NODE_COUNT``,
    ``TAO_GPUS_PER_NODE``, ``TAO_NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), which torchrun
    keeps while it sets its own ``WORLD_SIZE`` and ``RANK``. Single-node, the command exports the
    TAO values itself and torchrun runs ``--standalone`` (a free local port).

    :param probe_path: absolute path of the staged probe program.
    :param python: the image's Python with PyTorch.
    :param backend: what the probe is told to use (:func:`check_backend`), always passed explicitly.
    """
    if not probe_path.startswith("/"):
        raise ValidationError(f"probe path {probe_path!r} must be absolute")
    if not isinstance(python, str) or not python.strip():
        raise ValidationError("python is empty; give the image's Python, e.g. python3")
    launcher = f"exec {quote(python)} -m torch.distributed.run"
    program = f"{quote(probe_path)} --backend {quote(check_backend(backend))}"
    if nodes > 1:
        return (
            f'{launcher} --nnodes="$TAO_NODE_COUNT" --nproc-per-node="$TAO_GPUS_PER_NODE" '
            '--node-rank="$TAO_NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" '
            f"{program}"
        )
    return (
        f"export TAO_NODE_COUNT=1 TAO_GPUS_PER_NODE={gpus_per_node} TAO_NODE_RANK=0; "
        f"{launcher} --standalone --nnodes=1 --nproc-per-node={gpus_per_node} {program}"
    )


def _marker_line(log_text: str, marker: str) -> str | None:
    lines = [line.strip() for line in log_text.splitlines() if marker in line]
    return lines[-1] if lines else None


def _no_cuda(partition: str, evidence: str) -> str:
    where = f"partition {partition}" if partition else "the job's partition"
    return (
        f"CUDA is not available in the container on {where} ({evidence}), so the probe cannot test NCCL and "
        "no NCCL setting can help. Check the image (its PyTorch must be a CUDA build: "
        "python -c 'import torch; print(torch.cuda.is_available())'), the GPU request (a GPU partition, "
        "--gres=gpu:N, gpus_per_node) and that the job runs in the image's container (--container-image "
        f"with the .sqsh). backend={GLOO!r} is only for a CPU test cluster without CUDA"
    )


def judge_probe(
    *,
    native_state: str,
    exit_code: int | None,
    log_text: str,
    world_size: int,
    backend: str = NCCL,
    partition: str = "",
) -> ProbeOutcome:
    """Decide how a finished probe job went, from its SLURM state, exit code and log.

    :param native_state: the job's final SLURM state (``COMPLETED``, ``FAILED``, ``TIMEOUT``, ...).
    :param exit_code: the job's exit code (the step's: 124 when ``timeout`` stopped it).
    :param log_text: the end of the job's ``main.out`` and ``main.err``.
    :param world_size: the number of processes the probe had to span.
    :param backend: the backend the probe was told to use; with ``nccl`` a probe that found no CUDA,
        or a success line of another backend, is :attr:`Verdict.NO_CUDA`.
    :param partition: the probe job's partition(s), named in the verdict's message.
    :returns: the verdict and its evidence (and, when OK, the versions the probe saw).
    """
    ok_line = _marker_line(log_text, OK_MARKER)
    if native_state == "COMPLETED":
        if ok_line is not None and f" world={world_size} " in f"{ok_line} ":
            fields = dict(_FIELD_RE.findall(ok_line))
            used = fields.get("backend", UNSEEN)
            if used == backend:
                return ProbeOutcome(Verdict.OK, ok_line, SeenVersions.from_fields(fields))
            if backend == NCCL:
                return ProbeOutcome(Verdict.NO_CUDA, _no_cuda(partition, f"the probe ran backend {used}: {ok_line}"))
            return ProbeOutcome(Verdict.FAILED, f"the probe was told backend {backend} but ran {used}: {ok_line}")
        return ProbeOutcome(
            Verdict.FAILED,
            f"the job completed but its log has no '{OK_MARKER} world={world_size}' line"
            + (f" (it has: {ok_line})" if ok_line else ""),
        )
    no_cuda_line = _marker_line(log_text, NO_CUDA_MARKER)
    if no_cuda_line is not None:
        return ProbeOutcome(Verdict.NO_CUDA, _no_cuda(partition, no_cuda_line))
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
