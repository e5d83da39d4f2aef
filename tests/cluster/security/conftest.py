"""Fixtures of the security suite; ``tests/cluster/conftest.py`` (cluster, ssh_run, slurm_settings, ...) applies too.

The suite lives under ``tests/cluster`` so that the cluster conftest applies without importing it by
name (two ``conftest`` modules cannot share one import name). The reliability recorder that writes
RELIABILITY.md is registered here too, so a run that collects either suite records every catalogued case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterkit import conn, dag_id, image, secret_value
from reliability_report import register

if TYPE_CHECKING:
    import pytest

__all__ = ["conn", "dag_id", "image", "secret_value"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the reliability recorder (once per session, whichever suite's conftest comes first)."""
    register(config)
