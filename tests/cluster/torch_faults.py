"""Fault hook of the test cluster's torch venv (installed by ``harness.py up`` as ``slurmtest_faults``).

A ``.pth`` line imports this module whenever a Python of ``/opt/tao-slurm/venv`` starts. It does
nothing unless the harness's TaskProlog exported ``SLURMTEST_FAULT`` (only while the fault switch
file lists a fault). With ``SLURMTEST_FAULT=nccl_hang_unless_p2p_disable`` and ``NCCL_P2P_DISABLE``
not ``1``, it wraps ``torch.distributed.all_reduce`` as soon as that module is imported: global rank
0 never enters the collective, so every other rank waits in it, which is how a broken NCCL
peer-to-peer path looks from the job. Whatever program runs (the provider's NCCL probe or any other)
is left unchanged: the fault belongs to the cluster, like a real one.

Standard library only; it must never break a Python start-up, so any error leaves torch untouched.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import time
from types import ModuleType
from typing import Any

FAULT_VAR = "SLURMTEST_FAULT"
HANG_UNLESS_P2P_DISABLE = "nccl_hang_unless_p2p_disable"
TARGET = "torch.distributed"


def _hang_rank_zero(original: Any) -> Any:
    def all_reduce(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get("RANK", "0") == "0":
            print(
                f"SLURMTEST fault {HANG_UNLESS_P2P_DISABLE}: rank 0 stays out of the all-reduce "
                "(set NCCL_P2P_DISABLE=1 to avoid it)",
                flush=True,
            )
            while True:
                time.sleep(60)
        return original(*args, **kwargs)

    return all_reduce


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        module.all_reduce = _hang_rank_zero(module.all_reduce)  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Install the hook when the environment asks for the fault; return whether it did."""
    if environ.get(FAULT_VAR) != HANG_UNLESS_P2P_DISABLE or environ.get("NCCL_P2P_DISABLE") == "1":
        return False
    sys.meta_path.insert(0, _Finder())
    return True


with contextlib.suppress(Exception):  # a broken hook must never stop a Python from starting
    install()
