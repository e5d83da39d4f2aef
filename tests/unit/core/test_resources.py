"""Resource requests: TAO defaults, GPU layout, limits, names and SLURM time formats."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from airflow_provider_tao_slurm.core import resources as res
from airflow_provider_tao_slurm.core.resources import (
    Resources,
    build_resources,
    hours_to_slurm_time,
    parse_partitions,
    parse_slurm_time,
    site_options,
)
from airflow_provider_tao_slurm.exceptions import ResourceError, ValidationError


def test_constants_follow_tao_conventions() -> None:
    assert (res.DEFAULT_NUM_NODES, res.DEFAULT_GPUS_PER_NODE, res.MAX_GPUS_PER_NODE) == (1, 4, 8)
    assert res.DEFAULT_CPUS_PER_TASK == 16
    assert (res.DEFAULT_TIME_HOURS, res.DEFAULT_TIMEOUT_HOURS) == (4.0, 3.8)


def test_no_partition_name_is_built_in() -> None:
    assert not [name for name in dir(res) if "PARTITION" in name.upper() and name.isupper()]
    assert build_resources(partition=None).partition == ""  # the cluster's default, resolved before rendering


def test_defaults() -> None:
    resources = build_resources(partition="polar")
    assert resources == Resources(
        num_nodes=1,
        gpus_per_node=4,
        cpus_per_task=16,
        time_hours=4.0,
        timeout_hours=3.8,
        partition="polar",
        account=None,
        exclusive=False,
        requeue=True,
        exclude_nodes=(),
        mem_mb=None,
        cpus_default=True,  # 16 until the node shape is known (fit_gpus)
    )
    assert resources.slurm_time == "04:00:00"
    assert resources.timeout_seconds == 13680
    assert resources.total_gpus == 4


#: Before the request is placed on the cluster its node size is unknown: nothing is exclusive yet
#: (:func:`~airflow_provider_tao_slurm.core.partitions.fit_gpus` decides, tests/unit/core/test_partitions.py).
LAYOUTS = [
    pytest.param({}, (1, 4, False), id="default"),
    pytest.param({"gpus_per_node": 1}, (1, 1, False), id="one-gpu"),
    pytest.param({"gpus_per_node": 7}, (1, 7, False), id="seven-shared"),
    pytest.param({"gpus_per_node": 8}, (1, 8, False), id="full-node-exclusive"),
    pytest.param({"num_nodes": 2, "gpus_per_node": 8}, (2, 8, False), id="two-full-nodes"),
    pytest.param({"num_nodes": 3, "gpus_per_node": 2}, (3, 2, False), id="three-partial-nodes"),
    pytest.param({"total_gpus": 1}, (1, 1, False), id="total-1"),
    pytest.param({"total_gpus": 4}, (1, 4, False), id="total-4"),
    pytest.param({"total_gpus": 8}, (1, 8, False), id="total-8"),
    pytest.param({"total_gpus": 16}, (2, 8, False), id="total-16-two-nodes"),
    pytest.param({"total_gpus": 64}, (8, 8, False), id="total-64-eight-nodes"),
    pytest.param({"total_gpus": 12}, (2, 8, False), id="total-12-until-the-cluster-lays-it-out"),
    pytest.param({"total_gpus": 16, "num_nodes": 2, "gpus_per_node": 8}, (2, 8, False), id="total-agrees"),
    pytest.param({"total_gpus": 2, "num_nodes": 1, "gpus_per_node": 2}, (1, 2, False), id="total-agrees-small"),
    pytest.param({"total_gpus": 8, "num_nodes": 4, "gpus_per_node": 2}, (4, 2, False), id="total-explicit-layout"),
    pytest.param({"gpus_per_node": 16}, (1, 16, False), id="sixteen-checked-against-the-cluster"),
]


@pytest.mark.parametrize(("kwargs", "expected"), LAYOUTS)
def test_layout(kwargs: dict[str, Any], expected: tuple[int, int, bool]) -> None:
    resources = build_resources(partition="polar", **kwargs)
    assert (resources.num_nodes, resources.gpus_per_node, resources.exclusive) == expected
    assert resources.total_gpus == expected[0] * expected[1]


PROBES = [
    pytest.param(1, 1, False, False, id="single-gpu-no-probe"),
    pytest.param(1, 2, False, True, id="single-node-multi-gpu"),
    pytest.param(1, 8, False, True, id="single-full-node"),
    pytest.param(2, 1, True, True, id="multi-node-one-gpu"),
    pytest.param(4, 8, True, True, id="multi-node-full"),
]


@pytest.mark.parametrize(("nodes", "gpus", "multi", "probe"), PROBES)
def test_multi_node_and_probe(nodes: int, gpus: int, multi: bool, probe: bool) -> None:
    resources = build_resources(partition="polar", num_nodes=nodes, gpus_per_node=gpus)
    assert resources.is_multi_node is multi
    assert resources.needs_nccl_probe is probe


TIMES = [
    pytest.param({"time_hours": 0.5, "timeout_hours": 0.25}, "00:30:00", 900, id="half-hour"),
    pytest.param({"time_hours": 4, "timeout_hours": 3}, "04:00:00", 10800, id="ints"),
    pytest.param({"time_hours": 4.0, "max_time_hours": 4.0}, "04:00:00", 13680, id="exactly-at-limit"),
    pytest.param(
        {"time_hours": 26, "timeout_hours": 25.5, "max_time_hours": None}, "1-02:00:00", 91800, id="unlimited"
    ),
    pytest.param(
        {"time_hours": 168, "timeout_hours": 160, "max_time_hours": 168}, "7-00:00:00", 576000, id="week-queue"
    ),
]


@pytest.mark.parametrize(("kwargs", "slurm_time", "timeout_seconds"), TIMES)
def test_times(kwargs: dict[str, Any], slurm_time: str, timeout_seconds: int) -> None:
    resources = build_resources(partition="polar", **kwargs)
    assert resources.slurm_time == slurm_time
    assert resources.timeout_seconds == timeout_seconds
    assert isinstance(resources.time_hours, float)


def test_time_over_the_site_rule_message() -> None:
    with pytest.raises(ResourceError) as caught:
        build_resources(partition="polar", time_hours=5, max_time_hours=4)
    assert str(caught.value) == (
        "time_hours=5 exceeds the site rule max_time_hours=4 of this connection; lower time_hours (or the "
        "connection's max_time_hours)"
    )


def test_timeout_not_below_time_message() -> None:
    with pytest.raises(ResourceError) as caught:
        build_resources(partition="polar", time_hours=4, timeout_hours=4)
    assert str(caught.value) == (
        "timeout_hours=4 must be lower than time_hours=4: the program has to stop (and save its results) "
        "before SLURM ends the job at the wall limit; e.g. timeout_hours=3.8 (13680 s), or leave it out to derive it"
    )


OTHER_FIELDS = [
    pytest.param({"account": "proj_a.b-c"}, "account", "proj_a.b-c", id="account"),
    pytest.param({"mem_mb": 7200}, "mem_mb", 7200, id="mem"),
    pytest.param({"requeue": False}, "requeue", False, id="no-requeue"),
    pytest.param({"cpus_per_task": 4}, "cpus_per_task", 4, id="cpus"),
    pytest.param({"partition": "polar, polar3"}, "partition", "polar,polar3", id="partition-list-text"),
    pytest.param({"partition": ["grizzly"]}, "partition", "grizzly", id="partition-list"),
    pytest.param({"exclude_nodes": "n1"}, "exclude_nodes", ("n1",), id="exclude-one"),
    pytest.param({"exclude_nodes": "n[1-2,5],gpu07"}, "exclude_nodes", ("n[1-2,5]", "gpu07"), id="exclude-hostlist"),
    pytest.param({"exclude_nodes": "node01, node02"}, "exclude_nodes", ("node01", "node02"), id="exclude-spaces"),
    pytest.param({"exclude_nodes": [" n1 ", "n[01-04]"]}, "exclude_nodes", ("n1", "n[01-04]"), id="exclude-seq"),
    pytest.param({"exclude_nodes": ""}, "exclude_nodes", (), id="exclude-blank"),
    pytest.param({"exclude_nodes": []}, "exclude_nodes", (), id="exclude-empty-list"),
]


@pytest.mark.parametrize(("kwargs", "field", "expected"), OTHER_FIELDS)
def test_other_fields(kwargs: dict[str, Any], field: str, expected: object) -> None:
    kwargs = {"partition": "polar", **kwargs}
    assert getattr(build_resources(**kwargs), field) == expected


HOSTILE = {
    "leading-dash": "-p",
    "space": "a b",
    "semicolon": "a;reboot",
    "command-substitution": "$(id)",
    "backticks": "`id`",
    "quote": "a'b",
    "newline": "a\nb",
    "nul": "a\x00",
    "glob": "a*",
    "unicode": "p\u00f6lar",
    "too-long": "a" * 129,
}

REJECTED = [
    pytest.param({"num_nodes": 0}, "num_nodes=0 must be at least 1", id="zero-nodes"),
    pytest.param({"num_nodes": -1}, "num_nodes=-1 must be at least 1", id="negative-nodes"),
    pytest.param({"num_nodes": True}, "num_nodes=True is a bool, not a whole number", id="bool-nodes"),
    pytest.param({"num_nodes": 1.5}, "num_nodes=1.5 is a float", id="float-nodes"),
    pytest.param({"num_nodes": 2.0}, "num_nodes=2.0 is a float", id="integral-float-nodes"),
    pytest.param({"num_nodes": "2"}, "num_nodes='2' is a str", id="string-nodes"),
    pytest.param({"num_nodes": None}, "num_nodes=None is a NoneType", id="none-nodes"),
    pytest.param({"gpus_per_node": 0}, "gpus_per_node=0 must be at least 1", id="zero-gpus"),
    pytest.param({"gpus_per_node": False}, "gpus_per_node=False is a bool", id="bool-gpus"),
    pytest.param({"cpus_per_task": 0}, "cpus_per_task=0 must be at least 1", id="zero-cpus"),
    pytest.param({"cpus_per_task": "16"}, "cpus_per_task='16' is a str", id="string-cpus"),
    pytest.param({"total_gpus": 0}, "total_gpus=0 must be at least 1", id="total-0"),
    pytest.param({"total_gpus": True}, "total_gpus=True is a bool", id="total-bool"),
    pytest.param({"total_gpus": 16, "num_nodes": 3}, "conflicts with num_nodes=3 x gpus_per_node=4", id="conflict"),
    pytest.param({"total_gpus": 4, "gpus_per_node": 2}, "conflicts", id="conflict-small"),
    pytest.param({"time_hours": math.nan}, "time_hours=nan is not a usable number", id="nan-time"),
    pytest.param({"time_hours": math.inf}, "time_hours=inf is not a usable number", id="inf-time"),
    pytest.param({"time_hours": -math.inf}, "time_hours=-inf", id="minus-inf-time"),
    pytest.param({"time_hours": 1e300, "max_time_hours": None}, "up to a year", id="huge-time"),
    pytest.param({"time_hours": 0}, "time_hours=0 is less than one second", id="zero-time"),
    pytest.param({"time_hours": -1}, "time_hours=-1 is less than one second", id="negative-time"),
    pytest.param({"time_hours": "4"}, "time_hours='4' is a str", id="string-time"),
    pytest.param({"time_hours": True}, "time_hours=True is a bool", id="bool-time"),
    pytest.param({"time_hours": 4.01, "max_time_hours": 4}, "site rule max_time_hours=4", id="just-over-limit"),
    pytest.param(
        {"time_hours": 4 + 1 / 3600, "max_time_hours": 4}, "site rule max_time_hours=4", id="one-second-over-limit"
    ),
    pytest.param({"time_hours": 10, "max_time_hours": 8.5}, "site rule max_time_hours=8.5", id="custom-limit"),
    pytest.param({"timeout_hours": 4.5}, "timeout_hours=4.5 must be lower than time_hours=4", id="timeout-over"),
    pytest.param({"timeout_hours": math.nan}, "timeout_hours=nan", id="nan-timeout"),
    pytest.param({"timeout_hours": 0}, "timeout_hours=0 is less than one second", id="zero-timeout"),
    pytest.param({"max_time_hours": math.nan}, "max_time_hours=nan", id="nan-limit"),
    pytest.param({"max_time_hours": 0}, "max_time_hours=0", id="zero-limit"),
    pytest.param({"partition": "polar,"}, "has an empty entry; remove the stray comma", id="stray-comma"),
    pytest.param({"partition": 5}, "partition=5 is a int", id="int-partition"),
    pytest.param({"mem_mb": 0}, "mem_mb=0 must be at least 1", id="zero-mem"),
    pytest.param({"mem_mb": "7200"}, "mem_mb='7200' is a str", id="string-mem"),
    pytest.param({"requeue": "yes"}, "requeue='yes' must be True or False", id="string-requeue"),
    pytest.param({"requeue": 1}, "requeue=1 must be True or False", id="int-requeue"),
    pytest.param({"exclude_nodes": "n[3-1]"}, "'n[3-1]' is not a node name", id="inverted-range"),
    pytest.param({"exclude_nodes": "n[1-2"}, "is not a node name", id="unclosed-range"),
    pytest.param({"exclude_nodes": "n[]"}, "is not a node name", id="empty-range"),
    pytest.param({"exclude_nodes": "n[a-b]"}, "is not a node name", id="letter-range"),
    pytest.param({"exclude_nodes": "n1,,n2"}, "'' is not a node name", id="empty-entry"),
    pytest.param({"exclude_nodes": ["n1", 5]}, "entry 5 is not a node name", id="int-entry"),
    pytest.param({"exclude_nodes": 5}, "exclude_nodes=5 is a int", id="int-exclude"),
    *[pytest.param({"partition": v}, "is not a valid SLURM name", id=f"partition-{k}") for k, v in HOSTILE.items()],
    *[pytest.param({"account": v}, "is not a valid SLURM name", id=f"account-{k}") for k, v in HOSTILE.items()],
    *[pytest.param({"exclude_nodes": [v]}, "is not a node name", id=f"node-{k}") for k, v in HOSTILE.items()],
    pytest.param({"account": ""}, "account='' is not a valid SLURM name", id="empty-account"),
]


@pytest.mark.parametrize(("kwargs", "fragment"), REJECTED)
def test_build_resources_rejects(kwargs: dict[str, Any], fragment: str) -> None:
    kwargs = {"partition": "polar", **kwargs}
    with pytest.raises(ResourceError) as caught:
        build_resources(**kwargs)
    message = str(caught.value)
    assert fragment in message
    assert not re.search(r"[\x00-\x1f\x7f]", message), "hostile characters are escaped"
    assert len(message) < 500


def test_resource_error_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        build_resources(partition="polar", num_nodes=0)


PARTITIONS = [
    pytest.param(None, (), id="none-cluster-default"),
    pytest.param("", (), id="empty-cluster-default"),
    pytest.param("  ", (), id="blank-cluster-default"),
    pytest.param([], (), id="empty-list-cluster-default"),
    pytest.param("polar", ("polar",), id="one"),
    pytest.param("polar, polar3 ,grizzly", ("polar", "polar3", "grizzly"), id="comma-separated"),
    pytest.param(["polar", "polar"], ("polar",), id="duplicates-dropped"),
    pytest.param(("b", "a"), ("b", "a"), id="order-kept"),
    pytest.param("cpu_long.v2-x", ("cpu_long.v2-x",), id="safe-characters"),
]


@pytest.mark.parametrize(("value", "expected"), PARTITIONS)
def test_parse_partitions(value: Any, expected: tuple[str, ...]) -> None:
    assert parse_partitions(value) == expected


BAD_PARTITIONS = [
    pytest.param("polar,", "empty entry", id="trailing-comma"),
    pytest.param(",polar", "empty entry", id="leading-comma"),
    pytest.param("polar,,x", "empty entry", id="double-comma"),
    pytest.param(["polar", ""], "empty entry", id="empty-item"),
    pytest.param(["polar", None], "partition=None is not a valid SLURM name", id="none-item"),
    pytest.param([5], "partition=5 is not a valid SLURM name", id="int-item"),
    pytest.param(5, "partition=5 is a int", id="int"),
    *[pytest.param(v, "is not a valid SLURM name", id=k) for k, v in HOSTILE.items()],
]


@pytest.mark.parametrize(("value", "fragment"), BAD_PARTITIONS)
def test_parse_partitions_rejects(value: Any, fragment: str) -> None:
    with pytest.raises(ResourceError, match=re.escape(fragment)):
        parse_partitions(value)


SLURM_TIMES = [
    pytest.param(4, "04:00:00", id="int-4"),
    pytest.param(4.0, "04:00:00", id="float-4"),
    pytest.param(0.5, "00:30:00", id="half"),
    pytest.param(0.25, "00:15:00", id="quarter"),
    pytest.param(3.8, "03:48:00", id="tao-timeout"),
    pytest.param(1 / 3600, "00:01:00", id="one-second-is-a-minute"),
    pytest.param(1 / 60, "00:01:00", id="one-minute"),
    pytest.param(0.001, "00:01:00", id="seconds-round-up-to-a-minute"),
    pytest.param(61 / 3600, "00:02:00", id="a-minute-and-a-second"),
    pytest.param(0.1, "00:06:00", id="float-tenth-stays-six-minutes"),
    pytest.param(59 / 60 + 1 / 3600, "01:00:00", id="rounds-up-to-an-hour"),
    pytest.param(24 - 1 / 3600, "1-00:00:00", id="rounds-up-to-a-day"),
    pytest.param(23.5, "23:30:00", id="under-a-day"),
    pytest.param(24, "1-00:00:00", id="one-day"),
    pytest.param(26.0, "1-02:00:00", id="day-and-two-hours"),
    pytest.param(168, "7-00:00:00", id="week"),
    pytest.param(23.99999, "1-00:00:00", id="rounds-to-a-day"),
    pytest.param(100.75, "4-04:45:00", id="days-hours-minutes"),
]


@pytest.mark.parametrize(("hours", "expected"), SLURM_TIMES)
def test_hours_to_slurm_time(hours: float, expected: str) -> None:
    assert hours_to_slurm_time(hours) == expected


BAD_HOURS = [
    pytest.param(0, "less than one second", id="zero"),
    pytest.param(-1, "less than one second", id="negative"),
    pytest.param(1e-6, "less than one second", id="rounds-to-zero"),
    pytest.param(math.nan, "not a usable number", id="nan"),
    pytest.param(math.inf, "not a usable number", id="inf"),
    pytest.param(1e9, "not a usable number", id="over-a-year"),
    pytest.param(True, "is a bool", id="bool"),
    pytest.param("4", "is a str", id="string"),
    pytest.param(None, "is a NoneType", id="none"),
]


@pytest.mark.parametrize(("hours", "fragment"), BAD_HOURS)
def test_hours_to_slurm_time_rejects(hours: Any, fragment: str) -> None:
    with pytest.raises(ResourceError, match=re.escape(fragment)) as caught:
        hours_to_slurm_time(hours)
    assert str(caught.value).startswith("hours=")


PARSED_TIMES = [
    pytest.param("4:00:00", 4.0, id="h-m-s"),
    pytest.param("04:00:00", 4.0, id="padded"),
    pytest.param("7-00:00:00", 168.0, id="days-h-m-s"),
    pytest.param("1-02:00:00", 26.0, id="one-day-two-hours"),
    pytest.param("30", 0.5, id="minutes"),
    pytest.param("90", 1.5, id="minutes-over-an-hour"),
    pytest.param("30:36", 0.51, id="minutes-seconds"),
    pytest.param("2-12", 60.0, id="days-hours"),
    pytest.param("2-12:30", 60.5, id="days-hours-minutes"),
    pytest.param("0", 0.0, id="zero"),
    pytest.param(" 4:00:00\n", 4.0, id="surrounding-blanks"),
    pytest.param("1:00", 1 / 60, id="one-minute-partition"),
    pytest.param("30:00", 0.5, id="debug-partition"),
    pytest.param("2-0", 48.0, id="days-zero-hours"),
    pytest.param("1-00:00:00", 24.0, id="one-day"),
    pytest.param("UNLIMITED", None, id="unlimited"),
    pytest.param("NONE", None, id="none-scontrol"),
    pytest.param("infinite", None, id="infinite-lower"),
    pytest.param("Infinite", None, id="infinite-mixed"),
]


@pytest.mark.parametrize(("text", "expected"), PARSED_TIMES)
def test_parse_slurm_time(text: str, expected: float | None) -> None:
    assert parse_slurm_time(text) == (None if expected is None else pytest.approx(expected))


BAD_SLURM_TIMES = [
    pytest.param("", id="empty"),
    pytest.param("abc", id="word"),
    pytest.param("4h", id="unit"),
    pytest.param("1.5", id="decimal"),
    pytest.param("4:00:00:00", id="four-fields"),
    pytest.param("1-2-3", id="two-dashes"),
    pytest.param("-5", id="negative"),
    pytest.param("1-", id="days-only"),
    pytest.param("-", id="dash"),
    pytest.param("4::00", id="empty-field"),
    pytest.param("4: 00", id="inner-space"),
    pytest.param("\u0664:00:00", id="arabic-digit"),
    pytest.param("$(id)", id="hostile"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("text", BAD_SLURM_TIMES)
def test_parse_slurm_time_rejects(text: Any) -> None:
    with pytest.raises(ResourceError, match="cannot read the SLURM time"):
        parse_slurm_time(text)


@pytest.mark.parametrize("hours", [1 / 60, 0.25, 0.5, 3.8, 4, 26, 168, 100.75])
def test_slurm_time_round_trip(hours: float) -> None:
    assert parse_slurm_time(hours_to_slurm_time(hours)) == pytest.approx(hours)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, (), id="none"),
        pytest.param({"qos": "long_qos"}, ("--qos=long_qos",), id="qos"),
        pytest.param({"constraint": "a100&ib"}, ("--constraint=a100&ib",), id="constraint-and"),
        pytest.param({"constraint": "[r1|r2]"}, ("--constraint=[r1|r2]",), id="constraint-choice"),
        pytest.param({"reservation": "maint,gpu"}, ("--reservation=maint,gpu",), id="reservations"),
        pytest.param(
            {"sbatch_options": {"mail-type": "END", "--comment": "run-42", "hint": "nomultithread"}},
            ("--mail-type=END", "--comment=run-42", "--hint=nomultithread"),
            id="mapping",
        ),
        pytest.param({"sbatch_options": {"overcommit": True, "spread-job": False}}, ("--overcommit",), id="flags"),
        pytest.param({"sbatch_options": {"nodes-x": None}}, (), id="none-value-skipped"),
        pytest.param({"sbatch_options": {"begin": 3600}}, ("--begin=3600",), id="number"),
    ],
)
def test_site_options(kwargs: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert site_options(**kwargs) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"sbatch_options": {"uid": "0"}}, "may not set --uid", id="uid"),
        pytest.param({"sbatch_options": {"--output": "/etc/x"}}, "may not set --output", id="output"),
        pytest.param({"sbatch_options": {"job-name": "x"}}, "may not set --job-name", id="job-name"),
        pytest.param({"sbatch_options": {"export": "ALL"}}, "may not set --export", id="export"),
        pytest.param({"sbatch_options": {"wrap": "id"}}, "may not set --wrap", id="wrap"),
        pytest.param({"sbatch_options": {"qos": "x"}}, "use the operator's qos parameter", id="dedicated-qos"),
        pytest.param({"sbatch_options": {"time": "9:00:00"}}, "time_hours", id="dedicated-time"),
        pytest.param({"sbatch_options": {"container-image": "x"}}, "may not set --container-image", id="container"),
        pytest.param({"sbatch_options": {"-x": "n1"}}, "not a long option name", id="short"),
        pytest.param({"sbatch_options": {"J": "x"}}, "not a long option name", id="upper"),
        pytest.param({"sbatch_options": {"comment": "a b"}}, "no spaces or quotes", id="space"),
        pytest.param({"sbatch_options": {"comment": "x\n#SBATCH --uid=0"}}, "no spaces or quotes", id="newline"),
        pytest.param({"sbatch_options": {"comment": "$(id)"}}, "no spaces or quotes", id="substitution"),
        pytest.param({"sbatch_options": ["--qos=x"]}, "must be a mapping", id="list"),
        pytest.param({"qos": ""}, "qos='' must be a non-empty string", id="empty-qos"),
        pytest.param({"constraint": "a b"}, "no spaces or quotes", id="constraint-space"),
    ],
)
def test_site_options_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        site_options(**kwargs)


# ---------------------------------------------------------------------- the program timeout (issue 42, item 9)

#: time_hours -> the program timeout derived from it, in seconds (wall less max(15 s, a twentieth))
DERIVED_TIMEOUTS = [
    pytest.param(20 / 3600, 5, id="20-s"),
    pytest.param(1 / 60, 45, id="one-minute"),
    pytest.param(0.25, 855, id="quarter-hour"),
    pytest.param(0.5, 1710, id="half-hour"),
    pytest.param(2, 6840, id="two-hours"),
    pytest.param(4, 13680, id="four-hours-the-tao-default"),
    pytest.param(48, 164160, id="two-days"),
]


@pytest.mark.parametrize(("hours", "seconds"), DERIVED_TIMEOUTS)
def test_the_program_timeout_follows_the_wall_time_unless_set(hours: float, seconds: int) -> None:
    resources = build_resources(partition="polar", time_hours=hours)
    assert resources.timeout_seconds == seconds
    assert res.program_timeout_seconds(round(hours * 3600)) == seconds
    assert round(hours * 3600) - seconds >= min(res.PROGRAM_MARGIN_MIN_S, round(hours * 3600) // 2)


def test_the_default_wall_time_keeps_the_tao_timeout() -> None:
    assert res.program_timeout_seconds(round(res.DEFAULT_TIME_HOURS * 3600)) / 3600 == res.DEFAULT_TIMEOUT_HOURS


@pytest.mark.parametrize("hours", [1 / 60, 2 / 60, 0.1, 0.2, 1 / 3, 2, 4, 7, 49])
def test_a_suggested_timeout_is_one_the_check_accepts(hours: float) -> None:
    """The message's ``e.g. timeout_hours=X`` passes the same check (1/60 suggests 45 s, not 0.02 h = 72 s)."""
    with pytest.raises(ResourceError, match=r"e\.g\. timeout_hours=([0-9.e-]+) \(([0-9]+) s\)") as caught:
        build_resources(partition="polar", time_hours=hours, timeout_hours=hours)
    match = re.search(r"e\.g\. timeout_hours=([0-9.e-]+) \(([0-9]+) s\)", str(caught.value))
    assert match is not None
    suggested = float(match.group(1))
    accepted = build_resources(partition="polar", time_hours=hours, timeout_hours=suggested)
    assert accepted.timeout_seconds == int(match.group(2)) < round(hours * 3600)


def test_two_hours_is_no_longer_refused_and_an_explicit_timeout_is_kept() -> None:
    assert build_resources(partition="polar", time_hours=2).timeout_hours == 1.9
    assert build_resources(partition="polar", time_hours=2, timeout_hours=1.5).timeout_hours == 1.5
    with pytest.raises(ResourceError, match=r"timeout_hours=3\.8 must be lower than time_hours=2"):
        build_resources(partition="polar", time_hours=2, timeout_hours=3.8)


def test_a_wall_time_of_a_second_leaves_no_timeout() -> None:
    with pytest.raises(ResourceError, match="leaves the program no timeout below it"):
        build_resources(partition="polar", time_hours=1 / 3600)
