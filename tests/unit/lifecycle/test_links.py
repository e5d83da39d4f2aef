"""Extra links of ``SbatchSubmitOperator``: URLs of a job's logs and results, from its job handle."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.module_loading import import_string
from airflow.serialization.serialized_objects import OperatorSerialization

from airflow_provider_tao_slurm import get_provider_info
from airflow_provider_tao_slurm.exceptions import ConnectionConfigError
from airflow_provider_tao_slurm.lifecycle import links
from airflow_provider_tao_slurm.lifecycle.links import (
    WATCHED_JOB_KEY,
    SlurmJobLogsLink,
    SlurmJobResultsLink,
    check_url_template,
    job_url,
)
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

HANDLE = {
    "job_id": "tao-dag-submit-1a2b3c",
    "slurm_job_id": "4711",
    "cluster": "mini cluster",
    "log_dir": "/lustre/u/logs/tao-dag-submit-1a2b3c-4711",
    "results_dir": "/lustre/u/results/tao dag/1a2b3c",
}


@pytest.mark.parametrize(
    ("key", "template", "expected"),
    [
        pytest.param("log_dir", None, "file:///lustre/u/logs/tao-dag-submit-1a2b3c-4711", id="file-logs"),
        pytest.param("results_dir", None, "file:///lustre/u/results/tao%20dag/1a2b3c", id="file-results-quoted"),
        pytest.param("log_dir", "", "file:///lustre/u/logs/tao-dag-submit-1a2b3c-4711", id="empty-template"),
        pytest.param(
            "log_dir",
            "https://ood.example.org/pun/sys/dashboard/files/fs{path}",
            "https://ood.example.org/pun/sys/dashboard/files/fs/lustre/u/logs/tao-dag-submit-1a2b3c-4711",
            id="ondemand",
        ),
        pytest.param(
            "results_dir",
            "https://{cluster}.example.org/jobs/{slurm_job_id}?name={job_id}&dir={path}",
            "https://mini%20cluster.example.org/jobs/4711?name=tao-dag-submit-1a2b3c&dir=/lustre/u/results/tao%20dag/1a2b3c",
            id="all-fields",
        ),
        pytest.param(
            "log_dir", "https://x/{{raw}}{path}", "https://x/{raw}/lustre/u/logs/tao-dag-submit-1a2b3c-4711", id="brace"
        ),
        pytest.param("sidecar_path", None, "", id="missing-key"),
    ],
)
def test_job_url(key: str, template: str | None, expected: str) -> None:
    assert job_url(HANDLE, key, template) == expected


@pytest.mark.parametrize(
    ("template", "match"),
    [
        pytest.param("https://x/{user}{path}", r"uses \{user\}; use only \{path\}, \{slurm_job_id\}", id="unknown"),
        pytest.param("https://x/{}", r"uses \{\}", id="positional"),
        pytest.param("https://x/{path.upper}", r"uses \{path.upper\}", id="attribute"),
        pytest.param("https://x/{path!r}", r"uses \{path!r\}", id="conversion"),
        pytest.param("https://x/{path:>40}", r"uses \{path:>40\}", id="format-spec"),
        pytest.param("https://x/{path", r"is not a valid template .*literal brace as \{\{ or \}\}", id="unclosed"),
        pytest.param("https://x/}{path}", r"is not a valid template", id="stray-close"),
    ],
)
def test_bad_template_is_refused(template: str, match: str) -> None:
    with pytest.raises(ConnectionConfigError, match=match):
        check_url_template(template)
    with pytest.raises(ConnectionConfigError, match=match):
        job_url(HANDLE, "log_dir", template)


TI = SimpleNamespace(dag_id="dag", task_id="submit", run_id="run1", map_index=-1, try_number=1)


#: The XCom keys the links asked for, in order.
ASKED: list[str] = []


@pytest.fixture
def xcom(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """XCom of :data:`TI`, keyed by XCom key; the link must ask for this task instance's return value."""
    store: dict[str, Any] = {}
    ASKED.clear()

    def get_value(*, ti_key: Any, key: str) -> Any:
        assert ti_key is TI
        ASKED.append(key)
        return store.get(key)

    monkeypatch.setattr(links.XCom, "get_value", staticmethod(get_value))
    return store


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, extra: Mapping[str, Any]) -> None:
    value = {"conn_type": "tao_slurm", "host": "login", "login": "u", "extra": dict(extra)}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))


