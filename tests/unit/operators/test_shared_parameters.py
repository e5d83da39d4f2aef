"""The resource parameters the submitting operators share are checked in one place, with one message each.

``SbatchSubmitOperator``, ``NcclProbeOperator`` and ``EnrootImportOperator`` all hand them to
:func:`~airflow_provider_tao_slurm.core.resources.check_job_parameters`: the same bad value fails in
``execute()`` of each with the same message (naming the problem and the fix), before any SSH. And
``SbatchSubmitOperator`` stays a thin operator: no function of its module is over 60 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.resources import check_job_parameters
from airflow_provider_tao_slurm.exceptions import ValidationError
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook
from airflow_provider_tao_slurm.operators import sbatch_submit
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator

SETTINGS = ClusterSettings(
    hosts=("login",),
    user="u",
    partitions=("polar",),
    results_dir="/lustre/u",
    container_mounts="/lustre:/lustre",
    cluster_name="mini",
)
SQSH = "/lustre/containers/tao.sqsh"
CONTEXT = {"ti": SimpleNamespace(dag_id="dag", task_id="t", run_id="run1", map_index=-1, try_number=1, stats_tags={})}


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> SlurmHook:
    """A hook on explicit settings whose every attempt to connect fails the test."""

    def refuse(self: SlurmHook) -> Any:
        raise AssertionError("SSH was attempted before the input was validated")

    monkeypatch.setattr(SlurmHook, "get_conn", refuse)
    return SlurmHook(settings=SETTINGS)


def submit(**kwargs: Any) -> SbatchSubmitOperator:
    return SbatchSubmitOperator(task_id="t", image=SQSH, command="python train.py", gpus_per_node=1, **kwargs)


def probe(**kwargs: Any) -> NcclProbeOperator:
    return NcclProbeOperator(task_id="t", image=SQSH, **kwargs)


def convert(**kwargs: Any) -> EnrootImportOperator:
    return EnrootImportOperator(task_id="t", image="nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt", **kwargs)


ALL = (submit, probe, convert)
GPU_JOBS = (submit, probe)
#: (parameter, bad value, the operators that take it)
BAD = [
    pytest.param("cpus_per_task", 0, ALL, id="cpus-zero"),
    pytest.param("cpus_per_task", "4", ALL, id="cpus-text"),
    pytest.param("mem_mb", -1, ALL, id="mem-negative"),
    pytest.param("mem_mb", "7200", ALL, id="mem-text"),
    pytest.param("account", "$(id)", ALL, id="account-substitution"),
    pytest.param("partition", "cpu;long", ALL, id="partition-semicolon"),
    pytest.param("partition", "polar,", ALL, id="partition-stray-comma"),
    pytest.param("qos", "a b", ALL, id="qos-space"),
    pytest.param("reservation", " ", ALL, id="reservation-blank"),
    pytest.param("constraint", 5, ALL, id="constraint-number"),
    pytest.param("sbatch_options", {"uid": 0}, ALL, id="sbatch-options-uid"),
    pytest.param("sbatch_options", {"time": "1:00:00"}, ALL, id="sbatch-options-dedicated"),
    pytest.param("sbatch_options", ["mail-type"], ALL, id="sbatch-options-list"),
    pytest.param("gpu_type", "h100;x", GPU_JOBS, id="gpu-type"),
    pytest.param("time_hours", 0, (submit, convert), id="time-zero"),
    pytest.param("time_hours", float("nan"), (submit, convert), id="time-nan"),
]


def refusal(make: Any, hook: SlurmHook, param: str, value: Any) -> str:
    operator = make(**{param: value})
    operator.__dict__["hook"] = hook
    with pytest.raises(ValidationError) as refused:
        operator.execute(CONTEXT)
    return str(refused.value)


@pytest.mark.parametrize(("param", "value", "operators"), BAD)
def test_a_shared_parameter_is_refused_alike_by_every_operator_before_any_ssh(
    no_ssh: SlurmHook, param: str, value: Any, operators: tuple[Any, ...]
) -> None:
    with pytest.raises(ValidationError) as expected:
        check_job_parameters(**{param: value})

    messages = {make.__name__: refusal(make, no_ssh, param, value) for make in operators}

    assert messages == dict.fromkeys(messages, str(expected.value))
    assert param in str(expected.value)


def test_a_conversion_needs_its_memory(no_ssh: SlurmHook) -> None:
    assert "give it in MB, e.g. mem_mb=7200" in refusal(convert, no_ssh, "mem_mb", None)


def test_no_function_of_the_submit_operator_is_over_60_lines() -> None:
    source = Path(sbatch_submit.__file__).read_text()
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []
