"""What every SLURM release from 22.05 to 26.05 prints, read by feature: one table per parser, one row per form.

The text of each row follows SchedMD's printing code, NEWS/CHANGELOG and man pages of the release
named in the row id (``github:SchedMD/slurm``, tags ``slurm-22-05-8-1`` ... ``slurm-26-05-0-1``):

- squeue ``-o %T`` prints ``job_state_string()``; 25.11 adds the flag ``EXPEDITING``
  (``src/common/slurm_protocol_defs.c``). ``%r`` prints the state description as is; 26.05 names
  the topology constraint (``src/common/slurm_errno.c``, "Topology eval_nodes rejection reasons").
- sacct ``ExitCode`` is ``WEXITSTATUS:WTERMSIG``; before 25.11 a status of 128 or more lost 128
  (``src/sacct/print.c``, commit "sacct - don't subtract 128 from exit codes above 128"). From
  24.11 a NODE_FAIL job's exit code is 1 (a wait status: ``0:1``). 25.11 ends the jobs of a removed
  partition NODE_FAIL with Reason=PartitionDown (``src/slurmctld/read_config.c``).
- ``scontrol -o show job`` prints ``TRES=`` up to 22.05, ``ReqTRES=``/``AllocTRES=`` from 23.02;
  its job flags run together up to 23.11, are comma-separated in 24.05 to 25.05 and space-separated
  from 25.11, where ``StdErr=`` is blank unless the job set one (``src/api/job_info.c``,
  ``src/scontrol/info_job.c``).
- sinfo ``%t`` prints ``node_state_string_compact()`` in lower case; 24.05 adds ``BLOCK``
  (BLOCKED), ``FAILG`` (FAILING) is a node that is failing while it runs a job.
- sbatch prints "Slurm job queue full, sleeping and retrying" through ``error()`` on stderr and
  retries (``src/sbatch/sbatch.c``); 26.05 refuses ``--gres=gpu`` with ``--gpus-per-node``
  (``src/common/slurm_opt.c``: "--gpus-per-node and --gres=gpu are mutually exclusive.").
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
from fakes import SETTINGS

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.continuation import ends_slice
from airflow_provider_tao_slurm.core.failures import classify
from airflow_provider_tao_slurm.core.resources import site_options
from airflow_provider_tao_slurm.core.states import (
    SACCT_FIELDS,
    SACCT_ID_FIELDS,
    SQUEUE_FORMAT,
    SQUEUE_ID_FORMAT,
    ErrClass,
    TaoState,
    parse_sacct,
    parse_sbatch_reply,
    parse_squeue,
    pending_hint,
)
from airflow_provider_tao_slurm.core.templates import check_sbatch_option
from airflow_provider_tao_slurm.core.usage import USAGE_FIELDS, usage_command
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, StatusQueryError, ValidationError
from airflow_provider_tao_slurm.hooks.replies import CommandResult, _combine_poll
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

if TYPE_CHECKING:
    from conftest import HeldSubmission

P, R, E = TaoState.PENDING, TaoState.RUNNING, TaoState.ERROR
START, END = "2026-12-01T10:00:00", "2026-12-01T10:30:00"
RAN = f"{START}|{END}"

# ------------------------------------------------------------------------------------------ squeue

#: ``squeue -h -t all -o SQUEUE_FORMAT``: release, line, (native, TAO state, reason).
SQUEUE_FORMS = [
    ("22.05 running", f"101|tao-a|RUNNING|None|n1|{START}|2026-12-01T14:00:00", ("RUNNING", R, None)),
    ("22.05 pending", "102|tao-b|PENDING|Resources||N/A|N/A", ("PENDING", P, "Resources")),
    ("24.11 node fail", f"103|tao-c|NODE_FAIL|NodeDown|n2|{START}|{END}", ("NODE_FAIL", E, "NodeDown")),
    ("25.11 expediting", f"104|tao-d|EXPEDITING|None|n1|{START}|N/A", ("EXPEDITING", P, None)),
    (
        "25.11 partition removed",
        f"105|tao-e|NODE_FAIL|PartitionDown|n3|{START}|{END}",
        ("NODE_FAIL", E, "PartitionDown"),
    ),
    (
        "26.05 topology pending",
        "106|tao-f|PENDING|No suitable topology unit found||N/A|N/A",
        ("PENDING", P, "No suitable topology unit found"),
    ),
    (
        "26.05 topology segment pending",
        "107|tao-g|PENDING|No suitable topology unit found for segment||N/A|N/A",
        ("PENDING", P, "No suitable topology unit found for segment"),
    ),
]


@pytest.mark.parametrize(("line", "expected"), [row[1:] for row in SQUEUE_FORMS], ids=[r[0] for r in SQUEUE_FORMS])
def test_squeue_forms(line: str, expected: tuple[str, TaoState, str | None]) -> None:
    (state,) = parse_squeue(line + "\n").values()
    assert (state.native, state.tao_state, state.reason) == expected
    assert "unrecognised" not in state.message


def test_squeue_is_never_asked_for_a_field_that_changed_its_form() -> None:
    """``exit_code`` (23.02: ``status:signal``) and ``StdOut``/``StdErr`` (24.05: not expanded) exist only with
    ``-O``/``--Format``; the provider's squeue lines use ``-o`` codes (``%e`` is the end time)."""
    lines = [
        commands.squeue_states(["1"]),
        commands.squeue_states([str(n) for n in range(300)], "alice"),
        commands.jobs_by_name("tao-x", "alice", "now-1days"),
        commands.sbatch_submit_held("/l/j.sbatch", log_dir="/l/logs", job_name="tao-x", user="alice"),
    ]
    calls = [call for line in lines for call in re.findall(r"squeue -h [^;)]*", line)]
    assert len(calls) == len(lines)
    for call in calls:
        assert not re.search(r" -O|--[Ff]ormat", call)
        assert " -o " in call
    assert (SQUEUE_FORMAT, SQUEUE_ID_FORMAT) == ("%i|%j|%T|%r|%N|%S|%e", "%i|%u")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        pytest.param("101|tao-a|RUNNING", "3 columns", id="too-few-columns"),
        pytest.param("101|tao-a|RUNNING|None|n1", "5 columns", id="cut-short"),
    ],
)
def test_an_unreadable_squeue_row_is_an_error_naming_the_command_and_the_text(line: str, why: str) -> None:
    with pytest.raises(RemoteCommandError, match=r"^squeue printed") as err:
        parse_squeue(line + "\n")
    assert line in str(err.value), why
    assert "cannot read" in str(err.value)


