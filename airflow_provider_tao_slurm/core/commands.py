"""Builders of remote command lines: one string per round trip, every value quoted.

Nothing here runs anything. The hook sends each string to the login host's POSIX shell (sh, bash,
dash); every caller-supplied value goes through :func:`~airflow_provider_tao_slurm.core.shell.quote`
or :func:`~airflow_provider_tao_slurm.core.shell.join`, so it stays one word whatever it holds.
Paths must be absolute, so none can be mistaken for an option. Secrets and file contents travel
on stdin, never in the command line (which other users of the login host can see in ``ps``).

Commands whose output needs framing print a fixed vocabulary that the ``parse_*`` functions here
read: per-item checks print ``OK <index>`` / ``MISSING <index>`` (an index, never the path, so
hostile names cannot confuse the parser), the log reader prints a ``SIZE <n> LEN <m>`` header.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from airflow_provider_tao_slurm.core.images import SQSH_HEADER_BYTES
from airflow_provider_tao_slurm.core.partitions import SINFO_FORMAT
from airflow_provider_tao_slurm.core.records import check_job_id, check_slurm_job_id
from airflow_provider_tao_slurm.core.shell import join, quote, storage_now
from airflow_provider_tao_slurm.core.states import (
    SACCT_FIELDS,
    SACCT_ID_FIELDS,
    SQUEUE_FORMAT,
    SQUEUE_ID_FORMAT,
)
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, ValidationError

#: The Enroot credentials file on the cluster (netrc format), relative to the user's ``$HOME``.
ENROOT_CREDENTIALS = ".config/enroot/.credentials"
#: NGC needs one credentials line for its registry and one for its token service.
NGC_MACHINES = ("nvcr.io", "authn.nvidia.com")
#: First four bytes of a squashfs image (``hsqs``), as :func:`sqsh_check` prints them.
SQUASHFS_MAGIC_HEX = "68737173"

_STARTTIME_RE = re.compile(r"now-\d+(?:seconds|minutes|hours|days|weeks)?|(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})")
_MODE_RE = re.compile(r"[0-7]{3,4}")
_TOOL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_MACHINE_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d{1,5})?")
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*")
_INDEXED_RE = re.compile(r"(OK|MISSING) (\d+)")
_TAIL_HEADER_RE = re.compile(r"SIZE (\d+) LEN (\d+)")
_SQSH_RE = re.compile(rf"SQSH (\d+)(?: ([0-9a-f]{{0,{2 * SQSH_HEADER_BYTES}}}))?")


# ------------------------------------------------------------------ validation


def _absolute(path: str, what: str = "path") -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValidationError(f"{what} {path!r} is not absolute; give the full cluster path starting with '/'")
    return path


def _absolute_all(paths: Sequence[str], what: str = "path") -> list[str]:
    if isinstance(paths, str) or not paths:
        raise ValidationError(f"pass a non-empty list of {what}s, not {paths!r}")
    return [_absolute(path, what) for path in paths]


def _slurm_job_ids(job_ids: Sequence[str], *, allow_empty: bool = False) -> list[str]:
    if isinstance(job_ids, str) or not (job_ids or allow_empty):
        raise ValidationError(f"pass a non-empty list of SLURM job ids, not {job_ids!r}")
    return list(dict.fromkeys(check_slurm_job_id(job_id) for job_id in job_ids))


def _starttime(starttime: str) -> str:
    match = _STARTTIME_RE.fullmatch(starttime) if isinstance(starttime, str) else None
    valid = match is not None
    if match is not None and match.group(1):
        try:
            datetime.fromisoformat(match.group(1))
        except ValueError:
            valid = False
    if not valid:
        raise ValidationError(f"sacct start time {starttime!r} must look like 'now-2days' or '2024-05-01T00:00:00'")
    return starttime


def _mode(mode: str) -> str:
    if not isinstance(mode, str) or not _MODE_RE.fullmatch(mode):
        raise ValidationError(f"file mode {mode!r} must be 3 or 4 octal digits, e.g. '600'")
    return mode


def _names(values: Sequence[str], pattern: re.Pattern[str], what: str) -> list[str]:
    if isinstance(values, str) or not values:
        raise ValidationError(f"pass a non-empty list of {what}s, not {values!r}")
    for value in values:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValidationError(f"{what} {value!r} has characters a {what} cannot have")
    return list(values)


def _machine(machine: str) -> str:
    return _names([machine], _MACHINE_RE, "registry host name")[0].lower()


# ------------------------------------------------------------------ SLURM


def sbatch_submit(script_path: str, *, parsable: bool = True, extra_args: Sequence[str] = ()) -> str:
    """``sbatch [--parsable] [extra args] SCRIPT``.

    sbatch takes the script as a positional argument and passes anything after it to the script,
    so ``extra_args`` come first and must all be options (``--test-only``, ``--dependency=...``).

    :param script_path: absolute path of the staged batch script.
    :param parsable: print just ``<id>`` (or ``<id>;<cluster>``); read it with ``states.parse_sbatch_reply``.
    :param extra_args: more sbatch options, each one word starting with ``-``.
    :returns: the command line.
    :raises ValidationError: for a relative script path or an extra argument that is not an option.
    """
    for arg in extra_args:
        if not isinstance(arg, str) or not arg.startswith("-"):
            raise ValidationError(f"sbatch extra argument {arg!r} must be an option starting with '-'")
    return join(["sbatch", *(["--parsable"] if parsable else []), *extra_args, _absolute(script_path, "script")])


def sbatch_submit_held(
    script_path: str,
    *,
    log_dir: str,
    job_name: str,
    user: str,
    base: str | None = None,
    extra_args: Sequence[str] = (),
) -> str:
    """Submit held, make sure it is the only live job of its name, create its log directory, release: one round trip.

    ``--output=<log_dir>/%x-%j/main.out`` names a directory that only exists once the job id is known,
    and SLURM does not create it (the job would fail with exit 0:53). So the job is submitted with
    ``--hold``, ``<log_dir>/<job_name>-<id>`` is created, and the job released.

    Two tries of one task running at once (a zombie try and its retry) submit under the same name.
    While held, the job looks for ``user``'s live jobs of that name: when an older one exists, the
    new one is cancelled before it ever runs, the older one gets its log directory and is released,
    and the older id is the reply (after a ``#concurrent <cancelled> <kept>`` line). Whichever order
    the two submissions interleave in, exactly one job survives: the oldest.

    The last stdout line is the job id (read it with ``states.parse_sbatch_reply``); a non-zero exit
    after a reply means the job exists but is still held (:func:`prepare_job_logs` finishes the work).

    :param script_path: absolute path of the staged batch script.
    :param log_dir: absolute base log directory (``%x-%j`` lives under it).
    :param job_name: the job's SLURM name (``%x``), also passed as ``--job-name``.
    :param user: the SLURM user submitting (only that user's jobs of the name count).
    :param base: the trusted results dir ``log_dir`` lies under: :func:`secure_dirs` checks the tree
        before anything is submitted (default: ``log_dir``'s parent).
    :param extra_args: more sbatch options (e.g. ``--exclude=n2``), each starting with ``-``.
    :returns: the command line; the job runs with ``--export=ALL`` whatever the site's ``SBATCH_EXPORT``.
    """
    name = _names([job_name], _SLURM_NAME_RE, "job name")[0]
    owner = _names([user], _SLURM_NAME_RE, "SLURM user name")[0]
    # --export=ALL on the command line: only it beats a site's SBATCH_EXPORT (an #SBATCH line does not)
    submit = sbatch_submit(script_path, extra_args=("--hold", "--export=ALL", f"--job-name={name}", *extra_args))
    same_name = join(["squeue", "-h", f"--name={name}", f"--user={owner}", "-o", "%i"])
    logs = _absolute(log_dir, "log dir")
    root = base or posixpath.dirname(logs)
    return (
        f"{secure_dirs(root, _chain(root, logs))}; "
        f"reply=$({submit}) || exit $?; "
        "id=$(printf '%s\\n' \"$reply\" | tail -n 1); id=${id%%;*}; "
        "case $id in ''|*[!0-9]*) printf '%s\\n' \"$reply\"; exit 3;; esac; "
        f"first=$({same_name} 2>/dev/null | sort -n | head -n 1); "
        "case $first in ''|*[!0-9]*) first=$id;; esac; "
        'if [ "$first" -lt "$id" ]; then scancel "$id"; echo "#concurrent $id $first"; '
        f'd={quote(logs)}/{quote(name)}-"$first"; mkdir -p -- "$d" && _c "$d" && '
        '{ scontrol release "$first" 2>/dev/null || true; }; '
        "rc=$?; printf '%s\\n' \"$first\"; exit $rc; fi; "
        f'd={quote(logs)}/{quote(name)}-"$id"; _k=$id; mkdir -p -- "$d" && _c "$d" && scontrol release "$id"; rc=$?; '
        "printf '%s\\n' \"$reply\"; exit $rc"
    )


def prepare_job_logs(log_dir: str, job_name: str, job_id: str, base: str | None = None) -> str:
    """Create ``<log_dir>/<job_name>-<job_id>`` and release the job if it is still held (idempotent).

    :param base: the trusted results dir (see :func:`sbatch_submit_held`).
    """
    name = _names([job_name], _SLURM_NAME_RE, "job name")[0]
    (jid,) = _slurm_job_ids([job_id])
    logs = _absolute(log_dir, "log dir")
    directory = f"{logs}/{name}-{jid}"
    root = base or posixpath.dirname(logs)
    return (
        f"{secure_dirs(root, _chain(root, directory))}; "
        f"mkdir -p -- {quote(directory)} && {{ scontrol release {quote(jid)} 2>/dev/null || true; }}"
    )


def extract_tar(base: str, members: Sequence[str] = (), directories: Sequence[str] = ()) -> str:
    """Unpack a tar archive read from stdin under ``base`` (modes kept, owner ours).

    The hook stages a job's files (spec, env, meta, script, the mode-600 secret sidecar, the
    record) with one archive over stdin: one round trip, no content in argv. Every directory the
    archive writes into is first checked with :func:`secure_dirs`; tar itself replaces a file or
    link already at a member's name (it never writes through it).

    :param base: absolute directory the member names are relative to (the connection's results_dir).
    :param members: the archive's member names (relative), so their directories can be checked.
    :param directories: the archive's directory members (relative), checked themselves too.
    """
    root = _absolute(base, "base dir")
    dirs = {root}
    for member, is_dir in [(m, False) for m in members] + [(d, True) for d in directories]:
        parts = [part for part in member.split("/") if part]
        if not parts or any(part in (".", "..") for part in parts):
            raise ValidationError(f"staged file name {member!r} must be a relative path without '.' or '..'")
        dirs.update(posixpath.join(root, *parts[:end]) for end in range(1, len(parts) + is_dir))
    return (
        f"umask 077; {secure_dirs(root, sorted(dirs))}; "
        f"tar -x -p --no-same-owner --no-overwrite-dir -C {quote(root)} -f -"
    )


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
    """The directory whose tree :func:`secure_dirs` checks for ``path``: the results dir when ``path`` lies under it.

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


#: Above this many job ids, squeue asks for all of the user's jobs (filtered by the server) instead of
#: listing the ids on the command line: one command at any scale, no argv limit.
IDS_ON_COMMAND_LINE = 200


def squeue_states(job_ids: Sequence[str], user: str | None = None) -> str:
    """Every job's state in one query: ``squeue -h -t all -j ID,... -o SQUEUE_FORMAT``.

    ``-t all`` keeps finished jobs visible until SLURM's ``MinJobAge`` purges them. With more than
    :data:`IDS_ON_COMMAND_LINE` ids and a ``user``, the query is ``--user=USER`` instead of the id
    list (the answer then holds the user's other jobs too: keep the ones you asked for).

    :param job_ids: SLURM job ids (duplicates are dropped).
    :param user: the connection's SLURM user, for the server-side filter at scale.
    :returns: the command line; parse its output with ``states.parse_squeue``.
    :raises ValidationError: for an empty list, an id that is not a SLURM job id or a bad user name.
    """
    ids = _slurm_job_ids(job_ids)
    if user is not None and len(ids) > IDS_ON_COMMAND_LINE:
        owner = _names([user], _SLURM_NAME_RE, "SLURM user name")[0]
        return join(["squeue", "-h", "-t", "all", f"--user={owner}", "-o", SQUEUE_FORMAT])
    return join(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT])


def sacct_states(job_ids: Sequence[str], starttime: str) -> str:
    """``sacct -X -n -P -j ID,... -o SACCT_FIELDS --starttime=START``: final states and exit codes.

    :param job_ids: SLURM job ids (duplicates are dropped).
    :param starttime: ``now-<n><unit>`` or ``YYYY-MM-DDTHH:MM:SS``.
    :returns: the command line; parse its output with ``states.parse_sacct``.
    :raises ValidationError: for an empty list, a bad id or a bad start time.
    """
    return join(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-j",
            ",".join(_slurm_job_ids(job_ids)),
            "-o",
            SACCT_FIELDS,
            f"--starttime={_starttime(starttime)}",
        ]
    )


def jobs_by_name(name: str, user: str, starttime: str) -> str:
    """Every job named exactly ``name`` and owned by ``user``, live (squeue) and finished (sacct), in one round trip.

    Both queries filter by the user on the server side (``-u``), so another user's job of the same
    name is never listed; the owner column lets the parser check it once more. Each query's exit
    status follows its rows as ``#rc squeue <n>`` / ``#rc sacct <n>``: a failed query is not an
    empty answer. Read the output with ``states.parse_jobs_by_name``.

    :param name: the job name (a job id from ``records.mint_job_id``).
    :param user: the connection's SLURM user.
    :param starttime: how far back sacct looks (``now-7days``); without it sacct stops at midnight.
    :returns: the command line.
    :raises ValidationError: for a bad name, user or start time.
    """
    job = check_job_id(name, "job name")
    owner = _names([user], _SLURM_NAME_RE, "SLURM user name")[0]
    squeue = join(["squeue", "-h", "-t", "all", f"--name={job}", f"--user={owner}", "-o", SQUEUE_ID_FORMAT])
    sacct = join(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            f"--name={job}",
            f"--user={owner}",
            "-o",
            SACCT_ID_FIELDS,
            f"--starttime={_starttime(starttime)}",
        ]
    )
    return f'{squeue}; echo "#rc squeue $?"; {sacct}; echo "#rc sacct $?"'


