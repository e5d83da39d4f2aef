"""Example DAG: a TAO pipeline (train, evaluate, and export the model when it is good enough) on a SLURM cluster.

For MLOps pipelines: each action is its own GPU job, submitted exactly once and watched by its
own sensor, and each job reads the previous job's results by its handle: ``evaluate`` and
``export`` get the training job's ``results_dir`` from the ``train`` task's XCom (the handle
``SbatchSubmitOperator`` returns), so they use the checkpoints that job wrote, whatever its job id.

1. ``check_datasets`` and ``import_image``, as in ``example_tao_singlenode`` (the image is converted
   once on the CPU partition and reused).
2. ``train`` / ``wait_train``: the training job; the sensor settles its record (``status.json`` must
   say SUCCESS). A training longer than one allocation goes on in new slices from its checkpoints
   (``max_continuations``; see the docs' "Long trainings" page).
3. ``evaluate`` / ``wait_evaluate``: reads ``<train results_dir>/checkpoints``, writes its KPIs. TAO's
   evaluate reports them in ``status.json`` (a status line's ``kpi``); the sensor returns them as its
   XCom's ``kpis`` (e.g. ``{"accuracy": 0.62, "loss": 1.53}``) and puts them on its Asset event
   (``tao://example_tao_pipeline/evaluate``), so no task parses a results file.
4. ``accuracy_gate``: a ``ShortCircuitOperator`` reading ``wait_evaluate``'s ``kpis``: export runs only
   when ``accuracy`` reaches the ``min_accuracy`` Param; below it, export is skipped (the run still
   succeeds). An evaluation that reports no numeric ``accuracy`` fails the gate.
5. ``export`` / ``wait_export``: reads the same checkpoints, writes the exported model.

On the local test cluster of ``make demo`` the actions are ``/srv/lustre/demo/tao_like_train.py
--action train|evaluate|export`` (``dags/programs/tao_like_train.py``); on a real cluster use the
TAO entry points, e.g. ``classification_pyt evaluate -e {config_path} results_dir={results_dir}
evaluate.checkpoint=<train results_dir>/checkpoints/...``. The stand-in's accuracy is
``1 - loss/4`` of the last checkpoint (about 0.62 after the default 3 epochs): the default
``min_accuracy`` of 0.5 lets export run; ``--conf '{"min_accuracy": 0.9}'`` skips it.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG, Asset, Param

from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

DAG_ID = "example_tao_pipeline"
PROGRAM = "python3 /srv/lustre/demo/tao_like_train.py"
# The training job's results, read by the later actions from the train task's handle (XCom).
TRAINED = "{{ ti.xcom_pull(task_ids='train')['results_dir'] }}/checkpoints"
# Other DAGs can be scheduled on a finished training: its event's extra holds results_dir, job ids, GPU hours.
TRAINED_MODEL = Asset("tao://example_tao_pipeline/train")
# ... and on a finished evaluation: its event's extra holds the KPIs too (``kpis``).
EVALUATION = Asset("tao://example_tao_pipeline/evaluate")

log = logging.getLogger(__name__)


# [START example_tao_pipeline_gate]
def kpi_reaches(evaluation: dict[str, Any] | None, kpi: str, threshold: float) -> bool:
    """Return whether the evaluation's ``kpi`` reaches ``threshold`` (False skips what follows the gate).

    :param evaluation: the evaluate sensor's XCom: the job's final record, with the KPIs its
        ``status.json`` reported under ``kpis``.
    :param kpi: the KPI's name, e.g. ``accuracy``.
    :param threshold: the least value that passes.
    :raises ValueError: when the evaluation reported no numeric ``kpi`` (a broken evaluation is not a bad model).
    """
    kpis = (evaluation or {}).get("kpis") or {}
    value = kpis.get(kpi)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the evaluation reported no numeric {kpi!r} KPI in its status.json (its KPIs: {kpis})")
    passed = value >= threshold
    log.info("%s %s, threshold %s: %s", kpi, value, threshold, "passed" if passed else "missed, skipping what follows")
    return passed


# [END example_tao_pipeline_gate]


# [START example_tao_pipeline]
with DAG(
    dag_id=DAG_ID,
    schedule=None,
    render_template_as_native_obj=True,
    params={
        "image": Param("nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", type="string", description="registry image"),
        "datasets": Param(
            {"train": "lustre:///srv/lustre/demo/data/train", "val": "lustre:///srv/lustre/demo/data/val"},
            type="object",
            description="name -> lustre:///path on shared storage",
        ),
        "spec": Param({"epochs": 3, "batch_size": 4, "learning_rate": 0.001}, type="object"),
        "min_accuracy": Param(
            0.5, type="number", minimum=0, maximum=1, description="export only a model evaluated at least this accurate"
        ),
    },
    tags=["example", "tao", "slurm", "pipeline"],
    doc_md=__doc__,
) as dag:
    check_datasets = StageDatasetCheckOperator(task_id="check_datasets", paths="{{ params.datasets }}")
    import_image = EnrootImportOperator(
        task_id="import_image", image="{{ params.image }}", poll_interval_seconds=5, deferrable=True
    )

    def action(
        name: str, command: str, outlets: list[Asset] | None = None, **kwargs: object
    ) -> tuple[SbatchSubmitOperator, SlurmJobSensor]:
        """One TAO action: its GPU job and the sensor that watches it (announcing ``outlets`` when done)."""
        submit = SbatchSubmitOperator(
            task_id=name,
            image=import_image.output,
            command=command,
            gpus_per_node=1,
            cpus_per_task=1,
            time_hours=1,
            timeout_hours=0.5,
            network_arch="classification_pyt",
            action=name,
            **kwargs,  # type: ignore[arg-type]
        )
        wait = SlurmJobSensor(
            task_id=f"wait_{name}", job=submit.output, poke_interval=5, deferrable=True, outlets=outlets or []
        )
        submit >> wait
        return submit, wait

    train, wait_train = action(
        "train",
        f"{PROGRAM} --spec {{config_path}} --results {{results_dir}}",
        outlets=[TRAINED_MODEL],
        spec={"train": "{{ params.spec }}", "dataset": check_datasets.output},
        max_continuations=3,  # a slice that hits the time limit after a checkpoint goes on in the next one
    )
    evaluate, wait_evaluate = action(
        "evaluate",
        f"{PROGRAM} --action evaluate --checkpoint {TRAINED} --results {{results_dir}}",
        outlets=[EVALUATION],
    )
    # Reads the evaluate sensor's XCom (so it runs after it); a KPI below the Param skips export.
    accuracy_gate = ShortCircuitOperator(
        task_id="accuracy_gate",
        python_callable=kpi_reaches,
        op_kwargs={"evaluation": wait_evaluate.output, "kpi": "accuracy", "threshold": "{{ params.min_accuracy }}"},
    )
    export, wait_export = action(
        "export", f"{PROGRAM} --action export --checkpoint {TRAINED} --results {{results_dir}}"
    )

    check_datasets >> import_image >> train
    wait_train >> evaluate
    accuracy_gate >> export
# [END example_tao_pipeline]


if __name__ == "__main__":
    dag.test()
