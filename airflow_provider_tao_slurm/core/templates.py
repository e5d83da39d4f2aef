"""Rendering of the sbatch templates in ``templates/slurm`` (shipped inside the wheel).

Templates use ``@@NAME@@`` placeholders (TAO's convention) through Jinja2 with delimiters that
ordinary bash never contains: ``@@NAME@@`` for values, ``@@% ... %@@`` for blocks and
``@@# ... #@@`` for comments, so ``${VAR}``, ``{ ...; }`` and ``#`` comments stay literal. The
shell blocks both job templates share live in their own files (``job_end.sh.j2``: the EXIT trap
that removes the secret sidecar and leaves the end marker; ``rendezvous_port.sh.j2``: the choice of
a free ``MASTER_PORT``; ``slice.sh.j2``: what a slice of a chain does, see
:mod:`~airflow_provider_tao_slurm.core.continuation`; ``preemption.sh.j2``: after the step, wait for
SLURM to end a job whose preemption is under way, so a program that exited on the grace time's
``SIGTERM`` does not end it FAILED instead of PREEMPTED), pulled in with ``@@% include "NAME" %@@``.

Every value is checked before it is placed. Values on ``#SBATCH`` lines are parsed by ``sbatch``,
not by a shell, so they are validated against strict patterns and refused rather than quoted.
Values that reach the shell are quoted with :func:`~airflow_provider_tao_slurm.core.shell.quote`.

Placeholders: JOB_NAME, PARTITION, ACCOUNT, NUM_NODES, GPUS_PER_NODE, NUM_GPUS, CPUS_PER_TASK,
MEM_MB, TIME, TIMEOUT_SECONDS, REQUEUE, EXCLUSIVE, EXCLUDE, SBATCH_EXTRA (list of options), GPU_TYPE,
MASTER_PORT (a fixed port, or empty: the script picks a free port on the node when the job starts),
LOG_DIR, JOB_DIR, EXIT_CODE_FILE, ENDS_DIR (where the EXIT trap leaves the end marker; empty: none),
IMAGE, CONTAINER_MOUNTS, COMMAND, EXTRA_ENV (list of ``NAME=quoted`` exports) and ENV_FILE (the
credentials sidecar; empty without secrets). A slice (:attr:`SbatchSpec.slice`; all empty without one):
SLICE (true), SIGNAL_OPTION (``--signal=B:USR1@<grace>``), GRACE_SECONDS, SLICES_DIR,
LATEST_CHECKPOINT_FIND (the ``find`` command listing the checkpoints under the results directory as
``<mtime> <path>``), CHECKPOINT_SIGNAL (the signal forwarded to the program, or empty) and
CAP_TIME_LIMIT (a training on several partitions: the command that lowers the slice's limit; TIME is
then empty, so the script asks no ``--time``), GRACE_FROM_LIMIT (the warning fits the limit the slice got,
between MIN_GRACE_SECONDS and MAX_GRACE_SECONDS; GRACE_SECONDS is then the longest slice's).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import jinja2
import jinja2.meta

from airflow_provider_tao_slurm.core.continuation import (
    MAX_GRACE_S,
    MIN_GRACE_S,
    SLICE_SIGNAL,
    SliceScript,
    cap_time_limit,
    check_checkpoint_globs,
    check_checkpoint_signal,
    find_names,
)
from airflow_provider_tao_slurm.core.resources import Resources, parse_slurm_time, reserved_option
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import (
    ImageReferenceError,
    ResourceError,
    TemplateRenderError,
    ValidationError,
)

SINGLE_NODE_TEMPLATE = "single_node.sbatch.j2"
MULTI_NODE_TEMPLATE = "multi_node.sbatch.j2"

_SBATCH_WORD = re.compile(r"[A-Za-z0-9_.-]+")
_PARTITIONS = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
_NODE_LIST = re.compile(r"[A-Za-z0-9_.,\[\]-]+")
_SBATCH_PATH = re.compile(r"/[A-Za-z0-9_./+-]*")
_SLURM_TIME = re.compile(r"[0-9][0-9:-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(=[A-Za-z0-9_.,:/@%+=&|*\[\]-]+)?")
_LEFTOVER = re.compile(r"@@\s*([A-Za-z_][A-Za-z0-9_]*)\s*@@")

# Options the templates set themselves; ``--container-*`` on an #SBATCH line would also put the
# batch shell itself into the container, and ``--export`` would stop the environment reaching srun.
_MANAGED_SBATCH_OPTIONS = frozenset(
    {
        "job-name", "output", "error", "open-mode", "partition", "account", "nodes", "ntasks",
        "ntasks-per-node", "gres", "gpus", "gpus-per-node", "gpus-per-task", "cpus-per-task", "time", "requeue",
        "no-requeue", "exclusive", "exclude", "wait-all-nodes", "export", "mem", "mem-per-cpu", "mem-per-gpu",
    }
)  # fmt: skip
_RENDEZVOUS_NAMES = frozenset(
    {
        "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "NUM_GPU_PER_NODE", "TAO_NODE_COUNT",
        "TAO_GPUS_PER_NODE", "TAO_NODE_RANK",
    }
)  # fmt: skip
_RESERVED_ENV_PREFIXES = ("SLURM_", "TAO_SLURM_")


def _template_source(name: str) -> str:
    """Return the text of template ``name`` (also what ``@@% include %@@`` reads).

    :raises TemplateRenderError: if it cannot be read.
    """
    try:
        return (template_dir() / name).read_text(encoding="utf-8")
    except OSError as exc:
        raise TemplateRenderError(
            f"sbatch template {name} cannot be read ({exc.strerror}); reinstall airflow-provider-tao-slurm"
        ) from exc


def _included_source(name: str) -> tuple[str, None, Callable[[], bool]]:
    """Return the text of an ``@@% include %@@``d template, read at each render like the rest.

    Jinja keeps the include compiled while its file reads the same (the third item, asked at each
    render), so a submission parses and compiles no template it compiled before.
    """
    source = _template_source(name)

    def reads_the_same() -> bool:
        try:
            return _template_source(name) == source
        except TemplateRenderError:  # gone: the reload says so
            return False

    return source, None, reads_the_same


_JINJA = jinja2.Environment(
    variable_start_string="@@",
    variable_end_string="@@",
    block_start_string="@@%",
    block_end_string="%@@",
    comment_start_string="@@#",
    comment_end_string="#@@",
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,  # noqa: S701 - renders shell scripts, not HTML; shell values are quoted explicitly
    loader=jinja2.FunctionLoader(_included_source),
)


@functools.lru_cache(maxsize=16)
def _placeholders(source: str) -> frozenset[str]:
    """Return the placeholders a template's text uses (its includes' not counted), once per text."""
    return frozenset(jinja2.meta.find_undeclared_variables(_JINJA.parse(source)))


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    """Return a template's text compiled, once per text."""
    return _JINJA.from_string(source)


