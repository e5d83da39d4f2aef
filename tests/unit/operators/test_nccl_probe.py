"""``NcclProbeOperator`` without a cluster: planning, deferral, candidate retries, backends, verdicts and the cache.

The hook is the shared recording stand-in for ``SlurmHook`` (``tests/unit/fakes.py``); the
scripts, cache entries, triggers and events are the real ones the provider's code builds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from fakes import FakeSlurmHook

from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.nccl import CachedEnv, SeenVersions, cache_key, cache_text
from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.core.states import JobState, state_from_native
from airflow_provider_tao_slurm.exceptions import (
    ImageReferenceError,
    NcclProbeError,
    ResourceError,
    ValidationError,
)
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW
from airflow_provider_tao_slurm.lifecycle.events import state_to_payload
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

IMAGE = "/lustre/u/containers/pytorch.sqsh"
CACHE = "/lustre/u/nccl/mini.polar.json"
PROGRAM = resources.files("airflow_provider_tao_slurm.probes").joinpath("nccl_probe.py").read_bytes()
OK_LOG = (
    "TAO_NCCL_PROBE: rank 0/2 node 0/2\nTAO_NCCL_PROBE_OK world=2 nodes=2 gpus_per_node=1 backend=nccl sum=3 "
    "nccl=2.18.1 driver=535.104.05 cuda=12.1 torch=2.3.0 partition=polar\n"
)
GLOO_LOG = OK_LOG.replace("backend=nccl", "backend=gloo").replace(
    "nccl=2.18.1 driver=535.104.05", "nccl=none driver=none"
)
NO_CUDA_LOG = (
    "TAO_NCCL_PROBE_NO_CUDA: rank 0 host n1 partition polar: backend nccl needs CUDA but torch 2.3.0 (CUDA build "
    "12.1, driver none) sees no GPU; CUDA_VISIBLE_DEVICES=(unset)\n"
)
HANG_LOG = "TAO_NCCL_PROBE: rank 0/2 node 0/2\nTAO_SLURM: program stopped by timeout after 120 s\n"
SETTINGS = ClusterSettings(
    hosts=("login1",),
    user="u",
    results_dir="/lustre/u",
    cluster_name="mini",
    partitions=("polar",),
    account="gpu_proj",
    container_mounts="/lustre:/lustre",
)


def cluster(files: dict[str, str] | None = None) -> FakeSlurmHook:
    """The shared fake on this module's cluster, with ``files`` on its shared storage."""
    return FakeSlurmHook(files, settings=SETTINGS)


def staged_script(hook: FakeSlurmHook, index: int) -> str:
    """The batch script the ``index``-th submission staged."""
    base, files = hook.staged[index]
    content = files[hook.submits[index].script_path[len(base) + 1 :]][0]
    assert content is not None
    return content.decode()


def context(try_number: int = 1) -> dict[str, Any]:
    return {
        "ti": SimpleNamespace(
            dag_id="dag", task_id="probe", run_id="run1", map_index=-1, try_number=try_number, stats_tags={}
        )
    }


def operator(hook: FakeSlurmHook, **kwargs: Any) -> NcclProbeOperator:
    op = NcclProbeOperator(task_id="probe", image=kwargs.pop("image", IMAGE), **kwargs)
    op.__dict__["hook"] = hook
    return op


def deferred(call: Callable[[], object]) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as info:
        call()
    return info.value


def finish(
    op: NcclProbeOperator,
    hook: FakeSlurmHook,
    deferral: TaskDeferred,
    native: str,
    exit_code: int,
    log: str,
    *,
    keep_kwargs: bool = True,
) -> Any:
    """Play the trigger's terminal event for the deferred probe job; return what the operator returns.

    ``keep_kwargs=False`` resumes as ``airflow dags test`` does: with the event only.
    """
    slurm_id = deferral.trigger.slurm_job_id
    name = deferral.trigger.job_name
    hook.files[f"/lustre/u/logs/{name}-{slurm_id}/main.out"] = log
    state = state_from_native(slurm_id, native, source="sacct", exit_code=exit_code)
    event = {"status": "terminal", "slurm_job_id": slurm_id, "job_name": name, "state": state_to_payload(state)}
    return op.execute_complete(context(), event=event, **(deferral.kwargs if keep_kwargs else {}))