# ------------------------------------------------------------------------------------------- sacct

#: ``sacct -X -n -P -o SACCT_FIELDS``: release, line, (native, exit code, signal, TAO state, err_class).
SACCT_FORMS = [
    ("22.05 completed", f"201|tao-a|COMPLETED|0:0|None|n1|{RAN}", ("COMPLETED", 0, 0, TaoState.COMPLETE, None)),
    ("22.05 program SIGKILLed", f"202|tao-b|FAILED|9:0|NonZeroExitCode|n1|{RAN}", ("FAILED", 9, 0, E, None)),
    (
        "25.11 program SIGKILLed",
        f"202|tao-b|FAILED|137:0|NonZeroExitCode|n1|{RAN}",
        ("FAILED", 137, 0, E, None),
    ),
    (
        "22.05 out of memory",
        f"203|tao-c|OUT_OF_MEMORY|9:0|OutOfMemory|n1|{RAN}",
        ("OUT_OF_MEMORY", 9, 0, E, None),
    ),
    (
        "25.11 out of memory",
        f"203|tao-c|OUT_OF_MEMORY|137:0|OutOfMemory|n1|{RAN}",
        ("OUT_OF_MEMORY", 137, 0, E, None),
    ),
    ("22.05 time limit", f"204|tao-d|TIMEOUT|15:0|TimeLimit|n1|{RAN}", ("TIMEOUT", 15, 0, E, None)),
    ("25.11 time limit", f"204|tao-d|TIMEOUT|143:0|TimeLimit|n1|{RAN}", ("TIMEOUT", 143, 0, E, None)),
    ("22.05 program timeout", f"205|tao-e|FAILED|124:0|NonZeroExitCode|n1|{RAN}", ("FAILED", 124, 0, E, None)),
    (
        "22.05 node fail",
        f"206|tao-f|NODE_FAIL|0:0|NodeDown|n2|{RAN}",
        ("NODE_FAIL", 0, 0, E, ErrClass.ERR_INFRA),
    ),
    (
        "24.11 node fail exit code 1",
        f"206|tao-f|NODE_FAIL|0:1|NodeDown|n2|{RAN}",
        ("NODE_FAIL", 0, 1, E, ErrClass.ERR_INFRA),
    ),
    (
        "25.11 partition removed",
        f"207|tao-g|NODE_FAIL|0:1|PartitionDown|n3|{RAN}",
        ("NODE_FAIL", 0, 1, E, ErrClass.ERR_INFRA),
    ),
    ("any no exit code yet", f"208|tao-h|RUNNING||None|n1|{START}|Unknown", ("RUNNING", None, None, R, None)),
]