@dataclass(frozen=True, kw_only=True)
class SbatchSpec:
    """Typed inputs of one sbatch script; :func:`render_sbatch` validates every field.

    :param job_name: SLURM job name (the TAO job id), ``[A-Za-z0-9_.-]+``.
    :param partition: one partition or a comma-separated list.
    :param num_nodes: node count; more than one selects the multi-node template.
    :param gpus_per_node: GPUs per node (``--gres=gpu:N``).
    :param cpus_per_task: CPUs of the one task per node.
    :param time: wall-time limit as SLURM reads it, e.g. ``04:00:00`` or ``1-02:00:00``.
    :param timeout_seconds: the program is stopped with ``timeout`` after this; shorter than ``time``.
    :param log_dir: absolute directory; logs go to ``<log_dir>/%x-%j/main.out`` and ``main.err``.
    :param job_dir: absolute job directory, the batch script's working directory.
    :param image: absolute ``.sqsh`` path given to Pyxis ``--container-image``.
    :param command: shell command run in the container with ``bash -c``.
    :param exit_code_file: absolute path where the script writes the step's exit code.
    :param ends_dir: absolute directory where the script's EXIT trap leaves its end marker
        (``<job id>-<restart>-<exit code>.end``), or ``None`` for no marker.
    :param account: SLURM account, or ``None`` for the user's default.
    :param mem_mb: memory per node in MB (``--mem``), or ``None`` for the partition default.
    :param exclusive: ask for whole nodes.
    :param requeue: ``--requeue`` (default) or ``--no-requeue``.
    :param exclude_nodes: node names or hostlists for ``--exclude``.
    :param container_mounts: Pyxis ``--container-mounts`` value, or ``None``.
    :param env: non-secret variables exported to the step.
    :param nccl_env: NCCL variables exported to the step (from the probe or given explicitly).
    :param sidecar: absolute path of the mode-600 credentials file, or ``None`` without secrets.
    :param sbatch_extra: extra ``--option[=value]`` directives, e.g. ``("--qos=high",)``.
    :param gpu_type: GPU type for ``--gres=gpu:<type>:<n>``, or ``None`` for any GPU.
    :param master_port: the rendezvous port (``MASTER_PORT``), or ``None`` (the default) for one the
        script finds free on the master node when the job starts, so jobs sharing a node never
        bind the same port, whatever launcher binds it.
    :param slice: run as one slice of a training longer than one allocation (``max_continuations``):
        warned before the time limit, with start and ending markers and the slice's variables; or
        ``None`` (the default) for an ordinary job.
    """

    job_name: str
    partition: str
    num_nodes: int
    gpus_per_node: int
    cpus_per_task: int
    time: str
    timeout_seconds: int
    log_dir: str
    job_dir: str
    image: str
    command: str
    exit_code_file: str
    ends_dir: str | None = None
    account: str | None = None
    mem_mb: int | None = None
    exclusive: bool = False
    requeue: bool = True
    exclude_nodes: tuple[str, ...] = ()
    container_mounts: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    sidecar: str | None = None
    sbatch_extra: tuple[str, ...] = ()
    gpu_type: str | None = None
    master_port: int | None = None
    slice: SliceScript | None = None


