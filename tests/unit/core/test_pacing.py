"""The RPC pacing fragment, run by real shells (bash and dash) with real ``flock``, ``awk`` and ``sed``.

Only the clock, ``sleep`` and ``scontrol`` are stand-ins: ``date`` prints the time a test sets, ``sleep``
records what it was asked to wait instead of waiting, and ``scontrol`` prints the ``show config`` lines a
test sets (the real one is read on real releases by tests/cluster/test_hook.py) and counts its calls.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from airflow_provider_tao_slurm.core.commands import PACED_PREFIX, SUBMISSION_RPCS, parse_paced, rpc_pacing, site_config
from airflow_provider_tao_slurm.core.commands.pacing import LIMITS_CACHE_S, Paced
from airflow_provider_tao_slurm.core.preemption import parse_preemption

SHELLS = ["bash", "dash"]


@pytest.fixture
def login(tmp_path: Path) -> Path:
    """A home and a ``bin`` with the stand-in clock and sleep."""
    (tmp_path / "home").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "date").write_text(f'#!/bin/sh\ncat "{tmp_path}/now"\n')
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho "$1" >> "{tmp_path}/slept"\n')
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "$*" >> "{tmp_path}/scontrol-calls"\n'
        f'[ -f "{tmp_path}/config" ] || {{ echo "slurm_load_ctl_conf error: Unable to contact slurm controller" >&2; '
        f'exit 1; }}\ncat "{tmp_path}/config"\n'
    )
    for tool in ("date", "sleep", "scontrol"):
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
    why = "rpc_refill_rate set on the connection; the provider paces at a bucket of 5, 2 per s"
    assert (out, err) == ("sent\n", f"{PACED_PREFIX}2.500 {why}\n")
    assert parse_paced(err) == Paced(2.5, why, "")


@pytest.mark.parametrize(
    ("stderr", "parsed"),
    [
        ("", (0.0, "", "")),
        ("sbatch: error: Invalid partition\n", (0.0, "", "sbatch: error: Invalid partition\n")),
        (f"{PACED_PREFIX}12.5 why\nsbatch: warning\n", (12.5, "why", "sbatch: warning\n")),
        (f"{PACED_PREFIX}12.5\n", (12.5, "", "")),
        (f"{PACED_PREFIX}soon\n", (0.0, "", f"{PACED_PREFIX}soon\n")),
    ],
    ids=["empty", "other-lines-kept", "paced-line-taken-out", "no-reason", "unreadable-kept"],
)
def test_parse_paced(stderr: str, parsed: tuple[float, str, str]) -> None:
    assert parse_paced(stderr) == parsed


def site(login: Path, parameters: str | None) -> None:
    """What the stand-in ``scontrol show config`` prints for ``SlurmctldParameters`` (None: it fails)."""
    config = login / "config"
    if parameters is None:
        config.unlink(missing_ok=True)
    else:
        config.write_text(
            f"MinJobAge               = 300 sec\nSlurmctldParameters     = {parameters}\nSwitchType = (null)\n"
        )


def scontrol_calls(login: Path) -> int:
    path = login / "scontrol-calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("parameters", "waits", "why"),
    [
        # 5 takes of 7 at one moment: the site's share of its bucket and refill decides who waits, how long
        ("(null)", [], None),
        ("enable_configless,idle_on_node_suspend", [], None),
        (None, [], None),  # scontrol failed: nothing known, nothing paced
        (
            "rl_enable",
            [2.5, 6.875],
            "rl_enable: bucket 30, 2 per 1 s); the provider paces at a bucket of 24, 1.6 per s",
        ),
        (
            "enable_configless,rl_enable,rl_bucket_size=10,rl_refill_rate=1,rl_refill_period=2",
            [15.0, 32.5, 50.0, 67.5],
            "rl_enable: bucket 10, 1 per 2 s); the provider paces at a bucket of 8, 0.4 per s",
        ),
    ],
    ids=["no-parameters", "no-limiter", "unreadable", "limiter-defaults", "limiter-set"],
)
def test_the_site_limiter_decides(
    login: Path, shell: str, parameters: str | None, waits: list[float], why: str | None
) -> None:
    site(login, parameters)
    errors = [take_both(login, shell, 0, rpc_pacing(SUBMISSION_RPCS))[1] for _ in range(5)]
    assert slept(login) == waits
    if why is None:
        assert errors == [""] * 5
        assert not (login / "home" / ".tao-slurm" / "rpc-bucket").exists()
    else:
        assert parse_paced(errors[-1]).reason == f"the site limits RPCs ({why}"
    # the site's answer is asked once and kept; an unreadable one is never kept
    assert scontrol_calls(login) == (5 if parameters is None else 1)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_site_is_asked_again_once_its_answer_is_old(login: Path, shell: str) -> None:
    site(login, "(null)")
    fragment = rpc_pacing(SUBMISSION_RPCS)
    take(login, shell, 1000, fragment)
    site(login, "rl_enable,rl_bucket_size=5")  # the site turns its limiter on
    take(login, shell, 1000 + LIMITS_CACHE_S - 1, fragment)
    assert (scontrol_calls(login), slept(login)) == (1, [])
    take(login, shell, 1000 + LIMITS_CACHE_S, fragment)
    take(login, shell, 1000 + LIMITS_CACHE_S, fragment)
    assert scontrol_calls(login) == 2
    assert slept(login) == [1.875, 6.25]  # bucket 4 at 1.6/s: the first take leaves -3, the second -10
    take(login, shell, 500, fragment)  # a clock behind the cache's stamp (another login host's): asked again
    assert scontrol_calls(login) == 3


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("size", "rate", "parameters", "waits", "asked"),
    [
        (None, 1.0, "(null)", [], 1),  # the connection's rate paces without a site limiter: bucket 24 of it
        (5, None, "(null)", [], 1),  # a size alone paces nothing where the site has no limiter
        (5, None, "rl_enable", [1.25, 5.625, 10.0], 1),  # the given size, the site's share of its refill
        (7, 1.0, "rl_enable", [7.0, 14.0], 0),  # both given: the site is not asked
    ],
    ids=["rate-given", "size-given-no-limiter", "size-given-limiter", "both-given"],
)
def test_the_connection_sets_figures(
    login: Path,
    shell: str,
    size: int | None,
    rate: float | None,
    parameters: str,
    waits: list[float],
    asked: int,
) -> None:
    site(login, parameters)
    for _ in range(3):
        take(login, shell, 0, rpc_pacing(SUBMISSION_RPCS, size, rate))
    assert slept(login) == [pytest.approx(wait) for wait in waits]
    assert scontrol_calls(login) == asked


def config(login: Path, text: str | None) -> None:
    """What the stand-in ``scontrol show config`` prints (None: it fails)."""
    path = login / "config"
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(text)


PREEMPTION = (
    "MinJobAge               = 300 sec\nPreemptMode             = REQUEUE\n"
    "PreemptType             = preempt/partition_prio\nSlurmctldParameters     = {ctld}\nSwitchType = (null)\n"
)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_preemption_read_shares_the_pacing_cache(login: Path, shell: str) -> None:
    config(login, PREEMPTION.format(ctld="preempt_send_user_signal"))
    printed = take(login, shell, 1000, site_config() + ";")
    site = parse_preemption(printed)
    assert (site.preempt_type, site.mode, site.warns_batch_shell) == ("preempt/partition_prio", "REQUEUE", True)
    assert "MinJobAge" not in printed  # only the lines that matter
    # the pacing takes its SlurmctldParameters from the same read, and the preemption read from the pacing's
    assert take(login, shell, 1010, rpc_pacing(SUBMISSION_RPCS)) == "sent\n"
    config(login, PREEMPTION.format(ctld="(null)"))
    assert parse_preemption(take(login, shell, 1020, site_config() + ";")).warns_batch_shell
    assert scontrol_calls(login) == 1
    # a fresh read (the preflight's) asks scontrol, and the pacing's next read is the new answer
    assert not parse_preemption(take(login, shell, 1030, site_config(0) + ";")).warns_batch_shell
    assert scontrol_calls(login) == 2
    (login / "home" / ".tao-slurm" / "slurmctld-preemption").unlink()
    take(login, shell, 1040, rpc_pacing(SUBMISSION_RPCS))  # the pacing's cache is fresh: scontrol not asked
    assert scontrol_calls(login) == 2
    # an old cache is read again, by either
    take(login, shell, 1030 + LIMITS_CACHE_S, rpc_pacing(SUBMISSION_RPCS))
    assert scontrol_calls(login) == 3
    assert take(login, shell, 1030 + LIMITS_CACHE_S, site_config() + ";").startswith("PreemptMode")
    assert scontrol_calls(login) == 3


@pytest.mark.parametrize("shell", SHELLS)
def test_a_failed_preemption_read_prints_nothing_and_keeps_nothing(login: Path, shell: str) -> None:
    config(login, None)
    (login / "now").write_text("1000.0\n")
    env = {"HOME": str(login / "home"), "PATH": f"{login / 'bin'}:/usr/bin:/bin"}
    proc = subprocess.run([shell, "-c", site_config()], env=env, capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert not (login / "home" / ".tao-slurm" / "slurmctld-preemption").exists()
    with pytest.raises(ValueError, match="bad cache age"):
        site_config(-1)
