"""The spec bundle's ``execution`` block: model-owned order, real exit codes, supporting files.

A TAO spec bundle may declare how its action runs::

    execution:
      pre_commands: ["python3 prepare.py"]          # run first, in order; a failure stops the job
      post_commands:                                 # only after the primary command succeeded
        - "python3 export.py"
        - {command: "python3 publish.py", scope: leader}   # leader = task 0 only
      environment: {OMP_NUM_THREADS: "4"}            # declared non-secret
      distributed: {launcher: torchrun}              # one process per GPU of the node
      completion: {child_exit_code_path: "exit_codes"}     # relative to the job dir
      supporting_files:
        - {source: helpers/prepare.py, sha256: "<hex>"}    # relative to the bundle root

:func:`build_step_command` turns it into the one shell program each SLURM task runs inside the
container. The primary command's exit code is what the task exits with: a zero from a
post-command or a cleanup never masks a failed training step. Every child's exit code is
written, per node, as one JSON line to the child exit-code file, which the sensor reads.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.exceptions import ValidationError

KNOWN_KEYS = frozenset(
    {"pre_commands", "command", "post_commands", "environment", "distributed", "completion", "supporting_files"}
)
SCOPES = ("all", "leader")
LAUNCHERS = ("none", "torchrun")
HELPERS_DIR = "inputs/action-helpers"
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_SAFE_SEGMENT_RE = re.compile(r"[A-Za-z0-9._+@=-]+")


@dataclass(frozen=True)
class Step:
    """One child command and where it runs (``all`` tasks or only the ``leader``, task 0)."""

    command: str
    scope: str = "all"


@dataclass(frozen=True)
class SupportingFile:
    """A file of the bundle to stage: bundle-relative source, helpers-relative destination, declared hash."""

    source: str
    destination: str
    sha256: str


@dataclass(frozen=True)
class Execution:
    """A validated ``execution`` block."""

    pre: tuple[Step, ...] = ()
    post: tuple[Step, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    launcher: str = "none"
    processes_per_node: int | None = None
    child_exit_code_path: str = "exit_codes.children"
    supporting_files: tuple[SupportingFile, ...] = ()
    command: str | None = None


def _steps(value: Any, where: str) -> tuple[Step, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ValidationError(f"execution.{where} must be a list of commands")
    steps: list[Step] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            command, scope = item, "all"
        elif isinstance(item, Mapping) and isinstance(item.get("command"), str):
            command, scope = item["command"], str(item.get("scope", "all"))
        else:
            raise ValidationError(f"execution.{where}[{i}] must be a command string or {{command, scope}}")
        if not command.strip():
            raise ValidationError(f"execution.{where}[{i}] is empty")
        if scope not in SCOPES:
            raise ValidationError(f"execution.{where}[{i}].scope {scope!r} must be one of {', '.join(SCOPES)}")
        steps.append(Step(command, scope))
    return tuple(steps)


def relative_path(value: Any, where: str) -> str:
    """Normalise a relative path into safe segments; absolute paths and ``..`` are refused."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"{where} must be a non-empty relative path")
    if value.startswith("/"):
        raise ValidationError(f"{where} {value!r} is absolute; give a path relative to the bundle root")
    segments = value.split("/")
    if any(seg == ".." for seg in segments):
        raise ValidationError(f"{where} {value!r} contains '..'; files must stay inside the bundle root")
    parts = [seg for seg in segments if seg not in ("", ".")]
    if not parts or not all(_SAFE_SEGMENT_RE.fullmatch(seg) for seg in parts):
        raise ValidationError(f"{where} {value!r} may only use letters, digits and . _ + @ = - in its names")
    return "/".join(parts)


