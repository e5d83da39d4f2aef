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
