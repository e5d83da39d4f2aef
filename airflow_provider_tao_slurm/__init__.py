"""Apache Airflow provider: containerised GPU training on SLURM clusters reached over SSH.

Import this package cheaply: nothing here imports Airflow or SSH libraries.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_INTEGRATION = "TAO SLURM"


def _modules(*names: str) -> list[dict[str, Any]]:
    return [{"integration-name": _INTEGRATION, "python-modules": list(names)}]


def _conn_field(
    label: str,
    description: str,
    *,
    kind: str = "string",
    default: Any = None,
    secret: bool = False,
    minimum: int | None = None,
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [kind, "null"]}
    if default is not None:
        schema["default"] = default
    if secret:
        schema["format"] = "password"
    if minimum is not None:
        schema["minimum"] = minimum
    return {"label": label, "description": description, "schema": schema}


def get_provider_info() -> dict[str, Any]:
    """Return the provider metadata read by Airflow's ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-provider-tao-slurm",
        "name": "TAO SLURM",
        "description": "Run containerised GPU training (NVIDIA TAO, any Pyxis/Enroot image) on SLURM "
        "clusters reached over SSH.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": _INTEGRATION,
                "external-doc-url": "https://slurm.schedmd.com/",
                "tags": ["compute"],
            }
        ],
        "hooks": _modules("airflow_provider_tao_slurm.hooks.slurm"),
        "operators": _modules(
            "airflow_provider_tao_slurm.operators.preflight",
            "airflow_provider_tao_slurm.operators.stage_dataset_check",
            "airflow_provider_tao_slurm.operators.enroot_import",
            "airflow_provider_tao_slurm.operators.nccl_probe",
            "airflow_provider_tao_slurm.operators.sbatch_submit",
        ),
        "sensors": _modules("airflow_provider_tao_slurm.sensors.slurm_job"),
        "triggers": _modules("airflow_provider_tao_slurm.triggers.slurm_job"),
        "extra-links": [
            "airflow_provider_tao_slurm.lifecycle.links.SlurmJobLogsLink",
            "airflow_provider_tao_slurm.lifecycle.links.SlurmJobResultsLink",
        ],
        "connection-types": [
            {
                "connection-type": "tao_slurm",
                "hook-class-name": "airflow_provider_tao_slurm.hooks.slurm.SlurmHook",
                "hook-name": "TAO SLURM (over SSH)",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "password"],
                    "relabeling": {"login": "SLURM user", "host": "Login host(s)"},
                    "placeholders": {
                        "host": "login1.example.org,login2.example.org (failover in order)",
                        "login": "the SLURM user",
                        "port": "22",
                    },
                },
                "conn-fields": {
                    "key_file": _conn_field("Private key file", "Path of the SSH private key (mode 600)."),
                    "private_key": _conn_field(
                        "Private key (PEM)", "SSH private key text; use instead of a key file.", secret=True
                    ),
                    "private_key_passphrase": _conn_field(
                        "Private key passphrase", "Only for an encrypted private key (file or text).", secret=True
                    ),
                    "host_key": _conn_field(
                        "Pinned host key", "e.g. 'ssh-ed25519 AAAA...'; otherwise ~/.ssh/known_hosts is used."
                    ),
                    "proxy_command": _conn_field(
                        "Proxy command (jump host)",
                        "For login hosts behind a bastion, as OpenSSH's ProxyCommand, e.g. "
                        "'ssh -W %h:%p -i /keys/bastion jump@bastion.example.org' (%h, %p, %r expanded per host).",
                    ),
                    "no_host_key_check": _conn_field(
                        "Skip host key check",
                        "Not recommended; logged as a warning.",
                        kind="boolean",
                        default=False,
                    ),
                    "partition": _conn_field(
                        "GPU partition(s)",
                        "Comma separated, e.g. gpu_a100,gpu_h100. Empty: the cluster's default partition.",
                    ),
                    "account": _conn_field("Account", "SLURM account charged for jobs."),
                    "results_dir": _conn_field("Results base dir", "Shared (Lustre) base directory."),
                    "container_mounts": _conn_field(
                        "Container mounts", "Pyxis --container-mounts value, SRC:DST[,...]."
                    ),
                    "conversion_partition": _conn_field(
                        "Conversion partition",
                        "CPU partition for Enroot image conversion. Empty: the cluster's default partition.",
                    ),
                    "max_time_hours": _conn_field(
                        "Site max wall time (h)",
                        "Optional site rule, stricter than the partitions' own limits (read from the cluster).",
                        kind="number",
                    ),
                    "cluster_name": _conn_field("Cluster name", "Name used for per-cluster caches."),
                    "conn_timeout": _conn_field(
                        "Connect timeout (s)",
                        "Seconds to wait for each login host before trying the next (default 10).",
                        kind="number",
                    ),
                    "cmd_timeout": _conn_field(
                        "Command timeout (s)",
                        "Seconds one remote command (sbatch, squeue, ...) may take (default 120).",
                        kind="number",
                    ),
                    "rpc_bucket_size": _conn_field(
                        "RPC budget: burst",
                        "slurmctld RPCs the provider may send at once for this user (default: 4/5 of the "
                        "site's rl_enable bucket, no pacing where the site has none); submissions past it wait.",
                        kind="number",
                    ),
                    "rpc_refill_rate": _conn_field(
                        "RPC budget: refill per second",
                        "RPCs per second the budget refills (default: 4/5 of the site's rl_enable refill; set, "
                        "it paces whatever the site does); 0 turns the pacing off.",
                        kind="number",
                    ),
                    "log_url_template": _conn_field(
                        "Log URL template",
                        "Extra links of submitted jobs, e.g. https://ondemand.example.org/files{path}; "
                        "also {slurm_job_id}, {job_id}, {cluster}. Empty: file:// links.",
                    ),
                },
            }
        ],
    }
