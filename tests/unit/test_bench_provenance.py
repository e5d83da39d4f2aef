"""Where a benchmark's results come from (``benchmarks/provenance.py``): names, the cluster's release, code age."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from examples import load_file

provenance = load_file("bench_provenance", Path(__file__).resolve().parents[2] / "benchmarks" / "provenance.py")


@pytest.mark.parametrize(
    ("parts", "stem"),
    [
        pytest.param(("storm", None, None), "storm", id="the machine's own"),
        pytest.param(("storm", "26.05", None), "storm@26.05", id="a release tree"),
        pytest.param(("storm", "26.05", "rl"), "storm@26.05-rl", id="a release tree with the rate limit"),
        pytest.param(("submit", None, "rl"), "submit-rl", id="a variant on the machine's own"),
        pytest.param(("import_parse", None, None), "import_parse", id="an underscore is part of the name"),
        pytest.param(("earliest_start", "24.11", None), "earliest_start@24.11", id="underscore and release"),
    ],
)
def test_result_names_round_trip(parts: tuple[str, str | None, str | None], stem: str) -> None:
    assert provenance.result_name(*parts) == stem
    assert provenance.split_result_name(stem) == parts


@pytest.mark.parametrize(
    ("printed", "expected"),
    [
        pytest.param(
            "slurmctld=22.05.8\nlogin_client=slurm-wlm 22.05.8\n",
            {"slurmctld": "22.05.8", "login_client": "slurm-wlm 22.05.8"},
            id="both",
        ),
        pytest.param(
            "slurmctld=\nlogin_client=slurm 26.05.5\n",
            {"slurmctld": "unknown", "login_client": "slurm 26.05.5"},
            id="slurmctld did not answer",
        ),
        pytest.param("", {"slurmctld": "unknown", "login_client": "unknown"}, id="nothing printed"),
        pytest.param(
            "motd line\nslurmctld=26.05.5\nslurmctld=other\nlogin_client=slurm 26.05.5\n",
            {"slurmctld": "26.05.5", "login_client": "slurm 26.05.5"},
            id="the first answer counts, other lines are skipped",
        ),
    ],
)
def test_parse_release_probe(printed: str, expected: dict[str, str]) -> None:
    assert provenance.parse_release_probe(printed) == expected


def test_the_release_probe_prints_slurmctlds_version_and_the_clients(tmp_path: Path) -> None:
    """The probe's shell on stand-in commands: scontrol's SLURM_VERSION line and sinfo's first line."""
    (tmp_path / "scontrol").write_text(
        "#!/bin/sh\nprintf 'Configuration data as of X\\nSLURM_CONF = /etc/slurm/slurm.conf\\n"
        "SLURM_VERSION           = 26.05.5\\nSrunEpilog = (null)\\n'\n"
    )
    (tmp_path / "sinfo").write_text("#!/bin/sh\necho 'slurm 26.05.5'\n")
    for name in ("scontrol", "sinfo"):
        (tmp_path / name).chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    printed = subprocess.run(
        ["sh", "-c", provenance.RELEASE_PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert provenance.parse_release_probe(printed) == {"slurmctld": "26.05.5", "login_client": "slurm 26.05.5"}
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_ctl_conf error' >&2\nexit 1\n")
    printed = subprocess.run(
        ["sh", "-c", provenance.RELEASE_PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert provenance.parse_release_probe(printed) == {"slurmctld": "unknown", "login_client": "slurm 26.05.5"}


@pytest.mark.parametrize(
    ("result", "says"),
    [
        pytest.param({"slurmctld": "26.05.5"}, "SLURM 26.05.5 (slurmctld)", id="recorded"),
        pytest.param(
            {"slurmctld": "unknown (ssh failed)"},
            "the cluster's SLURM release: slurmctld could not be asked (unknown (ssh failed))",
            id="could not be asked",
        ),
        pytest.param(
            {"slurm": "slurm-wlm 22.05.8"},
            "the cluster's SLURM release not recorded (the client where the script ran: slurm-wlm 22.05.8)",
            id="an older file: its local client, said as such",
        ),
        pytest.param({}, "the cluster's SLURM release not recorded", id="nothing"),
    ],
)
def test_release_of(result: dict[str, str], says: str) -> None:
    assert provenance.release_of(result) == says


def test_declared_measures_reads_the_module_level_constant_only(tmp_path: Path) -> None:
    script = tmp_path / "bench.py"
    script.write_text(
        'TEMPLATE = """\nMEASURES = ("in/a/string",)\n"""\n\n'
        'MEASURES = (\n    "airflow_provider_tao_slurm/hooks",\n    "templates",\n)\n'
    )
    assert provenance.declared_measures(script) == ("airflow_provider_tao_slurm/hooks", "templates")
    script.write_text("X = 1\n")
    assert provenance.declared_measures(script) is None
    assert provenance.declared_measures(tmp_path / "missing.py") is None


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[str]]:
    """A git repository of four commits: a measured file, an unmeasured one, the measured one again, a doc."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    commits = []
    for path, text in (("pkg/a.py", "1"), ("other/b.py", "1"), ("pkg/a.py", "2"), ("docs.md", "1")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", path)
        git("commit", "-q", "-m", path)
        commits.append(git("rev-parse", "HEAD"))
    return tmp_path, commits


def test_later_commits_counts_the_commits_that_changed_the_measured_paths(repo: tuple[Path, list[str]]) -> None:
    root, commits = repo
    assert provenance.later_commits(root, commits[0], ["pkg"]) == 1
    assert provenance.later_commits(root, commits[0], ["pkg", "other"]) == 2
    assert provenance.later_commits(root, commits[2], ["pkg"]) == 0
    assert provenance.later_commits(root, commits[3], ["pkg"]) == 0
    assert provenance.later_commits(root, f"{commits[0]}-dirty", ["pkg"]) == 1
    assert provenance.later_commits(root, "0" * 40, ["pkg"]) is None
    assert provenance.later_commits(root, "not recorded", ["pkg"]) is None
    assert provenance.later_commits(root, None, ["pkg"]) is None
    assert provenance.later_commits(root, commits[0], []) is None


def test_table_header() -> None:
    result = {
        "run": "2026-12-07T10:00:00Z",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "slurmctld": "22.05.8",
        "measured_at": "2026-12-07 10:05:00 UTC",
    }
    assert provenance.table_header(result, 0) == (
        "Run `2026-12-07T10:00:00Z`, commit `0123456789ab`, SLURM 22.05.8 (slurmctld), measured 2026-12-07 10:05:00 "
        "UTC; 0 later commits changed the code it measures."
    )
    alone = {**result, "run": None, "commit": f"{result['commit']}-dirty"}
    header = provenance.table_header(alone, 3)
    assert header.startswith("Run none (run alone), commit `0123456789ab-dirty` (the checkout had uncommitted changes)")
    assert header.endswith("; 3 later commits changed the code it measures.")
    assert provenance.table_header(result, 1).endswith("; 1 later commit changed the code it measures.")
    assert "unknown" in provenance.table_header({}, None)
