"""``SlurmHook``: the provider's one door to a SLURM cluster, over SSH.

The hook speaks SLURM (submit, poll, cancel, read and write files, partitions); how it gets there lives
beside it: :mod:`~airflow_provider_tao_slurm.hooks.options` turns the connection into SSH options once
for both transports, :mod:`~airflow_provider_tao_slurm.hooks.failover` tries the login hosts in
order, :mod:`~airflow_provider_tao_slurm.hooks.transport` is the sync side (paramiko, through the SSH
provider's :class:`~airflow.providers.ssh.hooks.ssh.SSHHook`: ONE connection for the hook's lifetime)
and :mod:`~airflow_provider_tao_slurm.hooks.async_transport` the async side (asyncssh: one pooled
connection per cluster account, shared by every trigger of a triggerer). Replies are read in
:mod:`~airflow_provider_tao_slurm.hooks.replies`.

Every command string comes from :mod:`airflow_provider_tao_slurm.core.commands` (every value
quoted); every output is parsed by the core. Secrets travel only over stdin.

The public names code written against earlier releases imports from this module stay importable here
(``async_pool``, ``check_key_file``, ``LogChunk``): they are re-exported (``import x as x``). Private
helpers are imported from the module that owns them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.commands import STAGING_FAILED as STAGING_FAILED
from airflow_provider_tao_slurm.core.config import ClusterSettings, settings_from_connection, settings_from_env
from airflow_provider_tao_slurm.core.defaults import DEFAULT_CONN_ID
from airflow_provider_tao_slurm.core.logstream import TailChunk, TailRequest, tail_script
from airflow_provider_tao_slurm.core.mounts import SiteMounts
from airflow_provider_tao_slurm.core.partitions import Partition, parse_sinfo_partitions
from airflow_provider_tao_slurm.core.secrets import redact_text
from airflow_provider_tao_slurm.core.states import (
    JobState,
    NameLookup,
    parse_jobs_by_name,
    parse_sacct,
    parse_sbatch_reply,
)
from airflow_provider_tao_slurm.core.status import parse_status_lines
from airflow_provider_tao_slurm.exceptions import (
    CommandTimeoutError,
    ConnectionConfigError,
    ConnectionLostError,
    JobLookupError,
    RemoteCommandError,
    SlurmConnectionError,
    SubmissionError,
    SubmissionOutcomeUnknownError,
)
from airflow_provider_tao_slurm.hooks.async_transport import async_pool as async_pool
from airflow_provider_tao_slurm.hooks.failover import connect_first_blocking
from airflow_provider_tao_slurm.hooks.options import check_key_file as check_key_file
from airflow_provider_tao_slurm.hooks.options import ssh_options
from airflow_provider_tao_slurm.hooks.replies import (
    CommandResult,
    _check_scancel,
    _combine_poll,
    _file_text,
    _log_chunk,
    _needs_sacct,
    _result,
    _tail_chunks,
)
from airflow_provider_tao_slurm.hooks.transport import _exec_channel, connect

if TYPE_CHECKING:
    import paramiko

#: The name :meth:`SlurmHook.read_log`'s chunks had before every log reader shared one chunk type.
LogChunk = TailChunk

#: sacct looks back this far when searching by name (without ``--starttime`` it starts at midnight).
DEFAULT_SACCT_WINDOW = "now-7days"
#: How long one sinfo answer about the partitions serves every worker of a cluster.
PARTITION_CACHE_S = 600
#: The cache file's name under ``<results_dir>/.tao-slurm``; it names sinfo's output format, so an answer
#: cached by a version that asked sinfo for other fields is never read as this one's.
PARTITION_CACHE_NAME = "partitions-a-gres-avail-cpus-mem-access-deftime"
#: The preflight's cache of the site's Enroot mounts (:class:`~airflow_provider_tao_slurm.core.mounts.SiteMounts`
#: as JSON) under ``<results_dir>/.tao-slurm``; read back with every partition read.
SITE_MOUNTS_CACHE_NAME = "site-mounts.json"


#: event loop -> connection id -> the read of its settings in flight; a finished read is dropped at once.
_READS_IN_FLIGHT: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future[ClusterSettings]]] = (
    weakref.WeakKeyDictionary()
)


def _read_done(
    reads: dict[str, asyncio.Future[ClusterSettings]], key: str, read: asyncio.Future[ClusterSettings]
) -> None:
    """Drop the finished ``read`` of ``key`` (its outcome stays its awaiters' own; a later hook reads anew)."""
    if not read.cancelled():
        read.exception()  # retrieved here too: a read whose awaiters were all cancelled logs nothing
    if reads.get(key) is read:
        del reads[key]


class SlurmHook(BaseHook):
    """Run commands on a SLURM cluster's login hosts over SSH.

    Settings come from the ``tao_slurm`` Airflow connection ``slurm_conn_id``; when that connection
    does not exist, from the ``SLURM_*`` environment variables (``SLURM_USER``, ``SLURM_HOSTNAME``,
    ``SSH_KEY_PATH``, ...).

    :param slurm_conn_id: the Airflow connection id.
    :param settings: explicit settings (tests, benchmarks); skips the connection lookup.
    """

    conn_name_attr = "slurm_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "tao_slurm"
    hook_name = "TAO SLURM (over SSH)"

    def __init__(self, slurm_conn_id: str = default_conn_name, *, settings: ClusterSettings | None = None) -> None:
        super().__init__()
        self.slurm_conn_id = slurm_conn_id
        self._explicit_settings = settings
        self._async_settings: ClusterSettings | None = None
        self._client: paramiko.SSHClient | None = None
        self._host: str | None = None
        #: The site mounts this hook's last partition read brought back (a 1-tuple once read).
        self._site_mounts: tuple[SiteMounts | None] | None = None

    # ------------------------------------------------------------------ settings and connection

    @cached_property
    def settings(self) -> ClusterSettings:
        """The validated cluster settings (connection first, then ``SLURM_*`` variables)."""
        if self._explicit_settings is not None:
            return self._explicit_settings
        try:
            conn = self.get_connection(self.slurm_conn_id)
        except AirflowNotFoundException:
            return self._settings_without_connection()
        return settings_from_connection(
            host=conn.host,
            login=conn.login,
            port=conn.port,
            extra=conn.extra_dejson,
            source=f"connection {self.slurm_conn_id!r}",
        )

    def _settings_without_connection(self) -> ClusterSettings:
        """Read the settings from the ``SLURM_*`` variables, for when the default Airflow connection does not exist.

        The variables stand in for the default connection only: an explicitly named connection that
        does not exist is an error (a typo must not silently reach another cluster).

        :raises ConnectionConfigError: for a missing named connection, or when ``SLURM_HOSTNAME`` is not set.
        """
        if self.slurm_conn_id != self.default_conn_name:
            raise ConnectionConfigError(
                f"Airflow connection {self.slurm_conn_id!r} does not exist: create it (type 'tao_slurm') or fix "
                f"slurm_conn_id; the SLURM_* environment variables stand in for {self.default_conn_name!r} only"
            )
        if os.environ.get("SLURM_HOSTNAME"):
            return settings_from_env(os.environ)
        raise ConnectionConfigError(
            f"no Airflow connection {self.slurm_conn_id!r} and SLURM_HOSTNAME is not set: create a "
            "'tao_slurm' connection or export SLURM_HOSTNAME, SLURM_USER and SSH_KEY_PATH"
        )

    @property
    def active_host(self) -> str | None:
        """The login host the current connection goes to (None before connecting)."""
        return self._host

    def _connect(self, host: str) -> paramiko.SSHClient:
        """Connect to one login host (see :func:`~airflow_provider_tao_slurm.hooks.transport.connect`).

        :raises SlurmConnectionError: (or a subclass) naming the host and why.
        """
        return connect(ssh_options(self.settings, host))

    def get_conn(self) -> paramiko.SSHClient:
        """Return the hook's SSH connection, connecting to the first login host that answers.

        :raises SlurmConnectionError: (or a subclass) listing every host tried and why it failed.
        """
        if self._client is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client
            self.close()
        host, client = connect_first_blocking(self.settings.cluster_name, self.settings.hosts, self._connect)
        self._host, self._client = host, client
        return client

    def close(self) -> None:
        """Close the SSH connection (a later call reconnects)."""
        if self._client is not None:
            self._client.close()
        self._client = None
        self._host = None

    # ------------------------------------------------------------------ running commands

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        what: str = "command",
    ) -> CommandResult:
        """Run ``command`` on the login host; ``stdin`` (e.g. a secret) is sent over the channel.

        :param timeout: seconds before the command is abandoned (default: the connection's cmd_timeout).
        :param check: raise :class:`RemoteCommandError` on a non-zero exit status.
        :param what: a short description used in errors.
        :raises ConnectionLostError: when the connection dropped after the command was sent.
        :raises StoragePathError: when the command refused to write into a directory another user
            could plant files in (:func:`~airflow_provider_tao_slurm.core.commands.secure_dirs`), whatever ``check``.
        """
        rc, out, err, host = self._run_bytes(command, stdin, timeout)
        return _result(rc, out, err, host, check=check, what=what)

    def _run_bytes(self, command: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes, str]:
        """Run ``command``; return the exit status, raw stdout and stderr, and the host used."""
        client = self.get_conn()
        host = self._host or ""
        limit = self.settings.cmd_timeout if timeout is None else timeout
        self.log.debug("ssh %s: %s", host, command)
        try:
            rc, out, err = _exec_channel(client, command, stdin, limit)
        except ConnectionLostError:
            self.close()
            raise
        return rc, out, err, host

    def check_paths(self, paths: Sequence[str]) -> list[str]:
        """Return the paths (absolute cluster paths) that do not exist, checked in one round trip."""
        if not paths:
            return []
        result = self.run(commands.test_paths(paths), check=True, what="path check")
        return commands.parse_test_paths(result.stdout, paths)

    def write_file(self, path: str, data: bytes, mode: str = "600") -> None:
        """Write ``data`` to ``path`` atomically (temp file + rename) with ``mode``; content goes over stdin."""
        base = commands.trusted_base(path, self.settings.results_dir)
        self.run(commands.write_file_from_stdin(path, mode, base), stdin=data, check=True, what=f"writing {path}")

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """Read at most ``max_bytes`` of a remote text file; None only when it does not exist.

        :raises RemoteReadError: when the read failed otherwise (I/O error, stale handle, permission, a
            killed command): the file may exist, so that is never None.
        """
        return _file_text(self.run(commands.read_file(path, max_bytes)), path)

    def read_log(self, path: str, offset: int = 0, max_bytes: int = 65536) -> TailChunk[str]:
        """Read a log from a byte offset, at most ``max_bytes``; restarts at 0 if the file shrank.

        A multi-byte UTF-8 character cut by ``max_bytes`` is left for the next read, so joining the
        chunks' ``data`` gives back the file's text exactly.
        """
        _rc, out, _err, _host = self._run_bytes(commands.tail_bytes(path, offset, max_bytes), None, None)
        return _log_chunk(out, offset)

    def tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk[bytes]]:
        """Read what every file appended since its offset, in one round trip (the script goes over stdin).

        :raises RemoteCommandError: when the reading script failed or its answer is incomplete.
        """
        if not requests:
            return []
        script, nonce = tail_script(requests)
        rc, out, err, host = self._run_bytes("sh -s", script.encode(), None)
        return _tail_chunks(rc, out, err, host, len(requests), nonce)

    def read_status_json(self, path: str, max_bytes: int = 1 << 20) -> list[dict[str, Any]] | None:
        """Read TAO ``status.json`` (JSON lines, or one JSON document); None only when it does not exist.

        :raises RemoteReadError: when the read failed otherwise.
        """
        text = self.read_file(path, max_bytes)
        return None if text is None else parse_status_lines(text)

    # ------------------------------------------------------------------ jobs

    def stage_files(self, base: str, files: Mapping[str, tuple[bytes | None, int]]) -> None:
        """Write several files under ``base`` in one round trip: a tar archive sent over stdin.

        :param files: ``{relative path: (content, mode)}``, content ``None`` for a directory; secrets
            (the sidecar) go here too, never in argv.
        """
        command, archive = commands.staging(base, files, int(time.time()))
        self.run(command, stdin=archive, check=True, what=f"staging files under {base}")

    def submit(
        self,
        script_path: str,
        job_name: str,
        *,
        log_dir: str,
        extra_args: Sequence[str] = (),
        stage: tuple[str, Mapping[str, tuple[bytes | None, int]]] | None = None,
        reconcile_timeout: float | None = None,
        reconcile_interval: float | None = None,
    ) -> str:
        """Submit a staged batch script in one round trip and return its SLURM job id.

        The job is submitted held, checked to be the only live job of its name (an older twin wins), its
        log directory ``<log_dir>/<job_name>-<id>`` created, then released. First it takes its RPCs from
        the user's budget where the site limits RPCs or the connection sets a budget
        (:func:`~airflow_provider_tao_slurm.core.commands.rpc_pacing`; the connection's ``rpc_bucket_size``
        and ``rpc_refill_rate``), waiting up to
        :data:`~airflow_provider_tao_slurm.core.commands.MAX_PACING_WAIT_S` seconds when a storm spent it,
        and says in the task log how long it waited and why.
        This is one try: what to do when its outcome is unknown is
        :func:`~airflow_provider_tao_slurm.lifecycle.submission.submit_job`'s.

        :param stage: ``(base, files)`` as :meth:`stage_files` takes them, staged in the same round
            trip right before sbatch.
        :param reconcile_timeout: deprecated (goes in the next release): with it or ``reconcile_interval``
            the call is the previous release's, a submission reconciled by name when its outcome is
            unknown; use :func:`~airflow_provider_tao_slurm.lifecycle.submission.submit_job`, which this
            then calls (its ``reconcile_timeout``/``reconcile_interval``).
        :param reconcile_interval: deprecated, as ``reconcile_timeout``.
        :raises SubmissionError: when SLURM refused the job (message has sbatch's reason).
        :raises RemoteCommandError: when staging the files failed (nothing was submitted).
        :raises SubmissionOutcomeUnknownError: when the job may exist: the command timed out, the
            connection dropped, the reply had no job id, or the job was submitted but not released.
        """
        if reconcile_timeout is not None or reconcile_interval is not None:
            from airflow_provider_tao_slurm.lifecycle import submission  # the deprecated call only

            _deprecated(
                "SlurmHook.submit's reconcile_timeout and reconcile_interval", "lifecycle.submission.submit_job"
            )
            return submission.submit_job(
                self,
                script_path,
                job_name,
                log_dir=log_dir,
                log=self.log,
                extra_args=extra_args,
                stage=stage,
                reconcile_timeout=reconcile_timeout,
                reconcile_interval=reconcile_interval,
            )
        command, archive = self._sbatch_command(script_path, job_name, log_dir, extra_args, stage)
        result = self._run_paced(command, archive, job_name)
        return self._sbatch_reply(result, script_path, job_name)

    def _sbatch_command(
        self,
        script_path: str,
        job_name: str,
        log_dir: str,
        extra_args: Sequence[str],
        stage: tuple[str, Mapping[str, tuple[bytes | None, int]]] | None,
    ) -> tuple[str, bytes | None]:
        """Return the held submission's command, after the staging of ``stage`` when given, and its stdin.

        :returns: the command and the archive it unpacks from stdin (``None`` without ``stage``).
        """
        command = commands.sbatch_submit_held(
            script_path,
            log_dir=log_dir,
            job_name=job_name,
            user=self.settings.user,
            base=commands.trusted_base(log_dir, self.settings.results_dir),
            extra_args=extra_args,
        )
        if stage is None:
            return command, None
        staging, archive = commands.staging(*stage, int(time.time()))
        return commands.staged_then(staging, command), archive

    def _run_paced(self, command: str, archive: bytes | None, job_name: str) -> CommandResult:
        """Run the submission after taking its RPCs from the user's budget; log how long that took, and why.

        :returns: the result, its stderr without the pacing's report.
        :raises SubmissionOutcomeUnknownError: when the command timed out or the connection dropped.
        """
        settings = self.settings
        pacing = commands.rpc_pacing(commands.SUBMISSION_RPCS, settings.rpc_bucket_size, settings.rpc_refill_rate)
        try:
            result = self.run(
                pacing + command,
                stdin=archive,
                timeout=settings.cmd_timeout + (commands.MAX_PACING_WAIT_S if pacing else 0.0),
                what="sbatch",
            )
        except (ConnectionLostError, CommandTimeoutError) as exc:
            raise SubmissionOutcomeUnknownError(f"sbatch of {job_name}: {exc}") from exc
        paced = commands.parse_paced(result.stderr)
        if paced.waited:
            self.log.info(
                "%s waited %.1f s for the cluster user's RPC budget: %s", job_name, paced.waited, paced.reason
            )
        return dataclasses.replace(result, stderr=paced.rest)

    def prepare_job_logs(self, log_dir: str, job_name: str, job_id: str) -> None:
        """Create the log directory ``<log_dir>/<job_name>-<job_id>`` of an adopted job and release it if held.

        :raises StoragePathError: when another user could plant files in the log tree.
        :raises RemoteCommandError: when that failed.
        """
        base = commands.trusted_base(log_dir, self.settings.results_dir)
        self.run(
            commands.prepare_job_logs(log_dir, job_name, job_id, base), check=True, what="releasing the adopted job"
        )

    def _sbatch_reply(self, result: CommandResult, script_path: str, job_name: str) -> str:
        """Return the job id from the submitting round trip's reply, or the error it means."""
        if result.rc != 0 and STAGING_FAILED in result.stderr:
            raise RemoteCommandError(
                f"staging the job's files failed on {result.host} with exit status {result.rc}, so nothing was "
                f"submitted: {result.stderr.replace(STAGING_FAILED, '').strip()[-2000:]}",
                rc=result.rc,
                stderr=result.stderr,
            )
        parsed = parse_sbatch_reply(result.stdout)
        concurrent = re.search(r"^#concurrent (\d+) (\d+)$", result.stdout, re.M)
        if concurrent:
            self.log.warning(
                "Another try of this task submitted job %s first: the job just submitted (%s) was cancelled "
                "while held and %s is adopted",
                concurrent.group(2),
                concurrent.group(1),
                concurrent.group(2),
            )
        if result.rc != 0 and parsed:
            raise SubmissionOutcomeUnknownError(
                f"sbatch submitted {job_name} as job {parsed[0]}, but checking it for a twin or releasing it failed "
                f"(exit status {result.rc}): {result.stderr.strip()[-2000:]}",
                job_id=parsed[0],
                rc=result.rc,
                stderr=result.stderr,
            )
        if result.rc != 0:
            raise SubmissionError(
                f"sbatch refused {script_path}: {result.stderr.strip()[-2000:]}", rc=result.rc, stderr=result.stderr
            )
        if not parsed:
            raise SubmissionOutcomeUnknownError(f"sbatch of {job_name} answered no job id: {result.stdout[-500:]!r}")
        return parsed[0]

    def reconcile_by_name(
        self, job_name: str, *, timeout: float | None = None, interval: float | None = None
    ) -> str | None:
        """Find our job by name: deprecated, goes in the next release; use ``lifecycle.submission.reconcile``.

        Calls it: our job named exactly ``job_name``, looked for on every login host until it appears
        or ``timeout`` seconds pass (``None``: its default), or ``None``.

        :raises AmbiguousSubmissionError: when more than one job has that name.
        :raises JobLookupError: when the last lookup before the deadline failed.
        """
        from airflow_provider_tao_slurm.lifecycle import submission  # the deprecated call only

        _deprecated("SlurmHook.reconcile_by_name", "lifecycle.submission.reconcile")
        return submission.reconcile(self, job_name, self.log, timeout=timeout, interval=interval)

    def find_jobs_by_name(
        self, job_name: str, *, all_hosts: bool = False, since: str = DEFAULT_SACCT_WINDOW
    ) -> list[str]:
        """Ids of OUR jobs whose name is exactly ``job_name`` (live in squeue, or finished in sacct).

        Both queries filter by the connection's user on the server side, and every row's owner is
        checked again: another user's job of the same name is never returned (it is logged).

        :param all_hosts: ask every reachable login host, not only the connected one.
        :raises JobLookupError: when a query failed or no login host answered: that is never
            "no such job".
        """
        user = self.settings.user
        command = commands.jobs_by_name(job_name, user, since)
        answers: list[NameLookup] = []
        if all_hosts:
            unreachable: list[str] = []
            for host in self.settings.hosts:
                try:
                    client = self._client if host == self._host and self._client else self._connect(host)
                except SlurmConnectionError as exc:
                    self.log.warning("job lookup: %s", exc)
                    unreachable.append(str(exc))
                    continue
                try:
                    _rc, out, err = _exec_channel(client, command, None, self.settings.cmd_timeout)
                except SlurmConnectionError as exc:
                    self.log.warning("job lookup on %s: %s", host, exc)
                    unreachable.append(f"{host}: {exc}")
                    continue
                finally:
                    if client is not self._client:
                        client.close()
                answers.append(parse_jobs_by_name(out.decode("utf-8", "replace"), user, redact_text(err.decode())))
            if not answers:
                raise JobLookupError(
                    f"no login host answered the lookup of job {job_name} ({'; '.join(unreachable)}); that is not "
                    "'no such job', so nothing is submitted: retry when a login host is reachable",
                    evidence="; ".join(unreachable),
                )
        else:
            result = self.run(command, what="job lookup by name")
            answers.append(parse_jobs_by_name(result.stdout, user, result.stderr))
        seen: dict[str, None] = {}
        for answer in answers:
            for job_id, owner in answer.foreign:
                self.log.warning(
                    "SLURM job %s is also named %s but belongs to %s, not %s: it is left alone",
                    job_id,
                    job_name,
                    owner,
                    user,
                )
            seen.update(dict.fromkeys(answer.job_ids))
        return list(seen)

    def get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        """States of many jobs in at most two queries: squeue for live jobs, sacct for the rest.

        Past :data:`~airflow_provider_tao_slurm.core.commands.IDS_ON_COMMAND_LINE` ids, squeue asks
        for the connection user's jobs (filtered by the server) instead of listing the ids.

        Jobs neither command knows are absent from the result (the caller's grace window decides);
        a job that a failed query could not speak for is never reported absent.

        :raises StatusQueryError: when squeue or sacct failed and some job was answered by neither
            (``states`` has the answered ones).
        """
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        squeue = self.run(commands.squeue_states(ids, self.settings.user), what="squeue")
        rest = _needs_sacct(ids, squeue)
        sacct = self.run(commands.sacct_states(rest, since), what="sacct") if rest else None
        return _combine_poll(ids, squeue, sacct)

    def describe_job(self, slurm_job_id: str) -> dict[str, str]:
        """Return what slurmctld knows of a job (name, owner, state, log paths); empty once it forgot the job."""
        result = self.run(commands.show_job(slurm_job_id), what="scontrol show job")
        return commands.parse_show_job(result.stdout) if result.rc == 0 else {}

    def cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        """Cancel jobs; unknown or finished jobs are fine. With ``job_name`` only jobs of that name are hit.

        :raises RemoteCommandError: when scancel reports an error (e.g. the controller is down).
        """
        if job_ids:
            _check_scancel(self.run(commands.scancel(job_ids, name=job_name, user=self.settings.user), what="scancel"))

    def hand_off_cancel(
        self, job_ids: Sequence[str], *, job_name: str, within_s: float, every_s: float, log_path: str | None
    ) -> None:
        """Leave a cancel to the login host, which tries scancel again until slurmctld takes it.

        See :func:`~airflow_provider_tao_slurm.core.commands.scancel_handed_off`; the command returns at once.

        :raises RemoteCommandError: (or :class:`SlurmConnectionError`) when the loop could not be started.
        """
        if job_ids:
            command = commands.scancel_handed_off(
                job_ids, name=job_name, user=self.settings.user, within_s=within_s, every_s=every_s, log_path=log_path
            )
            self.run(command, check=True, what="handing scancel to the login host")

    def partition_limits(self, *, fresh: bool = False) -> list[Partition]:
        """Return the cluster's partitions (hidden ones too): ``MaxTime``, default flag, node shape, state and access.

        One ``sinfo -a`` answer is kept for :data:`PARTITION_CACHE_S` seconds on shared storage (under
        ``results_dir``) and serves every worker; ``fresh`` asks sinfo again. A partition whose line
        cannot be read is named in a warning and kept with its ``problem``: only a job that asks for
        it is refused.

        :raises RemoteCommandError: when sinfo failed (e.g. the controller is down).
        """
        return self.partition_limits_and_missing((), fresh=fresh)[0]

    def partition_limits_and_missing(
        self, paths: Sequence[str], *, fresh: bool = False
    ) -> tuple[list[Partition], list[str]]:
        """:meth:`partition_limits` and :meth:`check_paths` in the same round trip: the paths are tested first.

        :param paths: absolute cluster paths that must exist (none: the partitions alone).
        :returns: the partitions, and the paths that do not exist (in order).
        :raises RemoteCommandError: when sinfo failed, or the path check's answer is incomplete.
        """
        base = self.settings.results_dir
        cache = f"{base}/.tao-slurm/{PARTITION_CACHE_NAME}" if base else None
        command = commands.test_paths_then(
            paths, commands.sinfo_partitions_cached(cache, 1 if fresh else PARTITION_CACHE_S, base)
        )
        site_cache = self._site_mounts_cache()
        result = self.run(
            commands.with_site_mounts(command, site_cache) if site_cache else command, what="reading the partitions"
        )
        if result.rc != 0:
            raise RemoteCommandError(
                f"sinfo failed on {result.host} (exit {result.rc}): {result.stderr.strip()[-500:]}; the partition "
                "limits cannot be checked, so nothing is submitted: check that slurmctld is up (scontrol ping)",
                rc=result.rc,
                stderr=result.stderr,
            )
        stdout, site = commands.split_site_mounts(result.stdout)
        if site_cache:
            self._site_mounts = (self._read_site_mounts(site, site_cache),)
        missing, table = commands.split_test_paths(stdout, paths)
        partitions, unreadable = parse_sinfo_partitions(table)
        for partition in partitions:
            if partition.problem is not None:
                self.log.warning(
                    "Partition %s on cluster %s cannot be read (%s); jobs on other partitions are not affected",
                    partition.name,
                    self.settings.cluster_name,
                    partition.problem,
                )
        for line in unreadable:
            self.log.warning("sinfo printed %r, which names no partition; the line is ignored", line)
        return partitions, missing

    def _site_mounts_cache(self) -> str | None:
        """Return the site-mounts cache's path (None without a results directory)."""
        base = self.settings.results_dir
        return f"{base}/.tao-slurm/{SITE_MOUNTS_CACHE_NAME}" if base else None

    def _read_site_mounts(self, text: str | None, path: str) -> SiteMounts | None:
        """Read the cache's text (None or empty: no cache); a cache that cannot be read is named in a warning."""
        if not text:
            return None
        try:
            return SiteMounts.from_json(text)
        except (ValueError, KeyError, TypeError) as exc:
            self.log.warning(
                "The site-mounts cache %s cannot be read (%s); run SlurmPreflightOperator again", path, exc
            )
            return None

    def site_mounts(self) -> SiteMounts | None:
        """Return the site's Enroot mounts as the last preflight cached them; None when none did (or no results_dir).

        The partition read (:meth:`partition_limits`, which every submission makes before sbatch) brings
        the cache back in its own round trip; after it this answers from that read. Otherwise it reads
        the cache in one round trip.

        :raises RemoteCommandError: when the cache could not be read.
        """
        if self._site_mounts is None:
            path = self._site_mounts_cache()
            if path is None:
                return None
            result = self.run(commands.with_site_mounts("true", path), check=True, what="reading the site mounts")
            self._site_mounts = (self._read_site_mounts(commands.split_site_mounts(result.stdout)[1], path),)
        return self._site_mounts[0]

    def write_site_mounts(self, site: SiteMounts) -> str | None:
        """Cache ``site`` for every worker of the cluster under ``<results_dir>/.tao-slurm`` (temp file, then rename).

        :returns: the cache's path, or None without a results directory (nothing is cached).
        :raises RemoteCommandError: (or ``StoragePathError``) when it could not be written.
        """
        path = self._site_mounts_cache()
        if path is not None:
            self.write_file(path, site.to_json().encode())
            self._site_mounts = (site,)
        return path

    def install_enroot_credentials(self, registry: str, password: str, login: str = "$oauthtoken") -> None:
        """Install Enroot credentials for ``registry`` (mode 600) from a secret sent over stdin only."""
        for machine in commands.enroot_credential_machines(registry):
            self.run(
                commands.install_enroot_credentials(machine, login),
                stdin=password.encode(),
                check=True,
                what=f"installing Enroot credentials for {machine}",
            )

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's "Test connection": login, the SLURM tools and the shared directory."""
        try:
            tools = ("sbatch", "squeue", "sacct", "scancel", "srun", "sinfo")
            result = self.run(commands.which(tools), what="tool check")
            missing = commands.parse_which(result.stdout, tools)
            problems = [
                f"{tool} not found on {self._host}; install the SLURM client tools or put them on the PATH of "
                "non-interactive shells"
                for tool in missing
            ]
            results_dir = self.settings.results_dir
            if results_dir:
                probe = self.run(commands.writable_dir(results_dir), what="results dir check")
                if probe.rc != 0:
                    problems.append(
                        f"results_dir {results_dir} is not writable by {self.settings.user} on {self._host}; "
                        "create it or set the results_dir extra to a writable shared directory"
                    )
        except Exception as exc:
            return False, redact_text(str(exc))
        if problems:
            return False, "; ".join(problems)
        where = f"; results_dir {results_dir} is writable" if results_dir else ""
        return True, f"connected to {self._host} as {self.settings.user}; found {', '.join(tools)}{where}"

    # ------------------------------------------------------------------ async twins (triggers)

    async def a_run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        what: str = "command",
    ) -> CommandResult:
        """Async twin of :meth:`run` over the process-wide pooled connection.

        :param check: raise :class:`RemoteCommandError` on a non-zero exit status.
        :param what: a short description used in errors.
        :raises ConnectionLostError: when the connection dropped after the command was sent (it is
            never sent again: it may have taken effect).
        :raises StoragePathError: as :meth:`run`, whatever ``check``.
        """
        rc, out, err, host = await self._a_run_bytes(command, stdin, timeout)
        return _result(rc, out, err, host, check=check, what=what)

    async def _a_run_bytes(
        self, command: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes, str]:
        settings = await self.a_settings()
        return await async_pool().run(settings, command, stdin, settings.cmd_timeout if timeout is None else timeout)

    async def a_settings(self) -> ClusterSettings:
        """Read the settings with the async connection API (safe inside the triggerer's event loop), once.

        The hooks of one event loop that need the same connection while a read of it is in flight share
        that read: a triggerer starting hundreds of triggers at once asks its supervisor a few times, not
        once per trigger (one request at a time, about 10 ms each: the 1000th trigger waited 10 s). A read
        is never reused once it finished, so a hook always sees the connection as it was when it asked
        (an edited host key applies to the next trigger), and a failed read is the failure of its
        awaiters only.

        :raises ConnectionConfigError: as :attr:`settings`.
        """
        if self._explicit_settings is not None:
            return self._explicit_settings
        if self._async_settings is None:
            reads = _READS_IN_FLIGHT.setdefault(asyncio.get_running_loop(), {})
            read = reads.get(self.slurm_conn_id)
            if read is None:
                read = reads[self.slurm_conn_id] = asyncio.ensure_future(self._read_async_settings())
                read.add_done_callback(partial(_read_done, reads, self.slurm_conn_id))
            self._async_settings = await asyncio.shield(read)
        return self._async_settings

    async def _read_async_settings(self) -> ClusterSettings:
        """Read the settings of :attr:`slurm_conn_id` through the async connection API."""
        from airflow.providers.common.compat.connection import get_async_connection, get_async_extra_dejson

        try:
            conn = await get_async_connection(self.slurm_conn_id)
        except AirflowNotFoundException:
            return self._settings_without_connection()
        extra = await get_async_extra_dejson(conn)
        return settings_from_connection(
            host=conn.host,
            login=conn.login,
            port=conn.port,
            extra=extra,
            source=f"connection {self.slurm_conn_id!r}",
        )

    async def a_get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        """Async twin of :meth:`get_states`."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        squeue = await self.a_run(commands.squeue_states(ids, (await self.a_settings()).user))
        rest = _needs_sacct(ids, squeue)
        sacct = await self.a_run(commands.sacct_states(rest, since)) if rest else None
        return _combine_poll(ids, squeue, sacct)

    async def a_accounting_states(
        self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW
    ) -> dict[str, JobState]:
        """Accounting's word on many jobs in one ``sacct`` (slurmdbd; slurmctld is not asked).

        The shared poller confirms end markers with it: the state of a job that accounting shows
        ended is the state the record settles on. Every run of a requeued job is listed (``sacct -D``),
        so each state says which run it is (:attr:`~airflow_provider_tao_slurm.core.states.JobState.run`).

        :raises RemoteCommandError: when sacct failed (e.g. slurmdbd is down).
        """
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        result = await self.a_run(commands.sacct_states(ids, since, every_run=True))
        if result.rc != 0:
            raise RemoteCommandError(
                f"sacct failed on {result.host} (exit {result.rc}): {result.stderr.strip()[-300:]}",
                rc=result.rc,
                stderr=result.stderr,
            )
        states = parse_sacct(result.stdout, count_runs=True)
        return {job_id: state for job_id, state in states.items() if job_id in ids}

    async def a_read_log(self, path: str, offset: int = 0, max_bytes: int = 65536) -> TailChunk[str]:
        """Async twin of :meth:`read_log`."""
        _rc, out, _err, _host = await self._a_run_bytes(commands.tail_bytes(path, offset, max_bytes), None, None)
        return _log_chunk(out, offset)

    async def a_tail_many(self, requests: Sequence[TailRequest]) -> list[TailChunk[bytes]]:
        """Async twin of :meth:`tail_many` (the shared poller reads every watched job's logs with it)."""
        if not requests:
            return []
        script, nonce = tail_script(requests)
        rc, out, err, host = await self._a_run_bytes("sh -s", script.encode(), None)
        return _tail_chunks(rc, out, err, host, len(requests), nonce)

    async def a_end_markers(self, since: Mapping[str, float]) -> list[commands.EndMarker]:
        """Return the end markers in each ends directory modified after ``since[directory]``, in one command.

        :raises RemoteCommandError: when the listing failed (the poller tries again at its next read).
        """
        if not since:
            return []
        result = await self.a_run(commands.end_markers(since))
        if result.rc != 0:
            raise RemoteCommandError(
                f"listing the end markers failed on {result.host} (exit {result.rc}): {result.stderr.strip()[-300:]}",
                rc=result.rc,
                stderr=result.stderr,
            )
        return commands.parse_end_markers(result.stdout, list(since))

    async def a_cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:
        """Async twin of :meth:`cancel`."""
        if job_ids:
            user = (await self.a_settings()).user
            _check_scancel(await self.a_run(commands.scancel(job_ids, name=job_name, user=user)))

    async def a_hand_off_cancel(
        self, job_ids: Sequence[str], *, job_name: str, within_s: float, every_s: float, log_path: str | None
    ) -> None:
        """Async twin of :meth:`hand_off_cancel`."""
        if job_ids:
            user = (await self.a_settings()).user
            command = commands.scancel_handed_off(
                job_ids, name=job_name, user=user, within_s=within_s, every_s=every_s, log_path=log_path
            )
            await self.a_run(command, check=True, what="handing scancel to the login host")

    async def a_read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """Async twin of :meth:`read_file`: None only when the file does not exist.

        :raises RemoteReadError: when the read failed otherwise.
        """
        return _file_text(await self.a_run(commands.read_file(path, max_bytes)), path)

    async def a_write_file(self, path: str, data: bytes, mode: str = "600") -> None:
        """Async twin of :meth:`write_file` (content over stdin).

        :raises RemoteCommandError: when the write failed.
        """
        base = commands.trusted_base(path, (await self.a_settings()).results_dir)
        await self.a_run(
            commands.write_file_from_stdin(path, mode, base), stdin=data, check=True, what=f"writing {path}"
        )


def _deprecated(old: str, new: str) -> None:
    """Warn that ``old`` (a name of the previous release) goes in the next release; ``new`` replaces it."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use airflow_provider_tao_slurm.{new}",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )
