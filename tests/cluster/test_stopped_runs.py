"""A run stopped by its user leaves nothing behind (issue 41, item 7).

``airflow dags test`` is how docs/pipelines.md tells a new user to try a pipeline, and Ctrl-C (SIGINT) or a
``kill`` (SIGTERM) is how that user stops it. Whatever stops the run while its job waits, the job is
cancelled, its record says CANCELED, and no secret sidecar outlives it on shared storage. Each case runs a
real ``airflow dags test`` against the test cluster; the job is held pending (``--begin`` an hour away), so
the signal always lands while it waits, whatever the machine's load.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from clusterkit import (
    SECRET_SOURCE,
    dag_id,
    final_state,
    image,
    record_of,
    secret_value,
    sidecar_mode,
)
from deferral import wait_until
from demo import airflow_bin, airflow_facts, prepare_airflow

from airflow_provider_tao_slurm.core.shell import join

if TYPE_CHECKING:
    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

__all__ = ["dag_id", "image", "secret_value"]

#: A submit task whose job has a secret and waits (``--begin`` an hour away), and a sensor on it.
WAITING_DAG = """from airflow.sdk import DAG

from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

with DAG(dag_id={dag_id!r}, schedule=None):
    submit = SbatchSubmitOperator(
        task_id="submit",
        image={image!r},
        command="sleep 5",
        partition={partition!r},
        gpus_per_node=1,
        cpus_per_task=1,
        time_hours=1 / 60,
        timeout_hours=None,
        secret_env={{"RL_TOKEN": "env:{secret_source}"}},
        sbatch_options={{"begin": "now+1hour"}},
    )
    SlurmJobSensor(task_id="wait", job=submit.output, poke_interval=1, deferrable={deferrable})
"""

#: What ``airflow dags test`` prints once the sensor waits: the inline trigger, or the sensor's task (it pokes).
WAITING = {True: "[DAG TEST] running trigger in line", False: "[DAG TEST] running task <TaskInstance: {dag_id}.wait "}


class DagsTest:
    """One ``airflow dags test`` process, its output collected by a thread."""

    def __init__(self, env: dict[str, str], dag_id: str) -> None:
        self.lines: list[str] = []
        # Ctrl-C works as in a terminal even when this suite runs in the background: a shell starts background
        # commands with SIGINT ignored, which a child inherits; a handled SIGINT is the default after exec.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.proc = subprocess.Popen(
                [airflow_bin(), "dags", "test", dag_id],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        """Return once the output holds ``text``; fail with the output's tail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._reader.join(10)
                raise AssertionError(f"airflow dags test never printed {text!r}:\n{self.output[-6000:]}")
            time.sleep(0.5)

    def stop(self, signum: int, timeout: float = 120) -> int:
        """Send ``signum``; return the exit status once the process ended (killed after ``timeout``)."""
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            tail = self.output[-4000:]
            raise AssertionError(f"airflow dags test still ran {timeout:.0f} s after {signum}:\n{tail}") from None
        finally:
            self._reader.join(10)


@pytest.mark.parametrize(
    ("signum", "deferrable"),
    [(signal.SIGINT, True), (signal.SIGTERM, True), (signal.SIGINT, False)],
    ids=["ctrl-c-deferred", "sigterm-deferred", "ctrl-c-in-worker"],
)
def test_a_stopped_dags_test_cancels_its_job_and_leaves_no_secret(
    signum: int,
    deferrable: bool,
    image: str,
    dag_id: str,
    secret_value: str,
    ssh_run: SshRun,
    cluster: ClusterEnv,
) -> None:
    """Stop ``airflow dags test`` while the sensor waits on a pending job with a secret: the job ends
    CANCELLED in SLURM, its record says CANCELED, its sidecar is gone, and the run says what it did."""
    home = Path(tempfile.mkdtemp(prefix="tao-stopped-"))
    try:
        dags = home / "dags"
        dags.mkdir()
        (dags / "waiting.py").write_text(
            WAITING_DAG.format(
                dag_id=dag_id,
                image=image,
                partition=cluster.short_partition,
                secret_source=SECRET_SOURCE,
                deferrable=deferrable,
            )
        )
        extra = {"AIRFLOW__CORE__DAGS_FOLDER": str(dags), SECRET_SOURCE: secret_value}
        env = prepare_airflow(dataclasses.asdict(cluster), home, extra)
        run = DagsTest(env, dag_id)
        try:
            run.wait_for(WAITING[deferrable].format(dag_id=dag_id), timeout=180)
            time.sleep(2)  # the trigger (or the poke) is past its first query
            rc = run.stop(signum)
        finally:
            if run.proc.poll() is None:
                run.proc.kill()
        handle = airflow_facts(env, dag_id)["xcom"]["submit"]
    finally:
        shutil.rmtree(home, ignore_errors=True)

    output = run.output
    assert rc != 0 or "failed" in output.lower(), output[-4000:]
    slurm_id = handle["slurm_job_id"]
    assert (
        wait_until(lambda: final_state(ssh_run, slurm_id) or None, f"job {slurm_id} in accounting", timeout=60)
        == "CANCELLED"
    ), output[-4000:]
    assert ssh_run(join(["squeue", "-h", "-j", slurm_id]))[1].strip() == "", "the job still waits"
    assert handle["sidecar_path"], handle
    assert sidecar_mode(ssh_run, handle["sidecar_path"]) == "gone", output[-4000:]
    record = record_of(ssh_run, handle["record_path"])
    assert record["terminal_state"] == "CANCELED", record
    assert secret_value not in output
    assert f"Cancelling SLURM job {slurm_id} " in output, output[-4000:]
