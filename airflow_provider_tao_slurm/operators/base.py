"""Shared base of the provider's operators and sensors: the connection id and a lazily created hook."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_tao_slurm.core.defaults import DEFAULT_CONN_ID
from airflow_provider_tao_slurm.lifecycle.support import SerializeParamsOnceMixin, SlurmHookMixin


class SlurmBaseOperator(SlurmHookMixin, SerializeParamsOnceMixin, BaseOperator):
    """Base class: every operator takes ``slurm_conn_id`` and talks to the cluster through :attr:`hook`.

    :param slurm_conn_id: the ``tao_slurm`` connection (default ``slurm_default``).
    """

    ui_color = "#76b900"

    def __init__(self, *, slurm_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slurm_conn_id = slurm_conn_id