def parse_execution(block: Mapping[str, Any] | None, *, gpus_per_node: int | None = None) -> Execution:
    """Validate an ``execution`` block (``None`` → the default: just the primary command).

    ``distributed.processes_per_node`` is one process per GPU: left out, it is derived from the
    job's GPUs per node when the task starts (``TAO_GPUS_PER_NODE``, exported by the sbatch
    templates); given, it must equal ``gpus_per_node``.

    :param gpus_per_node: the job's GPUs per node, checked against an explicit
        ``processes_per_node`` (``None``: not known yet, nothing to check).
    :raises ValidationError: naming the key and the fix (both values for a mismatch).
    """
    if block is None:
        return Execution()
    if not isinstance(block, Mapping):
        raise ValidationError("execution must be a mapping (the bundle's execution block)")
    unknown = sorted(set(block) - KNOWN_KEYS)
    if unknown:
        raise ValidationError(f"execution has unknown keys {unknown}; known: {sorted(KNOWN_KEYS)}")
    environment = _environment(block.get("environment") or {})
    launcher, ppn = _distributed(block.get("distributed") or {}, gpus_per_node)
    exit_path = _child_exit_code_path(block.get("completion") or {})
    files = _supporting_files(block.get("supporting_files") or ())
    command = block.get("command")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise ValidationError("execution.command must be a non-empty command string")
    return Execution(
        pre=_steps(block.get("pre_commands"), "pre_commands"),
        post=_steps(block.get("post_commands"), "post_commands"),
        environment=environment,
        launcher=launcher,
        processes_per_node=ppn,
        child_exit_code_path=exit_path,
        supporting_files=files,
        command=command,
    )


def _environment(environment: object) -> tuple[tuple[str, str], ...]:
    """Validate ``execution.environment``: variable names to strings or numbers.

    :returns: its ``(name, value)`` pairs, values as text, in the block's order.
    :raises ValidationError: when it is not such a mapping.
    """
    if not isinstance(environment, Mapping) or not all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, (str, int, float))
        for k, v in environment.items()
    ):
        raise ValidationError("execution.environment must map variable names to strings or numbers")
    return tuple((k, str(v)) for k, v in environment.items())


def _distributed(distributed: object, gpus_per_node: int | None) -> tuple[str, int | None]:
    """Validate ``execution.distributed``: its launcher and processes per node (one per GPU).

    :param gpus_per_node: the job's GPUs per node, when known, which ``processes_per_node`` must equal.
    :returns: the launcher and the explicit ``processes_per_node`` (``None`` when left out).
    :raises ValidationError: naming the key and the fix (both values for a mismatch).
    """
    if not isinstance(distributed, Mapping):
        raise ValidationError("execution.distributed must be a mapping")
    launcher = str(distributed.get("launcher", "none"))
    if launcher not in LAUNCHERS:
        raise ValidationError(f"execution.distributed.launcher {launcher!r} must be one of {', '.join(LAUNCHERS)}")
    ppn = distributed.get("processes_per_node")
    if ppn is not None and (isinstance(ppn, bool) or not isinstance(ppn, int) or not 1 <= ppn <= 64):
        raise ValidationError("execution.distributed.processes_per_node must be an integer from 1 to 64")
    if ppn is not None and gpus_per_node is not None and ppn != gpus_per_node:
        raise ValidationError(
            f"execution.distributed.processes_per_node is {ppn} but the job has gpus_per_node={gpus_per_node}: "
            f"torchrun starts one process per GPU. Set processes_per_node to {gpus_per_node}, or leave it out "
            "(it is then derived from gpus_per_node), or change gpus_per_node"
        )
    return launcher, ppn


def _child_exit_code_path(completion: object) -> str:
    """Validate ``execution.completion`` and return its child exit-code path (relative to the job dir).

    :raises ValidationError: when it is not a mapping or the path is not a safe relative path.
    """
    if not isinstance(completion, Mapping):
        raise ValidationError("execution.completion must be a mapping")
    return relative_path(
        completion.get("child_exit_code_path", "exit_codes.children"), "execution.completion.child_exit_code_path"
    )


def _supporting_files(items: Sequence[Any]) -> tuple[SupportingFile, ...]:
    """Validate ``execution.supporting_files``: safe relative paths, a SHA-256 each, distinct destinations.

    :raises ValidationError: naming the entry and the fix.
    """
    files: list[SupportingFile] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValidationError(f"execution.supporting_files[{i}] must be {{source, sha256[, destination]}}")
        source = relative_path(item.get("source"), f"execution.supporting_files[{i}].source")
        destination = relative_path(item.get("destination", source), f"execution.supporting_files[{i}].destination")
        sha = str(item.get("sha256", "")).lower()
        if not _SHA_RE.fullmatch(sha):
            raise ValidationError(f"execution.supporting_files[{i}].sha256 must be the file's 64-hex SHA-256")
        files.append(SupportingFile(source, destination, sha))
    destinations = [f.destination for f in files]
    if len(set(destinations)) != len(destinations):
        raise ValidationError("execution.supporting_files has two files with the same destination")
    return tuple(files)


def primary_command(execution: Execution, command: str) -> str:
    """Return the primary command, under torchrun when the bundle asks for it (SLURM owns the rendezvous).

    The sbatch script exports the rendezvous: ``MASTER_ADDR``, a ``MASTER_PORT`` it found free on
    the master node when the job started (so jobs sharing a node never collide), the node count and
    rank, and ``TAO_GPUS_PER_NODE``, the default process count per node.
    """
    if execution.launcher != "torchrun":
        return command
    nproc = execution.processes_per_node or '"${TAO_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}"'
    return (
        'torchrun --nnodes="${TAO_NODE_COUNT:-${SLURM_NNODES:-1}}" '
        f"--nproc-per-node={nproc} "
        '--node-rank="${TAO_NODE_RANK:-${SLURM_NODEID:-0}}" '
        '--master-addr="${MASTER_ADDR:?unset: the sbatch script exports it}" '
        '--master-port="${MASTER_PORT:?unset: the sbatch script exports it}" '
        f"{command}"
    )


def build_step_command(execution: Execution, command: str, exit_code_file: str) -> str:
    """Return the shell program each task runs: pre → primary → post (only on success), exit codes kept.

    :param command: the primary command (shell text, tokens already bound).
    :param exit_code_file: absolute path; each task appends one JSON line to ``<file>``.
    :returns: bash text; its exit status is the primary command's (or the first failed pre-command's,
        or a failed post-command's when the primary succeeded).
    """
    if not exit_code_file.startswith("/"):
        raise ValidationError("the child exit-code file must be an absolute path")
    lines = [
        "__tao_codes=()",
        "__tao_rc=0",
        "__tao_task=${SLURM_PROCID:-0}",
        '__tao_run() { bash -c "$2"; local rc=$?; __tao_codes+=("\\"$1\\":$rc"); return $rc; }',
        '__tao_write() { local IFS=,; printf \'{"task":%s,"node":"%s",%s}\\n\' "$__tao_task" '
        f'"$(hostname)" "${{__tao_codes[*]}}" >> {quote(exit_code_file)}; }}',
        "trap __tao_write EXIT",
    ]
    for i, step in enumerate(execution.pre):
        lines.append(f"__tao_run pre_{i} {quote(step.command)} || {{ __tao_rc=$?; exit $__tao_rc; }}")
    lines.append(f"__tao_run primary {quote(primary_command(execution, command))}; __tao_rc=$?")
    lines.append('if [ "$__tao_rc" -ne 0 ]; then exit "$__tao_rc"; fi')
    for i, step in enumerate(execution.post):
        run = f"__tao_run post_{i} {quote(step.command)} || exit $?"
        if step.scope == "leader":
            run = f'if [ "$__tao_task" = 0 ]; then {run}; fi'
        lines.append(run)
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


def parse_child_exit_codes(text: str) -> dict[str, dict[str, int]]:
    """Read the child exit-code file: ``{"task <n>": {"pre_0": 0, "primary": 3, ...}}`` (last line per task wins)."""
    codes: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and "task" in item:
            codes[f"task {item['task']}"] = {k: v for k, v in item.items() if isinstance(v, int) and k != "task"}
    return codes


def canonical_sha256(value: Any) -> str:
    """SHA-256 of a value's canonical JSON (sorted keys, compact) — for bundle and config hashes."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(files: Sequence[tuple[SupportingFile, bytes]]) -> str:
    """Return the supporting-files manifest (JSON) after every declared SHA-256 was verified.

    :raises ValidationError: naming the first file whose content does not match its declared hash.
    """
    entries = []
    for declared, content in files:
        actual = hashlib.sha256(content).hexdigest()
        if actual != declared.sha256:
            raise ValidationError(
                f"supporting file {declared.source!r} has SHA-256 {actual[:12]}…, the bundle declares "
                f"{declared.sha256[:12]}…: the bundle is stale or tampered; rebuild it"
            )
        entries.append(
            {
                "source": declared.source,
                "destination": posixpath.join(HELPERS_DIR, declared.destination),
                "sha256": actual,
                "size": len(content),
            }
        )
    return json.dumps({"files": entries}, sort_keys=True, indent=2) + "\n"
