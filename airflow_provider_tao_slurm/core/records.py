"""Job records: one JSON document per job, minted before launch and appended to until terminal.

Pure: this module builds, validates and serialises records; the hook writes the text. A record's
``job_id`` exists before ``sbatch`` runs and doubles as the SLURM job name, so a lost ``sbatch``
reply is reconciled by name instead of resubmitted. ``results_dir`` is bound when the record is
opened and never derived again. Transitions are append-only; every serialisation goes through
:func:`~airflow_provider_tao_slurm.core.secrets.redact_obj`, and every message through
:func:`~airflow_provider_tao_slurm.core.secrets.redact_text`.

The allowed transitions are data (:data:`TRANSITIONS`): any non-terminal state may follow any
non-terminal state (``RUNNING -> PENDING`` is a requeue, which keeps the SLURM job id), and
``PENDING -> COMPLETE`` is allowed for short jobs that only ``sacct`` ever saw. Nothing follows a
terminal state; running a job again means a new record with ``retry_of``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from airflow_provider_tao_slurm.core.layout import JOB_ID_RE
from airflow_provider_tao_slurm.core.secrets import redact_obj, redact_text
from airflow_provider_tao_slurm.core.states import ErrClass, TaoState
from airflow_provider_tao_slurm.exceptions import RecordError, ValidationError

_ANY_STATE = frozenset(TaoState)

#: state -> states that may follow it. Terminal states have no successors.
TRANSITIONS: Mapping[TaoState, frozenset[TaoState]] = MappingProxyType(
    {
        TaoState.PENDING: _ANY_STATE,
        TaoState.RUNNING: _ANY_STATE,
        TaoState.UNKNOWN: _ANY_STATE,
        TaoState.COMPLETE: frozenset(),
        TaoState.ERROR: frozenset(),
        TaoState.CANCELED: frozenset(),
    }
)
#: States a record only enters once SLURM has given it a job id (``backend_ref``).
NEEDS_BACKEND_REF = frozenset({TaoState.RUNNING, TaoState.COMPLETE})

_SLURM_JOB_ID_RE = re.compile(r"\d+(?:[_+]\d+)?")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_SLUG_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_.-]+")
_SLUG_MAX = 40
_DIGEST_LEN = 16
_OPEN_MESSAGE = "record opened; job not submitted yet"
_STATE_VALUES = frozenset(state.value for state in TaoState)
_ERR_CLASS_VALUES = frozenset(klass.value for klass in ErrClass)


@dataclass
class Transition:
    """One row of a record's history.

    :param ts: ISO-8601 UTC time of the observation.
    :param state: the TAO state observed.
    :param message: what was seen (redacted).
    :param source: who observed it (``"submit"``, ``"sensor"``, ``"trigger"``, ``"sacct"``, ...).
    """

    ts: str
    state: TaoState
    message: str
    source: str


@dataclass(kw_only=True)
class JobRecord:
    """A job's record; build it with :func:`open_record` and extend it with :func:`mark` only."""

    job_id: str
    platform: str = "slurm"
    cluster: str
    backend_ref: str | None = None
    job_name: str
    image: str
    network_arch: str
    action: str
    results_dir: str
    job_dir: str
    log_dir: str
    storage_tier: str = "A"
    submitted_at: str
    transitions: list[Transition] = field(default_factory=list)
    terminal_state: TaoState | None = None
    err_class: ErrClass | None = None
    retry_of: str | None = None
    exit_codes: dict[str, Any] = field(default_factory=dict)
    bundle_sha256: str | None = None
    config_sha256: str | None = None
    redacted: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> TaoState:
        """The latest state (the last transition's)."""
        return self.transitions[-1].state


def check_job_id(value: str, what: str = "job id") -> str:
    """Check a TAO job id / SLURM job name: letters, digits, ``_ . -``, at most 128, alphanumeric first.

    :param value: the id.
    :param what: the parameter name used in the error.
    :returns: ``value`` unchanged.
    :raises ValidationError: when ``value`` is not a safe job name.
    """
    if not isinstance(value, str) or not JOB_ID_RE.fullmatch(value):
        raise ValidationError(
            f"{what} {value!r} may only contain letters, digits, '_', '.', '-' (at most 128, starting with a "
            "letter or digit); use an id from mint_job_id()"
        )
    return value


def check_slurm_job_id(value: str) -> str:
    """Check a SLURM job id: digits, optionally ``<id>_<task>`` (array) or ``<id>+<n>`` (heterogeneous).

    :param value: the id as text.
    :returns: ``value`` unchanged.
    :raises ValidationError: for anything else (including ``<id>;<cluster>``).
    """
    if not isinstance(value, str) or not _SLURM_JOB_ID_RE.fullmatch(value):
        raise ValidationError(
            f"SLURM job id {value!r} must be digits, optionally followed by _<task> or +<n>; pass the id sbatch printed"
        )
    return value


