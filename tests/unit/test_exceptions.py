"""Which provider errors burn an Airflow retry: the ones retrying cannot fix fail the task at once."""

from __future__ import annotations

import inspect

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao_slurm import exceptions

NOT_RETRYABLE = {
    "ValidationError",
    "ImageReferenceError",
    "StoragePathError",
    "ResourceError",
    "KeyFilePermissionError",
    "ConnectionConfigError",
    "TemplateRenderError",
    "SecretLeakError",
    "SlurmAuthenticationError",
    "HostKeyError",
    "AmbiguousSubmissionError",
    "ProgramFailedError",
}
CLASSES = {
    name: cls
    for name, cls in vars(exceptions).items()
    if inspect.isclass(cls) and issubclass(cls, exceptions.TaoSlurmError)
}


def test_the_table_covers_real_classes() -> None:
    assert set(CLASSES) >= NOT_RETRYABLE
    assert set(CLASSES) - NOT_RETRYABLE, "some errors stay retryable"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_only_errors_retrying_cannot_fix_skip_the_retries(name: str) -> None:
    cls = CLASSES[name]
    assert issubclass(cls, AirflowFailException) is (name in NOT_RETRYABLE)
    assert issubclass(cls, exceptions.TaoSlurmError)


@pytest.mark.parametrize("name", sorted(NOT_RETRYABLE))
def test_the_module_docstring_names_every_error_that_fails_at_once(name: str) -> None:
    doc = exceptions.__doc__ or ""
    assert f":class:`{name}`" in doc or issubclass(CLASSES[name], exceptions.ValidationError)


def test_bad_input_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="time_hours"):
        raise exceptions.ResourceError("time_hours=5 is over the limit")


@pytest.mark.parametrize(("err_class", "fails_at_once"), [("ERR_PROGRAM", True), ("ERR_INFRA", False), (None, False)])
def test_a_failed_job_uses_the_retries_only_when_a_retry_can_help(err_class: str | None, fails_at_once: bool) -> None:
    error = exceptions.job_failed("SLURM job 7 failed", err_class)

    assert isinstance(error, exceptions.JobFailedError)
    assert error.err_class == err_class
    assert isinstance(error, AirflowFailException) is fails_at_once
