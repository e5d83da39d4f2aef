"""Security suite (issue 10): where a secret must never be, and the life of its sidecar.

One module fixture runs four task chains the way Airflow does (submit -> deferred sensor -> resume),
all with the same random ``secret_env`` value and their triggers on one event loop: a job that
succeeds, one that fails, one the user cancels while it runs (the deferred task is marked failed:
the triggerer cancels ``run()``, then calls ``on_kill()`` and ``cleanup()``), and one that is requeued
while it runs (``scontrol requeue``, then released early). While it runs the fixture collects
every log line this process writes (task and triggerer side), every XCom value and trigger event,
the login host's process list (sampled continuously; the login host is this machine), the sidecar's
mode at each step, and afterwards the files on the cluster and the sshd logs. The tests then look
for the secret in each place, and check the sidecar's mode 600 while the job lives, across the
requeue, and its removal after every terminal state.

Host keys and key files are covered by the hook's suite (see RELIABILITY.md for the node ids).
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from clusterkit import (
    SECRET_SOURCE,
    SHOW_SECRET,
    ArgvSampler,
    LogCapture,
    connection_json,
    digest,
    jobs_named,
    remote_text,
    sensor_for,
    sidecar_mode,
    squeue_field,
    submit,
    submit_op,
)
from deferral import context, defer, first_event, resume, run_async, wait_until

from airflow_provider_tao_slurm.core.shell import join, quote
from airflow_provider_tao_slurm.exceptions import JobFailedError

if TYPE_CHECKING:
    from airflow.sdk.exceptions import TaskDeferred

    from tests.cluster.conftest import ClusterEnv, SshRun

pytestmark = pytest.mark.cluster

#: Random, and full of shell-special characters: quoting mistakes anywhere would break or leak it.
SECRET = f"rl-secret-{uuid.uuid4().hex}-$(id)'\"&;|`x`*?"
RERUN_FAST = 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then echo rerun; exit 0; fi; sleep 60'
COMMANDS = {
    "success": f"{SHOW_SECRET}; sleep 3",
    # alive a few seconds: its own EXIT trap removes the sidecar as soon as it ends (SLURM will not rerun it)
    "failure": f"{SHOW_SECRET}; sleep 3; exit 3",
    "cancel": f"{SHOW_SECRET}; sleep 60",
    "requeue": f"{SHOW_SECRET}; {RERUN_FAST}",
}


@dataclass
class Run:
    """One task chain and what was seen of it."""

    name: str
    ctx: dict[str, Any]
    handle: dict[str, Any]
    deferred: TaskDeferred | None = None
    event: dict[str, Any] | None = None
    outcome: Any = None
    modes: dict[str, str] = field(default_factory=dict)


@dataclass
class Evidence:
    """Everything the four runs left behind, as text per place."""

    runs: dict[str, Run]
    places: dict[str, str]


def _watch(run: Run, ssh_run: SshRun) -> Any:
    """The coroutine that plays the triggerer (and the user) for one run; returns the trigger's event or None."""
    assert run.deferred is not None
    trigger = run.deferred.trigger
    slurm_id = run.handle["slurm_job_id"]
    sidecar = run.handle["sidecar_path"]

    async def running() -> None:
        await asyncio.to_thread(
            wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", f"{run.name} running", 90
        )
        run.modes["running"] = await asyncio.to_thread(sidecar_mode, ssh_run, sidecar)

    async def main() -> Any:
        watch = asyncio.ensure_future(first_event(trigger, 180))
        if run.name == "cancel":
            await running()
            watch.cancel()  # the user marks the deferred task failed: run() is cancelled, then on_kill, cleanup
            with pytest.raises(asyncio.CancelledError):
                await watch
            await trigger.on_kill()
            await trigger.cleanup()
            await asyncio.to_thread(
                wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T") in ("CANCELLED", ""), "cancelled", 60
            )
            return None
        if run.name == "requeue":
            await running()
            rc, _, err = await asyncio.to_thread(ssh_run, join(["scontrol", "requeue", slurm_id]))
            assert rc == 0, err
            await asyncio.to_thread(
                wait_until, lambda: squeue_field(ssh_run, slurm_id, "%T|%r") == "PENDING|BeginTime", "requeued", 60
            )
            run.modes["requeued"] = await asyncio.to_thread(sidecar_mode, ssh_run, sidecar)
            # SLURM holds a requeued job for two minutes; its owner may end that wait.
            rc, _, err = await asyncio.to_thread(ssh_run, f"scontrol update jobid={quote(slurm_id)} StartTime=now")
            assert rc == 0, err
        return await watch

    return main()