def show_job(job_id: str) -> str:
    """``scontrol -o show job ID``: one line of ``Key=Value`` pairs (name, owner, log paths, state).

    Read it with :func:`parse_show_job`. SLURM forgets a finished job after ``MinJobAge``; then the
    command fails and only sacct knows the job (without its log paths).

    :raises ValidationError: for an id that is not a SLURM job id.
    """
    return join(["scontrol", "-o", "show", "job", check_slurm_job_id(str(job_id))])


#: The ``scontrol show job`` keys :func:`parse_show_job` keeps.
SHOW_JOB_KEYS = ("JobId", "JobName", "UserId", "JobState", "StdOut", "StdErr", "WorkDir", "Partition", "NodeList")
_SHOW_JOB_PAIR_RE = re.compile(r"(?:^|\s)(" + "|".join(SHOW_JOB_KEYS) + r")=(.*?)(?=\s[A-Za-z:/]+=|$)")


def parse_show_job(stdout: str) -> dict[str, str]:
    """The :data:`SHOW_JOB_KEYS` of :func:`show_job`'s line (empty when the job is not known).

    ``UserId`` reads ``name(uid)``; only the name is kept. A value holding a space followed by
    ``Word=`` is cut there (scontrol does not quote values).
    """
    line = next((row for row in stdout.splitlines() if row.startswith("JobId=")), "")
    found = {key: value.strip() for key, value in _SHOW_JOB_PAIR_RE.findall(line)}
    if "UserId" in found:
        found["UserId"] = found["UserId"].split("(", 1)[0]
    return found


