#!/usr/bin/env python3
"""Times the phases of ``make test`` and prints them at its end (standard library only).

Usage (``make test`` runs these):

- ``phases.py start``: a new run; forget the phases of any earlier one.
- ``phases.py run NAME -- COMMAND...``: run COMMAND as the phase NAME, record its wall time and exit status,
  and exit with that status; a phase that failed prints the table so far first.
- ``phases.py background NAME -- COMMAND...``: start COMMAND as the phase NAME and return at once; it runs beside
  the phases that follow, its output going to a log file in :data:`STATE`.
- ``phases.py wait NAME``: wait for that phase, record it, print its log's end when it failed, exit with its status.
- ``phases.py show``: the table of every phase recorded since ``start``, and the run's wall time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("TAO_PHASES_DIR", "/tmp/tao-slurm-phases"))
LEDGER = STATE / "phases.tsv"
STARTED = STATE / "started"
POLL_S = 2.0


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60:3d}:{int(seconds) % 60:02d}"


def _record(name: str, seconds: float, status: int, how: str = "") -> None:
    with LEDGER.open("a") as ledger:
        ledger.write(f"{name}\t{seconds:.1f}\t{status}\t{how}\n")


def show() -> None:
    """Print every phase recorded since ``start``: name, minutes:seconds, outcome; then the run's wall time."""
    rows = [line.split("\t") for line in LEDGER.read_text().splitlines()] if LEDGER.is_file() else []
    width = max([len(name) for name, *_ in rows] + [10])
    print("\nmake test, phase by phase:")
    for name, seconds, status, how in rows:
        outcome = "ok" if status == "0" else f"FAILED (exit {status})"
        print(f"  {name:<{width}}  {_clock(float(seconds))}  {outcome}{f' ({how})' if how else ''}")
    if STARTED.is_file():
        print(f"  {'wall time':<{width}}  {_clock(time.time() - float(STARTED.read_text()))}")


def run(name: str, command: list[str]) -> int:
    """Run one phase in the foreground."""
    started = time.monotonic()
    status = subprocess.run(command, check=False).returncode
    _record(name, time.monotonic() - started, status)
    if status != 0:
        show()
    return status


def _slug(name: str) -> str:
    return "".join(char if char.isalnum() else "-" for char in name)


def background(name: str, command: list[str]) -> int:
    """Start one phase beside the next ones (in a session of its own, so make's end of a recipe line leaves it)."""
    slug = _slug(name)
    (STATE / f"{slug}.status").unlink(missing_ok=True)
    with (STATE / f"{slug}.log").open("w") as log:
        subprocess.Popen(
            [sys.executable, __file__, "_track", name, "--", *command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    print(f"phases: {name} started in the background (log: {STATE / f'{slug}.log'})", flush=True)
    return 0


def track(name: str, command: list[str]) -> int:
    """The background phase itself: run COMMAND, then leave its time and status for ``wait``."""
    started = time.monotonic()
    status = subprocess.run(command, check=False).returncode
    (STATE / f"{_slug(name)}.status").write_text(f"{time.monotonic() - started:.1f}\t{status}\n")
    return status


def wait(name: str) -> int:
    """Wait for a background phase; record it; on failure print its log's end and the table."""
    slug = _slug(name)
    status_file = STATE / f"{slug}.status"
    if not (STATE / f"{slug}.log").is_file():
        print(f"phases: no phase {name!r} was started in the background", file=sys.stderr)
        return 2
    waited = time.monotonic()
    while not status_file.is_file():
        time.sleep(POLL_S)
    seconds, status = status_file.read_text().split()
    how = f"in the background, waited for {time.monotonic() - waited:.0f} s"
    _record(name, float(seconds), int(status), how)
    if status != "0":
        lines = (STATE / f"{slug}.log").read_text(errors="replace").splitlines()
        print("\n".join(lines[-60:]), file=sys.stderr)
        show()
    return int(status)


def main(argv: list[str]) -> int:
    """Run one subcommand (see the module's docstring)."""
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "start":
        STATE.mkdir(parents=True, exist_ok=True)
        LEDGER.write_text("")
        STARTED.write_text(f"{time.time()}\n")
        return 0
    if command == "show":
        show()
        return 0
    if command == "wait" and len(rest) == 1:
        return wait(rest[0])
    phases = {"run": run, "background": background, "_track": track}
    if command in phases and len(rest) >= 3 and rest[1] == "--":
        STATE.mkdir(parents=True, exist_ok=True)
        return phases[command](rest[0], rest[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
