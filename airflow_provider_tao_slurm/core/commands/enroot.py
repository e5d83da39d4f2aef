"""Enroot on the cluster: registry credentials (the secret over stdin only) and squashfs image checks."""

from __future__ import annotations

import re
from collections.abc import Sequence

from airflow_provider_tao_slurm.core.commands.checks import _indexed_checks, _parse_indexed
from airflow_provider_tao_slurm.core.commands.values import _absolute, _machine
from airflow_provider_tao_slurm.core.images import SQSH_HEADER_BYTES
from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, ValidationError

#: The Enroot credentials file on the cluster (netrc format), relative to the user's ``$HOME``.
ENROOT_CREDENTIALS = ".config/enroot/.credentials"
#: NGC needs one credentials line for its registry and one for its token service.
NGC_MACHINES = ("nvcr.io", "authn.nvidia.com")
#: First four bytes of a squashfs image (``hsqs``), as :func:`sqsh_check` prints them.
SQUASHFS_MAGIC_HEX = "68737173"

_SQSH_RE = re.compile(rf"SQSH (\d+)(?: ([0-9a-f]{{0,{2 * SQSH_HEADER_BYTES}}}))?")


def enroot_credential_machines(registry: str) -> tuple[str, ...]:
    """Return the ``machine`` entries a registry needs in the Enroot credentials file.

    :param registry: registry host (``nvcr.io``, ``ghcr.io``, ``registry.example.org:5000``).
    :returns: both NGC hosts for ``nvcr.io``, else just the registry.
    :raises ValidationError: when ``registry`` is not a host name.
    """
    machine = _machine(registry)
    return NGC_MACHINES if machine == NGC_MACHINES[0] else (machine,)


def _credentials_prefix(machine: str, login: str) -> str:
    if not isinstance(login, str) or not login or any(c.isspace() or c == "\\" for c in login):
        raise ValidationError(f"registry login {login!r} must be one word without spaces or backslashes")
    return f"machine {_machine(machine)} login {login} password "


def credentials_line(machine: str, login: str, password: str) -> str:
    """Return the credentials-file line :func:`install_enroot_credentials` writes (netrc format).

    The hook sends only ``password`` over stdin; the remote command writes this exact line.
    Use this to check a password before sending it.

    :param machine: registry host.
    :param login: registry login (``$oauthtoken`` for NGC).
    :param password: the secret; never part of an error message.
    :returns: ``machine <m> login <l> password <p>`` and a newline.
    :raises ValidationError: for a bad host or login, or an empty password or one with whitespace.
    """
    if not isinstance(password, str) or not password or any(c.isspace() or c == "\x00" for c in password):
        raise ValidationError(
            f"the password for {machine} must be non-empty and without whitespace (netrc format); check the secret"
        )
    return f"{_credentials_prefix(machine, login)}{password}\n"


def install_enroot_credentials(machine: str, login: str) -> str:
    """Install the credentials line for ``machine`` in ``~/.config/enroot/.credentials`` (mode 600).

    The password is read from stdin only (one line, the trailing newline optional) and never
    appears in the command line. It is checked (one word, as :func:`credentials_line` requires)
    and merged: lines for other machines are kept, an old line for ``machine`` is replaced, and
    the result is renamed into place atomically. On failure the file is left as it was and the
    command exits non-zero.

    Where the key may be: nowhere but the credentials file. The password goes from stdin straight
    into ``awk``, which holds it in memory and prints the finished line only after the whole input
    was read and checked; there is no staging copy, no here-document (bash backs those with files
    in ``$TMPDIR``) and no file in ``/tmp``. The merged file is written under ``umask 077`` into
    ``.credentials.XXXXXX`` next to the credentials file and renamed onto it: that file *is* the
    new credentials file (same directory and file system, mode 600 from its creation, never
    readable by anyone else), and the rename is what makes the update atomic, since writing the
    credentials file in place would let Enroot read it half written and lose the other machines'
    lines on a failure. Only a process killed mid-write (SIGKILL, which runs no cleanup) can leave
    that file behind, still mode 600 in the user's own Enroot directory.

    :param machine: registry host.
    :param login: registry login (``$oauthtoken`` for NGC).
    :returns: the command line; the hook sends the password on stdin.
    :raises ValidationError: for a bad host or login.
    """
    prefix = _credentials_prefix(machine, login)
    host = _machine(machine)
    return (
        f'umask 077 && f="$HOME"/{quote(ENROOT_CREDENTIALS)} && mkdir -p -- "${{f%/*}}" && '
        't=$(mktemp "$f.XXXXXX") && '
        f'if {{ [ ! -e "$f" ] || awk -v m={quote(host)} \'!($1 == "machine" && $2"" == m)\' "$f"; }} > "$t" && '
        f"awk -v p={quote(prefix)} "
        "'NR == 1 && NF == 1 && $0 == $1 { k = $0; ok = 1 } END { if (!ok || NR != 1) exit 1; print p k }' "
        '>> "$t" && chmod 600 "$t" && mv -f -- "$t" "$f"; '
        'then :; else rm -f -- "$t"; false; fi'
    )


