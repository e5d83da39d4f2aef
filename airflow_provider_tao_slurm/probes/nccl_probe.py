#!/usr/bin/env python3
"""NCCL probe: one small all-reduce over every GPU of a job, run before the real job.

``NcclProbeOperator`` stages this file to the cluster and runs it in a tiny batch job through the
provider's sbatch template, under torchrun (one process per GPU). It runs standalone inside any
training image: standard library only, ``torch`` imported only when the probe really runs, nothing
imported from the provider. (For that reason a setup problem is a ``ValueError`` here, not one of
the provider's exception classes.)

Rendezvous, read from the environment (TAO's convention, see ``templates/slurm``):

- node count: ``TAO_NODE_COUNT``, else ``WORLD_SIZE`` (TAO exports the NODE count there). Under
  torchrun ``WORLD_SIZE`` is torchrun's process count, so there torchrun's ``GROUP_WORLD_SIZE``
  is the fallback instead;
- GPUs per node: ``TAO_GPUS_PER_NODE``, ``NUM_GPU_PER_NODE``, then torchrun's ``LOCAL_WORLD_SIZE``;
- node rank: ``TAO_NODE_RANK``, ``NODE_RANK``, torchrun's ``GROUP_RANK``, then ``SLURM_NODEID``;
- local rank: ``LOCAL_RANK``; master: ``MASTER_ADDR``, ``MASTER_PORT``.

Unset values mean 1 node, 1 GPU, rank 0 and ``127.0.0.1:29500``. The global world size is nodes x
GPUs per node and the global rank is node rank x GPUs per node + local rank; under torchrun both
must equal torchrun's own ``WORLD_SIZE`` and ``RANK``.

Usage::

    python3 nccl_probe.py --dry-run    # print the computed configuration as JSON (torch not imported)
    torchrun --nnodes=N --nproc-per-node=G --node-rank=R --master-addr=A --master-port=P nccl_probe.py \
        [--backend nccl|gloo]

The backend is what the probe is told, never a guess: ``nccl`` (the default) all-reduces on the
GPUs and needs CUDA; when torch sees no GPU in the container every process prints
``TAO_NCCL_PROBE_NO_CUDA: ...`` and exits 4 without running anything (gloo would pass and prove
nothing about NCCL). ``gloo`` all-reduces on the CPU and is only for a CPU test cluster.

A real run all-reduces ``rank + 1`` over every process, checks that the sum is
``W * (W + 1) / 2``, and rank 0 prints ``TAO_NCCL_PROBE_OK world=W nodes=N gpus_per_node=G
backend=B sum=S nccl=V driver=D cuda=C torch=T partition=P``: the backend used and the NCCL
version, NVIDIA driver, CUDA build and PyTorch version it saw on rank 0's node, and the SLURM
partition (``none`` for what it could not see). Every process also prints its own
``TAO_NCCL_PROBE: rank ...`` line with the same versions. Exit status: 0 success; 2 setup error
(bad rendezvous environment, no torch, a PyTorch without NCCL, fewer GPUs than processes: other
NCCL settings cannot help); 3 the collective failed or summed wrong; 4 NCCL asked for but no CUDA.
A collective that hangs is stopped by the job's own time limit (the operator's probe timeout).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

OK_MARKER = "TAO_NCCL_PROBE_OK"
SETUP_ERROR_MARKER = "TAO_NCCL_PROBE_SETUP_ERROR"
FAILED_MARKER = "TAO_NCCL_PROBE_FAILED"
NO_CUDA_MARKER = "TAO_NCCL_PROBE_NO_CUDA"
SETUP_ERROR_EXIT = 2
COLLECTIVE_FAILED_EXIT = 3
NO_CUDA_EXIT = 4
#: The backends the probe can be told to use: NCCL on GPUs, gloo on the CPU (a CPU test only).
NCCL = "nccl"
GLOO = "gloo"
BACKENDS = (NCCL, GLOO)
#: Printed for a version or partition the probe could not see.
UNSEEN = "none"
#: The NVIDIA kernel module's version file (the host's driver, visible inside the container).
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
_DRIVER_RE = re.compile(r"Kernel Module(?: for [^ ]+)?\s+([0-9]+(?:\.[0-9]+)+)")
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
#: torchrun sets this in every worker it starts.
TORCHRUN_MARKER_VAR = "TORCHELASTIC_RUN_ID"
#: Variables shown in the configuration (the settings the probe is judging).
SHOWN_PREFIXES = ("NCCL_", "GLOO_")


@dataclass(frozen=True)
class Rendezvous:
    """Where one probe process sits in the job.

    :ivar nodes: node count.
    :ivar gpus_per_node: processes (GPUs) per node.
    :ivar node_rank: this node's rank, from 0.
    :ivar local_rank: this process's rank on its node, from 0.
    :ivar world_size: processes in the whole job.
    :ivar rank: this process's global rank.
    :ivar master_addr: host of rank 0's rendezvous store.
    :ivar master_port: port of that store.
    :ivar launcher: ``torchrun`` or ``direct``.
    """

    nodes: int
    gpus_per_node: int
    node_rank: int
    local_rank: int
    world_size: int
    rank: int
    master_addr: str
    master_port: int
    launcher: str


def _first_int(env: Mapping[str, str], names: Sequence[str], default: int, minimum: int) -> tuple[int, str]:
    """Return the first of ``names`` that is set, as an int of at least ``minimum``, with the name used."""
    for name in names:
        text = env.get(name, "").strip()
        if not text:
            continue
        if not text.isdigit() or int(text) < minimum:
            raise ValueError(f"{name}={text!r} is not a whole number of at least {minimum}; fix how the job exports it")
        return int(text), name
    return default, "default"


def rendezvous(env: Mapping[str, str]) -> Rendezvous:
    """Compute the global world size and rank of this process from the rendezvous variables.

    :param env: the process environment (or any mapping of the same variables).
    :returns: the computed :class:`Rendezvous`.
    :raises ValueError: when a variable is malformed or out of range, or torchrun's own
        ``WORLD_SIZE``/``RANK`` disagree with the TAO values; the message names the fix.
    """
    torchrun = TORCHRUN_MARKER_VAR in env
    node_names = ("TAO_NODE_COUNT", "GROUP_WORLD_SIZE") if torchrun else ("TAO_NODE_COUNT", "WORLD_SIZE")
    nodes, _ = _first_int(env, node_names, 1, 1)
    gpus, _ = _first_int(env, ("TAO_GPUS_PER_NODE", "NUM_GPU_PER_NODE", "LOCAL_WORLD_SIZE"), 1, 1)
    node_rank, node_rank_name = _first_int(env, ("TAO_NODE_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_NODEID"), 0, 0)
    local_rank, _ = _first_int(env, ("LOCAL_RANK",), 0, 0)
    port, _ = _first_int(env, ("MASTER_PORT",), DEFAULT_MASTER_PORT, 1)
    if node_rank >= nodes:
        raise ValueError(f"{node_rank_name}={node_rank} but the job has {nodes} node(s); export the TAO node rank")
    if local_rank >= gpus:
        raise ValueError(f"LOCAL_RANK={local_rank} but a node runs {gpus} process(es); start one process per GPU")
    config = Rendezvous(
        nodes=nodes,
        gpus_per_node=gpus,
        node_rank=node_rank,
        local_rank=local_rank,
        world_size=nodes * gpus,
        rank=node_rank * gpus + local_rank,
        master_addr=env.get("MASTER_ADDR", "").strip() or DEFAULT_MASTER_ADDR,
        master_port=port,
        launcher="torchrun" if torchrun else "direct",
    )
    if torchrun:
        for name, mine in (("WORLD_SIZE", config.world_size), ("RANK", config.rank)):
            theirs = env.get(name, "").strip()
            if theirs != str(mine):
                raise ValueError(
                    f"torchrun set {name}={theirs or 'nothing'} but TAO_NODE_COUNT x TAO_GPUS_PER_NODE gives {mine}; "
                    "start torchrun with --nnodes=$TAO_NODE_COUNT --nproc-per-node=$TAO_GPUS_PER_NODE "
                    "--node-rank=$TAO_NODE_RANK"
                )
    return config


def expected_sum(world_size: int) -> int:
    """Return the all-reduce result when every rank contributes ``rank + 1``."""
    return world_size * (world_size + 1) // 2


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    """Return the NCCL and gloo settings in ``env`` (never anything else: no secrets in the log)."""
    return {name: env[name] for name in sorted(env) if name.startswith(SHOWN_PREFIXES)}


def describe(config: Rendezvous, env: Mapping[str, str]) -> dict[str, object]:
    """Return the configuration the dry run prints."""
    return {**asdict(config), "settings": shown_env(env)}


def _say(*parts: object) -> None:
    print(*parts, flush=True)


def driver_version(text: str) -> str | None:
    """Return the NVIDIA driver version in the text of :data:`DRIVER_VERSION_FILE` (``None`` when absent)."""
    match = _DRIVER_RE.search(text)
    return match.group(1) if match else None


def nccl_version_text(value: object) -> str | None:
    """Return ``torch.cuda.nccl.version()`` as ``2.18.1``.

    The value is a tuple (a fourth, text part is a suffix, left out), or the packed int of older
    PyTorch releases.

    NCCL packs ``major*10000 + minor*100 + patch`` from 2.9 on and ``major*1000 + minor*100 + patch``
    before.
    """
    if isinstance(value, tuple) and len(value) >= 3 and all(isinstance(part, int) for part in value[:3]):
        return ".".join(str(part) for part in value[:3])
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        major = value // 10000 if value >= 20900 else value // 1000
        rest = value - major * (10000 if value >= 20900 else 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return None


def _read_driver_file() -> str | None:
    try:
        with open(DRIVER_VERSION_FILE, encoding="utf-8", errors="replace") as handle:
            return driver_version(handle.read(4096))
    except OSError:
        return None


def seen_versions(torch: Any, env: Mapping[str, str]) -> dict[str, str]:
    """Return what this node offers the probe: NCCL, driver, CUDA build, PyTorch, partition (:data:`UNSEEN` if unknown).

    :param torch: the imported ``torch`` module.
    :param env: the process environment (``SLURM_JOB_PARTITION``).
    """
    try:
        nccl = nccl_version_text(importlib.import_module("torch.cuda.nccl").version())
    except Exception:  # a CPU-only PyTorch has no NCCL at all, whatever it raises
        nccl = None
    seen = {
        "nccl": nccl,
        "driver": _read_driver_file(),
        "cuda": getattr(torch.version, "cuda", None),
        "torch": getattr(torch, "__version__", None),
        "partition": env.get("SLURM_JOB_PARTITION", "").strip() or None,
    }
    return {name: str(value).replace(" ", "_") if value else UNSEEN for name, value in seen.items()}


def _fields(values: Mapping[str, object]) -> str:
    return " ".join(f"{name}={value}" for name, value in values.items())


def _device(
    torch: Any, config: Rendezvous, backend: str, seen: Mapping[str, str], env: Mapping[str, str]
) -> tuple[Any, int]:
    """Return the device to all-reduce on and 0, or ``None`` and the exit status (after printing why)."""
    where = f"rank {config.rank} host {os.uname().nodename} partition {seen['partition']}"
    if backend == GLOO:
        return torch.device("cpu"), 0
    if not torch.cuda.is_available():
        _say(
            f"{NO_CUDA_MARKER}: {where}: backend nccl needs CUDA but torch {seen['torch']} (CUDA build "
            f"{seen['cuda']}, driver {seen['driver']}) sees no GPU; CUDA_VISIBLE_DEVICES="
            f"{env.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
        )
        return None, NO_CUDA_EXIT
    import torch.distributed as dist

    if not dist.is_nccl_available():
        _say(f"{SETUP_ERROR_MARKER}: {where}: torch {seen['torch']} was built without NCCL; use an image with it")
        return None, SETUP_ERROR_EXIT
    visible = torch.cuda.device_count()
    if config.local_rank >= visible:
        _say(
            f"{SETUP_ERROR_MARKER}: {where}: LOCAL_RANK={config.local_rank} but the container sees {visible} GPU(s); "
            "the job must get one GPU per probe process (--gres=gpu:N)"
        )
        return None, SETUP_ERROR_EXIT
    device = torch.device("cuda", config.local_rank)
    torch.cuda.set_device(device)
    return device, 0


def run_probe(config: Rendezvous, env: Mapping[str, str], backend: str = NCCL) -> int:
    """Initialise the process group, all-reduce once, check the sum; return the exit status.

    :param backend: :data:`NCCL` (needs CUDA: without it the probe refuses to run) or :data:`GLOO`
        (CPU tensors; a CPU test only).
    """
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        _say(f"{SETUP_ERROR_MARKER}: cannot import torch ({exc}); run the probe with a Python that has PyTorch")
        return SETUP_ERROR_EXIT
    seen = seen_versions(torch, env)
    device, status = _device(torch, config, backend, seen, env)
    if device is None:
        return status
    os.environ.setdefault("MASTER_ADDR", config.master_addr)
    os.environ.setdefault("MASTER_PORT", str(config.master_port))
    _say(
        f"TAO_NCCL_PROBE: rank {config.rank}/{config.world_size} node {config.node_rank}/{config.nodes} "
        f"local {config.local_rank}/{config.gpus_per_node} host {os.uname().nodename} backend {backend} "
        f"master {config.master_addr}:{config.master_port} launcher {config.launcher} "
        f"settings {json.dumps(shown_env(env), sort_keys=True)} {_fields(seen)}"
    )
    try:
        dist.init_process_group(backend, init_method="env://", rank=config.rank, world_size=config.world_size)
        value = torch.tensor([float(config.rank + 1)], device=device)
        dist.all_reduce(value)
        total = round(value.item())
    except Exception as exc:  # the collective's failure is the probe's verdict, whatever its type
        _say(f"{FAILED_MARKER}: rank {config.rank}: {type(exc).__name__}: {exc}")
        return COLLECTIVE_FAILED_EXIT
    expected = expected_sum(config.world_size)
    if total != expected:
        _say(f"{FAILED_MARKER}: rank {config.rank}: all-reduce gave {total}, expected {expected}")
        return COLLECTIVE_FAILED_EXIT
    dist.destroy_process_group()
    if config.rank == 0:
        _say(
            f"{OK_MARKER} world={config.world_size} nodes={config.nodes} gpus_per_node={config.gpus_per_node} "
            f"backend={backend} sum={total} {_fields(seen)}"
        )
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Parse the command line, compute the rendezvous and run (or only print) the probe.

    :param argv: arguments (default ``sys.argv[1:]``).
    :param env: the environment (default ``os.environ``).
    :returns: the exit status.
    """
    parser = argparse.ArgumentParser(description="NCCL all-reduce probe (TAO SLURM provider)")
    parser.add_argument("--dry-run", action="store_true", help="print the computed configuration; no torch")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=NCCL,
        help="nccl (default): all-reduce on the GPUs, refused without CUDA; gloo: on the CPU, for a CPU test only",
    )
    args = parser.parse_args(argv)
    environment = os.environ if env is None else env
    try:
        config = rendezvous(environment)
    except ValueError as exc:
        _say(f"{SETUP_ERROR_MARKER}: {exc}")
        return SETUP_ERROR_EXIT
    if args.dry_run:
        _say(json.dumps({**describe(config, environment), "backend": args.backend}, sort_keys=True))
        return 0
    return run_probe(config, environment, args.backend)


if __name__ == "__main__":
    sys.exit(main())
