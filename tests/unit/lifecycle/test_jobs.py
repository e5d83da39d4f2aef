"""``JobLifecycle`` over the shared fake hook (files in a dict, every lookup, command and submission recorded).

Submit once and adoption across tries, infrastructure resubmission (exclusions, partition fit),
cancel (sync and async), UNKNOWN records, settling and log tails.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.exceptions import AirflowFailException
from fakes import FakeSlurmHook

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.continuation import slice_job_id
from airflow_provider_tao_slurm.core.failures import Classification
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.records import JobRecord, from_json, mark, mint_job_id, open_record, to_json
from airflow_provider_tao_slurm.core.secrets import REDACTED
from airflow_provider_tao_slurm.core.states import ErrClass, JobState, TaoState, state_from_native
from airflow_provider_tao_slurm.core.usage import JobUsage
from airflow_provider_tao_slurm.exceptions import (
    AmbiguousSubmissionError,
    JobFailedError,
    JobLookupError,
    JobNotFoundError,
    RemoteCommandError,
    RemoteReadError,
    SlurmAuthenticationError,
    SlurmConnectionError,
    SubmissionError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW, CommandResult
from airflow_provider_tao_slurm.lifecycle import jobs as jobs_module
from airflow_provider_tao_slurm.lifecycle.events import JobHandle
from airflow_provider_tao_slurm.lifecycle.jobs import Attempt, JobLifecycle

BASE = "/lustre/u"
NOW = "2026-01-02T03:04:05Z"
DAG, TASK, RUN = "dag", "submit", "run1"
FIRST = mint_job_id(DAG, TASK, RUN)


def tried(n: int) -> str:
    """The job id try ``n`` mints when the record before it is terminal (try 1 has the first id)."""
    return FIRST if n == 1 else mint_job_id(DAG, TASK, RUN, try_number=n)


def ti(try_number: int, task_id: str = TASK) -> SimpleNamespace:
    return SimpleNamespace(dag_id=DAG, task_id=task_id, run_id=RUN, map_index=-1, try_number=try_number)


def record_of(
    job_id: str, state: TaoState | None = TaoState.RUNNING, *, retry_of: str | None = None, slurm_id: str = "500"
) -> JobRecord:
    """A record of ``job_id``: just opened (None), submitted as ``slurm_id`` (RUNNING) or settled (a terminal state)."""
    layout = JobLayout(BASE, job_id)
    record = open_record(
        job_id=job_id,
        cluster="mini",
        image="/lustre/c/x.sqsh",
        network_arch="custom",
        action="train",
        results_dir=layout.results_dir,
        job_dir=layout.job_dir,
        log_dir=layout.log_dir,
        job_name=job_id,
        now=NOW,
        retry_of=retry_of,
    )
    if state is None:
        return record
    record = mark(record, TaoState.RUNNING, now=NOW, message="submitted", source="submit", backend_ref=slurm_id)
    if state is TaoState.RUNNING:
        return record
    extra = {"err_class": ErrClass.ERR_PROGRAM} if state is TaoState.ERROR else {}
    return mark(record, state, now=NOW, message="ended", source="sensor", **extra)


class LifecycleHook(FakeSlurmHook):
    """The shared fake answering what a resubmission and a slice's end ask: node states, allocation, checkpoints."""

    def __init__(self) -> None:
        super().__init__()
        self.sinfo = "n1|polar*|idle\nn2|polar*|down*\nn3|polar*|idle\n"
        self.allocation = "n1\nn2\n"
        #: the listing of a slice's new checkpoints: one answer, or one per listing (the last one repeats)
        self.checkpoints: CommandResult | list[CommandResult] = CommandResult(0, "NOSTART\n", "")
        self.listings = 0
        self.handlers.append(self._cluster)

    def _cluster(self, command: str) -> CommandResult | None:
        if command == commands.node_states():
            return CommandResult(0, self.sinfo, "")
        if command.startswith("sinfo -a -h -N -o %N -n"):
            return CommandResult(0, self.allocation, "")
        if "-newer" in command:  # the slice's new checkpoints
            self.listings += 1
            if isinstance(self.checkpoints, list):
                return self.checkpoints.pop(0) if len(self.checkpoints) > 1 else self.checkpoints[0]
            return self.checkpoints
        return None


def store(hook: FakeSlurmHook, record: JobRecord) -> None:
    hook.files[JobLayout(BASE, record.job_id).record_path] = to_json(record)


def read_record(hook: FakeSlurmHook, job_id: str) -> JobRecord:
    return from_json(hook.files[JobLayout(BASE, job_id).record_path])


def sidecar_removals(hook: FakeSlurmHook) -> list[str]:
    return [c for c in hook.commands if c.startswith("rm -f -- ")]


#: What settling a job removes, in one command: its secret sidecar and its end markers.
SETTLED_REMOVAL = f"rm -f -- {JobLayout(BASE, FIRST).sidecar_path} {BASE}/ends/500-*.end"


# ---------------------------------------------------------------------- plan_attempt: submit once, adopt any try's job


def test_the_first_try_submits_the_first_id_without_any_lookup() -> None:
    hook = LifecycleHook()

    attempt = JobLifecycle(hook).plan_attempt(ti(1), BASE)

    assert attempt == Attempt(FIRST, JobLayout(BASE, FIRST))
    assert (hook.lookups, hook.reads, hook.commands) == ([], [], [])


@pytest.mark.parametrize(
    ("try_number", "records", "found", "expected", "lookups"),
    [
        pytest.param(2, [], {}, Attempt(FIRST, JobLayout(BASE, FIRST)), [FIRST], id="try2-no-records-looks-up-first"),
        pytest.param(
            2,
            [],
            {FIRST: ["77"]},
            Attempt(FIRST, JobLayout(BASE, FIRST), adopted="77"),
            [FIRST],
            id="try2-no-record-but-our-job-adopted",
        ),
        pytest.param(
            2,
            [record_of(FIRST)],
            {FIRST: ["500"]},
            Attempt(FIRST, JobLayout(BASE, FIRST), previous=record_of(FIRST), adopted="500"),
            [FIRST],
            id="try2-adopts-the-first-tries-live-job",
        ),
        pytest.param(
            2,
            [record_of(FIRST, None)],
            {},
            Attempt(FIRST, JobLayout(BASE, FIRST), previous=record_of(FIRST, None)),
            [FIRST],
            id="try2-first-try-died-before-sbatch-submits-under-its-name",
        ),
        pytest.param(
            2,
            [record_of(FIRST, TaoState.ERROR)],
            {},
            Attempt(tried(2), JobLayout(BASE, tried(2)), retry_of=FIRST),
            [],
            id="try2-first-record-terminal-fresh-id",
        ),
        pytest.param(
            3,
            [record_of(tried(2), retry_of=FIRST, slurm_id="600"), record_of(FIRST, TaoState.ERROR)],
            {tried(2): ["600"]},
            Attempt(
                tried(2),
                JobLayout(BASE, tried(2)),
                retry_of=FIRST,
                previous=record_of(tried(2), retry_of=FIRST, slurm_id="600"),
                adopted="600",
            ),
            [tried(2)],
            id="try3-adopts-try2s-job-retry-of-kept",
        ),
        pytest.param(
            3,
            [record_of(tried(2), TaoState.ERROR, retry_of=FIRST), record_of(FIRST, TaoState.ERROR)],
            {tried(2): ["600"]},
            Attempt(tried(3), JobLayout(BASE, tried(3)), retry_of=tried(2)),
            [],
            id="try3-try2-terminal-fresh-id-retries-try2",
        ),
        pytest.param(
            3,
            [record_of(FIRST)],
            {FIRST: ["500"]},
            Attempt(FIRST, JobLayout(BASE, FIRST), previous=record_of(FIRST), adopted="500"),
            [FIRST],
            id="try3-only-the-first-record-adopted",
        ),
        pytest.param(
            3,
            [record_of(FIRST, TaoState.CANCELED)],
            {},
            Attempt(tried(3), JobLayout(BASE, tried(3)), retry_of=FIRST),
            [],
            id="try3-only-first-record-terminal",
        ),
        pytest.param(
            4,
            [record_of(tried(3), TaoState.COMPLETE, retry_of=tried(2)), record_of(tried(2), retry_of=FIRST)],
            {},
            Attempt(tried(4), JobLayout(BASE, tried(4)), retry_of=tried(3)),
            [],
            id="try4-newest-record-wins",
        ),
        pytest.param(
            4,
            [record_of(tried(2), TaoState.ERROR, retry_of=FIRST)],
            {},
            Attempt(tried(4), JobLayout(BASE, tried(4)), retry_of=tried(2)),
            [],
            id="try4-try3-left-no-record",
        ),
    ],
)
def test_plan_attempt(
    try_number: int,
    records: list[JobRecord],
    found: dict[str, list[str]],
    expected: Attempt,
    lookups: list[str],
) -> None:
    hook = LifecycleHook()
    for record in records:
        store(hook, record)
    hook.found = found

    attempt = JobLifecycle(hook).plan_attempt(ti(try_number), BASE)

    assert attempt == expected
    assert hook.lookups == lookups
    assert hook.submits == []
    assert hook.staged == []
    if attempt.adopted is not None:  # an adopted job is released and gets its log directory
        assert hook.released == [(f"{BASE}/logs", attempt.job_id, attempt.adopted)]