@pytest.fixture(scope="module")
def evidence(cluster: ClusterEnv, ssh_run: SshRun, image: str) -> Iterator[Evidence]:
    """Run the four chains (success, failure, user cancel, requeue) and collect every place to scan."""
    dag = f"rl-secrets-{uuid.uuid4().hex[:8]}"
    runs: dict[str, Run] = {}
    with pytest.MonkeyPatch.context() as patch, LogCapture() as logs:
        patch.setenv("AIRFLOW_CONN_SLURM_DEFAULT", connection_json(cluster))
        patch.setenv(SECRET_SOURCE, SECRET)
        sampler = ArgvSampler()
        sampler.start()
        try:
            for name, command in COMMANDS.items():
                ctx = context(dag, name, "r1")
                handle = submit(submit_op(image, command, task_id=name), ctx)
                runs[name] = Run(name, ctx, handle, modes={"submitted": sidecar_mode(ssh_run, handle["sidecar_path"])})
            sensors = {name: sensor_for(run.handle) for name, run in runs.items()}
            for name, run in runs.items():
                run.deferred = defer(sensors[name], run.ctx)

            async def all_runs() -> list[Any]:
                return list(await asyncio.gather(*(_watch(run, ssh_run) for run in runs.values())))

            for run, event in zip(runs.values(), run_async(all_runs()), strict=True):
                run.event = None if event is None else dict(event.payload)
                if event is None:
                    continue
                assert run.deferred is not None
                try:
                    run.outcome = resume(sensors[run.name], run.ctx, run.deferred, event)
                except JobFailedError as failed:
                    run.outcome = failed
        finally:
            samples = sampler.stop()
        for run in runs.values():
            run.modes["final"] = sidecar_mode(ssh_run, run.handle["sidecar_path"])
        log_lines = list(logs.lines)

    handles = [run.handle for run in runs.values()]
    job_files = " ".join(quote(h[key]) for h in handles for key in ("job_dir", "record_path", "results_dir", "log_dir"))
    _, files, _ = ssh_run(f"find {job_files} -type f ! -name .secrets.env 2>/dev/null")
    file_text = {path: remote_text(ssh_run, path) for path in files.split()}
    sshd_logs = sorted(Path(cluster.state_dir, "log").glob("sshd*.log"))
    places = {
        "task and triggerer logs": "\n".join(log_lines),
        "XCom values, trigger events and deferral kwargs": json.dumps(
            [
                [run.handle, run.event, run.outcome if isinstance(run.outcome, dict) else str(run.outcome)]
                for run in runs.values()
            ]
            + [run.deferred.kwargs if run.deferred else None for run in runs.values()]
            + [run.deferred.trigger.serialize() if run.deferred else None for run in runs.values()],
            default=str,
        ),
        "job records": "\n".join(text for path, text in file_text.items() if "/records/" in path),
        "rendered sbatch scripts": "\n".join(text for path, text in file_text.items() if path.endswith(".sbatch")),
        "spec, env and meta files": "\n".join(
            text for path, text in file_text.items() if path.endswith(("/specs/spec.yaml", "/env", "/meta"))
        ),
        "job logs (main.out, main.err)": "\n".join(text for path, text in file_text.items() if "/logs/" in path),
        "every other file of the jobs": "\n".join(file_text.values()),
        "login host process list, sampled during submission and run": "\n".join(samples),
        "sshd logs": "\n".join(path.read_text(errors="replace") for path in sshd_logs),
    }
    yield Evidence(runs, places)
    ssh_run("rm -rf -- " + " ".join(quote(h[key]) for h in handles for key in ("job_dir", "results_dir", "log_dir")))


#: What each place must visibly contain, so that a scan of it cannot pass by being empty.
PRESENT = {
    "task and triggerer logs": ["submitted on", "SlurmJobTrigger"],
    "XCom values, trigger events and deferral kwargs": ["slurm_job_id", "sidecar_path"],
    "job records": ['"terminal_state"'],
    "rendered sbatch scripts": ["#SBATCH --job-name="],
    "spec, env and meta files": ['"secret_names":["RL_TOKEN"]'],
    "job logs (main.out, main.err)": [f"secret-digest={digest(SECRET)}"],
    "every other file of the jobs": ["TAO_SLURM: step exit code"],
    "login host process list, sampled during submission and run": ["sbatch"],
    "sshd logs": ["Accepted publickey"],
}


