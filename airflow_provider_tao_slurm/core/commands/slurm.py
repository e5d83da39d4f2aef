"""The SLURM command-line verbs: submit, query, cancel, and what sinfo and sacctmgr know.

Read the answers with the parsers of :mod:`~airflow_provider_tao_slurm.core.states` and
:mod:`~airflow_provider_tao_slurm.core.partitions`, or with the ``parse_*`` functions here.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_tao_slurm.core.commands.guard import _chain, secure_dirs
from airflow_provider_tao_slurm.core.commands.values import (
    _SLURM_NAME_RE,
    _absolute,
    _count,
    _names,
    _slurm_job_ids,
    _starttime,
)
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
        # a failed squeue is no answer: the job stays held and the caller looks it up by name
        f"listed=$({same_name}) || "
        "{ printf '%s\\n' \"$reply\"; echo 'squeue failed: the job stays held' >&2; exit 4; }; "
        "first=$(printf '%s\\n' \"$listed\" | sort -n | head -n 1); "
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


def sacct_states(job_ids: Sequence[str], starttime: str, *, every_run: bool = False) -> str:
    """``sacct -X -n -P -j ID,... -o SACCT_FIELDS --starttime=START``: final states and exit codes.

    :param job_ids: SLURM job ids (duplicates are dropped).
    :param starttime: ``now-<n><unit>`` or ``YYYY-MM-DDTHH:MM:SS``.
    :param every_run: ``-D``: a row for every run of a requeued job, oldest first (parse with
        ``count_runs``), not only its newest.
    :returns: the command line; parse its output with ``states.parse_sacct``.
    :raises ValidationError: for an empty list, a bad id or a bad start time.
    """
    return join(
        [
            "sacct",
            *(["-D"] if every_run else []),
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
    """Return the :data:`SHOW_JOB_KEYS` of :func:`show_job`'s line (empty for an empty reply).

    ``UserId`` reads ``name(uid)``; only the name is kept. A value holding a space followed by
    ``Word=`` is cut there (scontrol does not quote values). Keys are found by name wherever they
    stand, so every release's line reads the same: ``TRES=`` (22.05) or ``ReqTRES=``/``AllocTRES=``
    (23.02 and later), job flags run together, comma- or space-separated (25.11 and later), and a
    blank ``StdErr=`` (25.11 and later, when the job did not set one).

    :raises RemoteCommandError: for a reply with text but no ``JobId=`` line.
    """
    line = next((row for row in stdout.splitlines() if row.startswith("JobId=")), "")
    if not line and stdout.strip():
        raise RemoteCommandError(
            f"scontrol show job printed {stdout.strip()[:300]!r}, expected one line of Key=Value pairs starting "
            "with JobId=; nothing is guessed from it"
        )
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


def scancel_handed_off(
    job_ids: Sequence[str], *, name: str, user: str | None, within_s: float, every_s: float, log_path: str | None
) -> str:
    """Leave a cancel to the login host: a detached loop runs :func:`scancel` until slurmctld takes it.

    For a cancel whose ``scancel`` failed because the login host could not reach slurmctld (restarting, or
    cut off) while Airflow gives ``on_kill`` only seconds: the loop outlives the SSH session (``nohup``, every
    stream redirected, so the command returns at once) and tries every ``every_s`` seconds for ``within_s``
    seconds. It ends when scancel goes through or says nothing (``-Q``'s silent exit 1: the job is no longer
    live). Each try's error and the outcome go to ``log_path`` (stamped in UTC), never a secret: only
    scancel's own words.

    :param job_ids: SLURM job ids.
    :param name: our job name: only a job of exactly that name is cancelled (a reused id is never hit).
    :param user: the connection's SLURM user, as :func:`scancel`.
    :param log_path: where the loop writes what became of it; None: nowhere.
    :returns: the command line.
    :raises ValidationError: for a bad id, name or user, or a window or interval that is not positive.
    """
    if not (within_s > 0 and every_s > 0):
        raise ValidationError(f"a handed-off cancel needs a positive window and interval, not {within_s}/{every_s}")
    cancel = scancel(job_ids, name=name, user=user)
    loop = (
        f"end=$(( $(date +%s) + {int(within_s)} )); "
        f"while :; do err=$({cancel} 2>&1 >/dev/null); rc=$?; "
        'if [ "$rc" -eq 0 ] || [ -z "$err" ]; then echo "$(date -u +%FT%TZ) scancel went through"; exit 0; fi; '
        'echo "$(date -u +%FT%TZ) scancel failed ($rc): $err"; '
        'if [ "$(date +%s)" -ge "$end" ]; then echo "$(date -u +%FT%TZ) gave up: cancel the job by hand"; exit 1; fi; '
        f"sleep {every_s:g}; done"
    )
    target = quote(_absolute(log_path, "cancel log path")) if log_path else "/dev/null"
    return f"nohup sh -c {quote(loop)} </dev/null >>{target} 2>&1 &"


def sinfo_partitions() -> str:
    """``sinfo -a -h -o SINFO_FORMAT``: every partition (hidden ones too), its limit, state, access and node shapes.

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


#: The fields of a :func:`sacctmgr_assoc` row.
_ASSOC_FIELDS = 5


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


# ------------------------------------------------------------------ nodes

_NODELIST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-\[\],]*")


def existing_nodes(node_list: str) -> str:
    """``sinfo -a -h -N -o %N -n LIST``: the nodes of a SLURM hostlist (``n[1-2]``) that exist, one per line.

    ``-a``: a node only in a hidden partition (``Hidden=YES``) is listed too, as by every sinfo the
    provider sends.

    :raises ValidationError: for a list with characters a hostlist cannot have.
    """
    if not _NODELIST_RE.fullmatch(node_list or ""):
        raise ValidationError(f"node list {node_list!r} is not a SLURM hostlist such as n1 or n[1-3,5]")
    return join(["sinfo", "-a", "-h", "-N", "-o", "%N", "-n", node_list])


def node_states() -> str:
    """``sinfo -a -h -N -o '%N|%P|%t'``: every node of every partition with its short state, one per line.

    ``-a``: hidden partitions (``Hidden=YES``) too, so that a job on one is resubmitted on its nodes
    (plain sinfo lists none of them there). Read it with :func:`parse_node_states`; a node in several
    partitions has one line per partition.
    """
    return join(["sinfo", "-a", "-h", "-N", "-o", "%N|%P|%t"])


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
        """Whether the node is healthy: a state of :data:`HEALTHY_NODE_STATES` and answering (no ``*``).

        Down, drained, failing (``fail``, ``failg``), in maintenance, booting, powered off, unknown
        or silent nodes are not; neither is a state this provider does not know (never read as healthy).
        """
        return not self.state.endswith("*") and self.state.rstrip(_NODE_STATE_FLAGS) in HEALTHY_NODE_STATES


#: sinfo's short node states (``%t``) of a healthy node, flags removed; BLOCK (24.05 and later): idle but
#: held for an exclusive topology job.
HEALTHY_NODE_STATES = frozenset({"idle", "mix", "alloc", "comp", "resv", "plnd", "npc", "block", "cloud", "resm"})
#: The one-character flags sinfo appends to a short state (``*`` = not responding).
_NODE_STATE_FLAGS = "*$^@#%~!+-"


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
