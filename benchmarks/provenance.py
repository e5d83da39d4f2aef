"""Where a results file comes from: its name, the cluster's SLURM release, and how old its code is at HEAD.

Shared by the benchmark scripts (``_common.write_result``) and ``report.py``. No side effects on import
(``tests/unit/test_bench_provenance.py`` loads this file by path).

- A results file is named ``<script>[@<release>][-<variant>].json``: ``storm.json`` on the machine's own
  SLURM, ``storm@26.05.json`` in the 26.05 tree (``tests/cluster/releases.py``), ``storm@26.05-rl.json``
  there with slurmctld's RPC rate limit (``rl_enable``) on.
- The cluster's release is slurmctld's own: ``scontrol show config`` prints ``SLURM_VERSION``, which
  slurmctld fills in with the release it was built as (``_fill_ctld_conf``: ``SLURM_VERSION_STRING``), so
  it is the controller's whatever client asks; ``sinfo --version`` on the login host is the client's.
  Both are asked on the login host, as the cluster user, over the benchmark's own ssh (:data:`RELEASE_PROBE`).
- Each script declares the paths of the code it measures (``MEASURES``); a table measured at commit C is
  ``git rev-list --count C..HEAD -- <paths>`` commits older than HEAD's code (0: measured at HEAD).
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The variant of a results file measured with slurmctld's RPC rate limit on.
RATE_LIMITED = "rl"

#: One command on the login host (as the cluster user) that prints slurmctld's release and the client's, one
#: ``key=value`` line each; a query that fails prints its key with an empty value (never a shifted line).
RELEASE_PROBE = (
    "printf 'slurmctld=%s\\n' \"$(scontrol show config 2>/dev/null | sed -n 's/^SLURM_VERSION *= *//p' | head -n 1)\"; "
    "printf 'login_client=%s\\n' \"$(sinfo --version 2>/dev/null | head -n 1)\""
)


def result_name(name: str, release: str | None = None, variant: str | None = None) -> str:
    """The results file's name (without ``.json``) of script ``name`` on ``release`` (None: the machine's own)."""
    return f"{name}{f'@{release}' if release else ''}{f'-{variant}' if variant else ''}"


def split_result_name(stem: str) -> tuple[str, str | None, str | None]:
    """``(script, release, variant)`` of a results file's name: ``storm@26.05-rl`` -> ``("storm", "26.05", "rl")``.

    Script names have no ``-`` or ``@`` (``import_parse``, ``earliest_start``).
    """
    script, _, rest = stem.partition("@")
    if rest:
        release, _, variant = rest.partition("-")
        return script, release or None, variant or None
    script, _, variant = script.partition("-")
    return script, None, variant or None


def parse_release_probe(text: str) -> dict[str, str]:
    """What :data:`RELEASE_PROBE` printed: ``{"slurmctld": "22.05.8", "login_client": "slurm-wlm 22.05.8"}``.

    A key that printed nothing (slurmctld down, no sinfo) or did not print at all reads ``unknown``.
    """
    found = {"slurmctld": "", "login_client": ""}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in found and not found[key]:
            found[key] = value.strip()
    return {key: value or "unknown" for key, value in found.items()}


def release_of(result: Mapping[str, Any]) -> str:
    """The cluster's SLURM release a results file records, for a table's header.

    Files written before the release was asked of slurmctld name only the client on the machine that ran
    the script (``slurm``): that is said, not passed off as the cluster's.
    """
    ctld = str(result.get("slurmctld") or "")
    if ctld and not ctld.startswith("unknown"):
        return f"SLURM {ctld} (slurmctld)"
    if ctld:
        return f"the cluster's SLURM release: slurmctld could not be asked ({ctld})"
    local = result.get("slurm") or result.get("slurm_local_client")
    if local:
        return f"the cluster's SLURM release not recorded (the client where the script ran: {local})"
    return "the cluster's SLURM release not recorded"


def declared_measures(script: Path) -> tuple[str, ...] | None:
    """The ``MEASURES`` tuple a benchmark script declares at module level (read from its text, not imported)."""
    try:
        tree = ast.parse(script.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "MEASURES" for target in targets):
            try:
                return tuple(str(path) for path in ast.literal_eval(value))
            except ValueError:
                return None
    return None


def later_commits(root: Path, commit: str | None, paths: Sequence[str]) -> int | None:
    """How many commits after ``commit`` (up to HEAD of the checkout at ``root``) changed ``paths``.

    ``-dirty`` is dropped (the count is from the commit the checkout stood on). None when it cannot be
    told: no commit recorded, no paths, or a commit this checkout does not have.
    """
    base = (commit or "").removesuffix("-dirty")
    if not base or not paths or not all(c in "0123456789abcdef" for c in base):
        return None
    proc = subprocess.run(
        ["git", "rev-list", "--count", f"{base}..HEAD", "--", *paths],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


def table_header(result: Mapping[str, Any], later: int | None) -> str:
    """The line under a table's title: the run, the commit, the cluster's release and how old the code is.

    :param later: :func:`later_commits` of the table's commit and measured paths.
    """
    run = result.get("run")
    commit = str(result.get("commit") or "not recorded")
    short = commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")
    dirty = " (the checkout had uncommitted changes)" if commit.endswith("-dirty") else ""
    if later is None:
        age = "later commits to the code it measures: unknown (no measured paths, or a commit not in this checkout)"
    elif later == 0:
        age = "0 later commits changed the code it measures"
    else:
        age = f"{later} later commit{'s' if later != 1 else ''} changed the code it measures"
    return (
        f"Run {f'`{run}`' if run else 'none (run alone)'}, commit `{short}`{dirty}, {release_of(result)}, "
        f"measured {result.get('measured_at', 'at an unrecorded time')}; {age}."
    )
