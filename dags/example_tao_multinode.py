"""Example DAG: multi-node TAO-style training (2 nodes x 1 GPU) on a SLURM cluster reached over SSH.

The order a GPU cluster needs:

0. ``preflight`` — login, the SLURM tools, Pyxis options, Enroot on the conversion partition,
   the results directory, the partitions and the account: every problem reported at once.
1. ``check_datasets`` — every dataset path must already be on shared storage (one ``test -e``
   round trip from the login host; all missing paths are reported at once).
2. ``import_image`` — the registry image is converted to ``.sqsh`` once, on the CPU partition;
   later runs reuse the file.
3. ``nccl_probe`` — a tiny job of the same shape (2 nodes x 1 GPU) all-reduces once under
   torchrun, through the same sbatch template as the training job. A hang is stopped by the job's
   own timeout, cancelled, and the next NCCL settings are tried (none, then
   ``NCCL_P2P_DISABLE=1``, then also ``NCCL_IB_DISABLE=1`` and ``NCCL_SOCKET_IFNAME``). The first
   settings that work are cached per cluster, partition and node-count scope on shared storage and
   returned: later runs find them there and submit no probe (for a week, until the image or the
   driver changes; the ``force_probe`` param, given as ``force_reprobe``, probes again). The probe
   proves NCCL on the GPUs (``probe_backend=nccl``); a container without CUDA fails the task with
   the reason.
4. ``submit`` — the training job on 2 nodes, one task per node, ``--wait-all-nodes=1``. Every
   node gets the TAO rendezvous: ``WORLD_SIZE`` (the NODE count), ``NODE_RANK`` (its
   ``SLURM_NODEID``), ``NUM_GPU_PER_NODE``, ``MASTER_ADDR`` (the first host of the job) and
   ``MASTER_PORT`` (a port the batch script finds free on that first host when the job starts, so
   jobs sharing a master node never collide), plus the probed NCCL settings (``nccl_env``, from the probe's XCom).
5. ``wait`` — the sensor waits in the triggerer, settles the job record and checks ``status.json``.

The defaults fit the local test cluster of ``make demo``: the training program is
``/srv/lustre/demo/tao_like_train.py`` and the probe's PyTorch is the cluster's CPU venv. That
cluster has no CUDA (the Pyxis stand-in runs commands on the host), so ``make demo`` and the tests
say so explicitly with ``probe_backend=gloo``: a CPU test that proves nothing about NCCL. The
default, ``nccl``, is what a GPU cluster needs. The default command first prints what each node
sees, then trains; node 0 writes ``status.json`` into the results directory, the other nodes write
under ``node_<rank>``. On a real cluster pass your image, dataset paths, the TAO entry point (TAO
starts torchrun itself from the rendezvous variables) and ``probe_python=python3``, and leave
``probe_backend`` at ``nccl``.

Nothing here opens a connection at parse time; the operators create their SSH hook when they run.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_provider_tao_slurm.operators.enroot_import import EnrootImportOperator
from airflow_provider_tao_slurm.operators.nccl_probe import NcclProbeOperator
from airflow_provider_tao_slurm.operators.preflight import SlurmPreflightOperator
from airflow_provider_tao_slurm.operators.sbatch_submit import SbatchSubmitOperator
from airflow_provider_tao_slurm.operators.stage_dataset_check import StageDatasetCheckOperator
from airflow_provider_tao_slurm.sensors.slurm_job import SlurmJobSensor

DAG_ID = "example_tao_multinode"
NODES = 2
GPUS_PER_NODE = 1
DEFAULT_IMAGE = "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt"
DEFAULT_DATASETS = {
    "train": "lustre:///srv/lustre/demo/data/train",
    "val": "lustre:///srv/lustre/demo/data/val",
}
DEFAULT_SPEC = {"epochs": 3, "batch_size": 4, "learning_rate": 0.001}
DEFAULT_PROBE_PYTHON = "/opt/tao-slurm/venv/bin/python"
DEFAULT_COMMAND = (
    'echo "rendezvous host=$(hostname) WORLD_SIZE=$WORLD_SIZE NODE_RANK=$NODE_RANK '
    "NUM_GPU_PER_NODE=$NUM_GPU_PER_NODE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
    'nccl=[$(env | grep ^NCCL_ | sort | paste -sd, -)]"; '
    'RESULTS={results_dir}; [ "$NODE_RANK" = 0 ] || RESULTS="$RESULTS/node_$NODE_RANK"; '
    'exec python3 /srv/lustre/demo/tao_like_train.py --spec {config_path} --results "$RESULTS"'
)

# [START example_tao_multinode_flow]
with DAG(
    dag_id=DAG_ID,
    schedule=None,
    render_template_as_native_obj=True,  # params dicts, numbers and booleans stay native
    params={
        "image": Param(DEFAULT_IMAGE, type="string", description="registry image (or a .sqsh path)"),
        "datasets": Param(DEFAULT_DATASETS, type="object", description="name -> lustre:///path on shared storage"),
        "spec": Param(DEFAULT_SPEC, type="object", description="train section of the spec"),
        "command": Param(DEFAULT_COMMAND, type="string", description="command run on every node"),
        "probe_python": Param(DEFAULT_PROBE_PYTHON, type="string", description="the image's Python with PyTorch"),
        "probe_timeout_seconds": Param(120, type="integer", minimum=10, description="a probe slower than this hangs"),
        "force_probe": Param(False, type="boolean", description="probe even when the cluster's NCCL cache answers"),
        "probe_backend": Param(
            "nccl",
            type="string",
            enum=["nccl", "gloo"],
            description="nccl: prove NCCL on the GPUs (any GPU cluster); gloo: a CPU test only, for a cluster "
            "without CUDA such as the local test cluster of make demo",
        ),
    },
    tags=["example", "tao", "slurm", "multi-node"],
    doc_md=__doc__,
) as dag:
    # [START howto_operator_preflight]
    preflight = SlurmPreflightOperator(task_id="preflight")
    # [END howto_operator_preflight]

    check_datasets = StageDatasetCheckOperator(
        task_id="check_datasets",
        paths="{{ params.datasets }}",
    )

    import_image = EnrootImportOperator(
        task_id="import_image",
        image="{{ params.image }}",
    )

    # [START howto_operator_nccl_probe]
    nccl_probe = NcclProbeOperator(
        task_id="nccl_probe",
        image=import_image.output,
        num_nodes=NODES,
        gpus_per_node=GPUS_PER_NODE,
        timeout_seconds="{{ params.probe_timeout_seconds }}",
        force_reprobe="{{ params.force_probe }}",
        backend="{{ params.probe_backend }}",
        python="{{ params.probe_python }}",
        poll_interval_seconds=5,  # the demo cluster is tiny; 15-30 s suits a real cluster
    )
    # [END howto_operator_nccl_probe]

    # [START howto_operator_sbatch_submit_multinode]
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
        nccl_env=nccl_probe.output,
        num_nodes=NODES,
        gpus_per_node=GPUS_PER_NODE,
        cpus_per_task=1,
        time_hours=1,
        timeout_hours=0.5,
        network_arch="classification_pyt",
        action="train",
    )
    # [END howto_operator_sbatch_submit_multinode]

    wait = SlurmJobSensor(
        task_id="wait",
        job=submit.output,
        poke_interval=5,
        deferrable=True,
    )

    preflight >> check_datasets >> import_image >> nccl_probe >> submit >> wait
# [END example_tao_multinode_flow]


if __name__ == "__main__":
    dag.test()
