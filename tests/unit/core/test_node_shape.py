"""Sites and users as they are (issue 42, items 2, 12 and 13): partition state and access, node CPUs and memory.

sinfo's availability, CPUs, memory, AllowGroups and RootOnly columns are read with the time limit and
GRES; the automatic conversion partition is a usable one (the others named with why); CPUs per task
default from the node shape and a task no node can hold is refused before sbatch; durations read
``1 min``, never ``0.0166667 h``.
"""

from __future__ import annotations

import re

import pytest

from airflow_provider_tao_slurm.core.continuation import continuation_verdict
from airflow_provider_tao_slurm.core.partitions import (
    NodeShape,
    Partition,
    check_partition_limits,
    choose_partitions,
    cpu_partition,
    fit_gpus,
    parse_sinfo_partitions,
    skipped_cpu_partitions,
)
from airflow_provider_tao_slurm.core.resources import (
    DEFAULT_CPUS_PER_TASK,
    build_resources,
    default_cpus_per_task,
    format_duration,
)
from airflow_provider_tao_slurm.core.states import pending_hint
from airflow_provider_tao_slurm.exceptions import ResourceError


@pytest.mark.parametrize(
    ("hours", "text"),
    [
        pytest.param(45 / 3600, "45 s", id="seconds"),
        pytest.param(1 / 60, "1 min", id="one-minute"),
        pytest.param(0.5, "30 min", id="half-hour"),
        pytest.param(1.5 / 60, "1 min 30 s", id="minute-and-a-half"),
        pytest.param(1.0, "1 h", id="one-hour"),
        pytest.param(1.5, "1 h 30 min", id="hour-and-a-half"),
        pytest.param(3.8, "3 h 48 min", id="program-timeout-of-4-h"),
        pytest.param(4.0, "4 h", id="four-hours"),
        pytest.param(24.0, "1 d", id="one-day"),
        pytest.param(48.0, "2 d", id="two-days"),
        pytest.param(26.5, "1 d 2 h 30 min", id="day-hours-minutes"),
        pytest.param(168.0, "7 d", id="week"),
        pytest.param(0.0, "0 s", id="nothing"),
        pytest.param(0.1 / 3600, "0 s", id="below-a-second"),
    ],
)
def test_format_duration(hours: float, text: str) -> None:
    assert format_duration(hours) == text


def test_no_fraction_of_an_hour_is_shown() -> None:
    one_minute = Partition("polar_1m", 1 / 60, False, 4)
    assert one_minute.describe() == "polar_1m (1 min, 4 GPUs/node)"
    with pytest.raises(ResourceError, match=r"allows at most 1 min, but time_hours=0\.05 \(3 min\)"):
        check_partition_limits(0.05, ("polar_1m",), [one_minute])
    verdict = continuation_verdict(
        native="TIMEOUT", slice_number=1, max_continuations=2, time_hours=1 / 60, checkpoints=[], last_checkpoint=None
    )
    assert verdict.reason.startswith("the 1 min slice 1 ended TIMEOUT")