def mint_job_id(
    dag_id: str,
    task_id: str,
    run_id: str,
    map_index: int = -1,
    try_number: int | None = None,
    retry_of: str | None = None,
) -> str:
    """Mint the job id (also the SLURM job name) before anything is launched.

    The id is ``tao-<slug>-<digest>``: the slug is the DAG and task id made name-safe (readable,
    at most 40 characters), the digest the first 16 hex digits of the SHA-256 of all inputs. Equal
    inputs give the same id, so a re-run of the same task adopts its job instead of submitting
    again; a ``retry_of`` gives a new id, and a chain of retries a new id at every link.

    :param dag_id: Airflow DAG id.
    :param task_id: Airflow task id.
    :param run_id: Airflow DAG run id.
    :param map_index: mapped task index (``-1`` when not mapped).
    :param try_number: include it to get a new job per Airflow try; leave ``None`` to keep one job
        across tries (a worker crash then adopts the running job).
    :param retry_of: job id of the record this job retries.
    :returns: at most 61 characters of ``[A-Za-z0-9_.-]``, starting with ``tao-``.
    :raises ValidationError: when an id is empty or ``retry_of`` is not a job id.
    """
    for name, value in (("dag_id", dag_id), ("task_id", task_id), ("run_id", run_id)):
        if not isinstance(value, str) or not value:
            raise ValidationError(f"{name} must be a non-empty string; pass the Airflow task instance's {name}")
    if retry_of is not None:
        check_job_id(retry_of, "retry_of")
    payload = json.dumps([dag_id, task_id, run_id, map_index, try_number, retry_of])
    digest = hashlib.sha256(payload.encode()).hexdigest()[:_DIGEST_LEN]
    slug = _SLUG_UNSAFE_RE.sub("-", f"{dag_id}.{task_id}").strip("-.")[:_SLUG_MAX].strip("-.") or "job"
    return f"tao-{slug}-{digest}"


