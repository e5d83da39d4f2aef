"""The storm benchmark's token bucket (``benchmarks/ratelimit.py``): bursts in, throttled RPCs and delays out."""

from __future__ import annotations

from pathlib import Path

import pytest
from examples import load_file

ratelimit = load_file("bench_ratelimit", Path(__file__).resolve().parents[2] / "benchmarks" / "ratelimit.py")


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


def test_refusals_counts_one_users_lines_in_slurmctlds_log() -> None:
    log = (
        "[2026-12-07T10:00:00.001] RPC rate limit exceeded by uid 1001 with REQUEST_JOB_INFO from 127.0.0.1, "
        "telling to back off\n"
        "[2026-12-07T10:00:00.002] RPC rate limit exceeded by uid 10010 with REQUEST_JOB_INFO, telling to back off\n"
        "[2026-12-07T10:00:00.003] _slurm_rpc_submit_batch_job: JobId=12 InitPrio=1 usec=200\n"
        "[2026-12-07T10:00:00.004] RPC rate limit exceeded by uid 1001 with REQUEST_SUBMIT_BATCH_JOB, telling to "
        "back off\n"
    )
    assert ratelimit.refusals(log, 1001) == 2
    assert ratelimit.refusals(log, 10010) == 1
    assert ratelimit.refusals(log, 1002) == 0
    assert ratelimit.refusals("", 1001) == 0


@pytest.mark.parametrize(
    ("parameters", "limit"),
    [
        pytest.param("rl_enable", (30, 2.0), id="SLURM's defaults"),
        pytest.param("rl_enable,rl_bucket_size=30,rl_refill_rate=2", (30, 2.0), id="the benchmark's"),
        pytest.param(
            "enable_configless,rl_enable,rl_bucket_size=10,rl_refill_rate=4,rl_refill_period=2",
            (10, 2.0),
            id="among other parameters, a refill period",
        ),
        pytest.param("(null)", None, id="none"),
        pytest.param("enable_configless", None, id="other parameters only"),
        pytest.param("", None, id="nothing"),
    ],
)
def test_site_limit(parameters: str, limit: tuple[int, float] | None) -> None:
    found = ratelimit.site_limit(parameters)
    assert (None if found is None else (found.bucket, found.refill_per_s)) == limit


@pytest.mark.parametrize(
    ("submissions", "floor_s"),
    [
        pytest.param(1, 0.0, id="one fits the provider's bucket of 24"),
        pytest.param(3, 0.0, id="21 tokens still fit"),
        pytest.param(4, 2.5, id="28 tokens: 4 past the bucket at 1.6 per second"),
        pytest.param(10, 28.75, id="70 tokens: 46 past it"),
        pytest.param(40, 160.0, id="the storm's 40"),
    ],
)
def test_pacing_floor_is_the_tokens_past_the_providers_bucket_at_its_refill(submissions: int, floor_s: float) -> None:
    limit = ratelimit.site_limit("rl_enable,rl_bucket_size=30,rl_refill_rate=2")
    assert ratelimit.pacing_floor_s(submissions, 7, limit, 0.8) == pytest.approx(floor_s)