@pytest.mark.parametrize(
    ("link", "conn_extra", "return_value", "expected"),
    [
        pytest.param(
            SlurmJobLogsLink(), None, HANDLE, "file:///lustre/u/logs/tao-dag-submit-1a2b3c-4711", id="no-connection"
        ),
        pytest.param(
            SlurmJobResultsLink(),
            {"partition": "gpu"},
            HANDLE,
            "file:///lustre/u/results/tao%20dag/1a2b3c",
            id="no-template",
        ),
        pytest.param(
            SlurmJobLogsLink(),
            {"log_url_template": "https://ood/files{path}?job={slurm_job_id}"},
            HANDLE,
            "https://ood/files/lustre/u/logs/tao-dag-submit-1a2b3c-4711?job=4711",
            id="template",
        ),
        pytest.param(SlurmJobLogsLink(), {"log_url_template": "https://ood{path}"}, None, "", id="nothing-submitted"),
        pytest.param(SlurmJobLogsLink(), None, "not a handle", "", id="not-a-handle"),
    ],
)
def test_get_link_reads_the_job_handle_and_the_connection(
    monkeypatch: pytest.MonkeyPatch,
    xcom: dict[str, Any],
    link: Any,
    conn_extra: Mapping[str, Any] | None,
    return_value: Any,
    expected: str,
) -> None:
    conn_id = "slurm_links_test"
    if conn_extra is not None:
        _connection(monkeypatch, conn_id, conn_extra)
    xcom["return_value"] = return_value
    xcom[link.xcom_key] = "https://stale.example.org"  # the link's own stored value is never read back
    operator = SbatchSubmitOperator(task_id="submit", image="/x.sqsh", command="c", slurm_conn_id=conn_id)
    assert link.get_link(operator, ti_key=TI) == expected


def test_bad_template_in_connection_names_the_fix(monkeypatch: pytest.MonkeyPatch, xcom: dict[str, Any]) -> None:
    _connection(monkeypatch, "slurm_links_bad", {"log_url_template": "https://ood/{host}{path}"})
    xcom["return_value"] = HANDLE
    operator = SbatchSubmitOperator(task_id="submit", image="/x.sqsh", command="c", slurm_conn_id="slurm_links_bad")
    with pytest.raises(ConnectionConfigError, match=r"log_url_template .* uses \{host\}"):
        SlurmJobLogsLink().get_link(operator, ti_key=TI)


def test_operator_registers_the_links_and_they_survive_serialization() -> None:
    operator = SbatchSubmitOperator(task_id="submit", image="/x.sqsh", command="c")
    assert [type(link) for link in operator.operator_extra_links] == [SlurmJobLogsLink, SlurmJobResultsLink]
    serialized = OperatorSerialization.serialize_operator(operator)
    assert serialized["_operator_extra_links"] == {
        "SLURM job logs": "_link_SlurmJobLogsLink",
        "SLURM job results": "_link_SlurmJobResultsLink",
    }
    assert OperatorSerialization.deserialize_operator(serialized).extra_links == ["SLURM job logs", "SLURM job results"]


def test_provider_info_lists_the_links() -> None:
    info = get_provider_info()
    assert [import_string(path) for path in info["extra-links"]] == [SlurmJobLogsLink, SlurmJobResultsLink]
    (conn,) = info["connection-types"]
    assert conn["conn-fields"]["log_url_template"]["schema"] == {"type": ["string", "null"]}


def test_a_sensors_links_follow_the_job_it_watches(xcom: dict[str, Any]) -> None:
    """The sensor publishes the watched job's handle (``watched_job``); it wins over a return value, and it is
    there also when the job failed (no return value)."""
    resubmitted = {**HANDLE, "slurm_job_id": "4712", "log_dir": "/lustre/u/logs/tao-dag-submit-1a2b3c-r1-4712"}
    xcom[WATCHED_JOB_KEY] = resubmitted
    sensor = SlurmJobSensor(task_id="wait", job=HANDLE, slurm_conn_id="slurm_links_none")
    assert SlurmJobLogsLink().get_link(sensor, ti_key=TI) == "file:///lustre/u/logs/tao-dag-submit-1a2b3c-r1-4712"
    xcom["return_value"] = {**HANDLE, "log_dir": "/elsewhere"}
    assert SlurmJobLogsLink().get_link(sensor, ti_key=TI) == "file:///lustre/u/logs/tao-dag-submit-1a2b3c-r1-4712"


def test_a_submit_tasks_links_ask_only_for_its_return_value(xcom: dict[str, Any]) -> None:
    """Airflow logs an error line for every XCom asked for that was never pushed: a healthy submit task (which
    never publishes ``watched_job``) must not show two of them, one per link."""
    xcom["return_value"] = HANDLE
    operator = SbatchSubmitOperator(task_id="submit", image="/x.sqsh", command="c", slurm_conn_id="slurm_links_none")
    for link in (SlurmJobLogsLink(), SlurmJobResultsLink()):
        assert link.get_link(operator, ti_key=TI).startswith("file:///lustre/u/")
    assert ASKED == ["return_value", "return_value"]
