"""``spec`` may name a YAML file next to the DAG (read and rendered via ``template_ext``); nothing else is a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk import DAG

from airflow_provider_tao_slurm.exceptions import ValidationError
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator


def submit_in_dag(folder: Path, **kwargs: Any) -> SbatchSubmitOperator:
    with DAG("spec_file", schedule=None, template_searchpath=[str(folder)], params={"epochs": 3}):
        return SbatchSubmitOperator(task_id="train", image="/c/x.sqsh", **kwargs)


def render(op: SbatchSubmitOperator) -> None:
    op.resolve_template_files()
    op.render_template_fields({"params": {"epochs": 3}, "ds": "2026-12-03"})


def test_a_yaml_file_next_to_the_dag_is_read_and_rendered(tmp_path: Path) -> None:
    (tmp_path / "train.yaml").write_text(
        "train:\n  num_epochs: {{ params.epochs }}\n  run: '{{ ds }}'\ndataset_config: specs/data.yaml\n"
    )
    op = submit_in_dag(tmp_path, command="tao train --config specs/train.yaml", spec="train.yaml")

    render(op)

    assert yaml.safe_load(op.spec) == {
        "train": {"num_epochs": 3, "run": "2026-12-03"},
        "dataset_config": "specs/data.yaml",
    }
    assert op.command == "tao train --config specs/train.yaml", "a command ending in .yaml stays text"


def test_strings_inside_a_dict_spec_that_end_in_yaml_stay_text(tmp_path: Path) -> None:
    (tmp_path / "data.yaml").write_text("secret: must not be inlined\n")
    op = submit_in_dag(tmp_path, command="true", spec={"dataset_config": "data.yaml", "n": "{{ params.epochs }}"})

    render(op)

    assert op.spec == {"dataset_config": "data.yaml", "n": "3"}


def test_a_spec_file_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    op = submit_in_dag(tmp_path, command="true", spec="missing.yml")

    with pytest.raises(ValidationError, match=r"spec='missing.yml' names a YAML file, but it is neither next to"):
        render(op)
