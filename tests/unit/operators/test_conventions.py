"""Conventions shared with the official providers: the deferrable default and the renamed parameters."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_tao_slurm.exceptions import ValidationError
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator

PROBE = """
import json
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor
print(json.dumps([
    EnrootImportOperator(task_id="i", image="x:1").deferrable,
    NcclProbeOperator(task_id="n", image="/c/x.sqsh").deferrable,
    SlurmJobSensor(task_id="s", job={}).deferrable,
]))
"""


@pytest.mark.parametrize(("setting", "expected"), [("True", True), ("False", False), (None, False)])
def test_deferrable_follows_airflows_default_deferrable(setting: str | None, expected: bool) -> None:
    """A fresh interpreter per setting: the default is read when the operator module is imported, as Airflow does."""
    env = {key: value for key, value in os.environ.items() if key != "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"}
    if setting is not None:
        env["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] = setting
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [expected] * 3


def probe(**kwargs: Any) -> NcclProbeOperator:
    return NcclProbeOperator(task_id="n", image="/c/x.sqsh", **kwargs)


def importer(**kwargs: Any) -> EnrootImportOperator:
    return EnrootImportOperator(task_id="i", image="x:1", **kwargs)


#: Every deprecated parameter name: (operator, old name, value, new name, the new name's value).
ALIASES = [
    pytest.param(probe, "nodes", 3, "num_nodes", 3, id="probe-nodes"),
    pytest.param(probe, "force", True, "force_reprobe", True, id="probe-force"),
    pytest.param(probe, "poll_interval", 3, "poll_interval_seconds", 3, id="probe-poll-interval"),
    pytest.param(importer, "cpus", 2, "cpus_per_task", 2, id="import-cpus"),
    pytest.param(importer, "poll_interval", 3, "poll_interval_seconds", 3, id="import-poll-interval"),
    pytest.param(importer, "poke_interval", 3, "poll_interval_seconds", 3, id="import-poke-interval"),
    pytest.param(importer, "time_minutes", 90, "time_hours", 1.5, id="import-time-minutes"),
]


@pytest.mark.parametrize(("make", "old", "value", "new", "expected"), ALIASES)
def test_old_names_still_work_for_a_release_with_a_warning(
    make: Any, old: str, value: Any, new: str, expected: Any
) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"^{old} is deprecated .*; use {new}$"):
        operator = make(**{old: value})
    assert getattr(operator, new) == expected


@pytest.mark.parametrize(("make", "old", "value", "new", "expected"), ALIASES)
def test_old_and_new_name_together_are_refused(make: Any, old: str, value: Any, new: str, expected: Any) -> None:
    other = {"num_nodes": 4, "force_reprobe": True, "poll_interval_seconds": 7, "cpus_per_task": 8, "time_hours": 3}
    with pytest.raises(ValidationError, match=f"{old} and {new} were both given; .* give only {new}"):
        make(**{old: value, new: other[new]})


@pytest.mark.parametrize("make", [probe, importer], ids=["probe", "import"])
def test_the_new_names_warn_about_nothing(make: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        operator = make(poll_interval_seconds=3)
    assert (operator.poll_interval_seconds, operator.poll_interval) == (3, 3)  # the old attribute reads the new one


def test_force_reprobe_is_templated_under_its_new_name() -> None:
    assert "force_reprobe" in NcclProbeOperator.template_fields
    assert "force" not in NcclProbeOperator.template_fields


#: Words that make a parameter a duration (or an interval) whose name must carry its unit.
DURATION_WORDS = ("time", "timeout", "interval", "wait", "age", "grace", "delay", "period")


@pytest.mark.parametrize("operator", [SbatchSubmitOperator, EnrootImportOperator, NcclProbeOperator])
def test_one_vocabulary_for_parameters(operator: type) -> None:
    """Durations end in ``_seconds`` or ``_hours``, a poll interval is ``poll_interval_seconds``, flags ``force_*``."""
    names = [name for name in inspect.signature(operator.__init__).parameters if name not in ("self", "kwargs")]
    durations = [name for name in names if any(word in name.split("_") for word in DURATION_WORDS)]
    assert [name for name in durations if not name.endswith(("_seconds", "_hours"))] == []
    assert [name for name in names if "interval" in name and name != "poll_interval_seconds"] == []
    assert "force" not in names


ROOT = Path(__file__).resolve().parents[3]
#: Words that say the wait is deferred unless told otherwise (issue 32, item 12).
DEFERRED_BY_DEFAULT = re.compile(
    r"defer\w*(?: to the triggerer)?,? by default|the wait is deferred|wait \(deferred\)", re.IGNORECASE
)


def test_no_page_or_docstring_says_the_wait_is_deferred_by_default() -> None:
    """The default follows ``[operators] default_deferrable`` (false unless a deployment sets it)."""
    sources = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "airflow_provider_tao_slurm").rglob("*.py")),
    ]
    claims = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if DEFERRED_BY_DEFAULT.search(line)
    ]

    assert claims == []
