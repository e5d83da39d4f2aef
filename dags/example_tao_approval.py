"""Example DAG: a person approves a training over the GPU-hour budget, and the export after seeing the evaluation.

Approval before the expensive part, with Airflow's human-in-the-loop ``ApprovalOperator``
(``airflow.providers.standard.operators.hitl``, Airflow 3.1+):

1. ``check_datasets`` and ``import_image``: the cheap checks first, as in ``example_tao_pipeline``.
2. ``check_budget``: a ``BranchPythonOperator`` weighs what the training can use against the
   ``gpu_hour_budget`` Param (``gpu_hours_request``): one slice is nodes x GPUs per node x wall time,
   and a training continued from its checkpoints (``max_continuations=1`` here) can run up to
   ``max_continuations + 1`` slices, so the budget is judged on that most. Within the budget the run
   goes straight on to ``train``; over it, ``approve_training`` asks a person first, its subject and
   body showing both figures, ``2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours per slice; at most
   2 slices = 8 GPU hours``, and the budget.
3. ``train`` / ``wait_train``: the multi-node training (2 nodes x 1 GPU, TAO's rendezvous on every
   node as in ``example_tao_multinode``; node 0 writes the results, the others under ``node_<rank>``).
4. ``evaluate`` / ``wait_evaluate``: evaluates the training's checkpoints; the sensor's XCom carries the
   KPIs that the evaluation reported in its ``status.json`` (``kpis``).
5. ``approve_export``: its body lists those KPIs; Approve runs ``export`` / ``wait_export``.

Reject (or no answer within a day) skips what follows the approval, and the run still succeeds. A
waiting approval is a task in the ``awaiting_input`` state: answer it in the UI (the run's "Required
Actions") or through the REST API, ``GET`` to read and ``PATCH`` to answer
``/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails``, with
``{"chosen_options": ["Approve"]}``.

The defaults fit the local test cluster of ``make demo`` (the training program is
``/srv/lustre/demo/tao_like_train.py``): the training can use at most 8 GPU hours, four times the
default budget, so a run asks for approval; ``--conf '{"gpu_hour_budget": 8}'`` goes straight on. The training's NCCL
settings are the ``nccl_env`` Param (none by default: the test cluster has no CUDA); on a GPU cluster,
probe them before the training with ``NcclProbeOperator`` and pass its output, as ``example_tao_multinode`` does.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.providers.standard.operators.python import BranchPythonOperator
from airflow.sdk import DAG, Param

from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

DAG_ID = "example_tao_approval"
NODES, GPUS_PER_NODE, TIME_HOURS = 2, 1, 2.0
#: The training goes on from its checkpoints after a slice ends at its time limit, once: at most 2 slices.
MAX_CONTINUATIONS = 1
IMAGE = "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt"
DATASETS = {"train": "lustre:///srv/lustre/demo/data/train", "val": "lustre:///srv/lustre/demo/data/val"}
PROGRAM = "python3 /srv/lustre/demo/tao_like_train.py"
#: Every node of the training runs this: node 0 writes the results, the others under node_<rank>.
TRAIN = (
    'OUT={results_dir}; [ "$NODE_RANK" = 0 ] || OUT="$OUT/node_$NODE_RANK"; '
    f'exec {PROGRAM} --spec {{config_path}} --results "$OUT"'
)
CHECKPOINTS = "{{ ti.xcom_pull(task_ids='train')['results_dir'] }}/checkpoints"
#: How evaluate and export read the training's checkpoints and where they write.
AFTER_TRAINING = f"--checkpoint {CHECKPOINTS} --results {{results_dir}}"
#: The request's arithmetic, as ``check_budget`` pushed it, and the budget.
REQUEST = "{{ ti.xcom_pull(task_ids='check_budget', key='gpu_request') }}"
BUDGET = "{{ params.gpu_hour_budget }} GPU hours"
#: The evaluation's KPIs, one Markdown list item each (from the evaluate sensor's XCom).
KPI_LIST = (
    "{% for name, value in (ti.xcom_pull(task_ids='wait_evaluate').get('kpis') or {}).items() %}"
    "- {{ name }}: {{ value }}\n"
    "{% else %}- none: the evaluation reported no KPIs in its status.json\n{% endfor %}"
)

log = logging.getLogger(__name__)


# [START example_tao_approval_budget]
def route_by_budget(
    nodes: int, gpus_per_node: int, time_hours: float, max_continuations: int, budget: float, ti: Any
) -> str:
    """Return the task after ``check_budget``: ``train`` when the request fits ``budget``, else ``approve_training``.

    The budget is judged on the most the training can use: ``max_continuations + 1`` slices of nodes x
    GPUs per node x wall time. Both figures, e.g. ``2 node(s) x 1 GPU(s) per node x 2 h = 4 GPU hours per
    slice; at most 2 slices = 8 GPU hours``, go to XCom (key ``gpu_request``) for the approval's subject
    and body.

    :param max_continuations: the training's (0: one slice, and both figures are the same).
    :param budget: the GPU hours a training may use without a person's approval.
    """
    from airflow_provider_tao_slurm.core.resources import gpu_hours_request  # loads when the task runs

    gpu_hours = gpu_hours_request(nodes, gpus_per_node, time_hours, max_continuations)
    request = gpu_hours.describe()
    ti.xcom_push(key="gpu_request", value=request)
    over = gpu_hours.at_most > budget
    log.info("%s; budget %s GPU hours: %s", request, budget, "approval needed" if over else "within the budget")
    return "approve_training" if over else "train"


# [END example_tao_approval_budget]


def approval(task_id: str, subject: str, body: str) -> ApprovalOperator:
    """A person's Approve or Reject; Reject, or no answer within a day, skips what follows."""
    return ApprovalOperator(
        task_id=task_id, subject=subject, body=body, defaults="Reject", response_timeout=timedelta(days=1)
    )


