"""Preflight probes: what ``srun`` offers on the login host, and what a GPU job needs on a node.

The node probe is a short CPU-only job step; its answer uses the indexed framing of
:mod:`~airflow_provider_tao_slurm.core.commands.checks`. It also reads the site's Enroot mounts
there, which the preflight caches per cluster (:func:`with_site_mounts` reads that cache back in
another command's round trip).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_tao_slurm.core.commands.checks import _indexed_checks, _parse_indexed
from airflow_provider_tao_slurm.core.commands.values import (
    _SLURM_NAME_RE,
    _TOOL_RE,
    _absolute,
    _absolute_all,
    _count,
    _names,
)
from airflow_provider_tao_slurm.core.mounts import ENROOT_SYSCONF_DEFAULT, Mount, parse_fstab
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import RemoteCommandError

_SRUN_OPTION_RE = re.compile(r"--[a-z][a-z0-9-]*")

#: The first line every preflight step prints once it runs on a node: without it, the step never started (a
#: busy partition, a site rule such as a job_submit plugin requiring a GPU there), and nothing was seen.
STEP_STARTED = "#tao-slurm-step-started"


def srun_help() -> str:
    """``srun --help``: lists every option, including those SPANK plugins such as Pyxis register.

    :returns: the command line; read its stdout with :func:`missing_srun_options`.
    """
    return join(["srun", "--help"])


def missing_srun_options(help_text: str, options: Sequence[str]) -> list[str]:
    """Return the options that ``srun --help`` does not list.

    :param help_text: the stdout of :func:`srun_help`.
    :param options: long options such as ``--container-image``.
    :returns: the options not listed, in order (all of them for an empty help text).
    :raises ValidationError: for an empty list or a value that is not a long option.
    """
    wanted = _names(options, _SRUN_OPTION_RE, "srun option")
    return [option for option in wanted if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text)]


def srun_probe(partition: str, command: Sequence[str], *, account: str | None = None, wait_seconds: int = 60) -> str:
    """Run a tiny command as a one-task, one-minute job step on a node of ``partition``.

    ``--immediate`` makes srun give up when no node is free within ``wait_seconds`` instead of
    waiting in the queue; ``--input=none`` keeps srun from reading the SSH channel's stdin. The step
    prints :data:`STEP_STARTED` before the command (:func:`step_started` tells whether it ran).

    :param partition: the partition whose nodes are checked.
    :param command: the command words, e.g. ``["enroot", "version"]`` (plain words only).
    :param account: the SLURM account to charge, or ``None`` for the user's default.
    :param wait_seconds: how long srun may wait for a node (at least 1).
    :returns: the command line.
    :raises ValidationError: for a bad partition, account, command word or wait time.
    """
    words = _names(command, _TOOL_RE, "command word")
    return join(
        [*_srun_step(partition, account, wait_seconds), "sh", "-c", f"echo '{STEP_STARTED}'; exec \"$@\"", "sh", *words]
    )


def step_started(stdout: str) -> bool:
    """Tell whether a preflight step (:func:`srun_probe`, :func:`node_probe`) started on a node.

    :param stdout: the step's output; a step that ran printed :data:`STEP_STARTED` first.
    """
    return stdout.lstrip().startswith(STEP_STARTED)


def _srun_step(partition: str, account: str | None, wait_seconds: int) -> list[str]:
    """``srun`` and its options for :func:`srun_probe` and :func:`node_probe` (no GPU is requested)."""
    options = [f"--partition={_names([partition], _SLURM_NAME_RE, 'partition')[0]}"]
    if account is not None:
        options.append(f"--account={_names([account], _SLURM_NAME_RE, 'SLURM account name')[0]}")
    options += ["--nodes=1", "--ntasks=1", "--time=1", f"--immediate={_count(wait_seconds, 'wait_seconds', 1)}"]
    return ["srun", *options, "--input=none"]


#: Run on a node by :func:`node_probe`: the node's name, whether its SPANK plugin configuration (the
#: ``PlugStackConfig`` file and the files it includes) loads Pyxis, Enroot's version, every line of the site's
#: Enroot ``mounts.d/*.fstab`` files (in Enroot's order, each as ``FSTAB <line>``; awk ends a file's last line
#: even without its newline) and then ``MOUNTS <dir>``, then the indexed checks.
_NODE_PROBE = (
    f"echo '{STEP_STARTED}'; "
    'echo "NODE $(hostname)"; '
    "config=$(scontrol show config 2>/dev/null); "
    "conf=$(printf '%s\\n' \"$config\" | sed -n 's/^PlugStackConfig *= *//p'); "
    'case $conf in ""|"(null)") '
    "conf=$(printf '%s\\n' \"$config\" | sed -n 's/^SLURM_CONF *= *//p'); "
    'conf=$(dirname -- "${conf:-/etc/slurm/slurm.conf}")/plugstack.conf;; esac; '
    'dir=$(dirname -- "$conf"); files=$conf; '
    "for inc in $(sed -n 's/^[[:space:]]*include[[:space:]][[:space:]]*//p' \"$conf\" 2>/dev/null); do "
    'case $inc in /*) ;; *) inc=$dir/$inc;; esac; files="$files $inc"; done; '
    "if cat $files 2>/dev/null | grep -v '^[[:space:]]*#' | grep -qi pyxis; then echo 'PYXIS yes'; "
    'else echo "PYXIS no $conf"; fi; '
    'if command -v enroot >/dev/null 2>&1; then echo "ENROOT $(enroot version 2>/dev/null | tail -n 1)"; '
    "else echo 'ENROOT missing'; fi; "
    f"d=${{ENROOT_SYSCONF_PATH:-{ENROOT_SYSCONF_DEFAULT}}}/mounts.d; "
    'for f in "$d"/*.fstab; do [ -f "$f" ] && awk \'{print "FSTAB " $0}\' "$f" 2>/dev/null; done; '
    'echo "MOUNTS $d"'
)


def node_probe(
    partition: str,
    writable: Sequence[str],
    readable: Sequence[str] = (),
    *,
    account: str | None = None,
    wait_seconds: int = 60,
) -> str:
    """Check on a node of ``partition`` what a GPU job there needs, in one short CPU-only step.

    The step (no GPU requested, one minute) prints :data:`STEP_STARTED`, the node's name, whether the node's own SPANK
    plugin configuration loads Pyxis (a login host's ``srun --help`` only shows the login host's),
    Enroot's version there, the site's Enroot mounts there (the ``*.fstab`` files of
    ``$ENROOT_SYSCONF_PATH/mounts.d``, default ``/etc/enroot/mounts.d``: what Enroot mounts into every
    container), and whether each ``writable`` directory is a writable directory and
    each ``readable`` path is readable *on that node* (shared storage mounted there). Read it with
    :func:`parse_node_probe`.

    :param partition: the GPU partition whose node is checked.
    :param writable: absolute directories the job writes (the results directory).
    :param readable: absolute paths the job reads (dataset roots).
    :param account: the SLURM account to charge, or ``None`` for the user's default.
    :param wait_seconds: how long srun may wait for a node (at least 1).
    :returns: the command line.
    :raises ValidationError: for a bad partition, account, wait time or a relative path.
    """
    checks = [_NODE_PROBE]
    if writable:
        checks.append(_indexed_checks('[ -d "$x" ] && [ -w "$x" ]', _absolute_all(writable), "W"))
    if readable:
        checks.append(_indexed_checks('[ -r "$x" ]', _absolute_all(readable), "R"))
    script = "; ".join(checks)
    return join([*_srun_step(partition, account, wait_seconds), "sh", "-c", script])


@dataclass(frozen=True)
class NodeProbe:
    """What :func:`node_probe` found on a node.

    :param node: the node's name.
    :param pyxis: the node's SPANK plugin configuration loads Pyxis.
    :param plugstack: the configuration file read when it does not (for the message).
    :param enroot: Enroot's version there, ``None`` when it is not installed.
    :param unwritable: the ``writable`` directories the node cannot write.
    :param unreadable: the ``readable`` paths the node cannot read.
    :param site_mounts: the mounts the site's Enroot ``mounts.d`` files add to every container, in order.
    :param mounts_dir: the ``mounts.d`` directory read.
    """

    node: str
    pyxis: bool
    plugstack: str
    enroot: str | None
    unwritable: list[str]
    unreadable: list[str]
    site_mounts: tuple[Mount, ...] = ()
    mounts_dir: str = ""


def parse_node_probe(stdout: str, writable: Sequence[str], readable: Sequence[str] = ()) -> NodeProbe:
    """Read :func:`node_probe` output.

    :raises RemoteCommandError: when a line is missing (the step did not run to its end).
    """
    found: dict[str, str] = {}
    fstab: list[str] = []
    for line in stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        if key in ("NODE", "PYXIS", "ENROOT", "MOUNTS"):
            found[key] = value.strip()
        elif key == "FSTAB":
            fstab.append(value)
    if set(found) != {"NODE", "PYXIS", "ENROOT", "MOUNTS"}:
        raise RemoteCommandError(
            f"the node check printed {stdout.strip()[-300:]!r}; it did not run to its end: run the preflight again"
        )
    pyxis, _, plugstack = found["PYXIS"].partition(" ")
    return NodeProbe(
        node=found["NODE"],
        pyxis=pyxis == "yes",
        plugstack=plugstack,
        enroot=None if found["ENROOT"] in ("missing", "") else found["ENROOT"],
        unwritable=_parse_indexed(stdout, writable, "writable directory", "W") if writable else [],
        unreadable=_parse_indexed(stdout, readable, "readable path", "R") if readable else [],
        site_mounts=parse_fstab(fstab),
        mounts_dir=found["MOUNTS"],
    )


#: The line :func:`with_site_mounts` prints between the command's output and the site-mounts cache.
SITE_MOUNTS_MARKER = "#tao-slurm-site-mounts"
#: The most bytes of the site-mounts cache read back.
SITE_MOUNTS_MAX_BYTES = 65536


def with_site_mounts(command: str, cache_path: str) -> str:
    """Run ``command``, then print :data:`SITE_MOUNTS_MARKER` and the site-mounts cache, in one round trip.

    The submit path reads the partition table before every submission; the site mounts the last
    preflight cached (:meth:`~airflow_provider_tao_slurm.core.mounts.SiteMounts.to_json`) ride along, so
    the mount check costs no round trip of its own. A failed ``command`` exits with its status before
    the marker. The cache is read only when it is a plain file of our own (a link or another user's
    file planted there is not read, as the partition cache); otherwise nothing follows the marker.
    Read the reply with :func:`split_site_mounts`.

    :param command: the command whose output comes first (it must not print the marker line).
    :param cache_path: the cache's absolute path.
    :raises ValidationError: for a relative path.
    """
    path = quote(_absolute(cache_path, "cache path"))
    return (
        f"{{ {command}; }} || exit $?; echo {quote(SITE_MOUNTS_MARKER)}; f={path}; "
        'if [ -f "$f" ] && [ ! -L "$f" ] && [ -O "$f" ]; then '
        f'head -c {SITE_MOUNTS_MAX_BYTES} -- "$f"; echo; fi'
    )


def split_site_mounts(stdout: str) -> tuple[str, str | None]:
    """Split :func:`with_site_mounts`' reply into the command's output and the cache's text.

    :returns: the command's output, and the cache's text (``""``: no cache; ``None``: no marker, the
        reply stopped before it).
    """
    lines = stdout.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.rstrip("\n") == SITE_MOUNTS_MARKER:
            return "".join(lines[:index]), "".join(lines[index + 1 :]).strip()
    return stdout, None