def scancel(job_ids: Sequence[str], *, name: str | None = None, user: str | None = None) -> str:
    """``scancel -Q [--name=NAME] [--user=USER] ID ...``: cancel jobs; already finished ones are not an error.

    With ``name`` only jobs that carry exactly that name are cancelled, so a reused job id of
    someone else's job is never hit; with ``user`` only that user's jobs (an operator or admin
    account could otherwise cancel other people's jobs). With ``name`` and no ids, every job of
    that name (and user) is cancelled.

    :param job_ids: SLURM job ids.
    :param name: our job name, to restrict the cancel to our own job.
    :param user: the connection's SLURM user, to restrict the cancel to our own jobs.
    :returns: the command line.
    :raises ValidationError: with neither ids nor a name, or for a bad id, name or user.
    """
    guard = [] if name is None else [f"--name={check_job_id(name, 'job name')}"]
    if user is not None:
        guard.append(f"--user={_names([user], _SLURM_NAME_RE, 'SLURM user name')[0]}")
    return join(["scancel", "-Q", *guard, *_slurm_job_ids(job_ids, allow_empty=name is not None)])


def sinfo_partitions() -> str:
    """``sinfo -a -h -o '%P|%l|%G'``: every partition (hidden ones too), its time limit and its nodes' GRES.

    Read it with :func:`~airflow_provider_tao_slurm.core.partitions.parse_sinfo_partitions`.
    """
    return join(["sinfo", "-a", "-h", "-o", SINFO_FORMAT])


