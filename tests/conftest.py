"""Test-wide setup: an isolated Airflow home, created before anything imports Airflow."""

from __future__ import annotations

import os
import tempfile

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="tao-slurm-airflow-")
os.environ.setdefault("AIRFLOW_HOME", _AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# The suite runs as a deployment that defers by default ([operators] default_deferrable), as the docs advise.
os.environ.setdefault("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{os.environ['AIRFLOW_HOME']}/airflow.db")
