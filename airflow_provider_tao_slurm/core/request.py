"""What one ``SbatchSubmitOperator`` task submits: its parameters, validated into one frozen request.

:func:`submit_request` checks every parameter before anything reaches the cluster and returns a
:class:`SubmitRequest`, which carries everything the submission needs. Once the task knows its job
id (and so the job's :class:`~airflow_provider_tao_slurm.core.layout.JobLayout`), :func:`bind_request`
fills in the literal tokens ``{results_dir}``, ``{job_id}`` and ``{config_path}`` and checks that the
container sees the job's files; the :class:`BoundRequest` renders the batch script, opens the job
record and lists the files to stage, every path from the layout.

Nothing here performs I/O: the caller reads the bundle's supporting files
(:data:`SupportingFilesReader`), resolves the secrets, and talks to the cluster.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import yaml

from airflow_provider_tao_slurm.core import records
from airflow_provider_tao_slurm.core.binding import bind_text, bind_value, binding_values
from airflow_provider_tao_slurm.core.continuation import (
    SliceScript,
    check_checkpoint_globs,
    check_checkpoint_signal,
    check_max_continuations,
    grace_seconds,
)
from airflow_provider_tao_slurm.core.execution import Execution, build_step_command, canonical_sha256, parse_execution
from airflow_provider_tao_slurm.core.images import ImageRef, parse_image
from airflow_provider_tao_slurm.core.mounts import SiteMounts, check_mounts, spec_dataset_paths
from airflow_provider_tao_slurm.core.resources import (
    Resources,
    check_job_parameters,
    gpu_resources,
    hours_to_slurm_time,
)
from airflow_provider_tao_slurm.core.secrets import assert_no_secrets, sidecar_text
from airflow_provider_tao_slurm.core.specs import load_spec
from airflow_provider_tao_slurm.core.tao import job_network_arch
from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch, resource_fields
from airflow_provider_tao_slurm.exceptions import (
    ConnectionConfigError,
    ImageReferenceError,
    SecretLeakError,
    ValidationError,
)

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.config import ClusterSettings
    from airflow_provider_tao_slurm.core.layout import JobLayout
    from airflow_provider_tao_slurm.core.records import JobRecord

#: Stands for "the cluster's default partition" while the script is checked before asking the cluster.
DEFAULT_PARTITION_PLACEHOLDER = "cluster-default"
_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

#: Files to stage, by their name relative to the results base: ``(content, mode)``; content ``None`` is a directory.
StagedFiles = dict[str, tuple[bytes | None, int]]


@dataclass(frozen=True)
class SupportingFiles:
    """A bundle's supporting files as the worker read them, each checked against its declared SHA-256.

    :param contents: ``{destination under the helpers directory: content}``.
    :param manifest: the manifest JSON staged next to them.
    """

    contents: Mapping[str, bytes]
    manifest: str


#: Reads the supporting files of a parsed ``execution`` block on the worker (``None`` without any).
SupportingFilesReader = Callable[[Execution], SupportingFiles | None]


@dataclass(frozen=True)
class Continuation:
    """How a training goes on after a slice ends at its time limit (see the docs' "Long trainings" page).

    :param max_continuations: how many more slices may follow the first (0: TIMEOUT is an error).
    :param checkpoint_globs: the checkpoint file name patterns a slice must write to be continued.
    :param checkpoint_signal: the signal forwarded to the program before the limit, or ``None``.
    :param grace_seconds: how long before the limit the batch script is warned.
    :param stop_at_timeout: ``timeout_hours`` was given: the program's own timeout stops each slice
        (exit 124, continued as a TIMEOUT is); without it a slice runs until SLURM's limit.
    :param grace_given: ``signal_grace_seconds`` was given (else the grace is a tenth of the slice).
    """

    max_continuations: int
    checkpoint_globs: tuple[str, ...]
    checkpoint_signal: str | None
    grace_seconds: int
    stop_at_timeout: bool = False
    grace_given: bool = False

    @property
    def handle_globs(self) -> tuple[str, ...]:
        """The patterns the job handle carries: none for a job that is not continued."""
        return self.checkpoint_globs if self.max_continuations else ()

    def slice_script(self, layout: JobLayout, slice_hours: Mapping[str, float] | None = None) -> SliceScript | None:
        """Return what the batch script needs to run as a slice of a chain; ``None`` for an ordinary job.

        :param slice_hours: each partition's slice length when the training names several whose limits differ
            (:func:`~airflow_provider_tao_slurm.core.partitions.slice_hours`): the slice takes the limit of
            the partition it starts on, and so does its warning (unless ``signal_grace_seconds`` was given:
            then that warning, which must fit the shortest slice it may get).
        :raises ValidationError: for a ``signal_grace_seconds`` not shorter than the shortest slice.
        """
        if not self.max_continuations:
            return None
        grace, limit, from_limit = self.grace_seconds, None, False
        if slice_hours:
            longest = max(slice_hours.values())
            limit = hours_to_slurm_time(longest)
            if self.grace_given:
                grace = grace_seconds(min(slice_hours.values()), self.grace_seconds)
            else:
                grace, from_limit = grace_seconds(longest), True
        return SliceScript(
            slices_dir=layout.slices_dir,
            grace_seconds=grace,
            partition_limit=limit,
            grace_from_limit=from_limit,
            results_dir=layout.results_dir,
            checkpoint_globs=self.checkpoint_globs,
            checkpoint_signal=self.checkpoint_signal,
            stop_at_timeout=self.stop_at_timeout,
        )


@dataclass(frozen=True)
class SubmitRequest:
    """A validated submission, before its job id is known; build it with :func:`submit_request`.

    :param image: the ``.sqsh`` path on the cluster.
    :param command: the shell command run in the container, its tokens not bound yet.
    :param resources: the resources as requested (an empty ``partition``: the cluster's default).
    :param results_base: the connection's shared base directory (``results_dir``).
    :param cluster: the cluster's name.
    :param container_mounts: the Pyxis mounts (the operator's, else the connection's), or ``None``.
    :param mounts_origin: where ``container_mounts`` came from, for messages.
    :param network_arch: the TAO network the record gets (``"custom"`` for a plain container job).
    :param action: the TAO action (recorded).
    :param env: the non-secret environment (the bundle's declared environment, then ``env``).
    :param secret_env: the secret environment as references (``env:``/``conn:``/``var:``), never values.
    :param nccl_env: the NCCL settings exported to the job.
    :param spec: the loaded TAO spec, or ``None``.
    :param execution: the parsed ``execution`` block (the default one without a bundle).
    :param execution_block: the ``execution`` block as given (``None``: no bundle).
    :param supporting_files: the bundle's supporting files, or ``None``.
    :param master_port: the rendezvous port, or ``None`` for one chosen when the job starts.
    :param continuation: how the training continues after a slice.
    """

    image: str
    command: str
    resources: Resources
    results_base: str
    cluster: str
    container_mounts: str | None
    mounts_origin: str
    network_arch: str
    action: str
    env: Mapping[str, str]
    secret_env: Mapping[str, str]
    nccl_env: Mapping[str, str]
    spec: Mapping[str, Any] | None
    execution: Execution
    execution_block: Mapping[str, Any] | None
    supporting_files: SupportingFiles | None
    master_port: int | None
    continuation: Continuation

    @property
    def bundle_sha256(self) -> str | None:
        """The SHA-256 of the bundle (its ``execution`` block and the supporting files' manifest), or ``None``."""
        if self.execution_block is None:
            return None
        files = self.supporting_files.manifest if self.supporting_files is not None else None
        return canonical_sha256({"execution": self.execution_block, "files": files})

    def check_layout(self, resources: Resources) -> None:
        """Check the bundle against the layout the cluster gave a ``total_gpus`` request.

        :param resources: the request placed on the cluster.
        :raises ValidationError: when the bundle's ``processes_per_node`` differs from its GPUs per node.
        """
        if self.resources.layout_total is not None:
            parse_execution(self.execution_block, gpus_per_node=resources.gpus_per_node)


@dataclass(frozen=True)
class BoundRequest:
    """A request bound to one job: its layout and its tokens filled in; build it with :func:`bind_request`.

    :param request: the validated request.
    :param layout: the job's paths (``layout.job_id`` is also the SLURM job name).
    :param command: the bound command (wrapped by the bundle's steps when there is a bundle).
    :param env: the bound non-secret environment.
    :param spec: the bound spec, or ``None``.
    :param spec_text: the spec as staged (``""`` without a spec).
    :param env_text: the environment as staged (compact, sorted JSON).
    :param child_exit_code_path: the bundle's child exit-code file, or ``None`` without a bundle.
    """

    request: SubmitRequest
    layout: JobLayout
    command: str
    env: Mapping[str, str]
    spec: Mapping[str, Any] | None
    spec_text: str
    env_text: str
    child_exit_code_path: str | None

    @property
    def sidecar_path(self) -> str | None:
        """The mode-600 secret sidecar, for a job with ``secret_env``."""
        return self.layout.sidecar_path if self.request.secret_env else None

    def script(self, resources: Resources, slice_hours: Mapping[str, float] | None = None) -> str:
        """Render the batch script for ``resources``.

        :param slice_hours: a continued training's slice length on each of its partitions, when they differ
            (:meth:`Continuation.slice_script`).

        :raises ValidationError: (or ``TemplateRenderError``) for a value the script cannot carry.
        """
        request, layout = self.request, self.layout
        return render_sbatch(
            SbatchSpec(
                **resource_fields(resources),
                job_name=layout.job_id,
                log_dir=layout.log_dir,
                job_dir=layout.job_dir,
                image=request.image,
                container_mounts=request.container_mounts,
                command=self.command,
                env=self.env,
                nccl_env=request.nccl_env,
                sidecar=self.sidecar_path,
                exit_code_file=layout.exit_code_path,
                ends_dir=layout.ends_dir,
                master_port=request.master_port,
                slice=request.continuation.slice_script(layout, slice_hours),
            )
        )

    def draft_script(self, secrets: Collection[str]) -> str:
        """Return the script as requested, rendered before the cluster is asked (its default partition stood in for).

        No credential and no ``secret_env`` value may appear in the script, the spec or the environment.

        :param secrets: the resolved ``secret_env`` values.
        :raises SecretLeakError: naming where a secret was found (never the secret).
        """
        requested = self.request.resources
        script = self.script(replace(requested, partition=requested.partition or DEFAULT_PARTITION_PLACEHOLDER))
        for where, text in (("the rendered sbatch script", script), ("spec", self.spec_text), ("env", self.env_text)):
            assert_no_secrets(text, where)
            if any(value in text for value in secrets):
                raise SecretLeakError(f"a secret_env value appears in {where}; reference it by name ($NAME) instead")
        return script

    def check_mounts(self, site_mounts: SiteMounts | None) -> None:
        """Check that the container sees the job's files.

        The job directory and the results directory must be shown at their own path, every dataset
        path of the spec where the spec names it.

        :param site_mounts: the site's own container mounts as the last preflight cached them (counted
            under the job's own), or None when no preflight did.
        :raises ValidationError: naming every unseen path at once, the mounts counted and the mount to add.
        """
        request, layout = self.request, self.layout
        check_mounts(
            request.container_mounts,
            same_path={"job directory (spec, staged files)": layout.job_dir, "results directory": layout.results_dir},
            visible=spec_dataset_paths(self.spec),
            origin=request.mounts_origin,
            site_mounts=site_mounts,
        )

    def open_record(self, *, now: str, retry_of: str | None, secrets: Sequence[str]) -> JobRecord:
        """Return the job's new record (PENDING), redacted of ``secrets``.

        :param now: ISO-8601 UTC time, also ``submitted_at``.
        :param retry_of: the job id of the record this job retries, or ``None``.
        :param secrets: the resolved ``secret_env`` values.
        """
        request, layout = self.request, self.layout
        return records.open_record(
            job_id=layout.job_id,
            cluster=request.cluster,
            image=request.image,
            network_arch=request.network_arch,
            action=request.action,
            results_dir=layout.results_dir,
            job_dir=layout.job_dir,
            log_dir=layout.log_dir,
            job_name=layout.job_id,
            now=now,
            retry_of=retry_of,
            bundle_sha256=request.bundle_sha256,
            config_sha256=hashlib.sha256(self.spec_text.encode()).hexdigest() if self.spec is not None else None,
            secrets=secrets,
        )

    def files(
        self,
        *,
        script: str,
        record: JobRecord,
        secrets: Mapping[str, str],
        resources: Resources,
        origin: Mapping[str, Any],
        helpers: bool,
    ) -> StagedFiles:
        """Everything staged for the job, named relative to the results base (:meth:`JobLayout.staged_name`).

        :param script: the batch script.
        :param record: the job's record.
        :param secrets: the resolved ``secret_env`` (``{name: value}``), written only to the sidecar.
        :param resources: the resources placed on the cluster (recorded in ``meta``).
        :param origin: the Airflow task the job belongs to (``dag_id``, ``task_id``, ``run_id``, ``map_index``).
        :param helpers: stage the bundle's supporting files (not when an identical set is already there).
        """
        layout = self.layout
        name = layout.staged_name
        files: StagedFiles = {
            name(layout.results_dir): (None, 0o755),
            name(layout.log_dir): (None, 0o755),  # so the log tree is checked before anything is written
            name(layout.ends_dir): (None, 0o755),  # the EXIT trap's end markers
            name(layout.spec_path): (self.spec_text.encode(), 0o644),
            name(layout.env_path): (self.env_text.encode(), 0o644),
            name(layout.script_path): (script.encode(), 0o700),
            name(layout.record_path): (records.to_json(record, list(secrets.values())).encode(), 0o644),
        }
        if secrets:
            files[name(layout.sidecar_path)] = (sidecar_text(secrets).encode(), 0o600)
        supporting = self.request.supporting_files
        if helpers and supporting is not None:
            files.update({name(layout.helper_path(path)): (data, 0o644) for path, data in supporting.contents.items()})
            files[name(layout.helpers_manifest_path)] = (supporting.manifest.encode(), 0o644)
        meta = {
            "job_id": layout.job_id,
            **origin,
            "image": self.request.image,
            "nodes": resources.num_nodes,
            "gpus_per_node": resources.gpus_per_node,
            "partition": resources.partition,
            "secret_names": sorted(secrets),
        }
        files[name(layout.meta_path)] = (json.dumps(meta, separators=(",", ":"), sort_keys=True).encode(), 0o644)
        return files


# ------------------------------------------------------------------ validation


def check_env_names(env: Mapping[str, Any], param: str) -> dict[str, str]:
    """Check an environment mapping: its names must be variable names, its values strings a shell can carry.

    :param param: the parameter named in the error (``env``, ``secret_env``, ``nccl_env``).
    :raises ValidationError: naming the entry and the fix.
    """
    checked: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or key[0].isdigit() or not set(key) <= _ENV_NAME_CHARS:
            raise ValidationError(
                f"{param} name {key!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if not isinstance(value, str):
            raise ValidationError(f"{param}[{key!r}] must be a string (got {type(value).__name__}); quote it")
        if "\x00" in value:
            raise ValidationError(f"{param}[{key!r}] contains a NUL byte, which no shell can carry; remove it")
        checked[key] = value
    return checked


def _sqsh_path(image: ImageRef) -> str:
    if image.kind != "sqsh" or image.path is None:
        raise ImageReferenceError(
            f"image {image.raw!r} is a registry reference; GPU jobs only run .sqsh files. Put "
            "EnrootImportOperator upstream and pass its output (the .sqsh path) as image"
        )
    return image.path


def _nccl_env(nccl_env: Mapping[str, str] | None, resources: Resources) -> dict[str, str]:
    checked = check_env_names(nccl_env or {}, "nccl_env")
    # ``{}`` is a probe result too (no NCCL settings needed); only a missing one is refused.
    if resources.needs_nccl_probe and nccl_env is None:
        raise ValidationError(
            f"a job with {resources.num_nodes} node(s) x {resources.gpus_per_node} GPU(s) needs a working NCCL "
            "environment (P2P and network hangs happen inside a node too): put NcclProbeOperator upstream and "
            "pass its output as nccl_env (or pass nccl_env explicitly, {} for none)"
        )
    return checked


def _secret_env(secret_env: Mapping[str, str] | None, sources: Collection[str]) -> dict[str, str]:
    checked = check_env_names(secret_env or {}, "secret_env")
    literal = sorted(name for name, source in checked.items() if source.partition(":")[0] not in sources)
    if literal:
        raise ValidationError(
            f"secret_env[{', '.join(literal)}] holds a literal value; give a reference instead "
            "('env:VAR' from the worker's environment, 'conn:ID' for a connection's password, 'var:KEY' for an "
            "Airflow Variable) so the secret never sits in the DAG and can be redacted from every log"
        )
    return checked


def _command(command: object) -> str:
    if not isinstance(command, str) or not command.strip():
        raise ValidationError(
            "command is empty; give the shell command to run inside the container (or execution.command)"
        )
    if "\x00" in command:
        raise ValidationError("command contains a NUL byte, which no shell can carry; remove it")
    return command


def _results_base(settings: ClusterSettings, conn_id: str) -> str:
    if not settings.results_dir:
        raise ConnectionConfigError(
            f"connection {conn_id!r} has no results_dir: set the shared base directory "
            "(extra results_dir or SLURM_BASE_RESULTS_DIR)"
        )
    return settings.results_dir


def _check_network_arch(network_arch: object) -> None:
    if network_arch is not None and (not isinstance(network_arch, str) or not network_arch.strip()):
        raise ValidationError(
            f"network_arch={network_arch!r} must be a TAO network (e.g. 'classification_pyt') or 'custom' "
            "for a plain container job; leave it out to decide from the image and the command"
        )


def _continuation(
    resources: Resources,
    max_continuations: int,
    checkpoint_glob: object,
    checkpoint_signal: object,
    grace: object,
    stop_at_timeout: bool,
) -> Continuation:
    return Continuation(
        max_continuations=check_max_continuations(max_continuations),
        checkpoint_globs=check_checkpoint_globs(checkpoint_glob),
        checkpoint_signal=check_checkpoint_signal(checkpoint_signal),
        grace_seconds=grace_seconds(resources.time_hours, grace),
        stop_at_timeout=stop_at_timeout,
        grace_given=grace is not None,
    )


class SubmitParameters(TypedDict):
    """``SbatchSubmitOperator``'s parameters, as :func:`submit_request` takes them (see the operator's docstring)."""

    image: str
    command: str | None
    num_nodes: int
    gpus_per_node: int
    cpus_per_task: int | None
    time_hours: float
    timeout_hours: float | None
    partition: str | None
    account: str | None
    container_mounts: str | None
    spec: Mapping[str, Any] | str | None
    env: Mapping[str, str] | None
    secret_env: Mapping[str, str] | None
    nccl_env: Mapping[str, str] | None
    requeue: bool
    exclude_nodes: Sequence[str] | None
    network_arch: str | None
    action: str
    mem_mb: int | None
    execution: Mapping[str, Any] | None
    qos: str | None
    constraint: str | None
    reservation: str | None
    gpu_type: str | None
    total_gpus: int | None
    sbatch_options: Mapping[str, Any] | None
    master_port: int | None
    max_continuations: int
    checkpoint_glob: str | Sequence[str] | None
    checkpoint_signal: str | None
    signal_grace_seconds: int | None


def _check_parameter_names(parameters: Mapping[str, Any]) -> None:
    """Refuse a call that leaves out or misnames one of :class:`SubmitParameters` (as a signature would).

    :raises TypeError: naming the missing and the unexpected keyword arguments.
    """
    missing = sorted(SubmitParameters.__required_keys__ - parameters.keys())
    unexpected = sorted(parameters.keys() - SubmitParameters.__annotations__.keys())
    if missing or unexpected:
        raise TypeError(f"submit_request() missing keyword arguments {missing}, unexpected ones {unexpected}")


def _resources(settings: ClusterSettings, parameters: SubmitParameters) -> Resources:
    """Validate the job's resources; the partition and the account default to the connection's.

    :raises ResourceError: naming the parameter and the fix.
    """
    shared = check_job_parameters(
        partition=parameters["partition"] or settings.partitions,
        account=parameters["account"] or settings.account,
        cpus_per_task=parameters["cpus_per_task"],
        mem_mb=parameters["mem_mb"],
        time_hours=parameters["time_hours"],
        gpu_type=parameters["gpu_type"],
        qos=parameters["qos"],
        constraint=parameters["constraint"],
        reservation=parameters["reservation"],
        sbatch_options=parameters["sbatch_options"],
    )
    return gpu_resources(
        shared,
        num_nodes=parameters["num_nodes"],
        gpus_per_node=parameters["gpus_per_node"],
        timeout_hours=parameters["timeout_hours"],
        max_time_hours=settings.max_time_hours,
        requeue=parameters["requeue"],
        exclude_nodes=parameters["exclude_nodes"],
        total_gpus=parameters["total_gpus"],
    )


def submit_request(
    *,
    settings: ClusterSettings,
    conn_id: str,
    secret_sources: Collection[str],
    read_supporting_files: SupportingFilesReader,
    **parameters: Unpack[SubmitParameters],
) -> SubmitRequest:
    """Validate ``SbatchSubmitOperator``'s parameters (see its docstring for each) into a request.

    Nothing here reaches the cluster: a bad value fails before any SSH. The partition, account and
    container mounts default to the connection's.

    :param settings: the connection's settings.
    :param conn_id: the connection's id, for messages.
    :param secret_sources: the reference kinds a ``secret_env`` value may name (``env``, ``conn``, ``var``).
    :param read_supporting_files: reads the bundle's supporting files on the worker.
    :param parameters: the operator's parameters (:class:`SubmitParameters`), all of them by name.
    :returns: the validated :class:`SubmitRequest`.
    :raises ValidationError: (or a subclass: ``ImageReferenceError``, ``ResourceError``,
        ``ConnectionConfigError``) naming the parameter and the fix.
    """
    _check_parameter_names(parameters)
    p = parameters
    image_ref = parse_image(p["image"])
    image_path = _sqsh_path(image_ref)
    resources = _resources(settings, p)
    nccl = _nccl_env(p["nccl_env"], resources)
    secrets = _secret_env(p["secret_env"], secret_sources)
    # A total_gpus request is laid out on the partition's nodes later (SubmitRequest.check_layout checks it again).
    known_gpus_per_node = None if resources.layout_total is not None else resources.gpus_per_node
    parsed = parse_execution(p["execution"], gpus_per_node=known_gpus_per_node)
    job_command = _command(p["command"] if p["command"] is not None else parsed.command)
    results_base = _results_base(settings, conn_id)
    _check_network_arch(p["network_arch"])
    loaded_spec = load_spec(p["spec"])
    grace, stop_at_timeout = p["signal_grace_seconds"], p["timeout_hours"] is not None
    continuation = _continuation(
        resources, p["max_continuations"], p["checkpoint_glob"], p["checkpoint_signal"], grace, stop_at_timeout
    )
    return SubmitRequest(
        image=image_path,
        command=job_command,
        resources=resources,
        results_base=results_base,
        cluster=settings.cluster_name,
        container_mounts=p["container_mounts"] or settings.container_mounts,
        mounts_origin="the operator" if p["container_mounts"] else f"connection {conn_id!r}",
        network_arch=job_network_arch(p["network_arch"], image_ref, job_command),
        action=p["action"],
        execution=parsed,
        execution_block=p["execution"],
        supporting_files=read_supporting_files(parsed),
        env=MappingProxyType(check_env_names({**dict(parsed.environment), **(p["env"] or {})}, "env")),
        secret_env=MappingProxyType(secrets),
        nccl_env=MappingProxyType(nccl),
        spec=loaded_spec,
        master_port=p["master_port"],
        continuation=continuation,
    )


def bind_request(
    request: SubmitRequest,
    layout: JobLayout,
    *,
    site_mounts: SiteMounts | None = None,
    defer_mount_check: bool = False,
) -> BoundRequest:
    """Bind ``request`` to the job of ``layout`` and check that its container sees the job's files.

    The site's own mounts come from the cluster (the preflight's cache, read with the partition table),
    so a caller that reads them after binding (the submit operator: its partition read comes after the
    script is linted, so bad input costs no round trip) passes ``defer_mount_check`` and calls
    :meth:`BoundRequest.check_mounts` once it has them, before anything is staged.

    :param request: the validated request.
    :param layout: the job's paths.
    :param site_mounts: the site's own container mounts (None: not known).
    :param defer_mount_check: leave the mount check to the caller.
    :raises ValidationError: when the container mounts do not show the job directory, the results
        directory or a dataset path of the spec (every unseen path named at once).
    """
    values = binding_values(results_dir=layout.results_dir, job_id=layout.job_id, config_path=layout.spec_path)
    execution = request.execution
    command = bind_text(request.command, values)
    child_exit_code_path: str | None = None
    if request.execution_block is not None:
        bound = replace(
            execution,
            pre=tuple(replace(step, command=bind_text(step.command, values)) for step in execution.pre),
            post=tuple(replace(step, command=bind_text(step.command, values)) for step in execution.post),
        )
        child_exit_code_path = layout.in_job_dir(execution.child_exit_code_path)
        command = build_step_command(bound, command, child_exit_code_path)
    env = {key: bind_text(value, values) for key, value in request.env.items()}
    spec = bind_value(request.spec, values, where="spec") if request.spec is not None else None
    job = BoundRequest(
        request=request,
        layout=layout,
        command=command,
        env=MappingProxyType(env),
        spec=spec,
        spec_text=yaml.safe_dump(spec, sort_keys=False) if spec is not None else "",
        env_text=json.dumps(env, separators=(",", ":"), sort_keys=True),
        child_exit_code_path=child_exit_code_path,
    )
    if not defer_mount_check:
        job.check_mounts(site_mounts)
    return job
