"""What a request can cost before it is submitted: nodes x GPUs per node x wall time (``requested_gpu_hours``)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tao_slurm.core.resources import GpuHours, gpu_hours_request, requested_gpu_hours
from airflow_provider_tao_slurm.exceptions import ResourceError

#: (num_nodes, gpus_per_node, time_hours) -> GPU hours
REQUESTS = [
    pytest.param(1, 1, 1, 1.0, id="one-gpu-one-hour"),
    pytest.param(2, 1, 2, 4.0, id="example-approval"),
    pytest.param(2, 8, 4, 64.0, id="two-full-nodes"),
    pytest.param(4, 8, 0.5, 16.0, id="half-hour"),
    pytest.param(1, 4, 1 / 3, 1.3333, id="rounded-to-4-places"),
    pytest.param(16, 8, 48, 6144.0, id="large"),
]


@pytest.mark.parametrize(("nodes", "gpus", "hours", "expected"), REQUESTS)
def test_gpu_hours_are_nodes_times_gpus_times_wall_time(nodes: int, gpus: int, hours: float, expected: float) -> None:
    assert requested_gpu_hours(nodes, gpus, hours) == expected


#: (num_nodes, gpus_per_node, time_hours) -> a fragment of the error
REFUSED = [
    pytest.param(0, 1, 1, "num_nodes=0 must be at least 1", id="no-nodes"),
    pytest.param(1, 0, 1, "gpus_per_node=0 must be at least 1", id="no-gpus"),
    pytest.param(1.5, 1, 1, "num_nodes=1.5 is a float", id="fractional-nodes"),
    pytest.param(True, 1, 1, "not a whole number", id="bool-nodes"),
    pytest.param(1, "2", 1, "gpus_per_node='2' is a str", id="text-gpus"),
    pytest.param(1, 1, 0, "less than one second", id="no-time"),
    pytest.param(1, 1, -2, "less than one second", id="negative-time"),
    pytest.param(1, 1, float("nan"), "not a usable number of hours", id="nan-time"),
    pytest.param(1, 1, "4", "not a number of hours", id="text-time"),
]


@pytest.mark.parametrize(("nodes", "gpus", "hours", "fragment"), REFUSED)
def test_a_request_gpu_resources_would_refuse_is_refused(nodes: Any, gpus: Any, hours: Any, fragment: str) -> None:
    with pytest.raises(ResourceError, match=fragment):
        requested_gpu_hours(nodes, gpus, hours)


#: (num_nodes, gpus_per_node, time_hours, max_continuations) -> (one slice, slices, at most)
CHAINS = [
    pytest.param(2, 1, 2, 0, 4.0, 1, 4.0, id="not-continued-both-the-same"),
    pytest.param(2, 1, 2, 1, 4.0, 2, 8.0, id="example-approval"),
    pytest.param(1, 4, 0.5, 5, 2.0, 6, 12.0, id="six-slices"),
    pytest.param(1, 1, 1 / 60, 4, 0.0167, 5, 0.0833, id="one-minute-slices-rounded"),
    pytest.param(16, 8, 48, 1000, 6144.0, 1001, 6150144.0, id="the-most-continuations"),
]


@pytest.mark.parametrize(("nodes", "gpus", "hours", "continuations", "per_slice", "slices", "at_most"), CHAINS)
def test_a_continued_training_can_use_every_slice(
    nodes: int, gpus: int, hours: float, continuations: int, per_slice: float, slices: int, at_most: float
) -> None:
    cost = gpu_hours_request(nodes, gpus, hours, continuations)
    assert (cost.per_slice, cost.slices, cost.at_most) == (per_slice, slices, at_most)
    assert cost.per_slice == requested_gpu_hours(nodes, gpus, hours)


def test_both_figures_are_shown_for_a_chain_and_one_for_a_single_job() -> None:
    assert gpu_hours_request(2, 1, 2, 1).describe() == (
        "2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours per slice; at most 2 slices = 8 GPU hours"
    )
    assert gpu_hours_request(2, 1, 2).describe() == "2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours"
    assert gpu_hours_request(2, 1, 2) == GpuHours(2, 1, 2, 4.0, 1, 4.0)


@pytest.mark.parametrize("continuations", [-1, 1.5, True, "2", None])
def test_max_continuations_must_be_a_whole_number_from_0(continuations: Any) -> None:
    with pytest.raises(ResourceError, match=r"max_continuations=.* must be a whole number from 0"):
        gpu_hours_request(1, 1, 1, continuations)