@pytest.mark.parametrize("try_number", [2, 3])
def test_a_retry_adopts_and_releases_the_job_of_a_try_killed_inside_its_submission(try_number: int) -> None:
    """The earlier try opened its record and was killed inside the submission (after ``sbatch --hold``, before the
    release): its job is held and its record bound to no job. The retry releases the job, creates its log
    directory and binds the record to it; submit_once then writes nothing more and submits nothing."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST, None))
    hook.found = {FIRST: ["77"]}

    attempt = JobLifecycle(hook).plan_attempt(ti(try_number), BASE)

    assert (attempt.job_id, attempt.adopted) == (FIRST, "77")
    assert hook.released == [(f"{BASE}/logs", FIRST, "77")]
    written = read_record(hook, FIRST)
    assert (written.state, written.backend_ref, written.transitions[-1].message) == (
        TaoState.RUNNING,
        "77",
        "adopted SLURM job 77",
    )
    assert attempt.previous == written
    slurm_id, record = JobLifecycle(hook).submit_once(attempt, results_base=BASE, files={}, record=attempt.previous)
    assert (slurm_id, record, hook.submits, hook.staged) == ("77", written, [], [])
    assert hook.released == [(f"{BASE}/logs", FIRST, "77")], "released once"


def test_submit_once_binds_the_record_opened_for_a_job_adopted_without_one() -> None:
    """Try 2 found our job of the first name but no record (plan_attempt released it); the record the operator
    opens is bound to the adopted job and written."""
    hook = LifecycleHook()
    hook.found = {FIRST: ["77"]}
    attempt = JobLifecycle(hook).plan_attempt(ti(2), BASE)
    assert (attempt.adopted, attempt.previous, hook.released) == ("77", None, [(f"{BASE}/logs", FIRST, "77")])

    slurm_id, record = JobLifecycle(hook).submit_once(
        attempt, results_base=BASE, files={}, record=record_of(FIRST, None)
    )

    assert (slurm_id, record.state, record.backend_ref) == ("77", TaoState.RUNNING, "77")
    assert read_record(hook, FIRST) == record
    assert (hook.submits, hook.staged) == ([], [])


def test_plan_attempt_reads_the_newest_try_first() -> None:
    hook = LifecycleHook()

    JobLifecycle(hook).plan_attempt(ti(4), BASE)

    assert hook.reads == [JobLayout(BASE, job_id).record_path for job_id in (tried(3), tried(2), FIRST)]


@pytest.mark.parametrize(
    "records",
    [pytest.param([], id="no-records"), pytest.param([record_of(tried(2), retry_of=FIRST)], id="try2-live")],
)
def test_a_failed_lookup_propagates_and_nothing_is_submitted(records: list[JobRecord]) -> None:
    hook = LifecycleHook()
    for record in records:
        store(hook, record)
    hook.lookup_error = JobLookupError("looking up jobs by name failed (squeue exited 1)", evidence="squeue exited 1")

    with pytest.raises(JobLookupError, match="squeue exited 1"):
        JobLifecycle(hook).plan_attempt(ti(3), BASE)

    assert (hook.submits, hook.staged, hook.commands) == ([], [], [])


def test_several_of_our_jobs_of_one_name_stop_the_try() -> None:
    hook = LifecycleHook()
    hook.found = {FIRST: ["500", "501"]}

    with pytest.raises(AmbiguousSubmissionError, match=r"2 SLURM jobs are named .*\(500, 501\)"):
        JobLifecycle(hook).plan_attempt(ti(2), BASE)

    assert hook.submits == []


# ---------------------------------------------------------------------- submit_once


def test_submit_once_stages_submits_and_marks_running() -> None:
    hook = LifecycleHook()
    attempt = Attempt(FIRST, JobLayout(BASE, FIRST))
    files = {"jobs/x/spec.yaml": (b"a: 1\n", 0o644)}

    slurm_id, record = JobLifecycle(hook).submit_once(
        attempt, results_base=BASE, files=files, record=record_of(FIRST, None)
    )

    assert slurm_id == "501"
    assert hook.staged == [(BASE, files)]
    assert hook.submits == [(attempt.layout.script_path, FIRST, f"{BASE}/logs", ())]
    assert (record.state, record.backend_ref) == (TaoState.RUNNING, "501")
    assert read_record(hook, FIRST) == record


def test_submit_once_of_an_adopted_job_submits_nothing() -> None:
    hook = LifecycleHook()
    attempt = Attempt(FIRST, JobLayout(BASE, FIRST), adopted="500")

    slurm_id, record = JobLifecycle(hook).submit_once(attempt, results_base=BASE, files={}, record=record_of(FIRST))

    assert slurm_id == "500"
    assert (hook.staged, hook.submits) == ([], [])
    assert (record.state, record.backend_ref) == (TaoState.RUNNING, "500")


# ---------------------------------------------------------------------- resubmit

SENSOR_TI = ti(1, task_id="wait")
RETRY_ID = mint_job_id(DAG, "wait", RUN, retry_of=FIRST)
LAYOUT = JobLayout(BASE, FIRST)


def handle(**changes: Any) -> JobHandle:
    values: dict[str, Any] = {
        "job_id": FIRST,
        "slurm_job_id": "500",
        "job_dir": LAYOUT.job_dir,
        "results_dir": LAYOUT.results_dir,
        "record_path": LAYOUT.record_path,
        "results_base": BASE,
        "log_dir": LAYOUT.job_log_dir("500"),
        "script_path": LAYOUT.script_path,
        "sidecar_path": LAYOUT.sidecar_path,
        "submitted_at": NOW,
    }
    return JobHandle.from_dict({**values, **changes})


def failure(native: str, evidence: str, node_list: str | None = "n[1-2]") -> tuple[JobState, Classification]:
    state = state_from_native("500", native, source="sacct", exit_code=1, signal=0, node_list=node_list)
    return state, Classification(ErrClass.ERR_INFRA, "infrastructure failure", evidence, True)


@pytest.mark.parametrize(
    ("native", "evidence", "sinfo", "allocation", "changes", "extra"),
    [
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            "n1|polar*|idle\nn2|polar*|down*\nn3|polar*|idle\n",
            "n1\nn2\n",
            {},
            ("--exclude=n2",),
            id="node-fail-only-the-down-node",
        ),
        pytest.param(
            "FAILED",
            "line 7: NVRM: Xid (PCI:0000:3b:00) on n2: 79, GPU has fallen off the bus",
            "n1|polar*|idle\nn2|polar*|idle\nn21|polar*|idle\nn3|polar*|idle\n",
            "n1\nn2\nn21\n",
            {},
            ("--exclude=n2",),
            id="evidence-names-n2-not-n21",
        ),
        pytest.param(
            "FAILED",
            "line 7: NCCL WARN NET/IB : Got completion with error 12",
            "n1|polar*|idle\nn2|polar*|idle\nn3|polar*|idle\nn4|polar*|idle\n",
            "n1\nn2\n",
            {"num_nodes": 2, "partition": "polar"},
            ("--exclude=n1,n2",),
            id="nothing-named-whole-allocation-fits",
        ),
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            "n1|polar*|idle\nn2|polar*|down*\nn0|polar*|idle\n",
            "n1\nn2\n",
            {"exclude_nodes": ["n0"]},
            ("--exclude=n0,n2",),
            id="earlier-exclusions-kept",
        ),
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            "n1|gpu*|idle\nn2|gpu*|down*\nn3|debug|idle\n",
            "n1\nn2\n",
            {"num_nodes": 2, "partition": "gpu,debug"},
            ("--exclude=n2",),
            id="comma-partition-list-fits",
        ),
        pytest.param(
            "FAILED",
            "line 3: GPU has fallen off the bus",
            "n1|polar*|idle\n",
            "",
            {},
            (),
            id="no-allocation-no-exclude",
        ),
    ],
)
def test_resubmit_excludes_only_what_the_evidence_names(
    native: str, evidence: str, sinfo: str, allocation: str, changes: dict[str, Any], extra: tuple[str, ...]
) -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.sinfo, hook.allocation = sinfo, allocation
    state, verdict = failure(native, evidence, node_list="n[1-2]" if allocation else None)
    old = handle(**changes)

    new = JobLifecycle(hook).resubmit(SENSOR_TI, old, read_record(hook, FIRST), state, verdict)

    assert hook.lookups == [RETRY_ID]
    assert hook.submits == [(LAYOUT.script_path, RETRY_ID, f"{BASE}/logs", extra)]
    assert new.job_id == RETRY_ID
    assert (new.slurm_job_id, new.retry_of, new.infra_retries) == ("501", FIRST, 1)
    assert new.exclude_nodes == (tuple(extra[0].removeprefix("--exclude=").split(",")) if extra else ())
    assert (new.record_path, new.log_dir) == (JobLayout(BASE, RETRY_ID).record_path, f"{BASE}/logs/{RETRY_ID}-501")
    assert (new.num_nodes, new.partition, new.sidecar_path) == (old.num_nodes, old.partition, old.sidecar_path)
    settled = read_record(hook, FIRST)
    assert (settled.terminal_state, settled.err_class) == (TaoState.ERROR, ErrClass.ERR_INFRA)
    assert RETRY_ID in settled.transitions[-1].message
    retry = read_record(hook, RETRY_ID)
    assert (retry.retry_of, retry.backend_ref, retry.state) == (FIRST, "501", TaoState.RUNNING)
    assert sidecar_removals(hook) == []  # the resubmitted job still needs its secrets


def test_resubmit_stages_the_secret_sidecar_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed run's EXIT trap removed the sidecar (SLURM was not rerunning it): the resubmission, which runs
    the same script, gets it again, resolved on this worker, mode 600, in the same round trip as sbatch."""
    monkeypatch.setenv("TAO_TEST_SRC", "s3cr3t value'x")
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    state, verdict = failure("FAILED", "line 7: NVRM: Xid (PCI:0000:3b:00) on n2: 79, GPU has fallen off the bus")
    old = handle(sidecar_path=LAYOUT.sidecar_path, secret_refs={"HF_TOKEN": "env:TAO_TEST_SRC"})

    JobLifecycle(hook).resubmit(SENSOR_TI, old, read_record(hook, FIRST), state, verdict)

    assert hook.staged_files == {LAYOUT.sidecar_path: (b"export HF_TOKEN='s3cr3t value'\"'\"'x'\n", 0o600)}
    assert [job_name for _, job_name, _, _ in hook.submits] == [RETRY_ID]
    assert all("s3cr3t" not in text for text in hook.files.values())


