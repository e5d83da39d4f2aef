"""Failure classification: state-decided cases and a corpus of realistic log tails."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.failures import EVIDENCE_MAX_CHARS, classify
from airflow_provider_tao_slurm.core.states import ErrClass, JobState, parse_sacct, state_from_native
from airflow_provider_tao_slurm.exceptions import ValidationError

INFRA, PROGRAM = ErrClass.ERR_INFRA, ErrClass.ERR_PROGRAM


def _job(
    raw_state: str = "FAILED", exit_code: int | None = 1, signal: int | None = 0, node_list: str | None = "n1"
) -> JobState:
    return state_from_native(
        "4242", raw_state, source="sacct", exit_code=exit_code, signal=signal, node_list=node_list, name="tao_job_1"
    )


# --- log corpus -----------------------------------------------------------------------------------

CUDA_OOM_NEW = """\
Epoch 0:   3%|▎         | 12/400 [00:09<04:51,  1.33it/s, loss=2.31]
Traceback (most recent call last):
  File "/opt/tao/train.py", line 212, in <module>
    main()
  File "/opt/tao/train.py", line 180, in main
    loss.backward()
  File "/usr/local/lib/python3.10/dist-packages/torch/_tensor.py", line 521, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
79.15 GiB of which 1.02 GiB is free. Of the allocated memory 75.1 GiB is allocated by PyTorch
Error executing job with overrides: ['train.batch_size=256']
"""

CUDA_OOM_OLD = """\
  File "/workspace/tlt/cv/detectnet_v2/train.py", line 88, in forward
    x = self.backbone(x)
RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; \
14.21 GiB already allocated; 8.75 MiB free; 14.44 GiB reserved in total by PyTorch)
"""

CUDA_OOM_CUDA_ERROR = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/train.py", line 12, in <module>
[rank0]:     x = torch.empty(10**12, device="cuda")
[rank0]: RuntimeError: CUDA error: out of memory
"""

DEVICE_ASSERT = """\
/opt/pytorch/aten/src/ATen/native/cuda/Loss.cu:240: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], \
thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.
Traceback (most recent call last):
  File "/opt/tao/classification/train.py", line 301, in <module>
    loss = criterion(logits, labels)
RuntimeError: CUDA error: device-side assert triggered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be \
incorrect.
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""

PLAIN_TRACEBACK = """\
INFO: loading spec /lustre/proj/job/specs/spec.yaml
Traceback (most recent call last):
  File "/opt/tao/dataset.py", line 77, in __getitem__
    label = self.classes[record["label"]]
            ~~~~~~~~~~~~^^^^^^^^^^^^^^^^^
KeyError: 'pedestrian_'
"""

SRUN_PREFIXED_TRACEBACK = """\
1: NCCL INFO Bootstrap : Using ib0:10.0.0.2<0>
0: Traceback (most recent call last):
0:   File "/opt/tao/train.py", line 40, in <module>
0:     open(cfg.dataset.path)
0: FileNotFoundError: [Errno 2] No such file or directory: '/lustre/proj/data/train.tfrecord'
"""

INTERLEAVED_RANKS = """\
[rank1]: Traceback (most recent call last):
[rank0]: n1:812:830 [0] NCCL INFO comm 0x55d5c0 rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE
[rank1]:   File "/opt/train.py", line 99, in step
[rank1]:     raise ValueError("label out of range: 91")
[rank1]: ValueError: label out of range: 91
"""

CHAINED_EXCEPTIONS = """\
Traceback (most recent call last):
  File "/opt/train.py", line 10, in load
    return cache[key]
KeyError: 'resnet18'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/opt/train.py", line 14, in <module>
    load("resnet18")