def sinfo_partitions_cached(cache_path: str | None, max_age_s: int, base: str | None = None) -> str:
    """:func:`sinfo_partitions`, run at most once per ``max_age_s`` for every worker of a cluster.

    The answer is kept in ``cache_path`` on shared storage; a fresh enough copy is printed instead of
    asking the controller again (one round trip either way). Its age is measured by the storage's
    clock (:func:`~airflow_provider_tao_slurm.core.shell.storage_now`); a copy dated in the future is
    stale. A failed sinfo exits with its status and is never cached; a cache that cannot be written
    is simply not kept.

    The cache's directory tree is checked with :func:`secure_dirs` first (a planted link there
    would be written through, a planted file read as sinfo's answer), and the new copy is written
    to a fresh private temp file, then renamed into place.

    :param cache_path: absolute path of the cache file, or None to always ask sinfo.
    :param max_age_s: how long a cached answer is used.
    :param base: the trusted results dir the cache lies under (default: the cache's directory).
    """
    if cache_path is None:
        return sinfo_partitions()
    path = quote(_absolute(cache_path, "cache path"))
    age = _count(max_age_s, "max_age_s", 1)
    directory = posixpath.dirname(cache_path)
    root = base or directory
    return (
        f"{secure_dirs(root, _chain(root, directory))}; "
        f'f={path}; a=-1; if [ -f "$f" ] && [ ! -L "$f" ] && [ -O "$f" ] && [ -s "$f" ]; then '
        f"{storage_now(directory)}; "
        'a=$((now - $(stat -c %Y -- "$f"))); fi; '
        f'if [ "$a" -ge 0 ] && [ "$a" -lt {age} ]; then cat -- "$f"; '
        f"else out=$({sinfo_partitions()}) || exit $?; printf '%s\\n' \"$out\"; "
        f'{{ mkdir -p -m 700 -- {quote(directory)} && t=$(mktemp "$f.XXXXXX") && printf \'%s\\n\' "$out" > "$t" && '
        'mv -f -- "$t" "$f"; } 2>/dev/null || rm -f -- "$t"; fi'
    )


