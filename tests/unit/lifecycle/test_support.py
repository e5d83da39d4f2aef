"""Serialising the provider's tasks: typed Params are validated once per DAG, and the DAG is unchanged.

Airflow 3.3 serialises a task's ``params`` twice and validates every Param both times; the provider's
operators and sensor leave ``params`` to the one place that writes it (issue 18, DAG parse cost).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from airflow.dag_processing.dagbag import BundleDagBag
from airflow.sdk import DAG, BaseOperator, Param
from airflow.sdk.bases.sensor import BaseSensorOperator
from airflow.sdk.definitions.param import Param as SdkParam
from airflow.serialization.serialized_objects import DagSerialization

from airflow_provider_tao_slurm.lifecycle.support import SerializeParamsOnceMixin
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

DAGS = Path(__file__).resolve().parents[3] / "dags"
EXAMPLES = sorted(DAGS.glob("*.py"))
PARAMS = {
    "epochs": Param(10, type="integer", minimum=1, description="training epochs"),
    "image": Param("nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", type="string"),
    "spec": Param({"train": {"batch_size": 8}}, type="object"),
}


def typed_dag() -> DAG:
    """A DAG with typed Params, one provider operator and the sensor."""
    with DAG("typed_params", schedule=None, params=PARAMS) as dag:
        StageDatasetCheckOperator(task_id="check", paths={"train": "/lustre/data/train"})
        SlurmJobSensor(task_id="watch", slurm_job_id="42")
    return dag


def serialised(dags: dict[str, Any]) -> dict[str, str]:
    return {dag_id: json.dumps(DagSerialization.to_dict(dag), sort_keys=True) for dag_id, dag in dags.items()}


def parse(path: Path) -> dict[str, Any]:
    bag = BundleDagBag(dag_folder=str(path), bundle_path=DAGS, bundle_name="dags-folder", load_op_links=False)
    assert bag.import_errors == {}
    return dict(bag.dags)


def count_validations(dag: DAG) -> int:
    """How many times serialising ``dag`` validates a Param."""
    calls = 0
    resolve = SdkParam.resolve

    def counting(self: SdkParam, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return resolve(self, *args, **kwargs)

    with mock.patch.object(SdkParam, "resolve", counting):
        DagSerialization.to_dict(dag)
    return calls


@pytest.mark.parametrize(
    ("cls", "base"), [(StageDatasetCheckOperator, BaseOperator), (SlurmJobSensor, BaseSensorOperator)]
)
def test_serialised_fields_are_airflows_without_params(cls: type, base: type) -> None:
    assert "params" in base.get_serialized_fields()
    assert cls.get_serialized_fields() == base.get_serialized_fields() - {"params"}


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_serialises_exactly_as_airflow_would(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = serialised(parse(example))
    monkeypatch.delattr(SerializeParamsOnceMixin, "get_serialized_fields")
    assert serialised(parse(example)) == ours


def mapped_and_task_params_dag() -> DAG:
    """Mapped provider tasks, and a task with Params of its own on top of the DAG's."""
    with DAG("mapped_params", schedule=None, params=PARAMS) as dag:
        StageDatasetCheckOperator.partial(task_id="check").expand(paths=[{"a": "/lustre/a"}, {"b": "/lustre/b"}])
        SlurmJobSensor.partial(task_id="watch").expand(slurm_job_id=["41", "42"])
        StageDatasetCheckOperator(
            task_id="own", paths={"a": "/lustre/a"}, params={"split": Param("val", enum=["train", "val"])}
        )
    return dag


def test_mapped_tasks_and_task_params_serialise_exactly_as_airflow_would(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = serialised({"dag": mapped_and_task_params_dag()})
    monkeypatch.delattr(SerializeParamsOnceMixin, "get_serialized_fields")
    assert serialised({"dag": mapped_and_task_params_dag()}) == ours
    own = next(task for task in DagSerialization.from_dict(json.loads(ours["dag"])).tasks if task.task_id == "own")
    assert set(own.params) == {*PARAMS, "split"}


def test_typed_params_are_not_validated_per_task_while_serialising(monkeypatch: pytest.MonkeyPatch) -> None:
    assert count_validations(typed_dag()) == 0
    monkeypatch.delattr(SerializeParamsOnceMixin, "get_serialized_fields")
    # Airflow's own path: twice per Param per task; the check can fail.
    assert count_validations(typed_dag()) == 2 * len(PARAMS) * 2


def test_every_task_keeps_the_dags_typed_params_through_a_round_trip() -> None:
    back = DagSerialization.from_dict(DagSerialization.to_dict(typed_dag()))
    expected = {name: (param.value, param.schema) for name, param in PARAMS.items()}
    for owner in (back, *back.tasks):
        found = {
            name: (owner.params.get_param(name).value, owner.params.get_param(name).schema) for name in owner.params
        }
        assert found == expected, owner