RuntimeError: pretrained weights missing for resnet18
"""

NCCL_IB_ERROR_12 = """\
n2:41234:41301 [3] NCCL INFO Channel 01/0 : 7[3] -> 0[0] [send] via NET/IB/0
n2:41234:41310 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<51242> \
with error 12, opcode 0, len 0, vendor err 129 (Send) localGid ::ffff:10.0.0.2 remoteGid ::ffff:10.0.0.1
n2:41234:41310 [3] NCCL INFO include/net.h:35 -> 6
Traceback (most recent call last):
  File "/opt/tao/train.py", line 150, in <module>
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, \
remote process exited or there was a network error, NCCL version 2.19.3
"""

IBV_RETRY_EXC = """\
n1:2211:2290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>
n1:2211:2301 [0] transport/net_ib.cc:1512 NCCL WARN NET/IB : req 12 status=IBV_WC_RETRY_EXC_ERR(12) \
opcode=0 len=0 vendor err 129
"""

REMOTE_EXITED_ONLY = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/train.py", line 77, in <module>
[rank0]:     dist.all_reduce(t)
[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, \
remote process exited or there was a network error, NCCL version 2.21.5
[rank0]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
"""

OOM_THEN_REMOTE_EXITED = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/train.py", line 80, in <module>
[rank1]:     out = model(batch)
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 1 has a total capacity of \
79.15 GiB of which 2.00 GiB is free.
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/train.py", line 77, in <module>
[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, \
remote process exited or there was a network error, NCCL version 2.21.5
"""

WATCHDOG_ONLY = """\
[rank0]:[E501 10:42:17.512071 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=1842, OpType=ALLREDUCE, NumelIn=25557032, NumelOut=25557032, Timeout(ms)=600000) ran for \
600040 milliseconds before timing out.
[rank0]:[E501 10:42:17.512412 ProcessGroupNCCL.cpp:1664] [PG 0 Rank 0] Exception (either an error or timeout) \
detected by watchdog at work: 1842, last enqueued NCCL work: 1842, last completed NCCL work: 1841.
terminate called after throwing an instance of 'c10::DistBackendError'
"""

OOM_THEN_WATCHDOG = """\
1: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 1; 39.39 GiB total \
capacity; 36.80 GiB already allocated)
0: [E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, \
OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800498 milliseconds before timing out.
2: [E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, \
OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800512 milliseconds before timing out.
3: [E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, \
OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800530 milliseconds before timing out.
"""

TRACEBACK_THEN_WATCHDOG = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/opt/tao/data.py", line 51, in __next__
[rank3]: ValueError: image /lustre/proj/data/img_0042.jpg has 4 channels, expected 3
[rank0]:[E501 10:52:17.512071 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=9, OpType=BROADCAST, Timeout(ms)=600000) ran for 600031 milliseconds before timing out.
"""

WATCHDOG_THEN_TRACEBACK = """\
[rank0]:[E501 10:52:17.512071 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600031 milliseconds before timing out.
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/train.py", line 90, in <module>
[rank0]: RuntimeError: NCCL communicator was aborted on rank 0.
"""

IB_THEN_OOM = """\
n1:2211:2301 [0] transport/net_ib.cc:1512 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<43000> with \
error 12, opcode 1, len 0, vendor err 129
Traceback (most recent call last):
RuntimeError: CUDA out of memory. Tried to allocate 64.00 MiB
"""

XID79_AFTER_CUDA_ERROR = """\
Traceback (most recent call last):
  File "/opt/train.py", line 66, in <module>
    torch.cuda.synchronize()
RuntimeError: CUDA error: unspecified launch failure
CUDA kernel errors might be asynchronously reported at some other API call.
=== kernel messages (epilog) ===
[Wed May  1 10:41:02 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, \
GPU has fallen off the bus.
[Wed May  1 10:41:02 2024] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
"""

XID13 = """\
RuntimeError: CUDA error: an illegal memory access was encountered
[Wed May  1 10:41:02 2024] NVRM: Xid (PCI:0000:3b:00): 13, pid=3312, name=python, Graphics SM Warp Exception \
on (GPC 0, TPC 1, SM 0): Out Of Range Address
"""

XID13_THEN_XID79 = """\
[Wed May  1 10:41:01 2024] NVRM: Xid (PCI:0000:3b:00): 13, pid=3312, name=python, Graphics Exception
[Wed May  1 10:41:02 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=3312, GPU has fallen off the bus.
"""

XID31 = """\
NVRM: Xid (PCI:0000:86:00): 31, pid=991, name=python3, Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS \
GPCCLIENT_T1_0 faulted @ 0x7f3c_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ
"""

XID43 = """\
NVRM: Xid (PCI:0000:86:00): 43, pid=991, name=python3, Ch 00000008
"""

XID48 = """\
NVRM: Xid (PCI:0000:af:00): 48, pid=2131, name=python, An uncorrectable double bit error (DBE) has been detected \
on GPU in the framebuffer at partition 6, subpartition 0.
"""

XID63 = "NVRM: Xid (PCI:0000:07:00): 63, pid=1212, name=python, Row Remapper: New row marked for remapping\n"
XID64 = "NVRM: Xid (PCI:0000:07:00): 64, pid=1212, Row Remapper Error: the remapping of a row failed\n"
XID74 = "NVRM: Xid (PCI:0000:07:00): 74, pid=1212, name=python, NVLink: fatal error detected on link 3\n"
XID92 = "NVRM: Xid (PCI:0000:07:00): 92, pid=1212, High single-bit ECC error rate\n"
XID94 = "NVRM: Xid (PCI:0000:c1:00): 94, pid=1212, name=python, Contained: SM (0x1). RST: No, D-RST: No\n"
XID95 = "NVRM: Xid (PCI:0000:c1:00): 95, pid=1212, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No\n"
DCGM_XID = "dcgm health: GPU 3 XID error 79 reported by the driver\n"

GPU_IS_LOST = """\
Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU
"""

UNCORRECTABLE_ECC = """\
Traceback (most recent call last):
  File "/opt/train.py", line 120, in <module>
RuntimeError: CUDA error: uncorrectable ECC error encountered
"""

DRIVER_INIT_FAILED = """\
Traceback (most recent call last):
  File "/opt/tao/entrypoint.py", line 31, in <module>
    torch.cuda.set_device(local_rank)
  File "/usr/local/lib/python3.10/dist-packages/torch/cuda/__init__.py", line 247, in _lazy_init
    torch._C._cuda_init()
RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.
"""

IB_LINK_DOWN = """\
[Wed May  1 10:40:00 2024] mlx5_core 0000:5e:00.0 ib0: Link down
n1:2211:2301 [0] NCCL INFO Call to ibv_modify_qp failed
"""

NVLINK_DOWN = "nvidia-nvlink: NVLink link 2 is down on GPU 0000:3b:00.0\n"

SLURM_OOM_KILL = """\
Epoch 3: 100%|██████████| 400/400 [05:11<00:00,  1.28it/s]
slurmstepd: error: Detected 1 oom_kill event in StepId=4242.batch. Some of the step tasks have been OOM Killed.
"""

KERNEL_OOM = "[Wed May  1 10:40:00 2024] Out of memory: Killed process 3312 (python) total-vm:91234567kB\n"

NOISE_ONLY = """\
n1:2211:2290 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.
n1:2211:2290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>
/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py:557: UserWarning: This DataLoader will \
create 16 worker processes in total.
Epoch 1: 100%|██████████| 400/400 [05:11<00:00,  1.28it/s, loss=0.412]
"""

TAIL_CUT_AT_HEADER = "INFO: step 1200\nTraceback (most recent call last):\n"

OOM_IN_TORCHRUN_SUMMARY = """\
[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB.
E0501 10:41:02.123000 140 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: 1) \
local_rank: 2 (pid: 3314) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""

# The batch log of a job whose srun met slurmctld restarting (SLURM 26.05, the harness's restart-slurmctld).
SRUN_CONTROLLER_RESET = """\
TAO_SLURM: job 4528 start on n1, restart 0
TAO_SLURM: rendezvous 127.0.0.1:53277, 1 GPUs
TAO_SLURM: step start
srun: error: Unable to confirm allocation for job 4528: Connection reset by peer
srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 4528
TAO_SLURM: step exit code 1
TAO_SLURM: end
"""

SRUN_STEP_NO_CONTROLLER = """\
srun: error: Unable to create step for job 917: Unable to contact slurm controller (connect failure)
"""

# srun naming a job the controller no longer knows is no connection problem: not resubmitted on that alone.
SRUN_INVALID_JOB = """\
srun: error: Unable to confirm allocation for job 917: Invalid job id specified
srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 917
"""

CORPUS = [
    # id, state, log, expected class, text the evidence must contain
    ("cuda-oom-torch-2", "FAILED", CUDA_OOM_NEW, PROGRAM, "line 9: torch.OutOfMemoryError: CUDA out of memory"),
    ("cuda-oom-old-runtimeerror", "FAILED", CUDA_OOM_OLD, PROGRAM, "line 3: RuntimeError: CUDA out of memory"),
    (
        "cuda-error-out-of-memory",
        "FAILED",
        CUDA_OOM_CUDA_ERROR,
        PROGRAM,
        "line 4: [rank0]: RuntimeError: CUDA error: out of memory",
    ),
    ("device-side-assert", "FAILED", DEVICE_ASSERT, PROGRAM, "line 5: RuntimeError: CUDA error: device-side assert"),
    ("plain-traceback", "FAILED", PLAIN_TRACEBACK, PROGRAM, "line 6: KeyError: 'pedestrian_'"),
    ("srun-prefixed-traceback", "FAILED", SRUN_PREFIXED_TRACEBACK, PROGRAM, "line 5: 0: FileNotFoundError"),
    ("interleaved-ranks", "FAILED", INTERLEAVED_RANKS, PROGRAM, "line 5: [rank1]: ValueError: label out of range"),
    ("chained-exceptions-first-wins", "FAILED", CHAINED_EXCEPTIONS, PROGRAM, "line 4: KeyError: 'resnet18'"),
    ("nccl-ib-error-12", "FAILED", NCCL_IB_ERROR_12, INFRA, "line 2: n2:41234:41310 [3] transport/net_ib.cc"),
    ("ibv-retry-exc-err", "FAILED", IBV_RETRY_EXC, INFRA, "line 2: n1:2211:2301 [0] transport/net_ib.cc:1512"),
    (
        "remote-exited-no-earlier-error",
        "FAILED",
        REMOTE_EXITED_ONLY,
        INFRA,
        "line 4: [rank0]: torch.distributed.DistBackendError",
    ),
    ("oom-then-remote-exited", "FAILED", OOM_THEN_REMOTE_EXITED, PROGRAM, "line 4: [rank1]: torch.OutOfMemoryError"),
    ("watchdog-only", "FAILED", WATCHDOG_ONLY, INFRA, "line 1: [rank0]:[E501 10:42:17.512071"),
    ("oom-then-watchdogs", "FAILED", OOM_THEN_WATCHDOG, PROGRAM, "line 1: 1: torch.cuda.OutOfMemoryError"),
    ("traceback-then-watchdog", "FAILED", TRACEBACK_THEN_WATCHDOG, PROGRAM, "line 3: [rank3]: ValueError: image"),
    ("watchdog-then-traceback", "FAILED", WATCHDOG_THEN_TRACEBACK, INFRA, "line 1: [rank0]:[E501"),
    ("ib-error-before-oom", "FAILED", IB_THEN_OOM, INFRA, "line 1: n1:2211:2301"),
    ("xid79-after-cuda-error", "FAILED", XID79_AFTER_CUDA_ERROR, INFRA, "line 7: [Wed May  1 10:41:02 2024] NVRM: Xid"),
    ("xid13-app-fault", "FAILED", XID13, PROGRAM, "line 2: [Wed May  1 10:41:02 2024] NVRM: Xid (PCI:0000:3b:00): 13"),
    ("xid13-then-xid79", "FAILED", XID13_THEN_XID79, INFRA, "line 2: [Wed May  1 10:41:02 2024] NVRM: Xid"),
    ("xid31-mmu-fault", "FAILED", XID31, PROGRAM, "line 1: NVRM: Xid (PCI:0000:86:00): 31"),
    ("xid43-app-fault", "FAILED", XID43, PROGRAM, "line 1: NVRM: Xid (PCI:0000:86:00): 43"),
    ("xid48-dbe", "FAILED", XID48, INFRA, "line 1: NVRM: Xid (PCI:0000:af:00): 48"),
    ("xid63-row-remap", "FAILED", XID63, INFRA, "line 1: NVRM: Xid (PCI:0000:07:00): 63"),
    ("xid64-row-remap-failed", "FAILED", XID64, INFRA, "line 1: NVRM: Xid (PCI:0000:07:00): 64"),
    ("xid74-nvlink", "FAILED", XID74, INFRA, "line 1: NVRM: Xid (PCI:0000:07:00): 74"),
    ("xid92-ecc-rate", "FAILED", XID92, INFRA, "line 1: NVRM: Xid (PCI:0000:07:00): 92"),
    ("xid94-contained-ecc", "FAILED", XID94, INFRA, "line 1: NVRM: Xid (PCI:0000:c1:00): 94"),
    ("xid95-uncontained-ecc", "FAILED", XID95, INFRA, "line 1: NVRM: Xid (PCI:0000:c1:00): 95"),
    ("dcgm-xid-error-79", "FAILED", DCGM_XID, INFRA, "line 1: dcgm health: GPU 3 XID error 79"),
    ("gpu-is-lost", "FAILED", GPU_IS_LOST, INFRA, "line 1: Unable to determine the device handle"),
    ("uncorrectable-ecc", "FAILED", UNCORRECTABLE_ECC, INFRA, "line 3: RuntimeError: CUDA error: uncorrectable ECC"),
    (
        "cuda-driver-init-failed",
        "FAILED",
        DRIVER_INIT_FAILED,
        INFRA,
        "line 6: RuntimeError: CUDA driver initialization failed",
    ),
    ("ib-link-down", "FAILED", IB_LINK_DOWN, INFRA, "line 1: [Wed May  1 10:40:00 2024] mlx5_core 0000:5e:00.0 ib0"),
    ("nvlink-down", "FAILED", NVLINK_DOWN, INFRA, "line 1: nvidia-nvlink: NVLink link 2 is down"),
    ("slurmstepd-oom-kill", "FAILED", SLURM_OOM_KILL, PROGRAM, "line 2: slurmstepd: error: Detected 1 oom_kill event"),
    ("kernel-oom-killer", "FAILED", KERNEL_OOM, PROGRAM, "line 1: [Wed May  1 10:40:00 2024] Out of memory: Killed"),
    ("noise-only", "FAILED", NOISE_ONLY, PROGRAM, "State=FAILED ExitCode=1:0"),
    ("empty-log", "FAILED", "", PROGRAM, "State=FAILED ExitCode=1:0"),
    (
        "tail-cut-at-traceback-header",
        "FAILED",
        TAIL_CUT_AT_HEADER,
        PROGRAM,
        "line 2: Traceback (most recent call last):",
    ),
    (
        "torchrun-summary-after-oom",
        "FAILED",
        OOM_IN_TORCHRUN_SUMMARY,
        PROGRAM,
        "line 1: [rank2]: torch.OutOfMemoryError",
    ),
    ("special-exit-with-ib-error", "SPECIAL_EXIT", IBV_RETRY_EXC, INFRA, "line 2: n1:2211:2301"),
    ("completed-but-status-failed", "COMPLETED", PLAIN_TRACEBACK, PROGRAM, "line 6: KeyError"),
    ("unknown-state-no-log", "WEIRD_STATE", "", PROGRAM, "State=WEIRD_STATE ExitCode=1:0"),
    ("srun-met-a-controller-restart", "FAILED", SRUN_CONTROLLER_RESET, INFRA, "line 4: srun: error: Unable to confirm"),
    ("srun-step-without-controller", "FAILED", SRUN_STEP_NO_CONTROLLER, INFRA, "line 1: srun: error: Unable to create"),
    ("srun-invalid-job-is-no-outage", "FAILED", SRUN_INVALID_JOB, PROGRAM, "State=FAILED ExitCode=1:0"),
]


@pytest.mark.parametrize(
    ("raw_state", "log", "err_class", "evidence"), [row[1:] for row in CORPUS], ids=[row[0] for row in CORPUS]
)
def test_classify_log_corpus(raw_state: str, log: str, err_class: ErrClass, evidence: str) -> None:
    verdict = classify(_job(raw_state), log)
    assert verdict.err_class is err_class
    assert verdict.retryable is (err_class is ErrClass.ERR_INFRA)
    assert verdict.evidence.startswith(evidence), verdict.evidence
    assert verdict.reason


@pytest.mark.parametrize(
    ("log", "words"),
    [
        pytest.param(CUDA_OOM_NEW, "reduce the batch size", id="cuda-oom"),
        pytest.param(XID79_AFTER_CUDA_ERROR, "Xid", id="xid"),
        pytest.param(OOM_THEN_REMOTE_EXITED, "CUDA out of memory", id="secondary-nccl-blames-oom"),
        pytest.param(REMOTE_EXITED_ONLY, "no earlier program error", id="nccl-peer-lost"),
        pytest.param(SLURM_OOM_KILL, "request more memory", id="host-oom"),
        pytest.param(PLAIN_TRACEBACK, "Python exception", id="traceback"),
        pytest.param("", "read the job's logs", id="no-evidence"),
    ],
)
def test_reason_names_problem_and_fix(log: str, words: str) -> None:
    assert words in classify(_job(), log).reason


# --- the seed's table: the state and the log decide together ---------------------------------------

NODE_FAILURE_BANNER = """\
Epoch 3:  41%|████      | 164/400 [02:11<03:09,  1.25it/s, loss=0.82]
slurmstepd: error: *** JOB 4242 ON n2 CANCELLED AT 2026-12-03T06:40:11 DUE TO NODE FAILURE ***
"""
NODE_OOM_KILLER = """\
[Thu Dec  3 06:12:40 2026] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,task=slurmd
[Thu Dec  3 06:12:40 2026] Out of memory: Killed process 2211 (slurmd) total-vm:812340kB, anon-rss:10220kB
Traceback (most recent call last):
  File "/opt/tao/train.py", line 180, in main
RuntimeError: DataLoader worker (pid 9121) is killed by signal: Killed.
"""
JOB_OOM_KILLER = """\
[Thu Dec  3 06:12:40 2026] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,task=python
[Thu Dec  3 06:12:40 2026] Memory cgroup out of memory: Killed process 9121 (python) total-vm:9812340kB
slurmstepd: error: Detected 1 oom_kill event in StepId=4242.batch. Some of the step tasks have been OOM Killed.
"""
TIMEOUT_REASON = "wall-time limit reached (TIMEOUT): keep timeout_hours below time_hours and checkpoint"
NO_INFRA = "the log names no infrastructure error; not resubmitted"


@pytest.mark.parametrize(
    ("raw_state", "signal", "log", "err_class", "retryable", "evidence", "words"),
    [
        pytest.param(
            "NODE_FAIL", 0, NODE_FAILURE_BANNER, INFRA, True, "line 2: slurmstepd: error: *** JOB 4242 ON n2",
            "a node failed (NODE FAILURE); retryable", id="node-fail-with-slurm-banner",
        ),
        pytest.param(
            "NODE_FAIL", 0, CUDA_OOM_NEW, INFRA, False, "State=NODE_FAIL ExitCode=0:0",
            f"failed node (NODE_FAIL on n1) but {NO_INFRA}", id="node-fail-program-log-not-retried",
        ),
        pytest.param(
            "NODE_FAIL", 0, "", INFRA, False, "State=NODE_FAIL ExitCode=0:0", NO_INFRA, id="node-fail-no-log",
        ),
        pytest.param(
            "BOOT_FAIL", 0, "", INFRA, False, "State=BOOT_FAIL", f"(BOOT_FAIL on n1) and {NO_INFRA}",
            id="boot-fail-no-log",
        ),
        pytest.param(
            "BOOT_FAIL", 0, DRIVER_INIT_FAILED, INFRA, True, "line", "CUDA driver initialization failed",
            id="boot-fail-driver",
        ),
        pytest.param(
            "TIMEOUT", 15, WATCHDOG_ONLY, PROGRAM, False, "State=TIMEOUT ExitCode=0:15", TIMEOUT_REASON,
            id="timeout-decides-alone",
        ),
        pytest.param(
            "OUT_OF_MEMORY", 125, XID79_AFTER_CUDA_ERROR, INFRA, True, "line", "GPU hardware fault",
            id="out-of-memory-with-xid79",
        ),
        pytest.param(
            "OUT_OF_MEMORY", 125, NODE_OOM_KILLER, INFRA, True, "line 1: [Thu Dec  3 06:12:40 2026] oom-kill:",
            "OOM killer reclaimed the node", id="out-of-memory-node-reclaimed",
        ),
        pytest.param(
            "OUT_OF_MEMORY", 125, JOB_OOM_KILLER, PROGRAM, False, "State=OUT_OF_MEMORY ExitCode=0:125",
            "host memory limit exceeded (OUT_OF_MEMORY)", id="out-of-memory-own-limit",
        ),
        pytest.param(
            "OUT_OF_MEMORY", 125, "", PROGRAM, False, "State=OUT_OF_MEMORY ExitCode=0:125",
            "request more memory", id="out-of-memory-no-log",
        ),
        pytest.param(
            "DEADLINE", 0, "", PROGRAM, False, "State=DEADLINE ExitCode=0:0", "--deadline passed",
            id="deadline-no-log",
        ),
        pytest.param(
            "DEADLINE", 0, NCCL_IB_ERROR_12, INFRA, True, "line", "InfiniBand transport error", id="deadline-ib",
        ),
        pytest.param(
            "FAILED", 0, NODE_OOM_KILLER, INFRA, True, "line 1:", "OOM killer reclaimed the node",
            id="failed-node-reclaimed-beats-later-traceback",
        ),
        pytest.param(
            "FAILED", 0, JOB_OOM_KILLER, PROGRAM, False, "line 1:", "host memory exhausted (OOM killer)",
            id="failed-own-oom",
        ),
        pytest.param(
            "FAILED", 0, "", PROGRAM, False, "State=FAILED ExitCode=1:0",
            "no infrastructure error in the state or the log tail (FAILED)", id="plain-failed",
        ),
    ],
)  # fmt: skip
def test_classify_follows_the_seeds_table(
    raw_state: str,
    signal: int,
    log: str,
    err_class: ErrClass,
    retryable: bool,
    evidence: str,
    words: str,
) -> None:
    exit_code = 1 if raw_state == "FAILED" else 0
    verdict = classify(_job(raw_state, None if raw_state == "BOOT_FAIL" else exit_code, signal), log)
    assert (verdict.err_class, verdict.retryable) == (err_class, retryable)
    assert verdict.evidence.startswith(evidence), verdict.evidence
    assert words in verdict.reason, verdict.reason


@pytest.mark.parametrize(
    ("row", "log", "err_class", "retryable", "evidence"),
    [
        pytest.param(
            "4242|tao_job_1|TIMEOUT|0:15|TimeLimit|n1|2026-12-03T06:00:00|2026-12-03T07:00:05", WATCHDOG_ONLY, PROGRAM,
            False, "State=TIMEOUT ExitCode=0:15", id="timeout-as-printed-with-watchdog-lines-decides-alone",
        ),
        pytest.param(
            "4242|tao_job_1|TIMEOUT|0:15|TimeLimit|n1|2026-12-03T06:00:00|2026-12-03T07:00:05", REMOTE_EXITED_ONLY,
            PROGRAM, False, "State=TIMEOUT ExitCode=0:15", id="timeout-as-printed-with-nccl-remote-exited",
        ),
    ],
)  # fmt: skip
def test_classify_a_state_as_sacct_prints_it(
    row: str, log: str, err_class: ErrClass, retryable: bool, evidence: str
) -> None:
    """The state parsed from sacct's own row (the sensor's path), not one built in the test: the time limit's SIGTERM
    leaves NCCL errors in the other ranks' logs, and the TIMEOUT still decides alone."""
    (state,) = parse_sacct(row + "\n").values()
    verdict = classify(state, log)
    assert (verdict.err_class, verdict.retryable) == (err_class, retryable)
    assert verdict.evidence == evidence
    assert TIMEOUT_REASON in verdict.reason


def test_node_fail_without_node_list() -> None:
    verdict = classify(_job("NODE_FAIL", node_list=None))
    assert "(NODE_FAIL on an unknown node)" in verdict.reason


@pytest.mark.parametrize(
    "raw_state",
    [
        pytest.param("RUNNING", id="running"),
        pytest.param("PENDING", id="pending"),
        pytest.param("SUSPENDED", id="suspended"),
        pytest.param("CANCELLED by 1001", id="cancelled-by-user"),
        pytest.param("REVOKED", id="revoked"),
        pytest.param("PREEMPTED", id="preempted"),
    ],
)
def test_classify_refuses_live_or_cancelled_jobs(raw_state: str) -> None:
    with pytest.raises(ValidationError, match="not a failure"):
        classify(_job(raw_state))


@pytest.mark.parametrize("max_lines", [0, -5])
def test_classify_refuses_bad_max_lines(max_lines: int) -> None:
    with pytest.raises(ValidationError, match="max_lines must be at least 1"):
        classify(_job(), "", max_lines=max_lines)


# --- bounds ----------------------------------------------------------------------------------------


def _long_log() -> str:
    lines = [f"INFO step {n}" for n in range(1, 601)]
    lines[9] = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    lines[589] = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)"
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("max_lines", "err_class", "evidence"),
    [
        pytest.param(500, INFRA, "line 590: [Rank 0] Watchdog", id="default-window-misses-early-oom"),
        pytest.param(600, PROGRAM, "line 10: torch.OutOfMemoryError", id="wide-window-sees-oom"),
        pytest.param(11, INFRA, "line 590: [Rank 0] Watchdog", id="narrow-window"),
        pytest.param(5, PROGRAM, "State=FAILED", id="window-misses-everything"),
        pytest.param(1, PROGRAM, "State=FAILED", id="one-line-the-least-window"),
    ],
)
def test_only_the_last_max_lines_count(max_lines: int, err_class: ErrClass, evidence: str) -> None:
    verdict = classify(_job(), _long_log(), max_lines=max_lines)
    assert verdict.err_class is err_class
    assert verdict.evidence.startswith(evidence), verdict.evidence


