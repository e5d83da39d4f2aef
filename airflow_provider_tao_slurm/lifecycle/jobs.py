"""``JobLifecycle``: a job's life on the cluster, between the hook and the operators.

It owns what keeps the provider's promise that every logical submission becomes exactly one
SLURM job of OUR user and that the job's record tells the truth:

- the record store (read, mark, write; every write redacted);
- submit-once and adoption: any try finds the job of the try before it (not only the first
  try's) before submitting, and only ever our own jobs (the hook filters lookups by user); every
  job adopted, on every path, is released, given its log directory and recorded by
  :func:`~airflow_provider_tao_slurm.lifecycle.submission.adopt_job`;
- infrastructure resubmission: new record with ``retry_of``, the failed nodes excluded as
  precisely as the evidence allows, never more than the partition can spare;
- settling: cancel (recorded with its source), vanished and unrecognised jobs (recorded UNKNOWN,
  unless the job's own end marker and exit-code file show how it ended), sidecar removal, and
  bounded, redacted log tails.

Operators and the sensor are thin callers of this class; triggers use its async twins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.continuation import (
    SLICE_ENV,
    SliceEnd,
    Verdict,
    continuation_verdict,
    new_checkpoints,
    parse_new_checkpoints,
    slice_job_id,
)
from airflow_provider_tao_slurm.core.layout import JobLayout, ends_dir, slices_dir
from airflow_provider_tao_slurm.core.records import JobRecord, from_json, mark, mint_job_id, open_record, to_json
from airflow_provider_tao_slurm.core.resubmission import nodes_to_exclude, remaining_nodes
from airflow_provider_tao_slurm.core.secrets import KeyBlock, key_block_at, redact_chunk, sidecar_text
from airflow_provider_tao_slurm.core.states import ErrClass, JobState, TaoState, state_from_end_evidence
from airflow_provider_tao_slurm.core.usage import JobUsage, parse_usage, usage_command
from airflow_provider_tao_slurm.exceptions import (
    HostKeyError,
    JobFailedError,
    JobLookupError,
    JobNotFoundError,
    RecordError,
    RemoteCommandError,
    RemoteReadError,
    SlurmAuthenticationError,
    SlurmConnectionError,
    SubmissionError,
    TaoSlurmError,
    job_failed,
)
from airflow_provider_tao_slurm.lifecycle.submission import adopt_job, bind_adopted, find_job, submit_job, write_record
from airflow_provider_tao_slurm.lifecycle.support import resolve_secret, utc_now
from airflow_provider_tao_slurm.lifecycle.watch import Step, Watch, WatchRules, observe

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.failures import Classification
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
    from airflow_provider_tao_slurm.lifecycle.events import JobHandle

#: Bytes of each log read for a tail (classification and the task log).
LOG_TAIL_BYTES = 16384
#: How long a TAO job's missing ``status.json`` is read again before it counts as missing: NFS and
#: Lustre clients cache attributes for seconds (``actimeo``), so a login host can miss a file a
#: node wrote just before the job ended.
STATUS_SETTLE_S = 10.0
#: Seconds between those reads.
STATUS_RETRY_S = 2.0
#: How long a slice's checkpoints are listed again before "no new checkpoint" ends the chain: the login host's
#: directory cache may not show yet what a compute node wrote (NFS keeps a directory's attributes for
#: ``acdirmin``, 30 s by default; a Lustre client's statahead and dentry caches lag less).
CHECKPOINT_SETTLE_S = 30.0
#: Seconds between those listings.
CHECKPOINT_RETRY_S = 5.0
#: How long the lookup by name of a chain's next job (the next slice, an infrastructure resubmission) is asked
#: again while it fails (slurmdbd or slurmctld down for minutes) before the settle gives up with the error: a
#: failed lookup is never "no job", and the slice has already ended, so there is nothing else to wait for.
NEXT_JOB_LOOKUP_S = 300.0
#: Seconds between those lookups.
NEXT_JOB_LOOKUP_RETRY_S = 15.0
#: How long a cancel from a worker is tried again while the login host cannot be reached (or cannot take the cancel
#: over): the task's on_kill must end inside Airflow's ``killed_task_cleanup_time`` (60 s by default), and one
#: command that cannot reach its host takes up to about 20 s to fail.
CANCEL_RETRY_S = 35.0
#: The same in the triggerer, which ends a trigger's on_kill after ``[triggerer] on_kill_timeout`` (30 s by default):
#: a first failure inside it leaves time for one more try.
A_CANCEL_RETRY_S = 20.0
#: Seconds between those tries.
CANCEL_RETRY_INTERVAL_S = 3.0
#: How long the login host tries a cancel again once it is handed over (its scancel failed: slurmctld restarting,
#: or out of its reach). An outage lasts minutes, while Airflow gives on_kill seconds; the job's GPUs are the cost.
CANCEL_HANDOFF_S = 3600.0
#: Seconds between the login host's tries.
CANCEL_HANDOFF_INTERVAL_S = 5.0

_T = TypeVar("_T")


@dataclass(frozen=True)
class Attempt:
    """What one try of a submit task does.

    :param job_id: the job id (and SLURM name) this try submits under or adopts.
    :param layout: that job's paths.
    :param retry_of: the record this job retries (the immediately previous one), or None.
    :param previous: the existing, non-terminal record of ``job_id`` (an adopted job keeps it).
    :param adopted: the SLURM job id of our live (or finished) job of that name, to adopt.
    """

    job_id: str
    layout: JobLayout
    retry_of: str | None = None
    previous: JobRecord | None = None
    adopted: str | None = None


@dataclass(frozen=True)
class _FollowUp:
    """How a job that ended ERROR is followed by the next one (a resubmission or the next slice).

    :param new_id: the next job's id (and SLURM name).
    :param found: our SLURM job of that name an earlier try started, to adopt; None to submit it.
    :param ended: the ended job's last message.
    :param err_class: the ended job's error class, if any.
    :param excluded: the nodes the next job avoids.
    :param adopted: why ``found`` is adopted, for the log and the record.
    :param refused: what the next job is to the ended one and the fix, for the error when sbatch refuses it.
    """

    new_id: str
    found: str | None
    ended: str
    err_class: ErrClass | None
    excluded: tuple[str, ...]
    adopted: str
    refused: tuple[str, str]


def _settled(record: JobRecord, state: TaoState, *, message: str, source: str, **kwargs: Any) -> JobRecord:
    """Return the record with a terminal ``state``; one already terminal stays as it is (the first verdict stands)."""
    if record.terminal_state is not None:
        return record
    return mark(record, state, now=utc_now(), message=message, source=source, **kwargs)


def _running(record: JobRecord, slurm_id: str, message: str, source: str, secrets: Sequence[str] = ()) -> JobRecord:
    """``record`` bound to SLURM job ``slurm_id`` and marked RUNNING (submitted)."""
    return mark(
        record, TaoState.RUNNING, now=utc_now(), message=message, source=source, backend_ref=slurm_id, secrets=secrets
    )


def record_dict(record: JobRecord) -> dict[str, Any]:
    """Return the record as the JSON-safe dict a task returns (already redacted)."""
    return dict(json.loads(to_json(record)))


class JobLifecycle:
    """One job's (or one task's jobs') life on the cluster over ``hook``.

    :param hook: the cluster's :class:`~airflow_provider_tao_slurm.hooks.slurm.SlurmHook`.
    :param log: where to log (the calling task's logger).
    :param clock: seconds of a monotonic clock (the settle windows' reads); ``time.monotonic`` by default.
    :param sleep: waits between those reads; ``time.sleep`` by default.
    """

    def __init__(
        self,
        hook: SlurmHook,
        log: logging.Logger | Any = None,
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.hook = hook
        self.log = log or logging.getLogger(__name__)
        self._clock = clock
        self._sleep = sleep

    # ------------------------------------------------------------------ record store

    def read_record(self, path: str) -> JobRecord | None:
        """Return the record at ``path``, or None when there is none.

        :raises RemoteReadError: when it could not be read (never taken for "no record").
        """
        text = self.hook.read_file(path)
        return from_json(text) if text is not None else None

    def require_record(self, handle: JobHandle) -> JobRecord:
        """Return the handle's record; :raises JobNotFoundError: when it is missing (with the fix)."""
        record = self.read_record(handle.record_path)
        if record is None:
            raise JobNotFoundError(
                f"job record {handle.record_path} is missing on the cluster; it is written by SbatchSubmitOperator "
                "before launch: check results_dir and that the submit task succeeded"
            )
        return record

    def write_record(self, path: str, record: JobRecord, secrets: Iterable[str] = ()) -> None:
        """Write ``record`` (redacted) to ``path``."""
        write_record(self.hook, path, record, list(secrets))

    # ------------------------------------------------------------------ submit once / adopt

    def plan_attempt(self, ti: Any, results_base: str) -> Attempt:
        """Decide what try ``ti.try_number`` of a submit task does, before anything is staged.

        The first try submits the job minted from the DAG, task, run and map index. A later try
        looks for the newest record of an earlier try (try N-1's, else N-2's, ... else the first's):
        when that record is not terminal, its job is adopted (:func:`~.submission.adopt_job`: released,
        given its log directory, the record bound to it) or, if no job of ours carries its name,
        submitted under that name (the earlier try died before sbatch); when it is terminal, this try
        submits a fresh job whose ``retry_of`` is that record. With no record at all, our job of the
        first name is adopted too (the record the caller opens is bound to it by :meth:`submit_once`).

        :raises JobLookupError: when the scheduler could not be asked (never read as "no job").
        :raises RemoteReadError: when an earlier try's record could not be read (never read as "no record").
        :raises AmbiguousSubmissionError: when several of our jobs carry the name to adopt.
        """

        def mint(try_number: int | None = None) -> str:
            return mint_job_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, try_number=try_number)

        first = mint()
        if ti.try_number <= 1:
            return Attempt(first, JobLayout(results_base, first))
        candidates = [mint(k) for k in range(ti.try_number - 1, 1, -1)] + [first]
        latest: JobRecord | None = None
        for job_id in candidates:
            path = JobLayout(results_base, job_id).record_path
            try:
                latest = self.read_record(path)
            except RemoteReadError as exc:
                raise RemoteReadError(
                    f"cannot read {path}, the record of an earlier try ({exc}); nothing was submitted, so that no "
                    "second job runs beside the one it may describe. The task's next try reads it again; if the "
                    "shared storage keeps failing, fix it first",
                    path,
                    rc=exc.rc,
                    stderr=exc.stderr,
                ) from exc
            if latest is not None:
                break
        if latest is None:
            layout = JobLayout(results_base, first)
            found, _ = self._adopt_by_name(first, layout, None)
            return Attempt(first, layout, adopted=found)
        if latest.terminal_state is None:
            layout = JobLayout(results_base, latest.job_id)
            found, previous = self._adopt_by_name(latest.job_id, layout, latest)
            return Attempt(latest.job_id, layout, retry_of=latest.retry_of, previous=previous, adopted=found)
        fresh = mint(ti.try_number)
        self.log.info(
            "Job %s already ended %s: this try submits a fresh job %s", latest.job_id, latest.terminal_state, fresh
        )
        return Attempt(fresh, JobLayout(results_base, fresh), retry_of=latest.job_id)

    def _adopt_by_name(
        self, job_name: str, layout: JobLayout, record: JobRecord | None
    ) -> tuple[str | None, JobRecord | None]:
        """Adopt our job named ``job_name`` (live or finished) with its ``record`` (:func:`adopt_job`).

        :returns: the adopted SLURM job id (None when no job of ours has the name) and the record, bound
            to that job when there is one.
        :raises AmbiguousSubmissionError: when several of our jobs carry that name.
        :raises JobLookupError: when the lookup failed.
        """
        found = find_job(self.hook, job_name)
        if found is None:
            return None, record
        bound = adopt_job(
            self.hook,
            job_name,
            found,
            log_dir=layout.log_dir,
            log=self.log,
            why="submitted by an earlier try",
            record=(layout.record_path, record) if record is not None else None,
        )
        return found, bound

    def submit_once(
        self,
        attempt: Attempt,
        *,
        results_base: str,
        files: Mapping[str, tuple[bytes | None, int]],
        record: JobRecord,
        secrets: Sequence[str] = (),
    ) -> tuple[str, JobRecord]:
        """Stage ``files`` and submit ``attempt``'s script, unless it adopts a job; mark the record RUNNING.

        An adopted job (released by :meth:`plan_attempt`) stages and submits nothing: ``record`` is bound
        to it (:func:`~.submission.bind_adopted`) and written unless it already was.

        :returns: the SLURM job id and the written record.
        """
        slurm_id = attempt.adopted
        if slurm_id is not None:
            bound = bind_adopted(record, slurm_id, "submit", secrets)
            if bound is not record:
                self.write_record(attempt.layout.record_path, bound, secrets)
            return slurm_id, bound
        slurm_id = submit_job(
            self.hook,
            attempt.layout.script_path,
            attempt.job_id,
            log_dir=attempt.layout.log_dir,
            log=self.log,
            stage=(results_base, files),  # one round trip: unpack the files, then sbatch
        )
        record = _running(record, slurm_id, f"submitted as SLURM job {slurm_id}", "submit", secrets)
        self.write_record(attempt.layout.record_path, record, secrets)
        return slurm_id, record

    # ------------------------------------------------------------------ infrastructure resubmission

    def resubmit(
        self,
        ti: Any,
        handle: JobHandle,
        record: JobRecord,
        state: JobState,
        verdict: Classification,
        usage: JobUsage | None = None,
    ) -> JobHandle:
        """Run the staged script again as a new job (new record, ``retry_of``), avoiding the failed nodes.

        Exactly once: the new job's name is derived from the failed one, so a retried sensor adopts
        the job an earlier try resubmitted. The nodes the job was told to avoid stay excluded; this
        failure adds the nodes its evidence names (the whole allocation when it names none), as long
        as the partition keeps enough nodes for the job.

        In a chain of slices (``max_continuations``) the resubmission is the next slice: it counts as a
        continuation, is named as one (:meth:`_next_job`) and resumes from the checkpoints as any slice does.

        :param usage: the failed job's accounting, kept in the chain's slices.
        :raises JobFailedError: when excluding the failed nodes leaves the partition too small, or
            sbatch refused the resubmission (both records are settled, the sidecar removed).
        """
        new_id, found = self._next_job(ti, handle)
        # The same evidence gives the same exclusions as when an earlier try resubmitted it (found).
        excluded = self._exclusions(handle, record, state, verdict, check_fit=found is None)
        but = f" excluding {','.join(excluded)}" if excluded else ""
        hint = f"free or fix the excluded nodes ({','.join(excluded) or 'none'}) and clear the task"
        follow_up = _FollowUp(
            new_id,
            found,
            ended=f"{state.native}: {verdict.reason} [{verdict.evidence}]; resubmitted as {new_id}{but}",
            err_class=ErrClass.ERR_INFRA,
            excluded=tuple(excluded),
            adopted="resubmitted by an earlier try of this sensor",
            refused=("its resubmission", hint),
        )
        followed = self._follow(
            handle,
            record,
            follow_up,
            exclude_nodes=tuple(excluded),
            infra_retries=handle.infra_retries + 1,
            **_next_slice(handle, state, usage, None),
        )
        self.log.warning(
            "Infrastructure failure of SLURM job %s (%s); resubmitted as %s (SLURM %s)%s",
            state.job_id,
            verdict.evidence,
            new_id,
            followed.slurm_job_id,
            f", excluding {','.join(excluded)}" if excluded else "",
        )
        return followed

    def continue_slice(
        self, ti: Any, handle: JobHandle, record: JobRecord, state: JobState, usage: JobUsage | None
    ) -> JobHandle:
        """Follow a slice that ended at its time limit with the next slice, or stop the chain with the reason.

        The next slice runs the same staged script (same results directory, spec, secrets and
        resources) under the training's name with the slice number (:meth:`_next_job`), so a retried
        sensor adopts a slice an earlier try started and never starts a second one. It is only submitted once this slice
        wrote a new checkpoint (files under ``results_dir`` matching ``checkpoint_globs``, newer
        than the slice's start) and ``max_continuations`` is not used up.

        :param state: how the slice ended (TIMEOUT, or PREEMPTED that SLURM did not requeue).
        :param usage: the slice's accounting, kept in the chain's slices.
        :returns: the handle of the next slice.
        :raises JobFailedError: naming the stop rule and its fix (the record settled ERROR).
        :raises RemoteCommandError: when the checkpoints could not be listed (nothing is decided).
        """
        new_id, found = self._next_job(ti, handle)
        # A next slice an earlier try started was decided then: no need to wait for a lagging listing.
        verdict, end, earlier = self._slice_verdict(handle, state, usage, settle=found is None)
        if not verdict.go_on and found is None:  # a next slice an earlier try started was decided then
            self.settle(handle, record, TaoState.ERROR, message=verdict.reason, err_class=ErrClass.ERR_PROGRAM)
            raise job_failed(f"SLURM job {state.job_id}: {verdict.reason}", str(ErrClass.ERR_PROGRAM))
        continued = verdict.reason if verdict.go_on else f"slice {handle.slice_number} ended {state.native}"
        continued += " (warned of the limit before)" if end.warned else ""
        checkpoint = end.checkpoints[-1] if end.checkpoints else None
        follow_up = _FollowUp(
            new_id,
            found,
            ended=f"{continued}; continued as {new_id}",
            err_class=None,
            excluded=handle.exclude_nodes,
            adopted="the next slice an earlier try of this sensor started",
            refused=("its next slice", "check the partition and the account, then clear the task"),
        )
        followed = self._follow(handle, record, follow_up, **_next_slice(handle, state, usage, checkpoint))
        self.log.info(
            "Slice %d of at most %d started (SLURM job %s), resuming from %s",
            handle.slice_number + 1,
            handle.max_continuations + 1,
            followed.slurm_job_id,
            checkpoint if checkpoint is not None else earlier,
        )
        return followed

    def _follow(self, handle: JobHandle, record: JobRecord, follow_up: _FollowUp, **changes: Any) -> JobHandle:
        """Settle the job that ended ERROR and start the job that follows it, or adopt it when an earlier try did.

        The one skeleton of a resubmission and of a next slice: the secret sidecar is resolved again before
        any record says the job was followed, the ended job's record is settled, then the next job's record
        is opened and its script submitted (or our job of its name adopted).

        :param changes: the next job's handle fields that differ from ``handle``'s, besides its ids.
        :returns: the handle of the next job.
        :raises JobFailedError: when sbatch refused the next job (both records settled, the sidecar removed).
        """
        new_id, found = follow_up.new_id, follow_up.found
        stage = None if found is not None else self._sidecar_stage(handle)  # before any record says "followed"
        record = _settled(
            record, TaoState.ERROR, message=follow_up.ended, source="sensor", err_class=follow_up.err_class
        )
        self.write_record(handle.record_path, record)
        layout = JobLayout(handle.results_base, new_id)
        if found is not None:
            slurm_id = self._adopt_next(record, new_id, layout, found, follow_up.adopted)
        else:
            slurm_id = self._submit_retry(handle, record, new_id, layout, follow_up.excluded, stage, follow_up.refused)
        return _followed_by(handle, record, new_id, slurm_id, **changes)

    def _slice_verdict(
        self, handle: JobHandle, state: JobState, usage: JobUsage | None, *, settle: bool
    ) -> tuple[Verdict, SliceEnd, str | None]:
        """Decide whether the chain goes on after the slice ``handle``, from what the slice left.

        :param settle: list the checkpoints again while shared storage may lag (:meth:`_slice_end`).
        :returns: the verdict, what the slice left, and the chain's last checkpoint before this slice.
        :raises RemoteCommandError: when the checkpoints could not be listed (nothing is decided).
        """
        end, listings, span = self._slice_end(handle, settle=settle)
        earlier = next((item.get("checkpoint") for item in reversed(handle.slices) if item.get("checkpoint")), None)
        verdict = continuation_verdict(
            native=state.native,
            slice_number=handle.slice_number,
            max_continuations=handle.max_continuations,
            time_hours=handle.time_hours or 0.0,
            checkpoints=end.checkpoints,
            last_checkpoint=earlier,
            elapsed_seconds=usage.elapsed_seconds if usage else None,
            checkpoint_interval=handle.checkpoint_interval,
            listings=listings,
            listed_over_seconds=span,
        )
        return verdict, end, earlier

    def _slice_end(self, handle: JobHandle, *, settle: bool = True) -> tuple[SliceEnd, int, float]:
        """Return what the slice left: its markers and the checkpoints it wrote (newer than its start marker).

        A listing without a new checkpoint is listed again for :data:`CHECKPOINT_SETTLE_S` (``settle``) before
        it counts: the login host's directory cache may lag what the compute node wrote.

        :returns: the last listing, how many listings were made and the seconds they spanned.
        :raises RemoteCommandError: naming the command, when a listing failed (never read as "no checkpoint").
        """
        slices = slices_dir(handle.job_dir)
        command = new_checkpoints(handle.results_dir, slices, handle.slurm_job_id, handle.checkpoint_globs)
        what = (
            f"listing slice {handle.slice_number}'s checkpoints (find {handle.results_dir} -type f -name "
            f"{' -o -name '.join(handle.checkpoint_globs)} -newer {slices}/{handle.slurm_job_id}-<restart>.start)"
        )

        def listing() -> SliceEnd:
            return parse_new_checkpoints(self.hook.run(command, check=True, what=what).stdout)

        end, listings, span = self._read_settled(
            listing,
            lambda listed: bool(listed.checkpoints),
            window=CHECKPOINT_SETTLE_S if settle else 0.0,
            interval=CHECKPOINT_RETRY_S,
            note=f"No new checkpoint of slice {handle.slice_number} under {handle.results_dir} yet: listing again "
            "(shared storage may lag)",
        )
        if not end.started:
            self.log.warning("Slice %s never started its batch script: it wrote no checkpoint", handle.slurm_job_id)
        elif end.warned:
            self.log.info("Slice %s was warned of its time limit before it ended", handle.slurm_job_id)
        return end, listings, span

    def _read_settled(
        self, read: Callable[[], _T], enough: Callable[[_T], bool], *, window: float, interval: float, note: str
    ) -> tuple[_T, int, float]:
        """Read until ``enough`` says so or ``window`` seconds passed (shared storage lags); a failed read raises.

        :returns: the last read, how many reads were made and the seconds from the first to the last.
        """
        clock = self._clock or time.monotonic
        start = clock()
        reads = 0
        while True:
            value = read()
            reads += 1
            now = clock()
            if enough(value) or now - start >= window:
                return value, reads, now - start
            self.log.info("%s", note)
            (self._sleep or time.sleep)(interval)

    def _next_job(self, ti: Any, handle: JobHandle) -> tuple[str, str | None]:
        """Return the id of the job that follows ``handle`` (derived from it) and our SLURM job of that name, if any.

        In a chain of slices (the next slice, or an infrastructure resubmission, which counts as one) the job
        is named after the training: :func:`~airflow_provider_tao_slurm.core.continuation.slice_job_id`
        (``<first job's id>-s<N>``). Outside a chain it is minted from the watching task and ``handle``'s id.
        A chain whose next job the previous release started was named that way too: when no job of the
        slice's name exists, our job of that old name is looked for and adopted (until the next release).

        :raises AmbiguousSubmissionError: when several jobs carry the name.
        :raises JobLookupError: when a lookup failed (never read as "no job").
        """
        minted = mint_job_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, retry_of=handle.job_id)
        if not handle.max_continuations:
            return minted, self._find_through_outage(minted)
        first = str(handle.slices[0]["job_id"]) if handle.slices else handle.job_id
        new_id = slice_job_id(first, handle.slice_number + 1)
        found = self._find_through_outage(new_id)
        if found is None:  # the previous release's name (deprecated): its running chains are still adopted
            legacy = self._find_through_outage(minted)
            if legacy is not None:
                return minted, legacy
        return new_id, found

    def _find_through_outage(self, name: str) -> str | None:
        """:func:`find_job`, asked again while it fails (an outage of the scheduler or its accounting).

        Every :data:`NEXT_JOB_LOOKUP_RETRY_S`, for up to :data:`NEXT_JOB_LOOKUP_S`.

        :raises AmbiguousSubmissionError: when several jobs carry the name.
        :raises JobLookupError: the last failure, when the lookup still fails at the end of the window.
        """

        def lookup() -> tuple[str | None, JobLookupError | None]:
            try:
                return find_job(self.hook, name), None
            except JobLookupError as failed:
                return None, failed

        (found, failed), lookups, waited = self._read_settled(
            lookup,
            lambda answer: answer[1] is None,
            window=NEXT_JOB_LOOKUP_S,
            interval=NEXT_JOB_LOOKUP_RETRY_S,
            note=f"Looking up SLURM jobs named {name} failed (is slurmctld or slurmdbd down?); asking again in "
            f"{NEXT_JOB_LOOKUP_RETRY_S:g} s, for up to {NEXT_JOB_LOOKUP_S:g} s, before deciding the next job",
        )
        if failed is not None:
            raise failed
        if lookups > 1:
            self.log.info("Looked up SLURM jobs named %s: answered after %d lookups over %.0f s", name, lookups, waited)
        return found

    def _adopt_next(self, record: JobRecord, new_id: str, layout: JobLayout, found: str, why: str) -> str:
        """Adopt ``found``, the job ``new_id`` an earlier try started after ``record``'s (:func:`adopt_job`).

        That try may have died inside the submission (held, no log directory, its record not yet bound):
        the job is released, its log directory created and its record bound to it (opened now if that
        try left none).

        :raises RemoteReadError: when the job's record could not be read (never read as "no record").
        """
        existing = self.read_record(layout.record_path) or _retry_record(record, new_id)
        adopt_job(
            self.hook,
            new_id,
            found,
            log_dir=record.log_dir,
            log=self.log,
            why=why,
            record=(layout.record_path, existing),
            source="sensor",
        )
        return found

    def _exclusions(
        self, handle: JobHandle, record: JobRecord, state: JobState, verdict: Classification, *, check_fit: bool
    ) -> list[str]:
        """Return the handle's excluded nodes plus this failure's; fail the job when the partition could not fit it.

        :param check_fit: check the partition (False when the resubmission already exists).
        """
        rows = commands.parse_node_states(
            self.hook.run(commands.node_states(), check=True, what="reading node states").stdout
        )
        allocation = self._expand(state.node_list)
        exclusion = nodes_to_exclude(state, verdict, allocation, rows)
        excluded = list(dict.fromkeys([*handle.exclude_nodes, *exclusion.nodes]))
        num_nodes, partitions = self._shape(handle, allocation)
        if partitions and check_fit:
            left = remaining_nodes(partitions, excluded, rows)
            if len(left) < num_nodes:
                message = (
                    f"{state.native}: {verdict.reason} [{verdict.evidence}]; not resubmitted: excluding "
                    f"{','.join(excluded)} ({exclusion.why}) leaves {len(left)} node(s) of partition "
                    f"{','.join(partitions)} for a {num_nodes}-node job"
                )
                self.finish(
                    handle,
                    _settled(record, TaoState.ERROR, message=message, source="sensor", err_class=ErrClass.ERR_INFRA),
                )
                raise JobFailedError(
                    f"SLURM job {state.job_id} hit an infrastructure failure ({verdict.evidence}) and was not "
                    f"resubmitted: avoiding {','.join(excluded)} ({exclusion.why}) would leave partition "
                    f"{','.join(partitions)} only {len(left)} node(s) ({', '.join(left) or 'none'}) for a "
                    f"{num_nodes}-node job, which could never start. Ask the admins to repair those nodes, or "
                    "clear the task to try again without the exclusions",
                    err_class=str(ErrClass.ERR_INFRA),
                )
        self.log.info("Excluding %s: %s", ",".join(exclusion.nodes) or "no node", exclusion.why)
        return excluded

    def _expand(self, node_list: str | None) -> list[str]:
        """Expand a SLURM hostlist (``n[1-2]``) into node names, each once (``sinfo`` does it).

        sinfo prints a node once per partition it is in (hidden ones included): the names are kept once,
        in sinfo's order, so that the allocation's size is the job's node count.
        """
        if not node_list:
            return []
        listed = self.hook.run(commands.existing_nodes(node_list), what="expanding the failed job's node list")
        if listed.rc != 0:
            return []
        return list(dict.fromkeys(line.strip() for line in listed.stdout.splitlines() if line.strip()))

    def _shape(self, handle: JobHandle, allocation: Sequence[str]) -> tuple[int, list[str]]:
        """Return the job's node count and partitions: from the handle, else from the staged ``meta`` file."""
        num_nodes, partition = handle.num_nodes, handle.partition
        if num_nodes is None or partition is None:
            meta: dict[str, Any] = {}
            try:
                text = self.hook.read_file(f"{handle.job_dir}/meta")  # a resubmission keeps the first job's job_dir
                meta = json.loads(text) if text else {}
            except (ValueError, RemoteReadError) as exc:
                self.log.warning("Cannot use the job's meta file (%s); the partition check uses the allocation", exc)
            num_nodes = num_nodes or meta.get("nodes")
            partition = partition or meta.get("partition")
        count = int(num_nodes) if num_nodes else max(len(allocation), 1)
        return count, [part for part in str(partition or "").split(",") if part]

    def _submit_retry(
        self,
        handle: JobHandle,
        record: JobRecord,
        new_id: str,
        layout: JobLayout,
        excluded: Sequence[str],
        stage: tuple[str, dict[str, tuple[bytes | None, int]]] | None,
        refused: tuple[str, str],
    ) -> str:
        """Open the next job's record and submit the staged script under the new name.

        :param excluded: the nodes the job avoids (``--exclude``); in a chain the slice number goes along.
        :param stage: the secret sidecar to stage again, if any.
        :param refused: what the job is to the one it follows and the fix, for the error when sbatch refuses it.
        """
        retry = _retry_record(record, new_id)
        self.write_record(layout.record_path, retry)
        script = handle.script_path or JobLayout(handle.results_base, handle.job_id).script_path
        try:
            extra = [*([f"--exclude={','.join(excluded)}"] if excluded else []), *_slice_env(handle)]
            slurm_id = submit_job(
                self.hook, script, new_id, log_dir=record.log_dir, log=self.log, extra_args=extra, stage=stage
            )
        except SubmissionError as exc:
            retry = mark(retry, TaoState.ERROR, now=utc_now(), message=f"sbatch refused it: {exc}", source="sensor")
            self.write_record(layout.record_path, retry)
            self.finish(handle, record)
            raise JobFailedError(
                f"SLURM job {handle.slurm_job_id} ended and {refused[0]} {new_id} was refused ({exc}); {refused[1]}",
                err_class=str(ErrClass.ERR_INFRA),
            ) from exc
        self.write_record(
            layout.record_path, _running(retry, slurm_id, f"resubmitted as SLURM job {slurm_id}", "sensor")
        )
        return slurm_id

    @staticmethod
    def _sidecar_stage(handle: JobHandle) -> tuple[str, dict[str, tuple[bytes | None, int]]] | None:
        """Return the job's secret sidecar, resolved again here, to stage with a resubmission.

        The ended run's batch script removed it at its exit (SLURM was not going to run that job
        again); the resubmitted job runs the same script, which reads it at the same path.

        :raises ValidationError: when a ``secret_env`` reference cannot be resolved here (the
            secret is never guessed; nothing is submitted).
        """
        if not handle.sidecar_path or not handle.secret_refs:
            return None
        secrets = {name: resolve_secret(name, source) for name, source in handle.secret_refs.items()}
        relative = posixpath.relpath(handle.sidecar_path, handle.results_base)
        return handle.results_base, {relative: (sidecar_text(secrets).encode(), 0o600)}

    # ------------------------------------------------------------------ settling

    def settle(
        self, handle: JobHandle, record: JobRecord, state: TaoState, *, message: str, **kwargs: Any
    ) -> JobRecord:
        """Write the terminal record (a record already terminal keeps its first verdict) and remove the sidecar."""
        record = _settled(record, state, message=message, source="sensor", **kwargs)
        self.finish(handle, record)
        return record

    def finish(self, handle: JobHandle, record: JobRecord) -> None:
        """Write ``record``; remove the secret sidecar and the job's end markers (the job will not run again)."""
        self.write_record(handle.record_path, record)
        command, options = _sidecar_removal(
            handle.sidecar_path, ends=(ends_dir(handle.results_base), handle.slurm_job_id)
        )
        self.hook.run(command, **options)

    def end_evidence(self, handle: JobHandle) -> JobState | None:
        """How a job that squeue and sacct no longer know ended, by its own files; None when they do not show it.

        Reads the job's end markers (the batch script's EXIT trap) and its exit-code file, and decides with
        :func:`~airflow_provider_tao_slurm.core.states.state_from_end_evidence`.

        :raises RemoteCommandError: when the markers or the exit-code file could not be read: nothing is
            settled on a read that failed (the sensor's next try looks again).
        """
        if not handle.exit_code_path:
            return None
        directory = ends_dir(handle.results_base)
        listed = self.hook.run(commands.end_markers({directory: 0.0}), check=True, what="listing the job's end markers")
        code = self.hook.read_file(handle.exit_code_path)
        if code is None:
            return None
        markers = [
            (marker.restart, marker.exit_code)
            for marker in commands.parse_end_markers(listed.stdout, [directory])
            if marker.slurm_job_id == handle.slurm_job_id
        ]
        return state_from_end_evidence(handle.slurm_job_id, markers, code)

    def mark_unknown(self, handle: JobHandle, record: JobRecord, message: str, *, remove_sidecar: bool) -> None:
        """Record UNKNOWN (a vanished job, or a state nobody knows) with ``message``.

        :param remove_sidecar: True for a vanished job (it cannot run again); False for a job in an
            unrecognised state, which may still be running and need its secrets.
        """
        if record.terminal_state is None:
            try:
                record = mark(record, TaoState.UNKNOWN, now=utc_now(), message=message, source="sensor")
            except RecordError as exc:
                self.log.warning("Could not record UNKNOWN: %s", exc)
            self.write_record(handle.record_path, record)
        if remove_sidecar:
            self.remove_sidecar(handle.sidecar_path)

    def cancel(self, handle: JobHandle, *, source: str) -> None:
        """Handle a user kill of the task watching ``handle``: see :meth:`cancel_job`."""
        self.cancel_job(
            handle.slurm_job_id,
            handle.job_id,
            record_path=handle.record_path,
            sidecar_path=handle.sidecar_path,
            source=source,
        )

    def cancel_job(
        self,
        slurm_job_id: str,
        job_name: str,
        *,
        record_path: str | None = None,
        sidecar_path: str | None = None,
        source: str,
    ) -> None:
        """Cancel our job with ``scancel`` (by id AND exact name, our user only), record CANCELED, remove the sidecar.

        Every cancel of the provider comes here (or to :meth:`a_cancel` in the triggerer): a user
        kill of a watching task and a probe that is given up alike.

        :param source: who cancels (``sensor on_kill``, ``nccl probe`` ...), said in the log and the record.
        """
        plan = _CancelPlan(slurm_job_id, job_name, record_path, sidecar_path, source)
        self.log.info("%s", plan.note)
        handed_off = self._scancel(plan)
        try:
            write = plan.record_write(self.hook.read_file(record_path), handed_off) if record_path else None
            if write is not None:
                self.hook.write_file(*write)
        finally:  # the job will not run again: its secrets go whatever became of the record
            if plan.sidecar_removal is not None:
                command, options = plan.sidecar_removal
                self.hook.run(command, **options)

    async def a_cancel(
        self, slurm_job_id: str, job_name: str, *, record_path: str | None, sidecar_path: str | None, source: str
    ) -> None:
        """Async twin of :meth:`cancel_job` (the trigger's ``on_kill``): the same steps, :class:`_CancelPlan`'s.

        The steps run to their end whatever cancels the caller meanwhile (:func:`_through_cancels`): Airflow 3.3's
        triggerer cancels a trigger that runs ``on_kill`` again about once a second until it ends.
        """
        plan = _CancelPlan(slurm_job_id, job_name, record_path, sidecar_path, source)
        self.log.info("%s", plan.note)
        await _through_cancels(self._a_cancel_steps(plan))

    async def _a_cancel_steps(self, plan: _CancelPlan) -> None:
        """:meth:`a_cancel`'s steps: scancel (or hand it over), the record, the sidecar."""
        handed_off = await self._a_scancel(plan)
        try:
            record = await self.hook.a_read_file(plan.record_path) if plan.record_path else None
            write = plan.record_write(record, handed_off)
            if write is not None:
                await self.hook.a_write_file(*write)
        finally:  # the job will not run again: its secrets go whatever became of the record
            if plan.sidecar_removal is not None:
                command, options = plan.sidecar_removal
                await self.hook.a_run(command, **options)

    def _scancel(self, plan: _CancelPlan) -> bool:
        """Cancel the plan's job (scancel); a scancel that fails on the login host is handed to it at once.

        slurmctld restarting or out of the login host's reach answers in minutes, and Airflow gives on_kill seconds:
        the login host tries again (:meth:`SlurmHook.hand_off_cancel`). An SSH failure (the login host itself out of
        reach, or the hand-over refused) is tried again here for :data:`CANCEL_RETRY_S`.

        :returns: True when the cancel was handed to the login host.
        :raises RemoteCommandError: (or :class:`SlurmConnectionError`) the last failure, once the window is over,
            or at once for a failure no retry fixes (a refused key or host key).
        """
        clock = self._clock or time.monotonic
        start, tries = clock(), 0
        while True:
            tries += 1
            try:
                self.hook.cancel([plan.slurm_job_id], job_name=plan.job_name)
                return False
            except (RemoteCommandError, SlurmConnectionError) as failed:
                last: TaoSlurmError = failed
                if plan.hands_over(failed):
                    try:
                        self.hook.hand_off_cancel([plan.slurm_job_id], **plan.hand_off)
                        plan.say_handed_off(self.log, failed)
                        return True
                    except (RemoteCommandError, SlurmConnectionError) as hand_off_failed:
                        last = hand_off_failed
                if not plan.retry(self.log, last, tries, clock() - start, CANCEL_RETRY_S):
                    raise last from None
            (self._sleep or time.sleep)(CANCEL_RETRY_INTERVAL_S)

    async def _a_scancel(self, plan: _CancelPlan) -> bool:
        """Async twin of :meth:`_scancel`, for :data:`A_CANCEL_RETRY_S`."""
        clock = self._clock or time.monotonic
        start, tries = clock(), 0
        while True:
            tries += 1
            try:
                await self.hook.a_cancel([plan.slurm_job_id], job_name=plan.job_name)
                return False
            except (RemoteCommandError, SlurmConnectionError) as failed:
                last: TaoSlurmError = failed
                if plan.hands_over(failed):
                    try:
                        await self.hook.a_hand_off_cancel([plan.slurm_job_id], **plan.hand_off)
                        plan.say_handed_off(self.log, failed)
                        return True
                    except (RemoteCommandError, SlurmConnectionError) as hand_off_failed:
                        last = hand_off_failed
                if not plan.retry(self.log, last, tries, clock() - start, A_CANCEL_RETRY_S):
                    raise last from None
            await asyncio.sleep(CANCEL_RETRY_INTERVAL_S)

    def remove_sidecar(self, path: str | None) -> None:
        """Remove the job's secret sidecar (nothing to do without one)."""
        if path:
            command, options = _sidecar_removal(path)
            self.hook.run(command, **options)

    def read_status(self, path: str, *, settle: bool) -> list[dict[str, Any]] | None:
        """Return a job's TAO ``status.json`` records; None when it does not exist.

        :param settle: read a missing file again for :data:`STATUS_SETTLE_S` before it counts as
            missing (a TAO job's last write may not show yet on a login host that caches attributes).
        :raises RemoteReadError: when it could not be read (never taken for a missing file).
        """
        status, _, _ = self._read_settled(
            lambda: self.hook.read_status_json(path),
            lambda read: read is not None,
            window=STATUS_SETTLE_S if settle else 0.0,
            interval=STATUS_RETRY_S,
            note=f"{path} is not there yet: reading it again (shared storage may lag)",
        )
        return status

    # ------------------------------------------------------------------ logs

    def wait_until_ended(
        self,
        slurm_job_id: str,
        job_name: str,
        *,
        submitted_at: float,
        poll_interval: float,
        rules: WatchRules | None = None,
    ) -> dict[str, Any]:
        """Wait in the worker (``deferrable=False``) until the job ends; return the event the trigger would send.

        The same :func:`~airflow_provider_tao_slurm.lifecycle.watch.observe` rules as the trigger's: a failed
        query restarts the not-found clock, a vanished job, a state nobody knows and accounting lag get the
        same graces, and the event is the same.
        """
        watch = Watch.start(slurm_job_id, job_name, submitted_at=submitted_at)
        rules = rules or WatchRules()
        while True:
            step, _ = self.poll(watch, rules, now=time.time())
            watch = step.watch
            if step.event is not None:
                return step.event.to_dict()
            time.sleep(poll_interval)

    def poll(self, watch: Watch, rules: WatchRules, *, now: float) -> tuple[Step, JobState | None]:
        """Ask the scheduler once about the watched job and feed the answer to the watch; log what it says.

        A failed query goes to the watch as an error (never as "no job").

        :param now: the poll's time (epoch seconds).
        :returns: the watch's step and the state the scheduler gave (None when it gave none).
        """
        try:
            state, error = self.hook.get_states([watch.slurm_job_id]).get(watch.slurm_job_id), None
        except JobLookupError as exc:
            state, error = None, str(exc)
        step = observe(watch, rules, polled_at=now, state=state, error=error)
        for note in step.notes:
            self.log.log(note.level, "%s", note.message)
        return step, state

    def usage(self, slurm_job_id: str) -> JobUsage | None:
        """Return what the job cost (queue and run time, GPU hours, nodes, exit code) from accounting.

        ``None`` when accounting cannot say (the figures are a report: their absence never fails the job).
        """
        try:
            result = self.hook.run(usage_command(slurm_job_id), what="job usage query")
        except TaoSlurmError as exc:
            self.log.warning("Cannot read the usage of SLURM job %s: %s", slurm_job_id, exc)
            return None
        if result.rc != 0:
            self.log.warning("Cannot read the usage of SLURM job %s: sacct exited %s", slurm_job_id, result.rc)
            return None
        return parse_usage(result.stdout, slurm_job_id)

    def log_tail(self, path: str, max_bytes: int = LOG_TAIL_BYTES, secrets: Iterable[str] = ()) -> str:
        """Return the last ``max_bytes`` of a remote log, redacted (empty when missing).

        A tail that does not start at the file's start may start inside a private key block whose ``BEGIN``
        it does not hold: its lines that may be the key's body are withheld (see :meth:`raw_tail`).
        """
        text, key_block = self.raw_tail(path, max_bytes)
        return redact_chunk(text, secrets, key_block)[0]

    def raw_tail(self, path: str, max_bytes: int = LOG_TAIL_BYTES) -> tuple[str, KeyBlock]:
        """Return the last ``max_bytes`` of a remote log, not redacted (empty when missing), and where it starts.

        :returns: the text, and where it stands with respect to a private key block at its start (outside
            when it is the whole file, else unknown): redact it with
            :func:`~airflow_provider_tao_slurm.core.secrets.redact_chunk` from there.
        """
        size = self.hook.read_log(path, 0, 1).size
        start = max(0, size - max_bytes)
        text = self.hook.read_log(path, start, max_bytes).data if size else ""
        return text, key_block_at(start)


