"""The RPC pacing fragment, run by real shells (bash and dash) with real ``flock`` and ``awk``.

Only the clock and ``sleep`` are stand-ins: ``date`` prints the time a test sets, and ``sleep`` records
what it was asked to wait instead of waiting.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from airflow_provider_tao_slurm.core.commands import PACED_PREFIX, SUBMISSION_RPCS, parse_paced, rpc_pacing

SHELLS = ["bash", "dash"]


@pytest.fixture
def login(tmp_path: Path) -> Path:
    """A home and a ``bin`` with the stand-in clock and sleep."""
    (tmp_path / "home").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "date").write_text(f'#!/bin/sh\ncat "{tmp_path}/now"\n')
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho "$1" >> "{tmp_path}/slept"\n')
    for tool in ("date", "sleep"):
        (bin_dir / tool).chmod(0o755)
    return tmp_path


def take(login: Path, shell: str, now: float, fragment: str, *, home: str | None = None) -> str:
    """Run ``fragment`` then ``echo sent`` at time ``now``; return what the command printed."""
    return take_both(login, shell, now, fragment, home=home)[0]


def take_both(login: Path, shell: str, now: float, fragment: str, *, home: str | None = None) -> tuple[str, str]:
    """As :func:`take`: stdout and stderr."""
    (login / "now").write_text(f"{now:.6f}\n")
    env = {"HOME": home or str(login / "home"), "PATH": f"{login / 'bin'}:/usr/bin:/bin"}
    proc = subprocess.run(
        [shell, "-c", fragment + "echo sent"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def slept(login: Path) -> list[float]:
    """The waits asked of ``sleep`` (a take that need not wait sleeps 0 s: left out)."""
    path = login / "slept"
    return [float(line) for line in path.read_text().split() if float(line)] if path.exists() else []


def bucket(login: Path) -> tuple[float, float]:
    tokens, stamp = (login / "home" / ".tao-slurm" / "rpc-bucket").read_text().split()
    return float(tokens), float(stamp)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("takes", "waits", "left"),
    [
        # (time, cost) of each take; the waits of those that waited; the tokens left after the last one
        ([(0, 5)], [], 5.0),
        ([(0, 5), (0, 5)], [], 0.0),
        ([(0, 5), (0, 5), (0, 5)], [2.5], -5.0),
        ([(0, 5), (0, 5), (0, 5), (1, 5)], [2.5, 4.0], -8.0),
        ([(0, 5), (0, 5), (0, 5), (100, 5)], [2.5], 5.0),  # refilled to the bucket's size, not beyond
        ([(0, 10), (0, 10), (0, 10), (0, 10)], [5.0, 6.0, 6.0], -12.0),  # each wait capped at 6 s
        ([(50, 5), (40, 5)], [], 0.0),  # a clock behind the stamp (another login host's) refills nothing
    ],
    ids=["first", "bucket-spent", "waits-for-refill", "refill-between", "full-again", "capped", "clock-behind"],
)
def test_takes_wait_for_their_tokens(
    login: Path, shell: str, takes: list[tuple[float, int]], waits: list[float], left: float
) -> None:
    for now, cost in takes:
        assert take(login, shell, now, rpc_pacing(cost, 10, 2.0, max_wait=6.0)) == "sent\n"
    assert slept(login) == waits
    assert bucket(login)[0] == pytest.approx(left)


@pytest.mark.parametrize("shell", SHELLS)
def test_an_unusable_home_sends_at_once(login: Path, shell: str) -> None:
    """Pacing is a courtesy: a home where the bucket cannot live never stops the submission."""
    blocker = login / "not-a-dir"
    blocker.write_text("")
    assert take(login, shell, 0, rpc_pacing(5, 1, 1.0), home=str(blocker)) == "sent\n"
    assert slept(login) == []


def test_no_refill_means_no_pacing() -> None:
    assert rpc_pacing(SUBMISSION_RPCS, 24, 0) == ""


@pytest.mark.parametrize(
    ("cost", "size", "rate", "wait"), [(0, 24, 1.6, 1.0), (5, 0, 1.6, 1.0), (5, 24, -1.0, 1.0), (5, 24, 1.6, -1.0)]
)
def test_bad_pacing_is_refused(cost: int, size: int, rate: float, wait: float) -> None:
    with pytest.raises(ValueError, match="bad pacing"):
        rpc_pacing(cost, size, rate, max_wait=wait)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_take_that_waited_says_so_on_stderr(login: Path, shell: str) -> None:
    fragment = rpc_pacing(5, 5, 2.0)
    assert take_both(login, shell, 0, fragment) == ("sent\n", "")
    out, err = take_both(login, shell, 0, fragment)
    assert (out, err) == ("sent\n", f"{PACED_PREFIX}2.500\n")
    assert parse_paced(err) == (2.5, "")


@pytest.mark.parametrize(
    ("stderr", "parsed"),
    [
        ("", (0.0, "")),
        ("sbatch: error: Invalid partition\n", (0.0, "sbatch: error: Invalid partition\n")),
        (f"{PACED_PREFIX}12.5\nsbatch: warning\n", (12.5, "sbatch: warning\n")),
        (f"{PACED_PREFIX}soon\n", (0.0, f"{PACED_PREFIX}soon\n")),
    ],
    ids=["empty", "other-lines-kept", "paced-line-taken-out", "unreadable-kept"],
)
def test_parse_paced(stderr: str, parsed: tuple[float, str]) -> None:
    assert parse_paced(stderr) == parsed
