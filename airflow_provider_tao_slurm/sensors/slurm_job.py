"""``SlurmJobSensor``: wait (deferred) for a submitted job, then settle its record.

On the terminal event it writes the observed transitions to the job record, shows the new part
of the job's logs in the task log, checks ``status.json`` on success, classifies failures with
evidence, resubmits the staged script after infrastructure failures (new record, ``retry_of``,
failed nodes excluded), and removes the secret sidecar once the job is over.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.execution import parse_child_exit_codes
from airflow_provider_tao_slurm.core.failures import classify
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import (
    JobRecord,
    check_job_id,
    from_json,
    mark,
    mint_job_id,
    open_record,
    to_json,
)
from airflow_provider_tao_slurm.core.secrets import redact_text
from airflow_provider_tao_slurm.core.states import ErrClass, TaoState, state_from_native
from airflow_provider_tao_slurm.core.status import status_verdict
from airflow_provider_tao_slurm.exceptions import (
    AmbiguousSubmissionError,
    JobFailedError,
    JobNotFoundError,
    SubmissionError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.operators.base import SlurmHookMixin
from airflow_provider_tao_slurm.operators.sbatch_submit import resolve_secret
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger, state_to_payload

#: What the sensor needs from the submit operator's job handle.
HANDLE_KEYS = ("job_id", "slurm_job_id", "job_dir", "results_dir", "record_path", "results_base")
#: Bytes of each log shown in the task log at the end.
LOG_TAIL_BYTES = 16384


def _utc(ts: float | None = None) -> str:
    moment = datetime.fromtimestamp(ts, UTC) if ts is not None else datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _state_from_payload(job_id: str, payload: Mapping[str, Any]) -> Any:
    return state_from_native(
        job_id,
        str(payload.get("raw_state") or payload.get("native") or ""),
        source=payload.get("source") or "sacct",
        exit_code=payload.get("exit_code"),
        signal=payload.get("signal"),
        reason=payload.get("reason"),
        node_list=payload.get("node_list"),
        start=payload.get("start"),
        end=payload.get("end"),
        name=payload.get("name"),
    )


class SlurmJobSensor(SlurmHookMixin, BaseSensorOperator):
    """Wait until a job submitted by :class:`SbatchSubmitOperator` is terminal; return its final record.

    :param job: the job handle returned by ``SbatchSubmitOperator`` (usually its XCom).
    :param slurm_conn_id: the ``tao_slurm`` connection.
    :param poke_interval: seconds between status polls (shared per cluster when deferred).
    :param deferrable: wait in the triggerer (default) instead of holding a worker slot.
    :param max_infra_retries: how many times an infrastructure failure (NODE_FAIL, GPU Xid, NCCL
        transport, ...) is resubmitted, avoiding the failed nodes.
    :param require_status_json: fail a COMPLETED job whose ``status.json`` is missing.
    :param not_found_grace: seconds a job may be unknown to squeue and sacct (accounting lag).
    """

    template_fields: Sequence[str] = ("job",)
    ui_color = "#76b900"

    def __init__(
        self,
        *,
        job: Mapping[str, Any] | str,
        slurm_conn_id: str = SlurmHook.default_conn_name,
        poke_interval: float = 30,
        deferrable: bool = True,
        max_infra_retries: int = 2,
        require_status_json: bool = False,
        not_found_grace: float = 300.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("timeout", 60 * 60 * 24 * 365)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job = job
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = deferrable
        self.max_infra_retries = max_infra_retries
        self.require_status_json = require_status_json
        self.not_found_grace = not_found_grace
        self._current: dict[str, Any] | None = None

    # ------------------------------------------------------------------ inputs

    def _handle(self, job: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
        value = self.job if job is None else job
        if not isinstance(value, Mapping):
            raise ValidationError(
                "job must be the dict returned by SbatchSubmitOperator (pass submit.output); got "
                f"{type(value).__name__}"
            )
        missing = [key for key in HANDLE_KEYS if not value.get(key)]
        if missing:
            raise ValidationError(f"job handle lacks {', '.join(missing)}; pass SbatchSubmitOperator's output")
        if not str(value["slurm_job_id"]).isdigit():
            raise ValidationError(f"job handle has a bad slurm_job_id {value['slurm_job_id']!r}")
        check_job_id(value["job_id"], "job handle's job_id")
        handle = dict(value)
        handle.setdefault("infra_retries", 0)
        return handle

    # ------------------------------------------------------------------ deferrable path

    def execute(self, context: Any) -> Any:
        """Validate the handle, then defer to :class:`SlurmJobTrigger` (or poke when not deferrable)."""
        handle = self._handle()
        if not self.deferrable:
            self._current = handle
            return super().execute(context)
        self._defer(handle)
        return None

    def _defer(self, handle: Mapping[str, Any]) -> None:
        submitted = handle.get("submitted_at")
        submitted_at = (
            datetime.strptime(submitted, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp() if submitted else None
        )
        self.defer(
            trigger=SlurmJobTrigger(
                slurm_conn_id=self.slurm_conn_id,
                slurm_job_id=str(handle["slurm_job_id"]),
                job_name=str(handle["job_id"]),
                poll_interval=float(self.poke_interval),
                submitted_at=submitted_at,
                not_found_grace=self.not_found_grace,
                sidecar_path=handle.get("sidecar_path"),
            ),
            method_name="execute_complete",
            kwargs={"job": dict(handle)},
            timeout=None,
        )

    def execute_complete(self, context: Any, event: Mapping[str, Any] | None = None, job: Any = None) -> Any:
        """Resume after the trigger fired: settle the record, maybe resubmit (and defer again)."""
        handle = self._handle(job)
        if not isinstance(event, Mapping) or "status" not in event:
            raise ValidationError(f"unexpected trigger event {event!r}")
        if event.get("slurm_job_id") != str(handle["slurm_job_id"]):
            raise ValidationError(
                f"trigger event is for job {event.get('slurm_job_id')}, not {handle['slurm_job_id']}; clear the task"
            )
        outcome = self._settle(context, handle, event)
        if isinstance(outcome, dict) and outcome.get("resubmitted"):
            self._defer(outcome["handle"])
        return outcome

    # ------------------------------------------------------------------ poke path

    def poke(self, context: Any) -> bool | PokeReturnValue:
        """One status query; settles the job when it is terminal (non-deferrable mode)."""
        handle = self._current or self._handle()
        slurm_id = str(handle["slurm_job_id"])
        state = self.hook.get_states([slurm_id]).get(slurm_id)
        if state is None or not state.is_terminal:
            if state is not None:
                self.log.info("SLURM job %s: %s %s", slurm_id, state.native, state.reason or "")
            return False
        event = {"status": "terminal", "slurm_job_id": slurm_id, "state": state_to_payload(state), "transitions": []}
        outcome = self._settle(context, handle, event)
        if outcome.get("resubmitted"):
            self._current = outcome["handle"]
            return False
        return PokeReturnValue(is_done=True, xcom_value=outcome)

    def on_kill(self) -> None:
        """A user killed the task waiting in the worker (``deferrable=False``): cancel the job, remove its sidecar.

        A deferred sensor is killed through its trigger's ``on_kill`` instead; this one then has no job.
        """
        handle = self._current
        if handle is None:
            return
        self.log.info("Cancelling SLURM job %s (%s) on user request", handle["slurm_job_id"], handle["job_id"])
        self.hook.cancel([str(handle["slurm_job_id"])], job_name=str(handle["job_id"]))
        sidecar = handle.get("sidecar_path")
        if sidecar:
            self.hook.run(commands.remove_files([sidecar]), check=True, what="removing the secret sidecar")

    # ------------------------------------------------------------------ settling

    def _settle(self, context: Any, handle: dict[str, Any], event: Mapping[str, Any]) -> dict[str, Any]:
        hook = self.hook
        record = from_json(hook.read_file(handle["record_path"]) or _missing_record(handle))
        started = any(t.source == "trigger" and t.state == TaoState.RUNNING for t in record.transitions)
        # A retried sensor may settle a job whose record is already terminal: nothing follows that.
        for transition in event.get("transitions", []) if record.terminal_state is None else []:
            state = TaoState(transition["state"])
            started = started or state is TaoState.RUNNING
            # The submit already recorded RUNNING ("submitted"); queue waits before the job first ran
            # are logged by the trigger, while PENDING after a real start (a requeue) is recorded.
            if state.is_terminal or (state is TaoState.PENDING and not started):
                continue
            record = mark(
                record,
                state,
                now=_utc(transition.get("ts")),
                message=" ".join(str(x) for x in (transition.get("native"), transition.get("reason")) if x),
                source="trigger",
                backend_ref=str(handle["slurm_job_id"]),
            )
        log_tail = self._show_logs(handle)
        if event["status"] != "terminal":
            record = _settled(record, TaoState.ERROR, message=str(event.get("message")))
            self._write(handle, record)
            raise JobNotFoundError(str(event.get("message")))
        state = _state_from_payload(str(handle["slurm_job_id"]), event["state"])
        if state.tao_state is TaoState.COMPLETE:
            return self._completed(handle, record, state)
        if state.tao_state is TaoState.CANCELED:
            reason = f"SLURM job {state.job_id} ended {state.raw_state or state.native}"
            record = _settled(record, TaoState.CANCELED, message=reason)
            self._finish(handle, record)
            raise JobFailedError(f"{reason}; it was cancelled outside this task (scancel, preemption or an admin)")
        verdict = classify(state, log_tail)
        if verdict.err_class is ErrClass.ERR_INFRA and int(handle.get("infra_retries", 0)) < self.max_infra_retries:
            return self._resubmit(context, handle, record, state, verdict)
        message = f"{state.native} exit {state.exit_code}: {verdict.reason} [{verdict.evidence}]"
        record = _settled(
            record,
            TaoState.ERROR,
            message=message,
            err_class=verdict.err_class,
            exit_codes=self._exit_codes(handle, state.exit_code),
        )
        self._finish(handle, record)
        raise JobFailedError(
            f"SLURM job {state.job_id} failed ({verdict.err_class}): {verdict.reason}; evidence: {verdict.evidence}. "
            f"Logs: {handle.get('log_dir')}",
            err_class=str(verdict.err_class),
        )

    def _completed(self, handle: dict[str, Any], record: JobRecord, state: Any) -> dict[str, Any]:
        layout = JobLayout(handle["results_base"], handle["job_id"])
        verdict = status_verdict(self.hook.read_status_json(layout_status(handle, layout)))
        exit_codes = self._exit_codes(handle, state.exit_code if state.exit_code is not None else 0)
        if verdict.ok is False or (verdict.ok is None and self.require_status_json):
            record = _settled(
                record,
                TaoState.ERROR,
                message=f"COMPLETED but {verdict.message}",
                err_class=ErrClass.ERR_PROGRAM,
                exit_codes=exit_codes,
            )
            self._finish(handle, record)
            raise JobFailedError(f"SLURM job {state.job_id} completed but {verdict.message}", err_class="ERR_PROGRAM")
        record = _settled(
            record,
            TaoState.COMPLETE,
            message=f"COMPLETED; status.json: {verdict.message}",
            backend_ref=str(handle["slurm_job_id"]),
            exit_codes=exit_codes,
        )
        self._finish(handle, record)
        self.log.info("Job %s complete; results in %s", handle["job_id"], handle["results_dir"])
        return _record_dict(record)

    def _resubmit(
        self, context: Any, handle: dict[str, Any], record: JobRecord, state: Any, verdict: Any
    ) -> dict[str, Any]:
        """Run the staged script again as a new job (new record, ``retry_of``), avoiding the failed nodes.

        Exactly once: the new job's name is derived from the failed one, so a retried sensor adopts
        the job an earlier try resubmitted. The nodes the job was told to avoid stay excluded.
        """
        hook = self.hook
        ti = context["ti"]
        new_id = mint_job_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, retry_of=handle["job_id"])
        layout = JobLayout(handle["results_base"], new_id)
        excluded = list(dict.fromkeys([*(handle.get("exclude_nodes") or ()), *self._failed_nodes(state)]))
        found = hook.find_jobs_by_name(new_id, all_hosts=True)
        if len(found) > 1:
            raise AmbiguousSubmissionError(
                f"{len(found)} SLURM jobs are named {new_id} ({', '.join(found)}); cancel the extra ones", found
            )
        record = _settled(
            record,
            TaoState.ERROR,
            message=f"{state.native}: {verdict.reason} [{verdict.evidence}]; resubmitted as {new_id}"
            + (f" excluding {','.join(excluded)}" if excluded else ""),
            err_class=ErrClass.ERR_INFRA,
        )
        self._write(handle, record)
        if found:
            slurm_id = found[0]
            self.log.info("Adopting SLURM job %s, resubmitted by an earlier try of this sensor", slurm_id)
        else:
            slurm_id = self._submit_retry(handle, record, new_id, layout, excluded)
        self.log.warning(
            "Infrastructure failure of SLURM job %s (%s); resubmitted as %s (SLURM %s)%s",
            state.job_id,
            verdict.evidence,
            new_id,
            slurm_id,
            f", excluding {','.join(excluded)}" if excluded else "",
        )
        new_handle = {
            **handle,
            "job_id": new_id,
            "slurm_job_id": slurm_id,
            "record_path": layout.record_path,
            "log_dir": f"{record.log_dir}/{new_id}-{slurm_id}",
            "submitted_at": _utc(),
            "retry_of": handle["job_id"],
            "exclude_nodes": excluded,
            "infra_retries": int(handle.get("infra_retries", 0)) + 1,
        }
        return {"resubmitted": True, "handle": new_handle}

    def _failed_nodes(self, state: Any) -> list[str]:
        """The nodes of the failed allocation (its hostlist expanded by ``sinfo``)."""
        if not state.node_list:
            return []
        listed = self.hook.run(commands.existing_nodes(state.node_list), what="checking failed nodes")
        return [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.rc == 0 else []

    def _submit_retry(
        self, handle: Mapping[str, Any], record: JobRecord, new_id: str, layout: JobLayout, excluded: list[str]
    ) -> str:
        """Open the retry's record and submit the staged script under the new name."""
        hook = self.hook
        retry = open_record(
            job_id=new_id,
            cluster=record.cluster,
            image=record.image,
            network_arch=record.network_arch,
            action=record.action,
            results_dir=record.results_dir,
            job_dir=record.job_dir,
            log_dir=record.log_dir,
            job_name=new_id,
            now=_utc(),
            retry_of=record.job_id,
        )
        hook.write_file(layout.record_path, to_json(retry).encode(), "644")
        script = handle.get("script_path") or JobLayout(handle["results_base"], handle["job_id"]).script_path
        extra = (f"--exclude={','.join(excluded)}",) if excluded else ()
        try:
            slurm_id = hook.submit(script, new_id, log_dir=record.log_dir, extra_args=extra)
        except SubmissionError as exc:
            retry = mark(retry, TaoState.ERROR, now=_utc(), message=f"sbatch refused it: {exc}", source="sensor")
            hook.write_file(layout.record_path, to_json(retry).encode(), "644")
            self._finish(handle, record)
            raise JobFailedError(
                f"SLURM job {handle['slurm_job_id']} hit an infrastructure failure and its resubmission {new_id} "
                f"was refused ({exc}); free or fix the excluded nodes ({','.join(excluded) or 'none'}) and clear "
                "the task",
                err_class=str(ErrClass.ERR_INFRA),
            ) from exc
        retry = mark(
            retry,
            TaoState.RUNNING,
            now=_utc(),
            message=f"resubmitted as SLURM job {slurm_id}",
            source="sensor",
            backend_ref=slurm_id,
        )
        hook.write_file(layout.record_path, to_json(retry).encode(), "644")
        return slurm_id

    # ------------------------------------------------------------------ helpers

    def _show_logs(self, handle: Mapping[str, Any]) -> str:
        """Put the end of main.out/main.err (bounded, redacted) into the task log; return it for classification."""
        log_dir = handle.get("log_dir")
        if not log_dir:
            return ""
        secrets = self._secret_values(handle)
        tails: list[str] = []
        for name in ("main.out", "main.err"):
            path = f"{log_dir}/{name}"
            chunk = self.hook.read_log(path, 0, 1)
            start = max(0, chunk.size - LOG_TAIL_BYTES)
            text = self.hook.read_log(path, start, LOG_TAIL_BYTES).data if chunk.size else ""
            text = redact_text(text, secrets)
            if text:
                self.log.info("---- %s (last %d bytes) ----\n%s", path, LOG_TAIL_BYTES, text)
            tails.append(text)
        return "\n".join(tails)

    def _secret_values(self, handle: Mapping[str, Any]) -> list[str]:
        """The job's secrets, resolved from the handle's references, so a job that prints one is redacted."""
        values: list[str] = []
        for name, source in (handle.get("secret_refs") or {}).items():
            try:
                values.append(resolve_secret(name, source))
            except Exception as exc:  # a reference unresolvable here still leaves pattern redaction
                self.log.warning("Cannot resolve secret_env[%s] for log redaction: %s", name, type(exc).__name__)
        return values

    def _exit_codes(self, handle: Mapping[str, Any], job_code: int | None) -> dict[str, Any] | None:
        """The job's exit code plus, for execution blocks, every child's (from the child exit-code file)."""
        codes: dict[str, Any] = {} if job_code is None else {"job": job_code}
        path = handle.get("child_exit_code_path")
        if path:
            text = self.hook.read_file(path)
            if text:
                codes["children"] = parse_child_exit_codes(text)
        return codes or None

    def _write(self, handle: Mapping[str, Any], record: JobRecord) -> None:
        self.hook.write_file(handle["record_path"], to_json(record).encode(), "644")

    def _finish(self, handle: Mapping[str, Any], record: JobRecord) -> None:
        """Write the terminal record and remove the secret sidecar (the job will not run again)."""
        self._write(handle, record)
        sidecar = handle.get("sidecar_path")
        if sidecar:
            self.hook.run(commands.remove_files([sidecar]), check=True, what="removing the secret sidecar")


def layout_status(handle: Mapping[str, Any], layout: JobLayout) -> str:
    """The status.json of the job's (record-owned) results dir."""
    return f"{handle['results_dir']}/status.json" if handle.get("results_dir") else layout.status_path


def _settled(record: JobRecord, state: TaoState, *, message: str, **kwargs: Any) -> JobRecord:
    """The record with its terminal ``state`` from the sensor; one already terminal stays as it is.

    A retried sensor settles a job a second time, maybe with other words: the first verdict stands.
    """
    if record.terminal_state is not None:
        return record
    return mark(record, state, now=_utc(), message=message, source="sensor", **kwargs)


def _record_dict(record: JobRecord) -> dict[str, Any]:
    return dict(json.loads(to_json(record)))


def _missing_record(handle: Mapping[str, Any]) -> NoReturn:
    raise JobNotFoundError(
        f"job record {handle['record_path']} is missing on the cluster; it is written by SbatchSubmitOperator "
        "before launch: check results_dir and that the submit task succeeded"
    )
