"""sbatch rendering: golden files, validation, and the rendered scripts run against a fake srun.

Rewrite the golden files with ``UPDATE_GOLDEN=1 pytest tests/unit/core/test_templates.py``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.continuation import (
    LATEST_CHECKPOINT_ENV,
    PROGRAM_TIMEOUT_EXIT,
    SLICE_ENV,
    SLICE_SIGNAL,
    SliceScript,
    ends_slice,
    grace_seconds,
    slice_marker,
)
from airflow_provider_tao_slurm.core.failures import classify
from airflow_provider_tao_slurm.core.resources import build_resources
from airflow_provider_tao_slurm.core.secrets import lint_script
from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.core.states import ErrClass, state_from_native
from airflow_provider_tao_slurm.core.templates import (
    MULTI_NODE_TEMPLATE,
    SINGLE_NODE_TEMPLATE,
    SbatchSpec,
    render_sbatch,
    render_template,
    resource_fields,
    template_dir,
)
from airflow_provider_tao_slurm.exceptions import (
    ImageReferenceError,
    ResourceError,
    TemplateRenderError,
    ValidationError,
)

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[3]

BASE = SbatchSpec(
    job_name="tao-20240601-abc123",
    partition="polar,polar3,polar4,grizzly",
    num_nodes=1,
    gpus_per_node=4,
    cpus_per_task=16,
    time="04:00:00",
    timeout_seconds=13680,
    log_dir="/lustre/proj/results/logs",
    job_dir="/lustre/proj/results/jobs/tao-20240601-abc123",
    image="/lustre/proj/images/nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh",
    command="classification_pyt train -e /lustre/proj/results/jobs/tao-20240601-abc123/specs/spec.yaml",
    exit_code_file="/lustre/proj/results/jobs/tao-20240601-abc123/exit_codes",
    ends_dir="/lustre/proj/results/ends",
    container_mounts="/lustre/proj:/lustre/proj",
)

HOSTILE_COMMAND = (
    'echo "started $(date +%s)" `whoami`; rm -rf /tmp/x\n'
    "python train.py --msg 'it'\"'\"'s' \\\n"
    "  --name \"a b\" && echo '$HOME stays literal here'"
)

GOLDEN_CASES: dict[str, SbatchSpec] = {
    "single_default": BASE,
    "single_env_sidecar": replace(
        BASE,
        account="proj_ml",
        exclude_nodes=("gpu05", "gpu[10-12]"),
        requeue=False,
        env={"TAO_LOG_LEVEL": "INFO", "HF_HOME": "/lustre/proj/hf-cache"},
        sidecar="/lustre/proj/results/jobs/tao-20240601-abc123/.secrets.env",
    ),
    "single_8gpu_exclusive": replace(
        BASE,
        gpus_per_node=8,
        cpus_per_task=64,
        exclusive=True,
        mem_mb=480000,
        sbatch_extra=("--qos=high", "--constraint=a100&ib"),
        nccl_env={"NCCL_DEBUG": "WARN"},
    ),
    "multi_2x1_nccl": replace(
        BASE,
        num_nodes=2,
        gpus_per_node=1,
        nccl_env={"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_P2P_DISABLE": "1"},
    ),
    "hostile_values": replace(
        BASE,
        job_dir="/lustre/proj/my jobs/it's here",
        exit_code_file="/lustre/proj/my jobs/it's here/exit_codes",
        ends_dir="/lustre/proj/my jobs/it's $(ends)",
        image='/lustre/proj/my images/it\'s "tao".sqsh',
        container_mounts="/lustre/my data:/data,/lustre/it's:/x",
        command=HOSTILE_COMMAND,
        env={"MSG": "say \"hi\" and 'bye' $HOME `id` $(id); done\nnext line"},
        sidecar="/lustre/proj/my jobs/it's here/.secrets env",
    ),
    "single_slice": replace(
        BASE,
        time="00:30:00",
        timeout_seconds=1700,
        slice=SliceScript(
            slices_dir="/lustre/proj/results/jobs/tao-20240601-abc123/slices",
            grace_seconds=180,
            results_dir="/lustre/proj/results/results/tao-20240601-abc123",
        ),
    ),
    "single_slice_1min_timeout": replace(
        BASE,
        time="00:01:00",
        timeout_seconds=45,
        slice=SliceScript(
            slices_dir="/lustre/proj/results/jobs/tao-20240601-abc123/slices",
            grace_seconds=10,
            results_dir="/lustre/proj/results/results/tao-20240601-abc123",
            stop_at_timeout=True,
        ),
    ),
    "multi_2x1_slice_signal": replace(
        BASE,
        num_nodes=2,
        gpus_per_node=1,
        nccl_env={"NCCL_IB_DISABLE": "1"},
        slice=SliceScript(
            slices_dir="/lustre/proj/my jobs/it's $(here)/slices",
            grace_seconds=600,
            results_dir="/lustre/proj/my results/it's `here`",
            checkpoint_globs=("*.pth", "model_[0-9]*.ckpt"),
            checkpoint_signal="USR2",
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES), ids=sorted(GOLDEN_CASES))
def test_render_matches_golden(case: str) -> None:
    rendered = render_sbatch(GOLDEN_CASES[case])
    path = GOLDEN / f"{case}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_bytes(rendered.encode())
    assert rendered.encode() == path.read_bytes()


GOLDEN_FILES = sorted(GOLDEN.glob("*.sbatch"))


def test_every_golden_file_has_a_case() -> None:
    assert sorted(path.stem for path in GOLDEN_FILES) == sorted(GOLDEN_CASES)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[path.stem for path in GOLDEN_FILES])
def test_golden_is_valid_bash_and_secret_free(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert lint_script(path.read_text()) == []


COMMON_DIRECTIVES = [
    "#!/bin/bash\n",
    "#SBATCH --job-name=tao-20240601-abc123\n",
    "#SBATCH --output=/lustre/proj/results/logs/%x-%j/main.out\n",
    "#SBATCH --error=/lustre/proj/results/logs/%x-%j/main.err\n",
    "#SBATCH --open-mode=append\n",
    "#SBATCH --export=ALL\n",
    "#SBATCH --partition=polar,polar3,polar4,grizzly\n",
    "#SBATCH --ntasks-per-node=1\n",
    "#SBATCH --cpus-per-task=16\n",
    "#SBATCH --time=04:00:00\n",
    "srun --input=none --export=ALL ",
    "--no-container-mount-home",
    'TAO_SLURM_STEP_RC=$?\necho "TAO_SLURM: step exit code ${TAO_SLURM_STEP_RC}"\n',
    'exit "${TAO_SLURM_STEP_RC}"\n',
]


@pytest.mark.parametrize(
    ("spec", "present", "absent"),
    [
        pytest.param(
            BASE,
            [*COMMON_DIRECTIVES, "#SBATCH --nodes=1\n", "#SBATCH --gres=gpu:4\n", "#SBATCH --requeue\n",
             "    timeout 13680 bash -c \"${TAO_SLURM_STEP_NOTER}\" tao-step 'classification_pyt train -e ",
             "export MASTER_ADDR=127.0.0.1\n",
             "if ! MASTER_PORT=$(tao_slurm_free_port); then\n", "export TAO_GPUS_PER_NODE=4\n"],
            ["--account", "--exclusive", "--exclude", "--wait-all-nodes", "TAO_SLURM_ENV_FILE", "--mem",
             "export MASTER_PORT="],
            id="single-default",
        ),
        pytest.param(
            GOLDEN_CASES["single_env_sidecar"],
            ["#SBATCH --account=proj_ml\n", "#SBATCH --no-requeue\n", "#SBATCH --exclude=gpu05,gpu[10-12]\n",
             "export TAO_LOG_LEVEL=INFO\n", "set -a\n", "    rm -f -- \"${TAO_SLURM_ENV_FILE}\"\n",
             "trap tao_slurm_end EXIT\n"],
            ["#SBATCH --requeue\n"],
            id="single-sidecar",
        ),
        pytest.param(
            GOLDEN_CASES["single_8gpu_exclusive"],
            ["#SBATCH --gres=gpu:8\n", "#SBATCH --exclusive\n", "#SBATCH --mem=480000M\n",
             "#SBATCH --qos=high\n", "#SBATCH --constraint=a100&ib\n", "export NCCL_DEBUG=WARN\n"],
            [],
            id="single-8gpu",
        ),
        pytest.param(
            GOLDEN_CASES["multi_2x1_nccl"],
            [*COMMON_DIRECTIVES, "#SBATCH --nodes=2\n", "#SBATCH --gres=gpu:1\n", "#SBATCH --wait-all-nodes=1\n",
             "export WORLD_SIZE=2\n", "export NUM_GPU_PER_NODE=1\n",
             "if ! MASTER_PORT=$(tao_slurm_free_port); then\n",
             "export TAO_NODE_COUNT=2\n", "export TAO_GPUS_PER_NODE=1\n", "export NCCL_SOCKET_IFNAME=eth0\n",
             "\nexport NODE_RANK=\"${SLURM_NODEID}\" TAO_NODE_RANK=\"${SLURM_NODEID}\"\n",
             "    bash -c \"${TAO_SLURM_STEP_START}\" \\\n    tao-step 13680 'classification_pyt train -e "],
            ["timeout 13680 bash -c 'classification"],
            id="multi-node",
        ),
    ],
)  # fmt: skip
def test_render_directives(spec: SbatchSpec, present: list[str], absent: list[str]) -> None:
    script = render_sbatch(spec)
    assert [text for text in present if text not in script] == []
    assert [text for text in absent if text in script] == []


@pytest.mark.parametrize(
    ("changes", "error", "fragment"),
    [
        pytest.param({"job_name": "bad name"}, ValidationError, "job_name", id="job-name-space"),
        pytest.param({"job_name": "ok\n#SBATCH --x"}, ValidationError, "job_name", id="job-name-newline"),
        pytest.param({"job_name": "name\n"}, ValidationError, "job_name", id="job-name-trailing-newline"),
        pytest.param({"partition": "polar; rm"}, ValidationError, "partition", id="partition"),
        pytest.param({"partition": "polar,"}, ValidationError, "partition", id="partition-stray-comma"),
        pytest.param({"account": "acc'x"}, ValidationError, "account", id="account"),
        pytest.param({"exclude_nodes": ("n1 n2",)}, ValidationError, "exclude_nodes", id="exclude"),
        pytest.param({"log_dir": "/logs/my logs"}, ValidationError, "log_dir", id="log-dir-space"),
        pytest.param({"log_dir": "/logs/%u"}, ValidationError, "log_dir", id="log-dir-percent"),
        pytest.param({"log_dir": "logs"}, ValidationError, "log_dir", id="log-dir-relative"),
        pytest.param({"time": "4:00:00:00"}, ResourceError, "SLURM time", id="time-format"),
        pytest.param({"time": "04:00:00\n"}, ValidationError, "time", id="time-newline"),
        pytest.param({"time": "UNLIMITED"}, ValidationError, "time", id="time-unlimited"),
        pytest.param({"timeout_seconds": 14400}, ResourceError, "shorter than the wall time", id="timeout-eq"),
        pytest.param({"gpus_per_node": 0}, ResourceError, "gpus_per_node", id="gpus-zero"),
        pytest.param({"num_nodes": True}, ResourceError, "num_nodes", id="nodes-bool"),
        pytest.param({"cpus_per_task": "16"}, ResourceError, "cpus_per_task", id="cpus-str"),
        pytest.param({"mem_mb": 0}, ResourceError, "mem_mb", id="mem-zero"),
        pytest.param({"requeue": "false"}, ValidationError, "requeue must be True or False", id="requeue-str"),
        pytest.param({"image": "nvcr.io#nvidia/tao:5.5"}, ImageReferenceError, ".sqsh", id="image-registry"),
        pytest.param({"image": "images/tao.sqsh"}, ImageReferenceError, ".sqsh", id="image-relative"),
        pytest.param({"command": "  \n"}, ValidationError, "command is empty", id="command-empty"),
        pytest.param({"command": "a\x00b"}, ValidationError, "NUL", id="command-nul"),
        pytest.param({"container_mounts": " "}, ValidationError, "container_mounts", id="mounts-empty"),
        pytest.param({"job_dir": "jobs/x"}, ValidationError, "job_dir", id="job-dir-relative"),
        pytest.param({"exit_code_file": "exit"}, ValidationError, "exit_code_file", id="exit-file-relative"),
        pytest.param({"sidecar": "s.env"}, ValidationError, "sidecar", id="sidecar-relative"),
        pytest.param({"env": {"1BAD": "x"}}, ValidationError, "'1BAD'", id="env-name-digit"),
        pytest.param({"env": {"A B": "x"}}, ValidationError, "'A B'", id="env-name-space"),
        pytest.param({"env": {"A\n": "x"}}, ValidationError, "'A\\n'", id="env-name-newline"),
        pytest.param({"env": {"WORLD_SIZE": "8"}}, ValidationError, "WORLD_SIZE", id="env-rendezvous"),
        pytest.param({"env": {"SLURM_NODEID": "0"}}, ValidationError, "SLURM_NODEID", id="env-slurm"),
        pytest.param({"env": {"TAO_SLURM_STEP_RC": "0"}}, ValidationError, "TAO_SLURM_STEP_RC", id="env-own"),
        pytest.param({"env": {"N": 1}}, ValidationError, "must be a string", id="env-value-int"),
        pytest.param(
            {"env": {"NCCL_DEBUG": "INFO"}, "nccl_env": {"NCCL_DEBUG": "WARN"}},
            ValidationError, "NCCL_DEBUG", id="env-duplicate",
        ),
        pytest.param({"sbatch_extra": ("--qos high",)}, ValidationError, "sbatch_extra", id="extra-space"),
        pytest.param({"sbatch_extra": ("qos=high",)}, ValidationError, "sbatch_extra", id="extra-no-dashes"),
        pytest.param({"sbatch_extra": ("--qos=a\nb",)}, ValidationError, "sbatch_extra", id="extra-newline"),
        pytest.param({"sbatch_extra": ("--output=/tmp/x",)}, ValidationError, "--output", id="extra-managed"),
        pytest.param({"sbatch_extra": ("--container-image=/x.sqsh",)}, ValidationError, "--container-image",
                     id="extra-container"),
    ],
)  # fmt: skip
def test_render_rejects(changes: dict[str, Any], error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as raised:
        render_sbatch(replace(BASE, **changes))
    assert fragment in str(raised.value)


def test_secret_values_never_reach_validation_messages() -> None:
    with pytest.raises(ValidationError) as raised:
        render_sbatch(replace(BASE, env={"GOOD": "s3cr3t-value", "bad name": "other-s3cr3t"}))
    assert "s3cr3t" not in str(raised.value)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        pytest.param({"A": "x"}, "placeholder(s) B, C", id="missing-named"),
        pytest.param({"A": "@@B@@", "B": "y", "C": "z"}, "@@B@@", id="leftover-from-value"),
    ],
)
def test_render_template_errors(
    values: dict[str, object], fragment: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "t.j2").write_text("@@A@@ @@ B @@ @@% if C %@@c@@% endif %@@\n")
    monkeypatch.setattr("airflow_provider_tao_slurm.core.templates.template_dir", lambda: tmp_path)
    with pytest.raises(TemplateRenderError) as raised:
        render_template("t.j2", values)
    assert fragment in str(raised.value)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        pytest.param(None, "cannot be read", id="missing-file"),
        pytest.param("@@% if A %@@ never closed\n", "is invalid", id="syntax"),
        pytest.param('@@% include "gone.sh.j2" %@@\n', "gone.sh.j2 cannot be read", id="missing-include"),
    ],
)
def test_render_template_bad_template(
    source: str | None, fragment: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if source is not None:
        (tmp_path / "t.j2").write_text(source)
    monkeypatch.setattr("airflow_provider_tao_slurm.core.templates.template_dir", lambda: tmp_path)
    with pytest.raises(TemplateRenderError, match=fragment):
        render_template("t.j2", {"A": 1})


def test_bash_syntax_is_left_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = '${X:-1} { a; b; } # c {# d #} {{ e }} {% f %} "$@" ${arr[@]} @@V@@\n'
    (tmp_path / "t.j2").write_text(source)
    monkeypatch.setattr("airflow_provider_tao_slurm.core.templates.template_dir", lambda: tmp_path)
    assert render_template("t.j2", {"V": "v"}) == source.replace("@@V@@", "v")


def test_templates_found_and_packaged_at_the_looked_up_path() -> None:
    found = template_dir()
    assert {SINGLE_NODE_TEMPLATE, MULTI_NODE_TEMPLATE} <= {entry.name for entry in found.iterdir()}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    force_include = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert force_include["templates/slurm"] == "airflow_provider_tao_slurm/templates/slurm"


# --- the rendered scripts run under bash with a fake srun and scontrol ---------------------------

FAKE_SRUN = r"""#!/bin/bash
# Record the arguments (NUL separated), drop the leading srun options, run the command once per node
# (with --label, each line of its stdout and stderr prefixed with its task number, as srun does).
# With FAKE_DIR/signal-step, slurmstepd as a preemption's grace time starts: each time the program says it
# is ready (it creates FAKE_DIR/ready, removed here), SIGTERM to that node's task: to its first process only
# when the file says "first" (proctrack/cgroup), else to every process of it (proctrack/linuxproc).
printf '%s\0' "$@" > "$FAKE_DIR/srun.args"
if [ -n "${FAKE_SRUN_HANG:-}" ]; then : > "$FAKE_DIR/srun.started"; exec sleep 30; fi
set -o pipefail
nodes=1
label=
while [ $# -gt 0 ]; do
    case "$1" in --nodes=*) nodes="${1#--nodes=}"; shift ;; --label) label=1; shift ;; --*) shift ;; *) break ;; esac
