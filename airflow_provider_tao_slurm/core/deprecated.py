"""The previous release's public names in ``core``, kept for one more release as deprecated aliases.

Each alias calls (or is) the current code and warns once per use with ``DeprecationWarning``: ``core``
imports no Airflow, and Airflow's ``AirflowProviderDeprecationWarning`` (which the hook's aliases
raise) is a subclass of it, so one filter catches both. They go in the next release.
"""

from __future__ import annotations

import warnings

PACKAGE = "airflow_provider_tao_slurm"


def warn_moved(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` (``core.commands.Partition``) is deprecated and ``new`` replaces it.

    :param stacklevel: the caller of the alias, for the warning's location.
    """
    warnings.warn(
        f"{PACKAGE}.{old} is deprecated and will be removed in the next release; use {PACKAGE}.{new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
