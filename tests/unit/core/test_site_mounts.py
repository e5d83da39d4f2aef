"""The site's own container mounts (Enroot mounts.d): read on a GPU node, cached, counted by the mount check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from airflow_provider_tao_slurm.core.commands import preflight as commands
from airflow_provider_tao_slurm.core.commands.preflight import _NODE_PROBE
from airflow_provider_tao_slurm.core.mounts import Mount, SiteMounts, check_mounts, parse_fstab
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, ValidationError

JOB_DIR = "/lustre/u/jobs/tao-x"
RESULTS = "/lustre/u/results/tao-x"
SITE = SiteMounts(
    (Mount("/srv/lustre/datasets", "/datasets"), Mount("/lustre", "/lustre")),
    "2026-03-04T05:06:07Z",
    "n1",
    "/etc/enroot/mounts.d",
)


def sh(command: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, env={**os.environ, **env}, cwd=cwd, timeout=30
    )


# ------------------------------------------------------------------ the fstab lines


@pytest.mark.parametrize(
    ("lines", "mounts"),
    [
        pytest.param(["/srv/data /datasets none bind,ro"], [Mount("/srv/data", "/datasets")], id="plain"),
        pytest.param(["/srv/data datasets none bind"], [Mount("/srv/data", "/datasets")], id="relative-destination"),
        pytest.param(["  /a   /b/../c/  none bind  "], [Mount("/a", "/c")], id="spaces-and-dots"),
        pytest.param(["# /a /b none bind", "   #x", "", "   "], [], id="comments-and-blank-lines"),
        pytest.param(["/lonely"], [], id="one-field"),
        pytest.param(["/my\\040data /in\\011tab none bind"], [Mount("/my data", "/in\ttab")], id="fstab-escapes"),
        pytest.param(["${HOME}/x ${HOME}/x none bind", "/a /b${X} none bind"], [], id="variables-not-counted"),
        pytest.param(["/a /b none x-detach,nofail"], [], id="detach-removes"),
        pytest.param(["tmpfs /dev/shm tmpfs x-create=dir,rw"], [Mount("tmpfs", "/dev/shm")], id="not-a-bind"),
        pytest.param(
            ["/etc/hosts /etc/hosts none bind", "/srv/d /d none bind"],
            [Mount("/etc/hosts", "/etc/hosts"), Mount("/srv/d", "/d")],
            id="in-order",
        ),
    ],
)
def test_fstab_lines_are_read_as_enroot_reads_them(lines: list[str], mounts: list[Mount]) -> None:
    assert parse_fstab(lines) == tuple(mounts)


def test_the_cache_round_trips_and_a_broken_one_is_refused() -> None:
    assert SiteMounts.from_json(SITE.to_json()) == SITE
    assert SiteMounts.from_json(SiteMounts((), "t", "n", "/d").to_json()).mounts == ()
    for text in ("{", "[]", '{"mounts": [["a"]], "read_at": "t", "node": "n", "directory": "d"}', '{"mounts": []}'):
        with pytest.raises((ValueError, KeyError, TypeError)):
            SiteMounts.from_json(text)


# ------------------------------------------------------------------ the node probe reads them


def test_the_node_probe_prints_every_fstab_line_in_enroots_order(tmp_path: Path) -> None:
    mounts_d = tmp_path / "enroot" / "mounts.d"
    mounts_d.mkdir(parents=True)
    (mounts_d / "50-site.fstab").write_text("/srv/lustre/datasets /datasets none bind")  # no final newline
    (mounts_d / "10-system.fstab").write_text("# system\n/etc/hosts /etc/hosts none bind\n")
    (mounts_d / "notes.txt").write_text("/x /y none bind\n")

    out = sh(_NODE_PROBE, ENROOT_SYSCONF_PATH=str(tmp_path / "enroot")).stdout
    probe = commands.parse_node_probe(out, [])

    assert probe.site_mounts == (Mount("/etc/hosts", "/etc/hosts"), Mount("/srv/lustre/datasets", "/datasets"))
    assert probe.mounts_dir == str(mounts_d)


def test_a_node_without_mounts_d_has_no_site_mounts(tmp_path: Path) -> None:
    probe = commands.parse_node_probe(sh(_NODE_PROBE, ENROOT_SYSCONF_PATH=str(tmp_path)).stdout, [])

    assert (probe.site_mounts, probe.mounts_dir) == ((), f"{tmp_path}/mounts.d")


def test_a_probe_cut_before_the_mounts_line_did_not_run_to_its_end() -> None:
    with pytest.raises(RemoteCommandError, match="did not run to its end"):
        commands.parse_node_probe("NODE n1\nPYXIS yes\nENROOT 3.4\nFSTAB /a /b none bind\n", [])


# ------------------------------------------------------------------ the cache read, with another command's reply

HOSTILE = ["it's $(touch pwned) `id` a b", "semi;colon&amp|pipe", "new\nline", "-dash"]


@pytest.mark.parametrize("name", HOSTILE)
def test_the_cache_is_read_after_the_command_whatever_its_path(tmp_path: Path, name: str) -> None:
    directory = tmp_path / name
    directory.mkdir()
    cache = directory / "site-mounts.json"
    cache.write_text(SITE.to_json())

    result = sh(commands.with_site_mounts("echo 'polar*|4:00:00|gpu:4'", str(cache)), cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert commands.split_site_mounts(result.stdout) == ("polar*|4:00:00|gpu:4\n", SITE.to_json())
    assert not (tmp_path / "pwned").exists()


def test_no_cache_a_link_or_a_failed_command(tmp_path: Path) -> None:
    cache = tmp_path / "site-mounts.json"
    assert commands.split_site_mounts(sh(commands.with_site_mounts("true", str(cache))).stdout) == ("", "")
    (tmp_path / "planted").write_text(SITE.to_json())
    cache.symlink_to(tmp_path / "planted")
    assert commands.split_site_mounts(sh(commands.with_site_mounts("true", str(cache))).stdout) == ("", "")
    failed = sh(commands.with_site_mounts("echo partial; exit 7", str(cache)))
    assert failed.returncode == 7
    assert commands.split_site_mounts(failed.stdout) == ("partial\n", None)


def test_the_cache_path_must_be_absolute() -> None:
    with pytest.raises(ValidationError, match="is not absolute"):
        commands.with_site_mounts("true", "relative/site-mounts.json")


# ------------------------------------------------------------------ the mount check counts them


def test_a_site_mount_shows_a_dataset_the_job_does_not_mount() -> None:
    check_mounts(
        "/lustre/u:/lustre/u",
        same_path={"job directory": JOB_DIR, "results directory": RESULTS},
        visible={"spec dataset.train": "/datasets/coco"},
        origin="the operator",
        site_mounts=SITE,
    )


def test_site_mounts_alone_can_show_everything() -> None:
    check_mounts(
        None,
        same_path={"job directory": JOB_DIR},
        visible={"spec dataset.train": "/datasets/coco"},
        origin="the operator",
        site_mounts=SITE,
    )


@pytest.mark.parametrize(
    ("container_mounts", "problem"),
    [
        pytest.param("/scratch/u:/lustre/u", "the mount /scratch/u:/lustre/u shows /scratch/u/jobs/tao-x", id="job"),
        pytest.param("/scratch:/lustre", "the mount /scratch:/lustre shows /scratch/u/jobs/tao-x", id="same-dest"),
    ],
)
def test_the_jobs_own_mount_covers_the_sites(container_mounts: str, problem: str) -> None:
    """Enroot applies mounts.d first and --container-mounts after: the job's own mount at or above the site's wins."""
    with pytest.raises(ValidationError) as refused:
        check_mounts(container_mounts, same_path={"job directory": JOB_DIR}, visible={}, origin="x", site_mounts=SITE)

    assert problem in str(refused.value)


def test_a_site_mount_that_shows_something_else_is_named() -> None:
    site = SiteMounts((Mount("/srv/other", "/lustre/u"),), "2026-03-04T05:06:07Z", "n1", "/etc/enroot/mounts.d")

    with pytest.raises(ValidationError, match="the site mount /srv/other:/lustre/u shows /srv/other/jobs/tao-x"):
        check_mounts("/scratch:/scratch", same_path={"job": JOB_DIR}, visible={}, origin="x", site_mounts=site)
    check_mounts("/lustre:/lustre", same_path={"job": JOB_DIR}, visible={}, origin="x", site_mounts=site)


def test_a_path_no_mount_shows_is_refused_naming_the_site_mounts_counted() -> None:
    with pytest.raises(ValidationError) as refused:
        check_mounts(
            "/lustre/u:/lustre/u",
            same_path={"job directory": JOB_DIR},
            visible={"spec dataset.train": "/data/coco"},
            origin="the operator",
            site_mounts=SITE,
        )

    message = str(refused.value)
    assert "- spec dataset.train /data/coco: no mount shows it" in message
    assert (
        "the site mounts /srv/lustre/datasets at /datasets, /lustre at /lustre (site mounts read by the preflight on "
        "2026-03-04; run SlurmPreflightOperator again after the site changes them)"
    ) in message
    assert "container_mounts='/lustre/u:/lustre/u,/data:/data'" in message


def test_an_empty_site_list_and_an_unknown_one_are_told_apart() -> None:
    none = SiteMounts((), "2026-03-04T05:06:07Z", "n1", "/etc/enroot/mounts.d")
    with pytest.raises(ValidationError, match=r"and no site mounts \(site mounts read by the preflight on 2026-03-04"):
        check_mounts(None, same_path={"job": JOB_DIR}, visible={}, origin="x", site_mounts=none)
    with pytest.raises(ValidationError, match=r"site's own container mounts \(Enroot mounts.d\) not known.*preflight"):
        check_mounts(None, same_path={"job": JOB_DIR}, visible={}, origin="x")
