"""The one fake of :class:`~airflow_provider_tao_slurm.hooks.slurm.SlurmHook` the unit tests share.

:class:`FakeSlurmHook` keeps the cluster in plain attributes (files in a dict, job states in a dict,
command answers from handlers) and records what the code under test asked of it. Every public method
it defines has the real hook's signature, and so has every method a test module's subclass overrides:
``test_fakes.py`` checks both with :mod:`inspect`, so a fake cannot drift from the hook again.

Replies go through the hook's own reply readers (``_result``, ``_file_text``): a failed command with
``check``, a missing file and an unreadable one end the way they end on a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.logstream import TailChunk, TailRequest
from airflow_provider_tao_slurm.core.partitions import Partition
from airflow_provider_tao_slurm.core.status import parse_status_lines
from airflow_provider_tao_slurm.hooks.replies import CommandResult, _file_text, _result
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.mounts import SiteMounts
    from airflow_provider_tao_slurm.core.states import JobState

#: The fake's cluster unless a test gives its own.
SETTINGS = ClusterSettings(
    hosts=("login",),
    user="u",
    partitions=("polar",),
    account="acct",
    results_dir="/lustre/u",
    container_mounts="/lustre:/lustre",
    cluster_name="mini",
)
#: What ``sinfo`` says of the fake cluster's partitions: a 4 h default one and a 48 h one, 4 GPUs a node.
PARTITIONS = (Partition("polar", 4.0, True, 4), Partition("polar_long", 48.0, False, 4))
#: stderr of a read of a path in :attr:`FakeSlurmHook.unreadable`.
READ_ERROR = "Input/output error"
#: stderr of a write to a path in :attr:`FakeSlurmHook.unwritable`.
WRITE_ERROR = "No space left on device"

#: One way to answer commands: a reply for the commands it knows, None for the others.
Handler = Callable[[str], CommandResult | None]
#: Files as :meth:`SlurmHook.stage_files` takes them: ``{relative path: (content or None for a directory, mode)}``.
StagedFiles = Mapping[str, tuple[bytes | None, int]]


class Submission(NamedTuple):
    """One :meth:`FakeSlurmHook.submit` that reached sbatch."""

    script_path: str
    job_name: str
    log_dir: str
    extra_args: tuple[str, ...] = ()


class FakeSlurmHook:
    """A recording stand-in for :class:`~airflow_provider_tao_slurm.hooks.slurm.SlurmHook`.

    The cluster, for a test to set up:

    - ``settings``: the connection's :class:`ClusterSettings` (:data:`SETTINGS` unless given);
    - ``files``: remote text files by absolute path; a path in ``unreadable`` fails to read
      (:class:`~airflow_provider_tao_slurm.exceptions.RemoteReadError`), as a stale NFS handle does;
      one in ``unwritable`` fails to write (:class:`~airflow_provider_tao_slurm.exceptions.RemoteCommandError`,
      nothing written); what was staged reads back too;
    - ``handlers``: answer :meth:`run`/:meth:`a_run`, first reply wins; any other command exits 0, silent;
    - ``states``: what :meth:`get_states` reports per SLURM job id (absent: unknown to SLURM);
    - ``found``: our job ids per job name for :meth:`find_jobs_by_name`; ``lookup_error`` makes it fail;
    - ``next_job_id``: the id the next :meth:`submit` gets; ``submit_error`` makes sbatch refuse;
    - ``job_info``: what ``scontrol show job`` says per id; ``partitions``: the partitions' limits;
    - ``absent``: paths that do not exist for a path check (every other path exists);
    - ``site``: the site mounts a preflight cached (None: none did).

    What was asked: ``reads`` (paths read), ``modes`` (of written files), ``commands``, ``path_checks``
    (the paths each :meth:`partition_limits_and_missing` tested), ``staged``
    (each staging's base and files) and ``staged_files`` (by absolute path), ``submits``,
    ``released`` (adopted jobs whose logs were prepared), ``lookups``, ``polls``, ``cancels``, ``handed_off``
    (cancels left to the login host).
    """

    def __init__(self, files: Mapping[str, str] | None = None, *, settings: ClusterSettings = SETTINGS) -> None:
        self.settings = settings
        self.files: dict[str, str] = dict(files or {})
        self.unreadable: set[str] = set()
        self.unwritable: set[str] = set()
        self.reads: list[str] = []
        self.modes: dict[str, str] = {}
        self.handlers: list[Handler] = []
        self.commands: list[str] = []
        self.staged: list[tuple[str, dict[str, tuple[bytes | None, int]]]] = []
        self.staged_files: dict[str, tuple[bytes | None, int]] = {}
        self.next_job_id = 501
        self.submit_error: Exception | None = None
        self.submits: list[Submission] = []
        self.released: list[tuple[str, str, str]] = []
        self.found: dict[str, list[str]] = {}
        self.lookup_error: Exception | None = None
        self.lookups: list[str] = []
        self.states: dict[str, JobState] = {}
        self.polls: list[list[str]] = []
        self.poll_error: Exception | None = None
        self.cancels: list[tuple[list[str], str | None]] = []
        self.handed_off: list[tuple[list[str], str, float, float, str | None]] = []
        self.job_info: dict[str, dict[str, str]] = {}
        self.partitions: list[Partition] = list(PARTITIONS)
        self.absent: set[str] = set()
        self.site: SiteMounts | None = None
        self.path_checks: list[list[str]] = []

    # ------------------------------------------------------------------ commands and files

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        what: str = "command",
    ) -> CommandResult:
        """Record ``command`` and answer it from the first handler that knows it (else exit 0, no output)."""
        self.commands.append(command)
        replies = (handler(command) for handler in self.handlers)
        reply = next((reply for reply in replies if reply is not None), CommandResult(0, "", ""))
        host = reply.host or self.settings.hosts[0]
        return _result(reply.rc, reply.stdout.encode(), reply.stderr.encode(), host, check=check, what=what)

    def write_file(self, path: str, data: bytes, mode: str = "600") -> None:
        """Keep ``data`` as the text of ``path`` and its mode in ``modes`` (a path in ``unwritable`` fails)."""
        if path in self.unwritable:
            _result(1, b"", WRITE_ERROR.encode(), self.settings.hosts[0], check=True, what=f"writing {path}")
        self.files[path] = data.decode()
        self.modes[path] = mode

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """The file's text; None only when there is no such file; RemoteReadError for an unreadable one."""
        self.reads.append(path)
        host = self.settings.hosts[0]
        text = self._text(path)
        if path in self.unreadable:
            reply = CommandResult(1, "", READ_ERROR, host)
        elif text is None:
            reply = CommandResult(commands.MISSING_FILE_STATUS, "", "", host)
        else:
            reply = CommandResult(0, text.encode()[:max_bytes].decode("utf-8", "ignore"), "", host)
        return _file_text(reply, path)

    def read_log(self, path: str, offset: int = 0, max_bytes: int = 65536) -> TailChunk[str]:
        """At most ``max_bytes`` of a log from ``offset`` (from 0 when the file shrank); empty when missing."""
        data = (self._text(path) or "").encode()
        restarted = offset > len(data)
        start = 0 if restarted else offset
        piece = data[start : start + max_bytes]
        return TailChunk(
            data=piece.decode("utf-8", "replace"),
            size=len(data),
            next_offset=start + len(piece),
            restarted=restarted,
        )

    def tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk[bytes]]:
        """Each file's bytes since its offset (or its cursor), the last ``max_bytes`` of them, as the hook's script."""
        return [self._tail(request) for request in requests]

    def read_status_json(self, path: str, max_bytes: int = 1 << 20) -> list[dict[str, Any]] | None:
        """The status lines in ``files[path]``; None only when there is no such file."""
        text = self.read_file(path, max_bytes)
        return None if text is None else parse_status_lines(text)

    # ------------------------------------------------------------------ jobs

    def stage_files(self, base: str, files: StagedFiles) -> None:
        """Record the staging (``staged``) and keep each file's content and mode (``staged_files``)."""
        self.staged.append((base, dict(files)))
        self.staged_files.update({f"{base}/{name}": item for name, item in files.items()})

    def submit(
        self,
        script_path: str,
        job_name: str,
        *,
        log_dir: str,
        extra_args: Sequence[str] = (),
        stage: tuple[str, StagedFiles] | None = None,
        reconcile_timeout: float | None = None,
        reconcile_interval: float | None = None,
    ) -> str:
        """Stage ``stage`` first (one round trip, as the hook), then raise ``submit_error`` or hand out the next id."""
        if stage is not None:
            self.stage_files(*stage)
        if self.submit_error is not None:
            raise self.submit_error
        self.submits.append(Submission(script_path, job_name, log_dir, tuple(extra_args)))
        self.next_job_id += 1
        return str(self.next_job_id - 1)

    def prepare_job_logs(self, log_dir: str, job_name: str, job_id: str) -> None:
        """Record the release of an adopted job (``released``)."""
        self.released.append((log_dir, job_name, job_id))

    def find_jobs_by_name(
        self, job_name: str, *, all_hosts: bool = False, since: str = DEFAULT_SACCT_WINDOW
    ) -> list[str]:
        """Our jobs of that name from ``found``; ``lookup_error`` when set (a lookup that failed)."""
        self.lookups.append(job_name)
        if self.lookup_error is not None:
            raise self.lookup_error
        return list(self.found.get(job_name, []))

    def get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        """The states ``states`` has of these jobs (the others are unknown to SLURM); raise ``poll_error`` if set."""
        ids = list(job_ids)
        self.polls.append(ids)
        if self.poll_error is not None:
            raise self.poll_error
        return {job_id: self.states[job_id] for job_id in ids if job_id in self.states}

    def describe_job(self, slurm_job_id: str) -> dict[str, str]:
        """What ``job_info`` says of the job; empty for a job slurmctld does not know."""
        return dict(self.job_info.get(slurm_job_id, {}))

    def cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        """Record the scancel (``cancels``)."""
        self.cancels.append((list(job_ids), job_name))

    def hand_off_cancel(
        self, job_ids: Sequence[str], *, job_name: str, within_s: float, every_s: float, log_path: str | None
    ) -> None:
        """Record the cancel left to the login host (``handed_off``)."""
        self.handed_off.append((list(job_ids), job_name, within_s, every_s, log_path))

    def partition_limits(self, *, fresh: bool = False) -> list[Partition]:
        """The cluster's ``partitions``."""
        return list(self.partitions)

    def partition_limits_and_missing(
        self, paths: Sequence[str], *, fresh: bool = False
    ) -> tuple[list[Partition], list[str]]:
        """:meth:`partition_limits` and the ``paths`` in ``absent`` (recorded in ``path_checks``)."""
        self.path_checks.append(list(paths))
        return self.partition_limits(fresh=fresh), [path for path in paths if path in self.absent]

    def site_mounts(self) -> SiteMounts | None:
        """The cluster's ``site`` mounts."""
        return self.site

    # ------------------------------------------------------------------ async twins

    async def a_run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        what: str = "command",
    ) -> CommandResult:
        """As :meth:`run`."""
        return self.run(command, stdin=stdin, timeout=timeout, check=check, what=what)

    async def a_settings(self) -> ClusterSettings:
        """The ``settings``."""
        return self.settings

    async def a_get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        """As :meth:`get_states`."""
        return self.get_states(job_ids, since=since)

    async def a_read_log(self, path: str, offset: int = 0, max_bytes: int = 65536) -> TailChunk[str]:
        """As :meth:`read_log`."""
        return self.read_log(path, offset, max_bytes)

    async def a_tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk[bytes]]:
        """As :meth:`tail_many`."""
        return self.tail_many(requests)

    async def a_cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        """As :meth:`cancel`."""
        self.cancel(job_ids, job_name=job_name)

    async def a_hand_off_cancel(
        self, job_ids: Sequence[str], *, job_name: str, within_s: float, every_s: float, log_path: str | None
    ) -> None:
        """As :meth:`hand_off_cancel`."""
        self.hand_off_cancel(job_ids, job_name=job_name, within_s=within_s, every_s=every_s, log_path=log_path)

    async def a_read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """As :meth:`read_file`."""
        return self.read_file(path, max_bytes)

    async def a_write_file(self, path: str, data: bytes, mode: str = "600") -> None:
        """As :meth:`write_file`."""
        self.write_file(path, data, mode)

    # ------------------------------------------------------------------ helpers

    def _text(self, path: str) -> str | None:
        """The text of a file, written or staged; None when there is none."""
        if path in self.files:
            return self.files[path]
        content = self.staged_files.get(path, (None, 0))[0]
        return None if content is None else content.decode()

    def _tail(self, request: TailRequest) -> TailChunk[bytes]:
        """One file of :meth:`tail_many`: its cursor file is read and moved on as the hook's script does."""
        text = self._text(request.path)
        if text is None:
            return TailChunk(missing=True)
        data = text.encode()
        offset = request.offset
        if offset is None:
            cursor = (self._text(request.cursor_path) or "").strip() if request.cursor_path else ""
            offset = int(cursor) if cursor.isdigit() else 0
        if offset > len(data):
            offset = 0
        skipped = max(0, len(data) - offset - request.max_bytes)
        chunk = TailChunk(False, offset, skipped, data[offset + skipped :])
        if request.cursor_path and chunk.end != request.offset:
            self.files[request.cursor_path] = f"{chunk.end}\n"
        return chunk


class FakeTaskStateStore:
    """Airflow's ``task_state_store`` accessor as a dict, with its ``get``/``set`` signatures (values JSON-copied)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.retention: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self.values[key] = json.loads(json.dumps(value))
        self.retention[key] = retention