@pytest.mark.parametrize(("line", "expected"), [row[1:] for row in SACCT_FORMS], ids=[r[0] for r in SACCT_FORMS])
def test_sacct_forms(line: str, expected: tuple[Any, ...]) -> None:
    (state,) = parse_sacct(line + "\n").values()
    assert (state.native, state.exit_code, state.signal, state.tao_state, state.err_class) == expected


#: The same end printed by releases before 25.11 and from 25.11: (22.05 row id, 25.11 row id, log tail).
SAME_END = [
    (
        "22.05 program SIGKILLed",
        "25.11 program SIGKILLed",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=202.0",
    ),
    ("22.05 program SIGKILLed", "25.11 program SIGKILLed", ""),
    ("22.05 out of memory", "25.11 out of memory", ""),
    ("22.05 time limit", "25.11 time limit", ""),
    ("22.05 node fail", "24.11 node fail exit code 1", ""),
    (
        "22.05 node fail",
        "24.11 node fail exit code 1",
        "slurmstepd: error: *** JOB 206 ON n2 CANCELLED AT 2026-12-01T10:30:00 DUE TO NODE FAILURE ***",
    ),
]


@pytest.mark.parametrize(("old", "new", "log_tail"), SAME_END, ids=[f"{r[0]}|{bool(r[2])}" for r in SAME_END])
def test_both_exit_code_forms_classify_the_same(old: str, new: str, log_tail: str) -> None:
    """sacct 25.11 no longer subtracts 128 (``137:0`` where 22.05 shows ``9:0``): the verdict does not change."""
    rows = {row[0]: row[1] for row in SACCT_FORMS}
    (before,) = parse_sacct(rows[old]).values()
    (after,) = parse_sacct(rows[new]).values()
    one, two = classify(before, log_tail), classify(after, log_tail)
    assert (one.err_class, one.reason, one.retryable) == (two.err_class, two.reason, two.retryable)
    assert ends_slice(before.native, before.exit_code) == ends_slice(after.native, after.exit_code)


def test_node_fail_is_infrastructure_in_every_form() -> None:
    for release, line, _ in SACCT_FORMS:
        (state,) = parse_sacct(line).values()
        if state.native == "NODE_FAIL":
            assert classify(state).err_class is ErrClass.ERR_INFRA, release


def test_a_removed_partition_is_infrastructure_that_no_resubmission_fixes() -> None:
    """25.11: NODE_FAIL with Reason=PartitionDown, even with SLURM's node-failure banner in the log."""
    (state,) = parse_sacct(dict((r[0], r[1]) for r in SACCT_FORMS)["25.11 partition removed"]).values()
    banner = "slurmstepd: error: *** JOB 207 ON n3 CANCELLED AT 2026-12-01T10:30:00 DUE TO NODE FAILURE ***"
    for log_tail in ("", banner):
        verdict = classify(state, log_tail)
        assert (verdict.err_class, verdict.retryable) == (ErrClass.ERR_INFRA, False)
        assert "partition was removed" in verdict.reason
        assert "Reason=PartitionDown" in verdict.evidence


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("201|tao-a|COMPLETED|0:0", "8 '|'-separated columns", id="too-few-columns"),
        pytest.param(f"201|tao-a|FAILED|x:y|None|n1|{START}|{END}", "ExitCode as status:signal", id="bad-exit-code"),
    ],
)
def test_an_unreadable_sacct_row_is_an_error_naming_the_command_and_the_text(line: str, expected: str) -> None:
    with pytest.raises(RemoteCommandError) as err:
        parse_sacct(line + "\n")
    assert str(err.value).startswith(f"sacct printed {line!r}")
    assert expected in str(err.value)


