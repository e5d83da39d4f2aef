"""The earliest start: a continued training naming several partitions, each slice on the one that takes it first."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest

from airflow_provider_tao_slurm.core.continuation import SliceScript, cap_time_limit
from airflow_provider_tao_slurm.core.layout import JobLayout
from airflow_provider_tao_slurm.core.partitions import (
    Partition,
    check_partition_limits,
    parse_sinfo_partitions,
    slice_hours,
)
from airflow_provider_tao_slurm.core.request import Continuation
from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch
from airflow_provider_tao_slurm.exceptions import ResourceError, ValidationError

KNOWN = [
    Partition("preemptible", 4.0, gpus_per_node=8),
    Partition("regular", 24.0, gpus_per_node=8),
    Partition("open", None, gpus_per_node=8),
]
LAYOUT = JobLayout("/lustre/proj/results", "tao-dag.train-0123456789abcdef")
SPEC = SbatchSpec(
    job_name=LAYOUT.job_id,
    partition="preemptible,regular",
    num_nodes=1,
    gpus_per_node=8,
    cpus_per_task=16,
    time="12:00:00",
    timeout_seconds=41040,
    log_dir=LAYOUT.log_dir,
    job_dir=LAYOUT.job_dir,
    image="/lustre/proj/images/tao.sqsh",
    command="classification_pyt train",
    exit_code_file=LAYOUT.exit_code_path,
)
CONTINUED = Continuation(max_continuations=5, checkpoint_globs=("*.pth",), checkpoint_signal=None, grace_seconds=600)


@pytest.mark.parametrize(
    ("time_hours", "partitions", "expected"),
    [
        pytest.param(12.0, ("preemptible", "regular"), {"preemptible": 4.0, "regular": 12.0}, id="longest-on-regular"),
        pytest.param(30.0, ("regular", "open"), {"regular": 24.0, "open": 30.0}, id="unlimited-partition"),
        pytest.param(4.0, ("preemptible", "regular"), None, id="every-partition-allows-it"),
        pytest.param(12.0, ("regular",), None, id="one-partition"),
    ],
)
def test_each_partition_gives_its_own_slice(
    time_hours: float, partitions: tuple[str, ...], expected: dict[str, float] | None
) -> None:
    assert slice_hours(time_hours, partitions, KNOWN) == expected


def test_a_continued_training_is_refused_only_for_what_no_partition_can_run() -> None:
    check_partition_limits(12.0, ("preemptible", "regular"), KNOWN, continued=True)
    with pytest.raises(ResourceError) as refused:
        check_partition_limits(30.0, ("preemptible", "regular"), KNOWN, continued=True)
    assert str(refused.value) == (
        "time_hours=30 (1 d 6 h) is the longest slice of this continued training, but none of its partitions allows "
        "it (preemptible 4 h, regular 1 d); each slice takes the limit of the partition it starts on: lower "
        "time_hours to at most 24 (1 d), or add a partition with a longer limit"
    )


def test_single_partition_and_plain_jobs_keep_the_strict_check() -> None:
    with pytest.raises(ResourceError, match="partition preemptible allows at most 4 h"):
        check_partition_limits(12.0, ("preemptible", "regular"), KNOWN)
    with pytest.raises(ResourceError, match="partition preemptible allows at most 4 h"):
        check_partition_limits(12.0, ("preemptible",), KNOWN, continued=True)


@pytest.mark.parametrize(
    ("slices", "limit", "grace"),
    [
        pytest.param({"preemptible": 1 / 60, "regular": 0.05}, "00:03:00", 18, id="three-minute-longest"),
        pytest.param({"preemptible": 4.0, "regular": 12.0}, "12:00:00", 600, id="at-most-10-min"),
    ],
)
def test_the_slice_takes_its_partitions_limit_and_its_warning(slices: dict[str, float], limit: str, grace: int) -> None:
    """SLURM warns as for the longest slice; each slice's batch shell takes its own from the limit it got."""
    script = CONTINUED.slice_script(LAYOUT, slices)
    assert script is not None
    assert (script.partition_limit, script.grace_seconds, script.grace_from_limit) == (limit, grace, True)
    plain = CONTINUED.slice_script(LAYOUT)
    assert plain is not None
    assert (plain.partition_limit, plain.grace_seconds, plain.grace_from_limit) == (None, 600, False)


def test_a_given_grace_must_fit_the_shortest_slice() -> None:
    given = replace(CONTINUED, grace_seconds=90, grace_given=True)
    script = given.slice_script(LAYOUT, {"preemptible": 4.0, "regular": 12.0})
    assert script is not None
    assert (script.grace_seconds, script.grace_from_limit) == (90, False), "a given warning is every slice's"
    with pytest.raises(ValidationError, match=r"less than the slice \(60 s\)"):
        given.slice_script(LAYOUT, {"preemptible": 1 / 60, "regular": 12.0})


def _slice(partition_limit: str | None) -> SliceScript:
    return SliceScript(
        slices_dir=LAYOUT.slices_dir, grace_seconds=600, results_dir=LAYOUT.results_dir, partition_limit=partition_limit
    )


def test_the_script_asks_no_time_and_lowers_a_longer_limit() -> None:
    script = render_sbatch(replace(SPEC, slice=_slice("12:00:00")))
    assert "#SBATCH --time" not in script
    assert "#SBATCH --signal=B:USR1@600" in script
    assert cap_time_limit("12:00:00") in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    plain = render_sbatch(replace(SPEC, slice=_slice(None)))
    assert "#SBATCH --time=12:00:00" in plain
    assert "scontrol update" not in plain


def test_the_cap_is_the_jobs_own_and_quoted() -> None:
    assert cap_time_limit("1-00:00:00") == 'scontrol update "JobId=${SLURM_JOB_ID}" TimeLimit=1-00:00:00'
    script = render_sbatch(replace(SPEC, slice=_slice("1-00:00:00")))
    assert 'if tao_slurm_refused=$(scontrol update "JobId=${SLURM_JOB_ID}" TimeLimit=1-00:00:00 2>&1); then' in script
    assert "    TAO_SLURM_OWN_LIMIT=86400\n" in script


def test_a_capped_slice_runs_its_program_under_the_timeout_the_shell_may_shorten() -> None:
    capped = render_sbatch(replace(SPEC, slice=_slice("12:00:00")))
    assert 'timeout "${TAO_SLURM_TIMEOUT}" bash -c' in capped
    assert "TAO_SLURM_TIMEOUT=" in capped
    plain = render_sbatch(replace(SPEC, slice=_slice(None)))
    assert "TAO_SLURM_TIMEOUT" not in plain
    assert "TAO_SLURM_OWN_LIMIT" not in plain


def test_a_partitions_default_time_is_what_a_job_without_time_gets() -> None:
    known, _ = parse_sinfo_partitions(
        "preemptible|4:00:00|gpu:8|up|64|512000|all|NO|n/a\n"
        "regular|1-00:00:00|gpu:8|up|64|512000|all|NO|2:00:00\n"
        "odd|1:00:00|gpu:8|up|64|512000|all|NO|soon\n"
    )
    by_name = {p.name: p for p in known}
    assert (by_name["preemptible"].default_time_hours, by_name["preemptible"].job_limit_hours) == (None, 4.0)
    assert (by_name["regular"].default_time_hours, by_name["regular"].job_limit_hours) == (2.0, 2.0)
    assert by_name["odd"].problem == "sinfo printed the default time 'soon', not a SLURM time"
    assert slice_hours(12.0, ("preemptible", "regular"), known) == {"preemptible": 4.0, "regular": 2.0}