def test_resubmit_with_a_secret_this_worker_cannot_resolve_submits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAO_TEST_SRC", raising=False)
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    state, verdict = failure("FAILED", "line 7: NVRM: Xid (PCI:0000:3b:00) on n2: 79, GPU has fallen off the bus")
    old = handle(sidecar_path=LAYOUT.sidecar_path, secret_refs={"HF_TOKEN": "env:TAO_TEST_SRC"})

    with pytest.raises(ValidationError, match="TAO_TEST_SRC, which is not set on the worker"):
        JobLifecycle(hook).resubmit(SENSOR_TI, old, read_record(hook, FIRST), state, verdict)
    assert (hook.submits, hook.staged_files) == ([], {})
    assert read_record(hook, FIRST).terminal_state is None, "no record says it was resubmitted"


@pytest.mark.parametrize(
    ("sinfo", "changes", "meta", "match"),
    [
        pytest.param(
            "n1|polar*|idle\nn2|polar*|down*\n",
            {"num_nodes": 2, "partition": "polar"},
            None,
            r"only 1 node\(s\) \(n1\) for a 2-node job",
            id="two-node-job-on-a-two-node-partition",
        ),
        pytest.param(
            "n1|gpu*|idle\nn2|gpu*|down*\nn3|debug|drain\n",
            {"num_nodes": 3, "partition": "gpu,debug"},
            None,
            r"partition gpu,debug only 2 node\(s\) \(n1, n3\) for a 3-node job",
            id="comma-partition-list-too-small",
        ),
        pytest.param(
            "n1|polar*|idle\nn2|polar*|down*\n",
            {"num_nodes": 2, "partition": "polar", "exclude_nodes": ["n1"]},
            None,
            r"avoiding n1,n2 .* only 0 node\(s\) \(none\)",
            id="earlier-exclusion-plus-this-one",
        ),
        pytest.param(
            "n1|polar*|idle\nn2|polar*|down*\n",
            {},
            '{"nodes": 2, "partition": "polar"}',
            r"for a 2-node job",
            id="shape-from-the-meta-file",
        ),
    ],
)
def test_resubmit_refuses_when_the_partition_would_be_too_small(
    sinfo: str, changes: dict[str, Any], meta: str | None, match: str
) -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.sinfo = sinfo
    if meta is not None:
        hook.files[LAYOUT.meta_path] = meta
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL")

    with pytest.raises(JobFailedError, match=match) as failed:
        JobLifecycle(hook).resubmit(SENSOR_TI, handle(**changes), read_record(hook, FIRST), state, verdict)

    assert failed.value.err_class == "ERR_INFRA"
    assert hook.submits == []
    assert JobLayout(BASE, RETRY_ID).record_path not in hook.files
    settled = read_record(hook, FIRST)
    assert (settled.terminal_state, settled.err_class) == (TaoState.ERROR, ErrClass.ERR_INFRA)
    assert "not resubmitted" in settled.transitions[-1].message
    assert sidecar_removals(hook) == [SETTLED_REMOVAL]


