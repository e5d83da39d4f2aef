"""The spec's datasets checked before sbatch (issue 42, item 11): which paths, one round trip, one message."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from airflow_provider_tao_slurm.core.commands import checks
from airflow_provider_tao_slurm.core.storage import missing_paths_error, spec_dataset_checks
from airflow_provider_tao_slurm.exceptions import RemoteCommandError


def test_the_path_check_rides_before_the_command_and_keeps_its_exit_status(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    paths = [str(tmp_path / "train"), str(tmp_path / "val it")]
    command = checks.test_paths_then(paths, "echo 'polar*|4:00:00'; exit 3")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False)
    assert done.returncode == 3
    assert checks.split_test_paths("motd\n" + done.stdout, paths) == ([str(tmp_path / "val it")], "polar*|4:00:00\n")
    assert checks.test_paths_then([], "sinfo") == "sinfo"
    assert checks.split_test_paths("x\n", []) == ([], "x\n")


def test_a_path_check_cut_short_is_an_error_never_all_present() -> None:
    with pytest.raises(RemoteCommandError, match="did not finish"):
        checks.split_test_paths("OK 0\n", ["/a"])


def test_only_paths_the_login_host_sees_where_the_container_reads_them_are_checked() -> None:
    spec = {
        "dataset": {"train": "/lustre/d//train/", "val": "/data/coco", "out": "/lustre/u/results/j/tf", "rel": "x"},
        "model": "/lustre/m.pth",
    }
    checks = spec_dataset_checks(spec, "/lustre:/lustre,/lustre/datasets:/data", own=["/lustre/u/results/j"])
    assert checks == [("spec dataset.train", "/lustre/d/train")]
    assert spec_dataset_checks(None, None) == []


def test_the_message_names_every_missing_path_once_with_each_label() -> None:
    labelled = [("a", "/x"), ("b", "/y"), ("c", "/x")]
    error = missing_paths_error(labelled, {"/x"}, "mini", outcome=", so nothing ran", fix="correct them")
    assert error.missing == ["/x"]
    assert str(error) == (
        "1 dataset path(s) do not exist on cluster 'mini' (checked from the login host), so nothing ran:\n"
        "- a = /x\n- c = /x\nCopy the data to shared storage (Lustre) first, or correct them."
    )