def sacctmgr_assoc(user: str, account: str | None = None) -> str:
    """``sacctmgr -n -P show associations where user=U [account=A] format=...``.

    Prints ``Cluster|Account|User|Partition|QOS`` rows; no row means the user may not charge the account.

    :param user: the SLURM user.
    :param account: the account, or ``None`` for all of the user's associations.
    :returns: the command line.
    :raises ValidationError: for a user or account with characters SLURM names cannot have.
    """
    where = [f"user={_names([user], _SLURM_NAME_RE, 'SLURM user name')[0]}"]
    if account is not None:
        where.append(f"account={_names([account], _SLURM_NAME_RE, 'SLURM account name')[0]}")
    return join(
        ["sacctmgr", "-n", "-P", "show", "associations", "where", *where, "format=Cluster,Account,User,Partition,QOS"]
    )


# ------------------------------------------------------------------ per-item checks


def _indexed_checks(condition: str, items: list[str], prefix: str = "") -> str:
    """``OK <prefix><i>`` or ``MISSING <prefix><i>`` per item, in order (``prefix`` tells two lists apart)."""
    return (
        f'i=0; for x in {join(items)}; do if {condition}; then echo "OK {prefix}$i"; else echo "MISSING {prefix}$i"; '
        "fi; i=$((i+1)); done"
    )


def _parse_indexed(stdout: str, items: Sequence[str], what: str, prefix: str = "") -> list[str]:
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
    """The paths :func:`test_paths` found missing.

    :param stdout: the command's stdout (unrelated lines, e.g. from shell start-up files, are ignored).
    :param paths: the same paths, in the same order.
    :returns: the missing paths, in order.
    :raises RemoteCommandError: when some path got no answer.
    """
    return _parse_indexed(stdout, paths, "path")