def play(
    op: NcclProbeOperator, hook: FakeSlurmHook, endings: list[tuple[str, int, str]], *, keep_kwargs: bool = True
) -> Any:
    """Run execute() and then each probe job's ending in turn; return the final result."""
    deferral = deferred(lambda: op.execute(context()))
    for ending in endings[:-1]:
        deferral = deferred(
            lambda ending=ending, deferral=deferral: finish(op, hook, deferral, *ending, keep_kwargs=keep_kwargs)
        )
    return finish(op, hook, deferral, *endings[-1], keep_kwargs=keep_kwargs)


# ---------------------------------------------------------------------------------------------- candidate runs

P2P = {"NCCL_P2P_DISABLE": "1"}
THIRD = {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo,docker"}


@pytest.mark.parametrize(
    ("endings", "env"),
    [
        pytest.param([("COMPLETED", 0, OK_LOG)], {}, id="first-passes"),
        pytest.param([("FAILED", 124, HANG_LOG), ("COMPLETED", 0, OK_LOG)], P2P, id="hang-then-p2p-disable"),
        pytest.param(
            [("FAILED", 1, "TAO_NCCL_PROBE_FAILED: rank 1: NCCL error"), ("TIMEOUT", 0, ""), ("COMPLETED", 0, OK_LOG)],
            THIRD,
            id="error-wall-limit-third",
        ),
    ],
)
@pytest.mark.parametrize("keep_kwargs", [True, False], ids=["triggerer", "dags-test-event-only"])
def test_candidates_until_one_passes(
    endings: list[tuple[str, int, str]], env: dict[str, str], keep_kwargs: bool
) -> None:
    hook = cluster()
    assert play(operator(hook), hook, endings, keep_kwargs=keep_kwargs) == env
    ids = [str(501 + i) for i in range(len(endings))]
    assert [job_ids for job_ids, _ in hook.cancels] == [[i] for i in ids[:-1]]
    assert [name for _, name in hook.cancels] == [name for _, name, _, _ in hook.submits[:-1]]
    assert len({name for _, name, _, _ in hook.submits}) == len(endings)
    cached = json.loads(hook.files[CACHE])
    entry = cached["entries"]["multi-node/nccl"]
    assert (entry["env"], entry["slurm_job_id"], cached["cluster"], cached["partitions"], entry["image"]) == (
        env,
        ids[-1],
        "mini",
        ["polar"],
        IMAGE,
    )
    assert (entry["seen"]["driver"], entry["seen"]["nccl"]) == ("535.104.05", "2.18.1")
    assert hook.modes[CACHE] == "644"
    for index, candidate in enumerate([{}, P2P, THIRD][: len(endings)]):
        exports = [line for line in staged_script(hook, index).splitlines() if line.startswith("export NCCL_")]
        assert exports == [f"export {name}={quote(value)}" for name, value in candidate.items()]


@pytest.mark.parametrize(
    ("endings", "message", "submits"),
    [
        pytest.param(
            [("FAILED", 124, HANG_LOG)] * 3,
            "no candidate NCCL environment passed the all-reduce probe over 2 node(s) x 1 GPU(s) on cluster 'mini'",
            3,
            id="all-hang",
        ),
        pytest.param(
            [("FAILED", 1, "TAO_NCCL_PROBE_SETUP_ERROR: cannot import torch (No module named 'torch')")],
            "could not start on cluster 'mini': TAO_NCCL_PROBE_SETUP_ERROR: cannot import torch",
            1,
            id="no-torch-stops-at-once",
        ),
        pytest.param([("CANCELLED", 0, "")], "ended CANCELLED", 1, id="cancelled-stops"),
        pytest.param(
            [("COMPLETED", 0, "nothing printed")] * 3, "has no 'TAO_NCCL_PROBE_OK world=2' line", 3, id="no-marker"
        ),
    ],
)
def test_probe_failures(endings: list[tuple[str, int, str]], message: str, submits: int) -> None:
    hook = cluster()
    with pytest.raises(NcclProbeError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        play(operator(hook), hook, endings)
    assert len(hook.submits) == submits
    assert len(hook.cancels) == submits
    assert CACHE not in hook.files
    if submits == 3:
        assert str(info.value).count("\n- candidate ") == 3


def test_all_hang_message_lists_each_candidate() -> None:
    hook = cluster()
    with pytest.raises(NcclProbeError) as info:
        play(operator(hook), hook, [("FAILED", 124, HANG_LOG)] * 3)
    lines = [line for line in str(info.value).splitlines() if line.startswith("- ")]
    assert lines == [
        "- candidate 1/3 [(no NCCL settings)]: timeout (SLURM job 501): the all-reduce did not finish before the "
        "timeout (hung collective)",
        "- candidate 2/3 [NCCL_P2P_DISABLE=1]: timeout (SLURM job 502): the all-reduce did not finish before the "
        "timeout (hung collective)",
        "- candidate 3/3 [NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=^lo,docker]: timeout "
        "(SLURM job 503): the all-reduce did not finish before the timeout (hung collective)",
    ]


# ---------------------------------------------------------------------------------------------- cache


def cache_entry(
    env: dict[str, str],
    *,
    at: str = "2026-01-01T00:00:00Z",
    nodes: int = 2,
    backend: str = "nccl",
    image: str = IMAGE,
    driver: str = "535.104.05",
    previous: str | None = None,
) -> str:
    """The cache file after a probe of ``nodes`` proved ``env`` (added to ``previous``)."""
    key = cache_key("mini", ["polar"], nodes, backend, IMAGE)
    entry = CachedEnv(
        env=env,
        probed_at=at,
        slurm_job_id="77",
        nodes=nodes,
        gpus_per_node=1,
        backend=backend,
        image=image,
        seen=SeenVersions(nccl="2.18.1", driver=driver),
    )
    return cache_text(previous, key, entry)


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> str:
    """Pin the operator's clock: a day after the cached entries were proven."""
    monkeypatch.setattr("airflow_provider_tao_slurm.lifecycle.probe.utc_now", lambda: "2026-01-02T00:00:00Z")
    return "2026-01-02T00:00:00Z"


@pytest.mark.usefixtures("now")
def test_cache_hit_submits_nothing() -> None:
    hook = cluster({CACHE: cache_entry(P2P)})
    assert operator(hook).execute(context()) == P2P
    assert hook.reads == [CACHE]
    assert (hook.submits, hook.staged) == ([], [])


@pytest.mark.usefixtures("now")
@pytest.mark.parametrize(
    ("files", "kwargs"),
    [
        pytest.param({CACHE: cache_entry(P2P)}, {"force_reprobe": True}, id="force-reprobe"),
        pytest.param({CACHE: "{broken"}, {}, id="corrupt-cache"),
        pytest.param({}, {}, id="no-cache"),
        pytest.param(
            {
                CACHE: '{"cluster": "mini", "env": {"NCCL_P2P_DISABLE": "1"}, "gpus_per_node": 1, "nodes": 2, '
                '"probed_at": "2026-01-01T00:00:00Z", "scope": "multi-node", "slurm_job_id": "77", "version": 1}\n'
            },
            {},
            id="entry-of-the-previous-release",
        ),
        pytest.param({CACHE: cache_entry(P2P, at="2025-12-25T23:00:00Z")}, {}, id="expired-after-a-week"),
        pytest.param({CACHE: cache_entry(P2P)}, {"cache_max_age_hours": 12}, id="shorter-max-age"),
        pytest.param({CACHE: cache_entry(P2P, image="/lustre/u/containers/old.sqsh")}, {}, id="other-image"),
        pytest.param({CACHE: cache_entry(P2P, backend="gloo")}, {}, id="cpu-test-entry"),
        pytest.param(
            {CACHE: cache_entry({}, nodes=1, driver="550.54.15", at="2026-01-01T12:00:00Z", previous=cache_entry(P2P))},
            {},
            id="driver-changed-since",
        ),
    ],
)
def test_probes_without_a_usable_cache(files: dict[str, str], kwargs: dict[str, Any]) -> None:
    hook = cluster(files)
    assert play(operator(hook, **kwargs), hook, [("COMPLETED", 0, OK_LOG)]) == {}
    assert len(hook.submits) == 1
    entry = json.loads(hook.files[CACHE])["entries"]["multi-node/nccl"]
    assert (entry["env"], entry["probed_at"], entry["image"]) == ({}, "2026-01-02T00:00:00Z", IMAGE)


@pytest.mark.usefixtures("now")
def test_a_new_entry_keeps_the_other_scope_and_records_what_it_saw() -> None:
    single = cache_entry({"NCCL_IB_DISABLE": "1"}, nodes=1)
    hook = cluster({CACHE: single})
    assert play(operator(hook), hook, [("COMPLETED", 0, OK_LOG.replace("535.104.05", "550.54.15"))]) == {}
    cached = json.loads(hook.files[CACHE])
    assert sorted(cached["entries"]) == ["multi-node/nccl", "single-node/nccl"]
    assert (cached["latest"]["driver"], cached["latest"]["slurm_job_id"]) == ("550.54.15", "501")
    # The single-node entry saw driver 535: the next single-node run probes again instead of trusting it.
    again = cluster({CACHE: hook.files[CACHE]})
    deferred(lambda: operator(again, num_nodes=1, gpus_per_node=2).execute(context()))
    assert len(again.submits) == 1


# ---------------------------------------------------------------------------------------------- backends


@pytest.mark.parametrize(
    ("log", "exit_code", "native"),
    [
        pytest.param(GLOO_LOG, 0, "COMPLETED", id="gloo-result"),
        pytest.param(NO_CUDA_LOG, 1, "FAILED", id="probe-found-no-cuda"),
    ],
)
def test_nccl_required_without_cuda_fails_at_once(log: str, exit_code: int, native: str) -> None:
    """A probe that could not use NCCL is refused with the fix; the other candidates are not tried."""
    hook = cluster()
    with pytest.raises(NcclProbeError) as info:
        play(operator(hook), hook, [(native, exit_code, log)])
    message = str(info.value)
    assert "cannot prove NCCL: CUDA is not available in the container on partition polar" in message
    assert "Check the image" in message
    assert "--container-image" in message
    assert "/lustre/u/logs/" in message
    assert len(hook.submits) == 1
    assert CACHE not in hook.files


def test_cpu_test_runs_gloo_and_caches_it_apart() -> None:
    hook = cluster()
    op = operator(hook, backend="gloo")
    assert play(op, hook, [("COMPLETED", 0, GLOO_LOG)]) == {}
    assert staged_script(hook, 0).rstrip().count("nccl_probe.py --backend gloo") == 1
    entries = json.loads(hook.files[CACHE])["entries"]
    assert list(entries) == ["multi-node/gloo"]
    assert entries["multi-node/gloo"]["backend"] == "gloo"
    # The CPU test's entry never answers a run that requires NCCL.
    nccl = cluster({CACHE: hook.files[CACHE]})
    deferred(lambda: operator(nccl).execute(context()))
    assert len(nccl.submits) == 1


def test_backend_is_templated() -> None:
    assert "backend" in NcclProbeOperator.template_fields


def test_one_gpu_needs_no_probe() -> None:
    hook = cluster()
    assert operator(hook, num_nodes=1, gpus_per_node=1).execute(context()) == {}
    assert (hook.reads, hook.submits) == ([], [])


# ---------------------------------------------------------------------------------------------- the job


def test_first_job_is_staged_submitted_and_deferred() -> None:
    hook = cluster()
    deferral = deferred(lambda: operator(hook, timeout_seconds=120, poll_interval_seconds=3).execute(context()))
    (base, files), ((script_path, name, log_dir, _extra),) = hook.staged[0], hook.submits
    assert base == "/lustre/u"
    assert script_path == f"/lustre/u/jobs/{name}/sbatch/job_{name}.sbatch"
    assert log_dir == "/lustre/u/logs"
    assert files[f"jobs/{name}/inputs/nccl_probe.py"] == (PROGRAM, 0o644)
    assert files[f"jobs/{name}/sbatch/job_{name}.sbatch"][1] == 0o700
    script = staged_script(hook, 0)
    for line in (
        f"#SBATCH --job-name={name}",
        "#SBATCH --partition=polar",
        "#SBATCH --account=gpu_proj",
        "#SBATCH --nodes=2",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --time=00:04:00",
        "#SBATCH --wait-all-nodes=1",
        "#SBATCH --no-requeue",
        '    tao-step 120 \'exec python3 -m torch.distributed.run --nnodes="$TAO_NODE_COUNT" '
        '--nproc-per-node="$TAO_GPUS_PER_NODE" --node-rank="$TAO_NODE_RANK" --master-addr="$MASTER_ADDR" '
        f'--master-port="$MASTER_PORT" /lustre/u/jobs/{name}/inputs/nccl_probe.py --backend nccl\'',
    ):
        assert line in script.splitlines()
    trigger = deferral.trigger
    assert isinstance(trigger, SlurmJobTrigger)
    assert (trigger.slurm_job_id, trigger.job_name, trigger.poll_interval) == ("501", name, 3.0)
    assert deferral.method_name == "execute_complete"
    assert deferral.kwargs["job_names"][0] == name
    assert deferral.kwargs["outcomes"] == []
    assert json.loads(json.dumps(deferral.kwargs)) == deferral.kwargs


def test_single_node_with_several_gpus() -> None:
    hook = cluster()
    op = operator(hook, num_nodes=1, gpus_per_node=4, python="/opt/venv/bin/python")
    deferral = deferred(lambda: op.execute(context()))
    script = staged_script(hook, 0)
    assert "#SBATCH --gres=gpu:4" in script.splitlines()
    assert "--wait-all-nodes" not in script
    assert "--standalone --nnodes=1 --nproc-per-node=4" in script
    ok = OK_LOG.replace("world=2", "world=4")
    assert finish(op, hook, deferral, "COMPLETED", 0, ok) == {}
    assert list(json.loads(hook.files[CACHE])["entries"]) == ["single-node/nccl"]


def test_job_names_are_per_try_and_per_candidate() -> None:
    first, second = cluster(), cluster()
    names_1 = deferred(lambda: operator(first).execute(context(try_number=1))).kwargs["job_names"]
    names_2 = deferred(lambda: operator(second).execute(context(try_number=2))).kwargs["job_names"]
    again = deferred(lambda: operator(cluster()).execute(context(try_number=1))).kwargs["job_names"]
    assert len(set(names_1)) == len(set(names_2)) == 3
    assert not set(names_1) & set(names_2)
    assert names_1 == again


def test_event_for_another_job_is_refused() -> None:
    hook = cluster()
    op = operator(hook)
    deferral = deferred(lambda: op.execute(context()))
    event = {"status": "terminal", "slurm_job_id": "999", "job_name": "tao-other-0123456789abcdef"}
    with pytest.raises(NcclProbeError, match="which is not the end of one of this task's probe jobs"):
        op.execute_complete(context(), event=event, **deferral.kwargs)


# ---------------------------------------------------------------------------------------------- validation first


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        pytest.param(
            {"image": "nvcr.io/nvidia/pytorch:24.01-py3"}, ImageReferenceError, "registry reference", id="registry"
        ),
        pytest.param({"timeout_seconds": 5}, ValidationError, "give at least 10", id="short-timeout"),
        pytest.param(
            {"timeout_seconds": 4 * 3600}, ResourceError, "partition polar allows at most 4 h", id="long-timeout"
        ),
        pytest.param({"num_nodes": 0}, ResourceError, "num_nodes=0 must be at least 1", id="no-nodes"),
        pytest.param({"gpus_per_node": 9}, ResourceError, "gpus_per_node=9 cannot start on polar", id="nine-gpus"),
        pytest.param(
            {"force_reprobe": "yes"}, ValidationError, "force_reprobe='yes' must be True or False", id="force-text"
        ),
        pytest.param({"poll_interval_seconds": 0}, ValidationError, "poll_interval_seconds=0", id="poll"),
        pytest.param(
            {"candidate_envs": [{}, {"MASTER_ADDR": "n9"}]},
            ValidationError,
            r"candidate_envs\[1\] cannot be used: environment variable MASTER_ADDR is set by the sbatch template",
            id="rendezvous-name",
        ),
        pytest.param(
            {"candidate_envs": [{"NCCL_P2P_DISABLE": 1}]}, ValidationError, "give the value as a string", id="int"
        ),
        pytest.param({"backend": "cpu"}, ValidationError, "backend='cpu' must be 'nccl'", id="backend"),
        pytest.param(
            {"cache_max_age_hours": 0}, ValidationError, "cache_max_age_hours=0 must be a positive", id="max-age"
        ),
    ],
)
def test_bad_inputs_fail_before_the_cluster(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    hook = cluster()
    with pytest.raises(error, match=message):
        operator(hook, **kwargs).execute(context())
    assert (hook.reads, hook.staged, hook.submits) == ([], [], [])


# ---------------------------------------------------------------------------------------------- into the submit


@pytest.mark.parametrize(
    ("nccl_env", "exports"),
    [
        pytest.param({}, [], id="probe-needed-nothing"),
        pytest.param(P2P, ["export NCCL_P2P_DISABLE=1"], id="probe-found-p2p-disable"),
    ],
)
def test_probe_output_feeds_a_multi_node_submit(nccl_env: dict[str, str], exports: list[str]) -> None:
    hook = cluster()
    submit = SbatchSubmitOperator(
        task_id="submit", image=IMAGE, command="train.sh", num_nodes=2, gpus_per_node=1, nccl_env=nccl_env
    )
    submit.__dict__["hook"] = hook
    handle = submit.execute(context())
    assert handle["slurm_job_id"] == "501"
    script = staged_script(hook, 0).splitlines()
    assert [line for line in script if line.startswith("export NCCL_")] == exports
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --wait-all-nodes=1",
        "export WORLD_SIZE=2",
    ):
        assert line in script


