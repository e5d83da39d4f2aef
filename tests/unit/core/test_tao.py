"""Is a job a TAO action: decided from its image, its command or an explicit ``network_arch``."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.images import is_tao_image, parse_image
from airflow_provider_tao_slurm.core.tao import is_tao_action, job_network_arch, tao_entry_point

TAO_SQSH = "/lustre/containers/nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh"
PLAIN_SQSH = "/lustre/containers/docker.io+library+pytorch+2.3.sqsh"


@pytest.mark.parametrize(
    ("image", "tao"),
    [
        pytest.param("nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", True, id="ngc-reference"),
        pytest.param("nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt", True, id="enroot-reference"),
        pytest.param(TAO_SQSH, True, id="cache-name-of-a-tao-image"),
        pytest.param("/lustre/containers/tao.sqsh", True, id="tao-sqsh"),
        pytest.param("/lustre/c/tao-toolkit_5.5.0-pyt.sqsh", True, id="tao-toolkit-in-the-name"),
        pytest.param("myorg/tao-custom:1", True, id="word-tao-in-the-repository"),
        pytest.param(PLAIN_SQSH, False, id="plain-cache-name"),
        pytest.param("/lustre/tao/containers/pytorch.sqsh", False, id="tao-directory-is-not-the-image"),
        pytest.param("/lustre/c/potato.sqsh", False, id="tao-inside-a-word"),
        pytest.param("nvcr.io/nvidia/pytorch:24.01-py3", False, id="other-ngc-image"),
    ],
)
def test_a_tao_image_is_known_by_its_name(image: str, tao: bool) -> None:
    assert is_tao_image(parse_image(image)) is tao


@pytest.mark.parametrize(
    ("command", "network"),
    [
        pytest.param("classification_pyt train -e /s.yaml", "classification_pyt", id="pyt-entry-point"),
        pytest.param("  detectnet_v2_tf train", "detectnet_v2_tf", id="tf-entry-point"),
        pytest.param("/usr/local/bin/dino_pyt evaluate", "dino_pyt", id="entry-point-path"),
        pytest.param("TAO_LOG=1 OMP=4 ocrnet_pyt train", "ocrnet_pyt", id="after-assignments"),
        pytest.param("tao model classification_pyt train -e x", "classification_pyt", id="launcher-model"),
        pytest.param("tao dino train", "dino", id="launcher-4x"),
        pytest.param("tao --help", "tao", id="launcher-without-network"),
        pytest.param("python3 /srv/tao_like_train.py --spec x", None, id="python"),
        pytest.param("echo classification_pyt", None, id="not-first"),
        pytest.param("TAO=1", None, id="assignment-only"),
        pytest.param("taos run", None, id="other-program"),
    ],
)
def test_a_tao_entry_point_starts_the_command(command: str, network: str | None) -> None:
    assert tao_entry_point(command) == network


@pytest.mark.parametrize(
    ("network_arch", "image", "command", "recorded", "tao"),
    [
        pytest.param(None, TAO_SQSH, "python3 train.py", "tao", True, id="tao-image"),
        pytest.param(None, PLAIN_SQSH, "classification_pyt train", "classification_pyt", True, id="tao-command"),
        pytest.param(None, TAO_SQSH, "classification_pyt train", "classification_pyt", True, id="both"),
        pytest.param(None, PLAIN_SQSH, "python3 train.py", "custom", False, id="plain-job"),
        pytest.param("custom", TAO_SQSH, "classification_pyt train", "custom", False, id="explicit-custom"),
        pytest.param("yolo_v4", PLAIN_SQSH, "python3 train.py", "yolo_v4", True, id="explicit-network"),
    ],
)
def test_the_recorded_network_arch_decides_the_status_json_rule(
    network_arch: str | None, image: str, command: str, recorded: str, tao: bool
) -> None:
    network = job_network_arch(network_arch, parse_image(image), command)

    assert (network, is_tao_action(network)) == (recorded, tao)