def enroot_credentials_present(machines: Sequence[str]) -> str:
    """Check that ``~/.config/enroot/.credentials`` has a line for every machine; never prints a secret.

    :param machines: registry hosts, e.g. from :func:`enroot_credential_machines`.
    :returns: the command line (prints ``OK <i>`` or ``MISSING <i>`` per machine); read it with
        :func:`parse_enroot_credentials_present`.
    :raises ValidationError: for an empty list or a value that is not a host name.
    """
    if isinstance(machines, str) or not machines:
        raise ValidationError(f"pass a non-empty list of registry host names, not {machines!r}")
    condition = '[ -f "$f" ] && awk -v m="$x" \'$1 == "machine" && $2"" == m { found = 1 } END { exit !found }\' "$f"'
    return f'f="$HOME"/{quote(ENROOT_CREDENTIALS)}; ' + _indexed_checks(condition, [_machine(m) for m in machines])


def parse_enroot_credentials_present(stdout: str, machines: Sequence[str]) -> list[str]:
    """Return the machines :func:`enroot_credentials_present` found no credentials line for.

    :param stdout: the command's stdout.
    :param machines: the same machines, in the same order.
    :returns: the machines without a line, in order.
    :raises RemoteCommandError: when some machine got no answer.
    """
    return _parse_indexed(stdout, machines, "credentials")


# ------------------------------------------------------------------ images


def sqsh_check(path: str) -> str:
    """Print ``SQSH <size> <first bytes in hex>`` for a file, or ``MISSING``; see :func:`parse_sqsh_check`.

    The first :data:`~airflow_provider_tao_slurm.core.images.SQSH_HEADER_BYTES` bytes hold the magic
    and the superblock's ``bytes_used``, so a truncated image is caught, not only a wrong magic.

    :param path: absolute path of the ``.sqsh`` file.
    :returns: the command line.
    :raises ValidationError: for a relative path.
    """
    file = quote(_absolute(path))
    return (
        f'if [ -f {file} ]; then echo "SQSH $(($(wc -c < {file}))) '
        f"$(head -c {SQSH_HEADER_BYTES} -- {file} | od -An -v -tx1 | tr -d ' \\n')\"; else echo MISSING; fi"
    )


def parse_sqsh_check(stdout: str) -> tuple[int, str] | None:
    """Parse :func:`sqsh_check` output.

    :param stdout: the command's stdout.
    :returns: ``(size, header hex)``, valid when it starts with :data:`SQUASHFS_MAGIC_HEX`; ``None`` when missing.
    :raises RemoteCommandError: for any other output.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if last == "MISSING":
        return None
    match = _SQSH_RE.fullmatch(last)
    if match is None:
        raise RemoteCommandError(f"image check printed {last[:200]!r} instead of 'SQSH <size> <hex>'; run it again")
    return int(match.group(1)), match.group(2) or ""
