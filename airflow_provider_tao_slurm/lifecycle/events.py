"""The typed job handle (the submit task's XCom) and the typed trigger event.

Both are plain data with ``to_dict``/``from_dict``: the dict form is what crosses XCom and the
triggerer, and ``from_dict`` is the one place that checks it. The handle's keys are public (DAGs
read ``job_id``, ``slurm_job_id``, ``results_dir`` ... from the XCom): keep them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from airflow_provider_tao_slurm.core.defaults import DEFAULT_NOT_FOUND_GRACE_S as DEFAULT_NOT_FOUND_GRACE_S
from airflow_provider_tao_slurm.core.defaults import DEFAULT_UNRECOGNISED_GRACE_S as DEFAULT_UNRECOGNISED_GRACE_S
from airflow_provider_tao_slurm.core.records import check_job_id, check_slurm_job_id
from airflow_provider_tao_slurm.core.states import JobState, TaoState, state_from_native
from airflow_provider_tao_slurm.exceptions import ValidationError

#: Keys a handle must carry (the rest have defaults).
REQUIRED_HANDLE_KEYS = ("job_id", "slurm_job_id", "job_dir", "results_dir", "record_path", "results_base")


@dataclass(frozen=True, kw_only=True)
class JobHandle:
    """Where a submitted job lives and how to watch it; ``SbatchSubmitOperator`` returns ``to_dict()``.

    :param job_id: our job id, also the SLURM job name.
    :param slurm_job_id: the SLURM job id.
    :param job_dir: the job's staging directory.
    :param results_dir: the job's results directory.
    :param log_dir: the directory of this SLURM job's ``main.out``/``main.err``.
    :param record_path: the job record.
    :param cluster: the cluster name.
    :param results_base: the connection's results base directory.
    :param script_path: the staged batch script (resubmissions run it again).
    :param sidecar_path: the mode-600 secret sidecar, when the job has secrets.
    :param exit_code_path: the file the job writes its exit code to.
    :param submitted_at: ISO-8601 UTC submission time.
    :param exclude_nodes: nodes the job must avoid.
    :param child_exit_code_path: an execution block's child exit-code file.
    :param secret_refs: ``secret_env`` references (never values), to redact log tails.
    :param retry_of: the job id of the record this job retries.
    :param infra_retries: how many infrastructure resubmissions led to this job.
    :param num_nodes: nodes the job asked for (checked against the partition on resubmission).
    :param partition: the partition(s) the job asked for.
    :param max_continuations: how many more slices a training may run after a slice ends at its time
        limit (0: TIMEOUT is an error); see :mod:`~airflow_provider_tao_slurm.core.continuation`.
    :param slice_number: which slice of the chain this job is (1 for the first).
    :param checkpoint_globs: the checkpoint file name patterns a slice must write to be continued.
    :param time_hours: the slice's wall time in hours (for messages).
    :param checkpoint_interval: the spec's checkpoint interval (``"5 epoch"``), for messages; None when unset.
    :param slices: the chain's earlier slices, oldest first: ``job_id``, ``slurm_job_id``, ``state``,
        ``queue_seconds``, ``elapsed_seconds``, ``gpu_hours``, ``checkpoint``.
    """

    job_id: str
    slurm_job_id: str
    job_dir: str
    results_dir: str
    record_path: str
    results_base: str
    log_dir: str | None = None
    cluster: str | None = None
    script_path: str | None = None
    sidecar_path: str | None = None
    exit_code_path: str | None = None
    submitted_at: str | None = None
    exclude_nodes: tuple[str, ...] = ()
    child_exit_code_path: str | None = None
    secret_refs: Mapping[str, str] = field(default_factory=dict)
    retry_of: str | None = None
    infra_retries: int = 0
    num_nodes: int | None = None
    partition: str | None = None
    max_continuations: int = 0
    slice_number: int = 1
    checkpoint_globs: tuple[str, ...] = ()
    time_hours: float | None = None
    checkpoint_interval: str | None = None
    slices: tuple[Mapping[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-safe dict (the XCom value)."""
        data = asdict(self)
        data["exclude_nodes"] = list(self.exclude_nodes)
        data["secret_refs"] = dict(self.secret_refs)
        data["checkpoint_globs"] = list(self.checkpoint_globs)
        data["slices"] = [dict(item) for item in self.slices]
        return data

    @classmethod
    def from_dict(cls, value: object) -> JobHandle:
        """Check and read a handle dict; unknown keys are ignored (newer or older providers).

        :raises ValidationError: naming what is wrong and that the submit task's output is expected.
        """
        if isinstance(value, JobHandle):
            return value
        if not isinstance(value, Mapping):
            raise ValidationError(
                "job must be the dict returned by SbatchSubmitOperator (pass submit.output); got "
                f"{type(value).__name__}"
            )
        missing = [key for key in REQUIRED_HANDLE_KEYS if not value.get(key)]
        if missing:
            raise ValidationError(f"job handle lacks {', '.join(missing)}; pass SbatchSubmitOperator's output")
        if not str(value["slurm_job_id"]).isdigit():
            raise ValidationError(f"job handle has a bad slurm_job_id {value['slurm_job_id']!r}")
        check_job_id(str(value["job_id"]), "job handle's job_id")
        known = {f.name for f in fields(cls)}
        data = {key: item for key, item in value.items() if key in known}
        data["slurm_job_id"] = str(value["slurm_job_id"])
        try:
            data["exclude_nodes"] = tuple(str(node) for node in (value.get("exclude_nodes") or ()))
            data["secret_refs"] = {str(k): str(v) for k, v in dict(value.get("secret_refs") or {}).items()}
            data["infra_retries"] = int(value.get("infra_retries") or 0)
            data["max_continuations"] = int(value.get("max_continuations") or 0)
            data["slice_number"] = int(value.get("slice_number") or 1)
            data["checkpoint_globs"] = tuple(str(glob) for glob in (value.get("checkpoint_globs") or ()))
            data["slices"] = tuple(dict(item) for item in (value.get("slices") or ()))
            data["time_hours"] = None if value.get("time_hours") is None else float(value["time_hours"])
            interval = value.get("checkpoint_interval")
            data["checkpoint_interval"] = None if interval is None else str(interval)
        except (TypeError, ValueError) as exc:
            raise ValidationError(
                f"job handle has a malformed field ({exc}); pass SbatchSubmitOperator's output"
            ) from None
        return cls(**data)


