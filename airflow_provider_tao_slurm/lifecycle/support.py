"""Airflow-side helpers shared by the operators and the sensor.

The lazily created hook, secret references, registry credentials, time, script lint.

One module, so that no operator or sensor imports another one for a helper. Operator modules
import it at DAG parse time, so it imports the hook and the domain modules only inside the
helpers that run with a task.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk.configuration import conf

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.images import ImageRef
    from airflow_provider_tao_slurm.core.partitions import Partition
    from airflow_provider_tao_slurm.core.resources import Resources
    from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

SECRET_SOURCES = ("env", "conn", "var")
#: How :func:`sqsh_problem` describes a file that is not there.
MISSING_IMAGE = "the file does not exist"
#: The registry login NGC expects with an API key as the password.
NGC_LOGIN = "$oauthtoken"


class SlurmHookMixin:
    """Gives an operator or sensor a :attr:`hook` built from ``self.slurm_conn_id`` on first use."""

    slurm_conn_id: str

    @cached_property
    def hook(self) -> SlurmHook:
        """The hook, created on first use (never at DAG parse time)."""
        from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

        return SlurmHook(self.slurm_conn_id)


class SerializeParamsOnceMixin:
    """Leaves ``params`` out of Airflow's generic field loop when a task is serialised.

    Airflow 3.3's ``OperatorSerialization`` walks every serialised field of a task: for ``params`` it
    compares the ``ParamsDict`` with the client default and then stringifies it, and each of the two
    validates every Param against its JSON Schema. It then throws that string away and writes
    ``params`` again with ``_serialize_params_dict``. A DAG file whose typed Params every task carries
    pays for that on every parse, for nothing. Without ``params`` in the loop the serialised DAG is the
    same, byte for byte, and Param validation at parse time runs once per DAG, not twice per task.
    """

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """Airflow's serialised fields of the class, without ``params`` (serialised separately)."""
        return frozenset(super().get_serialized_fields() - {"params"})  # type: ignore[misc]


def default_deferrable() -> bool:
    """Airflow's ``[operators] default_deferrable`` (False unless set), read as the official providers do."""
    return conf.getboolean("operators", "default_deferrable", fallback=False)


def renamed_parameter(kwargs: dict[str, Any], old: str, new: str, value: Any, default: Any) -> Any:
    """Accept a parameter's deprecated old name for one more release.

    :param kwargs: the operator's remaining keyword arguments; the old name is taken out of them.
    :param old: the deprecated name, e.g. ``nodes``.
    :param new: the name to use instead, e.g. ``num_nodes``.
    :param value: the value of the new name (its default when not given).
    :param default: the new name's default.
    :returns: the old name's value (with an ``AirflowProviderDeprecationWarning``) when given, else ``value``.
    :raises ValidationError: when both names were given.
    """
    if old not in kwargs:
        return value
    if value != default:
        from airflow_provider_tao_slurm.exceptions import ValidationError

        raise ValidationError(f"{old} and {new} were both given; {old} is the old name of {new}: give only {new}")
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )
    return kwargs.pop(old)


def renamed_attribute(new: str) -> property:
    """Return the attribute under a parameter's deprecated old name, read-only, for as long as the old name is accepted.

    :param new: the parameter's (and attribute's) new name, e.g. ``poll_interval_seconds``.
    :returns: a property reading ``new``.
    """
    return property(lambda self: getattr(self, new), doc=f"The old name of ``{new}`` (read-only).")


def check_flag(name: str, value: object) -> bool:
    """Check an operator's ``True``/``False`` parameter (``deferrable``, ``force_*``).

    :raises ValidationError: naming the parameter and the value.
    """
    if not isinstance(value, bool):
        from airflow_provider_tao_slurm.core.storage import display_value
        from airflow_provider_tao_slurm.exceptions import ValidationError

        raise ValidationError(f"{name}={display_value(value)} must be True or False")
    return value


def check_poll_interval_seconds(value: object) -> float:
    """``poll_interval_seconds``: the seconds between status polls of an operator that waits for its job.

    :returns: the interval as a float.
    :raises ValidationError: for anything but a number of seconds in (0, 3600].
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        from airflow_provider_tao_slurm.core.storage import display_value
        from airflow_provider_tao_slurm.exceptions import ValidationError

        raise ValidationError(f"poll_interval_seconds={display_value(value)} must be a number of seconds in (0, 3600]")
    return float(value)


def utc_now() -> str:
    """Now as the ISO-8601 UTC text records use."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_secret(name: str, source: str) -> str:
    """Resolve one ``secret_env`` value at run time and register it with Airflow's log masker.

    ``env:VAR`` reads the worker's environment, ``conn:ID`` a connection's password,
    ``var:KEY`` an Airflow Variable. A literal value is refused: every secret is a reference.

    :raises ValidationError: for a literal value, or a reference that does not resolve.
    """
    from airflow.sdk.log import mask_secret

    from airflow_provider_tao_slurm.exceptions import ValidationError

    kind, _, ref = source.partition(":")
    if kind not in SECRET_SOURCES or not ref:
        raise ValidationError(
            f"secret_env[{name!r}] is not a reference; give 'env:VAR', 'conn:ID' or 'var:KEY' (never the value)"
        )
    if kind == "env":
        if ref not in os.environ:
            raise ValidationError(f"secret_env[{name!r}] reads ${ref}, which is not set on the worker")
        value = os.environ[ref]
    elif kind == "conn":
        from airflow.sdk import BaseHook

        value = BaseHook.get_connection(ref).password or ""
        if not value:
            raise ValidationError(f"secret_env[{name!r}]: connection {ref!r} has no password; set it")
    else:
        from airflow.sdk import Variable

        value = Variable.get(ref)
    if not value:
        raise ValidationError(f"secret_env[{name!r}] is empty; give a value or an env:/conn:/var: reference")
    mask_secret(value)
    return value


