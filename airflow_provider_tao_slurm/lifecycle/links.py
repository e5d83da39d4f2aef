"""Extra links of ``SbatchSubmitOperator`` and ``SlurmJobSensor``: where a job's logs and results live.

Airflow 3 computes a task's extra links on the worker when the task ends, stores each in XCom and
shows them as buttons on the task instance page. These links read the job handle of the task: the
one the sensor is watching (its ``watched_job`` XCom, which follows an infrastructure resubmission
and exists also when the job failed), else the handle the submit operator returned (its
``return_value`` XCom). A task with neither gets no link.

By default a link is the ``file://`` URL of the cluster path, which names the path and the SLURM
job id (log directories are ``<job_id>-<slurm_job_id>``); it is in the task's XCom and the REST
API, but the Airflow 3 UI renders only http(s) links as buttons, so set the template below to get
buttons. When the ``tao_slurm`` connection has the
extra ``log_url_template`` (e.g. an Open OnDemand file browser,
``https://ondemand.example.org/pun/sys/dashboard/files/fs{path}``), the link is that template with
``{path}``, ``{slurm_job_id}``, ``{job_id}`` and ``{cluster}`` filled in (URL-quoted).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote as url_quote

from airflow.sdk import BaseOperatorLink
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.sdk.execution_time.xcom import XCom

#: The connection extra holding the URL template.
URL_TEMPLATE_EXTRA = "log_url_template"
#: The XCom key under which a sensor publishes the handle of the job it watches.
WATCHED_JOB_KEY = "watched_job"
#: The class attribute (True) of a task that publishes :data:`WATCHED_JOB_KEY`; the links of any other task
#: read its return value only (asking Airflow for an XCom that was never pushed logs an error line).
PUBLISHES_WATCHED_JOB = "publishes_watched_job"
#: The placeholders a URL template may use.
URL_FIELDS = ("path", "slurm_job_id", "job_id", "cluster")


def check_url_template(template: str) -> None:
    """Check that ``template`` only uses the placeholders of :data:`URL_FIELDS`, without format specs.

    :raises ConnectionConfigError: naming the bad placeholder and the allowed ones.
    """
    from airflow_provider_tao_slurm.exceptions import ConnectionConfigError

    allowed = ", ".join(f"{{{name}}}" for name in URL_FIELDS)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConnectionConfigError(
            f"{URL_TEMPLATE_EXTRA} {template!r} is not a valid template ({exc}); write a literal brace as "
            f"{{{{ or }}}} and use only {allowed}"
        ) from None
    for _, name, spec, conversion in parsed:
        if name is not None and (name not in URL_FIELDS or spec or conversion):
            raise ConnectionConfigError(
                f"{URL_TEMPLATE_EXTRA} {template!r} uses {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}; use only {allowed}"
            )


def job_url(handle: Mapping[str, Any], handle_key: str, template: str | None = None) -> str:
    """Return the URL of the cluster path ``handle[handle_key]`` of a job handle.

    :param handle: the job handle returned by ``SbatchSubmitOperator``.
    :param handle_key: which path: ``"log_dir"`` or ``"results_dir"``.
    :param template: a URL template (see :data:`URL_FIELDS`); None gives ``file://<path>``.
    :returns: the URL; ``""`` when the handle has no such path.
    :raises ConnectionConfigError: when the template is invalid.
    """
    path = handle.get(handle_key)
    if not path:
        return ""
    quoted_path = url_quote(str(path), safe="/")
    if not template:
        return f"file://{quoted_path}"
    check_url_template(template)
    values = {
        "path": quoted_path,
        **{name: url_quote(str(handle.get(name) or ""), safe="") for name in ("slurm_job_id", "job_id", "cluster")},
    }
    return template.format_map(values)


def connection_url_template(conn_id: str) -> str | None:
    """Return the ``log_url_template`` extra of connection ``conn_id`` (None when unset or no connection)."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    value = conn.extra_dejson.get(URL_TEMPLATE_EXTRA)
    return str(value) if value else None


class _SlurmPathLink(BaseOperatorLink):
    """A link to one path of the task's job handle (a sensor's ``watched_job`` XCom, else ``return_value``)."""

    handle_key: ClassVar[str]

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the URL of the job's path (``""`` when the task has no job handle).

        :param operator: the task; its ``slurm_conn_id`` names the connection with the URL template.
        :param ti_key: the task instance.
        """
        handle = (
            XCom.get_value(ti_key=ti_key, key=WATCHED_JOB_KEY)
            if getattr(operator, PUBLISHES_WATCHED_JOB, False)
            else None
        )
        if not isinstance(handle, Mapping):
            handle = XCom.get_value(ti_key=ti_key, key=XCom.XCOM_RETURN_KEY)
        if not isinstance(handle, Mapping):
            return ""
        return job_url(handle, self.handle_key, connection_url_template(operator.slurm_conn_id))


class SlurmJobLogsLink(_SlurmPathLink):
    """The job's log directory (``main.out``, ``main.err``)."""

    name = "SLURM job logs"
    handle_key = "log_dir"


class SlurmJobResultsLink(_SlurmPathLink):
    """The job's results directory (``status.json``, checkpoints)."""

    name = "SLURM job results"
    handle_key = "results_dir"
