"""One submission (:mod:`airflow_provider_tao_slurm.lifecycle.submission`): an unknown outcome is always
reconciled by exact name before anything else, a name is never carried by two of our jobs, and a
failed lookup is never "no job"."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from fakes import FakeSlurmHook, StagedFiles

from airflow_provider_tao_slurm.core.request import Continuation
from airflow_provider_tao_slurm.exceptions import (
    AmbiguousSubmissionError,
    JobLookupError,
    SubmissionError,
    SubmissionOutcomeUnknownError,
)
from airflow_provider_tao_slurm.hooks.replies import CommandResult
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW
from airflow_provider_tao_slurm.lifecycle import submission
from airflow_provider_tao_slurm.lifecycle.submission import find_job, submit_job

LOG = logging.getLogger("test")
UNKNOWN = SubmissionOutcomeUnknownError("sbatch of j: remote command did not finish within 30 s")
DOWN = JobLookupError("looking up jobs by name failed", evidence="squeue exited 1")


class Cluster(FakeSlurmHook):
    """``submit`` answers from ``replies``; lookups from ``lookups`` (a list of ids, or an exception; the last
    one repeats). ``calls`` has every submit, lookup and release in order."""

    def __init__(self, replies: list[Any], lookups: list[Any]) -> None:
        super().__init__()
        self.replies = list(replies)
        self.lookups_left = list(lookups)
        self.calls: list[str] = []

    def submit(
        self,
        script_path: str,
        job_name: str,
        *,
        log_dir: str,
        extra_args: Sequence[str] = (),
        stage: tuple[str, StagedFiles] | None = None,
        reconcile_timeout: float | None = None,
        reconcile_interval: float | None = None,
    ) -> str:
        self.calls.append("submit")
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return str(reply)

    def find_jobs_by_name(
        self, job_name: str, *, all_hosts: bool = False, since: str = DEFAULT_SACCT_WINDOW
    ) -> list[str]:
        assert all_hosts, "a reconcile asks every login host"
        self.calls.append("lookup")
        answer = self.lookups_left.pop(0) if len(self.lookups_left) > 1 else self.lookups_left[0]
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    def prepare_job_logs(self, log_dir: str, job_name: str, job_id: str) -> None:
        self.calls.append(f"release {job_id}")


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reconcile of 0.2 s asking every 0.05 s."""
    monkeypatch.setattr(submission, "RECONCILE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(submission, "RECONCILE_INTERVAL_S", 0.05)


def submit(cluster: Cluster) -> str:
    return submit_job(cluster, "/l/jobs/j/job.sbatch", "j", log_dir="/l/logs", log=LOG)  # type: ignore[arg-type]


def test_a_clear_reply_is_the_job() -> None:
    cluster = Cluster(["41"], [[]])

    assert submit(cluster) == "41"
    assert cluster.calls == ["submit"]


@pytest.mark.parametrize(
    ("lookups", "calls"),
    [
        pytest.param([["41"]], ["submit", "lookup", "release 41"], id="found-at-once"),
        pytest.param([[], [], ["41"]], ["submit", "lookup", "lookup", "lookup", "release 41"], id="appears-late"),
        pytest.param([DOWN, ["41"]], ["submit", "lookup", "lookup", "release 41"], id="after-a-failed-lookup"),
    ],
)
def test_an_unknown_outcome_is_reconciled_by_name_and_the_job_adopted(lookups: list[Any], calls: list[str]) -> None:
    """A slow sbatch (longer than the command timeout) went on after the reply was given up: the job is found,
    released and adopted; nothing is submitted again."""
    cluster = Cluster([UNKNOWN], lookups)

    assert submit(cluster) == "41"
    assert cluster.calls == calls


def test_no_job_after_the_reconcile_window_is_submitted_again_once() -> None:
    cluster = Cluster([UNKNOWN, "42"], [[]])

    assert submit(cluster) == "42"
    assert cluster.calls.count("submit") == 2


def test_twice_unknown_and_never_found_is_an_error_naming_the_job() -> None:
    cluster = Cluster([UNKNOWN, UNKNOWN], [[]])

    with pytest.raises(SubmissionError, match=r"unknown twice .*squeue --me --name=j"):
        submit(cluster)
    assert cluster.calls.count("submit") == 2


def test_a_lookup_that_keeps_failing_is_never_read_as_no_job() -> None:
    cluster = Cluster([UNKNOWN], [DOWN])

    with pytest.raises(JobLookupError):
        submit(cluster)
    assert cluster.calls.count("submit") == 1


def test_two_jobs_of_the_name_stop_everything() -> None:
    cluster = Cluster([UNKNOWN], [["41", "43"]])

    with pytest.raises(AmbiguousSubmissionError, match=r"2 SLURM jobs are named j \(41, 43\)"):
        submit(cluster)
    assert "release 41" not in cluster.calls


def test_a_refusal_is_not_reconciled() -> None:
    cluster = Cluster([SubmissionError("sbatch refused it: invalid partition")], [["41"]])

    with pytest.raises(SubmissionError, match="invalid partition"):
        submit(cluster)
    assert cluster.calls == ["submit"]


@pytest.mark.parametrize(("ids", "found"), [([], None), (["7"], "7")])
def test_find_job(ids: list[str], found: str | None) -> None:
    assert find_job(Cluster([], [ids]), "j") == found  # type: ignore[arg-type]


#: ``scontrol show config`` lines of a site that preempts, without and with send_user_signal (22.05's spelling).
PREEMPTING = "PreemptMode = REQUEUE\nPreemptType = preempt/partition_prio\nSlurmctldParameters = {}\n"


@pytest.mark.parametrize(
    ("config", "max_continuations", "signal", "said"),
    [
        (PREEMPTING.format("(null)"), 1, "USR1", "preempts jobs (PreemptType=preempt/partition_prio, PreemptMode="),
        (PREEMPTING.format("preempt_send_user_signal"), 1, "USR1", None),
        ("PreemptMode = OFF\nPreemptType = preempt/none\n", 1, "USR1", None),
        (None, 1, "USR2", "Whether preemption on cluster mini sends checkpoint_signal=USR2 is not known"),
        (PREEMPTING.format("(null)"), 1, None, None),  # no checkpoint_signal: the site is not asked
        (PREEMPTING.format("(null)"), 0, "USR1", None),  # not a continued training: no slice signal at all
    ],
    ids=["no-send-user-signal", "send-user-signal", "no-preemption", "unreadable", "no-signal", "not-continued"],
)
def test_a_continued_training_hears_once_when_preemption_will_not_send_its_signal(
    config: str | None, max_continuations: int, signal: str | None, said: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    hook = FakeSlurmHook()
    hook.handlers.append(
        lambda command: CommandResult(0 if config else 1, config or "", "") if "scontrol" in command else None
    )
    continuation = Continuation(max_continuations, ("*.pth",), signal, 60)
    with caplog.at_level(logging.WARNING):
        submission.note_unsignalled_preemption(hook, continuation, logging.getLogger("task"))  # type: ignore[arg-type]
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == (1 if said else 0)  # once, and only where there is something to say
    assert said is None or said in messages[0]
    assert len(hook.commands) == (1 if max_continuations and signal else 0)
