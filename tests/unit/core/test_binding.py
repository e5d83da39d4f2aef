"""Token binding touches only the three literal tokens."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.binding import bind_text, bind_value, binding_values
from airflow_provider_tao_slurm.exceptions import ValidationError

VALUES = binding_values(results_dir="/l/results/j1", job_id="j1", config_path="/l/jobs/j1/specs/spec.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train -e {config_path} -r {results_dir}", "train -e /l/jobs/j1/specs/spec.yaml -r /l/results/j1"),
        ("echo ${HOME} {job_id}", "echo ${HOME} j1"),
        ('{"a": {"b": 1}} {job_id}', '{"a": {"b": 1}} j1'),
        ("{ echo x; } && echo {results_dir}/{job_id}", "{ echo x; } && echo /l/results/j1/j1"),
        ("{JOB_ID} {job_id_x} {results}", "{JOB_ID} {job_id_x} {results}"),
        ("{{job_id}}", "{j1}"),
        ("", ""),
    ],
    ids=["tokens", "shell-braces", "json", "brace-group", "near-misses", "double-braces", "empty"],
)
def test_bind_text(text: str, expected: str) -> None:
    assert bind_text(text, VALUES) == expected


def test_bind_value_recurses_and_keeps_types() -> None:
    spec = {"train": {"epochs": 2, "out": "{results_dir}/ckpt", "lr": 0.1, "flag": True}, "list": ["{job_id}", None]}
    assert bind_value(spec, VALUES) == {
        "train": {"epochs": 2, "out": "/l/results/j1/ckpt", "lr": 0.1, "flag": True},
        "list": ["j1", None],
    }


def test_bind_value_rejects_odd_types() -> None:
    with pytest.raises(ValidationError, match=r"spec\.a has a set"):
        bind_value({"a": {1}}, VALUES, where="spec")
