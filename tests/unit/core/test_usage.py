"""Cost and timing from accounting: the sacct line, its parser and the summary sentence."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.usage import USAGE_FIELDS, JobUsage, parse_usage, usage_command
from airflow_provider_tao_slurm.exceptions import ValidationError

ROW = "{id}|2026-12-03T06:00:00|{start}|2026-12-03T07:02:10|{elapsed}|{tres}|{nodes}|{exit}|{partition}|{limit}"


def row(
    job: str = "812",
    start: str = "2026-12-03T06:00:12",
    elapsed: str = "3718",
    tres: str = "billing=16,cpu=16,gres/gpu=8,mem=64G,node=2",
    nodes: str = "n[1-2]",
    exit_code: str = "0:0",
    partition: str = "",
    limit: str = "",
) -> str:
    return ROW.format(
        id=job, start=start, elapsed=elapsed, tres=tres, nodes=nodes, exit=exit_code, partition=partition, limit=limit
    )


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        pytest.param(row(), JobUsage(12, 3718, 8, 8.2622, "n[1-2]", 0), id="two-nodes-eight-gpus"),
        pytest.param(
            row(tres="cpu=1,gres/gpu:h100=1,gres/gpu=1,mem=1G,node=1", nodes="n2", exit_code="3:0"),
            JobUsage(12, 3718, 1, 1.0328, "n2", 3),
            id="typed-gpu-failed",
        ),
        pytest.param(row(tres="cpu=4,mem=7200M,node=1"), JobUsage(12, 3718, 0, 0.0, "n[1-2]", 0), id="cpu-only"),
        pytest.param(
            row(start="Unknown", elapsed="0", nodes="None assigned", exit_code="0:0"),
            JobUsage(None, 0, 8, 0.0, None, 0),
            id="cancelled-while-pending",
        ),
        pytest.param(row(partition="gpu_preempt", limit="240"),
                     JobUsage(12, 3718, 8, 8.2622, "n[1-2]", 0, "gpu_preempt", 14400), id="partition-it-ran-on"),
        pytest.param(row(partition="gpu", limit="UNLIMITED"), JobUsage(12, 3718, 8, 8.2622, "n[1-2]", 0, "gpu"),
                     id="unlimited"),
        pytest.param(row(elapsed=""), None, id="placeholder-row"),
        pytest.param(row(job="813"), None, id="another-job"),
        pytest.param("", None, id="no-row"),
        pytest.param(f"{row(job='812')}\n{row(job='813', elapsed='1')}", JobUsage(12, 3718, 8, 8.2622, "n[1-2]", 0),
                     id="first-matching-row"),
    ],
)  # fmt: skip
def test_parse_usage(stdout: str, expected: JobUsage | None) -> None:
    assert parse_usage(stdout, "812") == expected


def test_the_query_is_one_quoted_sacct_line() -> None:
    assert usage_command("812") == f"sacct -X -n -P -j 812 -o {USAGE_FIELDS} --starttime=now-400days"
    with pytest.raises(ValidationError):
        usage_command("812; rm -rf ~")


@pytest.mark.parametrize(
    ("usage", "line"),
    [
        (
            JobUsage(12, 3718, 8, 8.2622, "n[1-2]", 0),
            "SLURM job 812 COMPLETE (COMPLETED): queued 12 s, ran 1 h 1 min on n[1-2], 8 GPU(s) = 8.2622 GPU hours, "
            "exit code 0",
        ),
        (
            JobUsage(None, 0, 1, 0.0, None, None),
            "SLURM job 812 COMPLETE (COMPLETED): never started, ran 0 s, 1 GPU(s) = 0 GPU hours",
        ),
        (
            JobUsage(75, 95, 1, 0.0264, "n1", 1),
            "SLURM job 812 COMPLETE (COMPLETED): queued 1 min 15 s, ran 1 min 35 s on n1, 1 GPU(s) = 0.0264 GPU hours, "
            "exit code 1",
        ),
    ],
)
def test_summary_line(usage: JobUsage, line: str) -> None:
    assert usage.summary("812", "COMPLETE (COMPLETED)") == line
