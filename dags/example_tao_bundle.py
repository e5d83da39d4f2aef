"""Example DAG: run a TAO spec bundle's execution block (pre -> train -> post) on SLURM.

A spec bundle declares the model-owned order of its action: pre_commands, the primary
command, then post_commands that run only when training succeeded (scope: leader = task 0
only). supporting_files are verified against their SHA-256 and staged under
<job_dir>/inputs/action-helpers/. The real exit code of every child is kept in the job record.

The defaults fit the local test cluster of ``make demo`` (it stages the training program and the
datasets); the bundle root is ``dags/bundles/demo_bundle`` next to this file.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

DAG_ID = "example_tao_bundle"
BUNDLE_ROOT = Path(__file__).resolve().parent / "bundles" / "demo_bundle"

# [START howto_execution_bundle]
EXECUTION = {
    "pre_commands": ["python3 inputs/action-helpers/prepare.py {results_dir}"],
    "post_commands": [
        "echo post >> {results_dir}/order.txt",
        {"command": "echo leader >> {results_dir}/order.txt", "scope": "leader"},
    ],
    "environment": {"TAO_BUNDLE": "demo"},
    "completion": {"child_exit_code_path": "exit_codes.children"},
    "supporting_files": [
        {
            "source": "helpers/prepare.py",
            "destination": "prepare.py",
            "sha256": "b96e14a4473f701613bc2d506bb224d7f34f999136bac527745c5c66c3cf319d",
        }
    ],
}
# [END howto_execution_bundle]

with DAG(dag_id=DAG_ID, schedule=None, tags=["example", "tao", "slurm", "bundle"], doc_md=__doc__) as dag:
    import_image = EnrootImportOperator(task_id="import_image", image="nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt")

    # [START howto_operator_sbatch_submit_bundle]
    submit = SbatchSubmitOperator(
        task_id="submit",
        image=import_image.output,
        command="echo primary >> {results_dir}/order.txt && "
        "python3 /srv/lustre/demo/tao_like_train.py --spec {config_path} --results {results_dir}",
        spec={"train": {"epochs": 1}, "dataset": {"train": "/srv/lustre/demo/data/train"}},
        execution=EXECUTION,
        bundle_root=str(BUNDLE_ROOT),
        gpus_per_node=1,
        cpus_per_task=1,
        time_hours=1,
        timeout_hours=0.5,
        action="train",
    )
    # [END howto_operator_sbatch_submit_bundle]

    wait = SlurmJobSensor(task_id="wait", job=submit.output, poke_interval=5, retries=1)

    import_image >> submit >> wait
