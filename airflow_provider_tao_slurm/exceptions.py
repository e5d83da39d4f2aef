"""Typed exceptions of the provider, all in one module.

Every message says what failed and what to do about it, and never contains a secret value.
The pure ``core`` layer raises these too; the only thing taken from Airflow is the
:class:`~airflow.sdk.exceptions.AirflowFailException` base of the errors that retrying cannot fix.

Which errors burn a retry:

- **Fail at once, no retry** (subclasses of ``AirflowFailException``): bad input and refused limits
  (:class:`ValidationError` and its subclasses, among them a multi-node job without its NCCL probe
  result and bad connection settings, :class:`ConnectionConfigError`), :class:`TemplateRenderError`,
  :class:`SecretLeakError`, an unknown or changed host key (:class:`HostKeyError`), refused
  credentials (:class:`SlurmAuthenticationError`), duplicate jobs that need a person
  (:class:`AmbiguousSubmissionError`) and a job that failed as a program error
  (:class:`ProgramFailedError`: its program would fail the same way again).
- **Retryable** (Airflow's ``retries`` apply): everything else, e.g. no login host reachable,
  a dropped connection, the controller or accounting down (:class:`JobLookupError`), ``sbatch``
  refusing a job (often transient: "Socket timed out"), a job that failed for the infrastructure
  once its resubmissions are used up, a failed conversion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException


class TaoSlurmError(Exception):
    """Base class of every error raised by this provider."""


class SubmissionStopped(KeyboardInterrupt):
    """A kill (SIGTERM) reached ``SbatchSubmitOperator.on_kill`` while it submitted.

    Raised from ``on_kill`` so that the submission stops where it is and is undone as a Ctrl-C's is (the job
    of that name cancelled, its secret sidecar removed); a :class:`KeyboardInterrupt`, so that nothing on the
    way takes it for an ordinary error to retry.
    """


# --- bad input: raised before anything reaches the cluster -------------------------------------


class ValidationError(TaoSlurmError, ValueError, AirflowFailException):
    """A user-supplied value is invalid. The message names the parameter and the fix."""


class ImageReferenceError(ValidationError):
    """An image reference is malformed, hostile, or not allowed where it was given."""


class StoragePathError(ValidationError):
    """A dataset or results path cannot be resolved to a cluster path."""


class ResourceError(ValidationError):
    """A resource request (GPUs, nodes, CPUs, time) is impossible or over a limit."""


class TemplateRenderError(TaoSlurmError, AirflowFailException):
    """An sbatch template could not be rendered (unknown or leftover placeholder)."""


class SecretLeakError(TaoSlurmError, AirflowFailException):
    """Literal credential material was found where it must never be written.

    :param findings: ``(line_number, name)`` pairs; names only, never values.
    """

    def __init__(self, message: str, findings: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.findings = list(findings)


class RecordError(TaoSlurmError):
    """A job record operation is invalid (e.g. an impossible state transition)."""


class UnknownStateError(TaoSlurmError):
    """SLURM reported a state this provider does not know; the raw text is kept."""


# --- talking to the cluster ----------------------------------------------------------------------


class SlurmConnectionError(TaoSlurmError):
    """No login host could be reached.

    :param failures: ``(host, reason)`` for every host that was tried, in order.
    """

    def __init__(self, message: str, failures: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)


class SlurmAuthenticationError(SlurmConnectionError, AirflowFailException):
    """The login host refused our credentials."""


class HostKeyError(SlurmConnectionError, AirflowFailException):
    """The login host's key is unknown or changed; host keys are verified by default."""


class KeyFilePermissionError(ValidationError):
    """The private key file is readable by group or others (``chmod 600`` fixes it)."""


class ConnectionConfigError(ValidationError):
    """The connection (or the ``SLURM_*`` environment) is missing a setting or has a bad one."""