done
task=()
signaller=
if [ -e "$FAKE_DIR/signal-step" ]; then
    task=(bash -c 'echo "$$" > "$FAKE_DIR/task.pid"; exec "$@"' fake-task)
    tree() {
        local pid
        for pid in "$@"; do echo "$pid"; tree $(cat /proc/"$pid"/task/*/children 2> /dev/null); done
    }
    (
        while :; do
            while [ ! -e "$FAKE_DIR/ready" ]; do sleep 0.02; done
            rm -f "$FAKE_DIR/ready"
            pids=$(cat "$FAKE_DIR/task.pid")
            [ "$(cat "$FAKE_DIR/signal-step")" = first ] || pids=$(tree $pids)
            kill -s TERM $pids
        done
    ) > /dev/null 2>&1 &
    signaller=$!
fi
rc=0
for ((node = 0; node < nodes; node++)); do
    if [ -n "$label" ]; then
        ( { SLURM_NODEID=$node "${task[@]}" "$@" < /dev/null | sed "s/^/$node: /"; } 2>&1 1>&3 \
            | sed "s/^/$node: /" >&2 ) 3>&1
    else
        SLURM_NODEID=$node "${task[@]}" "$@" < /dev/null
    fi
    status=$?
    if [ "$status" -gt "$rc" ]; then rc=$status; fi
done
[ -z "$signaller" ] || kill "$signaller"
exit "$rc"
"""
# The slice's echo of its partition and limit (``squeue -o "%P %l"``): without it the machine's own squeue ran,
# and with its cluster down took seconds to fail, long enough to delay a warning's trap past its moment.
FAKE_SQUEUE = """#!/bin/bash
[ "$1 $2 $3" = "-h -j 4242" ] && echo "polar 4:00:00"
exit 0
"""
FAKE_SCONTROL = """#!/bin/bash
# A slice's cap (``update JobId=... TimeLimit=...``) is taken, or refused while FAKE_DIR/update-refused exists.
if [ "$1" = update ] && [ -e "$FAKE_DIR/update-refused" ]; then
    printf 'slurm_update error: Unable to contact slurm controller\\n(connect failure)\\n' >&2
    exit 1
fi
[ "$1 $2" = "show hostnames" ] && [ "$3" = "n[1-2]" ] && printf 'n1\\nn2\\n'
if [ "$1 $2 $3 $4" = "--local show job -o" ]; then
    shift  # --local: the one RPC a job's question of itself needs (no federation lookup)
    # What SLURM 22.05 prints while the batch script ends; FAKE_JOB_RESTARTS is the scheduler's restart count
    # (one past the run's SLURM_RESTART_COUNT once SLURM requeues the job), FAKE_JOB_REASON its Reason,
    # FAKE_PREEMPT_TIME when slurmctld began preempting it (while FAKE_DIR/preempting exists), FAKE_START_TIME
    # and FAKE_END_TIME its start and end; FAKE_SCONTROL_DOWN (or FAKE_DIR/scontrol-down): no answer. Each
    # answer adds a line to FAKE_DIR/scontrol.asked.
    if [ -n "${FAKE_SCONTROL_DOWN:-}" ] || [ -e "$FAKE_DIR/scontrol-down" ]; then
        echo 'Unable to contact slurm controller' >&2
        exit 1
    fi
    preempt=None
    [ -e "$FAKE_DIR/preempting" ] && preempt="${FAKE_PREEMPT_TIME:-None}"
    echo "$4" >> "$FAKE_DIR/scontrol.asked"
    echo "JobId=$4 JobName=tao-x UserId=u(1001) GroupId=u(1001) MCS_label=N/A Priority=1 Nice=0 Account=a QOS=normal" \\
        "JobState=COMPLETING Reason=${FAKE_JOB_REASON:-None} Dependency=(null) Requeue=1" \\
        "Restarts=${FAKE_JOB_RESTARTS:-0} BatchFlag=1 Reboot=0 ExitCode=0:0 Comment=x_Restarts=9 Reason=NodeDown" \\
        "StartTime=${FAKE_START_TIME:-Unknown} EndTime=${FAKE_END_TIME:-Unknown}" \\
        "PreemptEligibleTime=2026-12-06T10:00:00 PreemptTime=$preempt SuspendTime=None SecsPreSuspend=0"
fi
exit 0
"""


class Run:
    """A rendered script run under bash in a scratch job directory."""

    def __init__(self, tmp_path: Path, **changes: Any) -> None:
        self.job_dir = tmp_path / "job dir 'x'"
        self.job_dir.mkdir()
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("squeue", FAKE_SQUEUE)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.exit_code_file = self.job_dir / "exit_codes"
        self.sidecar = self.job_dir / ".secrets.env"
        self.out = self.job_dir / "out.txt"
        self.ends = tmp_path / "ends $(x) 'y'"
        self.ends.mkdir()
        spec = replace(
            BASE,
            job_dir=str(self.job_dir),
            exit_code_file=str(self.exit_code_file),
            sidecar=str(self.sidecar),
            ends_dir=str(self.ends),
        )
        self.script = tmp_path / "job.sbatch"
        self.script.write_text(render_sbatch(replace(spec, **changes)))
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "FAKE_DIR": str(self.job_dir),
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "n[1-2]",
        }

    def write_sidecar(self, text: str) -> None:
        self.sidecar.write_text(text)
        self.sidecar.chmod(0o600)

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.script)], env=self.env, capture_output=True, text=True, timeout=60, check=False
        )

    def srun_args(self) -> list[str]:
        return (self.job_dir / "srun.args").read_text().split("\0")[:-1]


#: The shapes the step takes in the script: the plain one (timeout the task's first process; on several nodes
#: through a shell that becomes timeout), a slice's (srun in the background) and a slice's with
#: checkpoint_signal (the relay is the task's first process).
SHAPES = [f"{nodes}-{kind}" for kind in ("plain", "slice", "relay") for nodes in ("single-node", "multi-node")]


def shaped(tmp_path: Path, shape: str, **changes: Any) -> Run:
    """A run of the script whose step has ``shape``; a slice's program runs under ``timeout_seconds`` too."""
    if shape.startswith("multi-node"):
        changes.update(num_nodes=2, gpus_per_node=1)
    if not shape.endswith("plain"):
        changes["slice"] = SliceScript(
            str(tmp_path / "slices"),
            30,
            str(tmp_path / "results"),
            checkpoint_signal="USR1" if shape.endswith("relay") else None,
            stop_at_timeout=True,
        )
    return Run(tmp_path, **changes)


def in_preemption(run: Run) -> None:
    """slurmctld shows the job's preemption under way (PreemptTime) while FAKE_DIR/preempting exists."""
    run.env["FAKE_PREEMPT_TIME"] = "2026-12-06T10:05:00"
    (run.job_dir / "preempting").touch()


def signal_the_step(run: Run, how: str = "first") -> None:
    """The fake srun sends the step SIGTERM as a preemption's grace time starts (see FAKE_SRUN)."""
    (run.job_dir / "signal-step").write_text(how)


def on_sigterm(code: int) -> str:
    """A program that runs until SIGTERM reaches it, then exits ``code`` (0: as a program that saves and exits)."""
    return f'trap "exit {code}" TERM; sleep 30 & : > "$FAKE_DIR/ready"; wait'


def asked(run: Run) -> int:
    """How many times the script asked slurmctld about its job (``scontrol show job``)."""
    path = run.job_dir / "scontrol.asked"
    return len(path.read_text().splitlines()) if path.exists() else 0


def notes(run: Run) -> list[str]:
    """The notes of a signalled step left in the job directory."""
    return sorted(path.name for path in run.job_dir.glob("step-signalled-*"))


def test_run_single_node_exit_code_sidecar_and_quoting(tmp_path: Path) -> None:
    env_value = "say \"hi\" and 'bye' $HOME `id` $(id); done\nnext line"
    command = (
        'printf "%s|%s|%s\\n" "$MY_SECRET" "$MSG" "$(echo sub)"; echo `echo tick`; echo "a;b"\n'
        "echo 'it'\"'\"'s'; exit 7"
    )
    run = Run(tmp_path, command=command, env={"MSG": env_value}, image="/images/my img/it's.sqsh")
    run.write_sidecar("export MY_SECRET='s3cr3t value'\n")

    result = run.run()

    assert result.returncode == 7
    lines = result.stdout.splitlines()
    assert lines[lines.index("TAO_SLURM: step start") + 1 :] == [
        f"s3cr3t value|{env_value.splitlines()[0]}",
        f"{env_value.splitlines()[1]}|sub",
        "tick",
        "a;b",
        "it's",
        "TAO_SLURM: step exit code 7",
        "TAO_SLURM: end",
        "TAO_SLURM: credentials file removed (SLURM will not run the job again)",
    ]
    assert "s3cr3t" not in result.stderr
    assert run.exit_code_file.read_text() == "7\n"
    assert not run.sidecar.exists(), "a program failure is the job's end: the script removes the sidecar"
    args = run.srun_args()
    assert args[:5] == ["--input=none", "--export=ALL", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=16"]
    assert "--container-image=/images/my img/it's.sqsh" in args
    assert "--no-container-mount-home" in args
    start = args.index("timeout")
    assert args[start : start + 4] == ["timeout", "13680", "bash", "-c"]
    assert args[start + 5 :] == ["tao-step", command, str(run.job_dir / "step-signalled-4242-0")]


@pytest.mark.parametrize(
    ("command", "timeout_seconds", "rc", "marker"),
    [
        pytest.param("true", 13680, 0, "TAO_SLURM: step exit code 0", id="success"),
        pytest.param("exit 3", 13680, 3, "TAO_SLURM: step exit code 3", id="failure"),
        pytest.param("sleep 5", 1, 124, "TAO_SLURM: program stopped by timeout after 1 s", id="timeout"),
    ],
)
def test_run_exit_code_is_the_step_exit_code(
    tmp_path: Path, command: str, timeout_seconds: int, rc: int, marker: str
) -> None:
    run = Run(tmp_path, command=command, timeout_seconds=timeout_seconds, sidecar=None)
    result = run.run()
    assert (result.returncode, marker in result.stdout.splitlines()) == (rc, True)
    assert run.exit_code_file.read_text() == f"{rc}\n"
    assert sorted(path.name for path in run.ends.iterdir()) == [f"4242-0-{rc}.end"]


@pytest.mark.parametrize(
    ("changes", "restart", "expected"),
    [
        pytest.param({"command": "exit 9"}, "2", ["4242-2-9.end"], id="third-run"),
        pytest.param({"num_nodes": 2, "gpus_per_node": 1, "command": "exit 4"}, None, ["4242-0-4.end"], id="multi"),
        pytest.param({"job_dir": "/nonexistent/job"}, None, ["4242-0-1.end"], id="setup-fails-under-set-e"),
        pytest.param({"ends_dir": None, "command": "exit 6"}, None, [], id="no-ends-dir"),
    ],
)
def test_run_end_marker_names_the_run_and_the_exit_code(
    tmp_path: Path, changes: dict[str, Any], restart: str | None, expected: list[str]
) -> None:
    run = Run(tmp_path, sidecar=None, **changes)
    if restart is not None:
        run.env["SLURM_RESTART_COUNT"] = restart
    result = run.run()
    assert result.returncode == (int(expected[0].split("-")[2].removesuffix(".end")) if expected else 6)
    assert sorted(path.name for path in run.ends.iterdir()) == expected


def test_run_cleanup_failure_never_masks_the_exit_code(tmp_path: Path) -> None:
    run = Run(tmp_path, command="exit 5", exit_code_file=str(tmp_path / "missing dir" / "exit_codes"))
    run.write_sidecar("export A=1\n")
    result = run.run()
    assert result.returncode == 5
    assert "TAO_SLURM: could not write the exit code file" in result.stderr


def test_run_without_sidecar_file_warns_and_runs(tmp_path: Path) -> None:
    result = Run(tmp_path, command="echo ran").run()
    assert result.returncode == 0
    assert "ran" in result.stdout.splitlines()
    assert "TAO_SLURM: credentials file not found; secret_env variables are not set" in result.stderr


def run_until_sigterm(run: Run) -> tuple[int, str, str]:
    """Run the script with a hanging step; SIGTERM it as SLURM does (batch shell and srun together)."""
    run.env["FAKE_SRUN_HANG"] = "1"
    process = subprocess.Popen(
        ["bash", str(run.script)],
        env=run.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not (run.job_dir / "srun.started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=20)
    return process.returncode, stdout, stderr


@pytest.mark.parametrize("with_sidecar", [True, False], ids=["sidecar", "no-sidecar"])
def test_run_sigterm_keeps_the_sidecar_for_a_requeued_run(tmp_path: Path, with_sidecar: bool) -> None:
    run = Run(tmp_path, command="true", sidecar=str(tmp_path / ".secrets.env") if with_sidecar else None)
    (tmp_path / ".secrets.env").write_text("export A=1\n")
    run.env["FAKE_JOB_RESTARTS"] = "1"  # SLURM counted the restart before it signalled this run
    rc, stdout, stderr = run_until_sigterm(run)
    assert rc == 128 + signal.SIGTERM
    assert stderr.splitlines()[-1] == "TAO_SLURM: SIGTERM received (cancel, requeue or preemption)"
    assert stdout.splitlines()[-1] == (
        "TAO_SLURM: credentials file kept for a rerun of the job" if with_sidecar else "TAO_SLURM: end"
    )
    assert run.exit_code_file.read_text() == f"{128 + signal.SIGTERM}\n"
    assert (tmp_path / ".secrets.env").exists()
    assert list(run.ends.iterdir()) == [], "a run that got SIGTERM leaves no end marker: the scheduler reports it"


@pytest.mark.parametrize(
    ("changes", "env", "signalled", "removed"),
    [
        pytest.param({"command": "true"}, {}, False, True, id="success"),
        pytest.param({"command": "exit 3"}, {}, False, True, id="program-failure"),
        pytest.param({"command": "sleep 5", "timeout_seconds": 1}, {}, False, True, id="program-timeout"),
        pytest.param({"command": "exit 3", "requeue": False}, {}, False, True, id="no-requeue"),
        pytest.param({"command": "true"}, {"SLURM_RESTART_COUNT": "2", "FAKE_JOB_RESTARTS": "2"}, False, True,
                     id="last-run-of-a-requeued-job"),
        pytest.param({"command": "true", "num_nodes": 2, "gpus_per_node": 1}, {}, False, True, id="multi-node"),
        pytest.param({"command": "true"}, {"FAKE_SCONTROL_DOWN": "1"}, False, False,
                     id="ended-by-itself-while-slurmctld-is-down"),
        pytest.param({"command": "true", "requeue": False}, {"FAKE_JOB_REASON": "NodeDown"}, False, False,
                     id="node-failure-ended-the-step-before-slurm-signalled-the-shell"),
        pytest.param({"command": on_sigterm(0)}, {}, True, True, id="signalled-step-slurm-will-not-rerun"),
        pytest.param({"command": on_sigterm(0)}, {"FAKE_JOB_RESTARTS": "1"}, True, False,
                     id="ended-while-slurm-requeues-it"),
        pytest.param({"command": on_sigterm(1), "requeue": False}, {"FAKE_JOB_REASON": "NodeDown"}, True, False,
                     id="node-failure-resubmitted-by-the-provider"),
        pytest.param({"command": on_sigterm(0)}, {"FAKE_SCONTROL_DOWN": "1"}, True, False,
                     id="scheduler-unreachable"),
    ],
)  # fmt: skip
def test_run_end_removes_the_sidecar_only_when_slurm_will_not_rerun_the_job(
    tmp_path: Path, changes: dict[str, Any], env: dict[str, str], signalled: bool, removed: bool
) -> None:
    """Nobody watches the job: its own EXIT trap removes the secret once SLURM will not run it again. The
    scheduler is asked once whether it will, signalled or not: a node failure can end the step (srun exits 0)
    before SLURM's signal reaches the shell (seen on the test cluster), and the provider resubmits that job
    with the same sidecar. A signalled step asks once more, whether a preemption is under way."""
    run = Run(tmp_path, **changes)
    run.write_sidecar("export A=1\n")
    run.env.update(env)
    if signalled:
        signal_the_step(run)
    result = run.run()
    assert run.sidecar.exists() is not removed, result.stdout
    expected = (
        "TAO_SLURM: credentials file removed (SLURM will not run the job again)"
        if removed
        else "TAO_SLURM: credentials file kept for a rerun of the job"
    )
    assert result.stdout.splitlines()[-1] == expected
    assert len(list(run.ends.iterdir())) == 1, "the end marker is still left after the sidecar decision"
    if "FAKE_SCONTROL_DOWN" not in env:
        assert asked(run) == 1 + signalled, "the sidecar's question, and the preemption's after a signalled step"


@pytest.mark.parametrize(("restarts", "removed"), [("0", True), ("1", False)], ids=["cancel-or-timeout", "requeue"])
def test_run_sigterm_removes_the_sidecar_unless_slurm_requeues_the_job(
    tmp_path: Path, restarts: str, removed: bool
) -> None:
    """SIGTERM comes for a cancel and a SLURM TIMEOUT (restart count unchanged: the job's end) and for a
    requeue (SLURM counted one more restart first: the next run needs the sidecar)."""
    run = Run(tmp_path, command="true")
    run.write_sidecar("export A=1\n")
    run.env["FAKE_JOB_RESTARTS"] = restarts
    rc, _, _ = run_until_sigterm(run)
    assert rc == 128 + signal.SIGTERM
    assert run.sidecar.exists() is not removed


def test_run_sigterm_before_the_step_ends_the_script_without_a_marker(tmp_path: Path) -> None:
    run = Run(tmp_path, command="true", sidecar=None, num_nodes=2, gpus_per_node=1)
    (run.bin / "scontrol").write_text('#!/bin/bash\ntouch "$FAKE_DIR/scontrol.started"\nexec sleep 30\n')
    process = subprocess.Popen(["bash", str(run.script)], env=run.env, start_new_session=True)
    deadline = time.monotonic() + 20
    while not (run.job_dir / "scontrol.started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the script is still setting up (the rendezvous' host list)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=20) == 128 + signal.SIGTERM
    assert not (run.job_dir / "srun.args").exists()
    assert list(run.ends.iterdir()) == []


# --- what the job's end asks slurmctld: nothing, unless a signal reached the step or the batch shell ---------


@pytest.mark.parametrize(
    ("command", "timeout_seconds", "rc"),
    [
        pytest.param("true", 13680, 0, id="success"),
        pytest.param("exit 7", 13680, 7, id="failure"),
        pytest.param("sleep 5", 1, 124, id="program-timeout"),
    ],
)
@pytest.mark.parametrize("shape", SHAPES)
def test_run_a_step_no_signal_reached_asks_slurmctld_nothing(
    tmp_path: Path, shape: str, command: str, timeout_seconds: int, rc: int
) -> None:
    """A job that ends by itself asks slurmctld nothing, even while it would show a preemption: no wait after
    the step. timeout's own SIGTERM (124) is no signal of SLURM's. (A job with a secret sidecar asks one
    question at its end, whether SLURM will run it again: see the sidecar's test above.)"""
    run = shaped(tmp_path, shape, command=command, timeout_seconds=timeout_seconds, sidecar=None)
    in_preemption(run)
    result = run.run()
    assert result.returncode == rc, result.stderr
    assert asked(run) == 0
    assert "preempted" not in result.stdout
    assert sorted(path.name for path in run.ends.iterdir()) == [f"4242-0-{rc}.end"]
    assert notes(run) == []


@pytest.mark.parametrize(
    ("restart", "stale"),
    [("0", "step-signalled-4242-0"), ("2", "step-signalled-4242-1")],
    ids=["left-in-this-runs-place", "an-earlier-runs"],
)
def test_run_a_note_left_before_the_step_asks_slurmctld_nothing(tmp_path: Path, restart: str, stale: str) -> None:
    """Only this run's note, written by its own step, counts: the script removes any in its place before the
    step, and an earlier run's (another restart count) is not its own."""
    run = Run(tmp_path, command="true", sidecar=None)
    run.env["SLURM_RESTART_COUNT"] = restart
    (run.job_dir / stale).touch()
    in_preemption(run)
    result = run.run()
    assert result.returncode == 0, result.stderr
    assert asked(run) == 0
    assert notes(run) == ([] if restart == "0" else [stale])


@pytest.mark.parametrize("how", ["first", "all"], ids=["cgroup", "linuxproc"])
@pytest.mark.parametrize("shape", SHAPES)
def test_run_a_step_ended_by_a_preemption_waits_for_slurm_to_end_the_job(tmp_path: Path, shape: str, how: str) -> None:
    """A preemption's grace time: the steps got SIGTERM (where SLURM signals only the task's first process,
    timeout or the relay passes it on) and the program exited 0, the shell got nothing. The step's note makes
    the script ask; while slurmctld shows a PreemptTime it waits (so SLURM ends the job PREEMPTED and may
    requeue it); its SIGTERM at the end of the grace time ends the wait, and no end marker is left."""
    run = shaped(tmp_path, shape, command=on_sigterm(0))
    signal_the_step(run, how)
    in_preemption(run)
    process = subprocess.Popen(
        ["bash", str(run.script)], env=run.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    wait_for(run.job_dir / "scontrol.asked")
    time.sleep(1.0)
    assert process.poll() is None, "the script ended before SLURM preempted the job"
    os.killpg(process.pid, signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=20)
    assert "TAO_SLURM: the job is being preempted (since 2026-12-06T10:05:00): waiting for SLURM to end it" in stdout
    assert "TAO_SLURM: SIGTERM received (cancel, requeue or preemption)" in stderr
    assert process.returncode == 0, "the step's status (SLURM records the job PREEMPTED)"
    assert list(run.ends.iterdir()) == [], "a preempted run leaves no end marker"
    assert notes(run) == [], "the note is read once, after the step"


def test_run_a_preemption_wait_goes_on_while_slurmctld_does_not_answer(tmp_path: Path) -> None:
    """A preemption was seen, then slurmctld stops answering: a failed query is no answer, so the script keeps
    waiting (until SLURM's SIGTERM), never ends the job by itself."""
    run = Run(tmp_path, command=on_sigterm(143))
    signal_the_step(run)
    in_preemption(run)
    process = subprocess.Popen(
        ["bash", str(run.script)], env=run.env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    wait_for(run.job_dir / "scontrol.asked")
    time.sleep(1.0)
    (run.job_dir / "scontrol-down").touch()
    (run.job_dir / "preempting").unlink()  # what slurmctld would say, if it answered
    time.sleep(7.0)  # past the next query
    assert process.poll() is None, "a failed query ended the wait"
    os.killpg(process.pid, signal.SIGTERM)
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == 143
    assert "waiting for SLURM to end it" in stdout
    assert list(run.ends.iterdir()) == []


def test_run_a_preemption_that_no_longer_shows_ends_the_wait(tmp_path: Path) -> None:
    """The wait lasts only while slurmctld shows the preemption: once it does not, the script ends by itself."""
    run = Run(tmp_path, command=on_sigterm(143))
    signal_the_step(run)
    in_preemption(run)
    process = subprocess.Popen(["bash", str(run.script)], env=run.env, stdout=subprocess.PIPE, text=True)
    wait_for(run.job_dir / "scontrol.asked")
    time.sleep(1.0)
    (run.job_dir / "preempting").unlink()
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == 143
    assert "waiting for SLURM to end it" in stdout
    assert [path.name for path in run.ends.iterdir()] == ["4242-0-143.end"]


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="no-preemption"),
        pytest.param(
            {"FAKE_SCONTROL_DOWN": "1", "FAKE_PREEMPT_TIME": "2026-12-06T10:05:00"}, id="scheduler-unreachable"
        ),
    ],
)
@pytest.mark.parametrize("shape", SHAPES)
def test_run_a_step_that_ends_without_a_preemption_ends_the_script(
    tmp_path: Path, shape: str, env: dict[str, str]
) -> None:
    """SIGTERM reached the step, but slurmctld shows no PreemptTime (or does not answer): one query, and the
    step's end is the job's end, at once."""
    run = shaped(tmp_path, shape, command=on_sigterm(143), sidecar=None)
    signal_the_step(run)
    (run.job_dir / "preempting").touch()
    run.env.update(env)
    result = run.run()
    assert result.returncode == 143, result.stderr
    assert "preempted" not in result.stdout
    assert asked(run) == (0 if env else 1)
    assert [path.name for path in run.ends.iterdir()] == ["4242-0-143.end"]


def test_run_multi_node_rendezvous_per_task(tmp_path: Path) -> None:
    command = (
        'echo "rank=$NODE_RANK tao_rank=$TAO_NODE_RANK world=$WORLD_SIZE gpus=$NUM_GPU_PER_NODE '
        'master=$MASTER_ADDR:$MASTER_PORT count=$TAO_NODE_COUNT/$TAO_GPUS_PER_NODE nccl=$NCCL_IB_DISABLE"'
    )
    run = Run(tmp_path, num_nodes=2, gpus_per_node=1, command=command, nccl_env={"NCCL_IB_DISABLE": "1"})
    result = run.run()
    assert result.returncode == 0, result.stderr
    ranks = [line for line in result.stdout.splitlines() if "rank=" in line]
    announced = [line for line in result.stdout.splitlines() if line.startswith("TAO_SLURM: rendezvous n1:")]
    port = int(announced[0].split(":")[2].split(",")[0])  # chosen on the node when the job started
    assert 1024 <= port <= 65535
    # each node's line carries its rank (srun --label); the batch script's own lines carry none
    assert ranks == [
        f"{rank}: rank={rank} tao_rank={rank} world=2 gpus=1 master=n1:{port} count=2/1 nccl=1" for rank in (0, 1)
    ]
    assert announced == [f"TAO_SLURM: rendezvous n1:{port}, 2 nodes x 1 GPUs"]
    args = run.srun_args()
    assert args[:7] == [
        "--input=none",
        "--export=ALL",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=16",
        "--kill-on-bad-exit=1",
        "--label",
    ]
    assert args[-3:] == ["tao-step", "13680", command]


def test_run_multi_node_labels_each_nodes_errors_and_the_classifier_reads_past_the_label(tmp_path: Path) -> None:
    command = 'echo "Epoch 1/2 on $NODE_RANK"; [ "$NODE_RANK" = 0 ] || { echo "CUDA out of memory" >&2; exit 1; }'
    result = Run(tmp_path, num_nodes=2, gpus_per_node=1, command=command, nccl_env={}).run()
    assert result.returncode == 1
    epochs = [line for line in result.stdout.splitlines() if "Epoch" in line]
    assert epochs == ["0: Epoch 1/2 on 0", "1: Epoch 1/2 on 1"]
    assert "1: CUDA out of memory" in result.stderr.splitlines()
    verdict = classify(state_from_native("7", "FAILED", source="sacct", exit_code=1), result.stderr)
    assert verdict.err_class is ErrClass.ERR_PROGRAM
    assert "CUDA out of memory" in verdict.reason + verdict.evidence, verdict


def test_run_multi_node_fails_without_hosts(tmp_path: Path) -> None:
    run = Run(tmp_path, num_nodes=2, gpus_per_node=1, command="true")
    run.env["SLURM_JOB_NODELIST"] = "other[1-2]"
    result = run.run()
    assert result.returncode == 1
    assert "TAO_SLURM: scontrol show hostnames printed no host for other[1-2]" in result.stderr
    assert not (run.job_dir / "srun.args").exists()


@pytest.mark.parametrize("num_nodes", [1, 2], ids=["single-node", "multi-node"])
@pytest.mark.parametrize(
    ("changes", "fixed"),
    [
        pytest.param({}, None, id="shared-nodes"),
        pytest.param({"exclusive": True, "gpus_per_node": 8}, None, id="exclusive-nodes"),
        pytest.param({"master_port": 31000}, "31000", id="overridden"),
    ],
)
def test_master_port_is_chosen_on_the_node_unless_given(
    changes: dict[str, Any], fixed: str | None, num_nodes: int
) -> None:
    script = render_sbatch(replace(BASE, **{"num_nodes": num_nodes, "gpus_per_node": 1, **changes}))
    picks = "if ! MASTER_PORT=$(tao_slurm_free_port); then\n" in script
    assert (picks, f"export MASTER_PORT={fixed}\n" in script) == (fixed is None, fixed is not None)
    assert "29500 + SLURM_JOB_ID % 1000" not in script


PORT_SNIPPET = "rendezvous_port.sh.j2"


def pick_port(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the port-choosing block of the job scripts with real bash, as the batch script runs it."""
    snippet = render_template(PORT_SNIPPET, {})
    return subprocess.run(
        ["/bin/bash", "-c", f'set -euo pipefail\n{snippet}echo "MASTER_PORT=${{MASTER_PORT}}"\n'],
        env={"SLURM_JOB_ID": "4242", "MASTER_ADDR": "127.0.0.1", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def listening(address: str, port: int) -> socket.socket | None:
    """A socket listening on ``address:port``, or None when that port is taken."""
    sock = socket.socket()
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def in_use(port: int, *addresses: str) -> bool:
    """Whether something accepts connections on ``port`` at any of ``addresses``."""
    for address in addresses:
        with socket.socket() as sock:
            if sock.connect_ex((address, port)) == 0:
                return True
    return False


def test_port_choice_with_python3_is_a_port_free_on_the_node() -> None:
    result = pick_port({"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    port = int(result.stdout.strip().removeprefix("MASTER_PORT="))
    sock = listening("", port)
    assert sock is not None, f"port {port} is not free"
    sock.close()


def test_port_choice_without_python3_skips_ports_in_use_on_either_address(tmp_path: Path) -> None:
    """No python3 on PATH: bash scans 29500-30499 from the job's own start (29742 for job 4242) with /dev/tcp,
    skipping a port something listens on at 127.0.0.1 and one it listens on only at MASTER_ADDR."""
    (tmp_path / "bin").mkdir()
    taken = [listening("127.0.0.1", 29742), listening("127.0.0.2", 29743)]
    try:
        free = next(port for port in range(29744, 30500) if not in_use(port, "127.0.0.1", "127.0.0.2"))
        result = pick_port({"PATH": str(tmp_path / "bin"), "MASTER_ADDR": "127.0.0.2"})
    finally:
        for sock in taken:
            if sock is not None:
                sock.close()
    assert None not in taken, "the test's ports 29742/29743 are in use on this machine"
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"MASTER_PORT={free}\n"


@pytest.mark.parametrize("port", [80, 70000, True, "29500"])
def test_bad_master_port_is_refused(port: Any) -> None:
    with pytest.raises(ValidationError, match="master_port"):
        render_sbatch(replace(BASE, num_nodes=2, gpus_per_node=1, master_port=port))


def test_gpu_type_goes_into_gres() -> None:
    assert "#SBATCH --gres=gpu:h100:2\n" in render_sbatch(replace(BASE, gpus_per_node=2, gpu_type="h100"))
    with pytest.raises(ValidationError, match="gpu_type"):
        render_sbatch(replace(BASE, gpu_type="h100 --uid=0"))


# --- one slice of a training longer than one allocation (core/continuation.py) ---------------------------

#: srun as a slice's batch shell sees it: the step runs in the background, srun passes USR1 and USR2 on to
#: its first process (as proctrack/cgroup delivers them) and exits with the step's status.
FORWARDING_SRUN = r"""#!/bin/bash
printf '%s\0' "$@" > "$FAKE_DIR/srun.args"
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
SLURM_NODEID=0 "$@" < /dev/null &
child=$!
trap 'kill -s USR1 "$child"' USR1
trap 'kill -s USR2 "$child"' USR2
while kill -0 "$child" 2> /dev/null; do wait "$child"; done
wait "$child"
"""
#: A step that runs a while: it says when it started and when it got to its end.
LONG_STEP = 'touch "$FAKE_DIR/step.started"; sleep 3; touch "$FAKE_DIR/step.done"; exit 3'


def slice_run(tmp_path: Path, command: str, spec: dict[str, Any] | None = None, **slice_changes: Any) -> Run:
    """A slice script (30 s warning) with the signal-forwarding srun; slices and results dirs under ``tmp_path``."""
    script = SliceScript(
        slices_dir=str(tmp_path / "slices 'x'"), grace_seconds=30, results_dir=str(tmp_path / "results $(x)")
    )
    run = Run(tmp_path, command=command, sidecar=None, slice=replace(script, **slice_changes), **(spec or {}))
    (run.bin / "srun").write_text(FORWARDING_SRUN)
    return run


def wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.02)


def warn_during_step(run: Run, slices: Path) -> tuple[int, str, str, bool]:
    """Run the script and send its batch shell SIGUSR1 (``--signal=B:USR1@...``) while the step runs.

    :returns: the exit status, stdout, stderr, and whether the step was still running when the ending
        marker appeared.
    """
    process = subprocess.Popen(
        ["bash", str(run.script)], env=run.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for(run.job_dir / "step.started")
    process.send_signal(signal.SIGUSR1)
    wait_for(slices / slice_marker("4242", 0, "ending"))
    running = not (run.job_dir / "step.done").exists()
    stdout, stderr = process.communicate(timeout=30)
    return process.returncode, stdout, stderr, running


def test_slice_script_directives_and_shared_names() -> None:
    script = render_sbatch(GOLDEN_CASES["single_slice"])
    assert f"#SBATCH --signal=B:{SLICE_SIGNAL}@180\n" in script
    assert f'export {SLICE_ENV}="${{{SLICE_ENV}:-1}}"\n' in script
    assert f"export {LATEST_CHECKPOINT_ENV}\n" in script
    # a slice ends at SLURM's limit: its program's timeout is twice the 30-minute wall, never timeout_seconds
    assert (
        f'    timeout 3600 bash -c "${{TAO_SLURM_STEP_NOTER}}" tao-step {quote(BASE.command)} '
        '"${TAO_SLURM_STEP_NOTE}"\n'
        "tao_slurm_step_rc\nTAO_SLURM_STEP_RC=$?\n"
    ) in script
    assert "\ntao_slurm_step srun --input=none " in script
    assert "TAO_SLURM_STEP_RELAY" not in script, "without checkpoint_signal the step is started as ever"
    assert "--signal" not in render_sbatch(BASE)


@pytest.fixture
def slices(tmp_path: Path) -> Path:
    return tmp_path / "slices 'x'"


def test_slice_warning_leaves_the_ending_marker_while_the_step_runs_on(tmp_path: Path, slices: Path) -> None:
    run = slice_run(tmp_path, LONG_STEP)
    rc, stdout, _, running = warn_during_step(run, slices)
    assert running, "the warning must not stop the step: without checkpoint_signal nothing is forwarded"
    assert rc == 3
    assert run.exit_code_file.read_text() == "3\n"
    assert (run.job_dir / "step.done").exists()
    assert sorted(path.name for path in slices.iterdir()) == ["4242-0.ending", "4242-0.start"]
    assert (slices / "4242-0.ending").read_text().strip(), "the ending marker holds the date of the warning"
    assert (
        "TAO_SLURM: slice 1 ends in about 30 s (time limit): the program is not signalled (no checkpoint_signal); "
        "the next slice resumes from the latest checkpoint"
    ) in stdout.splitlines()
    assert stdout.splitlines()[-2:] == ["TAO_SLURM: step exit code 3", "TAO_SLURM: end"]
    assert sorted(path.name for path in run.ends.iterdir()) == ["4242-0-3.end"]


@pytest.mark.parametrize("preempting", [False, True], ids=["time-limit", "preemption"])
def test_slice_warning_then_the_programs_own_end_asks_slurmctld(tmp_path: Path, preempting: bool) -> None:
    """SLURM's warning reached the batch shell and the program then ended by itself (exit 0, say after saving):
    the warning may be a preemption's (send_user_signal), so the script asks once, and waits for SLURM while
    slurmctld shows the preemption under way; the time limit's warning shows none, and the step's end stands."""
    command = 'touch "$FAKE_DIR/step.started"; sleep 3; touch "$FAKE_DIR/step.done"; exit 0'
    run = slice_run(tmp_path, command)
    if preempting:
        in_preemption(run)
    process = subprocess.Popen(["bash", str(run.script)], env=run.env, stdout=subprocess.PIPE, text=True)
    wait_for(run.job_dir / "step.started")
    process.send_signal(signal.SIGUSR1)
    wait_for(run.job_dir / "scontrol.asked")
    if preempting:
        time.sleep(1.0)
        assert process.poll() is None, "the script ended before SLURM preempted the job"
        process.send_signal(signal.SIGTERM)
    stdout, _ = process.communicate(timeout=30)
    assert (process.returncode, asked(run)) == (0, 1)
    assert ("waiting for SLURM to end it" in stdout) is preempting
    assert sorted(path.name for path in run.ends.iterdir()) == ([] if preempting else ["4242-0-0.end"])


@pytest.mark.parametrize("name", ["USR1", "USR2"])
def test_slice_warning_forwards_checkpoint_signal_to_an_unhandling_program(
    tmp_path: Path, slices: Path, name: str
) -> None:
    """Forwarded, a signal the program does not handle ends it at once: the step's status says so."""
    run = slice_run(tmp_path, LONG_STEP, checkpoint_signal=name)
    rc, stdout, _, _ = warn_during_step(run, slices)
    number = signal.Signals[f"SIG{name}"].value
    assert rc == 128 + number
    assert not (run.job_dir / "step.done").exists()
    assert run.exit_code_file.read_text() == f"{128 + number}\n"
    assert f"TAO_SLURM: slice 1 ends in about 30 s (time limit): SIG{name} goes to the program (checkpoint_signal)" in (
        stdout.splitlines()
    )
    args = run.srun_args()
    note = str(run.job_dir / "step-signalled-4242-0")
    assert (args[-8:-6], args[-5:]) == (["bash", "-c"], ["tao-step", "28800", name, LONG_STEP, note])


@pytest.mark.parametrize("name", ["USR1", "USR2"])
def test_slice_warning_reaches_a_program_that_handles_checkpoint_signal(
    tmp_path: Path, slices: Path, name: str
) -> None:
    """The program's own handler runs (timeout in between survives the signal) and the program goes on."""
    command = f"trap 'touch \"$FAKE_DIR/saved\"' {name}; {LONG_STEP}"
    run = slice_run(tmp_path, command, checkpoint_signal=name)
    rc, _, stderr, _ = warn_during_step(run, slices)
    assert (rc, (run.job_dir / "saved").exists(), (run.job_dir / "step.done").exists()) == (3, True, True), stderr
    assert run.exit_code_file.read_text() == "3\n"


def test_slice_program_starts_with_the_signal_ignored_where_env_lacks_default_signal(
    tmp_path: Path, slices: Path
) -> None:
    """An image whose env has no --default-signal (coreutils < 8.31): the program runs with the signal
    ignored, so the warning neither kills it nor reaches a shell trap; the log says why."""
    command = f"trap 'touch \"$FAKE_DIR/saved\"' USR1; {LONG_STEP}"
    run = slice_run(tmp_path, command, checkpoint_signal="USR1")
    old_env = '#!/bin/bash\ncase "$1" in --default-signal=*) exit 125 ;; esac\nexec /usr/bin/env "$@"\n'
    (run.bin / "env").write_text(old_env)
    (run.bin / "env").chmod(0o755)
    rc, _, stderr, _ = warn_during_step(run, slices)
    assert (rc, (run.job_dir / "saved").exists()) == (3, False)
    assert (
        "TAO_SLURM: env in the image has no --default-signal (coreutils 8.31+): the program starts with SIGUSR1 "
        "ignored" in stderr
    )


@pytest.mark.parametrize("checkpoint_signal", [None, "USR1"], ids=["plain", "relay"])
@pytest.mark.parametrize(
    ("command", "timeout_seconds", "rc"),
    [
        pytest.param("exit 4", 13680, 4, id="failure"),
        pytest.param("true", 13680, 0, id="success"),
        pytest.param("sleep 2", 1, 0, id="timeout-seconds-does-not-end-a-slice"),
    ],
)
def test_slice_step_exit_code_is_kept(
    tmp_path: Path, command: str, timeout_seconds: int, rc: int, checkpoint_signal: str | None
) -> None:
    run = slice_run(tmp_path, command, {"timeout_seconds": timeout_seconds}, checkpoint_signal=checkpoint_signal)
    result = run.run()
    assert result.returncode == rc, result.stderr
    assert run.exit_code_file.read_text() == f"{rc}\n"
    assert "program stopped by timeout" not in result.stdout
    assert sorted(path.name for path in run.ends.iterdir()) == [f"4242-0-{rc}.end"]


@pytest.mark.parametrize("checkpoint_signal", [None, "USR1"], ids=["plain", "relay"])
def test_slice_step_output_and_signal_death_are_kept(tmp_path: Path, checkpoint_signal: str | None) -> None:
    """The step's output reaches the log (not the pipe its status comes through) and a step killed by a
    signal has the status bash gives it, as outside a slice."""
    run = slice_run(tmp_path, "echo out; echo err >&2; kill -s KILL $$", checkpoint_signal=checkpoint_signal)
    result = run.run()
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert run.exit_code_file.read_text() == f"{128 + signal.SIGKILL}\n"
    assert result.stdout.splitlines()[-4:] == [
        "TAO_SLURM: step start",
        "out",
        "TAO_SLURM: step exit code 137",
        "TAO_SLURM: end",
    ]
    assert "err" in result.stderr.splitlines()


def test_slice_multi_node_relay_sets_the_node_rank(tmp_path: Path) -> None:
    command = 'echo "rank=$NODE_RANK tao_rank=$TAO_NODE_RANK world=$WORLD_SIZE"'
    run = slice_run(tmp_path, command, {"num_nodes": 2, "gpus_per_node": 1}, checkpoint_signal="USR2")
    result = run.run()
    assert result.returncode == 0, result.stderr
    assert "rank=0 tao_rank=0 world=2" in result.stdout.splitlines()


def test_slice_sigterm_keeps_todays_semantics(tmp_path: Path) -> None:
    """A cancel or requeue SIGTERMs batch shell and step together: the trap runs while srun is waited for."""
    run = Run(tmp_path, command="true", sidecar=None, slice=SliceScript(str(tmp_path / "s"), 30, str(tmp_path)))
    rc, _, stderr = run_until_sigterm(run)
    assert rc == 128 + signal.SIGTERM
    assert stderr.splitlines()[-1] == "TAO_SLURM: SIGTERM received (cancel, requeue or preemption)"
    assert run.exit_code_file.read_text() == f"{128 + signal.SIGTERM}\n"
    assert list(run.ends.iterdir()) == []


def test_slice_start_marker_and_directory_mode(tmp_path: Path, slices: Path) -> None:
    run = slice_run(tmp_path, "true")
    run.env["SLURM_RESTART_COUNT"] = "2"
    result = run.run()
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in slices.iterdir()) == [slice_marker("4242", 2, "start")]
    assert (slices / "4242-2.start").read_bytes() == b""
    assert slices.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("files", "globs", "slice_env", "expected"),
    [
        pytest.param({}, None, None, "", id="no-results-dir"),
        pytest.param({"status.json": 300}, None, None, "", id="no-checkpoint"),
        pytest.param(
            {"a.pth": 100, "sub dir/b 'x'.ckpt": 200, "c.tlt": 150, "later.txt": 300},
            None, "3", "sub dir/b 'x'.ckpt", id="newest-matching-in-a-subdir",
        ),
        pytest.param({"w.hdf5": 100, "x.pth": 50}, None, None, "w.hdf5", id="tf-checkpoint"),
        pytest.param({"a.pth": 300, "model_7.ckpt": 100}, ("model_[0-9]*.ckpt",), None, "model_7.ckpt", id="globs"),
    ],
)  # fmt: skip
def test_slice_latest_checkpoint_and_slice_number(
    tmp_path: Path, files: dict[str, int], globs: tuple[str, ...] | None, slice_env: str | None, expected: str
) -> None:
    command = f'printf "%s|%s" "${SLICE_ENV}" "${LATEST_CHECKPOINT_ENV}" > "$FAKE_DIR/seen"'
    run = slice_run(tmp_path, command, **({"checkpoint_globs": globs} if globs else {}))
    results = tmp_path / "results $(x)"
    if files:
        results.mkdir()
    for name, age in files.items():
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text("x")
        os.utime(results / name, (1_700_000_000 + age, 1_700_000_000 + age))
    if slice_env:
        run.env[SLICE_ENV] = slice_env
    result = run.run()
    assert result.returncode == 0, result.stderr
    latest = str(results / expected) if expected else ""
    assert (run.job_dir / "seen").read_text() == f"{slice_env or 1}|{latest}"
    assert (
        f"TAO_SLURM: slice {slice_env or 1} (TAO_SLURM_SLICE), latest checkpoint '{latest}' "
        "(TAO_SLURM_LATEST_CHECKPOINT)" in result.stdout.splitlines()
    )


SLICE = SliceScript(slices_dir="/lustre/proj/results/jobs/x/slices", grace_seconds=30, results_dir="/lustre/proj/r")


def slurm_time(offset_s: float) -> str:
    """A time as scontrol prints it (local, no zone), ``offset_s`` from now."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + offset_s))


@pytest.mark.parametrize(
    ("start", "end", "grace"),
    [
        pytest.param(-110, 10, 12, id="two-minute-partition"),
        pytest.param(-50, 10, 10, id="one-minute-partition-at-least-10-s"),
        pytest.param(60 - 4 * 3600, 60, 600, id="four-hour-partition-at-most-10-min"),
        pytest.param(None, None, 600, id="slurmctld-cannot-say-the-longest-slices"),
    ],
)
def test_slice_warning_fits_the_limit_of_the_partition_it_got(
    tmp_path: Path, slices: Path, start: int | None, end: int | None, grace: int
) -> None:
    """On several partitions SLURM warns as for the longest slice (600 s); the slice's own warning is a tenth
    of the limit it got (SLURM's warning comes here when that one is due: nothing is deferred)."""
    run = slice_run(tmp_path, LONG_STEP, partition_limit="04:00:00", grace_from_limit=True, grace_seconds=600)
    if start is not None and end is not None:
        run.env.update(FAKE_START_TIME=slurm_time(start), FAKE_END_TIME=slurm_time(end))
    rc, stdout, _, _ = warn_during_step(run, slices)
    assert rc == 3
    assert f"TAO_SLURM: slice 1 warned {grace} s before its time limit" in stdout.splitlines()
    assert "#SBATCH --signal=B:USR1@600" in run.script.read_text()


def test_slice_warning_too_early_for_a_shorter_slice_follows_at_its_own_time(tmp_path: Path, slices: Path) -> None:
    """A 100-second slice (warning 10 s) warned by SLURM 18 s before its end: nothing now, the ending marker
    and the program's signal 8 s later."""
    command = 'touch "$FAKE_DIR/step.started"; sleep 12; touch "$FAKE_DIR/step.done"; exit 3'
    run = slice_run(tmp_path, command, partition_limit="04:00:00", grace_from_limit=True, grace_seconds=600)
    run.env.update(FAKE_START_TIME=slurm_time(-82), FAKE_END_TIME=slurm_time(18))
    process = subprocess.Popen(["bash", str(run.script)], env=run.env, stdout=subprocess.PIPE, text=True)
    wait_for(run.job_dir / "step.started")
    warned_at = time.monotonic()
    process.send_signal(signal.SIGUSR1)
    wait_for(slices / slice_marker("4242", 0, "ending"))
    deferred = time.monotonic() - warned_at
    stdout, _ = process.communicate(timeout=30)
    assert 5 <= deferred <= 11, deferred
    assert any(line.startswith("TAO_SLURM: slice 1: SLURM's warning came ") for line in stdout.splitlines()), stdout
    assert "TAO_SLURM: slice 1 ends in about 10 s (time limit)" in stdout


@pytest.mark.parametrize("case", ["lowered", "refused-shorter-limit", "refused-longer-limit", "refused-unanswered"])
def test_a_slice_ends_at_its_length_whether_or_not_slurmctld_lowered_its_limit(
    tmp_path: Path, slices: Path, case: str
) -> None:
    """A slice of 8 s (warning 3 s) on a partition whose limit may be longer. slurmctld lowers the limit, or
    refuses to raise a shorter one: SLURM ends the slice (here the program ends first, by itself). slurmctld
    refuses, or cannot be reached, and its limit is longer or unknown: this shell warns itself 3 s before the
    end and the program's timeout stops the program at the end, exit 124, which continues the chain as a
    TIMEOUT does. The log says which limit holds."""
    own = case in ("refused-longer-limit", "refused-unanswered")
    command = 'touch "$FAKE_DIR/step.started"; sleep 20; exit 0' if own else "sleep 1"
    # the shorter limit's slice also takes its warning from that limit: the job line read once serves both
    from_limit = case == "refused-shorter-limit"
    run = slice_run(tmp_path, command, partition_limit="00:00:08", grace_seconds=3, grace_from_limit=from_limit)
    if case != "lowered":
        (run.job_dir / "update-refused").touch()
    if case == "refused-shorter-limit":
        run.env.update(FAKE_START_TIME=slurm_time(0), FAKE_END_TIME=slurm_time(6))
    if case == "refused-longer-limit":
        run.env.update(FAKE_START_TIME=slurm_time(0), FAKE_END_TIME=slurm_time(3600))
    started = time.monotonic()
    done = run.run()
    took = time.monotonic() - started
    lines = done.stdout.splitlines()
    said = {
        "lowered": "TAO_SLURM: slice time limit lowered to 00:00:08: SLURM ends the slice",
        "refused-shorter-limit": (
            "TAO_SLURM: slice time limit kept: the partition's (6 s) is no longer than the slice; SLURM ends the slice"
        ),
    }.get(
        case,
        "TAO_SLURM: slice time limit not lowered to 00:00:08 (scontrol: slurm_update error: Unable to contact slurm "
        "controller (connect failure)): this shell ends the slice after 8 s",
    )
    assert said in lines, lines
    if from_limit:
        assert "TAO_SLURM: slice 1 warned 10 s before its time limit" in lines, lines
        assert asked(run) == 1, "the job line read for the limit serves the warning: one scontrol show job"
    if not own:
        assert done.returncode == 0, done.stderr
        assert not (slices / slice_marker("4242", 0, "ending")).exists()
        assert not any("is warned by this shell" in line for line in lines), lines
        return
    assert done.returncode == PROGRAM_TIMEOUT_EXIT, done.stderr
    assert 7 <= took < 12, took
    assert any(line.startswith("TAO_SLURM: slice 1 is warned by this shell 3 s before its end") for line in lines)
    assert (slices / slice_marker("4242", 0, "ending")).exists(), "the shell's own warning left the ending marker"
    assert "TAO_SLURM: slice 1 ends in about 3 s (time limit)" in done.stdout
    stopped = [line for line in lines if line.startswith("TAO_SLURM: program stopped by timeout after ")]
    assert stopped, lines
    assert 6 <= int(stopped[0].split()[-2]) <= 8, stopped
    assert ends_slice("FAILED", done.returncode), "the chain goes on as after a TIMEOUT"


def test_a_preemptions_warning_is_never_deferred(tmp_path: Path, slices: Path) -> None:
    run = slice_run(tmp_path, LONG_STEP, partition_limit="04:00:00", grace_from_limit=True, grace_seconds=600)
    run.env.update(FAKE_START_TIME=slurm_time(-60), FAKE_END_TIME=slurm_time(3600), FAKE_PREEMPT_TIME=slurm_time(0))
    (run.job_dir / "preempting").touch()
    process = subprocess.Popen(["bash", str(run.script)], env=run.env, stdout=subprocess.PIPE, text=True)
    wait_for(run.job_dir / "step.started")
    process.send_signal(signal.SIGUSR1)
    wait_for(slices / slice_marker("4242", 0, "ending"))
    assert not (run.job_dir / "step.done").exists(), "the preemption's warning left the ending marker at once"
    (run.job_dir / "preempting").unlink()  # SLURM ended the preemption: the script's wait after the step ends
    stdout, _ = process.communicate(timeout=30)
    assert "SLURM's warning came" not in stdout


def test_a_slice_on_one_partition_takes_no_warning_of_its_own() -> None:
    script = render_sbatch(replace(BASE, slice=SLICE))
    assert "tao_slurm_warning_early" not in script
    assert "TAO_SLURM_GRACE=30\n" in script
    with pytest.raises(ValidationError, match="grace_from_limit needs a partition_limit"):
        render_sbatch(replace(BASE, slice=replace(SLICE, grace_from_limit=True)))


@pytest.mark.parametrize(
    ("changes", "error", "fragment"),
    [
        pytest.param({"grace_seconds": 0}, ResourceError, "grace_seconds=0", id="grace-zero"),
        pytest.param({"grace_seconds": True}, ResourceError, "grace_seconds=True", id="grace-bool"),
        pytest.param({"grace_seconds": 14400}, ResourceError, "less than the wall time", id="grace-whole-slice"),
        pytest.param({"grace_seconds": 2.5}, ResourceError, "whole number", id="grace-float"),
        pytest.param({"slices_dir": "slices"}, ValidationError, "slices_dir", id="slices-relative"),
        pytest.param({"results_dir": ""}, ValidationError, "results_dir", id="results-empty"),
        pytest.param({"checkpoint_globs": ("a/*.pth",)}, ValidationError, "checkpoint_glob", id="glob-path"),
        pytest.param({"checkpoint_globs": ["*.pth"]}, ValidationError, "tuple", id="glob-list"),
        pytest.param({"checkpoint_signal": "KILL"}, ValidationError, "checkpoint_signal", id="signal-unknown"),
        pytest.param({"checkpoint_signal": "TERM"}, ValidationError, "srun kills the step", id="signal-term"),
        pytest.param({"checkpoint_signal": "INT"}, ValidationError, "ignores INT", id="signal-int-ignored"),
        pytest.param({"checkpoint_signal": "SIGUSR1"}, ValidationError, "'USR1'", id="signal-spelling"),
    ],
)  # fmt: skip
def test_render_rejects_bad_slices(changes: dict[str, Any], error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as raised:
        render_sbatch(replace(BASE, slice=replace(SLICE, **changes)))
    assert fragment in str(raised.value)


def test_render_rejects_a_slice_that_is_no_slice_script() -> None:
    with pytest.raises(ValidationError, match="SliceScript"):
        render_sbatch(replace(BASE, slice={"grace_seconds": 30}))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- what is checked is what runs (issue 42, item 9)

#: (time_hours, timeout_hours or None for the derived one, max_continuations) -> the ``timeout`` seconds rendered
RENDERED_TIMEOUTS = [
    pytest.param(1 / 60, 0.0125, 0, 45, id="one-minute-45-s"),
    pytest.param(1 / 60, 0.0125, 3, 45, id="one-minute-slice-45-s"),
    pytest.param(1 / 60, 50 / 3600, 0, 50, id="sub-minute-timeout-50-s"),
    pytest.param(1 / 60, None, 0, 45, id="one-minute-derived"),
    pytest.param(1 / 60, None, 3, 120, id="one-minute-slice-to-the-limit"),
    pytest.param(0.25, None, 0, 855, id="quarter-hour-derived"),
    pytest.param(0.5, 0.45, 0, 1620, id="half-hour"),
    pytest.param(0.5, 0.45, 2, 1620, id="half-hour-slice"),
    pytest.param(2, None, 0, 6840, id="two-hours-derived"),
    pytest.param(4, 3.8, 0, 13680, id="four-hours"),
    pytest.param(26, None, 0, 88920, id="multi-day-derived"),
    pytest.param(26, 25.5, 1, 91800, id="multi-day-slice"),
]


@pytest.mark.parametrize(("hours", "timeout", "continuations", "seconds"), RENDERED_TIMEOUTS)
def test_the_rendered_program_timeout_is_the_checked_one(
    hours: float, timeout: float | None, continuations: int, seconds: int
) -> None:
    """The renderer's ``timeout N`` is the value the resource check accepted, below the wall time; only a
    chain's slice without ``timeout_hours`` runs to SLURM's limit (twice the wall: never the timeout first)."""
    resources = build_resources(partition="polar", time_hours=hours, timeout_hours=timeout)
    wall = round(hours * 3600)
    spec = replace(
        BASE,
        **resource_fields(resources),
        slice=None
        if not continuations
        else SliceScript(
            slices_dir="/l/slices",
            grace_seconds=grace_seconds(hours),
            results_dir="/l/results",
            stop_at_timeout=timeout is not None,
        ),
    )
    script = render_sbatch(spec)
    assert re.findall(r"timeout ([0-9]+) bash -c", script) == [str(seconds)]
    assert f"program stopped by timeout after {seconds} s" in script
    if continuations and timeout is None:
        assert seconds == 2 * wall
    else:
        assert seconds == resources.timeout_seconds < wall