def test_multi_node_submit_without_probe_result_is_refused() -> None:
    hook = cluster()
    submit = SbatchSubmitOperator(task_id="submit", image=IMAGE, command="train.sh", num_nodes=2, gpus_per_node=1)
    submit.__dict__["hook"] = hook
    with pytest.raises(ValidationError, match="put NcclProbeOperator upstream and pass its output as nccl_env"):
        submit.execute(context())
    assert (hook.staged, hook.submits) == ([], [])


class WaitingHook(FakeSlurmHook):
    """Answers status queries with each probe job's ending in turn (the worker-side wait)."""

    def __init__(self, endings: list[tuple[str, int, str]]) -> None:
        super().__init__(settings=SETTINGS)
        self.endings = list(endings)

    def get_states(self, job_ids: Iterable[str], *, since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        (slurm_id,) = job_ids
        native, exit_code, log = self.endings.pop(0)
        self.files[f"/lustre/u/logs/{self.submits[-1].job_name}-{slurm_id}/main.out"] = log
        self.states[slurm_id] = state_from_native(
            slurm_id, native, source="sacct", exit_code=exit_code, end="2026-12-04T05:08:30"
        )
        return super().get_states([slurm_id], since=since)


def test_non_deferrable_probe_waits_for_each_candidate_in_the_worker() -> None:
    hook = WaitingHook([("FAILED", 124, HANG_LOG), ("COMPLETED", 0, OK_LOG)])

    assert operator(hook, deferrable=False, poll_interval_seconds=0.01).execute(context()) == P2P

    assert hook.polls == [["501"], ["502"]]
    assert [job_ids for job_ids, _ in hook.cancels] == [["501"]]