class RemoteCommandError(TaoSlurmError):
    """A command on the login host exited non-zero.

    :param rc: exit status; ``stderr`` is kept (already redacted) for diagnosis.
    """

    def __init__(self, message: str, rc: int | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.rc = rc
        self.stderr = stderr


class RemoteReadError(RemoteCommandError):
    """Reading a remote file failed for another reason than its absence (I/O error, stale handle, permission).

    Never read as "no such file": the file may exist, and a caller that took the failure for a
    missing file would overwrite, resubmit or report on what it never saw.

    :param path: the file that could not be read.
    """

    def __init__(self, message: str, path: str, rc: int | None = None, stderr: str = "") -> None:
        super().__init__(message, rc=rc, stderr=stderr)
        self.path = path


class CommandTimeoutError(RemoteCommandError):
    """A remote command did not finish within its timeout: it may still be running on the login host.

    Never read as "the command failed": whatever it was doing (an sbatch) may complete after the reply
    was given up.
    """


class JobLookupError(RemoteCommandError):
    """A scheduler query (squeue, sacct) failed: it says nothing about whether a job exists.

    Never read as "no such job": no code path submits again because of it.

    :param evidence: what failed (the tool, its exit status, its stderr), for the task log.
    """

    def __init__(self, message: str, evidence: str = "", rc: int | None = None) -> None:
        super().__init__(message, rc=rc, stderr=evidence)
        self.evidence = evidence


class StatusQueryError(JobLookupError):
    """A batched status poll answered for some jobs only.

    :param states: the states that were answered (job id -> state), to be used as usual.
    :param unanswered: the job ids no query could speak for; they are neither running nor gone.
    """

    def __init__(self, message: str, states: Mapping[str, Any], unanswered: Sequence[str], evidence: str = "") -> None:
        super().__init__(message, evidence=evidence)
        self.states = dict(states)
        self.unanswered = list(unanswered)


class SubmissionError(RemoteCommandError):
    """``sbatch`` refused the job (bad partition, account, time limit, ...)."""


class SubmissionOutcomeUnknownError(RemoteCommandError):
    """An ``sbatch`` whose outcome is unknown.

    It timed out, the connection dropped, its reply had no job id, or the job exists but could not be
    checked for a twin or released.

    The job may exist: it is looked up by its exact name before anything else happens.

    :param job_id: the id the reply named, when it named one.
    """

    def __init__(self, message: str, job_id: str | None = None, rc: int | None = None, stderr: str = "") -> None:
        super().__init__(message, rc=rc, stderr=stderr)
        self.job_id = job_id


class AmbiguousSubmissionError(TaoSlurmError, AirflowFailException):
    """After an unclear ``sbatch`` reply, more than one job carries our exact job name."""

    def __init__(self, message: str, job_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.job_ids = list(job_ids)


class JobNotFoundError(TaoSlurmError):
    """Neither ``squeue`` nor ``sacct`` knows the job after the grace window."""


class MissingPathsError(TaoSlurmError):
    """One or more required paths do not exist on the cluster; all of them are listed."""

    def __init__(self, message: str, missing: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)


class ImageConversionError(TaoSlurmError):
    """Converting an image to ``.sqsh`` failed or produced an invalid file."""


class NcclProbeError(TaoSlurmError):
    """The NCCL all-reduce probe could not run, or no candidate environment made it pass."""


class PreflightError(TaoSlurmError):
    """One or more preflight checks failed; every problem is listed with its fix."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class JobFailedError(TaoSlurmError):
    """The SLURM job ended in a failure state."""

    def __init__(self, message: str, err_class: str | None = None) -> None:
        super().__init__(message)
        self.err_class = err_class


class ProgramFailedError(JobFailedError, AirflowFailException):
    """The job failed as a program error (``ERR_PROGRAM``): a retry cannot fix it.

    The task fails without using its retries (it would show the same lines and fail the same way);
    retries stay for what a retry can fix: the infrastructure and the connection.
    """


def job_failed(message: str, err_class: str | None) -> JobFailedError:
    """Build the error of a failed job: a program error fails the task without its retries."""
    if err_class == "ERR_PROGRAM":
        return ProgramFailedError(message, err_class=err_class)
    return JobFailedError(message, err_class=err_class)


class ConnectionLostError(SlurmConnectionError):
    """The SSH connection dropped while a command ran: it may or may not have taken effect."""