def template_dir() -> Traversable:
    """Return the directory holding the sbatch templates.

    Inside an installed wheel the templates are package data; in an editable checkout they are
    the repository's top-level ``templates/slurm``.
    """
    package = resources.files("airflow_provider_tao_slurm")
    packaged = package / "templates" / "slurm"
    return packaged if packaged.is_dir() else package / ".." / "templates" / "slurm"


def render_template(name: str, values: Mapping[str, object]) -> str:
    """Render one template file with already validated and quoted values.

    :param name: file name inside :func:`template_dir`, e.g. ``single_node.sbatch.j2``.
    :param values: placeholder name to value; values are inserted as they are.
    :returns: the rendered text.
    :raises TemplateRenderError: if the template (or one it includes) is missing or invalid, a
        placeholder has no value, or a ``@@NAME@@`` placeholder is left in the output.
    """
    source = _template_source(name)
    try:
        missing = sorted(_placeholders(source) - set(values))
        if missing:
            raise TemplateRenderError(
                f"template {name} needs a value for placeholder(s) {', '.join(missing)}; pass them to the renderer"
            )
        text = _compiled(source).render(values)
    except jinja2.TemplateError as exc:
        raise TemplateRenderError(f"template {name} is invalid: {exc}; fix templates/slurm/{name}") from exc
    leftover = _LEFTOVER.search(text)
    if leftover:
        raise TemplateRenderError(
            f"rendering {name} left placeholder @@{leftover.group(1)}@@ in the script; remove "
            "'@@NAME@@' text from the values or fix the template"
        )
    return text