def _check_ts(now: str) -> str:
    try:
        parsed = datetime.fromisoformat(now)
    except (TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.utcoffset() != timedelta(0):
        raise RecordError(f"time {now!r} is not an ISO-8601 UTC timestamp; pass datetime.now(timezone.utc).isoformat()")
    return now


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{what} must be a non-empty string")
    return value


def _check_abs(path: object, what: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise RecordError(f"{what} {path!r} must be an absolute cluster path")
    return path


def _check_sha256(value: object, what: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not _SHA256_RE.fullmatch(value)):
        raise RecordError(f"{what} must be 64 lowercase hex digits (hashlib.sha256(...).hexdigest())")
    return value


def _state(value: object) -> TaoState:
    if not isinstance(value, str) or value not in _STATE_VALUES:
        raise RecordError(f"state {value!r} is not one of {', '.join(TaoState)}")
    return TaoState(value)


def _err_class(value: object) -> ErrClass | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in _ERR_CLASS_VALUES:
        raise RecordError(f"err_class {value!r} is not one of {', '.join(ErrClass)}")
    return ErrClass(value)


def _check_ids(job_id: str, job_name: str, retry_of: str | None) -> str:
    """Check a new record's job id, SLURM job name and the id it retries (never its own).

    :returns: ``job_id`` unchanged.
    :raises ValidationError: when one of them is not a safe job name.
    :raises RecordError: when the record would retry itself.
    """
    check_job_id(job_id)
    check_job_id(job_name, "job_name")
    if retry_of is not None and check_job_id(retry_of, "retry_of") == job_id:
        raise RecordError(f"record {job_id} cannot retry itself; mint a new id with mint_job_id(retry_of=...)")
    return job_id


def open_record(
    *,
    job_id: str,
    cluster: str,
    image: str,
    network_arch: str,
    action: str,
    results_dir: str,
    job_dir: str,
    log_dir: str,
    job_name: str,
    now: str,
    retry_of: str | None = None,
    bundle_sha256: str | None = None,
    config_sha256: str | None = None,
    extra: Mapping[str, Any] | None = None,
    secrets: Iterable[str] = (),
) -> JobRecord:
    """Open a job's record before it is submitted; its first transition is PENDING from ``"submit"``.

    :param job_id: id from :func:`mint_job_id`.
    :param cluster: cluster name.
    :param image: the ``.sqsh`` path (or image reference) the job runs.
    :param network_arch: TAO network architecture (e.g. ``"classification_pyt"``).
    :param action: TAO action (e.g. ``"train"``).
    :param results_dir: the job's results directory, bound now and never re-derived.
    :param job_dir: the job's staging directory.
    :param log_dir: the directory of the job's SLURM logs.
    :param job_name: the SLURM job name (normally ``job_id``).
    :param now: ISO-8601 UTC time; also ``submitted_at``.
    :param retry_of: job id of the record this one retries.
    :param bundle_sha256: SHA-256 of the staged bundle, when known.
    :param config_sha256: SHA-256 of the staged spec, when known.
    :param extra: more JSON-serialisable facts (redacted like everything else).
    :param secrets: secret values to mask wherever they appear.
    :returns: the new, redacted record.
    :raises ValidationError: when ``job_id``, ``job_name`` or ``retry_of`` is not a safe job name.
    :raises RecordError: when another field is missing or malformed.
    """
    record = JobRecord(
        job_id=_check_ids(job_id, job_name, retry_of),
        cluster=_check_text(cluster, "cluster"),
        job_name=job_name,
        image=_check_text(image, "image"),
        network_arch=_check_text(network_arch, "network_arch"),
        action=_check_text(action, "action"),
        results_dir=_check_abs(results_dir, "results_dir"),
        job_dir=_check_abs(job_dir, "job_dir"),
        log_dir=_check_abs(log_dir, "log_dir"),
        submitted_at=_check_ts(now),
        transitions=[Transition(now, TaoState.PENDING, _OPEN_MESSAGE, "submit")],
        retry_of=retry_of,
        bundle_sha256=_check_sha256(bundle_sha256, "bundle_sha256"),
        config_sha256=_check_sha256(config_sha256, "config_sha256"),
        extra=dict(extra or {}),
    )
    return _from_dict(redact_obj(_to_dict(record), secrets))


def mark(
    record: JobRecord,
    state: TaoState | str,
    *,
    now: str,
    message: str,
    source: str,
    backend_ref: str | None = None,
    err_class: ErrClass | str | None = None,
    exit_codes: Mapping[str, Any] | None = None,
    secrets: Iterable[str] = (),
) -> JobRecord:
    """Return ``record`` with one more transition; ``record`` itself is not changed.

    Marking the latest state again with the same (redacted) message adds no row: observers that
    repeat themselves (sensor and trigger, a resumed poll) are idempotent, also after a terminal
    state as long as nothing else changes. ``terminal_state`` is set on COMPLETE, ERROR, CANCELED.

    :param record: the record to extend.
    :param state: the TAO state observed.
    :param now: ISO-8601 UTC time of the observation.
    :param message: what was seen; redacted with ``secrets`` before it is stored.
    :param source: who saw it (``"submit"``, ``"sensor"``, ``"trigger"``, ``"sacct"``, ...).
    :param backend_ref: the SLURM job id, once known; it can be bound once and never changed.
    :param err_class: why an ERROR happened; only allowed with ERROR.
    :param exit_codes: exit codes to merge into ``record.exit_codes``.
    :param secrets: secret values to mask in ``message``.
    :returns: the extended record.
    :raises RecordError: for a transition :data:`TRANSITIONS` forbids, a change after a terminal
        state, a second different ``backend_ref``, RUNNING/COMPLETE without a ``backend_ref``, or
        ``err_class`` with a state other than ERROR.
    :raises ValidationError: when ``backend_ref`` is not a SLURM job id.
    """
    new_state = _state(state)
    ts = _check_ts(now)
    who = _check_text(source, "source")
    text = redact_text(_check_text(message, "message"), secrets)
    klass = _err_class(err_class)
    ref = _bound_ref(record, backend_ref)
    if new_state in NEEDS_BACKEND_REF and ref is None:
        raise RecordError(f"record {record.job_id} cannot be {new_state} before sbatch gave it a SLURM job id")
    if klass is not None and new_state is not TaoState.ERROR:
        raise RecordError(f"err_class {klass} only goes with ERROR, not {new_state}")
    last = record.transitions[-1]
    repeat = last.state is new_state and last.message == text
    updated = replace(
        record,
        backend_ref=ref,
        transitions=record.transitions if repeat else [*record.transitions, Transition(ts, new_state, text, who)],
        terminal_state=new_state if not TRANSITIONS[new_state] else None,
        err_class=klass or record.err_class,
        exit_codes={**record.exit_codes, **(exit_codes or {})},
    )
    _check_follows(record, updated, repeat=repeat)
    return updated


def _bound_ref(record: JobRecord, backend_ref: str | None) -> str | None:
    """Return the SLURM job id ``record`` is bound to once ``backend_ref`` is given (bound once, never changed).

    :raises ValidationError: when ``backend_ref`` is not a SLURM job id.
    :raises RecordError: when the record is already bound to another SLURM job.
    """
    ref = record.backend_ref
    if backend_ref is None:
        return ref
    check_slurm_job_id(backend_ref)
    if ref is not None and ref != backend_ref:
        raise RecordError(
            f"record {record.job_id} is bound to SLURM job {ref}, not {backend_ref}; a resubmission "
            "needs a new record (mint_job_id(retry_of=...))"
        )
    return backend_ref


def _check_follows(record: JobRecord, updated: JobRecord, *, repeat: bool) -> None:
    """Check that ``updated`` may follow ``record``: nothing after a terminal state, a new row as :data:`TRANSITIONS`.

    :param repeat: the update repeats the latest transition (no new row).
    :raises RecordError: naming the rule broken and the fix.
    """
    if record.terminal_state is not None and updated != record:
        raise RecordError(
            f"record {record.job_id} is already {record.terminal_state}; nothing may follow a terminal state. "
            "To run the job again, open a new record with retry_of"
        )
    last, new_state = record.transitions[-1].state, updated.transitions[-1].state
    if not repeat and new_state not in TRANSITIONS[last]:
        raise RecordError(f"record {record.job_id} cannot go from {last} to {new_state}")


def _to_dict(record: JobRecord) -> dict[str, Any]:
    return asdict(record)


_FIELDS = tuple(f.name for f in fields(JobRecord))
_TRANSITION_FIELDS = tuple(f.name for f in fields(Transition))
_STR_FIELDS = (
    "job_id",
    "platform",
    "cluster",
    "job_name",
    "image",
    "network_arch",
    "action",
    "results_dir",
    "job_dir",
    "log_dir",
    "storage_tier",
    "submitted_at",
)
_OPTIONAL_STR_FIELDS = ("backend_ref", "retry_of", "bundle_sha256", "config_sha256")


def _check_keys(data: object, expected: Sequence[str], what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise RecordError(f"{what} must be a JSON object, not {type(data).__name__}")
    missing = sorted(set(expected) - data.keys())
    unknown = sorted(data.keys() - set(expected))
    if missing or unknown:
        raise RecordError(f"{what} has missing fields {missing} and unknown fields {unknown}")
    return data


def _from_dict(data: object) -> JobRecord:
    values = _check_keys(data, _FIELDS, "job record")
    for name in _STR_FIELDS:
        _check_text(values[name], name)
    for name in _OPTIONAL_STR_FIELDS:
        if values[name] is not None:
            _check_text(values[name], name)
    for name in ("exit_codes", "extra"):
        if not isinstance(values[name], dict):
            raise RecordError(f"{name} must be a JSON object")
    if values["redacted"] is not True:
        raise RecordError("job record is not marked redacted; write records only with to_json()")
    rows = values["transitions"]
    if not isinstance(rows, list) or not rows:
        raise RecordError("job record has no transitions; it must start with the PENDING row of open_record()")
    transitions = []
    for row in rows:
        item = _check_keys(row, _TRANSITION_FIELDS, "transition")
        transitions.append(
            Transition(
                ts=_check_ts(item["ts"]),
                state=_state(item["state"]),
                message=_check_text(item["message"], "message"),
                source=_check_text(item["source"], "source"),
            )
        )
    terminal = None if values["terminal_state"] is None else _state(values["terminal_state"])
    if terminal != (transitions[-1].state if not TRANSITIONS[transitions[-1].state] else None):
        raise RecordError(f"terminal_state {terminal} does not match the last transition {transitions[-1].state}")
    return JobRecord(
        **{
            **values,
            "transitions": transitions,
            "terminal_state": terminal,
            "err_class": _err_class(values["err_class"]),
        }
    )


def to_json(record: JobRecord, secrets: Iterable[str] = ()) -> str:
    """Serialise ``record`` for storage: redacted, keys sorted, indented, newline-terminated.

    :param record: the record.
    :param secrets: secret values to mask wherever they appear.
    :returns: the JSON text the hook writes to :func:`record_path`.
    :raises RecordError: when ``exit_codes`` or ``extra`` hold values JSON cannot represent.
    """
    try:
        text = json.dumps(redact_obj(_to_dict(record), secrets), indent=2, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise RecordError(
            f"record {record.job_id} cannot be written as JSON ({exc}); keep extra and exit_codes to JSON types"
        ) from None
    return text + "\n"


def from_json(text: str) -> JobRecord:
    """Parse and validate a record written by :func:`to_json`.

    :param text: the JSON text.
    :returns: the record.
    :raises RecordError: when the text is not JSON or not a valid record (the message says which field).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"job record is not valid JSON ({exc.msg} at line {exc.lineno}); the file was cut short or edited"
        ) from None
    return _from_dict(data)