def resolve_secrets(refs: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """Resolve a job's ``secret_env`` references (:func:`resolve_secret`) to redact its logs.

    A reference that does not resolve here (an ``env:`` variable this process lacks, a connection
    it cannot read) is named, never guessed: the caller withholds the job's lines rather than
    show them with pattern redaction alone.

    :param refs: the job handle's ``secret_refs``.
    :returns: the values resolved, and for each reference that failed, its name and the type of
        its error (never a value).
    """
    values: list[str] = []
    failed: dict[str, str] = {}
    for name, source in refs.items():
        try:
            values.append(resolve_secret(name, source))
        except Exception as exc:  # any failure leaves the secret unknown: the caller withholds the lines
            failed[name] = type(exc).__name__
    return values, failed


def secret_references(secret_env: Mapping[str, str]) -> dict[str, str]:
    """Return the ``env:``/``conn:``/``var:`` references of ``secret_env`` (never literal values).

    They travel in the job handle so the sensor can resolve the same secrets and redact them from
    the log tails it shows.
    """
    return {name: source for name, source in secret_env.items() if source.partition(":")[0] in SECRET_SOURCES}


def lint_bash(script: str) -> None:
    """``bash -n`` on the rendered script, locally, before anything is staged.

    The script is bash's stdin as a file, not a pipe: from a pipe bash reads one byte per ``read``
    (so as not to read past a command it runs), about 6000 system calls for a job script.

    :raises TemplateRenderError: with bash's message when the script does not parse.
    """
    import tempfile

    from airflow_provider_tao_slurm.exceptions import TemplateRenderError

    with tempfile.TemporaryFile("w+") as stdin:
        stdin.write(script)
        stdin.seek(0)
        result = subprocess.run(["bash", "-n"], stdin=stdin, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise TemplateRenderError(f"the rendered sbatch script does not parse (bash -n): {result.stderr.strip()}")


def registry_credentials_from_connection(conn_id: str) -> tuple[str, str]:
    """Read a registry login and key from an Airflow connection (password field) and mask the key in logs.

    :param conn_id: the connection; its login defaults to ``$oauthtoken`` (NGC).
    :returns: ``(login, password)``.
    :raises ConnectionConfigError: when the connection has no password.
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.log import mask_secret

    from airflow_provider_tao_slurm.exceptions import ConnectionConfigError

    conn = BaseHook.get_connection(conn_id)
    if not conn.password:
        raise ConnectionConfigError(
            f"registry connection {conn_id!r} has no password; put the registry key (for nvcr.io: the NGC API "
            "key) in its password field"
        )
    mask_secret(conn.password)
    return conn.login or NGC_LOGIN, conn.password


def install_registry_credentials(hook: SlurmHook, image: ImageRef, login: str, password: str) -> list[str]:
    """Install Enroot credentials for ``image``'s registry on the cluster (the key travels over stdin only).

    :returns: the credentials-file machines written (both NGC hosts for nvcr.io); empty for a ``.sqsh`` image.
    :raises ValidationError: for a login or key that cannot go in the credentials file (the key is not shown).
    """
    from airflow_provider_tao_slurm.core import commands
    from airflow_provider_tao_slurm.core.images import registry_host

    host = registry_host(image)
    if host is None:
        return []
    commands.credentials_line(host, login, password)
    hook.install_enroot_credentials(host, password, login)
    return list(commands.enroot_credential_machines(host))


def sqsh_problem(hook: SlurmHook, path: str) -> str | None:
    """Why ``path`` on the cluster is not a usable squashfs image (:data:`MISSING_IMAGE` when absent), or None.

    :raises RemoteCommandError: when the file could not be checked.
    """
    from airflow_provider_tao_slurm.core import commands
    from airflow_provider_tao_slurm.core.images import check_sqsh_header

    found = commands.parse_sqsh_check(hook.run(commands.sqsh_check(path), check=True, what="image check").stdout)
    if found is None:
        return MISSING_IMAGE
    size, magic = found
    return check_sqsh_header(bytes.fromhex(magic), size)


def _chosen_partitions(
    hook: SlurmHook,
    requested: object,
    time_hours: float,
    param: str,
    cpu_only: bool,
    datasets: Sequence[tuple[str, str]] = (),
    continued: bool = False,
) -> tuple[tuple[str, ...], list[Partition]]:
    from airflow_provider_tao_slurm.core.partitions import (
        check_partition_limits,
        choose_partitions,
        skipped_cpu_partitions,
        unavailable,
    )
    from airflow_provider_tao_slurm.core.resources import parse_partitions
    from airflow_provider_tao_slurm.core.storage import missing_paths_error

    wanted = parse_partitions(requested)  # type: ignore[arg-type]
    known, missing = hook.partition_limits_and_missing(list(dict.fromkeys(path for _, path in datasets)))
    if missing:
        raise missing_paths_error(
            datasets,
            missing,
            hook.settings.cluster_name,
            outcome=", so nothing was staged or submitted",
            fix="correct them in the spec's dataset section",
        )
    if any(name not in {p.name for p in known} for name in wanted):
        known = hook.partition_limits(fresh=True)  # a partition added since the cached answer
    cluster = hook.settings.cluster_name
    chosen = choose_partitions(wanted, known, cluster, time_hours, cpu_only=cpu_only)
    check_partition_limits(time_hours, chosen, known, param, continued=continued)
    skipped = skipped_cpu_partitions(known, time_hours) if cpu_only and not wanted else []
    if skipped:
        hook.log.info(
            "Conversion partition %s chosen on cluster %s; passed over: %s", chosen[0], cluster, "; ".join(skipped)
        )
    for partition in unavailable(chosen, known):
        hook.log.warning(
            "Partition %s on cluster %s is %s: a job there waits until the site brings it up%s",
            partition.name,
            cluster,
            partition.state.upper(),
            " (or starts on another of its partitions that is up)" if len(chosen) > 1 else "",
        )
    return chosen, known


def partitions_for(
    hook: SlurmHook, requested: object, time_hours: float, *, param: str = "time_hours", cpu_only: bool = False
) -> tuple[str, ...]:
    """Return the partitions a job goes to (``requested``, else the cluster's default), checked against their MaxTime.

    :param requested: partition name(s) from the operator or the connection (None or empty: the default).
    :param time_hours: the wall time asked for.
    :param param: the parameter named in the error.
    :param cpu_only: a CPU job (image conversion): with nothing requested it goes to a usable partition
        whose nodes have no GPUs (up, open to every user), never to a default partition with GPUs; the
        partitions passed over are logged with their reasons.
    :raises ResourceError: for an unknown partition, no default partition (no CPU partition with
        ``cpu_only``), or a time over a partition's limit.
    """
    return _chosen_partitions(hook, requested, time_hours, param, cpu_only)[0]


def place_on_cluster(
    hook: SlurmHook, resources: Resources, *, param: str = "time_hours", datasets: Sequence[tuple[str, str]] = ()
) -> Resources:
    """Place a GPU request on the cluster: partitions resolved and checked, GPUs laid out on their nodes.

    The dataset paths are tested (``test -e`` from the login host) in the round trip that reads the
    partition table, before it: a submission pays no extra round trip for them, and a missing one
    stops it before anything is staged or submitted.

    :param resources: the validated request (its ``partition`` as requested; empty: the default).
    :param param: the parameter named in a time-limit error.
    :param datasets: ``(label, path)`` pairs of data the job reads, which must exist on shared storage.
    :returns: ``resources`` with ``partition`` resolved and the layout fitted to the partitions' nodes.
    :raises MissingPathsError: naming every missing dataset path and the fix.
    :raises ResourceError: for an unknown partition, a time over its limit, or GPUs no node can hold.
    """
    return place_training(hook, resources, param=param, datasets=datasets)[0]


def place_training(
    hook: SlurmHook,
    resources: Resources,
    *,
    param: str = "time_hours",
    datasets: Sequence[tuple[str, str]] = (),
    continued: bool = False,
) -> tuple[Resources, dict[str, float] | None]:
    """:func:`place_on_cluster`, and a continued training's slice length on each of its partitions.

    :param continued: a continued training (``max_continuations``): on several partitions each slice takes
        the limit of the one it starts on (the earliest start), so ``time_hours`` is only refused when
        none of them allows it (:func:`~airflow_provider_tao_slurm.core.partitions.check_partition_limits`).
    :returns: the placed resources, and ``{partition: slice hours}`` when the named partitions' limits
        differ (:func:`~airflow_provider_tao_slurm.core.partitions.slice_hours`), else ``None``.
    """
    from airflow_provider_tao_slurm.core.partitions import fit_gpus, slice_hours

    chosen, known = _chosen_partitions(
        hook, resources.partition, resources.time_hours, param, False, datasets, continued=continued
    )
    placed = fit_gpus(resources, chosen, known)
    return placed, slice_hours(resources.time_hours, chosen, known) if continued else None
