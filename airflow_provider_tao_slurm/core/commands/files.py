"""Remote files: staging, atomic writes, reads that tell "missing" from "failed", log tails.

File contents travel on stdin, never in the command line; every writer checks the directory tree
with :func:`~airflow_provider_tao_slurm.core.commands.guard.secure_dirs` first.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from collections.abc import Mapping, Sequence

from airflow_provider_tao_slurm.core.commands.guard import _chain, secure_dirs
from airflow_provider_tao_slurm.core.commands.values import _absolute, _absolute_all, _count, _mode
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, ValidationError

#: Exit status of :func:`read_file` when the file does not exist; any other failure keeps its own.
MISSING_FILE_STATUS = 44
#: stderr marker of a :func:`staged_then` command whose staging failed (the command after it never ran).
STAGING_FAILED = "#tao-slurm-staging-failed"

_TAIL_HEADER_RE = re.compile(r"SIZE (\d+) LEN (\d+)")


def staging(base: str, files: Mapping[str, tuple[bytes | None, int]], mtime: int) -> tuple[str, bytes]:
    """Return the command that unpacks ``files`` under ``base`` (:func:`extract_tar`) and the archive it reads.

    The archive is built in memory, block by block, as :mod:`tarfile` writes one (headers from
    :meth:`tarfile.TarInfo.tobuf`): no file object, no I/O.

    :param base: absolute directory the names are relative to.
    :param files: ``{relative path: (content, mode)}``, content ``None`` for a directory; secrets (the
        sidecar) go here too, never in argv.
    :param mtime: the members' modification time (the staging host's clock, seconds).
    :returns: ``(command, tar archive)``: send the archive on the command's stdin.
    :raises ValidationError: for a name with ``.`` or ``..`` or a relative base.
    """
    blocks = []
    for name, (content, mode) in files.items():
        info = tarfile.TarInfo(name)
        info.mode = mode
        info.mtime = mtime
        if content is None:
            info.type = tarfile.DIRTYPE
        else:
            info.size = len(content)
        blocks.append(info.tobuf(tarfile.DEFAULT_FORMAT, tarfile.ENCODING, "surrogateescape"))
        if content:
            blocks.append(content + bytes(-len(content) % tarfile.BLOCKSIZE))
    blocks.append(bytes(2 * tarfile.BLOCKSIZE))  # the end of the archive
    archive = b"".join(blocks)
    archive += bytes(-len(archive) % tarfile.RECORDSIZE)  # whole records, as tar writes them
    command = extract_tar(
        base,
        [name for name, (content, _mode) in files.items() if content is not None],
        [name for name, (content, _mode) in files.items() if content is None],
    )
    return command, archive


def staged_then(staging_command: str, command: str) -> str:
    """Run ``command`` right after ``staging_command`` in one round trip, only when the staging succeeded.

    A failed staging keeps its exit status and prints :data:`STAGING_FAILED` on stderr, so the caller can
    tell "nothing was run" from a failure of ``command`` itself.
    """
    return f"{{ {staging_command}; }} || {{ rc=$?; echo {quote(STAGING_FAILED)} >&2; exit $rc; }}; {command}"


def extract_tar(base: str, members: Sequence[str] = (), directories: Sequence[str] = ()) -> str:
    """Unpack a tar archive read from stdin under ``base`` (modes kept, owner ours).

    The hook stages a job's files (spec, env, meta, script, the mode-600 secret sidecar, the
    record) with one archive over stdin: one round trip, no content in argv. Every directory the
    archive writes into is first checked with :func:`secure_dirs`. The archive is unpacked into a
    private directory under ``base`` and each file is then renamed into place (``mv -T``, one
    ``rename(2)``): a file or link already at a member's name is replaced, never written through,
    and two tries staging the same files at once both succeed (tar's own replace, unlink then
    create, fails with "File exists" when the other try creates the file in between).

    :param base: absolute directory the member names are relative to (the connection's results_dir).
    :param members: the archive's file member names (relative), moved into place (their missing
        parent directories created mode 700).
    :param directories: the archive's directory members (relative), checked, and created with the
        archive's mode when missing (an existing one keeps its own).
    """
    root = _absolute(base, "base dir")
    dirs = {root}
    for member, is_dir in [(m, False) for m in members] + [(d, True) for d in directories]:
        parts = [part for part in member.split("/") if part]
        if not parts or any(part in (".", "..") for part in parts):
            raise ValidationError(f"staged file name {member!r} must be a relative path without '.' or '..'")
        dirs.update(posixpath.join(root, *parts[:end]) for end in range(1, len(parts) + is_dir))
    made = [
        f"{{ [ -d {quote(posixpath.join(root, d))} ] || {{ mkdir -p -- {quote(posixpath.join(root, d))} && "
        f'chmod --reference="$_st"/{quote(d)} -- {quote(posixpath.join(root, d))}; }}; }}'
        for d in sorted(directories, key=lambda d: d.count("/"))
    ]
    parents = sorted({posixpath.dirname(posixpath.join(root, m)) for m in members} - {root})
    if parents:
        made.append(join(["mkdir", "-p", "--", *parents]))
    made += [f'mv -f -T -- "$_st"/{quote(m)} {quote(posixpath.join(root, m))}' for m in members]
    place = "".join(f" && {step}" for step in made)
    return (
        f"umask 077; {secure_dirs(root, sorted(dirs))}; "
        f"_st=$(mktemp -d -- {quote(posixpath.join(root, '.staging.XXXXXXXX'))}) && "
        f'{{ tar -x -p --no-same-owner -C "$_st" -f -{place}; _rc=$?; rm -rf -- "$_st"; [ "$_rc" -eq 0 ]; }}'
    )


def mkdirs(paths: Sequence[str], mode: str | None = "700") -> str:
    """``mkdir -p [-m MODE] -- DIR ...``.

    ``mode`` applies to the last component of each path when it is created (``mkdir -m``); parents
    and directories that already exist keep their permissions.

    :param paths: absolute directories.
    :param mode: octal mode such as ``"700"``, or ``None`` for the umask default.
    :returns: the command line.
    :raises ValidationError: for an empty list, a relative path or a bad mode.
    """
    dirs = _absolute_all(paths, "directory")
    return join(["mkdir", "-p", *([] if mode is None else ["-m", _mode(mode)]), "--", *dirs])


def write_file_from_stdin(path: str, mode: str = "600", base: str | None = None) -> str:
    """Write stdin to ``path`` atomically: a private temp file in the same directory, then a rename.

    The content never appears in the command line. Missing parent directories are created
    (mode 700). On any failure the temp file is removed and ``path`` is left as it was.

    The directories from ``base`` down to the file's are checked with :func:`secure_dirs` first;
    the rename replaces a link at ``path`` rather than writing through it.

    :param path: absolute destination path.
    :param mode: octal mode of the written file.
    :param base: the trusted results dir ``path`` lies under (default: the file's directory).
    :returns: the command line; the hook sends the content on stdin.
    :raises ValidationError: for a relative path, a path ending in ``/`` or a bad mode.
    """
    parent, name = posixpath.split(_absolute(path))
    if not name:
        raise ValidationError(f"file path {path!r} ends with '/'; name the file to write")
    temp = posixpath.join(parent, f".{name}.XXXXXX")
    root = base or parent
    return (
        f"umask 077; {secure_dirs(root, _chain(root, parent))}; "
        f"mkdir -p -- {quote(parent)} && t=$(mktemp {quote(temp)}) && "
        f'{{ cat > "$t" && chmod {_mode(mode)} "$t" && mv -f -- "$t" {quote(path)} || '
        '{ rm -f -- "$t"; false; }; }'
    )


def writable_dir(path: str) -> str:
    """Prove that ``path`` is a directory we can create files in (creates and removes a temp file).

    :param path: absolute directory.
    :returns: the command line; exit status 0 means writable.
    :raises ValidationError: for a relative path.
    """
    probe = posixpath.join(_absolute(path), ".tao-probe.XXXXXX")
    return f'[ -d {quote(path)} ] && t=$(mktemp {quote(probe)}) && rm -f -- "$t"'


def read_file(path: str, max_bytes: int) -> str:
    """At most ``max_bytes`` of a file, telling "there is no such file" apart from a failed read.

    ``head`` runs in the C locale with its error captured: only an error ending in ENOENT's text
    (``No such file or directory``: the file or a directory above it does not exist) exits with
    :data:`MISSING_FILE_STATUS`. Any other failure (I/O error, stale NFS handle, permission, a
    directory, a signal) keeps head's exit status; the error goes to stderr either way.

    :param path: absolute path.
    :param max_bytes: the most bytes to read (at least 1).
    :returns: the command line.
    :raises ValidationError: for a relative path or a byte count below 1.
    """
    head = join(["head", "-c", _count(max_bytes, "max_bytes", 1), "--", _absolute(path)])
    return (
        f"{{ e=$(LC_ALL=C {head} 2>&1 >&3); r=$?; }} 3>&1; "
        f'if [ "$r" -ne 0 ]; then printf \'%s\\n\' "$e" >&2; '
        f'case $e in *": No such file or directory") exit {MISSING_FILE_STATUS};; esac; exit "$r"; fi'
    )


def remove_files(paths: Sequence[str]) -> str:
    """``rm -f -- PATH ...``: remove files (never directories); missing files are fine.

    :param paths: absolute paths.
    :returns: the command line.
    :raises ValidationError: for an empty list or a relative path.
    """
    return join(["rm", "-f", "--", *_absolute_all(paths)])


def rename(src: str, dst: str) -> str:
    """``mv -f -- SRC DST``: an atomic rename when both are on the same file system.

    :param src: absolute source path.
    :param dst: absolute destination path (replaced if it exists).
    :returns: the command line.
    :raises ValidationError: for a relative path.
    """
    return join(["mv", "-f", "--", _absolute(src, "source"), _absolute(dst, "destination")])


def tail_bytes(path: str, offset: int, max_bytes: int) -> str:
    """Read at most ``max_bytes`` of a file from byte ``offset``; read the answer with :func:`parse_tail`.

    Prints ``SIZE <size> LEN <n>`` and a newline, then exactly the ``n`` bytes read (``n`` is
    computed from the size taken first, so bytes appended meanwhile wait for the next read), or
    ``MISSING`` when there is no such file. ``n`` is 0 when the file is shorter than ``offset``.

    :param path: absolute path of the log.
    :param offset: bytes already read.
    :param max_bytes: the most bytes to read (at least 1).
    :returns: the command line.
    :raises ValidationError: for a relative path or a bad offset or byte count.
    """
    start = _count(offset, "offset", 0) + 1
    limit = _count(max_bytes, "max_bytes", 1)
    file = quote(_absolute(path))
    return (
        f"if [ -f {file} ]; then s=$(wc -c < {file}); n=$((s - {offset})); "
        f'if [ "$n" -gt {limit} ]; then n={limit}; fi; if [ "$n" -lt 0 ]; then n=0; fi; '
        f'echo "SIZE $((s)) LEN $n"; tail -c +{start} -- {file} | head -c "$n"; else echo MISSING; fi'
    )


def parse_tail(stdout: str) -> tuple[int | None, int]:
    """Parse the header of :func:`tail_bytes` output (what follows it is the caller's to cut and decode).

    :param stdout: the command's stdout, or just its first line.
    :returns: ``(size, length)``: the file's size when read (``None`` when it does not exist) and how
        many bytes follow the header (count offsets with this, not with the decoded text).
    :raises RemoteCommandError: when the header is missing.
    """
    header, _, data = stdout.partition("\n")
    if header == "MISSING" and not data:
        return None, 0
    match = _TAIL_HEADER_RE.fullmatch(header)
    if match is None:
        raise RemoteCommandError(f"log read printed {header[:200]!r} instead of 'SIZE <n> LEN <m>'; run it again")
    return int(match.group(1)), int(match.group(2))


def next_offset(offset: int, size: int | None, length: int) -> tuple[int, bool]:
    """Where the next :func:`tail_bytes` starts, and whether reading restarts from the beginning.

    A file shorter than ``offset`` was truncated (a requeued job's rerun rewrites its log) or
    replaced: reading restarts at 0. A file that disappeared after being read restarts at 0 too.

    :param offset: the offset this read started at.
    :param size: the size :func:`parse_tail` read.
    :param length: the length :func:`parse_tail` read.
    :returns: ``(next offset, restarted)``.
    """
    if size is None or size < offset:
        return 0, offset > 0
    return offset + length, False
