"""The previous release's public names (issue 42, item 8): each still works, does what its replacement
does, and warns that it goes in the next release."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_tao_slurm.core import commands, partitions, resources
from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.exceptions import ConnectionLostError, ResourceError
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.lifecycle import submission

SINFO = "polar*|4:00:00|gpu:a100:4(S:0-1)\nscratch|infinite|gpu:h100:8\ncpu|7-00:00:00|(null)\n"
GOES = r"is deprecated and will be removed in the next release; use airflow_provider_tao_slurm\."
LOG = logging.getLogger("test")


def quietly(name: str, module: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(module, name)


def test_commands_parse_sinfo_partitions_is_the_partitions_parser() -> None:
    with pytest.warns(DeprecationWarning, match=rf"core\.commands\.parse_sinfo_partitions {GOES}core\.partitions"):
        old = commands.parse_sinfo_partitions(SINFO)
    assert old == partitions.parse_sinfo_partitions(SINFO)


def test_commands_partition_is_the_partition_class() -> None:
    with pytest.warns(DeprecationWarning, match=rf"core\.commands\.Partition {GOES}core\.partitions\.Partition"):
        from airflow_provider_tao_slurm.core.commands import Partition
    assert Partition is partitions.Partition
    assert Partition("polar", 4.0, True) == partitions.Partition("polar", 4.0, True)


def test_resources_partition_limit_is_the_partition_class() -> None:
    with pytest.warns(DeprecationWarning, match=rf"core\.resources\.PartitionLimit {GOES}core\.partitions\.Partition"):
        partition_limit = resources.PartitionLimit  # type: ignore[attr-defined]
    assert partition_limit is partitions.Partition
    assert partition_limit("polar", 4.0, True).describe() == "polar (4 h, no GPUs)"


@pytest.mark.parametrize(("hours", "refused"), [(3.5, False), (5.0, True)])
def test_resources_check_partition_limits_is_the_partitions_check(hours: float, refused: bool) -> None:
    known = [quietly("PartitionLimit", resources)("polar", 4.0, True), partitions.Partition("long", None)]
    results = []
    for check, warns in ((resources.check_partition_limits, True), (partitions.check_partition_limits, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check(hours, ("polar",), known)
                results.append(None)
            except ResourceError as exc:
                results.append(str(exc))
        assert any(issubclass(w.category, DeprecationWarning) for w in caught) is warns
    assert results[0] == results[1]
    assert (results[0] is not None) is refused


def test_unknown_names_still_fail() -> None:
    with pytest.raises(AttributeError):
        commands.no_such_builder  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError):
        resources.NoSuchLimit  # type: ignore[attr-defined]  # noqa: B018


def hook(monkeypatch: pytest.MonkeyPatch, lookups: list[list[str]], calls: list[str]) -> SlurmHook:
    """A hook whose sbatch round trip drops the connection and whose lookups answer ``lookups`` in turn."""
    made = SlurmHook(settings=ClusterSettings(hosts=("login1.example.org",), user="alice", results_dir="/l"))
    answers = iter(lookups)

    def run(command: str, **_: Any) -> Any:
        calls.append("sbatch")
        raise ConnectionLostError("the connection dropped before the reply")

    def find(job_name: str, *, all_hosts: bool = False, **_: Any) -> list[str]:
        calls.append(f"lookup {job_name}")
        return next(answers, ["41"])

    monkeypatch.setattr(made, "run", run)
    monkeypatch.setattr(made, "find_jobs_by_name", find)
    monkeypatch.setattr(made, "prepare_job_logs", lambda log_dir, job_name, job_id: calls.append(f"release {job_id}"))
    return made


def test_hook_reconcile_by_name_is_the_lifecycles_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    slurm = hook(monkeypatch, [[], ["41"], [], ["41"]], calls)
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"reconcile_by_name {GOES}lifecycle\.submission"):
        old = slurm.reconcile_by_name("j", timeout=5, interval=0.01)
    assert old == submission.reconcile(slurm, "j", LOG, timeout=5, interval=0.01) == "41"
    assert calls == ["lookup j", "lookup j"] * 2
    with pytest.warns(AirflowProviderDeprecationWarning):
        assert slurm.reconcile_by_name("gone", timeout=0, interval=0) == "41"


def test_hook_submit_with_the_reconcile_arguments_is_the_lifecycles_submission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    slurm = hook(monkeypatch, [[], ["41"], [], ["41"]], calls)
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"reconcile_interval {GOES}lifecycle\.submission"):
        old = slurm.submit("/l/jobs/j.sbatch", "j", log_dir="/l/logs", reconcile_timeout=5, reconcile_interval=0.01)
    new = submission.submit_job(
        slurm, "/l/jobs/j.sbatch", "j", log_dir="/l/logs", log=LOG, reconcile_timeout=5, reconcile_interval=0.01
    )
    assert old == new == "41"
    assert calls == ["sbatch", "lookup j", "lookup j", "release 41"] * 2
