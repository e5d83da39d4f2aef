"""Fixtures of the fault suite; ``tests/cluster/conftest.py`` (cluster, ssh_run, slurm_settings, ...) applies too.

The suite lives under ``tests/cluster`` so that the cluster conftest applies without importing it by
name (two ``conftest`` modules cannot share one import name). The reliability recorder that writes
RELIABILITY.md is registered here too, so a run that collects either suite records every catalogued case.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import SECRET_SOURCE, conn, dag_id, demo_program, image, secret_value, submit, submit_op
from deferral import context
from reliability_report import register

from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.config import ClusterSettings

__all__ = ["conn", "dag_id", "demo_program", "image", "secret_value", "wall_limit_job"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the reliability recorder (once per session, whichever suite's conftest comes first)."""
    register(config)


@pytest.fixture
def wall_limit_job(slurm_settings: ClusterSettings, image: str, secret_value: str) -> tuple[dict[str, Any], str]:
    """A job whose program ignores SIGTERM: ``timeout`` cannot stop it, so SLURM ends it at its one-minute wall
    limit (TIMEOUT); ``test_timeout_at_the_wall_limit`` settles it (its 60-90 s run beside the other cluster
    tests under make test). Returns the job handle and its DAG id."""
    dag = f"rl-wall-limit-{time.time_ns()}"
    op = submit_op(image, "trap '' TERM; echo started; sleep 300", time_hours=1 / 60, timeout_hours=0.8 / 60)
    op.__dict__["hook"] = SlurmHook(settings=slurm_settings)  # no Airflow connection here
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SECRET_SOURCE, secret_value)
        handle = submit(op, context(dag, "submit", "r1"))
    return handle, dag