def test_resubmit_adopts_the_job_an_earlier_try_resubmitted() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.found = {RETRY_ID: ["501"]}
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL")

    new = JobLifecycle(hook).resubmit(SENSOR_TI, handle(), read_record(hook, FIRST), state, verdict)

    assert hook.submits == []
    assert (new.job_id, new.slurm_job_id, new.infra_retries) == (RETRY_ID, "501", 1)
    assert hook.submits == []  # the adopted job runs: only its exclusions are re-derived from the same evidence
    assert hook.released == [(f"{BASE}/logs", RETRY_ID, "501")]


@pytest.mark.parametrize("left", ["opened", "none"])
def test_an_adopted_resubmission_is_released_and_its_record_bound(left: str) -> None:
    """The sensor's earlier try was killed inside the resubmission's submission: the job is held and its record
    opened but bound to no job (or, killed earlier still, missing). The retry releases the job, creates its log
    directory and binds its record to it; nothing is submitted."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    if left == "opened":
        store(hook, record_of(RETRY_ID, None, retry_of=FIRST))
    hook.found = {RETRY_ID: ["501"]}
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL")

    new = JobLifecycle(hook).resubmit(SENSOR_TI, handle(), read_record(hook, FIRST), state, verdict)

    assert (new.slurm_job_id, hook.submits) == ("501", [])
    assert hook.released == [(f"{BASE}/logs", RETRY_ID, "501")]
    adopted = read_record(hook, RETRY_ID)
    assert (adopted.state, adopted.backend_ref, adopted.retry_of) == (TaoState.RUNNING, "501", FIRST)
    assert adopted.transitions[-1].source == "sensor"


def test_an_adopted_resubmission_that_already_ended_keeps_its_record() -> None:
    """An earlier try watched the resubmission to its end: adopting it again releases nothing held and leaves the
    settled record as it is."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    settled = record_of(RETRY_ID, TaoState.COMPLETE, retry_of=FIRST, slurm_id="501")
    store(hook, settled)
    hook.found = {RETRY_ID: ["501"]}
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL")

    JobLifecycle(hook).resubmit(SENSOR_TI, handle(), read_record(hook, FIRST), state, verdict)

    assert read_record(hook, RETRY_ID) == settled


def test_an_adopted_resubmission_keeps_the_nodes_it_excludes() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL")
    first = JobLifecycle(hook).resubmit(SENSOR_TI, handle(), read_record(hook, FIRST), state, verdict)
    assert first.exclude_nodes == ("n2",)
    hook.found = {RETRY_ID: ["501"]}

    again = JobLifecycle(hook).resubmit(SENSOR_TI, handle(), read_record(hook, FIRST), state, verdict)

    assert again.exclude_nodes == first.exclude_nodes


def test_a_second_resubmission_still_checks_the_partition_from_the_meta_file() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.files[LAYOUT.meta_path] = '{"nodes": 2, "partition": "polar"}'
    hook.sinfo = "n1|polar*|idle\nn2|polar*|down*\nn3|polar*|idle\n"
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL")
    # an older provider's handle: no num_nodes/partition, so the shape comes from the meta file
    retried = JobLifecycle(hook).resubmit(SENSOR_TI, handle(), read_record(hook, FIRST), state, verdict)
    assert (retried.job_dir, retried.exclude_nodes, retried.num_nodes) == (LAYOUT.job_dir, ("n2",), None)
    # the resubmitted job ran on n1,n3 and n3 failed too: only n1 is left for the 2-node job
    hook.sinfo = "n1|polar*|idle\nn2|polar*|down*\nn3|polar*|down*\n"
    hook.allocation = "n1\nn3\n"
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL", node_list="n[1,3]")

    with pytest.raises(JobFailedError, match="could never start"):
        JobLifecycle(hook).resubmit(SENSOR_TI, retried, read_record(hook, RETRY_ID), state, verdict)