class EventStatus(StrEnum):
    """Why a trigger fired."""

    #: The job reached a terminal state (``state`` says which).
    TERMINAL = "terminal"
    #: Neither squeue nor sacct knew the job for longer than the grace window.
    VANISHED = "vanished"
    #: The scheduler kept reporting a state this provider does not know.
    UNRECOGNISED = "unrecognised"


@dataclass(frozen=True)
class Observation:
    """A state change the trigger saw while waiting.

    :param ts: epoch seconds of the poll.
    :param state: the TAO state.
    :param native: SLURM's state.
    :param reason: SLURM's reason, if any.
    """

    ts: float
    state: TaoState
    native: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "state": str(self.state), "native": self.native, "reason": self.reason}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Observation:
        return cls(float(value["ts"]), TaoState(value["state"]), str(value.get("native") or ""), value.get("reason"))


def state_to_payload(state: JobState) -> dict[str, Any]:
    """Return a JSON-safe dict of a :class:`JobState` (enums as plain strings)."""
    return {
        "job_id": state.job_id,
        "native": state.native,
        "raw_state": state.raw_state,
        "tao_state": str(state.tao_state),
        "exit_code": state.exit_code,
        "signal": state.signal,
        "reason": state.reason,
        "node_list": state.node_list,
        "start": state.start,
        "end": state.end,
        "name": state.name,
        "source": state.source,
        "err_class": str(state.err_class) if state.err_class else None,
        "message": state.message,
    }


def state_from_payload(job_id: str, payload: Mapping[str, Any]) -> JobState:
    """Return the :class:`JobState` of :func:`state_to_payload`'s dict (re-derived from the raw fields)."""
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


