"""The storm benchmark's token bucket (``benchmarks/ratelimit.py``): bursts in, throttled RPCs and delays out."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "ratelimit.py"
_SPEC = importlib.util.spec_from_file_location("bench_ratelimit", _PATH)
assert _SPEC is not None
assert _SPEC.loader is not None
ratelimit = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = ratelimit  # dataclasses look their module up while the class is made
_SPEC.loader.exec_module(ratelimit)


def burst(count: int, at: float = 0.0) -> list[float]:
    """``count`` RPCs sent at the same time."""
    return [at] * count


@pytest.mark.parametrize(
    ("arrivals", "throttled", "max_delay_s", "finished_at"),
    [
        pytest.param([], 0, 0.0, 0.0, id="nothing"),
        pytest.param(burst(1), 0, 0.0, 0.0, id="one RPC"),
        pytest.param(burst(30), 0, 0.0, 0.0, id="a full bucket's worth at once"),
        pytest.param(burst(31), 1, 0.5, 0.5, id="one past the bucket waits for half a second's refill"),
        pytest.param(burst(40), 10, 5.0, 5.0, id="40 at once: 10 wait, the last 5 s"),
        pytest.param(burst(30) + burst(10, at=5.0), 0, 0.0, 5.0, id="the bucket refilled 10 tokens in 5 s"),
        pytest.param(burst(30) + burst(12, at=5.0), 2, 1.0, 6.0, id="2 more than the refill"),
        pytest.param([i * 0.5 for i in range(1000)], 0, 0.0, 499.5, id="2 per second forever: the refill rate"),
        pytest.param([i * 0.25 for i in range(120)], 61, 15.25, 45.0, id="4 per second for 30 s: 59 fit"),
        pytest.param(burst(5, at=100.0), 0, 0.0, 100.0, id="a burst later on the clock"),
    ],
)
def test_throttle(arrivals: list[float], throttled: int, max_delay_s: float, finished_at: float) -> None:
    result = ratelimit.throttle(arrivals)
    assert result.rpcs == len(arrivals)
    assert result.throttled == throttled
    assert result.max_delay_s == pytest.approx(max_delay_s)
    assert result.finished_at == pytest.approx(finished_at)


@pytest.mark.parametrize(
    ("size", "refill_per_s", "throttled", "max_delay_s"),
    [
        pytest.param(10, 2.0, 30, 15.0, id="a smaller bucket"),
        pytest.param(30, 10.0, 10, 1.0, id="a faster refill"),
    ],
)
def test_throttle_with_site_settings(size: int, refill_per_s: float, throttled: int, max_delay_s: float) -> None:
    result = ratelimit.throttle(burst(40), size=size, refill_per_s=refill_per_s)
    assert (result.throttled, result.max_delay_s) == (throttled, pytest.approx(max_delay_s))


def test_arrival_order_does_not_matter() -> None:
    times = [3.0, 0.0, 0.0, 1.0] * 20
    assert ratelimit.throttle(times) == ratelimit.throttle(sorted(times))