# [START example_tao_approval]
with DAG(
    dag_id=DAG_ID,
    schedule=None,
    render_template_as_native_obj=True,
    params={
        "gpu_hour_budget": Param(
            2, type="number", minimum=0, description="a training that can use more GPU hours waits for approval"
        ),
        "image": Param(IMAGE, type="string", description="registry image (or a .sqsh path)"),
        "datasets": Param(DATASETS, type="object", description="name -> lustre:///path on shared storage"),
        "spec": Param({"epochs": 3, "batch_size": 4, "learning_rate": 0.001}, type="object"),
        "nccl_env": Param(
            {}, type="object", description="the training's NCCL settings ({}: none; see example_tao_multinode's probe)"
        ),
    },
    tags=["example", "tao", "slurm", "approval"],
    doc_md=__doc__,
) as dag:
    check_datasets = StageDatasetCheckOperator(task_id="check_datasets", paths="{{ params.datasets }}")
    import_image = EnrootImportOperator(
        task_id="import_image", image="{{ params.image }}", deferrable=True, poll_interval_seconds=5
    )

    def job(action: str, command: str, **request: Any) -> tuple[SbatchSubmitOperator, SlurmJobSensor]:
        """One TAO action: its GPU job (one GPU unless ``request`` says more) and the deferred sensor watching it."""
        submit = SbatchSubmitOperator(
            task_id=action,
            action=action,
            network_arch="classification_pyt",
            image=import_image.output,
            command=command,
            **{"gpus_per_node": 1, "cpus_per_task": 1, "time_hours": 1, **request},
        )
        return submit, SlurmJobSensor(task_id=f"wait_{action}", job=submit.output, poke_interval=5, deferrable=True)

    check_budget = BranchPythonOperator(
        task_id="check_budget",
        python_callable=route_by_budget,
        op_kwargs={
            "nodes": NODES,
            "gpus_per_node": GPUS_PER_NODE,
            "time_hours": TIME_HOURS,
            "max_continuations": MAX_CONTINUATIONS,
            "budget": "{{ params.gpu_hour_budget }}",
        },
    )
    approve_training = approval(
        "approve_training",
        f"Approve a training of {REQUEST}?",
        f"The training asks for **{REQUEST}**, over the budget of {BUDGET} without approval.\n\n"
        "Approve to submit it to SLURM; Reject to skip it.",
    )
    train, wait_train = job(
        "train",
        TRAIN,
        spec={"train": "{{ params.spec }}", "dataset": check_datasets.output},
        nccl_env="{{ params.nccl_env }}",
        num_nodes=NODES,
        gpus_per_node=GPUS_PER_NODE,
        time_hours=TIME_HOURS,
        max_continuations=MAX_CONTINUATIONS,
        trigger_rule="none_failed_min_one_success",  # after the approval, or straight from check_budget
    )
    evaluate, wait_evaluate = job("evaluate", f"{PROGRAM} --action evaluate {AFTER_TRAINING}")
    approve_export = approval(
        "approve_export",
        "Export the evaluated model?",
        f"The evaluation of {CHECKPOINTS} reported:\n\n{KPI_LIST}\nApprove to export the model; Reject to skip it.",
    )
    export, wait_export = job("export", f"{PROGRAM} --action export {AFTER_TRAINING}")

    check_datasets >> import_image >> check_budget >> [approve_training, train]
    approve_training >> train >> wait_train >> evaluate >> wait_evaluate >> approve_export >> export >> wait_export
# [END example_tao_approval]


if __name__ == "__main__":
    dag.test()