def test_a_node_in_several_partitions_counts_once_in_the_allocation() -> None:
    """sinfo -a lists a node once per partition (hidden ones too): a 1-node job whose shape is known from nothing
    but its allocation is a 1-node job, and the partition's other node is enough to resubmit it."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.sinfo = "n1|polar_hidden|idle\nn2|polar_hidden|idle\nn1|polar*|idle\nn2|polar*|idle\n"
    hook.allocation = "n1\nn1\n"  # n1 of polar and of the hidden polar_hidden
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL", node_list="n1")

    new = JobLifecycle(hook).resubmit(
        SENSOR_TI, handle(partition="polar_hidden"), read_record(hook, FIRST), state, verdict
    )

    assert new.exclude_nodes == ("n1",)
    assert [s.extra_args for s in hook.submits] == [("--exclude=n1",)]


def test_a_refused_resubmission_settles_both_records() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.submit_error = SubmissionError("Requested node configuration is not available", rc=1)
    state, verdict = failure("NODE_FAIL", "State=NODE_FAIL")

    with pytest.raises(JobFailedError, match=r"was refused .*excluded nodes \(n2\)"):
        JobLifecycle(hook).resubmit(SENSOR_TI, handle(), read_record(hook, FIRST), state, verdict)

    assert read_record(hook, FIRST).terminal_state is TaoState.ERROR
    assert read_record(hook, RETRY_ID).terminal_state is TaoState.ERROR
    assert sidecar_removals(hook) == [SETTLED_REMOVAL]


# ---------------------------------------------------------------------- cancel, UNKNOWN, settle, log tails


@pytest.mark.parametrize(
    ("stored", "canceled"),
    [
        pytest.param(TaoState.RUNNING, True, id="running"),
        pytest.param(TaoState.COMPLETE, False, id="terminal-keeps-its-verdict"),
        pytest.param("missing", False, id="no-record"),
    ],
)
@pytest.mark.parametrize("side", ["sync", "async"])
def test_cancel_scancels_records_canceled_and_removes_the_sidecar(
    side: str, stored: TaoState | str, canceled: bool
) -> None:
    hook = LifecycleHook()
    if stored != "missing":
        store(hook, record_of(FIRST, stored))  # type: ignore[arg-type]
    before = hook.files.get(LAYOUT.record_path)
    lifecycle = JobLifecycle(hook)

    if side == "sync":
        lifecycle.cancel(handle(), source="sensor on_kill")
    else:
        asyncio.run(
            lifecycle.a_cancel(
                "500",
                FIRST,
                record_path=LAYOUT.record_path,
                sidecar_path=LAYOUT.sidecar_path,
                source="trigger on_kill",
            )
        )

    assert hook.cancels == [(["500"], FIRST)]
    assert sidecar_removals(hook) == [f"rm -f -- {LAYOUT.sidecar_path}"]
    if canceled:
        record = read_record(hook, FIRST)
        assert record.terminal_state is TaoState.CANCELED
        assert record.transitions[-1].source == ("sensor on_kill" if side == "sync" else "trigger on_kill")
    else:
        assert hook.files.get(LAYOUT.record_path) == before


@pytest.mark.parametrize("remove_sidecar", [True, False], ids=["vanished", "unrecognised"])
def test_mark_unknown(remove_sidecar: bool) -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))

    JobLifecycle(hook).mark_unknown(handle(), read_record(hook, FIRST), "gone", remove_sidecar=remove_sidecar)

    record = read_record(hook, FIRST)
    assert (record.terminal_state, record.transitions[-1].state, record.transitions[-1].message) == (
        None,
        TaoState.UNKNOWN,
        "gone",
    )
    assert sidecar_removals(hook) == ([f"rm -f -- {LAYOUT.sidecar_path}"] if remove_sidecar else [])


def test_mark_unknown_leaves_a_terminal_record_alone() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST, TaoState.COMPLETE))
    before = hook.files[LAYOUT.record_path]

    JobLifecycle(hook).mark_unknown(handle(), read_record(hook, FIRST), "gone", remove_sidecar=True)

    assert hook.files[LAYOUT.record_path] == before


def test_settle_keeps_the_first_verdict_and_removes_the_sidecar() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST, TaoState.CANCELED))

    record = JobLifecycle(hook).settle(handle(), read_record(hook, FIRST), TaoState.COMPLETE, message="late")

    assert record.terminal_state is TaoState.CANCELED
    assert read_record(hook, FIRST).terminal_state is TaoState.CANCELED
    assert sidecar_removals(hook) == [SETTLED_REMOVAL]


def test_require_record_names_the_missing_file() -> None:
    with pytest.raises(JobNotFoundError, match=LAYOUT.record_path):
        JobLifecycle(LifecycleHook()).require_record(handle())


def test_records_are_written_redacted() -> None:
    hook = LifecycleHook()
    record = mark(record_of(FIRST), TaoState.RUNNING, now=NOW, message="token tok-1f3a9c5e7b seen", source="x")

    JobLifecycle(hook).write_record(LAYOUT.record_path, record, ["tok-1f3a9c5e7b"])

    assert "tok-1f3a9c5e7b" not in hook.files[LAYOUT.record_path]
    assert json.loads(hook.files[LAYOUT.record_path])["job_id"] == FIRST


@pytest.mark.parametrize(
    ("text", "max_bytes", "expected"),
    [
        pytest.param("ab cd ef", 5, "cd ef", id="last-bytes"),  # a base64-only cut line would be withheld
        pytest.param("abc", 10, "abc", id="short-log"),
        pytest.param(None, 10, "", id="missing"),
        pytest.param("x secret-value y", 100, "x ${REDACTED} y", id="redacted"),
    ],
)
def test_log_tail(text: str | None, max_bytes: int, expected: str) -> None:
    hook = LifecycleHook()
    if text is not None:
        hook.files["/l/main.out"] = text

    assert JobLifecycle(hook).log_tail("/l/main.out", max_bytes, secrets=["secret-value"]) == expected


@pytest.mark.parametrize("rows_kept", range(1, 5))
def test_a_log_tail_that_starts_inside_a_key_block_withholds_its_rows(rows_kept: int) -> None:
    """The tail an error message or a failure summary quotes starts inside a key block (its BEGIN cut off, a row
    cut in two): no row nor piece of one is in it; what follows the block is, and a line says what was withheld."""
    rows = [f"MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ff{n:06d}" for n in range(4)]
    text = "\n".join(["epoch 1", "-----BEGIN " + "PRIVATE KEY-----", *rows, "-----END " + "PRIVATE KEY-----", "boom"])
    hook = LifecycleHook()
    hook.files["/l/main.out"] = text
    tail_bytes = len(text) - text.index(rows[-rows_kept]) - 7  # 7 bytes into a row

    tail = JobLifecycle(hook).log_tail("/l/main.out", tail_bytes)

    assert tail.split("\n")[-2:] == [REDACTED, "boom"]
    assert "withheld" in tail
    assert not [line for line in tail.split("\n") if any(line in row for row in rows)]


# ---------------------------------------------------------------------- continue_slice: a training over several slices

#: Slice 2 of the training whose first job is FIRST: its name with the slice number.
SLICE_2 = slice_job_id(FIRST, 2)
#: What the sensor task minted for the next slice before (the previous release's name, still adopted).
LEGACY_SLICE_2 = RETRY_ID
SLICE_USAGE = JobUsage(
    queue_seconds=2,
    elapsed_seconds=65,
    gpus=1,
    gpu_hours=0.0181,
    node_list="n1",
    exit_code=0,
    partition="gpu_preempt",
    time_limit_seconds=60,
)


def chain(**changes: Any) -> JobHandle:
    values: dict[str, Any] = {"max_continuations": 2, "checkpoint_globs": ["*.pth"], "time_hours": 1 / 60}
    return handle(**{**values, **changes})


def timed_out(native: str = "TIMEOUT") -> JobState:
    return state_from_native("500", native, source="sacct", exit_code=0, signal=0, node_list="n1")


class FakeClock:
    """A monotonic clock that moves only when the code under test sleeps (every sleep recorded)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def settling(hook: LifecycleHook, clock: FakeClock | None = None) -> JobLifecycle:
    """The lifecycle over ``hook`` whose settle windows run on a fake clock (no real waiting)."""
    clock = clock or FakeClock()
    return JobLifecycle(hook, clock=clock.monotonic, sleep=clock.sleep)


def test_a_slice_with_a_new_checkpoint_is_followed_by_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAO_TEST_SRC", "s3cr3t")
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.checkpoints = CommandResult(
        0, f"START\n1.5 {LAYOUT.results_dir}/e1.pth\n2.5 {LAYOUT.results_dir}/e2.pth\n", ""
    )
    old = chain(secret_refs={"HF_TOKEN": "env:TAO_TEST_SRC"})

    new = settling(hook).continue_slice(SENSOR_TI, old, read_record(hook, FIRST), timed_out(), SLICE_USAGE)

    assert hook.submits == [(LAYOUT.script_path, SLICE_2, f"{BASE}/logs", ("--export=ALL,TAO_SLURM_SLICE=2",))]
    assert list(hook.staged_files) == [LAYOUT.sidecar_path], "the ended slice's EXIT trap removed it"
    assert (new.job_id, new.slurm_job_id, new.retry_of, new.slice_number) == (SLICE_2, "501", FIRST, 2)
    assert (new.results_dir, new.script_path, new.infra_retries) == (old.results_dir, old.script_path, 0)
    assert new.slices == (
        {
            "job_id": FIRST,
            "slurm_job_id": "500",
            "state": "TIMEOUT",
            "queue_seconds": 2,
            "elapsed_seconds": 65,
            "gpu_hours": 0.0181,
            "partition": "gpu_preempt",
            "time_limit_seconds": 60,
            "checkpoint": f"{LAYOUT.results_dir}/e2.pth",
        },
    )
    ended = read_record(hook, FIRST)
    assert ended.terminal_state is TaoState.ERROR
    assert ended.transitions[-1].message == (
        f"slice 1 ended TIMEOUT after writing 2 checkpoint(s); slice 2 of at most 3 resumes from "
        f"{LAYOUT.results_dir}/e2.pth; continued as {SLICE_2}"
    )
    assert read_record(hook, SLICE_2).retry_of == FIRST


