"""Test-wide setup: an isolated Airflow home, created before anything imports Airflow.

Each pytest-xdist worker gets a home (and metadata database) of its own: a worker inherits the
controller's environment, and two workers sharing one SQLite database would lock each other out.
"""

from __future__ import annotations

import os
import tempfile

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="tao-slurm-airflow-")
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_AIRFLOW_HOME}/airflow.db"
os.environ.setdefault("AIRFLOW_HOME", _AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# The suite runs as a deployment that defers by default ([operators] default_deferrable), as the docs advise.
os.environ.setdefault("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{os.environ['AIRFLOW_HOME']}/airflow.db")
