"""Shell quoting: the one place where values are made safe for a remote POSIX shell.

Every value that reaches a remote shell goes through :func:`quote` (or :func:`join`, which quotes
each word). Values with characters that no shell can carry safely (NUL) are refused.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from airflow_provider_tao_slurm.exceptions import ValidationError


def quote(value: object) -> str:
    """Return ``value`` as one single-quoted shell word.

    :param value: any value; it is converted with ``str()`` first.
    :raises ValidationError: if the text contains a NUL byte, which no shell word can hold.
    """
    text = str(value)
    if "\x00" in text:
        raise ValidationError("a value contains a NUL byte, which cannot be passed to a shell; remove it")
    return shlex.quote(text)


def join(words: Iterable[object]) -> str:
    """Quote every word and join them with spaces into one command line."""
    return " ".join(quote(word) for word in words)


def storage_now(directory: str, variable: str = "now") -> str:
    """Shell code setting ``$variable`` to the current time as the storage holding ``directory`` keeps it.

    The age of a file on shared storage is its mtime (set by the file server's clock, or by whichever
    login host wrote it) subtracted from "now": taking "now" from the login host's own clock makes
    every age wrong by the clocks' skew (a fresh lock looks ten minutes old). So "now" is the mtime of
    a scratch file created there for the purpose (``set -C``: never through a planted link, and a
    file it did not create is not removed); ``date +%s`` only when it cannot be created.

    :param directory: absolute directory on the same storage as the files whose age is computed.
    :param variable: the shell variable to set (a plain name).
    :raises ValidationError: for a relative directory or a bad variable name.
    """
    if not isinstance(directory, str) or not directory.startswith("/"):
        raise ValidationError(f"directory {directory!r} must be an absolute path")
    if not variable.isidentifier() or not variable.isascii():
        raise ValidationError(f"{variable!r} is not a shell variable name")
    scratch = quote(f"{directory.rstrip('/') or ''}/.tao-now.")
    return (
        f'{variable}=$(t={scratch}$$; set -C; : > "$t" && stat -c %Y -- "$t" && rm -f -- "$t"); '
        f"case ${variable} in ''|*[!0-9]*) {variable}=$(date +%s);; esac"
    )