@pytest.mark.parametrize(
    ("changes", "listing", "message"),
    [
        pytest.param({}, "START\n", "the 1 min slice 1 ended TIMEOUT and wrote no checkpoint", id="no-checkpoint"),
        pytest.param({}, "NOSTART\n", "the 1 min slice 1 ended TIMEOUT and wrote no checkpoint", id="never-started"),
        pytest.param(
            {"slice_number": 3},
            "START\n1 /r/e9.pth\n",
            "max_continuations=2 is used up; the last checkpoint is /r/e9.pth",
            id="used-up",
        ),
    ],
)
def test_the_chain_stops_with_the_rule_and_its_fix(changes: dict[str, Any], listing: str, message: str) -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.checkpoints = CommandResult(0, listing, "")

    with pytest.raises(JobFailedError, match=re.escape(message)):
        settling(hook).continue_slice(SENSOR_TI, chain(**changes), read_record(hook, FIRST), timed_out(), None)

    assert hook.submits == []
    ended = read_record(hook, FIRST)
    assert (ended.terminal_state, ended.err_class) == (TaoState.ERROR, ErrClass.ERR_PROGRAM)
    assert SETTLED_REMOVAL in sidecar_removals(hook)


def test_a_next_slice_an_earlier_try_started_is_adopted() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.found[SLICE_2] = ["611"]
    hook.checkpoints = CommandResult(0, "START\n1 /r/e2.pth\n", "")

    new = settling(hook).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    assert (hook.submits, new.slurm_job_id, new.slice_number) == ([], "611", 2)
    assert hook.released == [(f"{BASE}/logs", SLICE_2, "611")]
    adopted = read_record(hook, SLICE_2)
    assert (adopted.state, adopted.backend_ref, adopted.retry_of) == (TaoState.RUNNING, "611", FIRST)


def test_a_held_next_slice_of_a_try_killed_inside_its_submission_is_released() -> None:
    """The sensor's earlier try opened the next slice's record and was killed after ``sbatch --hold``: the retry
    releases that slice, creates its log directory and binds its record; it submits no second slice."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    store(hook, record_of(SLICE_2, None, retry_of=FIRST))
    hook.found[SLICE_2] = ["611"]
    hook.checkpoints = CommandResult(0, "START\n1 /r/e2.pth\n", "")

    new = settling(hook).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    assert (hook.submits, new.slurm_job_id) == ([], "611")
    assert hook.released == [(f"{BASE}/logs", SLICE_2, "611")]
    adopted = read_record(hook, SLICE_2)
    assert (adopted.state, adopted.backend_ref) == (TaoState.RUNNING, "611")
    assert [t.state for t in adopted.transitions] == [TaoState.PENDING, TaoState.RUNNING]


@pytest.mark.parametrize("failing", [1, 3], ids=["first-listing", "a-listing-inside-the-settle-window"])
def test_a_checkpoint_listing_that_failed_decides_nothing(failing: int) -> None:
    """A failed ``find`` (EIO on the results directory), first or while the window lists again, is an error that
    names the command: never "no checkpoint", nothing settled, nothing submitted (the sensor's retry lists again)."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.checkpoints = [CommandResult(0, "START\n", "")] * (failing - 1) + [
        CommandResult(1, "START\n", "find: Input/output error")
    ]

    with pytest.raises(RemoteCommandError) as failed:
        settling(hook).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    assert hook.listings == failing
    assert (
        f"listing slice 1's checkpoints (find {LAYOUT.results_dir} -type f -name *.pth -newer "
        f"{LAYOUT.job_dir}/slices/500-<restart>.start) failed" in str(failed.value)
    )
    assert "Input/output error" in str(failed.value)
    assert hook.submits == []
    assert read_record(hook, FIRST).terminal_state is None


@pytest.mark.parametrize("shows_on", [2, 3], ids=["second-listing", "third-listing"])
def test_a_lagging_listing_that_shows_the_checkpoint_later_continues_the_chain(shows_on: int) -> None:
    """The login host's directory cache lags the node: the slice's checkpoint shows only on a later listing.
    Expected: the listing is repeated within the settle window and the chain goes on from that checkpoint."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.checkpoints = [CommandResult(0, "START\nWARNED\n", "")] * (shows_on - 1) + [
        CommandResult(0, f"START\nWARNED\n9.5 {LAYOUT.results_dir}/e3.pth\n", "")
    ]
    clock = FakeClock()

    new = settling(hook, clock).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    assert hook.listings == shows_on
    assert clock.slept == [jobs_module.CHECKPOINT_RETRY_S] * (shows_on - 1)
    assert [job_name for _, job_name, _, _ in hook.submits] == [SLICE_2]
    assert (new.job_id, new.slice_number, new.slices[-1]["checkpoint"]) == (SLICE_2, 2, f"{LAYOUT.results_dir}/e3.pth")


def test_a_listing_that_never_shows_a_checkpoint_ends_the_chain_naming_the_slice_and_the_interval() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.checkpoints = CommandResult(0, "START\n", "")
    clock = FakeClock()
    old = chain(checkpoint_interval="5 epoch")

    with pytest.raises(JobFailedError) as failed:
        settling(hook, clock).continue_slice(SENSOR_TI, old, read_record(hook, FIRST), timed_out(), SLICE_USAGE)

    window, every = jobs_module.CHECKPOINT_SETTLE_S, jobs_module.CHECKPOINT_RETRY_S
    assert hook.listings == int(window / every) + 1
    assert sum(clock.slept) == window
    message = (
        "the 1 min slice 1 ended TIMEOUT and wrote no checkpoint: lower the training's checkpoint interval (TAO: "
        "train.checkpoint_interval; the spec's checkpoint interval is 5 epoch) so it saves within a slice (this one "
        f"ran 1 min 5 s of its 1 min), or raise time_hours; no new checkpoint in {hook.listings} listing(s) over 30 s"
    )
    assert str(failed.value) == f"SLURM job 500: {message}"
    assert failed.value.err_class == "ERR_PROGRAM"
    assert read_record(hook, FIRST).transitions[-1].message == message
    assert hook.submits == []


def test_a_slice_preempted_before_its_first_checkpoint_says_so() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.checkpoints = CommandResult(0, "START\n", "")

    with pytest.raises(JobFailedError) as failed:
        settling(hook).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out("PREEMPTED"), None)

    assert "the 1 min slice 1 was preempted before its first checkpoint; no new checkpoint in 7 listing(s)" in str(
        failed.value
    )
    assert "lower the training's checkpoint interval" not in str(failed.value)
    assert hook.submits == []


class OutageHook(LifecycleHook):
    """A hook whose lookups by name fail ``failures`` times (slurmdbd down), then answer."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def find_jobs_by_name(
        self, job_name: str, *, all_hosts: bool = False, since: str = DEFAULT_SACCT_WINDOW
    ) -> list[str]:
        if self.failures:
            self.failures -= 1
            self.lookups.append(job_name)
            raise JobLookupError("looking up jobs by name failed (sacct exited 1)", evidence="sacct exited 1")
        return super().find_jobs_by_name(job_name, all_hosts=all_hosts, since=since)


