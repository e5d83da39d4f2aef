"""``SbatchSubmitOperator``: render, lint, stage and submit one training job, exactly once."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import ResumableJobMixin

from airflow_provider_tao_slurm.core.defaults import SUBMITTED_JOB_KEY
from airflow_provider_tao_slurm.lifecycle.links import SlurmJobLogsLink, SlurmJobResultsLink
from airflow_provider_tao_slurm.lifecycle.support import (
    SECRET_SOURCES,
    lint_bash,
    place_training,
    resolve_secret,
    secret_references,
    utc_now,
)
from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator

if TYPE_CHECKING:
    import jinja2

    from airflow_provider_tao_slurm.core.execution import Execution
    from airflow_provider_tao_slurm.core.records import JobRecord
    from airflow_provider_tao_slurm.core.request import BoundRequest, StagedFiles, SubmitRequest, SupportingFiles
    from airflow_provider_tao_slurm.core.resources import Resources
    from airflow_provider_tao_slurm.lifecycle.events import JobHandle


class SbatchSubmitOperator(ResumableJobMixin, SlurmBaseOperator):
    """Submit a containerised training job to SLURM and return its job handle.

    The image must already be a ``.sqsh`` on shared storage (put :class:`EnrootImportOperator`
    upstream); a multi-node job needs a probed or explicit ``nccl_env`` (put
    :class:`NcclProbeOperator` upstream). In ``command``, ``env`` values and ``spec`` strings the
    literal tokens ``{results_dir}``, ``{job_id}`` and ``{config_path}`` are bound after the job
    record is opened. Exactly once: the job id (also the SLURM job name) comes from the DAG, task,
    run and map index; a retry of this task adopts the job its earlier try submitted: first through
    Airflow's task state store (:class:`airflow.sdk.ResumableJobMixin`: the handle is stored under
    ``slurm_job`` right after the submission, and Airflow's ``resumable_job.*`` metrics count each
    retry's decision), else by the job's exact name (a try that died between ``sbatch`` and the
    store write).

    ``slurm_conn_id`` (the ``tao_slurm`` connection, default ``slurm_default``) and the ``BaseOperator``
    arguments (``task_id``, ``retries``, ...) are passed on through ``**kwargs``.

    :param image: ``.sqsh`` path on the cluster.
    :param command: the shell command run inside the container on every node.
    :param num_nodes: nodes (one task per node); default 1.
    :param gpus_per_node: GPUs per node, at most the partition's node size; default 4. Every GPU of the
        partition's nodes (4 of 4, 8 of 8, 16 of 16) takes the nodes whole (``--exclusive``); fewer share them.
    :param cpus_per_task: CPUs per task (one task per node). Default ``None``: the node's CPUs for the job's
        share of its GPUs (all of them for a whole-node job; 16 where the node shape is unknown). A value no
        node of the partition can hold is refused before anything is submitted.
    :param time_hours: wall-time limit in hours (at most the partition's limit); default 4. A continued
        training (``max_continuations``) naming several partitions: its longest slice; each slice starts on
        whichever partition takes it first, with that partition's limit (the docs' "Long trainings" page).
    :param timeout_hours: the program's own timeout in hours, below ``time_hours``. Default ``None``:
        derived from ``time_hours``, less a twentieth of it and at least 15 s (3.8 for 4 h, 1.9 for 2 h,
        45 s for one minute), the time the batch script needs after the program. In a continued
        training (``max_continuations``) without it, each slice runs until SLURM's limit; with it, the
        program stops at it (exit 124 ends the slice as a TIMEOUT does).
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
        limit unless ``timeout_hours`` is given. The sensor watches the whole chain; it can use up to
        ``max_continuations + 1`` times one slice's GPU hours
        (:func:`~airflow_provider_tao_slurm.core.resources.gpu_hours_request`). See the docs' "Long
        trainings" page.
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
    :param durable: store the job handle in the task state store so that a retry reattaches through it
        (default ``True``; ``ResumableJobMixin``'s parameter). With ``False`` a retry still adopts its
        earlier try's job by name.
    """

    #: The task state store key of the submitted job's handle (renaming it breaks in-flight retries).
    external_id_key = SUBMITTED_JOB_KEY

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
        cpus_per_task: int | None = None,
        time_hours: float = 4.0,
        timeout_hours: float | None = None,
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
        durable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(durable=durable, **kwargs)
        self.image, self.command, self.spec, self.action = image, command, spec, action
        self.network_arch, self.execution, self.bundle_root = network_arch, execution, bundle_root
        self.num_nodes, self.gpus_per_node, self.total_gpus = num_nodes, gpus_per_node, total_gpus
        self.cpus_per_task, self.mem_mb, self.gpu_type = cpus_per_task, mem_mb, gpu_type
        self.time_hours, self.timeout_hours, self.requeue = time_hours, timeout_hours, requeue
        self.partition, self.account, self.exclude_nodes = partition, account, exclude_nodes
        self.qos, self.constraint, self.reservation = qos, constraint, reservation
        self.sbatch_options, self.container_mounts, self.master_port = sbatch_options, container_mounts, master_port
        self.env, self.secret_env, self.nccl_env = env, secret_env, nccl_env
        self.max_continuations, self.checkpoint_glob = max_continuations, checkpoint_glob
        self.checkpoint_signal, self.signal_grace_seconds = checkpoint_signal, signal_grace_seconds
        self._request: SubmitRequest | None = None
        self._handle: dict[str, Any] | None = None  # the job this try submitted
        self._reattached: dict[str, Any] = {}  # the job this try reattached to
        self._submitting = False  # inside sbatch's round trip: a kill stops it (on_kill)

    # ------------------------------------------------------------------ validation (no SSH)

    def _validated(self) -> SubmitRequest:
        """Every parameter checked before any SSH, as the request the submission is made from."""
        from airflow_provider_tao_slurm.core.request import submit_request

        return submit_request(
            settings=self.hook.settings,
            conn_id=self.slurm_conn_id,
            secret_sources=SECRET_SOURCES,
            read_supporting_files=self._supporting_files,
            image=self.image,
            command=self.command,
            num_nodes=self.num_nodes,
            gpus_per_node=self.gpus_per_node,
            cpus_per_task=self.cpus_per_task,
            time_hours=self.time_hours,
            timeout_hours=self.timeout_hours,
            partition=self.partition,
            account=self.account,
            container_mounts=self.container_mounts,
            spec=self.spec,
            env=self.env,
            secret_env=self.secret_env,
            nccl_env=self.nccl_env,
            requeue=self.requeue,
            exclude_nodes=self.exclude_nodes,
            network_arch=self.network_arch,
            action=self.action,
            mem_mb=self.mem_mb,
            execution=self.execution,
            qos=self.qos,
            constraint=self.constraint,
            reservation=self.reservation,
            gpu_type=self.gpu_type,
            total_gpus=self.total_gpus,
            sbatch_options=self.sbatch_options,
            master_port=self.master_port,
            max_continuations=self.max_continuations,
            checkpoint_glob=self.checkpoint_glob,
            checkpoint_signal=self.checkpoint_signal,
            signal_grace_seconds=self.signal_grace_seconds,
        )

    def _supporting_files(self, execution: Execution) -> SupportingFiles | None:
        """Read the bundle's supporting files on the worker and verify every declared SHA-256.

        :returns: their contents and manifest, or None without supporting files.
        """
        from airflow_provider_tao_slurm.core.execution import manifest
        from airflow_provider_tao_slurm.core.request import SupportingFiles
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
        return SupportingFiles({item.destination: content for item, content in contents}, manifest(contents))

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
        """Validate; reattach to the job an earlier try stored, or submit (or adopt) one.

        :returns: the job handle (:class:`~airflow_provider_tao_slurm.lifecycle.events.JobHandle` as a
            dict), pushed as the task's XCom ``return_value`` for the sensor and the extra links.
        """
        self._request = self._validated()
        result = self.execute_resumable(context)  # None when it reattached (ResumableJobMixin's contract)
        return dict(result if result is not None else self._reattached)

    # ------------------------------------------------------------------ ResumableJobMixin

    def on_kill(self) -> None:
        """Stop the submission a kill (SIGTERM) caught halfway, so that it is undone.

        Raises :class:`~airflow_provider_tao_slurm.exceptions.SubmissionStopped` into the submission (the Task
        SDK calls this from its SIGTERM handler): the job of that name, if sbatch made one, is cancelled and
        its secret sidecar removed. At any other moment there is nothing of this task's to stop: its job,
        once submitted, is the sensor's.
        """
        from airflow_provider_tao_slurm.exceptions import SubmissionStopped

        if self._submitting:
            raise SubmissionStopped

    def get_job_status(self, external_id: Any, context: Any) -> str:
        """Describe what became of the job an earlier try stored (see :mod:`.lifecycle.resume`)."""
        from airflow_provider_tao_slurm.lifecycle.events import JobHandle
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
        from airflow_provider_tao_slurm.lifecycle.resume import stored_job_status

        return stored_job_status(JobLifecycle(self.hook, self.log), JobHandle.from_dict(external_id))

    def is_job_active(self, status: str) -> bool:
        """Reattach to a job SLURM still runs, or that ended before any sensor settled it."""
        from airflow_provider_tao_slurm.lifecycle.resume import reattachable

        return reattachable(status)

    def is_job_succeeded(self, status: str) -> bool:
        """Take a job that ended COMPLETED before any sensor settled it as done: its handle is the result."""
        from airflow_provider_tao_slurm.lifecycle.resume import ended_well

        return ended_well(status)

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        """Nothing to wait for: the submit task is done once its job is submitted (the sensor waits for it)."""
        self._reattached = self.get_job_result(external_id, context)

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, Any]:
        """Return the job handle (a reattached one is said in the task log)."""
        if self._handle is None:  # not submitted by this try
            self.log.info(
                "Reattached to SLURM job %s (%s), submitted by an earlier try (task state store key %r)",
                external_id["slurm_job_id"],
                external_id["job_id"],
                self.external_id_key,
            )
        return dict(external_id)

    def submit_job(self, context: Any) -> dict[str, Any]:
        """Render, lint, stage, open the record, submit (or adopt by name), mark RUNNING; return the handle."""
        from airflow_provider_tao_slurm.core.request import bind_request
        from airflow_provider_tao_slurm.exceptions import SubmissionStopped
        from airflow_provider_tao_slurm.lifecycle.jobs import JobLifecycle
        from airflow_provider_tao_slurm.lifecycle.stopping import (
            STOPPED_BY_CTRL_C,
            STOPPED_BY_SIGTERM,
            abandon_submission,
        )
        from airflow_provider_tao_slurm.lifecycle.submission import note_unsignalled_preemption

        request = self._request if self._request is not None else self._validated()
        ti = context["ti"]
        secrets = {name: resolve_secret(name, source) for name, source in request.secret_env.items()}
        secret_values = list(secrets.values())
        lifecycle = JobLifecycle(self.hook, self.log)
        attempt = lifecycle.plan_attempt(ti, request.results_base)
        job = bind_request(request, attempt.layout, defer_mount_check=True)
        script, resources = self._script(job, secret_values, check_data=attempt.adopted is None)
        # The site's own container mounts came back with the partition table (no round trip of their own).
        job.check_mounts(self.hook.site_mounts())
        # An adopted job keeps the record its earlier try opened (history and submitted_at).
        previous = attempt.previous if attempt.adopted is not None else None
        record = previous or job.open_record(now=utc_now(), retry_of=attempt.retry_of, secrets=secret_values)
        staged = self._files(job, ti, script, record, resources, secrets) if attempt.adopted is None else {}
        self._submitting = True
        try:
            slurm_job_id, record = lifecycle.submit_once(
                attempt, results_base=request.results_base, files=staged, record=record, secrets=secret_values
            )
        except KeyboardInterrupt as stop:  # stopped mid-submission: nothing it staged may outlive it
            why = STOPPED_BY_SIGTERM if isinstance(stop, SubmissionStopped) else STOPPED_BY_CTRL_C
            abandon_submission(lifecycle, attempt.job_id, attempt.layout, source=why)
            raise
        finally:
            self._submitting = False
        self._log_submitted(job, slurm_job_id)
        note_unsignalled_preemption(self.hook, request.continuation, self.log)
        self._handle = _job_handle(job, slurm_job_id, record, resources).to_dict()
        return self._handle

    def _script(self, job: BoundRequest, secrets: Sequence[str], *, check_data: bool) -> tuple[str, Resources]:
        """Return the batch script and the resources placed on the cluster.

        Checked as requested first (no cluster needed: bad input never costs a round trip), then for the
        partitions the cluster confirms (its default one when none was given), with their MaxTime. With
        ``check_data`` (a job to submit, not one adopted), every dataset path of the spec must exist on the
        shared storage: tested from the login host in the round trip that reads the partition table (no
        extra round trip; a missing path stops the task before anything is staged or submitted). A path
        the container reads elsewhere than the host, or under the job's own directories, is left to the job
        (:func:`~airflow_provider_tao_slurm.core.storage.spec_dataset_checks`).
        """
        from airflow_provider_tao_slurm.core.resources import format_duration
        from airflow_provider_tao_slurm.core.storage import spec_dataset_checks

        script = job.draft_script(secrets)
        lint_bash(script)
        requested = job.request.resources
        layout = job.layout
        own = (layout.job_dir, layout.results_dir)
        datasets = spec_dataset_checks(job.spec, job.request.container_mounts, own=own) if check_data else []
        continued = bool(job.request.continuation.max_continuations)
        resources, slices = place_training(self.hook, requested, datasets=datasets, continued=continued)
        if slices:
            self.log.info(
                "Each slice starts on whichever partition takes it first, with that partition's limit: %s",
                ", ".join(f"{name} {format_duration(hours)}" for name, hours in slices.items()),
            )
        if resources != requested or slices:
            job.request.check_layout(resources)
            script = job.script(resources, slices)
        return script, resources

    def _files(
        self,
        job: BoundRequest,
        ti: Any,
        script: str,
        record: JobRecord,
        resources: Resources,
        secrets: Mapping[str, str],
    ) -> StagedFiles:
        """Return the files a newly submitted job stages (an adopted job stages nothing)."""
        return job.files(
            script=script,
            record=record,
            secrets=secrets,
            resources=resources,
            origin={"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": ti.map_index},
            helpers=self._stage_helpers(job),
        )

    def _log_submitted(self, job: BoundRequest, slurm_job_id: str) -> None:
        """Say where the job is, its logs, its results and its record."""
        layout = job.layout
        self.log.info("SLURM job %s (%s) submitted on %s", slurm_job_id, layout.job_id, job.request.cluster)
        self.log.info(
            "Logs: %s and %s; results: %s; record: %s",
            *layout.log_paths(slurm_job_id),
            layout.results_dir,
            layout.record_path,
        )

    def _stage_helpers(self, job: BoundRequest) -> bool:
        """Whether the bundle's supporting files are staged: not without any, nor when an identical manifest is there.

        A job directory is never overwritten with another bundle's files.
        """
        from airflow_provider_tao_slurm.exceptions import ValidationError

        supporting = job.request.supporting_files
        if supporting is None:
            return False
        existing = self.hook.read_file(job.layout.helpers_manifest_path)
        if existing is not None and existing != supporting.manifest:
            raise ValidationError(
                f"{job.layout.helpers_dir} already holds a different bundle's files; a job directory is never "
                "overwritten with another bundle: submit it from a new DAG run (or remove that directory on purpose)"
            )
        if existing is not None:
            self.log.info("Supporting files already staged with an identical manifest: reusing them")
            return False
        return True


def _job_handle(job: BoundRequest, slurm_job_id: str, record: JobRecord, resources: Resources) -> JobHandle:
    """Return the handle of the submitted (or adopted) job: what the sensor watches and the XCom carries."""
    from airflow_provider_tao_slurm.core.continuation import spec_checkpoint_interval
    from airflow_provider_tao_slurm.lifecycle.events import JobHandle

    request, layout = job.request, job.layout
    return JobHandle(
        job_id=layout.job_id,
        slurm_job_id=slurm_job_id,
        job_dir=layout.job_dir,
        results_dir=layout.results_dir,
        log_dir=layout.job_log_dir(slurm_job_id),
        record_path=layout.record_path,
        cluster=request.cluster,
        script_path=layout.script_path,
        sidecar_path=job.sidecar_path,
        exit_code_path=layout.exit_code_path,
        results_base=request.results_base,
        submitted_at=record.submitted_at,
        exclude_nodes=tuple(resources.exclude_nodes),
        child_exit_code_path=job.child_exit_code_path,
        secret_refs=secret_references(request.secret_env),
        retry_of=record.retry_of,
        num_nodes=resources.num_nodes,
        partition=resources.partition,
        max_continuations=request.continuation.max_continuations,
        checkpoint_globs=request.continuation.handle_globs,
        time_hours=resources.time_hours,
        checkpoint_interval=spec_checkpoint_interval(request.spec) if request.continuation.max_continuations else None,
    )