def test_evidence_is_truncated() -> None:
    line = "RuntimeError: CUDA out of memory. " + "x" * 1000
    verdict = classify(_job(), line)
    assert len(verdict.evidence) == EVIDENCE_MAX_CHARS
    assert verdict.evidence.startswith("line 1: RuntimeError: CUDA out of memory.")
    assert verdict.evidence.endswith("...")


def test_short_evidence_is_kept_whole() -> None:
    assert classify(_job(), "KeyError: 'x'\nTraceback (most recent call last):\nKeyError: 'y'\n").evidence == (
        "line 3: KeyError: 'y'"
    )


@pytest.mark.parametrize(
    ("log", "blames_node"),
    [
        pytest.param(SRUN_CONTROLLER_RESET, False, id="controller-restart-blames-no-node"),
        pytest.param(SRUN_STEP_NO_CONTROLLER, False, id="controller-unreachable-blames-no-node"),
        pytest.param(XID79_AFTER_CUDA_ERROR, True, id="gpu-fault-blames-the-node"),
        pytest.param(IB_LINK_DOWN, True, id="link-down-blames-the-node"),
    ],
)
def test_whether_the_evidence_blames_a_node(log: str, blames_node: bool) -> None:
    verdict = classify(_job(), log)
    assert verdict.retryable
    assert verdict.blames_node is blames_node
    if not blames_node:
        assert "did not run" in verdict.reason
        assert "no node is at fault" in verdict.reason
