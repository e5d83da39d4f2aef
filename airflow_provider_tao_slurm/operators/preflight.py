"""``SlurmPreflightOperator``: check everything a GPU training run needs from the cluster, before the GPU.

Each check is one round trip over the hook's single SSH connection. Every problem found is
collected with its fix; the task fails once, listing all of them (:class:`PreflightError`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_provider_tao_slurm.core.defaults import CONVERSION_TIME_HOURS, PYXIS_SRUN_OPTIONS
from airflow_provider_tao_slurm.lifecycle.support import (
    NGC_LOGIN,
    install_registry_credentials,
    registry_credentials_from_connection,
    sqsh_problem,
    utc_now,
)
from airflow_provider_tao_slurm.operators.base import SlurmBaseOperator

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.commands import NodeProbe
    from airflow_provider_tao_slurm.core.images import ImageRef
    from airflow_provider_tao_slurm.hooks.replies import CommandResult

#: The SLURM commands the provider runs on the login host.
SLURM_TOOLS = ("sbatch", "squeue", "sacct", "scancel", "srun")
#: Registries that always need Enroot credentials (NGC refuses anonymous pulls of most images).
CREDENTIAL_REGISTRIES = frozenset({"nvcr.io"})

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SlurmPreflightOperator(SlurmBaseOperator):
    """Check that the cluster is ready for this provider; fail listing every problem with its fix.

    Checks, in order: key-only login; ``sbatch``, ``squeue``, ``sacct``, ``scancel`` and ``srun`` on the
    login host; the Pyxis options of ``srun`` (from ``srun --help``, which lists the options SPANK
    plugins register); ``enroot version`` in a one-minute step on the conversion partition; the
    results directory is writable; the partitions exist (``sinfo``); the account is usable by the user
    (``sacctmgr``); what a preempted training can rely on (``scontrol show config``: whether preemption sends
    the batch shell its ``--signal`` warning, ``send_user_signal``; never a failure, and the answer refreshes
    the cache the submissions read); Enroot credentials for ``image``'s registry when it needs them
    (installed first from ``registry_conn_id`` or ``registry_secret_env`` when given).

    ``slurm_conn_id`` (the ``tao_slurm`` connection, default ``slurm_default``) and the ``BaseOperator``
    arguments (``task_id``, ``retries``, ...) are passed on through ``**kwargs``.

    :param partitions: GPU partitions to check (default: the connection's); templated.
    :param conversion_partition: the CPU partition for image conversion (default: the connection's); templated.
    :param account: the SLURM account (default: the connection's; none means the user's default); templated.
    :param results_dir: the shared results directory (default: the connection's); templated.
    :param image: the image the pipeline will use; its registry decides whether credentials are checked, and
        they are needed only while the image has no converted copy in ``containers_dir`` (then missing ones
        read "not needed now" with a warning); templated.
    :param containers_dir: the image cache directory, as ``EnrootImportOperator``'s (default
        ``<results_dir>/containers``); templated.
    :param registry_conn_id: Airflow connection whose password is the registry key (login defaults to
        ``$oauthtoken``); the credentials are installed on the cluster before they are checked.
    :param registry_secret_env: name of a worker environment variable holding the registry key (login
        ``$oauthtoken``), as an alternative to ``registry_conn_id``.
    :param pyxis_options: the ``srun`` options Pyxis must provide.
    :param check_enroot: run the ``enroot version`` step on the conversion partition.
    :param check_gpu_node: run one short CPU-only step on a node of the (first) GPU partition: Pyxis
        in that node's SPANK plugin configuration, Enroot there, ``results_dir`` writable and
        ``dataset_paths`` readable from that node. The step also reads the site's own Enroot mounts there
        (``$ENROOT_SYSCONF_PATH/mounts.d/*.fstab``, default ``/etc/enroot/mounts.d``: what every container
        gets), says which it found, and caches them for the cluster under the connection's ``results_dir``
        (``.tao-slurm/site-mounts.json``): ``SbatchSubmitOperator`` counts them when it checks that a job's
        container sees its files. Run the preflight again after the site changes them.
    :param dataset_paths: dataset roots the jobs read (absolute, ``lustre:///`` or ``slurm://``); templated.
    :param enroot_wait_seconds: how long each of those steps may wait for a free node; a step that finds none
        (a busy partition) or that the site refuses to start (e.g. a job_submit rule requiring a GPU there)
        saw nothing: its check reads "not verified (why)" with a warning, and only what a step saw fails.
    :rtype: dict[str, Any]
    :returns: a report: ``cluster``, ``login_host``, ``user`` and ``checks`` (check name to what was found).
    :raises PreflightError: listing every problem and its fix (``.problems``).
    """

    template_fields = (
        "partitions",
        "conversion_partition",
        "account",
        "results_dir",
        "image",
        "dataset_paths",
        "containers_dir",
    )

    def __init__(
        self,
        *,
        partitions: str | Sequence[str] | None = None,
        conversion_partition: str | None = None,
        account: str | None = None,
        results_dir: str | None = None,
        image: str | None = None,
        registry_conn_id: str | None = None,
        registry_secret_env: str | None = None,
        pyxis_options: Sequence[str] = PYXIS_SRUN_OPTIONS,
        check_enroot: bool = True,
        check_gpu_node: bool = True,
        dataset_paths: Sequence[str] | None = None,
        enroot_wait_seconds: int = 60,
        containers_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.partitions = partitions
        self.conversion_partition = conversion_partition
        self.account = account
        self.results_dir = results_dir
        self.image = image
        self.registry_conn_id = registry_conn_id
        self.registry_secret_env = registry_secret_env
        self.pyxis_options = pyxis_options
        self.check_enroot = check_enroot
        self.check_gpu_node = check_gpu_node
        self.dataset_paths = dataset_paths
        self.enroot_wait_seconds = enroot_wait_seconds
        self.containers_dir = containers_dir

    def execute(self, context: Any) -> dict[str, Any]:
        """Run every check; return the report or raise :class:`PreflightError` listing all problems."""
        from airflow_provider_tao_slurm.core import commands
        from airflow_provider_tao_slurm.core.resources import parse_partitions
        from airflow_provider_tao_slurm.exceptions import KeyFilePermissionError, SlurmConnectionError

        image, datasets = self._validate()
        settings = self.hook.settings
        partitions = parse_partitions(self.partitions or settings.partitions)
        conversion = parse_partitions(self.conversion_partition or settings.conversion_partition)
        resolved: dict[str, str] = {}
        account = self.account or settings.account
        account_check = None if account is None else commands.sacctmgr_assoc(settings.user, account)
        results_dir = self.results_dir or settings.results_dir
        found = _Findings(settings.cluster_name)
        try:
            self.hook.get_conn()
        except (SlurmConnectionError, KeyFilePermissionError) as exc:
            found.problems.append(
                f"login: {exc} (fix the connection {self.slurm_conn_id!r}: host, port, login, key_file, host_key); "
                "the other checks need a login and were skipped"
            )
            found.fail()
        found.checks["login"] = f"ok: {settings.user}@{self.hook.active_host} with a key, no password"
        tools_ok = found.run("tools", self._tools)
        if tools_ok:
            found.run("pyxis", self._pyxis)
        found.run("results_dir", lambda: self._results_dir(results_dir))
        found.run("partitions", lambda: self._partitions(partitions, conversion, resolved))
        account_ok = found.run("account", lambda: self._account(account, account_check))
        if tools_ok:
            found.run("preemption", self._preemption)
        # An explicit conversion partition is tried even when sinfo does not list it: every problem at once.
        conversion_name = resolved.get("conversion") or (conversion[0] if conversion else None)
        if self.check_enroot and tools_ok and conversion_name is not None:
            found.run("enroot", lambda: self._enroot(conversion_name, account if account_ok else None))
        gpu_name = resolved.get("gpu")  # the partitions check found it
        if self.check_gpu_node and tools_ok and gpu_name is not None and results_dir:
            found.run(
                "gpu_node", lambda: self._gpu_node(gpu_name, account if account_ok else None, results_dir, datasets)
            )
        if image is not None:
            found.run("credentials", lambda: self._credentials(image, results_dir))
        if found.problems:
            found.fail()
        report = {
            "cluster": settings.cluster_name,
            "login_host": self.hook.active_host,
            "user": settings.user,
            "checks": found.checks,
        }
        self.log.info("Preflight passed on cluster %s: %s", settings.cluster_name, found.checks)
        return report

    # ------------------------------------------------------------------ validation (no SSH)

    def _validate(self) -> tuple[ImageRef | None, list[str]]:
        """Check every explicit input before the hook is created; returns the parsed image and dataset paths."""
        from airflow_provider_tao_slurm.core import commands
        from airflow_provider_tao_slurm.core.images import parse_image
        from airflow_provider_tao_slurm.core.resources import parse_partitions
        from airflow_provider_tao_slurm.core.storage import display_value, resolve_cluster_path, resolve_paths
        from airflow_provider_tao_slurm.exceptions import ValidationError

        if self.partitions:
            parse_partitions(self.partitions)
        if self.conversion_partition is not None:
            parse_partitions([self.conversion_partition])
        if self.results_dir is not None:
            resolve_cluster_path(self.results_dir, param="results_dir")
        if self.containers_dir is not None:
            resolve_cluster_path(self.containers_dir, param="containers_dir")
        commands.missing_srun_options("", self.pyxis_options)
        for flag in ("check_enroot", "check_gpu_node"):
            if not isinstance(getattr(self, flag), bool):
                raise ValidationError(f"{flag}={display_value(getattr(self, flag))} must be True or False")
        resolved = [] if self.dataset_paths is None else resolve_paths(self.dataset_paths, param="dataset_paths")
        datasets = list(resolved.values()) if isinstance(resolved, dict) else resolved
        commands.srun_probe("any", ["enroot", "version"], account=self.account, wait_seconds=self.enroot_wait_seconds)
        if self.registry_conn_id is not None and self.registry_secret_env is not None:
            raise ValidationError("give registry_conn_id or registry_secret_env, not both")
        if self.registry_secret_env is not None and not _ENV_NAME_RE.fullmatch(str(self.registry_secret_env)):
            raise ValidationError(
                f"registry_secret_env={display_value(self.registry_secret_env)} is not an environment variable name"
            )
        return (None if self.image is None else parse_image(self.image)), datasets

    # ------------------------------------------------------------------ checks: (ok, what was found or the problem)

    def _tools(self) -> tuple[bool, str]:
        from airflow_provider_tao_slurm.core import commands

        result = self.hook.run(commands.which(SLURM_TOOLS), what="tool check")
        missing = commands.parse_which(result.stdout, SLURM_TOOLS)
        if missing:
            return False, (
                f"{', '.join(missing)} not found on the login host {self.hook.active_host}; install the SLURM client "
                "tools there or add their directory to PATH for non-interactive SSH logins"
            )
        return True, "ok: " + " ".join(SLURM_TOOLS)

    def _pyxis(self) -> tuple[bool, str]:
        from airflow_provider_tao_slurm.core import commands

        result = self.hook.run(commands.srun_help(), what="srun --help")
        missing = commands.missing_srun_options(result.stdout, self.pyxis_options)
        if missing:
            return False, (
                f"srun does not offer {', '.join(missing)}, so Pyxis is missing or too old; install the Pyxis SPANK "
                "plugin (https://github.com/NVIDIA/pyxis) on the login and compute nodes and list it in plugstack.conf"
            )
        return True, "ok: srun offers " + " ".join(self.pyxis_options)

    def _results_dir(self, results_dir: str | None) -> tuple[bool, str]:
        from airflow_provider_tao_slurm.core import commands
        from airflow_provider_tao_slurm.core.storage import resolve_cluster_path

        if not results_dir:
            return False, "none is set; set results_dir on the connection (a shared directory, e.g. /lustre/<user>)"
        path = resolve_cluster_path(results_dir, param="results_dir")
        if self.hook.run(commands.writable_dir(path), what="results dir check").rc != 0:
            user = self.hook.settings.user
            return False, (
                f"{path} is not a directory that {user} can write; create it (mkdir -p {path}) and make it writable "
                f"for {user}, or point results_dir at such a directory"
            )
        return True, f"ok: {path} is writable"

    def _partitions(
        self, gpu: tuple[str, ...], conversion: tuple[str, ...], resolved: dict[str, str]
    ) -> tuple[bool, str]:
        """Check the GPU partitions exist with GPUs, and the conversion partition (chosen without GPUs if unset)."""
        from airflow_provider_tao_slurm.core.partitions import choose_partitions, resolve_partitions
        from airflow_provider_tao_slurm.exceptions import ResourceError

        known = self.hook.partition_limits(fresh=True)
        cluster = self.hook.settings.cluster_name
        try:
            gpu_names = resolve_partitions(gpu, known, cluster)
            conversion_names = choose_partitions(conversion, known, cluster, CONVERSION_TIME_HOURS, cpu_only=True)
        except ResourceError as exc:
            return False, f"{exc}; fix partition / conversion_partition on the connection or the operator"
        resolved["conversion"] = conversion_names[0]
        resolved["gpu"] = gpu_names[0]
        by_name = {p.name: p for p in known}
        without = [name for name in gpu_names if not by_name[name].has_gpus]
        if without:
            return False, (
                f"partition {', '.join(without)} has no GPUs (sinfo shows no gpu GRES on its nodes); set partition on "
                "the connection or the operator to a GPU partition: "
                + ("; ".join(p.describe() for p in known if p.has_gpus) or "none visible")
            )

        def shown(names: tuple[str, ...], given: tuple[str, ...], default: str) -> str:
            text = ", ".join(by_name[name].describe() for name in names)
            return text if given else f"{text}, {default}"

        gpu_text = shown(gpu_names, gpu, "the cluster's default")
        conversion_text = shown(conversion_names, conversion, "chosen as a partition without GPUs")
        if any(by_name[name].has_gpus for name in conversion_names):
            self.log.warning(
                "The conversion partition %s has GPU nodes: image conversion holds one of them for minutes without "
                "using its GPUs; prefer a CPU partition for conversion_partition",
                ", ".join(conversion_names),
            )
        return True, (f"ok: GPU jobs on {gpu_text}; conversion on {conversion_text}")

    def _account(self, account: str | None, command: str | None) -> tuple[bool, str]:
        from airflow_provider_tao_slurm.core import commands

        if account is None or command is None:
            return True, "ok: none set, jobs use the user's default account"
        result = self.hook.run(command, what="sacctmgr")
        if result.rc != 0:
            text = f"not verified: sacctmgr failed ({result.stderr.strip()[-200:]})"
            self.log.warning("Preflight on cluster %s: account %s %s", self.hook.settings.cluster_name, account, text)
            return True, text
        user = self.hook.settings.user
        if not commands.parse_sacctmgr_assoc(result.stdout):
            return False, (
                f"user {user} has no association with account {account} (sacctmgr lists none), so sbatch would "
                "refuse the jobs; fix account on the connection or the operator, or ask the cluster admins to add it"
            )
        return True, f"ok: {user} may charge {account}"

    def _preemption(self) -> tuple[bool, str]:
        """Say what a preempted training can rely on (never a failure): whether preemption warns the batch shell."""
        from airflow_provider_tao_slurm.core import commands
        from airflow_provider_tao_slurm.core.preemption import parse_preemption
        from airflow_provider_tao_slurm.exceptions import RemoteCommandError

        cluster = self.hook.settings.cluster_name
        result = self.hook.run(commands.site_config(0), what="scontrol show config")
        try:
            site = parse_preemption(result.stdout)
        except RemoteCommandError:
            text = f"not verified: scontrol show config printed no preemption settings (exit status {result.rc})"
            self.log.warning("Preflight on cluster %s: preemption %s", cluster, text)
            return True, text
        if site.preempts and not site.warns_batch_shell:
            self.log.warning("Preflight on cluster %s: %s", cluster, site.describe())
        return True, f"ok: {site.describe()}"

    def _enroot(self, partition: str, account: str | None) -> tuple[bool, str]:
        from airflow_provider_tao_slurm.core import commands

        wait = self.enroot_wait_seconds
        command = commands.srun_probe(partition, ["enroot", "version"], account=account, wait_seconds=wait)
        result = self.hook.run(command, what="enroot check", timeout=wait + 120)
        if not commands.step_started(result.stdout):
            return self._not_verified("enroot", partition, result)
        lines = result.stdout.strip().splitlines()[1:]
        if result.rc != 0 or not lines:
            return False, (
                f"`enroot version` did not run on partition {partition} (exit status {result.rc}: "
                f"{result.stderr.strip()[-500:]}); install Enroot on its nodes, or set conversion_partition to a CPU "
                "partition whose nodes have it"
            )
        return True, f"ok: enroot {lines[-1]} on partition {partition}"

    def _not_verified(self, check: str, partition: str, result: CommandResult) -> tuple[bool, str]:
        """Report a step that never started on ``partition`` (it saw nothing) as a warning, not a failure."""
        reason = result.stderr.strip().splitlines()[-1:] or [f"srun exited {result.rc} and printed nothing"]
        text = (
            f"not verified: the one-minute CPU step found no free node on partition {partition} within "
            f"{self.enroot_wait_seconds} s or was refused there ({reason[0][-300:]}); a busy partition is normal: run "
            "the preflight again when a node is free, or raise enroot_wait_seconds"
        )
        self.log.warning("Preflight on cluster %s: %s %s", self.hook.settings.cluster_name, check, text)
        return True, text

    def _gpu_node(self, partition: str, account: str | None, results_dir: str, datasets: list[str]) -> tuple[bool, str]:
        """Check what a GPU job needs on a node of its partition (the login host's view is not the node's)."""
        from airflow_provider_tao_slurm.core import commands
        from airflow_provider_tao_slurm.core.storage import resolve_cluster_path

        results = [resolve_cluster_path(results_dir, param="results_dir")]
        wait = self.enroot_wait_seconds
        command = commands.node_probe(partition, results, datasets, account=account, wait_seconds=wait)
        result = self.hook.run(command, what="GPU node check", timeout=wait + 120)
        if not commands.step_started(result.stdout):
            return self._not_verified("gpu_node", partition, result)
        probe = commands.parse_node_probe(result.stdout, results, datasets)
        where = f"on node {probe.node} of partition {partition}"
        problems = []
        if not probe.pyxis:
            problems.append(
                f"Pyxis is not in the SPANK plugin configuration {where} ({probe.plugstack} and the files it "
                "includes), though the login host's srun offers its options: a GPU job there would run its command "
                "outside the container; ask the cluster admins to install Pyxis on the GPU nodes"
            )
        if probe.enroot is None:
            problems.append(f"enroot is not installed {where} (Pyxis needs it); ask the cluster admins to install it")
        problems += [
            f"{path} is not a writable directory {where} (shared storage not mounted there?); fix results_dir"
            for path in probe.unwritable
        ]
        problems += [
            f"{path} cannot be read {where} (shared storage not mounted there?); fix dataset_paths or the mounts"
            for path in probe.unreadable
        ]
        site = self._site_mounts(probe)
        if problems:
            return False, "; ".join(problems)
        seen = ", ".join([f"{results[0]} writable", *(f"{path} readable" for path in datasets)])
        return True, f"ok: {where}: Pyxis configured, enroot {probe.enroot}, {seen}; {site}"

    def _site_mounts(self, probe: NodeProbe) -> str:
        """Cache the site's Enroot mounts the node probe read; say which were found and where they are cached.

        A cache that cannot be written is a warning, not a problem: the submissions then count no site
        mounts and say so when they refuse a job.
        """
        from airflow_provider_tao_slurm.core.mounts import SiteMounts
        from airflow_provider_tao_slurm.exceptions import ConnectionLostError, TaoSlurmError

        site = SiteMounts(probe.site_mounts, utc_now(), probe.node, probe.mounts_dir)
        found = f"site mounts from {probe.mounts_dir or 'mounts.d'}: {site.describe()}"
        try:
            path = self.hook.write_site_mounts(site)
        except ConnectionLostError:
            raise
        except TaoSlurmError as exc:
            text = f"{found} (not cached: {exc}; submissions count no site mounts until a preflight caches them)"
            self.log.warning("Preflight on cluster %s: %s", self.hook.settings.cluster_name, text)
            return text
        if path is None:
            return f"{found} (not cached: the connection has no results_dir)"
        return f"{found} (cached in {path})"

    def _credentials(self, image: ImageRef, results_dir: str | None) -> tuple[bool, str]:
        """Registry credentials are needed only to convert ``image``: none while its converted copy is there."""
        from airflow_provider_tao_slurm.core import commands
        from airflow_provider_tao_slurm.core.images import registry_host

        host = registry_host(image)
        secret = self._registry_secret()
        if host is None or (host not in CREDENTIAL_REGISTRIES and secret is None):
            return True, "ok: not needed for this image"
        if secret is not None:
            install_registry_credentials(self.hook, image, *secret)
        machines = list(commands.enroot_credential_machines(host))
        result = self.hook.run(commands.enroot_credentials_present(machines), what="credentials check")
        missing = commands.parse_enroot_credentials_present(result.stdout, machines)
        if not missing:
            return True, f"ok: present for {', '.join(machines)}" + (" (installed now)" if secret else "")
        fix = (
            "pass registry_conn_id (a connection with the registry key as password) or registry_secret_env to install "
            f"them, or add lines like 'machine {missing[0]} login $oauthtoken password <key>' (mode 600) yourself"
        )
        converted = self._converted_copy(image, results_dir)
        if converted is None:
            cache = self._containers_dir(results_dir) or "the containers directory"
            return False, (
                f"no Enroot credentials for {', '.join(missing)} in ~/.config/enroot/.credentials, and the image "
                f"must be converted (no usable copy in {cache}); {fix}"
            )
        text = (
            f"ok: not needed now: {image.raw} is converted already ({converted}); credentials for "
            f"{', '.join(missing)} are needed only to convert it again: {fix}"
        )
        self.log.warning("Preflight on cluster %s: credentials %s", self.hook.settings.cluster_name, text)
        return True, text

    def _containers_dir(self, results_dir: str | None) -> str | None:
        """Return the image cache directory as ``EnrootImportOperator`` uses it (None without a results directory)."""
        from airflow_provider_tao_slurm.core.storage import resolve_cluster_path

        given = self.containers_dir or (f"{results_dir}/containers" if results_dir else None)
        return None if given is None else resolve_cluster_path(given, param="containers_dir")

    def _converted_copy(self, image: ImageRef, results_dir: str | None) -> str | None:
        """Return the path of ``image``'s usable converted copy in the image cache (None: it must be converted)."""
        from airflow_provider_tao_slurm.core.images import sqsh_cache_path

        containers = self._containers_dir(results_dir)
        if containers is None:
            return None
        path = sqsh_cache_path(image, containers)
        return path if sqsh_problem(self.hook, path) is None else None

    def _registry_secret(self) -> tuple[str, str] | None:
        """``(login, key)`` from ``registry_conn_id`` or ``registry_secret_env``; None when neither is given."""
        from airflow_provider_tao_slurm.exceptions import ConnectionConfigError

        if self.registry_conn_id is not None:
            return registry_credentials_from_connection(self.registry_conn_id)
        if self.registry_secret_env is None:
            return None
        from airflow.sdk.log import mask_secret

        value = os.environ.get(self.registry_secret_env)
        if not value:
            raise ConnectionConfigError(
                f"environment variable {self.registry_secret_env} is not set on the worker; export the registry key "
                "in it, or use registry_conn_id"
            )
        mask_secret(value)
        return NGC_LOGIN, value


class _Findings:
    """What the checks found: a line per passed check, and every problem with its fix.

    A plain class, not a dataclass: building a dataclass costs every DAG parse about a millisecond.
    """

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.checks: dict[str, str] = {}
        self.problems: list[str] = []

    def run(self, name: str, check: Callable[[], tuple[bool, str]]) -> bool:
        """Run one check and record its outcome; a lost connection ends the preflight."""
        from airflow_provider_tao_slurm.exceptions import ConnectionLostError, TaoSlurmError

        try:
            ok, text = check()
        except ConnectionLostError:
            raise
        except TaoSlurmError as exc:
            ok, text = (
                False,
                f"the check could not run ({exc}); run the preflight again, and check the login host if it repeats",
            )
        self.checks[name] = text if ok else "FAILED"
        if not ok:
            self.problems.append(f"{name}: {text}")
        return ok

    def fail(self) -> NoReturn:
        """Raise :class:`PreflightError` listing every problem."""
        from airflow_provider_tao_slurm.exceptions import PreflightError

        listing = "\n".join(f"- {problem}" for problem in self.problems)
        raise PreflightError(
            f"preflight found {len(self.problems)} problem(s) on cluster {self.cluster!r}:\n{listing}", self.problems
        )