def resource_fields(resources: Resources) -> dict[str, Any]:
    """Return the :class:`SbatchSpec` fields that come straight from validated :class:`Resources`."""
    return {
        "partition": resources.partition,
        "account": resources.account,
        "num_nodes": resources.num_nodes,
        "gpus_per_node": resources.gpus_per_node,
        "cpus_per_task": resources.cpus_per_task,
        "time": resources.slurm_time,
        "timeout_seconds": resources.timeout_seconds,
        "exclusive": resources.exclusive,
        "requeue": resources.requeue,
        "exclude_nodes": resources.exclude_nodes,
        "mem_mb": resources.mem_mb,
        "gpu_type": resources.gpu_type,
        "sbatch_extra": resources.sbatch_extra,
    }


def _program_timeout(spec: SbatchSpec) -> int:
    """Return the program's own ``timeout``: ``timeout_seconds``, the value checked, shorter than the wall time.

    The one exception is a slice of a chain (``max_continuations``) without ``timeout_hours``
    (``slice.stop_at_timeout`` false): it runs until SLURM ends it TIMEOUT, after the warning signal,
    so its program is given twice the wall time and the program's timeout never ends it first. A slice
    with ``timeout_hours`` runs under that timeout, as any job.
    """
    if spec.slice is None or spec.slice.stop_at_timeout:
        return spec.timeout_seconds
    return 2 * _slurm_seconds(spec.time)


def render_sbatch(spec: SbatchSpec) -> str:
    """Render the sbatch script for ``spec``: single-node template for one node, multi-node otherwise.

    :param spec: the job's inputs.
    :returns: the script text.
    :raises ValidationError: if a value is unsafe or malformed (subclasses name the kind).
    :raises TemplateRenderError: if the template cannot be rendered.
    """
    _validate(spec)
    values: dict[str, object] = {
        "JOB_NAME": spec.job_name,
        "PARTITION": spec.partition,
        "ACCOUNT": spec.account or "",
        "NUM_NODES": spec.num_nodes,
        "GPUS_PER_NODE": spec.gpus_per_node,
        "NUM_GPUS": spec.num_nodes * spec.gpus_per_node,
        "CPUS_PER_TASK": spec.cpus_per_task,
        "TIME": spec.time if _capped(spec) is None else "",
        "MEM_MB": spec.mem_mb or "",
        "TIMEOUT_SECONDS": _program_timeout(spec) if _capped(spec) is None else '"${TAO_SLURM_TIMEOUT}"',
        "PROGRAM_TIMEOUT": _program_timeout(spec),
        "REQUEUE": "--requeue" if spec.requeue else "--no-requeue",
        "GPU_TYPE": spec.gpu_type or "",
        "MASTER_PORT": _master_port(spec),
        "EXCLUSIVE": spec.exclusive,
        "EXCLUDE": ",".join(spec.exclude_nodes),
        "SBATCH_EXTRA": list(spec.sbatch_extra),
        "LOG_DIR": spec.log_dir,
        "JOB_DIR": quote(spec.job_dir),
        "EXIT_CODE_FILE": quote(spec.exit_code_file),
        "ENDS_DIR": quote(spec.ends_dir) if spec.ends_dir else "",
        "IMAGE": quote(spec.image),
        "CONTAINER_MOUNTS": quote(spec.container_mounts) if spec.container_mounts else "",
        "COMMAND": quote(spec.command),
        "EXTRA_ENV": [f"{name}={quote(value)}" for name, value in _all_env(spec).items()],
        "ENV_FILE": quote(spec.sidecar) if spec.sidecar else "",
        **_slice_values(spec.slice),
    }
    return render_template(MULTI_NODE_TEMPLATE if spec.num_nodes > 1 else SINGLE_NODE_TEMPLATE, values)


def _slurm_seconds(slurm_time: str) -> int:
    """Return a SLURM time (``HH:MM:SS``, ``D-HH:MM:SS`` ...) in whole seconds; 0 for an unlimited one."""
    return round((parse_slurm_time(slurm_time) or 0.0) * 3600)


def _capped(spec: SbatchSpec) -> str | None:
    """Return the slice length a slice's batch shell lowers its limit to (``None``: the script asks ``--time``).

    Such a script runs the program under ``TAO_SLURM_TIMEOUT``, which the shell shortens to the slice's end
    when slurmctld does not take the lower limit.
    """
    return spec.slice.partition_limit if spec.slice is not None else None