#: sinfo -a -h -o '%P|%l|%G|%a|%c|%m|%g|%r|%L' lines and the partition each is read as.
SHAPE_LINES = [
    pytest.param(
        "polar*|4:00:00|gpu:a100:4|up|8|8192|all|no",
        Partition("polar", 4.0, True, 4, ("a100",), shapes=(NodeShape(4, 8, 8192),)),
        id="gpu-partition",
    ),
    pytest.param(
        "cpu|7-00:00:00|(null)|down|64|256000|all|no",
        Partition("cpu", 168.0, state="down", shapes=(NodeShape(0, 64, 256000),)),
        id="down",
    ),
    pytest.param("cpu|1:00:00|(null)|drain|8|8192|all|no", Partition("cpu", 1.0, state="drain",
                 shapes=(NodeShape(0, 8, 8192),)), id="drained"),
    pytest.param("cpu|1:00:00|(null)|inact|8|8192|all|no", Partition("cpu", 1.0, state="inact",
                 shapes=(NodeShape(0, 8, 8192),)), id="inactive"),
    pytest.param("cpu|1:00:00|(null)|up|8|8192|admins,ops|no", Partition("cpu", 1.0, allow_groups=("admins", "ops"),
                 shapes=(NodeShape(0, 8, 8192),)), id="allow-groups"),
    pytest.param("cpu|1:00:00|(null)|up|8|8192|all|yes", Partition("cpu", 1.0, root_only=True,
                 shapes=(NodeShape(0, 8, 8192),)), id="root-only"),
    pytest.param("mix|1:00:00|gpu:8|up|64+|512000+|all|no", Partition("mix", 1.0, False, 8,
                 shapes=(NodeShape(8, 64, 512000, at_least=True),)), id="smallest-of-several-plus"),
    pytest.param("g|1:00:00|gpu:4|up|8|16G|all|no", Partition("g", 1.0, False, 4, shapes=(NodeShape(4, 8, 16384),)),
                 id="memory-with-suffix"),
    pytest.param("g|1:00:00|gpu:4|up|8|2048K|all|no", Partition("g", 1.0, False, 4, shapes=(NodeShape(4, 8, 2),)),
                 id="memory-in-k"),
    pytest.param("g|1:00:00|gpu:4|up|8|3M|all|no", Partition("g", 1.0, False, 4, shapes=(NodeShape(4, 8, 3),)),
                 id="memory-in-m"),
    pytest.param("g|1:00:00|gpu:4|up|8|1.5T|all|no", Partition("g", 1.0, False, 4,
                 shapes=(NodeShape(4, 8, 1572864),)), id="memory-in-t"),
    pytest.param("g|1:00:00|gpu:4|up|8|1P|all|no", Partition("g", 1.0, False, 4,
                 shapes=(NodeShape(4, 8, 1073741824),)), id="memory-in-p"),
    pytest.param("g|1:00:00|gpu:4|up|8|(null)|ALL|NO", Partition("g", 1.0, False, 4, shapes=(NodeShape(4, 8, None),)),
                 id="memory-null"),
    pytest.param("empty|1:00:00|(null)|up|0|0|all|no", Partition("empty", 1.0), id="no-nodes"),
    pytest.param("old|1:00:00|gpu:4", Partition("old", 1.0, False, 4), id="three-columns"),
    pytest.param("g|1:00:00|gpu:4|up|eight|8192|all|no", Partition("g", 1.0, False, 4,
                 problem="sinfo printed the CPUs per node 'eight', which is not a number"), id="cpus-unreadable"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), SHAPE_LINES)
def test_parse_state_shape_and_access(line: str, expected: Partition) -> None:
    assert parse_sinfo_partitions(line + "\n") == ([expected], [])


def test_lines_of_one_partition_keep_each_node_shape() -> None:
    stdout = "polar*|4:00:00|gpu:a100:4|up|8|8192|all|no\npolar*|4:00:00|gpu:h100:8|up|64|512000|all|no\n"
    (polar,), _ = parse_sinfo_partitions(stdout)
    assert polar.shapes == (NodeShape(4, 8, 8192), NodeShape(8, 64, 512000))
    assert polar.describe() == "polar (4 h, 8 GPUs/node: a100, h100, 64 CPUs/node, 512000 MB/node)"


CPU_SITE = [
    Partition("polar", 4.0, True, 4, ("a100",), shapes=(NodeShape(4, 8, 8192),)),
    Partition("a_down", None, state="down"),
    Partition("b_drain", None, state="drain"),
    Partition("c_admins", None, allow_groups=("admins",)),
    Partition("d_root", None, root_only=True),
    Partition("e_short", 1.0),
    Partition("f_cpu", 168.0),
    Partition("g_cpu", 168.0),
]

SKIPPED = [
    "a_down: it is DOWN",
    "b_drain: it is DRAIN",
    "c_admins: only groups admins may submit there (AllowGroups)",
    "d_root: only root may submit there (RootOnly=YES)",
    "e_short: it allows at most 1 h, the conversion asks for 2 h",
]


def test_the_conversion_goes_to_the_first_usable_cpu_partition() -> None:
    assert cpu_partition(CPU_SITE, "mini", 2.0) == "f_cpu"
    assert choose_partitions((), CPU_SITE, "mini", 2.0, cpu_only=True) == ("f_cpu",)
    assert skipped_cpu_partitions(CPU_SITE, 2.0) == SKIPPED


def test_no_usable_cpu_partition_names_each_and_why() -> None:
    with pytest.raises(ResourceError) as caught:
        cpu_partition(CPU_SITE[:6], "mini", 2.0)
    assert f"(passed over: {'; '.join(SKIPPED)})" in str(caught.value)
    assert "set the connection's conversion_partition extra" in str(caught.value)


def test_a_configured_conversion_partition_that_is_down_is_refused_with_its_state() -> None:
    with pytest.raises(ResourceError, match=r"the conversion partition a_down is DOWN on cluster 'mini'.*usable "
                       r"without GPUs: f_cpu, g_cpu\)"):  # fmt: skip
        choose_partitions(("a_down",), CPU_SITE, "mini", 2.0, cpu_only=True)
    assert choose_partitions(("a_down", "f_cpu"), CPU_SITE, "mini", 2.0, cpu_only=True) == ("a_down", "f_cpu")
    assert choose_partitions(("a_down",), CPU_SITE, "mini", 2.0) == ("a_down",)  # a GPU job: the caller warns


