"""Which commit a run measured or tested: shared by the benchmarks and ``tests/cluster/reliability_report.py``.

No side effects on import (``reliability_report.py`` loads this file by path).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path


def checkout_commit(root: Path, outputs: Sequence[str] = ()) -> str:
    """``git rev-parse HEAD`` of the checkout at ``root``, with ``-dirty`` when it has changes other than ``outputs``.

    :param outputs: paths (relative to ``root``) the run writes itself, whose changes do not count.
    """

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    changed = git("status", "--porcelain", "--", ".", *(f":!{path}" for path in outputs))
    return f"{commit}-dirty" if changed else commit
