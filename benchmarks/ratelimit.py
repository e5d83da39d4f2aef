"""SLURM's per-user RPC rate limit (``rl_enable``, slurmctld 23.02+) simulated over a timeline of RPCs.

No side effects on import: ``benchmarks/storm.py`` applies it to the RPCs it measured, and
``tests/unit/test_bench_ratelimit.py`` loads this file by path.

slurmctld gives each user a bucket of ``rl_bucket_size`` tokens (30 by default), refilled by
``rl_refill_rate`` tokens (2) every ``rl_refill_period`` seconds (1); an RPC that finds the bucket empty
is refused, and the client command sleeps and sends it again. The simulation lets every refused RPC
wait, in arrival order, until a token is there (an ideal retry: the real clients' sleeps only add to the
delay), and refills continuously at the average rate (2 tokens per second).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: slurmctld's defaults with ``rl_enable``: the bucket's size and the tokens refilled per second.
DEFAULT_BUCKET_SIZE = 30
DEFAULT_REFILL_PER_S = 2.0


@dataclass(frozen=True)
class Throttling:
    """What the bucket does to a timeline of RPCs.

    :ivar rpcs: RPCs in the timeline.
    :ivar throttled: RPCs that found the bucket empty (refused at least once, then sent again).
    :ivar max_delay_s: the longest an RPC waited for a token.
    :ivar finished_at: when the last RPC got its token (seconds, on the timeline's clock).
    """

    rpcs: int
    throttled: int
    max_delay_s: float
    finished_at: float


def throttle(
    arrivals: Iterable[float], *, size: int = DEFAULT_BUCKET_SIZE, refill_per_s: float = DEFAULT_REFILL_PER_S
) -> Throttling:
    """Run ``arrivals`` (each RPC's send time, seconds) through one user's token bucket, full at the start.

    :param size: the bucket's capacity (``rl_bucket_size``).
    :param refill_per_s: tokens added per second (``rl_refill_rate`` / ``rl_refill_period``).
    """
    tokens = float(size)
    clock: float | None = None  # when the previous RPC got its token
    throttled, max_delay, count = 0, 0.0, 0
    for sent in sorted(arrivals):
        served = sent if clock is None else max(sent, clock)  # a refused RPC's successors queue behind it
        if clock is not None:
            tokens = min(float(size), tokens + (served - clock) * refill_per_s)
        if tokens < 1.0:
            served += (1.0 - tokens) / refill_per_s
            tokens = 1.0
        tokens -= 1.0
        delay = served - sent
        throttled += delay > 1e-9
        max_delay = max(max_delay, delay)
        clock = served
        count += 1
    return Throttling(count, throttled, max_delay, clock if clock is not None else 0.0)