def test_sacct_is_never_asked_for_the_renamed_reserved_field() -> None:
    """23.02 renamed ``Reserved`` to ``Planned``; asking for ``Reserved`` fails there (exit 1)."""
    lines = [
        commands.sacct_states(["1"], "now-1days"),
        commands.jobs_by_name("tao-x", "alice", "now-1days"),
        usage_command("1"),
    ]
    for fields in (SACCT_FIELDS, SACCT_ID_FIELDS, USAGE_FIELDS):
        assert not {"reserved", "planned"} & {field.lower() for field in fields.split(",")}
    for line in lines:
        assert "reserved" not in line.lower()


#: sacct's exit status and stderr on a failure (24.05 and later exit 1 on any error, rows or not).
SACCT_FAILURES = [
    pytest.param(
        1, "", "sacct: error: Problem talking to the database: Connection refused\n", id="22.05-slurmdbd-down"
    ),
    pytest.param(
        1,
        f"209|tao-i|COMPLETED|0:0|None|n1|{START}|{END}\n",
        'sacct: error: Invalid field requested: "Reserved"\n',
        id="24.05-exit-1-with-rows",
    ),
    pytest.param(0, "209|tao-i|COMPLETED\n", "", id="unreadable-row"),
]


@pytest.mark.parametrize(("rc", "stdout", "stderr"), SACCT_FAILURES)
def test_a_failed_sacct_never_reads_as_no_job(rc: int, stdout: str, stderr: str) -> None:
    gone = CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n", "login1")
    with pytest.raises(StatusQueryError) as err:
        _combine_poll(["209"], gone, CommandResult(rc, stdout, stderr, "login1"))
    assert err.value.unanswered == ["209"]
    assert "sacct" in str(err.value)


# ---------------------------------------------------------------------------------- scontrol show job

_PATHS = "StdErr=/l/logs/tao-a-301/main.err StdIn=/dev/null StdOut=/l/logs/tao-a-301/main.out"
_HEAD = (
    "JobId=301 JobName=tao-a UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=research QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    f"Reboot=0 ExitCode=0:0 RunTime=00:01:02 TimeLimit=04:00:00 TimeMin=N/A SubmitTime={START} "
    f"EligibleTime={START} AccrueTime={START} StartTime={START} EndTime=2026-12-01T14:00:00 Deadline=N/A "
    f"SuspendTime=None SecsPreSuspend=0 LastSchedEval={START} Scheduler=Main Partition=polar "
    "AllocNode:Sid=login1:4242 ReqNodeList=(null) ExcNodeList=(null) NodeList=n1 BatchHost=n1 NumNodes=1 "
    "NumCPUs=16 NumTasks=1 CPUs/Task=16 ReqB:S:C:T=0:0:*:*"
)
_TAIL = (
    "MinCPUsNode=16 MinMemoryNode=7200M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
    "Contiguous=0 Licenses=(null) Network=(null) Command=/l/jobs/tao-a/sbatch/job_tao-a.sbatch WorkDir=/l/jobs/tao-a"
)
_TRES = "cpu=16,mem=7200M,node=1,billing=16,gres/gpu=4"

#: ``scontrol -o show job ID``: release, the line (what changed is in the id).
SHOW_JOB_FORMS = [
    (
        "22.05 TRES= and flags run together",
        f"{_HEAD} TRES={_TRES} Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* {_TAIL} {_PATHS} Power= "
        "GresEnforceBind=YesKillOInInvalidDependent=No TresPerNode=gres:gpu:4",
    ),
    (
        "23.02 ReqTRES= and AllocTRES=",
        f"{_HEAD} ReqTRES={_TRES} AllocTRES={_TRES} Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* {_TAIL} "
        f"{_PATHS} Power= GresEnforceBind=YesKillOInInvalidDependent=No TresPerNode=gres/gpu:4",
    ),
    (
        "24.05 flags comma-separated",
        f"{_HEAD} ReqTRES={_TRES} AllocTRES={_TRES} Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* {_TAIL} "
        f"{_PATHS} Power= GresEnforceBind=Yes,KillOInInvalidDependent=No TresPerNode=gres/gpu:4",
    ),
    (
        "25.11 flags space-separated",
        f"{_HEAD} ReqTRES={_TRES} AllocTRES={_TRES} Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* {_TAIL} "
        f"{_PATHS} GresEnforceBind=Yes KillOnInvalidDependent=No ExpeditedRequeue=Yes TresPerNode=gres/gpu:4 ",
    ),
    (
        "26.05 expediting",
        f"{_HEAD.replace('JobState=RUNNING', 'JobState=EXPEDITING')} ReqTRES={_TRES} AllocTRES={_TRES} "
        f"Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* {_TAIL} {_PATHS} KillOnInvalidDependent=No "
        "TresPerNode=gres/gpu:4 ",
    ),
]
SHOW_JOB = {
    "JobId": "301",
    "JobName": "tao-a",
    "UserId": "alice",
    "JobState": "RUNNING",
    "StdOut": "/l/logs/tao-a-301/main.out",
    "StdErr": "/l/logs/tao-a-301/main.err",
    "WorkDir": "/l/jobs/tao-a",
    "Partition": "polar",
    "NodeList": "n1",
}


