"""Where a job's files live on shared storage: one pure description used by every layer.

Under the shared base directory (the connection's ``results_dir``)::

    <base>/jobs/<job_id>/specs/spec.yaml    staged spec (secret-free)
    <base>/jobs/<job_id>/env                compact JSON of the non-secret environment
    <base>/jobs/<job_id>/meta               compact JSON metadata
    <base>/jobs/<job_id>/sbatch/job_<job_id>.sbatch
    <base>/jobs/<job_id>/.secrets.env       mode-600 sidecar (secret_env), removed once terminal
    <base>/jobs/<job_id>/exit_codes         exit codes written by the batch script
    <base>/jobs/<job_id>/inputs/action-helpers/  a bundle's supporting files and their manifest.json
    <base>/jobs/<job_id>/events/<slurm_id>-<hex>.json  a trigger's full event, one per deferral (mode 600)
    <base>/events/<slurm_id>-<hex>.json     the same for a job submitted outside the provider
    <base>/results/<job_id>/                the job's results (status.json, checkpoints)
    <base>/logs/<job_name>-<slurm_id>/main.out|main.err
    <base>/records/<job_id>.json            the job record, outside the results tree
    <base>/ends/<slurm_id>-<restart>-<rc>.end  end markers the batch scripts leave (read by the poller)
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from airflow_provider_tao_slurm.core.execution import HELPERS_DIR
from airflow_provider_tao_slurm.exceptions import ValidationError

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _check_base(base: str) -> str:
    if not base.startswith("/") or "\x00" in base or "\n" in base:
        raise ValidationError(f"results base dir {base!r} must be an absolute cluster path; set results_dir")
    normalised = posixpath.normpath(base)
    if normalised != base.rstrip("/") or "/../" in f"{base}/":
        raise ValidationError(f"results base dir {base!r} must be normalised (no '..', '.', '//'); fix results_dir")
    return normalised


def ends_dir(base: str) -> str:
    """Return the end markers' directory of results base ``base``."""
    return f"{_check_base(base)}/ends"


def slices_dir(job_dir: str) -> str:
    """Where the slices of a chain (``max_continuations``) leave their start and ending markers."""
    return f"{job_dir}/slices"


@dataclass(frozen=True)
class JobLayout:
    """Paths of one job under ``base``; ``job_id`` doubles as the SLURM job name."""

    base: str
    job_id: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", _check_base(self.base))
        if not JOB_ID_RE.match(self.job_id):
            raise ValidationError(
                f"job id {self.job_id!r} may only contain letters, digits, '_', '.', '-' (max 128, no leading "
                "punctuation)"
            )

    @property
    def ends_dir(self) -> str:
        """Where every job of this base leaves its end marker (one directory the poller lists)."""
        return ends_dir(self.base)

    @property
    def job_dir(self) -> str:
        return f"{self.base}/jobs/{self.job_id}"

    @property
    def specs_dir(self) -> str:
        return f"{self.job_dir}/specs"

    @property
    def spec_path(self) -> str:
        return f"{self.specs_dir}/spec.yaml"

    @property
    def env_path(self) -> str:
        return f"{self.job_dir}/env"

    @property
    def meta_path(self) -> str:
        return f"{self.job_dir}/meta"

    @property
    def script_path(self) -> str:
        return f"{self.job_dir}/sbatch/job_{self.job_id}.sbatch"

    @property
    def sidecar_path(self) -> str:
        return f"{self.job_dir}/.secrets.env"

    @property
    def slices_dir(self) -> str:
        return slices_dir(self.job_dir)

    @property
    def exit_code_path(self) -> str:
        return f"{self.job_dir}/exit_codes"

    @property
    def inputs_dir(self) -> str:
        return f"{self.job_dir}/inputs"

    @property
    def helpers_dir(self) -> str:
        """Where a bundle's supporting files are staged."""
        return f"{self.job_dir}/{HELPERS_DIR}"

    @property
    def helpers_manifest_path(self) -> str:
        """The manifest of the staged supporting files (its SHA-256 list decides whether they are reused)."""
        return f"{self.helpers_dir}/manifest.json"

    def helper_path(self, destination: str) -> str:
        """Return the staged path of a supporting file whose bundle destination is ``destination``."""
        return f"{self.helpers_dir}/{destination}"

    def in_job_dir(self, relative: str) -> str:
        """Make a job-relative path (e.g. an execution block's ``child_exit_code_path``) absolute."""
        return f"{self.job_dir}/{relative}"

    def staged_name(self, path: str) -> str:
        """``path`` relative to the base: the name a file under it is staged by (see ``SlurmHook.stage_files``).

        :raises ValidationError: for a path outside the base.
        """
        if not path.startswith(f"{self.base}/"):
            raise ValidationError(f"{path!r} is not under the results base dir {self.base!r}; it cannot be staged")
        return path[len(self.base) + 1 :]

    @property
    def results_dir(self) -> str:
        return f"{self.base}/results/{self.job_id}"

    @property
    def status_path(self) -> str:
        return f"{self.results_dir}/status.json"

    @property
    def log_dir(self) -> str:
        return f"{self.base}/logs"

    @property
    def records_dir(self) -> str:
        return f"{self.base}/records"

    @property
    def record_path(self) -> str:
        return f"{self.records_dir}/{self.job_id}.json"

    def job_log_dir(self, slurm_job_id: str, job_name: str | None = None) -> str:
        """``<log_dir>/<job_name>-<slurm_job_id>`` (sbatch's ``%x-%j``)."""
        return f"{self.log_dir}/{job_name or self.job_id}-{slurm_job_id}"

    def log_paths(self, slurm_job_id: str, job_name: str | None = None) -> tuple[str, str]:
        """``(main.out, main.err)`` of one SLURM job."""
        directory = self.job_log_dir(slurm_job_id, job_name)
        return f"{directory}/main.out", f"{directory}/main.err"