def _slice_values(script: SliceScript | None) -> dict[str, object]:
    """Return the slice placeholders: all empty (false) outside a chain of slices."""
    if script is None:
        return dict.fromkeys(
            (
                "SLICE",
                "SIGNAL_OPTION",
                "GRACE_SECONDS",
                "SLICES_DIR",
                "LATEST_CHECKPOINT_FIND",
                "CHECKPOINT_SIGNAL",
                "CAP_TIME_LIMIT",
                "SLICE_LIMIT",
                "SLICE_SECONDS",
                "GRACE_FROM_LIMIT",
            ),
            "",
        )
    return {
        "SLICE": True,
        "CAP_TIME_LIMIT": cap_time_limit(script.partition_limit) if script.partition_limit else "",
        "SLICE_LIMIT": script.partition_limit or "",
        "SLICE_SECONDS": _slurm_seconds(script.partition_limit) if script.partition_limit else 0,
        "GRACE_FROM_LIMIT": script.grace_from_limit,
        "MIN_GRACE_SECONDS": MIN_GRACE_S,
        "MAX_GRACE_SECONDS": MAX_GRACE_S,
        "SIGNAL_OPTION": f"--signal=B:{SLICE_SIGNAL}@{script.grace_seconds}",
        "GRACE_SECONDS": script.grace_seconds,
        "SLICES_DIR": quote(script.slices_dir),
        "LATEST_CHECKPOINT_FIND": join(
            [
                "find",
                script.results_dir,
                "-type",
                "f",
                "(",
                *find_names(script.checkpoint_globs),
                ")",
                "-printf",
                "%T@ %p\\n",
            ]
        ),
        "CHECKPOINT_SIGNAL": script.checkpoint_signal or "",
    }


def _master_port(spec: SbatchSpec) -> str:
    """``MASTER_PORT``'s value in the script: the given port, or empty (picked on the node at run time)."""
    port = spec.master_port
    if port is None:
        return ""
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise ValidationError(f"master_port={port!r} must be a port number from 1024 to 65535")
    return str(port)


def _all_env(spec: SbatchSpec) -> dict[str, str]:
    both = sorted(set(spec.env) & set(spec.nccl_env))
    if both:
        raise ValidationError(f"env and nccl_env both set {', '.join(both)}; keep each variable in one of them")
    merged = {**spec.env, **spec.nccl_env}
    for name, value in merged.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValidationError(
                f"environment variable name {name!r} is invalid; use letters, digits and '_', not starting with a digit"
            )
        if name in _RENDEZVOUS_NAMES or name.startswith(_RESERVED_ENV_PREFIXES):
            raise ValidationError(
                f"environment variable {name} is set by the sbatch template or by SLURM; remove it from env"
            )
        if not isinstance(value, str):
            raise ValidationError(f"environment variable {name} must be a string; convert it with str()")
    return merged


