"""Container mounts: what a job's container sees, checked before anything is staged."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.mounts import (
    Mount,
    check_mounts,
    parse_mounts,
    same_path_problem,
    spec_dataset_paths,
    visible_problem,
)
from airflow_provider_tao_slurm.exceptions import ValidationError

JOB_DIR = "/lustre/u/jobs/tao-x"
RESULTS = "/lustre/u/results/tao-x"


def test_mounts_are_parsed_as_pyxis_reads_them() -> None:
    assert parse_mounts(" /lustre:/lustre:ro+rprivate , /data , /a:/b") == (
        Mount("/lustre", "/lustre"),
        Mount("/data", "/data"),
        Mount("/a", "/b"),
    )


@pytest.mark.parametrize("text", ["", "  "])
def test_empty_mounts_are_refused(text: str) -> None:
    with pytest.raises(ValidationError, match="container_mounts is empty"):
        parse_mounts(text)


@pytest.mark.parametrize(
    ("mounts", "problem"),
    [
        pytest.param("/lustre:/lustre", None, id="same-path"),
        pytest.param("/lustre/u/:/lustre/u/", None, id="trailing-slashes"),
        pytest.param("/lustre/u/jobs/tao-x", None, id="path-alone"),
        pytest.param("/:/", None, id="root"),
        pytest.param("/scratch:/scratch", "no mount shows it", id="not-mounted"),
        pytest.param("/lustre:/mnt", "no mount shows it", id="mounted-elsewhere"),
        pytest.param("/other:/lustre", "shows /other/u/jobs/tao-x there instead", id="another-directory-there"),
        pytest.param(
            "/lustre:/lustre,/scratch/x:/lustre/u", "shows /scratch/x/jobs/tao-x there instead", id="deeper-mount-hides"
        ),
        pytest.param("/scratch/x:/lustre/u,/lustre:/lustre", "shows /scratch/x/jobs/tao-x", id="deepest-wins"),
        pytest.param("relative:/lustre", "shows relative there instead", id="relative-source"),
    ],
)
def test_a_host_path_must_be_shown_at_the_same_path(mounts: str, problem: str | None) -> None:
    found = same_path_problem(parse_mounts(mounts), JOB_DIR)

    assert found == problem if problem is None else problem in (found or "")


def test_a_path_read_inside_the_container_needs_a_mount_there() -> None:
    mounts = parse_mounts("/lustre/datasets:/data")

    assert visible_problem(mounts, "/data/coco/train") is None
    assert visible_problem(mounts, "/lustre/datasets/coco") == "no mount shows it"


def test_dataset_paths_are_the_absolute_paths_of_the_specs_dataset_section() -> None:
    spec = {
        "train": {"pretrained": "/opt/in/the/image.pth"},
        "dataset": {
            "train": "/lustre/data/train",
            "sources": [{"image_dir": "/data/img", "classes": 3}, "relative/dir"],
            "format": "coco",
            "bound": "{results_dir}/x",
        },
    }

    assert spec_dataset_paths(spec) == {
        "spec dataset.sources[0].image_dir": "/data/img",
        "spec dataset.train": "/lustre/data/train",
    }
    assert spec_dataset_paths({"dataset": ["/a", "/b"]}) == {"spec dataset[0]": "/a", "spec dataset[1]": "/b"}
    assert spec_dataset_paths(None) == spec_dataset_paths({"train": {}}) == {}


def test_every_unseen_path_is_named_with_the_mounts_and_the_fix() -> None:
    with pytest.raises(ValidationError) as refused:
        check_mounts(
            "/scratch:/scratch",
            same_path={"job directory": JOB_DIR, "results directory": RESULTS},
            visible={"spec dataset.train": "/datasets/coco", "spec dataset.val": "/scratch/val"},
            origin="connection 'slurm_default'",
        )

    message = str(refused.value)
    assert "cannot see 3 of its paths with container_mounts='/scratch:/scratch'" in message
    assert "connection 'slurm_default'" in message
    for line in (
        f"- job directory {JOB_DIR}: no mount shows it",
        f"- results directory {RESULTS}: no mount shows it",
        "- spec dataset.train /datasets/coco: no mount shows it",
    ):
        assert line in message
    assert "/scratch/val" not in message
    assert "container_mounts='/scratch:/scratch,/datasets:/datasets,/lustre:/lustre'" in message


def test_no_mounts_at_all_is_refused_with_the_mount_to_add() -> None:
    with pytest.raises(ValidationError, match=r"(?s)no container_mounts set.*container_mounts='/lustre:/lustre'"):
        check_mounts(None, same_path={"results directory": RESULTS}, visible={}, origin="the operator")


def test_mounts_that_show_everything_pass() -> None:
    check_mounts(
        "/lustre/u:/lustre/u:ro,/lustre/datasets:/data",
        same_path={"job directory": JOB_DIR, "results directory": RESULTS},
        visible={"spec dataset.train": "/data/coco"},
        origin="the operator",
    )
