"""Builders of remote command lines: one string per round trip, every value quoted.

Nothing here runs anything. The hook sends each string to the login host's POSIX shell (sh, bash,
dash); every caller-supplied value goes through :func:`~airflow_provider_tao_slurm.core.shell.quote`
or :func:`~airflow_provider_tao_slurm.core.shell.join`, so it stays one word whatever it holds.
Paths must be absolute, so none can be mistaken for an option. Secrets and file contents travel
on stdin, never in the command line (which other users of the login host can see in ``ps``).

Commands whose output needs framing print a fixed vocabulary that the ``parse_*`` functions read:
per-item checks print ``OK <index>`` / ``MISSING <index>`` (an index, never the path, so hostile
names cannot confuse the parser), the log reader prints a ``SIZE <n> LEN <m>`` header.

The builders live in one module per subject and are all importable from here:

- :mod:`.slurm`: the SLURM verbs (sbatch, squeue, sacct, scontrol, scancel, sinfo, sacctmgr);
- :mod:`.files`: staging, atomic writes, reads, log tails;
- :mod:`.guard`: the shared-storage guard every writer runs first;
- :mod:`.checks`: per-item checks (paths, tools);
- :mod:`.enroot`: registry credentials and squashfs image checks;
- :mod:`.preflight`: srun's options, the node probe and the read of its site-mounts cache;
- :mod:`.markers`: the end markers batch scripts leave;
- :mod:`.pacing`: the provider's own budget of slurmctld RPCs, and the site configuration it reads;
- :mod:`.values`: the validation every builder shares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_tao_slurm.core import partitions as _partitions
from airflow_provider_tao_slurm.core.commands.checks import (
    parse_test_paths,
    parse_which,
    split_test_paths,
    test_paths,
    test_paths_then,
    which,
)
from airflow_provider_tao_slurm.core.commands.enroot import (
    ENROOT_CREDENTIALS,
    NGC_MACHINES,
    SQUASHFS_MAGIC_HEX,
    credentials_line,
    enroot_credential_machines,
    enroot_credentials_present,
    install_enroot_credentials,
    parse_enroot_credentials_present,
    parse_sqsh_check,
    sqsh_check,
)
from airflow_provider_tao_slurm.core.commands.files import (
    MISSING_FILE_STATUS,
    STAGING_FAILED,
    extract_tar,
    mkdirs,
    next_offset,
    parse_tail,
    read_file,
    remove_files,
    rename,
    staged_then,
    staging,
    tail_bytes,
    writable_dir,
    write_file_from_stdin,
)
from airflow_provider_tao_slurm.core.commands.guard import UNSAFE_PATH_RE, UNSAFE_PATH_STATUS, secure_dirs, trusted_base
from airflow_provider_tao_slurm.core.commands.markers import (
    EndMarker,
    end_markers,
    parse_end_markers,
    remove_end_markers,
)
from airflow_provider_tao_slurm.core.commands.pacing import (
    MAX_PACING_WAIT_S,
    PACED_PREFIX,
    SUBMISSION_RPCS,
    parse_paced,
    rpc_pacing,
    site_config,
)
from airflow_provider_tao_slurm.core.commands.preflight import (
    SITE_MOUNTS_MARKER,
    STEP_STARTED,
    NodeProbe,
    missing_srun_options,
    node_probe,
    parse_node_probe,
    split_site_mounts,
    srun_help,
    srun_probe,
    step_started,
    with_site_mounts,
)
from airflow_provider_tao_slurm.core.commands.slurm import (
    IDS_ON_COMMAND_LINE,
    SHOW_JOB_KEYS,
    Association,
    NodeRow,
    existing_nodes,
    jobs_by_name,
    node_states,
    parse_node_states,
    parse_sacctmgr_assoc,
    parse_show_job,
    prepare_job_logs,
    sacct_states,
    sacctmgr_assoc,
    sbatch_submit,
    sbatch_submit_held,
    scancel,
    scancel_handed_off,
    show_job,
    sinfo_partitions,
    sinfo_partitions_cached,
    squeue_states,
)

__all__ = [
    "ENROOT_CREDENTIALS",
    "IDS_ON_COMMAND_LINE",
    "MAX_PACING_WAIT_S",
    "MISSING_FILE_STATUS",
    "NGC_MACHINES",
    "PACED_PREFIX",
    "SHOW_JOB_KEYS",
    "SITE_MOUNTS_MARKER",
    "SQUASHFS_MAGIC_HEX",
    "STAGING_FAILED",
    "STEP_STARTED",
    "SUBMISSION_RPCS",
    "UNSAFE_PATH_RE",
    "UNSAFE_PATH_STATUS",
    "Association",
    "EndMarker",
    "NodeProbe",
    "NodeRow",
    "credentials_line",
    "end_markers",
    "enroot_credential_machines",
    "enroot_credentials_present",
    "existing_nodes",
    "extract_tar",
    "install_enroot_credentials",
    "jobs_by_name",
    "missing_srun_options",
    "mkdirs",
    "next_offset",
    "node_probe",
    "node_states",
    "parse_end_markers",
    "parse_enroot_credentials_present",
    "parse_node_probe",
    "parse_node_states",
    "parse_paced",
    "parse_sacctmgr_assoc",
    "parse_show_job",
    "parse_sqsh_check",
    "parse_tail",
    "parse_test_paths",
    "parse_which",
    "prepare_job_logs",
    "read_file",
    "remove_end_markers",
    "remove_files",
    "rename",
    "rpc_pacing",
    "sacct_states",
    "sacctmgr_assoc",
    "sbatch_submit",
    "sbatch_submit_held",
    "scancel",
    "scancel_handed_off",
    "secure_dirs",
    "show_job",
    "sinfo_partitions",
    "sinfo_partitions_cached",
    "site_config",
    "split_site_mounts",
    "split_test_paths",
    "sqsh_check",
    "squeue_states",
    "srun_help",
    "srun_probe",
    "staged_then",
    "staging",
    "step_started",
    "tail_bytes",
    "test_paths",
    "test_paths_then",
    "trusted_base",
    "which",
    "with_site_mounts",
    "writable_dir",
    "write_file_from_stdin",
]


def parse_sinfo_partitions(stdout: str) -> tuple[list[_partitions.Partition], list[str]]:
    """Read sinfo's partitions: deprecated, goes in the next release; use ``core.partitions.parse_sinfo_partitions``.

    Calls it and returns what it returns: the partitions (with GPUs per node, GPU types and a
    ``problem`` for an unreadable line) and the lines that name no partition. (The previous release's
    parser returned the list alone and raised on an unreadable line.)
    """
    from airflow_provider_tao_slurm.core.deprecated import warn_moved

    warn_moved("core.commands.parse_sinfo_partitions", "core.partitions.parse_sinfo_partitions")
    return _partitions.parse_sinfo_partitions(stdout)


if not TYPE_CHECKING:  # mypy keeps checking every other name of the package

    def __getattr__(name: str) -> Any:
        """Give ``Partition``: deprecated, goes in the next release; use ``core.partitions.Partition``.

        The name gives that class itself (its time limit is ``max_time_hours``, no longer
        ``max_time_seconds``), with a ``DeprecationWarning``.
        """
        if name == "Partition":
            from airflow_provider_tao_slurm.core.deprecated import warn_moved

            warn_moved("core.commands.Partition", "core.partitions.Partition")
            return _partitions.Partition
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