def _validate(spec: SbatchSpec) -> None:
    _check_sbatch_word("job_name", spec.job_name, _SBATCH_WORD)
    _check_sbatch_word("partition", spec.partition, _PARTITIONS)
    if spec.account is not None:
        _check_sbatch_word("account", spec.account, _SBATCH_WORD)
    if spec.gpu_type is not None:
        _check_sbatch_word("gpu_type", spec.gpu_type, _SBATCH_WORD)
    for node in spec.exclude_nodes:
        _check_sbatch_word("exclude_nodes", node, _NODE_LIST)
    _check_sbatch_word("log_dir", spec.log_dir, _SBATCH_PATH)
    for option in spec.sbatch_extra:
        check_sbatch_option(option)
    for name in ("exclusive", "requeue"):
        if not isinstance(getattr(spec, name), bool):
            raise ValidationError(f"{name} must be True or False, got {getattr(spec, name)!r}")
    counts = ("num_nodes", "gpus_per_node", "cpus_per_task", "timeout_seconds")
    for name in counts if spec.mem_mb is None else (*counts, "mem_mb"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResourceError(f"{name} must be a positive whole number, got {value!r}")
    _check_sbatch_word("time", spec.time, _SLURM_TIME)
    wall_seconds = _slurm_seconds(spec.time)  # 0 (UNLIMITED) fails the check above
    if spec.timeout_seconds >= wall_seconds:
        raise ResourceError(
            f"timeout_seconds ({spec.timeout_seconds}) must be shorter than the wall time {spec.time} "
            f"({wall_seconds} s) so the program stops before SLURM kills the job; lower it"
        )
    for name in ("job_dir", "exit_code_file", "ends_dir", "sidecar"):
        path = getattr(spec, name)
        if path is not None and not path.startswith("/"):
            raise ValidationError(f"{name} must be an absolute path on the cluster, got {path!r}")
    if not (spec.image.startswith("/") and spec.image.endswith(".sqsh")):
        raise ImageReferenceError(
            f"image must be an absolute .sqsh path, got {spec.image!r}; convert the image first "
            "(EnrootImportOperator) and pass the .sqsh path"
        )
    if not spec.command.strip():
        raise ValidationError("command is empty; give the shell command to run in the container")
    if spec.container_mounts is not None and not spec.container_mounts.strip():
        raise ValidationError("container_mounts is empty; pass None for no mounts or SRC:DST[,...]")
    if spec.slice is not None:
        _validate_slice(spec.slice, wall_seconds)


def _validate_slice(script: SliceScript, wall_seconds: int) -> None:
    if not isinstance(script, SliceScript):
        raise ValidationError(f"slice must be a SliceScript or None, got {type(script).__name__}")
    for name in ("slices_dir", "results_dir"):
        path = getattr(script, name)
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValidationError(f"slice {name} must be an absolute path on the cluster, got {path!r}")
    grace = script.grace_seconds
    if isinstance(grace, bool) or not isinstance(grace, int) or not 1 <= grace < wall_seconds:
        raise ResourceError(
            f"slice grace_seconds={grace!r} must be a whole number of seconds from 1 to less than the wall time "
            f"({wall_seconds} s): SLURM warns the slice that long before its time limit"
        )
    if check_checkpoint_globs(script.checkpoint_globs) != script.checkpoint_globs:
        raise ValidationError(
            f"slice checkpoint_globs={script.checkpoint_globs!r} must be a tuple of distinct patterns"
        )
    signal = check_checkpoint_signal(script.checkpoint_signal)
    if signal != script.checkpoint_signal:
        raise ValidationError(f"checkpoint_signal={script.checkpoint_signal!r} must be written {signal!r}")
    if script.partition_limit is not None:
        _check_sbatch_word("slice partition_limit", script.partition_limit, _SLURM_TIME)
    elif script.grace_from_limit:
        raise ValidationError(
            "slice grace_from_limit needs a partition_limit: only a slice that takes its partition's limit "
            "takes its warning from it"
        )


def _check_sbatch_word(name: str, value: str, pattern: re.Pattern[str]) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValidationError(
            f"{name} {value!r} cannot go on an #SBATCH line; remove spaces, quotes and other special "
            f"characters (it must match {pattern.pattern})"
        )


def check_sbatch_option(option: str) -> None:
    """Refuse an ``#SBATCH`` option that is unsafe, or that the provider sets itself (abbreviated or not)."""
    match = _SBATCH_OPTION.fullmatch(option) if isinstance(option, str) else None
    if match is None:
        raise ValidationError(
            f"sbatch_extra entry {option!r} is not a safe '--option' or '--option=value' "
            f"(must match {_SBATCH_OPTION.pattern})"
        )
    name = match.group(1)
    meant = reserved_option(name, _MANAGED_SBATCH_OPTIONS)
    if meant is not None or name.startswith("container-"):
        shown = f"--{name}" + (f" (sbatch takes it for --{meant})" if meant not in (None, name) else "")
        raise ValidationError(
            f"sbatch_extra option {shown} is set by the provider; use the matching operator argument instead"
        )
