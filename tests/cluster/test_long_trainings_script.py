"""A slice's batch script (issue 33) on the real test cluster, without a sensor.

Each test renders the single-node script of one slice for ``polar_1m`` (one-minute ``MaxTime``) with
:func:`~airflow_provider_tao_slurm.core.templates.render_sbatch` and submits it with ``sbatch``; both jobs
run at the same time (one GPU each) to keep the module near two minutes. SLURM warns the batch shell with
``--signal=B:USR1@<grace>`` before the limit and ends the job TIMEOUT.

- A program that handles nothing (the default, no ``checkpoint_signal``): the warning reaches only the
  batch shell, which leaves the ``.ending`` marker; the program sleeps on until SLURM ends the job.
- ``checkpoint_signal='USR1'`` and a program that traps it: the batch shell passes it on through srun, the
  step's relay hands it to the program (``timeout`` in between survives it), and the program writes a file
  and keeps going until SLURM ends the job TIMEOUT, not FAILED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from clusterkit import dag_id, final_state, image, remote_text
from deferral import wait_until

from airflow_provider_tao_slurm.core.continuation import SliceScript, slice_marker
from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.core.templates import SbatchSpec, render_sbatch

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

__all__ = ["dag_id", "image"]

#: A program that handles nothing: SLURM's limit ends it.
SLEEPER = "sleep 200"
#: A program that saves a "checkpoint" on SIGUSR1 and goes on (sleeping in short steps, as a training
#: loop would: the test cluster's proctrack/linuxproc also signals the sleep itself).
HANDLER = (
    "trap 'date > \"$SLOT/saved\"' USR1; end=$((SECONDS + 200)); "
    'while [ "$SECONDS" -lt "$end" ]; do sleep 1; if [ -e "$SLOT/saved" ]; then : > "$SLOT/after"; fi; done'
)
GRACE_S = 20
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


def submit_slice(
    ssh_run: SshRun, cluster: ClusterEnv, image: str, name: str, command: str, checkpoint_signal: str | None
) -> tuple[str, str]:
    """Render one slice script for the one-minute partition, submit it; return ``(slurm id, job dir)``."""
    job_dir = f"{cluster.results_dir}/{name}"
    spec = SbatchSpec(
        job_name=name,
        partition=cluster.short_partition,
        num_nodes=1,
        gpus_per_node=1,
        cpus_per_task=1,
        time="00:01:00",
        timeout_seconds=50,
        log_dir=f"{job_dir}/logs",
        job_dir=job_dir,
        image=image,
        command=command,
        exit_code_file=f"{job_dir}/exit_codes",
        env={"SLOT": f"{job_dir}/slot"},
        slice=SliceScript(
            slices_dir=f"{job_dir}/slices",
            grace_seconds=GRACE_S,
            results_dir=f"{job_dir}/results",
            checkpoint_signal=checkpoint_signal,
        ),
    )
    prepare = join(["mkdir", "-p", "--", f"{job_dir}/slot", f"{job_dir}/results"])
    # As the hook does: submitted held, its log directory <log_dir>/<name>-<id> made, then released.
    submit = (
        f"{prepare} && cd -- {quote(job_dir)} && id=$(sbatch --parsable --hold) && "
        f'mkdir -p -- {quote(job_dir)}/logs/{quote(name)}-"$id" && scontrol release "$id" && echo "$id"'
    )
    rc, out, err = ssh_run(submit, stdin=render_sbatch(spec))
    assert rc == 0, err
    return out.strip().split(";")[0], job_dir


def test_slices_are_warned_before_the_limit_and_end_timeout(
    ssh_run: SshRun, cluster: ClusterEnv, image: str, dag_id: str
) -> None:
    plain_id, plain_dir = submit_slice(ssh_run, cluster, image, f"{dag_id}-plain", SLEEPER, None)
    usr1_id, usr1_dir = submit_slice(ssh_run, cluster, image, f"{dag_id}-usr1", HANDLER, "USR1")
    try:
        wait_until(
            lambda: {final_state(ssh_run, plain_id), final_state(ssh_run, usr1_id)} <= ENDED,
            "both slices to end",
            timeout=170,
        )
    finally:
        ssh_run(join(["scancel", plain_id, usr1_id]))
    logs = {
        job: remote_text(ssh_run, f"{job_dir}/logs/{job_dir.rsplit('/', 1)[1]}-{job}/main.out")
        for job, job_dir in ((plain_id, plain_dir), (usr1_id, usr1_dir))
    }
    assert (final_state(ssh_run, plain_id), final_state(ssh_run, usr1_id)) == ("TIMEOUT", "TIMEOUT"), logs
    for job, job_dir in ((plain_id, plain_dir), (usr1_id, usr1_dir)):
        _, listing, _ = ssh_run(join(["ls", "--", f"{job_dir}/slices"]))
        assert sorted(listing.split()) == [slice_marker(job, 0, "ending"), slice_marker(job, 0, "start")], logs[job]
        assert remote_text(ssh_run, f"{job_dir}/slices/{slice_marker(job, 0, 'ending')}").strip(), "the warning's date"
        assert "TAO_SLURM: slice 1 (TAO_SLURM_SLICE), latest checkpoint '' (TAO_SLURM_LATEST_CHECKPOINT)" in logs[job]
    assert f"TAO_SLURM: slice 1 ends in about {GRACE_S} s (time limit): the program is not signalled" in logs[plain_id]
    assert remote_text(ssh_run, f"{plain_dir}/slot/saved") == ""
    assert f"ends in about {GRACE_S} s (time limit): SIGUSR1 goes to the program" in logs[usr1_id]
    assert remote_text(ssh_run, f"{usr1_dir}/slot/saved").strip(), "the program's own USR1 handler ran"
    assert ssh_run(join(["test", "-e", f"{usr1_dir}/slot/after"]))[0] == 0, "the program went on after the signal"