@pytest.mark.parametrize(
    ("gpus_per_node", "node_cpus", "node_gpus", "cpus"),
    [
        pytest.param(4, 8, 4, 8, id="whole-node-all-cpus"),
        pytest.param(1, 8, 4, 2, id="a-quarter"),
        pytest.param(4, 64, 8, 32, id="half-of-a-large-node"),
        pytest.param(3, 8, 4, 6, id="three-of-four"),
        pytest.param(1, 2, 8, 1, id="at-least-one"),
        pytest.param(1, 8, None, 8, id="gpus-unknown-node-smaller-than-default"),
        pytest.param(1, 64, None, DEFAULT_CPUS_PER_TASK, id="gpus-unknown-default"),
    ],
)
def test_default_cpus_per_task(gpus_per_node: int, node_cpus: int, node_gpus: int | None, cpus: int) -> None:
    assert default_cpus_per_task(gpus_per_node, node_cpus, node_gpus) == cpus


EIGHT_CPUS = [Partition("polar", 4.0, True, 4, ("a100",), shapes=(NodeShape(4, 8, 8192),))]


@pytest.mark.parametrize(
    ("request_", "known", "cpus"),
    [
        pytest.param({}, EIGHT_CPUS, 8, id="default-whole-node"),
        pytest.param({"gpus_per_node": 1}, EIGHT_CPUS, 2, id="default-one-gpu"),
        pytest.param({"cpus_per_task": 6}, EIGHT_CPUS, 6, id="explicit-kept"),
        pytest.param({}, [Partition("polar", 4.0, True, 4)], DEFAULT_CPUS_PER_TASK, id="shape-unknown"),
        pytest.param({"cpus_per_task": 32}, [Partition("polar", 4.0, True, 4, shapes=(NodeShape(4, 8, 8192, True),))],
                     32, id="smallest-of-several-not-refused"),
        pytest.param({"gpus_per_node": 2}, [Partition("polar", 4.0, True, 8, shapes=(NodeShape(4, 8, 8192),
                     NodeShape(8, 64, 512000)))], 4, id="default-fits-every-node-it-can-land-on"),
    ],
)  # fmt: skip
def test_cpus_from_the_node_shape(request_: dict[str, int], known: list[Partition], cpus: int) -> None:
    placed = fit_gpus(build_resources(partition="polar", **request_), ("polar",), known)
    assert (placed.cpus_per_task, placed.cpus_default) == (cpus, False)


def test_more_cpus_than_a_node_has_is_refused_before_sbatch() -> None:
    with pytest.raises(ResourceError) as caught:
        fit_gpus(build_resources(partition="polar", cpus_per_task=16), ("polar",), EIGHT_CPUS)
    assert str(caught.value) == (
        "the job cannot start on polar (4 h, 4 GPUs/node: a100, 8 CPUs/node, 8192 MB/node): cpus_per_task=16 (one "
        "task per node) is more than the 8 CPUs of its nodes with 4 GPU(s): ask for at most 8, or leave "
        "cpus_per_task out (8 from the node shape). SLURM would keep it PENDING (BadConstraints) forever, so it is "
        "not submitted"
    )


def test_more_memory_than_a_node_has_is_refused_before_sbatch() -> None:
    with pytest.raises(ResourceError, match=re.escape("mem_mb=16000 is more than the 8192 MB of its nodes")):
        fit_gpus(build_resources(partition="polar", mem_mb=16000), ("polar",), EIGHT_CPUS)
    placed = fit_gpus(build_resources(partition="polar", mem_mb=8000), ("polar",), EIGHT_CPUS)
    assert placed.mem_mb == 8000


@pytest.mark.parametrize(
    ("asked", "named", "not_named"),
    [
        pytest.param(
            {"cpus_per_task": 8, "mem_mb": 9000}, "mem_mb=9000", "cpus_per_task=8 (", id="all-cpus-more-memory"
        ),
        pytest.param(
            {"cpus_per_task": 9, "mem_mb": 8192}, "cpus_per_task=9 (", "mem_mb=8192 is", id="all-memory-more-cpus"
        ),
    ],
)
def test_a_refusal_names_only_what_is_more_than_a_node_has(asked: dict[str, int], named: str, not_named: str) -> None:
    """A value equal to the node's own is no reason: the refusal names the other one alone."""
    with pytest.raises(ResourceError) as caught:
        fit_gpus(build_resources(partition="polar", **asked), ("polar",), EIGHT_CPUS)
    assert named in str(caught.value)
    assert not_named not in str(caught.value)


def test_bad_constraints_is_explained_while_the_job_pends() -> None:
    hint = pending_hint("BadConstraints")
    assert hint is not None
    assert "can never start" in hint
    assert "cpus_per_task" in hint
    assert pending_hint("PartitionDown") is not None