def which(tools: Sequence[str]) -> str:
    """Check that every tool is on the login host's ``PATH``; read the answer with :func:`parse_which`.

    :param tools: command names (``sbatch``, ``enroot``, ...).
    :returns: the command line (prints ``OK <i>`` or ``MISSING <i>`` per tool, in order).
    :raises ValidationError: for an empty list or a name that is not a plain command name.
    """
    return _indexed_checks('command -v "$x" >/dev/null 2>&1', _names(tools, _TOOL_RE, "command name"))


def parse_which(stdout: str, tools: Sequence[str]) -> list[str]:
    """The tools :func:`which` did not find.

    :param stdout: the command's stdout.
    :param tools: the same tools, in the same order.
    :returns: the missing tools, in order.
    :raises RemoteCommandError: when some tool got no answer.
    """
    return _parse_indexed(stdout, tools, "tool")


# ------------------------------------------------------------------ files


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
    """``head -c MAX -- PATH``: at most ``max_bytes`` of a file; non-zero exit status when it is missing.

    :param path: absolute path.
    :param max_bytes: the most bytes to read (at least 1).
    :returns: the command line.
    :raises ValidationError: for a relative path or a byte count below 1.
    """
    return join(["head", "-c", _count(max_bytes, "max_bytes", 1), "--", _absolute(path)])


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


def _count(value: int, what: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValidationError(f"{what} must be an integer of at least {minimum}, not {value!r}")
    return value


# ------------------------------------------------------------------ logs


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


@dataclass(frozen=True)
class TailChunk:
    """What :func:`tail_bytes` read.

    :param size: the file's size when read, ``None`` when it does not exist.
    :param length: how many bytes were read (count offsets with this, not ``len(data)``).
    :param data: the bytes read, as decoded by the caller.
    """

    size: int | None
    length: int
    data: str


def parse_tail(stdout: str) -> TailChunk:
    """Parse :func:`tail_bytes` output.

    :param stdout: the command's stdout (decoded; a split multi-byte character is the caller's to replace).
    :returns: the chunk.
    :raises RemoteCommandError: when the header is missing.
    """
    header, _, data = stdout.partition("\n")
    if header == "MISSING" and not data:
        return TailChunk(None, 0, "")
    match = _TAIL_HEADER_RE.fullmatch(header)
    if match is None:
        raise RemoteCommandError(f"log read printed {header[:200]!r} instead of 'SIZE <n> LEN <m>'; run it again")
    return TailChunk(int(match.group(1)), int(match.group(2)), data)


def next_offset(offset: int, size: int | None, length: int) -> tuple[int, bool]:
    """Where the next :func:`tail_bytes` starts, and whether reading restarts from the beginning.

    A file shorter than ``offset`` was truncated (a requeued job's rerun rewrites its log) or
    replaced: reading restarts at 0. A file that disappeared after being read restarts at 0 too.

    :param offset: the offset this read started at.
    :param size: :attr:`TailChunk.size`.
    :param length: :attr:`TailChunk.length`.
    :returns: ``(next offset, restarted)``.
    """
    if size is None or size < offset:
        return 0, offset > 0
    return offset + length, False


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


# ------------------------------------------------------------------ Enroot credentials


def enroot_credential_machines(registry: str) -> tuple[str, ...]:
    """The ``machine`` entries a registry needs in the Enroot credentials file.

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
    """The credentials-file line :func:`install_enroot_credentials` writes (netrc format).

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


_NODELIST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-\[\],]*")


def existing_nodes(node_list: str) -> str:
    """``sinfo -h -N -o %N -n LIST``: the nodes of a SLURM hostlist (``n[1-2]``) that exist, one per line.

    :raises ValidationError: for a list with characters a hostlist cannot have.
    """
    if not _NODELIST_RE.fullmatch(node_list or ""):
        raise ValidationError(f"node list {node_list!r} is not a SLURM hostlist such as n1 or n[1-3,5]")
    return join(["sinfo", "-h", "-N", "-o", "%N", "-n", node_list])


def node_states() -> str:
    """``sinfo -h -N -o '%N|%P|%t'``: every node of every partition with its short state, one per line.

    Read it with :func:`parse_node_states`; a node in several partitions has one line per partition.
    """
    return join(["sinfo", "-h", "-N", "-o", "%N|%P|%t"])


@dataclass(frozen=True)
class NodeRow:
    """One node of one partition as ``sinfo`` shows it.

    :param name: node name.
    :param partition: partition name (without the default marker ``*``).
    :param state: sinfo's short state (``idle``, ``mix``, ``down*``, ``drain`` ...).
    """

    name: str
    partition: str
    state: str

    @property
    def usable(self) -> bool:
        """Whether the scheduler can start a job on it (not down, drained, failing, in maintenance or silent)."""
        return not self.state.endswith("*") and not self.state.startswith(_UNUSABLE_NODE_STATES)


_UNUSABLE_NODE_STATES = ("down", "drain", "drng", "fail", "maint", "unk", "inval", "futr", "boot", "powered", "pow")


def parse_node_states(stdout: str) -> list[NodeRow]:
    """Parse :func:`node_states` output.

    :raises RemoteCommandError: for a line that is not ``NODE|PARTITION|STATE``.
    """
    rows: list[NodeRow] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 3 or not all(part.rstrip("*") for part in parts):
            raise RemoteCommandError(f"sinfo printed {line!r}, expected 'NODE|PARTITION|STATE'")
        rows.append(NodeRow(parts[0], parts[1].rstrip("*"), parts[2].lower()))
    return rows


# ------------------------------------------------------------------ preflight

_SRUN_OPTION_RE = re.compile(r"--[a-z][a-z0-9-]*")
_ASSOC_FIELDS = 5


def srun_help() -> str:
    """``srun --help``: lists every option, including those SPANK plugins such as Pyxis register.

    :returns: the command line; read its stdout with :func:`missing_srun_options`.
    """
    return join(["srun", "--help"])


def missing_srun_options(help_text: str, options: Sequence[str]) -> list[str]:
    """The options that ``srun --help`` does not list.

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
    waiting in the queue; ``--input=none`` keeps srun from reading the SSH channel's stdin.

    :param partition: the partition whose nodes are checked.
    :param command: the command words, e.g. ``["enroot", "version"]`` (plain words only).
    :param account: the SLURM account to charge, or ``None`` for the user's default.
    :param wait_seconds: how long srun may wait for a node (at least 1).
    :returns: the command line.
    :raises ValidationError: for a bad partition, account, command word or wait time.
    """
    return join([*_srun_step(partition, account, wait_seconds), *_names(command, _TOOL_RE, "command word")])


def _srun_step(partition: str, account: str | None, wait_seconds: int) -> list[str]:
    """``srun`` and its options for :func:`srun_probe` and :func:`node_probe` (no GPU is requested)."""
    options = [f"--partition={_names([partition], _SLURM_NAME_RE, 'partition')[0]}"]
    if account is not None:
        options.append(f"--account={_names([account], _SLURM_NAME_RE, 'SLURM account name')[0]}")
    options += ["--nodes=1", "--ntasks=1", "--time=1", f"--immediate={_count(wait_seconds, 'wait_seconds', 1)}"]
    return ["srun", *options, "--input=none"]


#: Run on a node by :func:`node_probe`: the node's name, whether its SPANK plugin configuration (the
#: ``PlugStackConfig`` file and the files it includes) loads Pyxis, Enroot's version, then the indexed checks.
_NODE_PROBE = (
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
    "else echo 'ENROOT missing'; fi"
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

    The step (no GPU requested, one minute) prints the node's name, whether the node's own SPANK
    plugin configuration loads Pyxis (a login host's ``srun --help`` only shows the login host's),
    Enroot's version there, and whether each ``writable`` directory is a writable directory and
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
    """

    node: str
    pyxis: bool
    plugstack: str
    enroot: str | None
    unwritable: list[str]
    unreadable: list[str]


def parse_node_probe(stdout: str, writable: Sequence[str], readable: Sequence[str] = ()) -> NodeProbe:
    """Read :func:`node_probe` output.

    :raises RemoteCommandError: when a line is missing (the step did not run to its end).
    """
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        if key in ("NODE", "PYXIS", "ENROOT"):
            found[key] = value.strip()
    if set(found) != {"NODE", "PYXIS", "ENROOT"}:
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
    )


@dataclass(frozen=True)
class Association:
    """One row of :func:`sacctmgr_assoc`: the user may charge ``account`` (on ``partition``, or on all)."""

    cluster: str
    account: str
    user: str
    partition: str | None
    qos: str


def parse_sacctmgr_assoc(stdout: str) -> list[Association]:
    """Parse :func:`sacctmgr_assoc` output (``Cluster|Account|User|Partition|QOS`` lines).

    :param stdout: sacctmgr's stdout; blank lines are skipped.
    :returns: the associations; an empty partition means every partition.
    :raises RemoteCommandError: for a line without five ``|``-separated fields.
    """
    rows: list[Association] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        cells = line.strip().split("|")
        if len(cells) != _ASSOC_FIELDS:
            raise RemoteCommandError(f"sacctmgr printed {line[:200]!r}, expected 'Cluster|Account|User|Partition|QOS'")
        cluster, account, user, partition, qos = cells
        rows.append(Association(cluster, account, user, partition or None, qos))
    return rows


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
    """The machines :func:`enroot_credentials_present` found no credentials line for.

    :param stdout: the command's stdout.
    :param machines: the same machines, in the same order.
    :returns: the machines without a line, in order.
    :raises RemoteCommandError: when some machine got no answer.
    """
    return _parse_indexed(stdout, machines, "credentials")


# ------------------------------------------------------------------ end markers

#: An end marker's name: ``<slurm job id>-<restart count>-<exit code>.end`` (an empty file the batch
#: script's EXIT trap leaves in ``<results_dir>/ends`` when the script ends by itself).
_END_MARKER_RE = re.compile(r"^(\d+)-(\d+)-(\d+)\.end (\d+(?:\.\d*)?)$")
_END_DIR_TAG = "== tao-slurm ends "


@dataclass(frozen=True)
class EndMarker:
    """One end marker: which job's script ended, in which run, with which exit code, and when.

    :ivar directory: the ends directory it was found in.
    :ivar slurm_job_id: the job.
    :ivar restart: ``SLURM_RESTART_COUNT`` of the run that wrote it (0 for the first run).
    :ivar exit_code: the batch script's exit status.
    :ivar mtime: the marker's modification time, in the file system's clock.
    """

    directory: str
    slurm_job_id: str
    restart: int
    exit_code: int
    mtime: float


def end_markers(since: Mapping[str, float]) -> str:
    """One command listing, per ends directory, the markers modified after ``since[directory]`` (epoch s).

    ``find`` only stats the directory's entries and prints the new names; a directory that does not
    exist yet lists nothing.
    """
    parts = []
    for index, (directory, after) in enumerate(since.items()):
        newer = f"@{max(0, int(after))}"
        find = join(["find", directory, "-maxdepth", "1", "-name", "*.end", "-newermt", newer, "-printf", "%f %T@\\n"])
        parts.append(f"echo {quote(_END_DIR_TAG + str(index))}; {find} 2>/dev/null")
    return "; ".join([*parts, "true"])


def parse_end_markers(stdout: str, directories: Sequence[str]) -> list[EndMarker]:
    """The markers :func:`end_markers` listed; lines that are not well-formed markers are ignored."""
    markers: list[EndMarker] = []
    directory: str | None = None
    for line in stdout.splitlines():
        if line.startswith(_END_DIR_TAG):
            index = line[len(_END_DIR_TAG) :]
            directory = directories[int(index)] if index.isdigit() and int(index) < len(directories) else None
            continue
        match = _END_MARKER_RE.match(line)
        if directory is None or match is None:
            continue
        job, restart, code, mtime = match.groups()
        markers.append(EndMarker(directory, job, int(restart), int(code), float(mtime)))
    return markers


def remove_end_markers(directory: str, slurm_job_id: str, also: Sequence[str] = ()) -> str:
    """Remove every end marker of one job (all its runs) and the files ``also`` (e.g. its secret sidecar).

    :raises ValidationError: for an id that is not a plain number, or a relative path.
    """
    if not slurm_job_id.isdigit():
        raise ValidationError(f"SLURM job id {slurm_job_id!r} has no end markers (only plain numeric ids do)")
    files = join(_absolute_all(also)) + " " if also else ""
    return f"rm -f -- {files}{quote(_absolute(directory, 'ends directory'))}/{slurm_job_id}-*.end"