@pytest.mark.parametrize("line", [row[1] for row in SHOW_JOB_FORMS], ids=[row[0] for row in SHOW_JOB_FORMS])
def test_show_job_forms(line: str) -> None:
    found = commands.parse_show_job(line + "\n")
    expected = {**SHOW_JOB, "JobState": "EXPEDITING"} if "JobState=EXPEDITING" in line else SHOW_JOB
    assert found == expected


def test_show_job_25_11_blank_stderr_reads_as_none_set() -> None:
    """25.11 prints ``StdErr=`` blank unless the job set one (stderr then goes to StdOut)."""
    line = SHOW_JOB_FORMS[3][1].replace("StdErr=/l/logs/tao-a-301/main.err", "StdErr=")
    found = commands.parse_show_job(line)
    assert (found["StdErr"], found["StdOut"]) == ("", "/l/logs/tao-a-301/main.out")


@pytest.mark.parametrize(
    "stdout",
    [
        pytest.param("No jobs in the system\n", id="no-job-line"),
        pytest.param("Job 301 is gone\n", id="other-text"),
    ],
)
def test_an_unreadable_show_job_reply_is_an_error_naming_the_command_and_the_text(stdout: str) -> None:
    with pytest.raises(RemoteCommandError, match="scontrol show job printed") as err:
        commands.parse_show_job(stdout)
    assert stdout.strip() in str(err.value)


# ------------------------------------------------------------------------------------- sinfo nodes

#: ``sinfo -a -h -N -o '%N|%P|%t'``: release, line, usable (healthy and answering).
SINFO_NODE_FORMS = [
    ("22.05 idle", "n1|polar*|idle", True),
    ("22.05 mixed", "n1|polar|mix", True),
    ("22.05 allocated", "n1|polar|alloc", True),
    ("22.05 planned", "n1|polar|plnd", True),
    ("22.05 idle powered down", "n1|polar|idle~", True),
    ("22.05 not responding", "n1|polar|idle*", False),
    ("22.05 down", "n1|polar|down*", False),
    ("22.05 drained", "n1|polar|drain", False),
    ("22.05 draining", "n1|polar|drng", False),
    ("22.05 fail", "n1|polar|fail", False),
    ("22.05 failing (FAILG)", "n1|polar|failg", False),
    ("22.05 maintenance", "n1|polar|maint", False),
    ("22.05 rebooting", "n1|polar|boot^", False),
    ("22.05 powering up", "n1|polar|pow_up", False),
    ("22.05 unknown", "n1|polar|unk*", False),
    ("24.05 blocked (BLOCKED)", "n1|polar|block", True),
    ("25.11 failing, not responding", "n1|polar|failg*", False),
    ("26.05 external", "n1|polar|ext", False),
    ("a state no release printed yet", "n1|polar|newstate", False),
]


@pytest.mark.parametrize(
    ("line", "usable"), [row[1:] for row in SINFO_NODE_FORMS], ids=[row[0] for row in SINFO_NODE_FORMS]
)
def test_sinfo_node_forms(line: str, usable: bool) -> None:
    (row,) = commands.parse_node_states(line + "\n")
    assert (row.name, row.partition, row.usable) == ("n1", "polar", usable)


# ------------------------------------------------------------------------------------------ sbatch

#: sbatch's answer to ``--parsable`` (the held submission prints it last): release, stdout, stderr.
SBATCH_REPLY_FORMS = [
    ("22.05", "4242\n", ""),
    ("22.05 on a cluster", "4242;polar\n", ""),
    ("26.05 queue full, retried", "4242\n", "sbatch: error: Slurm job queue full, sleeping and retrying\n"),
    (
        "any release, retried twice",
        "4242\n",
        "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying\n",
    ),
]


