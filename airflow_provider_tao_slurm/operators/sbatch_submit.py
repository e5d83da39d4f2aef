"""``SbatchSubmitOperator``: render, lint, stage and submit one training job, exactly once."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core.defaults import DEFAULT_TIMEOUT_HOURS
from airflow_provider_tao_slurm.lifecycle.links import SlurmJobLogsLink, SlurmJobResultsLink
from airflow_provider_tao_slurm.lifecycle.support import (
    lint_bash,
    place_on_cluster,
    resolve_secret,
    secret_references,
    utc_now,
)
from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator

if TYPE_CHECKING:
    import jinja2

    from airflow_provider_tao_slurm.core.execution import Execution
    from airflow_provider_tao_slurm.core.layout import JobLayout
    from airflow_provider_tao_slurm.core.resources import Resources

#: Stands for "the cluster's default partition" while the script is checked before asking the cluster.
_DEFAULT_PARTITION_PLACEHOLDER = "cluster-default"
_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _check_env_names(env: Mapping[str, Any], param: str) -> dict[str, str]:
    from airflow_provider_tao_slurm.exceptions import ValidationError

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


class SbatchSubmitOperator(SlurmBaseOperator):
    """Submit a containerised training job to SLURM and return its job handle.

    The image must already be a ``.sqsh`` on shared storage (put :class:`EnrootImportOperator`
    upstream); a multi-node job needs a probed or explicit ``nccl_env`` (put
    :class:`NcclProbeOperator` upstream). In ``command``, ``env`` values and ``spec`` strings the
    literal tokens ``{results_dir}``, ``{job_id}`` and ``{config_path}`` are bound after the job
    record is opened. Exactly once: the job id (also the SLURM job name) comes from the DAG, task,
    run and map index; a retry of this task adopts the job its earlier try submitted.

    ``slurm_conn_id`` (the ``tao_slurm`` connection, default ``slurm_default``) and the ``BaseOperator``
    arguments (``task_id``, ``retries``, ...) are passed on through ``**kwargs``.

    :param image: ``.sqsh`` path on the cluster.
    :param command: the shell command run inside the container on every node.
    :param num_nodes: nodes (one task per node).
    :param gpus_per_node: GPUs per node (at most 8; 8 means exclusive nodes).
    :param cpus_per_task: CPUs per task.
    :param time_hours: wall-time limit (at most the partition's limit).
    :param timeout_hours: the program's own timeout, below ``time_hours``.
    :param partition: GPU partition(s); default from the connection.
    :param account: SLURM account; default from the connection.
    :param container_mounts: Pyxis mounts ``SRC:DST[:FLAGS][,...]``; default from the connection. They must show
        the job directory and the results directory at their own path (e.g. ``/lustre:/lustre``), and every
        absolute path in the spec's ``dataset`` section; that is checked before anything is staged.
    :param spec: TAO spec, staged as ``specs/spec.yaml`` (``{config_path}``): a dict, YAML text, or the
        name of a ``.yaml``/``.yml`` file next to the DAG file (or in the DAG's ``template_searchpath``),
        which Airflow reads and renders with Jinja like any templated file (``template_ext``).
    :param env: non-secret environment for the job.
    :param secret_env: secret environment as references only: ``{NAME: "env:VAR" | "conn:ID" | "var:KEY"}``,
        resolved at run time, written only to a mode-600 sidecar over stdin (a literal value is refused,
        so every secret can be redacted from log tails).
    :param nccl_env: NCCL settings from :class:`NcclProbeOperator` (required for a job with more than one
        GPU: several nodes, or one node with ``gpus_per_node > 1``).
    :param requeue: let SLURM requeue the job after node failure or preemption.
    :param exclude_nodes: nodes to avoid.
    :param network_arch: TAO network architecture (recorded); it decides whether the job is a TAO action, which
        :class:`SlurmJobSensor` holds COMPLETE only when ``status.json`` says SUCCESS. Pass ``"custom"`` for a
        plain container job. Default: the network of the TAO entry point the command starts with
        (``classification_pyt train ...``, the ``tao`` launcher), else ``"tao"`` for a TAO image (its name has
        the word ``tao``, e.g. ``nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh``), else ``"custom"``.
    :param action: TAO action (recorded).
    :param mem_mb: memory per node in MB (optional).
    :param qos: SLURM QOS (``--qos``).
    :param constraint: node features (``--constraint``, e.g. ``h100`` or ``a100&ib``).
    :param reservation: SLURM reservation(s) (``--reservation``).
    :param gpu_type: GPU type (``--gres=gpu:<type>:<n>``), e.g. ``h100``.
    :param total_gpus: total GPUs; the layout is derived from the partition's nodes (up to one node's
        GPUs on one node, above that whole nodes); leave ``num_nodes``/``gpus_per_node`` at their defaults.
    :param sbatch_options: more sbatch options ``{long-name: value}`` (``True`` for a flag), e.g.
        ``{"mail-type": "END", "comment": "run-42"}``; options the provider sets or that would break
        isolation (``uid``, ``output``, ``job-name``, ``export``, ``wrap`` ...) are refused.
    :param master_port: the rendezvous port; default: a port free on the master node, chosen when the
        job starts, so jobs sharing a node never collide.
    :param max_continuations: how many more slices a training may run after one ends at its time limit
        (0, the default: TIMEOUT is an error). A slice that ends TIMEOUT (or PREEMPTED and not requeued)
        after writing a new checkpoint is followed by the next one: the same script, results directory,
        spec, secrets and resources; the program resumes from its checkpoints. A slice runs until SLURM's
        limit (``timeout_hours`` does not stop it early). The sensor watches the whole chain. See the
        docs' "Long trainings" page.
    :param checkpoint_glob: file name pattern(s) of the checkpoints under ``results_dir`` a slice must
        write to be continued (default: TAO's, ``*.pth``, ``*.ckpt``, ``*.tlt``, ``*.hdf5``).
    :param checkpoint_signal: a signal the program handles by saving a checkpoint, sent to it shortly
        before each slice's limit (``None``, the default: none is sent; an unhandled ``SIGUSR1`` would
        end a Python or shell program at once).
    :param signal_grace_seconds: how long before the limit the batch script is warned (default: a
        tenth of the slice, 10 s to 10 min).
    :param execution: the spec bundle's ``execution`` block (pre/post commands, declared environment,
        torchrun launcher, child exit-code file, supporting files); see the docs' "Spec bundles" page.
    :param bundle_root: directory (on the worker) the bundle's ``supporting_files`` are relative to.
    """

    template_fields: Sequence[str] = (
        "image",
        "command",
        "spec",
        "env",
        "nccl_env",
        "partition",
        "account",
        "container_mounts",
        "network_arch",
        "action",
        "execution",
        "bundle_root",
        "qos",
        "constraint",
        "reservation",
        "gpu_type",
        "sbatch_options",
    )
    template_fields_renderers = {"spec": "yaml", "env": "json", "nccl_env": "json", "command": "bash"}
    #: Only ``spec`` is read from a file: a command or spec value that merely ends in ``.yaml`` stays text.
    template_ext: Sequence[str] = (".yaml", ".yml")
    operator_extra_links = (SlurmJobLogsLink(), SlurmJobResultsLink())

    def __init__(
        self,
        *,
        image: str,
        command: str | None = None,
        num_nodes: int = 1,
        gpus_per_node: int = 4,
        cpus_per_task: int = 16,
        time_hours: float = 4.0,
        timeout_hours: float = DEFAULT_TIMEOUT_HOURS,
        partition: str | None = None,
        account: str | None = None,
        container_mounts: str | None = None,
        spec: Mapping[str, Any] | str | None = None,
        env: Mapping[str, str] | None = None,
        secret_env: Mapping[str, str] | None = None,
        nccl_env: Mapping[str, str] | None = None,
        requeue: bool = True,
        exclude_nodes: Sequence[str] | None = None,
        network_arch: str | None = None,
        action: str = "train",
        mem_mb: int | None = None,
        execution: Mapping[str, Any] | None = None,
        bundle_root: str | None = None,
        qos: str | None = None,
        constraint: str | None = None,
        reservation: str | None = None,
        gpu_type: str | None = None,
        total_gpus: int | None = None,
        sbatch_options: Mapping[str, Any] | None = None,
        master_port: int | None = None,
        max_continuations: int = 0,
        checkpoint_glob: str | Sequence[str] | None = None,
        checkpoint_signal: str | None = None,
        signal_grace_seconds: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.image = image
        self.command = command
        self.num_nodes = num_nodes
        self.gpus_per_node = gpus_per_node
        self.cpus_per_task = cpus_per_task
        self.time_hours = time_hours
        self.timeout_hours = timeout_hours
        self.partition = partition
        self.account = account
        self.container_mounts = container_mounts
        self.spec = spec
        self.env = env
        self.secret_env = secret_env
        self.nccl_env = nccl_env
        self.requeue = requeue
        self.exclude_nodes = exclude_nodes
        self.network_arch = network_arch
        self.action = action
        self.mem_mb = mem_mb
        self.execution = execution
        self.bundle_root = bundle_root
        self.qos = qos
        self.constraint = constraint
        self.reservation = reservation
        self.gpu_type = gpu_type
        self.total_gpus = total_gpus
        self.sbatch_options = sbatch_options
        self.master_port = master_port
        self.max_continuations = max_continuations
        self.checkpoint_glob = checkpoint_glob
        self.checkpoint_signal = checkpoint_signal
        self.signal_grace_seconds = signal_grace_seconds

    # ------------------------------------------------------------------ validation (no SSH)

    def _validated(self) -> dict[str, Any]:
        from airflow_provider_tao_slurm.core.continuation import (
            check_checkpoint_globs,
            check_checkpoint_signal,
            check_max_continuations,
            grace_seconds,
        )
        from airflow_provider_tao_slurm.core.execution import parse_execution
        from airflow_provider_tao_slurm.core.images import parse_image
        from airflow_provider_tao_slurm.core.resources import build_resources, site_options
        from airflow_provider_tao_slurm.core.specs import load_spec
        from airflow_provider_tao_slurm.core.tao import job_network_arch
        from airflow_provider_tao_slurm.exceptions import ConnectionConfigError, ImageReferenceError, ValidationError

        settings = self.hook.settings
        image = parse_image(self.image)
        if image.kind != "sqsh":
            raise ImageReferenceError(
                f"image {self.image!r} is a registry reference; GPU jobs only run .sqsh files. Put "
                "EnrootImportOperator upstream and pass its output (the .sqsh path) as image"
            )
        resources = build_resources(
            num_nodes=self.num_nodes,
            gpus_per_node=self.gpus_per_node,
            cpus_per_task=self.cpus_per_task,
            time_hours=self.time_hours,
            timeout_hours=self.timeout_hours,
            partition=self.partition or settings.partitions,
            account=self.account or settings.account,
            max_time_hours=settings.max_time_hours,
            requeue=self.requeue,
            exclude_nodes=self.exclude_nodes,
            mem_mb=self.mem_mb,
            total_gpus=self.total_gpus,
            gpu_type=self.gpu_type,
            sbatch_extra=site_options(
                qos=self.qos,
                constraint=self.constraint,
                reservation=self.reservation,
                sbatch_options=dict(self.sbatch_options)
                if isinstance(self.sbatch_options, Mapping)
                else self.sbatch_options,
            ),
        )
        nccl_env = _check_env_names(self.nccl_env or {}, "nccl_env")
        # ``{}`` is a probe result too (no NCCL settings needed); only a missing one is refused.
        if resources.needs_nccl_probe and self.nccl_env is None:
            raise ValidationError(
                f"a job with {resources.num_nodes} node(s) x {resources.gpus_per_node} GPU(s) needs a working NCCL "
                "environment (P2P and network hangs happen inside a node too): put NcclProbeOperator upstream and "
                "pass its output as nccl_env (or pass nccl_env explicitly, {} for none)"
            )
        secret_names = _check_env_names(self.secret_env or {}, "secret_env")
        literal = sorted(name for name, source in secret_names.items() if name not in secret_references(secret_names))
        if literal:
            raise ValidationError(
                f"secret_env[{', '.join(literal)}] holds a literal value; give a reference instead "
                "('env:VAR' from the worker's environment, 'conn:ID' for a connection's password, 'var:KEY' for an "
                "Airflow Variable) so the secret never sits in the DAG and can be redacted from every log"
            )
        # A total_gpus request is laid out on the partition's nodes later (place_on_cluster checks it again).
        execution = parse_execution(
            self.execution, gpus_per_node=None if resources.layout_total is not None else resources.gpus_per_node
        )
        command = self.command if self.command is not None else execution.command
        if not isinstance(command, str) or not command.strip():
            raise ValidationError(
                "command is empty; give the shell command to run inside the container (or execution.command)"
            )
        if "\x00" in command:
            raise ValidationError("command contains a NUL byte, which no shell can carry; remove it")
        if not settings.results_dir:
            raise ConnectionConfigError(
                f"connection {self.slurm_conn_id!r} has no results_dir: set the shared base directory "
                "(extra results_dir or SLURM_BASE_RESULTS_DIR)"
            )
        if self.network_arch is not None and (not isinstance(self.network_arch, str) or not self.network_arch.strip()):
            raise ValidationError(
                f"network_arch={self.network_arch!r} must be a TAO network (e.g. 'classification_pyt') or 'custom' "
                "for a plain container job; leave it out to decide from the image and the command"
            )
        spec = load_spec(self.spec)
        max_continuations = check_max_continuations(self.max_continuations)
        return {
            "max_continuations": max_continuations,
            "checkpoint_globs": check_checkpoint_globs(self.checkpoint_glob),
            "checkpoint_signal": check_checkpoint_signal(self.checkpoint_signal),
            "grace_seconds": grace_seconds(resources.time_hours, self.signal_grace_seconds),
            "settings": settings,
            "command": command,
            "network_arch": job_network_arch(self.network_arch, image, command),
            "container_mounts": self.container_mounts or settings.container_mounts,
            "execution": execution,
            "helpers": self._supporting_files(execution),
            "image": image,
            "resources": resources,
            "env": _check_env_names({**dict(execution.environment), **(self.env or {})}, "env"),
            "secret_names": secret_names,
            "nccl_env": nccl_env,
            "spec": spec,
        }

    def _supporting_files(self, execution: Execution) -> tuple[dict[str, bytes], str] | None:
        """Read the bundle's supporting files on the worker and verify every declared SHA-256.

        :returns: ``({destination: content}, manifest JSON)``, or None without supporting files.
        """
        from airflow_provider_tao_slurm.core.execution import manifest
        from airflow_provider_tao_slurm.exceptions import ValidationError

        if not execution.supporting_files:
            return None
        if not self.bundle_root:
            raise ValidationError("execution.supporting_files needs bundle_root: the directory they are relative to")
        root = Path(self.bundle_root).resolve()
        contents = []
        for item in execution.supporting_files:
            path = (root / item.source).resolve()
            if not path.is_relative_to(root):
                raise ValidationError(f"supporting file {item.source!r} leaves bundle_root through a link; refusing")
            try:
                contents.append((item, path.read_bytes()))
            except OSError as exc:
                raise ValidationError(f"supporting file {item.source!r} cannot be read under {root}: {exc}") from None
        return {item.destination: content for item, content in contents}, manifest(contents)

    # ------------------------------------------------------------------ execute

    def resolve_template_files(self) -> None:
        """Read ``spec`` from its file when it names one (no other field is ever read from a file)."""
        import jinja2

        spec = self.spec
        if isinstance(spec, str) and spec.endswith(tuple(self.template_ext)):
            env = self.get_template_env()
            if env.loader is not None:
                with contextlib.suppress(jinja2.TemplateNotFound):
                    self.spec = env.loader.get_source(env, spec)[0]
        self.prepare_template()

    def render_template(
        self, content: Any, context: Any, jinja_env: jinja2.Environment | None = None, seen_oids: set[int] | None = None
    ) -> Any:
        """Render as Airflow does, except that only the ``spec`` field itself may name a template file."""
        import jinja2

        from airflow_provider_tao_slurm.exceptions import ValidationError

        if isinstance(content, str) and content.endswith(tuple(self.template_ext)):
            env = jinja_env or self.get_template_env()
            if content is not self.spec:
                return self._render(env.from_string(content), context)
            try:
                return super().render_template(content, context, env, seen_oids)
            except jinja2.TemplateNotFound:
                raise ValidationError(
                    f"spec={content!r} names a YAML file, but it is neither next to the DAG file nor in the DAG's "
                    "template_searchpath; put it there, or pass the spec as a dict or YAML text"
                ) from None
        return super().render_template(content, context, jinja_env, seen_oids)

    def execute(self, context: Any) -> dict[str, Any]:
        """Validate, render, lint, stage, open the record, submit (or adopt), mark RUNNING."""
        import yaml

        from airflow_provider_tao_slurm.core.binding import bind_text, bind_value, binding_values
        from airflow_provider_tao_slurm.core.continuation import SliceScript
        from airflow_provider_tao_slurm.core.execution import build_step_command, canonical_sha256, parse_execution
        from airflow_provider_tao_slurm.core.mounts import check_mounts, spec_dataset_paths
        from airflow_provider_tao_slurm.core.records import open_record
        from airflow_provider_tao_slurm.core.secrets import assert_no_secrets
        from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch, resource_fields
        from airflow_provider_tao_slurm.exceptions import SecretLeakError
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle

        checked = self._validated()
        settings = checked["settings"]
        ti = context["ti"]
        secrets = {name: resolve_secret(name, source) for name, source in checked["secret_names"].items()}
        secret_values = list(secrets.values())
        requested = checked["resources"]

        lifecycle = JobLifecycle(self.hook, self.log)
        attempt = lifecycle.plan_attempt(ti, settings.results_dir)
        job_id, layout = attempt.job_id, attempt.layout
        # An adopted job keeps the record its earlier try opened (history and submitted_at).
        previous = attempt.previous if attempt.adopted is not None else None

        values = binding_values(results_dir=layout.results_dir, job_id=job_id, config_path=layout.spec_path)
        execution: Execution = checked["execution"]
        helpers = checked["helpers"]
        command = bind_text(checked["command"], values)
        exit_codes_path: str | None = None
        if self.execution is not None:
            bound = dataclasses.replace(
                execution,
                pre=tuple(dataclasses.replace(step, command=bind_text(step.command, values)) for step in execution.pre),
                post=tuple(
                    dataclasses.replace(step, command=bind_text(step.command, values)) for step in execution.post
                ),
            )
            exit_codes_path = f"{layout.job_dir}/{execution.child_exit_code_path}"
            command = build_step_command(bound, command, exit_codes_path)
        env = {key: bind_text(value, values) for key, value in checked["env"].items()}
        spec = bind_value(checked["spec"], values, where="spec") if checked["spec"] is not None else None
        check_mounts(
            checked["container_mounts"],
            same_path={"job directory (spec, staged files)": layout.job_dir, "results directory": layout.results_dir},
            visible=spec_dataset_paths(spec),
            origin="the operator" if self.container_mounts else f"connection {self.slurm_conn_id!r}",
        )

        slice_script = (
            SliceScript(
                slices_dir=layout.slices_dir,
                grace_seconds=checked["grace_seconds"],
                results_dir=layout.results_dir,
                checkpoint_globs=checked["checkpoint_globs"],
                checkpoint_signal=checked["checkpoint_signal"],
            )
            if checked["max_continuations"]
            else None
        )

        def render(resources: Resources) -> str:
            return render_sbatch(
                SbatchSpec(
                    **resource_fields(resources),
                    job_name=job_id,
                    log_dir=layout.log_dir,
                    job_dir=layout.job_dir,
                    image=checked["image"].path,
                    container_mounts=checked["container_mounts"],
                    command=command,
                    env=env,
                    nccl_env=checked["nccl_env"],
                    sidecar=layout.sidecar_path if secrets else None,
                    exit_code_file=layout.exit_code_path,
                    ends_dir=layout.ends_dir,
                    master_port=self.master_port,
                    slice=slice_script,
                )
            )

        # Checked as requested first (no cluster needed: bad input never costs a round trip), then for the
        # partitions the cluster confirms (its default one when none was given), with their MaxTime.
        script = render(dataclasses.replace(requested, partition=requested.partition or _DEFAULT_PARTITION_PLACEHOLDER))
        spec_text = yaml.safe_dump(spec, sort_keys=False) if spec is not None else ""
        env_text = json.dumps(env, separators=(",", ":"), sort_keys=True)
        for where, text in (("the rendered sbatch script", script), ("spec", spec_text), ("env", env_text)):
            assert_no_secrets(text, where)
            if any(value in text for value in secret_values):
                raise SecretLeakError(f"a secret_env value appears in {where}; reference it by name ($NAME) instead")
        lint_bash(script)
        resources = place_on_cluster(self.hook, requested)
        if resources != requested:
            if requested.layout_total is not None:
                parse_execution(self.execution, gpus_per_node=resources.gpus_per_node)
            script = render(resources)

        now = utc_now()
        record = previous or open_record(
            job_id=job_id,
            cluster=settings.cluster_name,
            image=checked["image"].path,
            network_arch=checked["network_arch"],
            action=self.action,
            results_dir=layout.results_dir,
            job_dir=layout.job_dir,
            log_dir=layout.log_dir,
            job_name=job_id,
            now=now,
            retry_of=attempt.retry_of,
            bundle_sha256=canonical_sha256({"execution": self.execution, "files": helpers and helpers[1]})
            if self.execution is not None
            else None,
            config_sha256=hashlib.sha256(spec_text.encode()).hexdigest() if spec is not None else None,
            secrets=secret_values,
        )
        staged: dict[str, tuple[bytes | None, int]] = {}
        if attempt.adopted is None:
            staged = _job_files(layout, script, spec_text, env_text, secrets, record)
            if helpers is not None:
                staged.update(self._helper_files(layout, *helpers))
            meta = {
                "job_id": job_id,
                "dag_id": ti.dag_id,
                "task_id": ti.task_id,
                "run_id": ti.run_id,
                "map_index": ti.map_index,
                "image": checked["image"].path,
                "nodes": resources.num_nodes,
                "gpus_per_node": resources.gpus_per_node,
                "partition": resources.partition,
                "secret_names": sorted(secrets),
            }
            staged[layout.meta_path[len(layout.base) + 1 :]] = (
                json.dumps(meta, separators=(",", ":"), sort_keys=True).encode(),
                0o644,
            )
        adopted, record = lifecycle.submit_once(
            attempt, results_base=settings.results_dir, files=staged, record=record, secrets=secret_values
        )
        out_log, err_log = layout.log_paths(adopted)
        self.log.info("SLURM job %s (%s) submitted on %s", adopted, job_id, settings.cluster_name)
        self.log.info(
            "Logs: %s and %s; results: %s; record: %s", out_log, err_log, layout.results_dir, layout.record_path
        )
        return JobHandle(
            job_id=job_id,
            slurm_job_id=adopted,
            job_dir=layout.job_dir,
            results_dir=layout.results_dir,
            log_dir=layout.job_log_dir(adopted),
            record_path=layout.record_path,
            cluster=settings.cluster_name,
            script_path=layout.script_path,
            sidecar_path=layout.sidecar_path if secrets else None,
            exit_code_path=layout.exit_code_path,
            results_base=settings.results_dir,
            submitted_at=record.submitted_at,
            exclude_nodes=tuple(resources.exclude_nodes),
            child_exit_code_path=exit_codes_path,
            secret_refs=secret_references(checked["secret_names"]),
            retry_of=record.retry_of,
            num_nodes=resources.num_nodes,
            partition=resources.partition,
            max_continuations=checked["max_continuations"],
            checkpoint_globs=checked["checkpoint_globs"] if checked["max_continuations"] else (),
            time_hours=resources.time_hours,
        ).to_dict()

    def _helper_files(
        self, layout: JobLayout, contents: Mapping[str, bytes], manifest_text: str
    ) -> dict[str, tuple[bytes | None, int]]:
        """Supporting files under ``<job_dir>/inputs/action-helpers/`` with their manifest.

        An identical manifest already there is reused; a different bundle is never overwritten.
        """
        from airflow_provider_tao_slurm.core.execution import HELPERS_DIR
        from airflow_provider_tao_slurm.exceptions import ValidationError

        helpers_dir = f"{layout.job_dir}/{HELPERS_DIR}"
        existing = self.hook.read_file(f"{helpers_dir}/manifest.json")
        if existing is not None and existing != manifest_text:
            raise ValidationError(
                f"{helpers_dir} already holds a different bundle's files; a job directory is never overwritten "
                "with another bundle: submit it from a new DAG run (or remove that directory on purpose)"
            )
        if existing is not None:
            self.log.info("Supporting files already staged with an identical manifest: reusing them")
            return {}
        rel = helpers_dir[len(layout.base) + 1 :]
        files: dict[str, tuple[bytes | None, int]] = {
            f"{rel}/{destination}": (content, 0o644) for destination, content in contents.items()
        }
        files[f"{rel}/manifest.json"] = (manifest_text.encode(), 0o644)
        return files


def _job_files(
    layout: JobLayout,
    script: str,
    spec_text: str,
    env_text: str,
    secrets: Mapping[str, str],
    record: Any,
) -> dict[str, tuple[bytes | None, int]]:
    """The files (and directories: content None) staged for one job, relative to the results base."""
    from airflow_provider_tao_slurm.core.records import to_json
    from airflow_provider_tao_slurm.core.secrets import sidecar_text

    def rel(path: str) -> str:
        return path[len(layout.base) + 1 :]

    files: dict[str, tuple[bytes | None, int]] = {
        rel(layout.results_dir): (None, 0o755),
        rel(layout.log_dir): (None, 0o755),  # so the log tree is checked before anything is written
        rel(layout.ends_dir): (None, 0o755),  # the EXIT trap's end markers
        rel(layout.spec_path): (spec_text.encode(), 0o644),
        rel(layout.env_path): (env_text.encode(), 0o644),
        rel(layout.script_path): (script.encode(), 0o700),
        rel(layout.record_path): (to_json(record, list(secrets.values())).encode(), 0o644),
    }
    if secrets:
        files[rel(layout.sidecar_path)] = (sidecar_text(secrets).encode(), 0o600)
    return files