def _followed_by(handle: JobHandle, record: JobRecord, new_id: str, slurm_id: str, **changes: Any) -> JobHandle:
    """Return the handle of the job ``new_id`` (SLURM ``slurm_id``) that runs ``handle``'s script after it."""
    return replace(
        handle,
        job_id=new_id,
        slurm_job_id=slurm_id,
        record_path=JobLayout(handle.results_base, new_id).record_path,
        log_dir=f"{record.log_dir}/{new_id}-{slurm_id}",
        submitted_at=utc_now(),
        retry_of=handle.job_id,
        **changes,
    )


def _retry_record(record: JobRecord, new_id: str) -> JobRecord:
    """Open the record of the job ``new_id`` that runs ``record``'s job's script again after it."""
    return open_record(
        job_id=new_id,
        cluster=record.cluster,
        image=record.image,
        network_arch=record.network_arch,
        action=record.action,
        results_dir=record.results_dir,
        job_dir=record.job_dir,
        log_dir=record.log_dir,
        job_name=new_id,
        now=utc_now(),
        retry_of=record.job_id,
    )


def _slice_env(handle: JobHandle) -> list[str]:
    """Return the sbatch option that tells the next slice its number (none outside a chain of slices)."""
    return [f"--export=ALL,{SLICE_ENV}={handle.slice_number + 1}"] if handle.max_continuations else []


