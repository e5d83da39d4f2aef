"""Failure classification: decide from evidence whether a failed job hit the infrastructure or the program.

The seed's table: a job that ended FAILED, BOOT_FAIL, DEADLINE, OUT_OF_MEMORY or NODE_FAIL is
retried (``retryable``) only when its log tail matches an infrastructure pattern; otherwise it is an
ERROR that no retry fixes. TIMEOUT is the program's (it ran out of its own wall time). CANCELLED,
PREEMPTED and REVOKED are CANCELED, not failures: SLURM's own requeue handles preemption (a
requeued job goes back to PENDING), so :func:`classify` refuses them. The verdict always keeps the
field or log line that decided as evidence.

Order of the decision:

1. TIMEOUT decides alone: a program failure. NODE_FAIL with ``Reason=PartitionDown`` decides alone
   too: SLURM (25.11 and later) ends so the jobs of a partition removed from the cluster; that is
   the infrastructure's doing, but a resubmission to the same partition cannot start.
2. Infrastructure evidence anywhere in the tail decides for infrastructure, retryable: hardware
   Xids (48, 63, 64, 74, 79, 92, 94, 95), "GPU has fallen off the bus", uncorrectable ECC, a network
   or NVLink link down, "CUDA driver initialization failed", SLURM's own
   ``*** JOB n ON node CANCELLED AT ... DUE TO NODE FAILURE ***`` banner, and the kernel's OOM killer
   reclaiming the node (see below). Its position does not matter: kernel messages are often copied
   into job logs after the program's own symptoms.
3. Otherwise the earliest error line decides. NCCL transport errors, "remote process exited or
   there was a network error" and NCCL watchdog timeouts are usually secondary (one rank died and
   the others lost it), so they decide for infrastructure only when no program error comes first.
   So does srun failing to reach slurmctld as it starts the step (``srun: error: Unable to confirm
   allocation for job n: Connection reset by peer``, or ``Unable to create step``, with a connection
   error): a controller restart or outage at that moment; the program never ran and no node is at
   fault (:attr:`Classification.blames_node` is false, so a resubmission avoids none).
   A Python traceback counts at its exception line, so a traceback that ends in an NCCL error is
   judged by that error.
4. No infrastructure evidence: not retryable. NODE_FAIL and BOOT_FAIL keep ``ERR_INFRA`` (the
   scheduler blames a node) but are not resubmitted on the state alone; OUT_OF_MEMORY and
   DEADLINE are program failures citing the state; FAILED cites the program line, else its State
   and ExitCode.

Host-memory kills of the job are program failures: ``slurmstepd: error: Detected 1 oom_kill
event``, a cgroup OOM (``constraint=CONSTRAINT_MEMCG``) and the kernel's ``Out of memory: Killed
process`` of the job's own process mean it exceeded the memory it asked for; a retry with the same
request fails the same way. The OOM killer reclaiming the *node* is infrastructure: a system-wide
OOM (``constraint=CONSTRAINT_NONE``) or a kill of a node daemon (slurmd, slurmstepd, sshd, munged,
systemd): another tenant or the node itself ran out of memory. Xid 13, 31 and 43 are usually caused
by the application (illegal memory access) and are program failures too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from airflow_provider_tao_slurm.core.states import ErrClass, JobState, TaoState
from airflow_provider_tao_slurm.exceptions import ValidationError

#: Log lines considered by default (the tail's last lines).
DEFAULT_MAX_LINES = 500
#: Longest evidence text kept: with its "SLURM job N failed; evidence: " prefix a task-log line stays under 300.
EVIDENCE_MAX_CHARS = 240
# Characters of one log line searched (bounds the regex work on a huge line).
_SCAN_CHARS = 4096


@dataclass(frozen=True)
class Classification:
    """The verdict on one failed job.

    :param err_class: ``ERR_INFRA`` or ``ERR_PROGRAM``.
    :param reason: short human text: what happened and what to do.
    :param evidence: the field or log line that decided, e.g. ``State=NODE_FAIL`` or
        ``line 812: NCCL WARN NET/IB : Got completion ... error 12``.
    :param retryable: ``True`` when resubmitting the same job may succeed.
    :param blames_node: ``False`` when the evidence shows no node at fault (the controller was out of
        reach), so a resubmission has no node to avoid.
    """

    err_class: ErrClass
    reason: str
    evidence: str
    retryable: bool
    blames_node: bool = True


class _Kind(Enum):
    #: Node or hardware evidence: decides for infrastructure wherever it appears.
    HARDWARE = "hardware"
    TRANSPORT = "transport"
    PROGRAM = "program"


@dataclass(frozen=True)
class _Rule:
    kind: _Kind
    pattern: re.Pattern[str]
    reason: str
    blames_node: bool = True


_XID = r"\bXid\b(?:\s*\([^)]*\))?\s*:?\s*(?:error\s+)?"

# Per line the first matching rule counts, so hardware rules come first.
_RULES = (
    _Rule(
        _Kind.HARDWARE,
        re.compile(_XID + r"(?:48|63|64|74|79|92|94|95)\b", re.IGNORECASE),
        "GPU hardware fault reported by the NVIDIA driver (Xid); retryable, exclude the node if it recurs",
    ),
    _Rule(
        _Kind.HARDWARE,
        re.compile(r"fallen off the bus|\bGPU is lost\b", re.IGNORECASE),
        "GPU fell off the bus; retryable, exclude the node if it recurs",
    ),
    _Rule(
        _Kind.HARDWARE,
        re.compile(r"uncorrectable ECC", re.IGNORECASE),
        "uncorrectable GPU memory (ECC) error; retryable, exclude the node if it recurs",
    ),
    _Rule(
        _Kind.HARDWARE,
        re.compile(r"CUDA driver initialization failed", re.IGNORECASE),
        "CUDA driver initialization failed on the node (GPU or driver problem); retryable",
    ),
    _Rule(
        _Kind.HARDWARE,
        re.compile(
            r"\b(?:ib\d+|mlx\d+_\d+|mlx\d+_core|infiniband|nvlink)\b.*\blink(?:\s+\d+)?\s+(?:is\s+)?down\b",
            re.IGNORECASE,
        ),
        "InfiniBand or NVLink link down; retryable, exclude the node if it recurs",
    ),
    _Rule(
        _Kind.HARDWARE,
        re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT .* DUE TO NODE FAILURE|srun: error: Node failure on "),
        "SLURM stopped the job because a node failed (NODE FAILURE); retryable, the failed node is excluded",
    ),
    _Rule(
        _Kind.HARDWARE,
        re.compile(
            r"constraint=CONSTRAINT_NONE"
            r"|out of memory: killed process \d+ \((?:slurmd|slurmstepd|sshd|munged|systemd[\w-]*|dbus-daemon)\)",
            re.IGNORECASE,
        ),
        "the kernel's OOM killer reclaimed the node (system-wide out of memory, not the job's own limit); retryable",
    ),
    _Rule(
        _Kind.PROGRAM,
        re.compile(_XID + r"(?:13|31|43)\b", re.IGNORECASE),
        "GPU fault most likely caused by the program (Xid 13/31/43: illegal memory access or exception)",
    ),
    _Rule(
        _Kind.PROGRAM,
        re.compile(r"\bCUDA out of memory\b|\bOutOfMemoryError\b|CUDA error: out of memory", re.IGNORECASE),
        "CUDA out of memory: reduce the batch size or model size, or use GPUs with more memory",
    ),
    _Rule(
        _Kind.PROGRAM,
        re.compile(r"device-side assert", re.IGNORECASE),
        "CUDA device-side assert (often a label or index out of range): fix the data or the program",
    ),
    _Rule(
        _Kind.PROGRAM,
        re.compile(r"\boom[-_ ]kill|\bout of memory: killed process", re.IGNORECASE),
        "host memory exhausted (OOM killer): request more memory or reduce the job's memory use",
    ),
    _Rule(
        _Kind.TRANSPORT,
        re.compile(r"NET/IB\s*:\s*Got completion|IBV_WC_\w*ERR"),
        "NCCL InfiniBand transport error; retryable",
    ),
    _Rule(
        _Kind.TRANSPORT,
        re.compile(r"remote process exited or there was a network error", re.IGNORECASE),
        "NCCL lost a peer (remote process exited or network error) with no earlier program error; retryable",
    ),
    _Rule(
        _Kind.TRANSPORT,
        re.compile(r"Watchdog caught collective operation timeout", re.IGNORECASE),
        "NCCL collective timed out (watchdog) with no earlier program error; retryable",
    ),
    _Rule(
        _Kind.TRANSPORT,
        re.compile(
            r"srun: error: Unable to (?:confirm allocation|create step) for job \d+: (?:Connection reset by peer"
            r"|Connection refused|Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted"
            r"|Communication connection failure|Broken pipe)",
            re.IGNORECASE,
        ),
        "srun could not reach slurmctld to start the step (a controller restart or outage): the program did not "
        "run; retryable, no node is at fault",
        blames_node=False,
    ),
)
_TRACEBACK_RULE = _Rule(
    _Kind.PROGRAM, re.compile(r"Traceback \(most recent call last\):"), "the program raised a Python exception"
)
# Rank prefixes added by `srun -l` ("0: ") and torchrun ("[rank0]: ", "[default0]:").
_RANK_PREFIX = re.compile(r"^(?:\d+:\s?|\[[^\]\s]*\]:\s?)*")

#: TIMEOUT decides alone.
_TIMEOUT = (
    ErrClass.ERR_PROGRAM,
    "wall-time limit reached (TIMEOUT): keep timeout_hours below time_hours and checkpoint",
)
#: NODE_FAIL with this reason: the job's partition was removed from the cluster (SLURM 25.11 and later).
PARTITION_REMOVED_REASON = "PartitionDown"
_PARTITION_REMOVED = (
    ErrClass.ERR_INFRA,
    "the job's partition was removed from the cluster (NODE_FAIL, Reason=PartitionDown); not resubmitted, "
    "as the same partition cannot run it: choose a partition that exists (sinfo -a) and rerun",
)
#: The verdict of a state whose log tail shows no infrastructure evidence (never retryable).
_WITHOUT_EVIDENCE = {
    "NODE_FAIL": (
        ErrClass.ERR_INFRA,
        "the scheduler reports a failed node (NODE_FAIL on {nodes}) but the log names no infrastructure "
        "error; not resubmitted: ask the cluster's admins about the node, then rerun",
    ),
    "BOOT_FAIL": (
        ErrClass.ERR_INFRA,
        "a node failed to boot (BOOT_FAIL on {nodes}) and the log names no infrastructure error; not "
        "resubmitted: ask the cluster's admins about the node, then rerun",
    ),
    "OUT_OF_MEMORY": (
        ErrClass.ERR_PROGRAM,
        "host memory limit exceeded (OUT_OF_MEMORY): request more memory or reduce memory use",
    ),
    "DEADLINE": (ErrClass.ERR_PROGRAM, "the job's --deadline passed before it finished (DEADLINE)"),
}


def _clip(text: str) -> str:
    return text if len(text) <= EVIDENCE_MAX_CHARS else text[: EVIDENCE_MAX_CHARS - 3] + "..."


def _verdict(
    err_class: ErrClass, reason: str, evidence: str, *, retryable: bool, blames_node: bool = True
) -> Classification:
    return Classification(err_class, reason, _clip(evidence), retryable, blames_node)


def _state_evidence(state: JobState) -> str:
    evidence = f"State={' '.join(state.raw_state.split()) or state.native}"
    if state.exit_code is not None:
        evidence += f" ExitCode={state.exit_code}:{state.signal or 0}"
    return evidence


def _exception_line(lines: list[str], header: int) -> int:
    """Index of the exception line closing the traceback that starts at ``header`` (else ``header``)."""
    match = _RANK_PREFIX.match(lines[header])  # only this rank's lines: other ranks may interleave
    prefix = match.group() if match else ""
    for index in range(header + 1, len(lines)):
        body = lines[index].removeprefix(prefix) if lines[index].startswith(prefix) else ""
        if body.strip() and not body[0].isspace():
            return index
    return header


def _log_hits(lines: list[str]) -> dict[int, _Rule]:
    """Map line index -> the rule that line shows; a traceback counts at its exception line."""
    hits: dict[int, _Rule] = {}
    for index, line in enumerate(lines):
        rule = next((r for r in _RULES if r.pattern.search(line[:_SCAN_CHARS])), None)
        if rule is not None:
            hits[index] = rule
    for index, line in enumerate(lines):
        if _TRACEBACK_RULE.pattern.search(line[:_SCAN_CHARS]):
            hits.setdefault(_exception_line(lines, index), _TRACEBACK_RULE)
    return hits


def classify(state: JobState, log_tail: str = "", max_lines: int = DEFAULT_MAX_LINES) -> Classification:
    """Classify a failed job as an infrastructure or a program failure, with evidence.

    Meant for jobs that ended in ERROR (or COMPLETE with a failed ``status.json``) and for UNKNOWN
    jobs whose logs are available. See the module docstring for the seed's table and the order of
    the decision.

    :param state: the job's final state.
    :param log_tail: the end of the job's stdout and stderr; only its last ``max_lines`` lines are read.
    :param max_lines: how many trailing lines to read (at least 1).
    :returns: the verdict; the evidence cites ``State=...`` or ``line <n>: <text>`` (``n`` counts
        from the first line of ``log_tail``), cut to :data:`EVIDENCE_MAX_CHARS` characters.
    :raises ValidationError: if ``max_lines`` is below 1, or the job is live or was cancelled,
        preempted or revoked (none is a failure to classify).
    """
    if max_lines < 1:
        raise ValidationError(f"max_lines must be at least 1, got {max_lines}; pass a positive line count")
    if state.tao_state in (TaoState.PENDING, TaoState.RUNNING, TaoState.CANCELED):
        raise ValidationError(
            f"job {state.job_id} is {state.tao_state} (SLURM {state.message}), not a failure; "
            "classify only jobs that ended in an error"
        )
    if state.native == "TIMEOUT":
        return _verdict(*_TIMEOUT, _state_evidence(state), retryable=False)
    if state.native == "NODE_FAIL" and state.reason == PARTITION_REMOVED_REASON:
        return _verdict(*_PARTITION_REMOVED, f"{_state_evidence(state)} Reason={state.reason}", retryable=False)

    all_lines = log_tail.splitlines()
    first_number = max(len(all_lines) - max_lines, 0) + 1
    lines = all_lines[-max_lines:]
    hits = _log_hits(lines)
    hardware = [index for index, rule in hits.items() if rule.kind is _Kind.HARDWARE]
    index = (min(hardware) if hardware else min(hits)) if hits else None
    if index is not None and hits[index].kind is not _Kind.PROGRAM:
        evidence = f"line {first_number + index}: {lines[index].strip()}"
        rule = hits[index]
        return _verdict(ErrClass.ERR_INFRA, rule.reason, evidence, retryable=True, blames_node=rule.blames_node)
    if state.native in _WITHOUT_EVIDENCE:
        err_class, reason = _WITHOUT_EVIDENCE[state.native]
        nodes = state.node_list or "an unknown node"
        return _verdict(err_class, reason.format(nodes=nodes), _state_evidence(state), retryable=False)
    if index is not None:
        evidence = f"line {first_number + index}: {lines[index].strip()}"
        return _verdict(ErrClass.ERR_PROGRAM, hits[index].reason, evidence, retryable=False)
    return _verdict(
        ErrClass.ERR_PROGRAM,
        f"no infrastructure error in the state or the log tail ({state.message}); treated as a program "
        "error: read the job's logs and fix the program or its inputs",
        _state_evidence(state),
        retryable=False,
    )