@pytest.mark.parametrize("place", list(PRESENT), ids=[p.split(" (")[0].replace(" ", "-") for p in PRESENT])
def test_secret_is_absent(evidence: Evidence, place: str, record_property: Any) -> None:
    """After the four runs (success, failure, user cancel, requeue) the secret value (random, with shell-special
    characters) was searched for in this place, as is and base64-, URL- and JSON-encoded. Expected: absent in
    every form, while the place visibly holds what it should (so the scan saw it)."""
    text = evidence.places[place]
    for marker in PRESENT[place]:
        assert marker in text, f"{place}: {marker!r} not found, the scan would be vacuous"
    for form, shown in encoded_forms(SECRET).items():
        assert shown not in text, f"the secret is in {place}, {form}"


def encoded_forms(secret: str) -> dict[str, str]:
    """The secret as it is, and as programs re-encode it (base64, URL, JSON string)."""
    raw = secret.encode()
    return {
        "as is": secret,
        "base64-encoded": base64.b64encode(raw).decode().rstrip("="),
        "base64url-encoded": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "URL-encoded": urllib.parse.quote(secret, safe=""),
        "URL-encoded (form)": urllib.parse.quote_plus(secret, safe=""),
        "JSON-escaped": json.dumps(secret)[1:-1],
    }


def test_every_run_ended_as_it_should(evidence: Evidence, ssh_run: SshRun) -> None:
    """The four runs' outcomes, and that each one is a single SLURM job. Expected: success COMPLETE, failure
    ERROR (the task fails), cancel cancelled by the user's kill, requeue COMPLETE on the same job id after a
    rerun that still had the secret."""
    runs = evidence.runs
    assert runs["success"].outcome["terminal_state"] == "COMPLETE"
    assert isinstance(runs["failure"].outcome, JobFailedError)
    assert runs["cancel"].event is None
    assert runs["requeue"].outcome["terminal_state"] == "COMPLETE"
    requeued = runs["requeue"].handle
    assert "rerun" in remote_text(ssh_run, f"{requeued['log_dir']}/main.out")
    assert f"secret-digest={digest(SECRET)}" in remote_text(ssh_run, f"{requeued['log_dir']}/main.out")
    for run in runs.values():
        assert jobs_named(ssh_run, run.handle["job_id"]) == [run.handle["slurm_job_id"]]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_sidecar_is_private_while_the_job_lives_and_gone_after(
    evidence: Evidence, name: str, record_property: Any
) -> None:
    """The sidecar's mode was read right after submit, while the job ran, after the requeue (requeue run),
    and after the task ended. Expected: 600 at every point of the job's life, removed after its terminal
    state (success, failure, user cancel, requeue then success)."""
    modes = evidence.runs[name].modes
    record_property("detail", ", ".join(f"{when}={mode}" for when, mode in modes.items()))
    live = {when: mode for when, mode in modes.items() if when != "final"}
    assert set(live.values()) == {"600"}, modes
    assert modes["final"] == "gone", modes


def test_user_kill_of_a_waiting_non_deferrable_sensor(
    conn: str, image: str, dag_id: str, ssh_run: SshRun, record_property: Any
) -> None:
    """A sensor with deferrable=False waited in the worker (poking every 5 s) for a running job that holds a
    secret; the user marked the task failed, so Airflow called the sensor's on_kill(). Expected: the SLURM
    job is cancelled and its sidecar removed at once (no poke needed); the poke loop then ends the task as
    cancelled; one SLURM job."""
    ctx = context(dag_id, "submit", "r1")
    handle = submit(submit_op(image, f"{SHOW_SECRET}; sleep 60"), ctx)
    slurm_id, sidecar = handle["slurm_job_id"], handle["sidecar_path"]
    sensor = sensor_for(handle, deferrable=False, poke_interval=5)
    with ThreadPoolExecutor(1) as worker:
        waiting = worker.submit(sensor.execute, ctx)
        wait_until(lambda: squeue_field(ssh_run, slurm_id, "%T") == "RUNNING", "job running", 90)
        live = sidecar_mode(ssh_run, sidecar)
        sensor.on_kill()
        killed = sidecar_mode(ssh_run, sidecar)
        state = wait_until(
            lambda: squeue_field(ssh_run, slurm_id, "%T") in ("CANCELLED", "") and "cancelled", "job cancelled", 30
        )
        with pytest.raises(JobFailedError, match="CANCELLED"):
            waiting.result(timeout=60)
    record_property("detail", f"sidecar {live} while waiting, {killed} right after on_kill; job {state}")
    assert (live, killed) == ("600", "gone")
    assert jobs_named(ssh_run, handle["job_id"]) == [slurm_id]
