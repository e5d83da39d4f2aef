"""The shared-storage guard every writer runs first: stop where another user could plant files.

On shared storage another user who can write into our tree can plant a symbolic link or a file of
their own where this provider writes (secrets, records, scripts). :func:`secure_dirs` prints shell
that checks the tree before the write and stops with :data:`UNSAFE_PATH_STATUS`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from airflow_provider_tao_slurm.core.commands.values import _absolute
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import ValidationError

#: Exit status of a command that :func:`secure_dirs` stopped (the hook raises ``StoragePathError``).
UNSAFE_PATH_STATUS = 86
#: stderr line of such a command: ``UNSAFE <path>: <reason>``.
UNSAFE_PATH_RE = re.compile(r"^UNSAFE (/.*): ([a-z ]+)$", re.M)

_GUARD = (
    '_u() { printf \'UNSAFE %s: %s\\n\' "$1" "$2" >&2; [ -z "${_k:-}" ] || scancel "$_k"; exit '
    + str(UNSAFE_PATH_STATUS)
    + "; }; "
    '_w() { case $(stat $1 -c %A -- "$2") in ?????w*|????????w*) _u "$2" \'is writable by other users\';; esac; }; '
    '_b() { [ -d "$1" ] || mkdir -p -- "$1" 2>/dev/null || _u "$1" \'cannot be created\'; '
    '[ -O "$1" ] || _u "$1" \'is owned by another user\'; _w -L "$1"; }; '
    '_c() { for _p; do if [ -L "$_p" ]; then _u "$_p" \'is a symbolic link\'; elif [ -e "$_p" ]; then '
    '[ -d "$_p" ] || _u "$_p" \'is not a directory\'; [ -O "$_p" ] || _u "$_p" \'is owned by another user\'; '
    '_w "" "$_p"; fi; done; }'
)


def trusted_base(path: str, results_dir: str | None) -> str:
    """Return the directory whose tree :func:`secure_dirs` checks for ``path``: the results dir if ``path`` is in it.

    :param path: absolute path about to be written.
    :param results_dir: the connection's shared base directory, if any.
    :returns: ``results_dir`` (normalised) for a path under it, else the path's own directory.
    """
    target = posixpath.normpath(_absolute(path))
    if results_dir:
        root = posixpath.normpath(_absolute(results_dir, "results_dir"))
        if target == root or target.startswith(f"{root}/"):
            return root
    return posixpath.dirname(target) or "/"


def secure_dirs(base: str, directories: Sequence[str]) -> str:
    """Shell that stops (exit :data:`UNSAFE_PATH_STATUS`) where another user could plant files we are about to write.

    On shared storage another user who can write into our tree can plant a symbolic link (the
    secret sidecar written through it into their file, or over one of ours) or a file of their
    own (a forged record or script). So before anything is written, ``base`` (created when
    missing; it may itself be a link, its target is checked) and each of ``directories`` that
    exists must be a directory owned by us that neither group nor others can write; the others
    must not be links. A directory that does not exist yet is safe: its nearest existing parent
    was checked, so only we can create it. The refusal prints ``UNSAFE <path>: <reason>`` on stderr.

    :param base: absolute trusted root (the results dir).
    :param directories: absolute directories under ``base``, parents before children.
    :returns: shell text ending in ``;``-joinable form; follow it with ``;`` and the write.
    :raises ValidationError: for a relative path or a directory outside ``base``.
    """
    root = posixpath.normpath(_absolute(base, "base dir"))
    below = []
    for directory in directories:
        path = posixpath.normpath(_absolute(directory, "directory"))
        if path == root:
            continue
        if not path.startswith(f"{root}/"):
            raise ValidationError(f"directory {directory!r} is outside the trusted base {root!r}")
        below.append(path)
    below.sort(key=lambda d: d.count("/"))
    checks = f"; _c {join(below)}" if below else ""
    return f"{_GUARD}; _b {quote(root)}{checks}"


def _chain(base: str, directory: str) -> list[str]:
    """``directory`` and each of its parents below ``base``, parents first."""
    root = posixpath.normpath(_absolute(base, "base dir"))
    path = posixpath.normpath(_absolute(directory, "directory"))
    chain = []
    while path.startswith(f"{root}/"):
        chain.append(path)
        path = posixpath.dirname(path)
    return chain[::-1]
