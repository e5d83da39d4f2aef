"""Hostile specs are refused before they are built: aliases (bombs), deep nesting, huge values and texts."""

from __future__ import annotations

import resource
import time
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.specs import (
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    MAX_SPEC_NODES,
    MAX_SPEC_STRING,
    load_spec,
)
from airflow_provider_tao_slurm.exceptions import ValidationError

BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def _nested_dict(depth: int) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for _ in range(depth):
        spec = {"x": spec}
    return spec


def _shared_bomb(levels: int) -> dict[str, Any]:
    """A dict whose shared sub-lists expand to 9**levels values when walked (the in-memory billion laughs)."""
    value: Any = ["lol"] * 9
    for _ in range(levels):
        value = [value] * 9
    return {"bomb": value}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(BILLION_LAUGHS, "spec uses the YAML alias *a", id="yaml-billion-laughs"),
        pytest.param("a: &x 1\nb: *x\n", "spec uses the YAML alias *x", id="yaml-one-alias"),
        pytest.param("a: " + "[" * 10_000 + "]" * 10_000, f"deeper than {MAX_SPEC_DEPTH} levels", id="yaml-deep"),
        pytest.param("x: " + "y" * (MAX_SPEC_BYTES + 1), f"more than {MAX_SPEC_BYTES}", id="yaml-huge-text"),
        pytest.param("[" + ", ".join(["1"] * (MAX_SPEC_NODES + 1)) + "]", f"more than {MAX_SPEC_NODES} values",
                     id="yaml-many-values"),
        pytest.param(_nested_dict(MAX_SPEC_DEPTH + 5), f"deeper than {MAX_SPEC_DEPTH} levels", id="dict-deep"),
        pytest.param(_shared_bomb(8), f"more than {MAX_SPEC_NODES} values", id="dict-shared-bomb"),
        pytest.param({"x": "y" * (MAX_SPEC_STRING + 1)}, f"more than {MAX_SPEC_STRING}", id="dict-huge-string"),
        pytest.param("a: [1, 2", "spec is not valid YAML", id="yaml-broken"),
        pytest.param("- 1\n- 2\n", "spec must be a mapping", id="yaml-list"),
    ],
)  # fmt: skip
def test_hostile_specs_are_refused_quickly_in_little_memory(spec: Any, message: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.process_time()
    with pytest.raises(ValidationError, match=message.replace("*", r"\*")):
        load_spec(spec)
    assert time.process_time() - started < 5, "refused without building or walking the whole thing"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200 * 1024, f"peak memory grew by {grown_kib} KiB"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(None, None, id="none"),
        pytest.param("train:\n  epochs: 3\n  lr: 0.001\n", {"train": {"epochs": 3, "lr": 0.001}}, id="yaml"),
        pytest.param({"train": {"epochs": 3}, "paths": ["/a", "/b"]}, {"train": {"epochs": 3}, "paths": ["/a", "/b"]},
                     id="dict"),
        pytest.param(_nested_dict(MAX_SPEC_DEPTH - 1), _nested_dict(MAX_SPEC_DEPTH - 1), id="deep-but-allowed"),
        pytest.param("note: 'an & in text'\n", {"note": "an & in text"}, id="ampersand-in-a-string"),
    ],
)  # fmt: skip
def test_ordinary_specs_load(spec: Any, expected: Any) -> None:
    assert load_spec(spec) == expected
