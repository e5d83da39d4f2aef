"""Per-item checks: one round trip answers for many paths or tools, item by item.

A check prints ``OK <index>`` or ``MISSING <index>`` per item (an index, never the value, so hostile
names cannot confuse the parser); lines it did not print (shell start-up noise) are ignored, and an
answer that misses an item is an error, never "missing".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from airflow_provider_tao_slurm.core.commands.values import _TOOL_RE, _absolute_all, _names
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import RemoteCommandError

_INDEXED_RE = re.compile(r"(OK|MISSING) (\d+)")
#: The line :func:`test_paths_then` prints between the path check's answer and the command's output.
_PATHS_CHECKED = "== tao-slurm paths checked"


def _indexed_checks(condition: str, items: list[str], prefix: str = "") -> str:
    """``OK <prefix><i>`` or ``MISSING <prefix><i>`` per item, in order (``prefix`` tells two lists apart)."""
    return (
        f'i=0; for x in {join(items)}; do if {condition}; then echo "OK {prefix}$i"; else echo "MISSING {prefix}$i"; '
        "fi; i=$((i+1)); done"
    )


def _parse_indexed(stdout: str, items: Sequence[str], what: str, prefix: str = "") -> list[str]:
    """Return the items an :func:`_indexed_checks` answer says ``MISSING``, in order.

    :raises RemoteCommandError: when some item got no answer (the shell is not POSIX, or the output was cut).
    """
    pattern = re.compile(rf"(OK|MISSING) {re.escape(prefix)}(\d+)") if prefix else _INDEXED_RE
    seen: dict[int, bool] = {}
    for line in stdout.splitlines():
        match = pattern.fullmatch(line.strip())
        if match and int(match.group(2)) < len(items):
            seen[int(match.group(2))] = match.group(1) == "OK"
    if len(seen) != len(items):
        raise RemoteCommandError(
            f"the {what} check answered for {len(seen)} of {len(items)} items; the login shell must be POSIX "
            "sh or bash and the command must not be cut short: run it again"
        )
    return [item for index, item in enumerate(items) if not seen[index]]


def test_paths(paths: Sequence[str]) -> str:
    """Check that every path exists, in one round trip; read the answer with :func:`parse_test_paths`.

    :param paths: absolute cluster paths.
    :returns: the command line (prints ``OK <i>`` or ``MISSING <i>`` per path, in order).
    :raises ValidationError: for an empty list or a relative path.
    """
    return _indexed_checks('[ -e "$x" ]', _absolute_all(paths))


def parse_test_paths(stdout: str, paths: Sequence[str]) -> list[str]:
    """Return the paths :func:`test_paths` found missing.

    :param stdout: the command's stdout (unrelated lines, e.g. from shell start-up files, are ignored).
    :param paths: the same paths, in the same order.
    :returns: the missing paths, in order.
    :raises RemoteCommandError: when some path got no answer.
    """
    return _parse_indexed(stdout, paths, "path")


def test_paths_then(paths: Sequence[str], command: str) -> str:
    """:func:`test_paths`, then ``command``, in one round trip; read the answer with :func:`split_test_paths`.

    The path check only prints: ``command`` runs whatever it found, and the exit status is ``command``'s.

    :param paths: absolute cluster paths (none: ``command`` alone).
    :param command: the command whose round trip carries the check.
    :raises ValidationError: for a relative path.
    """
    if not paths:
        return command
    return f"{{ {test_paths(paths)}; }}; echo {quote(_PATHS_CHECKED)}; {command}"


def split_test_paths(stdout: str, paths: Sequence[str]) -> tuple[list[str], str]:
    """Return the paths a :func:`test_paths_then` answer found missing, and ``command``'s own stdout.

    :param stdout: the round trip's stdout.
    :param paths: the same paths, in the same order (none: all of ``stdout`` is the command's).
    :raises RemoteCommandError: when some path got no answer (the check did not run to its end).
    """
    if not paths:
        return [], stdout
    checked, marker, rest = stdout.partition(f"{_PATHS_CHECKED}\n")
    if not marker:
        raise RemoteCommandError(
            "the path check did not finish (its end line is missing); the login shell must be POSIX sh or bash and "
            "the command must not be cut short: run it again"
        )
    return parse_test_paths(checked, paths), rest


def which(tools: Sequence[str]) -> str:
    """Check that every tool is on the login host's ``PATH``; read the answer with :func:`parse_which`.

    :param tools: command names (``sbatch``, ``enroot``, ...).
    :returns: the command line (prints ``OK <i>`` or ``MISSING <i>`` per tool, in order).
    :raises ValidationError: for an empty list or a name that is not a plain command name.
    """
    return _indexed_checks('command -v "$x" >/dev/null 2>&1', _names(tools, _TOOL_RE, "command name"))


def parse_which(stdout: str, tools: Sequence[str]) -> list[str]:
    """Return the tools :func:`which` did not find.

    :param stdout: the command's stdout.
    :param tools: the same tools, in the same order.
    :returns: the missing tools, in order.
    :raises RemoteCommandError: when some tool got no answer.
    """
    return _parse_indexed(stdout, tools, "tool")
