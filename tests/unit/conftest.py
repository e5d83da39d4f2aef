"""Unit-test setup: the shared hook fake (``fakes.py`` beside this file) imports as ``fakes`` everywhere below."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from airflow_provider_tao_slurm.core import commands

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


#: Runs the real held-submission script once with stand-in SLURM tools: ``{tool: sh body}`` -> the process.
HeldSubmission = Callable[[Mapping[str, str]], "subprocess.CompletedProcess[str]"]


@pytest.fixture
def held_submission(tmp_path: Path) -> HeldSubmission:
    """Run :func:`commands.sbatch_submit_held` in ``sh`` with stand-in tools first on PATH (in ``tmp_path/bin``)."""

    def run(tools: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        for tool, body in tools.items():
            (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / tool).chmod(0o755)
        (tmp_path / "logs").mkdir(mode=0o755, exist_ok=True)
        command = commands.sbatch_submit_held(
            "/x/job.sbatch", log_dir=f"{tmp_path}/logs", job_name="j", user="alice", base=str(tmp_path)
        )
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False, env=env)

    return run
