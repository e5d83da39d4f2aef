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


def refusals(log_text: str, uid: int) -> int:
    """RPCs of user ``uid`` that slurmctld's rate limit refused, counted in slurmctld's log text.

    slurmctld logs each refusal (at ``info``, unless ``rl_log_freq`` thins them out) as
    ``RPC rate limit exceeded by uid <uid> with <RPC> [from <address>], telling to back off``.
    """
    mark = f"RPC rate limit exceeded by uid {uid} "
    return sum(mark in line for line in log_text.splitlines())


@dataclass(frozen=True)
class SiteLimit:
    """slurmctld's limiter as ``SlurmctldParameters`` sets it (``rl_enable`` and its ``rl_*`` settings).

    :ivar bucket: ``rl_bucket_size`` (30 by default).
    :ivar refill_per_s: ``rl_refill_rate`` / ``rl_refill_period`` (2 per 1 s by default).
    """

    bucket: int
    refill_per_s: float


def site_limit(parameters: str) -> SiteLimit | None:
    """The limiter ``SlurmctldParameters`` (``rl_enable,rl_bucket_size=30,...``) sets; None without ``rl_enable``."""
    items = dict(item.strip().partition("=")[::2] for item in parameters.split(",") if item.strip())
    if "rl_enable" not in items:
        return None
    period = float(items.get("rl_refill_period") or 1) or 1.0
    return SiteLimit(
        int(items.get("rl_bucket_size") or DEFAULT_BUCKET_SIZE), float(items.get("rl_refill_rate") or 2) / period
    )


def pacing_floor_s(submissions: int, cost: int, limit: SiteLimit, share: float) -> float:
    """The least time ``submissions`` submissions in a row must wait under the provider's pacing.

    The provider paces at ``share`` of the site's bucket and refill (``core/commands/pacing.py``: a bucket of
    ``int(share * bucket)`` tokens, full at the start, ``share * refill`` per second), each submission taking
    ``cost`` tokens before it sends anything: the tokens past the bucket arrive at the refill rate.
    """
    size = max(1, int(share * limit.bucket))
    rate = share * limit.refill_per_s
    return max(0.0, submissions * cost - size) / rate if rate > 0 else 0.0
