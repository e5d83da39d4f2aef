"""Example DAG: a TAO pipeline (train, then evaluate and export the trained model) on a SLURM cluster.

For MLOps pipelines: each action is its own GPU job, submitted exactly once and watched by its
own sensor, and each job reads the previous job's results by its handle: ``evaluate`` and
``export`` get the training job's ``results_dir`` from the ``train`` task's XCom (the handle
``SbatchSubmitOperator`` returns), so they use the checkpoints that job wrote, whatever its job id.

1. ``check_datasets`` and ``import_image``, as in ``example_tao_singlenode`` (the image is converted
   once on the CPU partition and reused).
2. ``train`` / ``wait_train``: the training job; the sensor settles its record (``status.json`` must
   say SUCCESS). A training longer than one allocation goes on in new slices from its checkpoints
   (``max_continuations``; see the docs' "Long trainings" page).
3. ``evaluate`` / ``wait_evaluate``: reads ``<train results_dir>/checkpoints``, writes its KPIs.
4. ``export`` / ``wait_export``: reads the same checkpoints, writes the exported model.

On the local test cluster of ``make demo`` the actions are ``/srv/lustre/demo/tao_like_train.py
--action train|evaluate|export`` (``dags/programs/tao_like_train.py``); on a real cluster use the
TAO entry points, e.g. ``classification_pyt evaluate -e {config_path} results_dir={results_dir}
evaluate.checkpoint=<train results_dir>/checkpoints/...``.
"""

from __future__ import annotations

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
        "evaluate", f"{PROGRAM} --action evaluate --checkpoint {TRAINED} --results {{results_dir}}"
    )
    export, wait_export = action(
        "export", f"{PROGRAM} --action export --checkpoint {TRAINED} --results {{results_dir}}"
    )

    check_datasets >> import_image >> train
    wait_train >> [evaluate, export]
# [END example_tao_pipeline]


if __name__ == "__main__":
    dag.test()