def _next_slice(handle: JobHandle, state: JobState, usage: JobUsage | None, checkpoint: str | None) -> dict[str, Any]:
    """Return the handle fields of the job that follows ``handle`` in a chain of slices (none outside one)."""
    if not handle.max_continuations:
        return {}
    ended = {
        "job_id": handle.job_id,
        "slurm_job_id": handle.slurm_job_id,
        "state": state.native,
        "queue_seconds": usage.queue_seconds if usage else None,
        "elapsed_seconds": usage.elapsed_seconds if usage else None,
        "gpu_hours": usage.gpu_hours if usage else None,
        "partition": usage.partition if usage else None,
        "time_limit_seconds": usage.time_limit_seconds if usage else None,
        "checkpoint": checkpoint,
    }
    return {"slice_number": handle.slice_number + 1, "slices": (*handle.slices, ended)}


def chain_summary(handle: JobHandle, state: JobState, usage: JobUsage | None) -> dict[str, Any]:
    """Summarise a finished chain: its ``slices`` (every slice, the last one included) and their ``totals``.

    Each slice carries the partition it ran on and its time limit there (``partition``, ``time_limit_seconds``,
    from accounting): a training naming several partitions starts each slice on whichever takes it first.
    """
    last = _next_slice(handle, state, usage, None)["slices"][-1]
    slices = [dict(item) for item in (*handle.slices, last)]

    def total(key: str) -> float:
        return round(sum(item.get(key) or 0 for item in slices), 4)

    return {
        "slices": slices,
        "totals": {
            "slices": len(slices),
            "queue_seconds": total("queue_seconds"),
            "elapsed_seconds": total("elapsed_seconds"),
            "gpu_hours": total("gpu_hours"),
        },
    }


