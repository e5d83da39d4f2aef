"""Conventions shared with the official providers: the deferrable default and the renamed parameters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_tao_slurm.exceptions import ValidationError
from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator

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


@pytest.mark.parametrize(
    ("make", "old", "attribute", "expected"),
    [
        (lambda **kw: NcclProbeOperator(task_id="n", image="/c/x.sqsh", **kw), {"nodes": 3}, "num_nodes", 3),
        (lambda **kw: EnrootImportOperator(task_id="i", image="x:1", **kw), {"cpus": 2}, "cpus_per_task", 2),
        (lambda **kw: EnrootImportOperator(task_id="i", image="x:1", **kw), {"poke_interval": 3}, "poll_interval", 3),
        (lambda **kw: EnrootImportOperator(task_id="i", image="x:1", **kw), {"time_minutes": 90}, "time_hours", 1.5),
    ],
    ids=["probe-nodes", "import-cpus", "import-poke-interval", "import-time-minutes"],
)
def test_old_names_still_work_for_a_release_with_a_warning(
    make: Any, old: dict[str, Any], attribute: str, expected: Any
) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=f"{next(iter(old))} is deprecated .* use {attribute}"):
        operator = make(**old)
    assert getattr(operator, attribute) == expected


def test_old_and_new_name_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="nodes and num_nodes were both given"):
        NcclProbeOperator(task_id="n", image="/c/x.sqsh", nodes=3, num_nodes=4)


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