def test_a_next_slice_lookup_that_fails_while_accounting_is_down_is_asked_again_until_it_answers() -> None:
    """slurmdbd is down when the slice has ended: the lookup of the next slice's name fails twice, then answers
    none. Expected: it is asked again every NEXT_JOB_LOOKUP_RETRY_S (never read as "no job" while it fails), and
    the chain goes on with one next slice."""
    hook = OutageHook(failures=2)
    store(hook, record_of(FIRST))
    hook.checkpoints = CommandResult(0, f"START\n1.5 {LAYOUT.results_dir}/e1.pth\n", "")
    clock = FakeClock()

    new = settling(hook, clock).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    retry = jobs_module.NEXT_JOB_LOOKUP_RETRY_S
    assert clock.slept[:2] == [retry, retry]
    assert [job_name for _, job_name, _, _ in hook.submits] == [SLICE_2]
    assert new.job_id == SLICE_2


def test_a_next_slice_lookup_that_fails_past_the_window_decides_nothing() -> None:
    """The outage outlasts NEXT_JOB_LOOKUP_S: the last failure is raised, nothing is submitted or settled."""
    hook = OutageHook(failures=1000)
    store(hook, record_of(FIRST))
    hook.checkpoints = CommandResult(0, f"START\n1.5 {LAYOUT.results_dir}/e1.pth\n", "")
    clock = FakeClock()

    with pytest.raises(JobLookupError, match="sacct exited 1"):
        settling(hook, clock).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    window, every = jobs_module.NEXT_JOB_LOOKUP_S, jobs_module.NEXT_JOB_LOOKUP_RETRY_S
    assert len(hook.lookups) == int(window / every) + 1
    assert sum(clock.slept) == window
    assert hook.submits == []
    assert read_record(hook, FIRST).terminal_state is None


def test_a_found_next_slice_is_adopted_without_waiting_out_the_settle_window() -> None:
    """An earlier try decided and started the next slice: the retry lists once and adopts it."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.found[SLICE_2] = ["611"]
    hook.checkpoints = CommandResult(0, "START\n", "")  # the checkpoint does not show (yet) on this host
    clock = FakeClock()

    new = settling(hook, clock).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    assert (hook.listings, clock.slept, hook.submits, new.slurm_job_id) == (1, [], [], "611")


def test_slices_are_named_after_the_training_and_numbered_whoever_watches() -> None:
    """Slice 3 of a chain whose slice 2 was watched by a sensor: named <first job>-s3, not after the sensor task."""
    hook = LifecycleHook()
    store(hook, record_of(SLICE_2, retry_of=FIRST, slurm_id="501"))
    hook.checkpoints = CommandResult(0, "START\n1 /r/e9.pth\n", "")
    second = chain(
        job_id=SLICE_2, slurm_job_id="501", record_path=JobLayout(BASE, SLICE_2).record_path, slice_number=2,
        slices=[{"job_id": FIRST, "slurm_job_id": "500", "state": "TIMEOUT", "checkpoint": "/r/e4.pth"}],
    )  # fmt: skip

    new = settling(hook).continue_slice(
        ti(2, task_id="another_sensor"), second, read_record(hook, SLICE_2), timed_out(), None
    )

    assert new.job_id == slice_job_id(FIRST, 3) == f"{FIRST}-s3"
    assert hook.lookups[0] == f"{FIRST}-s3"
    assert [job_name for _, job_name, _, _ in hook.submits] == [f"{FIRST}-s3"]


def test_a_next_slice_the_previous_release_named_after_the_sensor_is_still_adopted() -> None:
    """A chain running across the upgrade: the previous release's sensor started slice 2 under the name it minted
    from the sensor task, then died. The retry finds no job of the new name, finds ours of the old one and adopts
    it (released, its record bound); it submits no second slice 2."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.found[LEGACY_SLICE_2] = ["611"]
    hook.checkpoints = CommandResult(0, "START\n1 /r/e2.pth\n", "")

    new = settling(hook).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    assert hook.lookups == [SLICE_2, LEGACY_SLICE_2]
    assert (hook.submits, new.job_id, new.slurm_job_id, new.slice_number) == ([], LEGACY_SLICE_2, "611", 2)
    assert hook.released == [(f"{BASE}/logs", LEGACY_SLICE_2, "611")]
    assert read_record(hook, LEGACY_SLICE_2).backend_ref == "611"


def test_a_job_of_the_new_slice_name_is_adopted_without_asking_for_the_old_one() -> None:
    hook = LifecycleHook()
    store(hook, record_of(FIRST))
    hook.found = {SLICE_2: ["611"], LEGACY_SLICE_2: ["612"]}
    hook.checkpoints = CommandResult(0, "START\n1 /r/e2.pth\n", "")

    new = settling(hook).continue_slice(SENSOR_TI, chain(), read_record(hook, FIRST), timed_out(), None)

    assert (hook.lookups, new.job_id, new.slurm_job_id) == ([SLICE_2], SLICE_2, "611")


def test_an_unreadable_record_of_an_earlier_try_stops_the_try_before_anything_is_submitted() -> None:
    """Try 3: try 2's record exists but the storage answers EIO. Reading it as "no record" would fall back to
    the first try's (terminal) record and submit a second job beside try 2's; the try fails, retryable, instead."""
    hook = LifecycleHook()
    store(hook, record_of(FIRST, TaoState.ERROR))
    store(hook, record_of(tried(2), retry_of=FIRST))
    hook.unreadable.add(JobLayout(BASE, tried(2)).record_path)

    with pytest.raises(RemoteReadError, match=r"record of an earlier try .*Input/output error.*nothing was submitted"):
        JobLifecycle(hook).plan_attempt(ti(3), BASE)

    assert (hook.submits, hook.staged, hook.lookups) == ([], [], [])
    assert not issubclass(RemoteReadError, AirflowFailException)  # Airflow retries the task


class CancelOutageHook(LifecycleHook):
    """A hook whose scancel fails with each of ``failures`` in turn, then goes through; the hand-over of a cancel to
    the login host fails with each of ``hand_off_failures`` in turn, then is recorded."""

    def __init__(self, failures: list[Exception], hand_off_failures: Sequence[Exception] = ()) -> None:
        super().__init__()
        self.failures = failures
        self.hand_off_failures = list(hand_off_failures)
        self.tries = 0

    def cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        self.tries += 1
        if self.failures:
            raise self.failures.pop(0)
        super().cancel(job_ids, job_name=job_name)

    def hand_off_cancel(
        self, job_ids: Sequence[str], *, job_name: str, within_s: float, every_s: float, log_path: str | None
    ) -> None:
        if self.hand_off_failures:
            raise self.hand_off_failures.pop(0)
        super().hand_off_cancel(job_ids, job_name=job_name, within_s=within_s, every_s=every_s, log_path=log_path)


#: scancel on the login host, which cannot reach slurmctld.
CTLD_DOWN = RemoteCommandError("scancel failed: Unable to contact slurm controller (connect failure)")
#: The login host itself out of reach.
LOGIN_DOWN = SlurmConnectionError("cannot connect to the login host: Connection refused")