@dataclass(frozen=True)
class JobEvent:
    """The one event a :class:`~airflow_provider_tao_slurm.triggers.slurm_job.SlurmJobTrigger` yields.

    Given an ``event_path``, the trigger writes :meth:`to_dict` to that file and yields only
    :meth:`compact` (the triggerer logs each event whole, on one line of the task log); otherwise, or
    when the write fails, it yields :meth:`to_dict` itself, as an older provider did.

    :param status: why it fired.
    :param slurm_job_id: the watched SLURM job.
    :param job_name: its exact SLURM name (empty for a job submitted outside the provider).
    :param state: the last state seen (the terminal one for TERMINAL; None when never seen).
    :param transitions: state changes seen while waiting, oldest first.
    :param message: what happened, in words (for VANISHED and UNRECOGNISED).
    :param log_offsets: per live stream (``main.out`` ...), the bytes already shown in the task log.
    """

    status: EventStatus
    slurm_job_id: str
    job_name: str
    state: JobState | None = None
    transitions: Sequence[Observation] = ()
    message: str = ""
    log_offsets: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the full JSON-safe dict: inline in the trigger event, or the file a :meth:`compact` event names."""
        return {
            "status": str(self.status),
            "slurm_job_id": self.slurm_job_id,
            "job_name": self.job_name,
            "state": state_to_payload(self.state) if self.state is not None else None,
            "transitions": [item.to_dict() for item in self.transitions],
            "message": self.message,
            "log_offsets": dict(self.log_offsets),
        }

    def compact(self, ref: str) -> dict[str, Any]:
        """Return the small event a trigger yields once :meth:`to_dict` is in the file named ``ref``.

        The triggerer logs every event whole on one line of the task log; this one says only how the
        wait ended (``status``, ``slurm_job_id``, the terminal ``native`` state when there is one) and
        where the rest is. :meth:`reference` tells it apart; :meth:`from_file` reads the file back.

        :param ref: the file's name (not its path: the task that deferred knows the directory).
        """
        native = {"native": self.state.native} if self.state is not None else {}
        return {"status": str(self.status), "slurm_job_id": self.slurm_job_id, **native, "ref": ref}

    @staticmethod
    def reference(value: object, *, what: str = "trigger event") -> str | None:
        """Return the file name a :meth:`compact` event refers to; None for a full event (:meth:`from_dict` reads it).

        :raises ValidationError: for a compact event whose ``ref``, ``status`` or ``slurm_job_id`` is malformed.
        """
        if not isinstance(value, Mapping) or "ref" not in value:
            return None
        ref = value["ref"]
        try:
            EventStatus(str(value.get("status")))
            check_slurm_job_id(str(value.get("slurm_job_id")))
        except ValueError as exc:
            raise ValidationError(
                f"unexpected {what} {value!r} ({exc}); check the triggerer's log and clear the task"
            ) from None
        if not isinstance(ref, str) or not ref or "/" in ref or ref in (".", ".."):
            raise ValidationError(
                f"{what} {value!r} refers to no file name; check the triggerer's log and clear the task"
            )
        return ref

    @classmethod
    def from_file(cls, text: str, compact: Mapping[str, Any], path: str, *, what: str = "trigger event") -> JobEvent:
        """Read the full event in ``path`` (its ``text``) that the :meth:`compact` event ``compact`` refers to.

        :raises ValidationError: for a file that is no event, or about another job or outcome than ``compact``.
        """
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValidationError(
                f"{what} file {path} is not JSON ({exc}); clear the task to watch the job again"
            ) from None
        event = cls.from_dict(value, what=f"{what} in {path}")
        if (event.slurm_job_id, str(event.status)) != (str(compact["slurm_job_id"]), compact["status"]):
            raise ValidationError(
                f"{what} file {path} is about job {event.slurm_job_id} ({event.status}), but the event names job "
                f"{compact['slurm_job_id']} ({compact['status']}); clear the task to watch the job again"
            )
        return event

    @classmethod
    def from_dict(cls, value: object, *, what: str = "trigger event") -> JobEvent:
        """Check and read an event dict (an older provider's ``"error"`` status reads as VANISHED).

        :raises ValidationError: for anything that is not such an event.
        """
        if not isinstance(value, Mapping) or "status" not in value:
            raise ValidationError(f"unexpected {what} {value!r}; check the triggerer's log and clear the task")
        raw_status = "vanished" if value["status"] == "error" else value["status"]
        try:
            status = EventStatus(raw_status)
            slurm_job_id = check_slurm_job_id(str(value.get("slurm_job_id")))
            job_name = check_job_id(str(value["job_name"]), "event's job_name") if value.get("job_name") else ""
            payload = value.get("state")
            state = state_from_payload(slurm_job_id, payload) if isinstance(payload, Mapping) and payload else None
            transitions = tuple(Observation.from_dict(item) for item in value.get("transitions") or ())
            log_offsets = {str(label): int(offset) for label, offset in dict(value.get("log_offsets") or {}).items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValidationError(
                f"unexpected {what} {value!r} ({exc}); check the triggerer's log and clear the task"
            ) from None
        if status is EventStatus.TERMINAL and (state is None or not state.is_terminal):
            raise ValidationError(f"{what} says terminal but carries no terminal state: {value!r}")
        return cls(status, slurm_job_id, job_name, state, transitions, str(value.get("message") or ""), log_offsets)