@pytest.mark.parametrize(
    ("stdout", "stderr"), [row[1:] for row in SBATCH_REPLY_FORMS], ids=[row[0] for row in SBATCH_REPLY_FORMS]
)
def test_sbatch_reply_forms(monkeypatch: pytest.MonkeyPatch, stdout: str, stderr: str) -> None:
    """A slow submission is not a failed one: the job id is read from stdout whatever stderr says."""
    assert parse_sbatch_reply(stdout) is not None
    assert parse_sbatch_reply(stdout)[0] == "4242"  # type: ignore[index]
    hook = SlurmHook(settings=SETTINGS)
    monkeypatch.setattr(hook, "run", lambda *_a, **_k: CommandResult(0, stdout, stderr, "login1"))
    assert hook.submit("/l/jobs/j/job.sbatch", "tao-j", log_dir="/l/logs") == "4242"


def test_a_queue_full_sbatch_through_the_held_submission_script(held_submission: HeldSubmission) -> None:
    """The real submission script with a stand-in sbatch that retries as 26.05's does: the id comes through."""
    done = held_submission(
        {
            "sbatch": "echo 'sbatch: error: Slurm job queue full, sleeping and retrying' >&2; echo 4242",
            "squeue": "echo 4242",
            "scontrol": "exit 0",
        }
    )
    assert done.returncode == 0, done.stderr
    assert parse_sbatch_reply(done.stdout) == ("4242", None)
    assert "queue full" in done.stderr


#: ``sbatch_options`` that would put ``--gpus-per-node`` (or another GPU count) next to the templates'
#: ``--gres=gpu:N``; 26.05 refuses the pair. Key, the option sbatch takes it for.
GPU_OPTION_FORMS = [
    ("gpus-per-node", "gpus-per-node"),
    ("--gpus-per-node", "gpus-per-node"),
    ("gpus-per-n", "gpus-per-node"),
    ("gpus-per-nod", "gpus-per-node"),
    ("gres", "gres"),
    ("gpus", "gpus"),
    ("gpus-per-t", "gpus-per-task"),
]


@pytest.mark.parametrize(("key", "meant"), GPU_OPTION_FORMS, ids=[row[0] for row in GPU_OPTION_FORMS])
def test_no_sbatch_option_can_ask_for_gpus_beside_the_templates_gres(key: str, meant: str) -> None:
    with pytest.raises(ValidationError, match=f"may not set --{key.removeprefix('--')}") as err:
        site_options(sbatch_options={key: 2})
    assert f"--{meant}" in str(err.value)
    if meant == "gpus-per-node":
        assert "refuses --gres=gpu together with --gpus-per-node" in str(err.value)
        assert "gpus_per_node parameter" in str(err.value)
    with pytest.raises(ValidationError, match="is set by the provider"):
        check_sbatch_option(f"--{key.removeprefix('--')}=2")


@pytest.mark.parametrize("key", ["gres-flags", "mail-type", "time-min", "mem-bind", "hint", "gpu-bind"])
def test_other_options_that_share_a_start_are_still_accepted(key: str) -> None:
    assert site_options(sbatch_options={key: "x"}) == (f"--{key}=x",)
    check_sbatch_option(f"--{key}=x")


# -------------------------------------------------------------------------------- pending reasons

#: squeue ``%r`` of a pending job: release, reason, a word of its hint (``None``: no hint, no error).
PENDING_REASON_FORMS = [
    ("22.05", "Resources", "free nodes"),
    ("22.05", "Priority", "ahead in the queue"),
    ("25.11 requeue delay", "BeginTime", "begin time"),
    ("26.05", "No suitable topology unit found", "topology unit"),
    ("26.05", "No suitable topology unit found for segment", "topology unit"),
    ("26.05", "Insufficient resources in topology unit", "topology unit"),
    ("26.05", "Required nodes do not fit topology", "node constraints"),
    ("26.05", "Exceeded maximum node limit during topology allocation", "fewer nodes"),
    ("a reason no release printed yet", "Waiting for the moon", None),
    ("scontrol's form", "No_suitable_topology_unit_found", None),
]


@pytest.mark.parametrize(
    ("reason", "words"), [row[1:] for row in PENDING_REASON_FORMS], ids=[f"{r[0]}|{r[1]}" for r in PENDING_REASON_FORMS]
)
def test_pending_reason_forms(reason: str, words: str | None) -> None:
    hint = pending_hint(reason)
    assert (hint is None) if words is None else (words in (hint or ""))
