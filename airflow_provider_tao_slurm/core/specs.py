"""A TAO spec from a DAG: read with bounds, so a hostile or broken spec is refused quickly in little memory.

YAML text is checked event by event before anything is built (``yaml.parse`` streams, it does not
recurse): its size, its nesting depth and its number of nodes are bounded, and aliases (``*name``)
are refused, which is what makes "billion laughs" bombs small on paper and huge once expanded. A
spec given as a dict is walked with the same bounds. Nothing here touches the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from airflow_provider_tao_slurm.exceptions import ValidationError

#: Largest spec text, in bytes (TAO specs are a few KiB).
MAX_SPEC_BYTES = 1 << 20
#: Deepest nesting of mappings and lists.
MAX_SPEC_DEPTH = 32
#: Most scalars, mappings and lists in one spec.
MAX_SPEC_NODES = 50_000
#: Longest single string value, in characters.
MAX_SPEC_STRING = 64 * 1024

_OPENING = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSING = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def load_spec(spec: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """Return the spec as a dict, checked: YAML text is parsed within the bounds, a mapping is walked.

    :param spec: a mapping, YAML text of a mapping, or None.
    :returns: the spec (None when none was given).
    :raises ValidationError: naming the bound that was crossed or the YAML problem, and the fix.
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        spec = _load_yaml(spec)
    if not isinstance(spec, Mapping):
        raise ValidationError(
            "spec must be a mapping (a dict, YAML text of a mapping, or a .yaml file next to the DAG)"
        )
    _check_shape(spec)
    return dict(spec)


def _load_yaml(text: str) -> Any:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise ValidationError(
            f"spec is {size} bytes, more than {MAX_SPEC_BYTES}; put large data in files on shared storage "
            "and name their paths in the spec"
        )
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise ValidationError(
                    f"spec uses the YAML alias *{event.anchor}: aliases are refused (they can expand a small text "
                    "into a huge spec); write the values out"
                )
            if isinstance(event, _OPENING):
                depth += 1
                if depth > MAX_SPEC_DEPTH:
                    raise ValidationError(f"spec nests deeper than {MAX_SPEC_DEPTH} levels; flatten it")
            elif isinstance(event, _CLOSING):
                depth -= 1
            if isinstance(event, (*_OPENING, yaml.ScalarEvent)):
                nodes += 1
                if nodes > MAX_SPEC_NODES:
                    raise ValidationError(f"spec has more than {MAX_SPEC_NODES} values; put bulk data in files")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValidationError(f"spec is not valid YAML: {exc}") from None


def _check_shape(spec: Mapping[str, Any]) -> None:
    """Walk a mapping spec (iteratively) within the same bounds; shared sub-objects count each time."""
    stack: list[tuple[Any, int]] = [(spec, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SPEC_NODES:
            raise ValidationError(f"spec has more than {MAX_SPEC_NODES} values; put bulk data in files")
        if isinstance(value, str):
            if len(value) > MAX_SPEC_STRING:
                raise ValidationError(
                    f"a spec value is {len(value)} characters long, more than {MAX_SPEC_STRING}; put it in a file"
                )
            continue
        children = value.items() if isinstance(value, Mapping) else value if isinstance(value, list | tuple) else None
        if children is None:
            continue
        if depth > MAX_SPEC_DEPTH:
            raise ValidationError(f"spec nests deeper than {MAX_SPEC_DEPTH} levels; flatten it")
        for child in children:
            if isinstance(child, tuple) and isinstance(value, Mapping):
                stack.extend((item, depth + 1) for item in child)
            else:
                stack.append((child, depth + 1))
