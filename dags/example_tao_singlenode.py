"""Example DAG: single-node TAO-style training on a SLURM cluster reached over SSH.

The order a GPU cluster needs:

1. ``check_datasets`` — every dataset path must already be on shared storage (one ``test -e``
   round trip from the login host; all missing paths are reported at once).
2. ``import_image`` — the registry image is converted to ``.sqsh`` once, in a batch job on the
   CPU partition (the connection's ``conversion_partition``); later runs reuse the file.
3. ``submit`` — the GPU job is rendered, linted, staged and submitted exactly once; it only ever
   references the ``.sqsh`` file. Its spec gets the resolved dataset paths.
4. ``wait`` — the sensor waits in the triggerer, settles the job record and checks ``status.json``.

Every value is an Airflow param (``Trigger DAG w/ config``). The defaults fit the local test
cluster of ``make demo``, where the training program is ``/srv/lustre/demo/tao_like_train.py``
(``dags/programs/tao_like_train.py``) and the Enroot stand-in converts the TAO image. On a real
cluster pass your image, dataset paths and the TAO entry point, e.g.
``classification_pyt train -e {config_path} results_dir={results_dir}``.

Secrets: when ``DEMO_API_TOKEN`` is set in the environment that parses this file, the job gets it
through ``secret_env``: its value is read on the worker at run time and written only to a mode-600
sidecar file over stdin, never into the script, the logs, XCom or the job record.

Nothing here opens a connection at parse time; the operators create their SSH hook when they run.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Param

from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

DAG_ID = "example_tao_singlenode"
DEFAULT_IMAGE = "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt"
DEFAULT_DATASETS = {
    "train": "lustre:///srv/lustre/demo/data/train",
    "val": "lustre:///srv/lustre/demo/data/val",
}
DEFAULT_SPEC = {"epochs": 3, "batch_size": 4, "learning_rate": 0.001}
DEFAULT_COMMAND = "python3 /srv/lustre/demo/tao_like_train.py --spec {config_path} --results {results_dir}"

# [START howto_secret_env]
# Name where the secret comes from ("env:", "conn:" or "var:"); never put the value in the DAG.
SECRET_ENV = {"DEMO_API_TOKEN": "env:DEMO_API_TOKEN"} if os.environ.get("DEMO_API_TOKEN") else None
# [END howto_secret_env]

# [START example_tao_singlenode_flow]
with DAG(
    dag_id=DAG_ID,
    schedule=None,
    render_template_as_native_obj=True,  # params lists and dicts stay lists and dicts
    params={
        "image": Param(DEFAULT_IMAGE, type="string", description="registry image (or a .sqsh path)"),
        "datasets": Param(DEFAULT_DATASETS, type="object", description="name -> lustre:///path on shared storage"),
        "spec": Param(DEFAULT_SPEC, type="object", description="train section of the spec"),
        "command": Param(DEFAULT_COMMAND, type="string", description="command run inside the container"),
    },
    tags=["example", "tao", "slurm"],
    doc_md=__doc__,
) as dag:
    # [START howto_operator_stage_dataset_check]
    check_datasets = StageDatasetCheckOperator(
        task_id="check_datasets",
        paths="{{ params.datasets }}",
    )
    # [END howto_operator_stage_dataset_check]

    # [START howto_operator_enroot_import]
    import_image = EnrootImportOperator(
        task_id="import_image",
        image="{{ params.image }}",
        poll_interval_seconds=5,
        deferrable=True,  # wait in the triggerer (or set [operators] default_deferrable = True)
    )
    # [END howto_operator_enroot_import]

    # [START howto_operator_sbatch_submit]
    submit = SbatchSubmitOperator(
        task_id="submit",
        image=import_image.output,
        command="{{ params.command }}",
        spec={
            "train": "{{ params.spec }}",
            "dataset": check_datasets.output,
            "results_dir": "{results_dir}",
        },
        env={"TAO_LOG_LEVEL": "INFO"},
        secret_env=SECRET_ENV,
        gpus_per_node=1,
        cpus_per_task=1,
        time_hours=1,
        timeout_hours=0.5,
        network_arch="classification_pyt",
        action="train",
        # Site options go to #SBATCH lines (qos=, constraint=, reservation=, gpu_type= likewise); the
        # partition and its time limit come from the connection or the cluster itself.
        sbatch_options={"comment": "{{ dag.dag_id }}"},
    )
    # [END howto_operator_sbatch_submit]

    # [START howto_sensor_slurm_job]
    wait = SlurmJobSensor(
        task_id="wait",
        job=submit.output,
        poke_interval=5,  # the demo cluster is tiny; 30-60 s suits a real cluster
        deferrable=True,  # a long training waits in the triggerer, not in a worker slot
        retries=1,  # a retried sensor re-settles the same job: it never resubmits what already ran
    )
    # [END howto_sensor_slurm_job]

    check_datasets >> import_image >> submit >> wait
# [END example_tao_singlenode_flow]


if __name__ == "__main__":
    dag.test()
