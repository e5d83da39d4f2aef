"""Measuring probe for ``import_parse.py``, always run in a fresh interpreter.

It imports nothing of the provider before it starts timing. Modes (one JSON line on stdout):

- ``import MODULE...``: seconds for ``import airflow.sdk``, then for importing the given modules on
  top of it, and which SSH libraries are loaded after each step.
- ``parse ROUNDS PRELOAD BUNDLE=FILE...``: what Airflow's DAG processor pays per file. Like the
  processor's manager, this process imports the parsing machinery, freezes its heap (``gc.freeze()``)
  and pre-imports the ``airflow.*`` modules each file imports
  (``[dag_processor] parsing_pre_import_modules``), plus the
  comma-separated ``PRELOAD`` modules (``-`` for none; a diagnostic); then, per round and file, it
  forks a child which builds a ``BundleDagBag`` for the file and serialises its DAGs, timed inside
  the child (wall time, and the child's user and system CPU time and minor page faults: a forked
  child copies each page of the parent it writes to).
- ``cold BUNDLE=FILE``: the same parse in this fresh interpreter, no pre-imports (timed by the caller).
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

SSH_LIBRARIES = ("paramiko", "asyncssh")


def _ssh_loaded() -> list[str]:
    return [name for name in SSH_LIBRARIES if name in sys.modules]


def probe_import(modules: list[str]) -> dict[str, Any]:
    """Time ``import airflow.sdk`` and then the given modules."""
    started = time.perf_counter()
    importlib.import_module("airflow.sdk")
    sdk_done = time.perf_counter()
    ssh_after_sdk = _ssh_loaded()
    for module in modules:
        importlib.import_module(module)
    done = time.perf_counter()
    return {
        "sdk_s": sdk_done - started,
        "provider_s": done - sdk_done,
        "ssh_after_sdk": ssh_after_sdk,
        "ssh_after_provider": _ssh_loaded(),
    }


def _parse_once(bundle: str, path: str) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.serialization.serialized_objects import DagSerialization

    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    bag = BundleDagBag(dag_folder=path, bundle_path=Path(bundle), bundle_name="dags-folder", load_op_links=False)
    for dag in bag.dags.values():
        DagSerialization.to_dict(dag)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "s": elapsed,
        "user_s": after.ru_utime - usage.ru_utime,
        "system_s": after.ru_stime - usage.ru_stime,
        "page_faults": after.ru_minflt - usage.ru_minflt,
        "dags": sorted(bag.dags),
        "errors": sorted(bag.import_errors),
        "ssh": _ssh_loaded(),
    }


def _in_child(bundle: str, path: str) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: parse, report, exit without running the parent's cleanup
        os.close(read_fd)
        try:
            payload = json.dumps(_parse_once(bundle, path)).encode()
        except BaseException as exc:  # report any failure to the parent instead of dying silently
            payload = json.dumps({"error": repr(exc)}).encode()
        os.write(write_fd, payload)
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return dict(json.loads(b"".join(chunks)))


def probe_parse(rounds: int, preload: list[str], files: list[tuple[str, str]]) -> dict[str, list[dict[str, Any]]]:
    """Processor-style parse of every file, ``rounds`` times, interleaved."""
    import gc

    import airflow.dag_processing.manager  # noqa: F401 - the manager process has it imported
    from airflow.utils.file import iter_airflow_imports

    # The manager freezes its heap before its parsing loop, so that parsing children forked from it
    # do not copy the pages that a garbage collection would touch (``DagFileProcessorManager.before_run``).
    gc.freeze()
    for _, path in files:
        for module in iter_airflow_imports(path):
            importlib.import_module(module)
    for module in preload:
        importlib.import_module(module)
    results: dict[str, list[dict[str, Any]]] = {path: [] for _, path in files}
    for _ in range(rounds):
        for bundle, path in files:
            results[path].append(_in_child(bundle, path))
    return results


def main() -> None:
    """Dispatch on the mode in ``sys.argv[1]``."""
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "import":
        result: Any = probe_import(args)
    elif mode == "parse":
        preload = [] if args[1] == "-" else args[1].split(",")
        result = probe_parse(int(args[0]), preload, [tuple(a.split("=", 1)) for a in args[2:]])  # type: ignore[misc]
    elif mode == "cold":
        import airflow.dag_processing.processor  # noqa: F401 - what a parsing process imports

        bundle, path = args[0].split("=", 1)
        result = _parse_once(bundle, path)
    else:
        raise SystemExit(f"unknown mode {mode!r}: use import, parse or cold")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