def _sidecar_removal(path: str | None, *, ends: tuple[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """Return the one command (and its ``run`` options) that removes a job's secret sidecar.

    :param ends: ``(ends directory, SLURM job id)``: the job's end markers go in the same round trip (the
        job will not run again).
    """
    sidecar = [path] if path else []
    if ends is not None:
        command = commands.remove_end_markers(ends[0], ends[1], sidecar)
        return command, {"check": True, "what": "removing the secret sidecar and the end markers"}
    return commands.remove_files(sidecar), {"check": True, "what": f"removing the secret sidecar {path}"}


#: The steps :func:`_through_cancels` runs, referenced until they end (their caller may have stopped waiting).
_RUNNING_CANCELS: set[asyncio.Task[None]] = set()


async def _through_cancels(steps: Coroutine[Any, Any, None]) -> None:
    """Await ``steps`` to their end, whatever cancels the caller meanwhile; then pass a cancel on.

    A cancel stopped half way has handed the job to nobody, written no record and left its secrets behind: worse
    than a late one. Airflow 3.3's triggerer cancels a trigger that runs ``on_kill`` again at each of its syncs
    (about once a second) until it ends, and an unreachable slurmctld takes scancel 18 s to report. ``steps`` are
    bounded by their own windows (:data:`A_CANCEL_RETRY_S`, the connection's timeouts). Where the caller stops
    waiting all the same (Python 3.11's ``asyncio.wait_for`` leaves at the second cancel), the steps go on as a task
    of their own: their last lines are then in the triggerer's log, their outcome in the record.

    :raises asyncio.CancelledError: once the steps ended, when the caller was cancelled meanwhile.
    """
    task = asyncio.ensure_future(steps)
    _RUNNING_CANCELS.add(task)
    task.add_done_callback(_RUNNING_CANCELS.discard)
    interrupted = False
    while True:
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.done() or current is None:
                raise
            current.uncancel()
            interrupted = True
            continue
        if interrupted:
            raise asyncio.CancelledError
        return


@dataclass(frozen=True)
class _CancelPlan:
    """A cancel of our job, decided without I/O: the one sequence of the sync and the async cancel.

    :meth:`JobLifecycle.cancel_job` and :meth:`JobLifecycle.a_cancel` run it, each with its own hook
    calls. In order: log :attr:`note`; scancel the job by id AND exact name (a scancel that slurmctld did not answer
    is handed to the login host, :attr:`hand_off`; the login host out of reach is tried again, as :meth:`retry`
    says); write :meth:`record_write`
    of the record read at ``record_path`` (when there is one); then, whatever became of the record, run
    :attr:`sidecar_removal` (the job will not run again).

    :param source: who cancels, said in the log and the record.
    """

    slurm_job_id: str
    job_name: str
    record_path: str | None
    sidecar_path: str | None
    source: str

    @property
    def note(self) -> str:
        """The log line that says which job is cancelled, and by whom."""
        return f"Cancelling SLURM job {self.slurm_job_id} ({self.job_name}): {self.source}"

    @property
    def hand_off_log(self) -> str | None:
        """Where the login host says what became of a cancel handed to it: beside the record (None without one)."""
        if self.record_path is None:
            return None
        return f"{self.record_path.removesuffix('.json')}.cancel.log"

    @property
    def hand_off(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`SlurmHook.hand_off_cancel` (the job's name, the window, the log)."""
        return {
            "job_name": self.job_name,
            "within_s": CANCEL_HANDOFF_S,
            "every_s": CANCEL_HANDOFF_INTERVAL_S,
            "log_path": self.hand_off_log,
        }

    @property
    def hand_off_note(self) -> str:
        """What the record says of a cancel handed to the login host."""
        where = f"; its log: {self.hand_off_log}" if self.hand_off_log else ""
        return (
            f"slurmctld did not answer the login host's scancel: the login host tries again every "
            f"{CANCEL_HANDOFF_INTERVAL_S:g} s for up to {CANCEL_HANDOFF_S / 60:g} min{where}"
        )

    @staticmethod
    def hands_over(failed: TaoSlurmError) -> bool:
        """Whether a failed scancel is handed to the login host.

        Only one that ran there and failed (slurmctld did not answer it): a login host out of reach cannot take it over.
        """
        return isinstance(failed, RemoteCommandError)

    def say_handed_off(self, log: Any, failed: TaoSlurmError) -> None:
        """Log that the cancel is the login host's now, and what to do should it never go through."""
        log.warning(
            "scancel of SLURM job %s failed (%s): %s; if slurmctld stays out of reach longer, cancel it by hand "
            "(scancel %s)",
            self.slurm_job_id,
            failed,
            self.hand_off_note,
            self.slurm_job_id,
        )

    def retry(self, log: Any, failed: TaoSlurmError, tries: int, waited: float, window: float) -> bool:
        """Whether a cancel that could not reach the login host (or hand itself over) is tried again; logs why.

        The log says when the next try comes, or why the cancel is given up. A login host restarting or out of
        reach answers later; a refused key or host key never.
        """
        if isinstance(failed, (SlurmAuthenticationError, HostKeyError)):
            return False
        if waited < window:
            log.warning(
                "scancel of SLURM job %s failed (%s): trying again in %g s, for up to %g s (is the login host "
                "restarting or out of reach?)",
                self.slurm_job_id,
                failed,
                CANCEL_RETRY_INTERVAL_S,
                window,
            )
            return True
        log.error(
            "SLURM job %s (%s) could not be cancelled: scancel failed %d time(s) over %.0f s; the job may still run: "
            "cancel it by hand (scancel %s) once the login host and slurmctld answer",
            self.slurm_job_id,
            self.job_name,
            tries,
            waited,
            self.slurm_job_id,
        )
        return False

    def record_write(self, text: str | None, handed_off: bool = False) -> tuple[str, bytes, str] | None:
        """Return the ``write_file`` arguments of the record marked CANCELED; None without a record.

        :param text: the record read at ``record_path`` (None when there is none).
        :param handed_off: the cancel is the login host's now (the record says so, and where its log is).
        :raises RecordError: when the record read is not a valid record.
        """
        if self.record_path is None or text is None:
            return None
        record = _canceled(from_json(text), self.slurm_job_id, self.source, self.hand_off_note if handed_off else "")
        return self.record_path, to_json(record).encode(), "644"

    @property
    def sidecar_removal(self) -> tuple[str, dict[str, Any]] | None:
        """The command (and its ``run`` options) that removes the secret sidecar; None without one."""
        return _sidecar_removal(self.sidecar_path) if self.sidecar_path else None


def _canceled(record: JobRecord, slurm_job_id: str, source: str, note: str = "") -> JobRecord:
    """``record`` marked CANCELED by a user kill seen by ``source`` (a terminal record stays as it is).

    :param note: said after the message (a cancel handed to the login host).
    """
    return _settled(
        record,
        TaoState.CANCELED,
        message=f"SLURM job {slurm_job_id} cancelled on user request (task killed: {source})"
        + (f"; {note}" if note else ""),
        source=source,
    )
