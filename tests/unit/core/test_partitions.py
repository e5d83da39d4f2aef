"""The cluster's partitions: sinfo's every time form, hidden and GPU shapes, resolution, limits, GPU layout."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.partitions import (
    NodeShape,
    Partition,
    check_partition_limits,
    cpu_partition,
    fit_gpus,
    parse_sinfo_partitions,
    resolve_partitions,
    slice_hours,
)
from airflow_provider_tao_slurm.core.resources import build_resources, whole_node
from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch, resource_fields
from airflow_provider_tao_slurm.exceptions import ResourceError

KNOWN = [
    Partition("polar", 4.0, True, 4, ("a100",)),
    Partition("polar_long", 48.0, False, 4, ("a100",)),
    Partition("scratch", None, False, 8, ("h100",)),
    Partition("cpu", 168.0),
]


def test_sinfo_asks_for_hidden_partitions_gres_state_shape_and_access() -> None:
    assert commands.sinfo_partitions() == "sinfo -a -h -o '%P|%l|%G|%a|%c|%m|%g|%r|%L'"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # every time form sinfo prints (sinfo/print.c): M:SS below an hour, H:MM:SS, D-HH:MM:SS, infinite
        pytest.param("debug|30:00|gpu:4", Partition("debug", 0.5, False, 4), id="sub-hour-M:SS"),
        pytest.param("tiny|1:00|gpu:4", Partition("tiny", 1 / 60, False, 4), id="one-minute"),
        pytest.param("quick|0:30|(null)", Partition("quick", 0.5 / 60), id="thirty-seconds"),
        pytest.param("polar*|4:00:00|gpu:a100:4", Partition("polar", 4.0, True, 4, ("a100",)), id="H:MM:SS-default"),
        pytest.param("week|7-00:00:00|(null)", Partition("week", 168.0), id="D-HH:MM:SS"),
        pytest.param("big|infinite|(null)", Partition("big", None), id="infinite"),
        # what scontrol and slurm.conf write (a cache or wrapper may hand them over)
        pytest.param("x|UNLIMITED|(null)", Partition("x", None), id="UNLIMITED"),
        pytest.param("y|NONE|(null)", Partition("y", None), id="NONE"),
        pytest.param("m|45|(null)", Partition("m", 0.75), id="M"),
        pytest.param("d|2-12|(null)", Partition("d", 60.0), id="D-H"),
        pytest.param("dm|2-12:30|(null)", Partition("dm", 60.5), id="D-H:MM"),
        # GRES forms
        pytest.param("g|1:00:00|gpu:8", Partition("g", 1.0, False, 8), id="untyped"),
        pytest.param("g|1:00:00|gpu:h100:4(S:0-1)", Partition("g", 1.0, False, 4, ("h100",)), id="sockets"),
        pytest.param("g|1:00:00|gpu:a100:2(S:0,2),gpu:v100:2(IDX:2-3)", Partition("g", 1.0, False, 4, ("a100", "v100")),
                     id="two-types-one-node"),
        pytest.param("g|1:00:00|craynetwork:4,gpu:tesla:2", Partition("g", 1.0, False, 2, ("tesla",)),
                     id="other-gres-first"),
        pytest.param("g|1:00:00|gpu", Partition("g", 1.0, False, 1), id="gpu-without-count"),
        pytest.param("g|1:00:00|mps:100", Partition("g", 1.0), id="no-gpu-gres"),
        pytest.param("g|1:00:00|", Partition("g", 1.0), id="no-gres-field"),
        # sinfo marks each column on its own: CPUs differ between the nodes (64+), their memory does not
        pytest.param("mix|1:00:00|gpu:8|up|64+|512000|all|no",
                     Partition("mix", 1.0, False, 8, shapes=(NodeShape(8, 64, 512000, at_least=True),)),
                     id="cpus-differ-memory-same-plus"),
    ],
)  # fmt: skip
def test_parse_one_line(line: str, expected: Partition) -> None:
    assert parse_sinfo_partitions(line + "\n") == ([expected], [])


def test_a_partition_of_several_node_shapes_is_merged() -> None:
    stdout = (
        "polar*|4:00:00|gpu:a100:4\npolar*|4:00:00|gpu:h100:8\ncpu|7-00:00:00|(null)\npolar*|4:00:00|gpu:a100:4\n\n"
    )
    assert parse_sinfo_partitions(stdout) == (
        [Partition("polar", 4.0, True, 8, ("a100", "h100")), Partition("cpu", 168.0)],
        [],
    )


def test_a_partition_reads_the_same_whatever_order_sinfo_prints_its_lines_in() -> None:
    """sinfo prints one line per node state and GRES, so its order changes when a node of the partition is
    allocated, drained or back: the GPU types and node shapes must not (seen on the test cluster side by side); a
    blank line among them is skipped, not an end."""
    lines = [
        "polar*|4:00:00|gpu:h100:4|up|8|8192",
        "polar*|4:00:00|gpu:a100:4,gpu:l40:2|up|16|16384",
        "",
        "polar*|4:00:00|gpu:a100:4|up|8+|8192",
    ]
    read = {tuple(parse_sinfo_partitions("\n".join(order))[0]) for order in (lines, lines[::-1], lines[1:] + lines[:1])}
    assert len(read) == 1
    ((polar,),) = read
    assert polar.gpu_types == ("a100", "h100", "l40")
    assert polar.shapes == (NodeShape(4, 8, 8192), NodeShape(4, 8, 8192, True), NodeShape(6, 16, 16384))


def test_an_unreadable_line_is_kept_as_a_problem_and_fails_only_its_own_jobs() -> None:
    stdout = "polar*|4:00:00|gpu:4\nodd|4 hours|gpu:4\n|1:00:00|gpu:4\njunk\n"
    partitions, unreadable = parse_sinfo_partitions(stdout)
    assert partitions == [
        Partition("polar", 4.0, True, 4),
        Partition("odd", None, problem="sinfo printed the time limit '4 hours', which is not a SLURM time"),
    ]
    assert unreadable == ["|1:00:00|gpu:4", "junk"]
    check_partition_limits(4.0, ("polar",), partitions)
    with pytest.raises(ResourceError, match=r"partition odd cannot be checked: sinfo printed the time limit '4 hours'"):
        check_partition_limits(1.0, ("odd",), partitions)


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        pytest.param((), ("polar",), id="cluster-default"),
        pytest.param(("polar_long",), ("polar_long",), id="given"),
        pytest.param(("polar_long", "polar"), ("polar_long", "polar"), id="several"),
    ],
)
def test_resolve_partitions(requested: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert resolve_partitions(requested, KNOWN, "mini") == expected


def test_resolve_partitions_refuses_what_the_cluster_lacks() -> None:
    with pytest.raises(
        ResourceError, match=r"partition grizzly does not exist on cluster 'mini' \(sinfo -a shows: polar"
    ):
        resolve_partitions(("grizzly",), KNOWN, "mini")
    with pytest.raises(ResourceError, match="has no default partition"):
        resolve_partitions((), [Partition("a", 1.0)], "mini")


@pytest.mark.parametrize(
    ("hours", "partitions", "message"),
    [
        pytest.param(4.0, ("polar",), None, id="at-the-limit"),
        pytest.param(5.0, ("polar",), "partition polar allows at most 4 h, but time_hours=5", id="over"),
        pytest.param(47.0, ("polar_long",), None, id="long-partition"),
        pytest.param(49.0, ("polar_long",), "allows at most 2 d, but time_hours=49 (2 d 1 h)", id="over-long"),
        pytest.param(1000.0, ("scratch",), None, id="unlimited"),
        pytest.param(5.0, ("unlisted", "polar"), "partition polar allows at most 4 h", id="unlisted-then-over"),
        pytest.param(5.0, ("polar_long", "polar"), "partition polar allows at most 4 h", id="every-partition-counts"),
        pytest.param(48.0, ("polar",), "partitions that allow it: polar_long, scratch, cpu",
                     id="a-partition-whose-limit-is-exactly-the-time-is-named"),
    ],
)  # fmt: skip
def test_check_partition_limits(hours: float, partitions: tuple[str, ...], message: str | None) -> None:
    if message is None:
        check_partition_limits(hours, partitions, KNOWN)
        return
    with pytest.raises(ResourceError, match=re.escape(message)) as caught:
        check_partition_limits(hours, partitions, KNOWN)
    assert "scratch" in str(caught.value)  # names a partition that would allow it


@pytest.mark.parametrize(
    ("hours", "partitions", "refused"),
    [
        pytest.param(48.0, ("polar", "polar_long"), False, id="longest-slice-exactly-the-longest-limit"),
        pytest.param(48.5, ("polar", "polar_long"), True, id="half-an-hour-over-the-longest-limit"),
        pytest.param(4.5, ("polar", "polar_long"), False, id="over-one-limit-within-another"),
    ],
)
def test_a_continued_training_is_checked_against_its_longest_limit(
    hours: float, partitions: tuple[str, ...], refused: bool
) -> None:
    if not refused:
        check_partition_limits(hours, partitions, KNOWN, continued=True)
        return
    with pytest.raises(ResourceError, match=r"is the longest slice of this continued training, but none of its"):
        check_partition_limits(hours, partitions, KNOWN, continued=True)


@pytest.mark.parametrize(
    ("hours", "partitions", "expected"),
    [
        pytest.param(4.5, ("polar", "polar_long"), {"polar": 4.0, "polar_long": 4.5}, id="half-an-hour-over-one-limit"),
        pytest.param(10.0, ("polar", "polar_long", "scratch"), {"polar": 4.0, "polar_long": 10.0, "scratch": 10.0},
                     id="three-partitions"),
        pytest.param(48.0, ("polar", "polar_long", "scratch"), {"polar": 4.0, "polar_long": 48.0, "scratch": 48.0},
                     id="three-partitions-one-at-exactly-its-limit"),
    ],
)  # fmt: skip
def test_each_partition_of_a_continued_training_gives_its_own_slice(
    hours: float, partitions: tuple[str, ...], expected: dict[str, float]
) -> None:
    assert slice_hours(hours, partitions, KNOWN) == expected


def test_time_over_partition_limit_message() -> None:
    with pytest.raises(ResourceError) as caught:
        check_partition_limits(5, ("polar",), KNOWN)
    assert str(caught.value) == (
        "partition polar allows at most 4 h, but time_hours=5 (5 h): lower time_hours or pick a partition with a "
        "longer limit; partitions that allow it: polar_long, scratch, cpu"
    )


@pytest.mark.parametrize(
    ("request_", "partitions", "layout"),
    [
        pytest.param({"total_gpus": 16}, ("scratch",), (2, 8, True), id="seed-shape-where-nodes-have-8"),
        pytest.param({"total_gpus": 16}, ("polar",), (4, 4, True), id="four-gpu-nodes"),
        pytest.param({"total_gpus": 8}, ("polar",), (2, 4, True), id="eight-on-four-gpu-nodes"),
        pytest.param({"total_gpus": 12}, ("polar",), (3, 4, True), id="twelve-on-four-gpu-nodes"),
        pytest.param({"total_gpus": 3}, ("polar",), (1, 3, False), id="fits-one-node"),
        pytest.param({"total_gpus": 16}, ("polar", "scratch"), (4, 4, False), id="smallest-shape-of-several"),
        pytest.param({"gpus_per_node": 4}, ("polar",), (1, 4, True), id="explicit-fits-whole-nodes"),
        pytest.param({"gpus_per_node": 2}, ("polar",), (1, 2, False), id="explicit-shares"),
        pytest.param({"num_nodes": 2, "gpus_per_node": 8}, ("scratch",), (2, 8, True), id="explicit-full-nodes"),
        pytest.param({"total_gpus": 8, "num_nodes": 4, "gpus_per_node": 2}, ("polar",), (4, 2, False),
                     id="explicit-layout-kept"),
    ],
)  # fmt: skip
def test_fit_gpus_lays_out_on_the_partitions_node_shape(
    request_: dict[str, int], partitions: tuple[str, ...], layout: tuple[int, int, bool]
) -> None:
    fitted = fit_gpus(build_resources(partition=None, **request_), partitions, KNOWN)
    assert (fitted.num_nodes, fitted.gpus_per_node, fitted.exclusive) == layout
    assert (fitted.partition, fitted.layout_total) == (",".join(partitions), None)


@pytest.mark.parametrize(
    ("request_", "partitions", "message"),
    [
        pytest.param({"gpus_per_node": 8}, ("polar",),
                     "gpus_per_node=8 cannot start on polar (4 h, 4 GPUs/node: a100): no node there has more than 4 "
                     "GPUs; ask for at most 4 per node and more nodes (total_gpus=8 lays them out for you), or pick a "
                     "partition with larger nodes: scratch (no time limit, 8 GPUs/node: h100)",
                     id="more-than-a-node-has"),
        pytest.param({"total_gpus": 10}, ("polar",),
                     "total_gpus=10 cannot be laid out on whole 4-GPU nodes on polar (4 h, 4 GPUs/node: a100): above 4 "
                     "GPUs a job takes whole nodes; ask for a multiple of 4 (total_gpus=8 or 12)",
                     id="not-whole-nodes"),
        pytest.param({"gpus_per_node": 1}, ("cpu",), "partition cpu has no GPUs (sinfo shows no gpu GRES on its nodes)",
                     id="cpu-partition"),
        pytest.param({"gpus_per_node": 1, "gpu_type": "h100"}, ("polar",),
                     "gpu_type='h100': no node of polar (4 h, 4 GPUs/node: a100) has that GPU type; use one of a100",
                     id="gpu-type-missing"),
    ],
)  # fmt: skip
def test_fit_gpus_refuses_what_no_node_can_hold(
    request_: dict[str, object], partitions: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ResourceError, match=re.escape(message)):
        fit_gpus(build_resources(partition=None, **request_), partitions, KNOWN)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("known", "hours", "expected"),
    [
        pytest.param(KNOWN, 2.0, "cpu", id="gpu-default-is-never-chosen"),
        pytest.param([*KNOWN, Partition("cpu_default", 1.0, True)], 0.5, "cpu_default", id="default-without-gpus"),
        pytest.param([*KNOWN, Partition("cpu_default", 1.0, True)], 2.0, "cpu", id="default-too-short"),
        pytest.param([Partition("odd", None, problem="x"), *KNOWN], 2.0, "cpu", id="unreadable-skipped"),
        pytest.param(
            [*KNOWN, Partition("cpu_default", 1.0, True)], 1.0, "cpu_default", id="default-at-exactly-its-limit"
        ),
        pytest.param([Partition("t4", 4.0, True, 1, ("t4",)), *KNOWN], 2.0, "cpu", id="one-gpu-nodes-are-gpu-nodes"),
    ],
)
def test_cpu_partition(known: list[Partition], hours: float, expected: str) -> None:
    assert cpu_partition(known, "mini", hours) == expected


#: One partition whose sinfo line says 8 GPUs, 64 CPUs and 512000 MB per node (``gpu:h100:8|up|64|512000``).
SHAPED = [Partition("gpu", 4.0, True, 8, ("h100",), shapes=(NodeShape(8, 64, 512000),))]


@pytest.mark.parametrize(
    ("request_", "fits"),
    [
        pytest.param({"gpus_per_node": 8, "cpus_per_task": 64, "mem_mb": 512000}, True, id="all-a-node-has"),
        pytest.param({"gpus_per_node": 8, "cpus_per_task": 64, "mem_mb": 512001}, False, id="one-mb-more"),
        pytest.param({"gpus_per_node": 8, "cpus_per_task": 65, "mem_mb": 512000}, False, id="one-cpu-more"),
    ],
)
def test_a_task_may_ask_for_everything_a_node_has(request_: dict[str, int], fits: bool) -> None:
    if fits:
        assert fit_gpus(build_resources(partition="gpu", **request_), ("gpu",), SHAPED).mem_mb == request_["mem_mb"]
        return
    with pytest.raises(ResourceError, match=r"the job cannot start on gpu .*BadConstraints"):
        fit_gpus(build_resources(partition="gpu", **request_), ("gpu",), SHAPED)


def test_cpu_partition_refuses_a_cluster_without_one() -> None:
    with pytest.raises(ResourceError) as caught:
        cpu_partition([*KNOWN[:3], Partition("cpu_short", 1.0)], "mini", 2.0)
    assert str(caught.value) == (
        "no conversion partition is configured and cluster 'mini' has no usable partition without GPUs for 2 h "
        "(passed over: cpu_short: it allows at most 1 h, the conversion asks for 2 h); image conversion never runs on "
        "a GPU partition: set the connection's conversion_partition extra (or partition= on EnrootImportOperator) to "
        "a CPU partition you may use"
    )


# ---------------------------------------------------------------------- whole nodes (issue 42, item 3)

#: (GPUs per node of the partition's nodes, GPUs per node the job asks for) -> exclusive
WHOLE_NODES = [
    pytest.param(4, 4, True, id="4-gpu-nodes-all-4"),
    pytest.param(4, 2, False, id="4-gpu-nodes-2"),
    pytest.param(4, 1, False, id="4-gpu-nodes-1"),
    pytest.param(8, 8, True, id="8-gpu-nodes-all-8"),
    pytest.param(8, 4, False, id="8-gpu-nodes-4"),
    pytest.param(8, 7, False, id="8-gpu-nodes-7"),
    pytest.param(16, 16, True, id="16-gpu-nodes-all-16"),
    pytest.param(16, 8, False, id="16-gpu-nodes-8-share"),
    pytest.param(16, 15, False, id="16-gpu-nodes-15"),
]


@pytest.mark.parametrize(("node_gpus", "asked", "exclusive"), WHOLE_NODES)
def test_a_job_asking_for_every_gpu_of_its_nodes_takes_them_whole(node_gpus: int, asked: int, exclusive: bool) -> None:
    known = [Partition("gpu", 4.0, True, node_gpus, ("h100",))]
    fitted = fit_gpus(build_resources(partition="gpu", gpus_per_node=asked, num_nodes=2), ("gpu",), known)
    assert fitted.exclusive is exclusive
    assert whole_node(asked, node_gpus) is exclusive
    assert ("#SBATCH --exclusive\n" in render_sbatch(spec_for(fitted))) is exclusive


def test_several_partitions_take_nodes_whole_only_when_the_job_fills_the_largest() -> None:
    """4 GPUs fill polar's nodes but not scratch's 8-GPU ones, where SLURM may start the job: not exclusive."""
    assert not fit_gpus(build_resources(partition=None, gpus_per_node=4), ("polar", "scratch"), KNOWN).exclusive
    assert fit_gpus(build_resources(partition=None, gpus_per_node=4), ("polar", "polar_long"), KNOWN).exclusive


@pytest.mark.parametrize(
    ("node_gpus", "asked"),
    [pytest.param(None, 8, id="not-known"), pytest.param(0, 8, id="no-gpu-count"), pytest.param(None, 4, id="four")],
)
def test_an_unknown_node_size_never_makes_a_job_exclusive(node_gpus: int | None, asked: int) -> None:
    """Unknown shape: no --exclusive on a guess (the request, before it is placed on the cluster, and the rule)."""
    assert whole_node(asked, node_gpus) is False
    assert build_resources(partition="gpu", gpus_per_node=asked).exclusive is False
    assert fit_gpus(build_resources(partition="gpu", gpus_per_node=asked), ("gpu",), []).exclusive is False


def spec_for(resources: Any) -> SbatchSpec:
    """A batch script's inputs for ``resources`` (the fields that come from them, and fixed paths)."""
    return SbatchSpec(
        job_name="tao-x",
        log_dir="/l/logs",
        job_dir="/l/jobs/x",
        image="/l/i.sqsh",
        command="true",
        exit_code_file="/l/jobs/x/rc",
        **resource_fields(resources),
    )


def test_a_partition_that_is_not_up_is_never_suggested() -> None:
    """A longer partition that is DOWN or drained would leave the job pending: the refusal names only the usable."""
    known = [*KNOWN, dataclasses.replace(KNOWN[1], name="polar_down", state="down")]
    with pytest.raises(ResourceError) as caught:
        check_partition_limits(5, ("polar",), known)
    assert str(caught.value).endswith("partitions that allow it: polar_long, scratch, cpu")