def run_cancel(hook: LifecycleHook, side: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user kill of the task watching the job, from a worker (sync) or the triggerer (async), on ``clock``."""
    lifecycle = JobLifecycle(hook, clock=clock.monotonic, sleep=clock.sleep)
    if side == "sync":
        lifecycle.cancel(handle(), source="sensor on_kill")
        return

    async def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    monkeypatch.setattr(jobs_module.asyncio, "sleep", sleep)
    asyncio.run(
        lifecycle.a_cancel(
            "500", FIRST, record_path=LAYOUT.record_path, sidecar_path=LAYOUT.sidecar_path, source="sensor on_kill"
        )
    )


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_cancel_slurmctld_does_not_answer_is_handed_to_the_login_host(
    side: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The soak's case: a user marked the task failed while the login host could not reach slurmctld for longer than
    Airflow's on_kill budget. Expected: at the first failed scancel, the cancel is handed to the login host (its job
    name, an hour's window, a log beside the record) and on_kill ends at once; the record says CANCELED and where
    the login host's log is, the sidecar goes. Before, on_kill tried for 20 s and gave up: the job ran on to
    COMPLETED and its record stayed open."""
    hook = CancelOutageHook([CTLD_DOWN])
    store(hook, record_of(FIRST))
    clock = FakeClock()

    run_cancel(hook, side, clock, monkeypatch)

    log = f"{BASE}/records/{FIRST}.cancel.log"
    assert (hook.tries, clock.slept, hook.cancels) == (1, [], [])
    assert hook.handed_off == [
        (["500"], FIRST, jobs_module.CANCEL_HANDOFF_S, jobs_module.CANCEL_HANDOFF_INTERVAL_S, log)
    ]
    record = read_record(hook, FIRST)
    assert record.terminal_state is TaoState.CANCELED
    assert "the login host tries again every 5 s for up to 60 min" in record.transitions[-1].message
    assert log in record.transitions[-1].message
    assert sidecar_removals(hook) == [f"rm -f -- {LAYOUT.sidecar_path}"]
    assert "cancel it by hand (scancel 500)" in caplog.text


class SlowScancelHook(CancelOutageHook):
    """scancel takes ``ticks`` turns of the event loop to fail (18 s against an unreachable slurmctld)."""

    def __init__(self, ticks: int) -> None:
        super().__init__([CTLD_DOWN])
        self.ticks = ticks

    async def a_cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        for _ in range(self.ticks):
            await asyncio.sleep(0)
        await super().a_cancel(job_ids, job_name=job_name)


@pytest.mark.parametrize("through_wait_for", [False, True], ids=["awaited", "wait_for"])
def test_an_on_kill_cancelled_again_by_the_triggerer_still_hands_the_cancel_over(through_wait_for: bool) -> None:
    """Airflow 3.3's triggerer cancels a trigger running on_kill again at each sync until it ends, while scancel
    against an unreachable slurmctld takes 18 s to fail. Here the caller is cancelled at every turn of the loop while
    scancel has not failed yet, awaited directly and through ``asyncio.wait_for`` as the triggerer does (under
    Python 3.11 ``wait_for`` runs on_kill as a task of its own and stops waiting at the second cancel).
    Expected: the cancel is handed over all the same, the record says CANCELED, the sidecar goes, and the caller
    is told it was cancelled once the steps ended (or has left). Before, the first cancel after on_kill began
    stopped it: nothing handed over, the record open, the sidecar left."""
    hook = SlowScancelHook(ticks=20)
    store(hook, record_of(FIRST))
    lifecycle = JobLifecycle(hook)

    async def on_kill() -> None:
        await lifecycle.a_cancel(
            "500", FIRST, record_path=LAYOUT.record_path, sidecar_path=LAYOUT.sidecar_path, source="trigger on_kill"
        )

    async def triggerer() -> int:
        killing = asyncio.ensure_future(asyncio.wait_for(on_kill(), 30) if through_wait_for else on_kill())
        cancels = 0
        while not killing.done():
            await asyncio.sleep(0)
            if not killing.done():
                killing.cancel("__airflow_user_action__")
                cancels += 1
        with pytest.raises(asyncio.CancelledError):
            await killing
        for _ in range(100):  # the steps' task, where the caller left it (3.11)
            if sidecar_removals(hook):
                break
            await asyncio.sleep(0)
        return cancels

    cancels = asyncio.run(triggerer())

    assert cancels >= 2
    assert [call[0] for call in hook.handed_off] == [["500"]]
    assert read_record(hook, FIRST).terminal_state is TaoState.CANCELED
    assert sidecar_removals(hook) == [f"rm -f -- {LAYOUT.sidecar_path}"]


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_cancel_while_the_login_host_is_out_of_reach_is_tried_again_until_it_goes_through(
    side: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The login host's sshd restarting: the cancel cannot be handed over either. Expected: tried again every
    CANCEL_RETRY_INTERVAL_S; once it goes through the record says CANCELED and the sidecar goes."""
    hook = CancelOutageHook([LOGIN_DOWN, LOGIN_DOWN])
    store(hook, record_of(FIRST))
    clock = FakeClock()

    run_cancel(hook, side, clock, monkeypatch)

    assert (hook.tries, hook.handed_off) == (3, [])
    assert clock.slept == [jobs_module.CANCEL_RETRY_INTERVAL_S] * 2
    assert hook.cancels == [(["500"], FIRST)]
    assert read_record(hook, FIRST).terminal_state is TaoState.CANCELED
    assert sidecar_removals(hook) == [f"rm -f -- {LAYOUT.sidecar_path}"]
    assert "is the login host restarting or out of reach?" in caplog.text


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_hand_over_that_fails_is_tried_again_like_the_cancel(side: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """scancel failed on the login host, then the connection dropped before the cancel was handed over. Expected:
    tried again; the second scancel goes through (nothing handed over), the record says CANCELED."""
    hook = CancelOutageHook([CTLD_DOWN], hand_off_failures=[LOGIN_DOWN])
    store(hook, record_of(FIRST))
    clock = FakeClock()

    run_cancel(hook, side, clock, monkeypatch)

    assert (hook.tries, hook.handed_off, hook.cancels) == (2, [], [(["500"], FIRST)])
    assert clock.slept == [jobs_module.CANCEL_RETRY_INTERVAL_S]
    record = read_record(hook, FIRST)
    assert record.terminal_state is TaoState.CANCELED
    assert "login host tries again" not in record.transitions[-1].message


@pytest.mark.parametrize(
    ("side", "window"), [("sync", jobs_module.CANCEL_RETRY_S), ("async", jobs_module.A_CANCEL_RETRY_S)]
)
def test_a_cancel_that_never_goes_through_raises_and_keeps_the_record_open(
    side: str, window: float, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The login host stays out of reach past the window (Airflow ends on_kill soon after). Expected: the last
    failure is raised and logged with what to do by hand; the record is not marked CANCELED and the sidecar stays
    (the job may still run and need it)."""
    hook = CancelOutageHook([LOGIN_DOWN] * 1000)
    store(hook, record_of(FIRST))
    before = hook.files[LAYOUT.record_path]
    clock = FakeClock()

    with pytest.raises(SlurmConnectionError, match="Connection refused"):
        run_cancel(hook, side, clock, monkeypatch)

    assert sum(clock.slept) >= window
    assert sum(clock.slept) < window + jobs_module.CANCEL_RETRY_INTERVAL_S
    assert hook.files[LAYOUT.record_path] == before
    assert (sidecar_removals(hook), hook.handed_off) == ([], [])
    assert "could not be cancelled" in caplog.text
    assert "scancel 500" in caplog.text


def test_a_refused_key_is_not_tried_again() -> None:
    hook = CancelOutageHook([SlurmAuthenticationError("the login host refused the key")])
    store(hook, record_of(FIRST))
    clock = FakeClock()

    with pytest.raises(SlurmAuthenticationError):
        JobLifecycle(hook, clock=clock.monotonic, sleep=clock.sleep).cancel(handle(), source="sensor on_kill")

    assert (hook.tries, clock.slept) == (1, [])
