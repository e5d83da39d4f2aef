"""Late binding of the literal tokens ``{results_dir}``, ``{job_id}`` and ``{config_path}``.

Only these exact tokens are replaced, after the job record is opened (the record owns the
results dir). Nothing else in the text is touched, so shell braces (``${VAR}``, ``{ a; }``) and
JSON survive unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_tao_slurm.exceptions import ValidationError

TOKENS = ("results_dir", "job_id", "config_path")


def binding_values(*, results_dir: str, job_id: str, config_path: str) -> dict[str, str]:
    """Return the token → value table for one job."""
    return {"{results_dir}": results_dir, "{job_id}": job_id, "{config_path}": config_path}


def bind_text(text: str, values: Mapping[str, str]) -> str:
    """Replace every literal token of ``values`` in ``text``; nothing else changes."""
    for token, value in values.items():
        text = text.replace(token, value)
    return text


def bind_value(value: Any, values: Mapping[str, str], *, where: str = "value") -> Any:
    """Bind tokens in every string inside ``value`` (dicts, lists, tuples); other scalars pass through.

    :raises ValidationError: for types a spec cannot hold (sets, objects).
    """
    if isinstance(value, str):
        return bind_text(value, values)
    if isinstance(value, Mapping):
        return {key: bind_value(item, values, where=f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [bind_value(item, values, where=f"{where}[{i}]") for i, item in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise ValidationError(f"{where} has a {type(value).__name__}; use strings, numbers, lists and dicts")
