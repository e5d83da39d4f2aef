"""Preemption with and without ``send_user_signal`` (issue 42, item 6), on the real test cluster.

``harness.py preempt-signal on|off`` gives the GPU partitions that ``polar_urgent`` preempts a preemption
``GraceTime``; ``on`` also has slurmctld send a preempted job's batch shell its ``--signal`` warning
(``SlurmctldParameters=preempt_send_user_signal`` on 22.05, ``PreemptParameters=send_user_signal`` from 23.02).
A continued training (one more slice allowed, no requeue) on the debug partition is preempted after its first
checkpoint by another user's job that needs every GPU of its node. The slice's batch shell traps the warning
(``USR1``) and leaves ``<slices>/<job id>-0.ending``: that file tells whether the shell was warned.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from clusterkit import (
    as_other,
    conn,
    dag_id,
    demo_program,
    harness,
    image,
    secret_value,
    sensor_for,
    squeue_field,
    submit,
    submit_op,
)
from deferral import context, run_deferrable, wait_until
from demo import DEMO_DIR

from airflow_provider_tao_slurm.core.shell import join

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.usefixtures("demo_program")]

__all__ = ["conn", "dag_id", "demo_program", "image", "secret_value"]

PROGRAM = f"python3 {DEMO_DIR}/tao_like_train.py"
#: The site configuration the provider keeps on the login host: removed around each test, so each reads the site.
SITE_CACHES = '"$HOME/.tao-slurm/slurmctld-parameters" "$HOME/.tao-slurm/slurmctld-preemption"'
UNSIGNALLED = "without send_user_signal, so a preempted slice gets no SIGUSR1"


@pytest.fixture
def preempt_signal(request: pytest.FixtureRequest, ssh_run: SshRun) -> Iterator[str]:
    """``harness.py preempt-signal <param>`` for one test; SLURM's default again afterwards, whatever happened."""
    ssh_run(f"rm -f {SITE_CACHES}")
    harness("preempt-signal", request.param)
    try:
        yield request.param
    finally:
        harness("preempt-signal", "default")
        ssh_run(f"rm -f {SITE_CACHES}")


@pytest.mark.parametrize("preempt_signal", ["on", "off"], indirect=True)
def test_a_preempted_slice_is_warned_only_with_send_user_signal(
    conn: str,
    image: str,
    dag_id: str,
    ssh_run: SshRun,
    cluster: ClusterEnv,
    preempt_signal: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """With send_user_signal the batch shell gets the warning at preemption (its trap leaves the ending marker)
    and the program runs on through the grace time. Without it the shell gets nothing and the submission said so
    once (``checkpoint_signal`` set): the steps get SIGTERM when the grace time starts and the stand-in program
    (which does not handle it) dies; the batch shell sees the preemption under way (PreemptTime) and waits for
    SLURM to end the job, so it ends PREEMPTED, not FAILED. Either way the next slice resumes from the
    checkpoint and the training completes."""
    warned_site = preempt_signal == "on"
    ctx = context(dag_id, "train", f"preempt-{preempt_signal}")
    handle = submit(
        submit_op(
            image,
            f"{PROGRAM} --spec {{config_path}} --results {{results_dir}} --epoch-seconds 2",
            spec={"train": {"epochs": 20}},
            partition=cluster.debug_partition,
            network_arch="classification_pyt",
            secret_env=None,
            time_hours=0.2,
            timeout_hours=None,
            max_continuations=1,
            requeue=False,
            # the stand-in program does not handle USR1: it is asked for only where preemption never sends it
            checkpoint_signal=None if warned_site else "USR1",
        ),
        ctx,
    )
    assert (UNSIGNALLED in capfd.readouterr().out) != warned_site
    slurm_id = handle["slurm_job_id"]
    checkpoint = f"{handle['results_dir']}/checkpoints/epoch_1.ckpt"
    wait_until(lambda: ssh_run(join(["test", "-e", checkpoint]))[0] == 0, "the first checkpoint", timeout=60)
    node = squeue_field(ssh_run, slurm_id, "%N")
    rc, _, err = as_other(
        cluster,
        join([
            "sbatch", "--parsable", f"--partition={cluster.urgent_partition}", f"--nodelist={node}",
            f"--gres=gpu:{cluster.gpus_per_node}", "--time=2", f"--output={cluster.other_dir}/urgent-%j.out",
            "--wrap=sleep 5",
        ]),
    )  # fmt: skip
    assert rc == 0, err

    done = run_deferrable(sensor_for(handle), ctx, timeout=150)

    ending = f"{handle['job_dir']}/slices/{slurm_id}-0.ending"
    assert (ssh_run(join(["test", "-e", ending]))[0] == 0) == warned_site
    first = ssh_run(join(["sacct", "-X", "-n", "-P", "-j", slurm_id, "-o", "State"]))[1].split()
    assert first == ["PREEMPTED"]
    assert done["terminal_state"] == "COMPLETE"
    assert [item["state"] for item in done["slices"]] == ["PREEMPTED", "COMPLETED"]
    if not warned_site:  # the steps' SIGTERM killed the program: the shell waited for SLURM to end the job
        main_out = ssh_run(join(["cat", f"{handle['log_dir']}/main.out"]))[1]
        assert "TAO_SLURM: the job is being preempted" in main_out, main_out
