"""``StageDatasetCheckOperator``: prove that every dataset path is on shared storage before anything runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator


class StageDatasetCheckOperator(SlurmBaseOperator):
    """Check that dataset paths exist on the cluster's shared storage, all in one SSH round trip.

    Paths are validated and resolved before any SSH command: only ``lustre:///abs/path``,
    ``slurm:///abs/path`` (or ``slurm://host/abs/path``) and plain absolute paths are accepted;
    ``file://`` URIs, other schemes and relative paths are refused (the data must already be on
    shared storage). Then every path is tested with ``test -e`` from the login host.

    ``slurm_conn_id`` (the ``tao_slurm`` connection, default ``slurm_default``) and the ``BaseOperator``
    arguments (``task_id``, ``retries``, ...) are passed on through ``**kwargs``.

    :param paths: a list or a dict (names to paths) of dataset locations; templated.
    :rtype: dict[str, str] | list[str]
    :returns: the resolved absolute cluster paths, in the same shape (dict in, dict out).
    :raises StoragePathError: listing every invalid entry, before any SSH command.
    :raises MissingPathsError: listing every path that does not exist.
    """

    template_fields = ("paths",)

    def __init__(self, *, paths: Mapping[str, str] | Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.paths = paths

    def execute(self, context: Any) -> dict[str, str] | list[str]:
        """Resolve the paths, test them on the cluster and return them resolved."""
        from airflow_provider_tao_slurm.core.storage import display_value, missing_paths_error, resolve_paths

        resolved = resolve_paths(self.paths, param="paths")
        labelled = (
            [(f"paths[{display_value(key)}]", path) for key, path in resolved.items()]
            if isinstance(resolved, dict)
            else [(f"paths[{index}]", path) for index, path in enumerate(resolved)]
        )
        missing = set(self.hook.check_paths(list(dict.fromkeys(path for _, path in labelled))))
        if missing:
            raise missing_paths_error(labelled, missing, self.hook.settings.cluster_name, fix="correct the paths")
        self.log.info("All %d dataset path(s) exist on the cluster", len(labelled))
        return resolved
