"""Remote command builders: golden command lines, validation, and a hostile-input corpus run through real shells.

The builders' strings are executed here with ``bash -c`` and ``sh -c`` (dash on Debian) against
temporary directories, and SLURM tools are replaced by stand-ins on ``PATH`` that print their argv,
to prove that every value stays one word and nothing in it is ever executed.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao_slurm.core import commands
from airflow_provider_tao_slurm.core.defaults import PYXIS_SRUN_OPTIONS
from airflow_provider_tao_slurm.core.states import parse_jobs_by_name
from airflow_provider_tao_slurm.exceptions import JobLookupError, RemoteCommandError, ValidationError

SHELLS = [shell for shell in ("bash", "sh") if shutil.which(shell)]
CANARY = "canary"
INJECT = f"$(touch {CANARY})"

# Values that a shell would split, expand or execute if they were not quoted. Each is a valid file
# name (no '/', no NUL, at most 255 bytes) so the file-system tests can create it.
HOSTILE = {
    "space": "a b",
    "single-quote": "it's",
    "double-quote": 'say "hi"',
    "semicolon": f"x; touch {CANARY}",
    "and-and": f"x && touch {CANARY}",
    "or-or": f"x || touch {CANARY}",
    "pipe": f"x | touch {CANARY}",
    "command-substitution": INJECT,
    "backticks": f"`touch {CANARY}`",
    "quote-breakout": f"'; touch {CANARY}; '",
    "dquote-breakout": f'"; touch {CANARY}; "',
    "variable": "$HOME",
    "braced-variable": "${IFS}x",
    "arithmetic": "$((1+1))",
    "newline": f"first\ntouch {CANARY}",
    "tab": "a\tb",
    "carriage-return": "a\rb",
    "star-glob": "star*",
    "question-glob": "q?",
    "bracket-glob": "br[ax]",
    "brace-expansion": "{a,b}",
    "tilde": "~root",
    "leading-dash": "-rf",
    "long-option": "--help",
    "redirect": f"> {CANARY}",
    "background": f"& touch {CANARY}",
    "hash": "#comment",
    "bang": "!!",
    "backslash": "back\\slash",
    "unicode": "ünïcødé-日本語-🚀",
    "very-long": "L" * 200,
    "only-dots": "...",
    "percent": "%s%n",
}
# Decoys that an unquoted glob in HOSTILE would match.
GLOB_DECOYS = ("starfish", "qx", "brx", "a")


def run_shell(
    shell: str,
    command: str,
    cwd: Path,
    *,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [shell, "-c", command],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A directory for hostile names; the shell runs in its parent, where the canary would appear."""
    (tmp_path / "files").mkdir()
    return tmp_path / "files"


def assert_no_canary(work: Path) -> None:
    assert not list(work.parent.rglob(CANARY)), "a hostile value was executed"
    assert not (Path.cwd() / CANARY).exists()


# ------------------------------------------------------------------ golden command lines

GOLDEN: list[tuple[str, Callable[[], str], str]] = [
    (
        "sbatch",
        lambda: commands.sbatch_submit("/lustre/jobs/j/sbatch/job_j.sbatch"),
        "sbatch --parsable /lustre/jobs/j/sbatch/job_j.sbatch",
    ),
    (
        "sbatch-extra",
        lambda: commands.sbatch_submit("/s x.sbatch", parsable=False, extra_args=["--test-only"]),
        "sbatch --test-only '/s x.sbatch'",
    ),
    (
        "squeue-states",
        lambda: commands.squeue_states(["12", "13_4", "14+0", "12"]),
        "squeue -h -t all -j 12,13_4,14+0 -o '%i|%j|%T|%r|%N|%S|%e'",
    ),
    (
        "jobs-by-name",
        lambda: commands.jobs_by_name("tao-demo.train-0123", "alice", "now-7days"),
        "squeue -h -t all --name=tao-demo.train-0123 --user=alice -o '%i|%u'; echo \"#rc squeue $?\"; "
        "sacct -X -n -P --name=tao-demo.train-0123 --user=alice -o JobIDRaw,User --starttime=now-7days; "
        'echo "#rc sacct $?"',
    ),
    (
        "sacct-states",
        lambda: commands.sacct_states(["12", "13"], "now-2days"),
        "sacct -X -n -P -j 12,13 -o JobIDRaw,JobName,State,ExitCode,Reason,NodeList,Start,End --starttime=now-2days",
    ),
    ("node-states", commands.node_states, "sinfo -a -h -N -o '%N|%P|%t'"),
    ("scancel", lambda: commands.scancel(["12", "13"]), "scancel -Q 12 13"),
    ("scancel-guarded", lambda: commands.scancel(["12"], name="tao-x"), "scancel -Q --name=tao-x 12"),
    ("scancel-by-name", lambda: commands.scancel([], name="tao-x"), "scancel -Q --name=tao-x"),
    (
        "scancel-own-jobs",
        lambda: commands.scancel(["12"], name="tao-x", user="alice"),
        "scancel -Q --name=tao-x --user=alice 12",
    ),
    ("sinfo", commands.sinfo_partitions, "sinfo -a -h -o '%P|%l|%G|%a|%c|%m|%g|%r|%L'"),
    (
        "sacctmgr",
        lambda: commands.sacctmgr_assoc("alice", "proj_1"),
        "sacctmgr -n -P show associations where user=alice account=proj_1 format=Cluster,Account,User,Partition,QOS",
    ),
    (
        "sacctmgr-no-account",
        lambda: commands.sacctmgr_assoc("alice"),
        "sacctmgr -n -P show associations where user=alice format=Cluster,Account,User,Partition,QOS",
    ),
    (
        "test-paths",
        lambda: commands.test_paths(["/a b", "/c"]),
        'i=0; for x in \'/a b\' /c; do if [ -e "$x" ]; then echo "OK $i"; else echo "MISSING $i"; fi; i=$((i+1)); done',
    ),
    (
        "which",
        lambda: commands.which(["sbatch", "enroot"]),
        'i=0; for x in sbatch enroot; do if command -v "$x" >/dev/null 2>&1; then echo "OK $i"; '
        'else echo "MISSING $i"; fi; i=$((i+1)); done',
    ),
    (
        "write-file-under-base",
        lambda: commands.write_file_from_stdin("/r/jobs/j/env", "640", base="/r"),
        f"umask 077; {commands.secure_dirs('/r', ['/r/jobs', '/r/jobs/j'])}; mkdir -p -- /r/jobs/j && "
        "t=$(mktemp /r/jobs/j/.env.XXXXXX) && "
        '{ cat > "$t" && chmod 640 "$t" && mv -f -- "$t" /r/jobs/j/env || { rm -f -- "$t"; false; }; }',
    ),
    (
        "secure-dirs",
        lambda: commands.secure_dirs("/r", ["/r/logs/a b", "/r/logs"]),
        '_u() { printf \'UNSAFE %s: %s\\n\' "$1" "$2" >&2; [ -z "${_k:-}" ] || scancel "$_k"; exit 86; }; '
        '_w() { case $(stat $1 -c %A -- "$2") in ?????w*|????????w*) _u "$2" \'is writable by other users\';; esac; }; '
        '_b() { [ -d "$1" ] || mkdir -p -- "$1" 2>/dev/null || _u "$1" \'cannot be created\'; '
        '[ -O "$1" ] || _u "$1" \'is owned by another user\'; _w -L "$1"; }; '
        '_c() { for _p; do if [ -L "$_p" ]; then _u "$_p" \'is a symbolic link\'; elif [ -e "$_p" ]; then '
        '[ -d "$_p" ] || _u "$_p" \'is not a directory\'; [ -O "$_p" ] || _u "$_p" \'is owned by another user\'; '
        '_w "" "$_p"; fi; done; }; _b /r; _c /r/logs \'/r/logs/a b\'',
    ),
    ("mkdirs", lambda: commands.mkdirs(["/r/jobs/j", "/r/logs"]), "mkdir -p -m 700 -- /r/jobs/j /r/logs"),
    ("mkdirs-umask", lambda: commands.mkdirs(["/r"], mode=None), "mkdir -p -- /r"),
    (
        "write-file",
        lambda: commands.write_file_from_stdin("/r/jobs/j/env", "640"),
        f"umask 077; {commands.secure_dirs('/r/jobs/j', [])}; mkdir -p -- /r/jobs/j && "
        "t=$(mktemp /r/jobs/j/.env.XXXXXX) && "
        '{ cat > "$t" && chmod 640 "$t" && mv -f -- "$t" /r/jobs/j/env || { rm -f -- "$t"; false; }; }',
    ),
    (
        "writable-dir",
        lambda: commands.writable_dir("/r"),
        '[ -d /r ] && t=$(mktemp /r/.tao-probe.XXXXXX) && rm -f -- "$t"',
    ),
    (
        "read-file",
        lambda: commands.read_file("/r/status.json", 1024),
        '{ e=$(LC_ALL=C head -c 1024 -- /r/status.json 2>&1 >&3); r=$?; } 3>&1; if [ "$r" -ne 0 ]; then '
        'printf \'%s\\n\' "$e" >&2; case $e in *": No such file or directory") exit 44;; esac; exit "$r"; fi',
    ),
    ("remove-files", lambda: commands.remove_files(["/r/a", "/r/b c"]), "rm -f -- /r/a '/r/b c'"),
    ("rename", lambda: commands.rename("/i/.x.tmp", "/i/x.sqsh"), "mv -f -- /i/.x.tmp /i/x.sqsh"),
    (
        "tail-bytes",
        lambda: commands.tail_bytes("/l/main.out", 100, 65536),
        'if [ -f /l/main.out ]; then s=$(wc -c < /l/main.out); n=$((s - 100)); if [ "$n" -gt 65536 ]; then '
        'n=65536; fi; if [ "$n" -lt 0 ]; then n=0; fi; echo "SIZE $((s)) LEN $n"; tail -c +101 -- /l/main.out '
        '| head -c "$n"; else echo MISSING; fi',
    ),
    (
        "sqsh-check",
        lambda: commands.sqsh_check("/i/x.sqsh"),
        'if [ -f /i/x.sqsh ]; then echo "SQSH $(($(wc -c < /i/x.sqsh))) $(head -c 48 -- /i/x.sqsh | od -An -v -tx1 '
        "| tr -d ' \\n')\"; else echo MISSING; fi",
    ),
    (
        "enroot-credentials",
        lambda: commands.install_enroot_credentials("nvcr.io", "$oauthtoken"),
        'umask 077 && f="$HOME"/.config/enroot/.credentials && mkdir -p -- "${f%/*}" && t=$(mktemp "$f.XXXXXX") && '
        'if { [ ! -e "$f" ] || awk -v m=nvcr.io \'!($1 == "machine" && $2"" == m)\' "$f"; } > "$t" && '
        "awk -v p='machine nvcr.io login $oauthtoken password ' "
        "'NR == 1 && NF == 1 && $0 == $1 { k = $0; ok = 1 } END { if (!ok || NR != 1) exit 1; print p k }' "
        '>> "$t" && chmod 600 "$t" && mv -f -- "$t" "$f"; then :; else rm -f -- "$t"; false; fi',
    ),
]


@pytest.mark.parametrize(("build", "expected"), [case[1:] for case in GOLDEN], ids=[case[0] for case in GOLDEN])
def test_golden_command(build: Callable[[], str], expected: str) -> None:
    assert build() == expected


@pytest.mark.parametrize(("build", "expected"), [case[1:] for case in GOLDEN], ids=[case[0] for case in GOLDEN])
@pytest.mark.parametrize("shell", SHELLS)
def test_golden_command_is_valid_shell(shell: str, build: Callable[[], str], expected: str) -> None:
    result = subprocess.run([shell, "-n", "-c", build()], capture_output=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ validation

REJECTED: list[tuple[str, Callable[[], Any]]] = [
    ("sbatch-relative", lambda: commands.sbatch_submit("job.sbatch")),
    ("sbatch-leading-dash", lambda: commands.sbatch_submit("--wrap=id")),
    ("sbatch-empty", lambda: commands.sbatch_submit("")),
    ("sbatch-positional-extra", lambda: commands.sbatch_submit("/j.sbatch", extra_args=["/other.sbatch"])),
    ("squeue-no-ids", lambda: commands.squeue_states([])),
    ("squeue-string-ids", lambda: commands.squeue_states("123")),
    ("squeue-hostile-id", lambda: commands.squeue_states([f"1 {INJECT}"])),
    ("squeue-cluster-suffix", lambda: commands.squeue_states(["1;c"])),
    ("jobs-by-bad-name", lambda: commands.jobs_by_name("a b", "alice", "now-7days")),
    ("jobs-by-empty-name", lambda: commands.jobs_by_name("", "alice", "now-7days")),
    ("jobs-by-hostile-user", lambda: commands.jobs_by_name("tao-x", f"a {INJECT}", "now-7days")),
    ("jobs-by-option-user", lambda: commands.jobs_by_name("tao-x", "--all", "now-7days")),
    ("sacct-bad-id", lambda: commands.sacct_states(["-1"], "now-2days")),
    ("sacct-bad-start", lambda: commands.sacct_states(["1"], "now-2days; id")),
    ("sacct-start-midnight", lambda: commands.sacct_states(["1"], "")),
    ("sacct-start-impossible-date", lambda: commands.sacct_states(["1"], "2024-13-45T00:00:00")),
    ("sacct-start-unit", lambda: commands.jobs_by_name("tao-x", "alice", "now-2fortnights")),
    ("jobs-by-option-name", lambda: commands.jobs_by_name("--all", "alice", "now-2days")),
    ("scancel-bad-user", lambda: commands.scancel(["12"], name="tao-x", user="a;b")),
    ("scancel-nothing", lambda: commands.scancel([])),
    ("scancel-bad-id", lambda: commands.scancel(["12 13"])),
    ("scancel-bad-name", lambda: commands.scancel(["12"], name="x y")),
    ("scancel-string-ids", lambda: commands.scancel("", name="tao-x")),
    (
        "handoff-no-window",
        lambda: commands.scancel_handed_off(["12"], name="tao-x", user="u", within_s=0, every_s=5, log_path=None),
    ),
    (
        "handoff-relative-log",
        lambda: commands.scancel_handed_off(
            ["12"], name="tao-x", user="u", within_s=60, every_s=5, log_path="x.cancel.log"
        ),
    ),
    (
        "handoff-bad-name",
        lambda: commands.scancel_handed_off(["12"], name="x;y", user="u", within_s=60, every_s=5, log_path=None),
    ),
    ("sacctmgr-bad-user", lambda: commands.sacctmgr_assoc("a b")),
    ("sacctmgr-list-user", lambda: commands.sacctmgr_assoc("a,b")),
    ("sacctmgr-bad-account", lambda: commands.sacctmgr_assoc("alice", "x where user=root")),
    ("test-paths-empty", lambda: commands.test_paths([])),
    ("test-paths-relative", lambda: commands.test_paths(["/ok", "data/x"])),
    ("test-paths-string", lambda: commands.test_paths("/one/path")),
    ("which-empty", lambda: commands.which([])),
    ("which-path", lambda: commands.which(["/bin/sh"])),
    ("which-option", lambda: commands.which(["-p"])),
    ("mkdirs-relative", lambda: commands.mkdirs(["x"])),
    ("mkdirs-bad-mode", lambda: commands.mkdirs(["/x"], mode="rwx")),
    ("mkdirs-mode-injection", lambda: commands.mkdirs(["/x"], mode="700 /etc")),
    ("write-relative", lambda: commands.write_file_from_stdin("x")),
    ("write-directory", lambda: commands.write_file_from_stdin("/x/")),
    ("write-bad-mode", lambda: commands.write_file_from_stdin("/x", mode="0600; id")),
    ("writable-relative", lambda: commands.writable_dir("x")),
    ("read-relative", lambda: commands.read_file("-n", 1)),
    ("read-zero", lambda: commands.read_file("/x", 0)),
    ("read-bool", lambda: commands.read_file("/x", True)),
    ("remove-empty", lambda: commands.remove_files([])),
    ("remove-relative", lambda: commands.remove_files(["-rf"])),
    ("rename-relative-src", lambda: commands.rename("x", "/y")),
    ("rename-relative-dst", lambda: commands.rename("/x", "-y")),
    ("tail-relative", lambda: commands.tail_bytes("main.out", 0, 1)),
    ("tail-negative-offset", lambda: commands.tail_bytes("/x", -1, 1)),
    ("tail-zero-bytes", lambda: commands.tail_bytes("/x", 0, 0)),
    ("tail-float", lambda: commands.tail_bytes("/x", 1.5, 1)),
    ("sqsh-relative", lambda: commands.sqsh_check("x.sqsh")),
    ("nul-byte", lambda: commands.test_paths(["/a\x00b"])),
    ("registry-with-path", lambda: commands.enroot_credential_machines("nvcr.io/nvidia")),
    ("registry-hostile", lambda: commands.enroot_credential_machines(INJECT)),
    ("creds-bad-machine", lambda: commands.install_enroot_credentials("a b", "u")),
    ("creds-login-space", lambda: commands.install_enroot_credentials("nvcr.io", "a b")),
    ("creds-login-backslash", lambda: commands.install_enroot_credentials("nvcr.io", "a\\tb")),
    ("creds-login-empty", lambda: commands.install_enroot_credentials("nvcr.io", "")),
]


@pytest.mark.parametrize("build", [case[1] for case in REJECTED], ids=[case[0] for case in REJECTED])
def test_rejects(build: Callable[[], Any]) -> None:
    with pytest.raises(ValidationError):
        build()


@pytest.mark.parametrize(
    "password", ["", "two words", "tab\tsep", "new\nline", "nul\x00"], ids=["empty", "space", "tab", "newline", "nul"]
)
def test_credentials_line_rejects_without_echoing_the_secret(password: str) -> None:
    with pytest.raises(ValidationError) as info:
        commands.credentials_line("nvcr.io", "$oauthtoken", password)
    if password:
        assert password not in str(info.value)


def test_credentials_line() -> None:
    assert commands.credentials_line("NVCR.io", "$oauthtoken", "k3y$(x)`y`'\"") == (
        "machine nvcr.io login $oauthtoken password k3y$(x)`y`'\"\n"
    )


@pytest.mark.parametrize(
    ("registry", "machines"),
    [
        ("nvcr.io", ("nvcr.io", "authn.nvidia.com")),
        ("NVCR.IO", ("nvcr.io", "authn.nvidia.com")),
        ("ghcr.io", ("ghcr.io",)),
        ("registry.example.org:5000", ("registry.example.org:5000",)),
    ],
    ids=["ngc", "ngc-upper", "ghcr", "with-port"],
)
def test_enroot_credential_machines(registry: str, machines: tuple[str, ...]) -> None:
    assert commands.enroot_credential_machines(registry) == machines


# ------------------------------------------------------------------ parsers


@pytest.mark.parametrize(
    ("stdout", "missing"),
    [
        ("OK 0\nMISSING 1\nOK 2\n", ["/b"]),
        ("MISSING 0\nMISSING 1\nMISSING 2\n", ["/a", "/b", "/c"]),
        ("Welcome to the cluster!\nOK 0\r\nOK 1\n  OK 2  \nOK 7\n", []),
        ("OK 2\nOK 1\nOK 0\n", []),
    ],
    ids=["one-missing", "all-missing", "banner-crlf-and-out-of-range", "any-order"],
)
def test_parse_test_paths(stdout: str, missing: list[str]) -> None:
    assert commands.parse_test_paths(stdout, ["/a", "/b", "/c"]) == missing


@pytest.mark.parametrize(
    "stdout",
    ["", "OK 0\nOK 1\n", "OK 0\nOK 1\nOK two\n", "ok 0\nok 1\nok 2\n"],
    ids=["empty", "cut-short", "garbled", "lowercase"],
)
def test_parse_test_paths_rejects_incomplete_output(stdout: str) -> None:
    with pytest.raises(RemoteCommandError):
        commands.parse_test_paths(stdout, ["/a", "/b", "/c"])


def test_parse_which() -> None:
    assert commands.parse_which("OK 0\nMISSING 1\n", ["sbatch", "enroot"]) == ["enroot"]


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("MISSING\n", (None, 0)),
        ("SIZE 10 LEN 0\n", (10, 0)),
        ("SIZE 10 LEN 5\nab\ncd", (10, 5)),
        ("SIZE 10 LEN 9\nSIZE 1 LEN 1\n", (10, 9)),
        ("SIZE 3 LEN 3\n\ufffd\ufffd\n", (3, 3)),
        ("SIZE 3 LEN 3", (3, 3)),
    ],
    ids=["missing", "nothing-new", "chunk-with-newline", "chunk-looks-like-header", "undecodable-bytes", "header-only"],
)
def test_parse_tail(stdout: str, expected: tuple[int | None, int]) -> None:
    assert commands.parse_tail(stdout) == expected


@pytest.mark.parametrize("stdout", ["", "tail: cannot open\n", "SIZE x LEN 1\n"], ids=["empty", "error", "garbled"])
def test_parse_tail_rejects(stdout: str) -> None:
    with pytest.raises(RemoteCommandError):
        commands.parse_tail(stdout)


@pytest.mark.parametrize(
    ("offset", "size", "length", "expected"),
    [
        (0, None, 0, (0, False)),
        (0, 0, 0, (0, False)),
        (0, 100, 60, (60, False)),
        (60, 100, 40, (100, False)),
        (100, 100, 0, (100, False)),
        (100, 30, 0, (0, True)),
        (100, None, 0, (0, True)),
    ],
    ids=["not-yet-created", "empty", "first-chunk", "rest", "caught-up", "truncated-by-requeue", "deleted"],
)
def test_next_offset(offset: int, size: int | None, length: int, expected: tuple[int, bool]) -> None:
    assert commands.next_offset(offset, size, length) == expected


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("SQSH 4096 68737173\n", (4096, commands.SQUASHFS_MAGIC_HEX)),
        ("SQSH 0 \n", (0, "")),
        ("banner\nMISSING\n", None),
        ("SQSH 2 6869\n", (2, "6869")),
    ],
    ids=["valid", "empty-file", "missing", "short-file"],
)
def test_parse_sqsh_check(stdout: str, expected: tuple[int, str] | None) -> None:
    assert commands.parse_sqsh_check(stdout) == expected


def test_parse_sqsh_check_rejects() -> None:
    with pytest.raises(RemoteCommandError):
        commands.parse_sqsh_check("head: error\n")


# ------------------------------------------------------------------ SLURM tools under stand-ins

STAND_IN = '#!/bin/sh\nprintf \'%s\\0\' "$(basename "$0")" "$@"\n'


@pytest.fixture
def stand_ins(tmp_path: Path) -> dict[str, str]:
    """Put argv-printing stand-ins for the SLURM tools first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "squeue", "sacct", "scancel", "sinfo", "sacctmgr"):
        path = bin_dir / tool
        path.write_text(STAND_IN)
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def argv_of(shell: str, command: str, cwd: Path, env: dict[str, str]) -> list[str]:
    result = run_shell(shell, command, cwd, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("value", list(HOSTILE.values()), ids=list(HOSTILE))
def test_sbatch_hostile_values_stay_one_word(shell: str, value: str, work: Path, stand_ins: dict[str, str]) -> None:
    script = f"/lustre/{value}.sbatch"
    extra = [f"--comment={value}", f"--export={value}"]
    argv = argv_of(shell, commands.sbatch_submit(script, extra_args=extra), work.parent, stand_ins)
    assert argv == ["sbatch", "--parsable", *extra, script]
    assert_no_canary(work)


@pytest.mark.parametrize("shell", SHELLS)
def test_slurm_commands_argv(shell: str, work: Path, stand_ins: dict[str, str]) -> None:
    cases = [
        (
            commands.squeue_states(["1", "2_3"]),
            ["squeue", "-h", "-t", "all", "-j", "1,2_3", "-o", "%i|%j|%T|%r|%N|%S|%e"],
        ),
        (commands.scancel(["5"], name="tao-a", user="a.b"), ["scancel", "-Q", "--name=tao-a", "--user=a.b", "5"]),
        (commands.node_states(), ["sinfo", "-a", "-h", "-N", "-o", "%N|%P|%t"]),
        (commands.sinfo_partitions(), ["sinfo", "-a", "-h", "-o", "%P|%l|%G|%a|%c|%m|%g|%r|%L"]),
        (
            commands.sacctmgr_assoc("a.b@c", "acct"),
            [
                "sacctmgr",
                "-n",
                "-P",
                "show",
                "associations",
                "where",
                "user=a.b@c",
                "account=acct",
                "format=Cluster,Account,User,Partition,QOS",
            ],
        ),
    ]
    for command, expected in cases:
        assert argv_of(shell, command, work.parent, stand_ins) == expected


@pytest.mark.parametrize("shell", SHELLS)
def test_very_long_value_stays_one_word(shell: str, work: Path, stand_ins: dict[str, str]) -> None:
    value = "--comment=" + "x'y\"z $(a) " * 4000  # the quoted word must stay under Linux's 128 KiB per argument
    argv = argv_of(shell, commands.sbatch_submit("/j.sbatch", extra_args=[value]), work.parent, stand_ins)
    assert argv == ["sbatch", "--parsable", value, "/j.sbatch"]


# ------------------------------------------------------------------ files under hostile names


def _hostile_paths(work: Path) -> list[str]:
    return [str(work / name) for name in HOSTILE.values()]


@pytest.mark.parametrize("shell", SHELLS)
def test_test_paths_with_hostile_names(shell: str, work: Path) -> None:
    paths = _hostile_paths(work)
    for decoy in GLOB_DECOYS:
        (work / decoy).write_text("decoy")
    present = paths[::2]
    for path in present:
        Path(path).write_text("x")
    paths.append(str(work / "no such dir" / "file"))
    result = run_shell(shell, commands.test_paths(paths), work.parent)
    assert result.returncode == 0, result.stderr
    missing = commands.parse_test_paths(result.stdout.decode(), paths)
    assert missing == [path for path in paths if path not in present]
    assert_no_canary(work)


@pytest.mark.parametrize("shell", SHELLS)
def test_which_finds_real_tools(shell: str, work: Path) -> None:
    tools = ["sh", "definitely-not-a-tool-42", "awk"]
    result = run_shell(shell, commands.which(tools), work)
    assert commands.parse_which(result.stdout.decode(), tools) == ["definitely-not-a-tool-42"]


@pytest.mark.parametrize("shell", SHELLS)
def test_mkdirs_with_hostile_names(shell: str, work: Path) -> None:
    paths = [f"{path}/nested/leaf" for path in _hostile_paths(work)]
    result = run_shell(shell, commands.mkdirs(paths), work.parent)
    assert result.returncode == 0, result.stderr
    for path in paths:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert sorted(p.name for p in work.iterdir()) == sorted(HOSTILE.values())
    assert_no_canary(work)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", list(HOSTILE.values()), ids=list(HOSTILE))
def test_write_read_rename_remove_with_hostile_names(shell: str, name: str, work: Path) -> None:
    target = str(work / "new dir" / name)
    content = f"line 1\n{INJECT}\n`x` 'q' \"d\" \x01\xff".encode("utf-8", "surrogateescape") + b"\x00\xfe end"
    result = run_shell(shell, commands.write_file_from_stdin(target, "640"), work.parent, stdin=content)
    assert result.returncode == 0, result.stderr
    assert Path(target).read_bytes() == content
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(work / "new dir").st_mode) == 0o700
    assert os.listdir(work / "new dir") == [name], "the temp file was left behind"

    result = run_shell(shell, commands.read_file(target, 9), work.parent)
    assert (result.returncode, result.stdout) == (0, content[:9])

    moved = str(work / f"moved {name}")
    assert run_shell(shell, commands.rename(target, moved), work.parent).returncode == 0
    assert Path(moved).read_bytes() == content
    assert not Path(target).exists()

    result = run_shell(shell, commands.remove_files([moved, str(work / "never existed")]), work.parent)
    assert result.returncode == 0, result.stderr
    assert not Path(moved).exists()
    assert_no_canary(work)


@pytest.mark.parametrize("shell", SHELLS)
def test_write_file_replaces_atomically_and_keeps_the_old_file_on_failure(shell: str, work: Path) -> None:
    target = work / "spec.yaml"
    target.write_text("old")
    assert run_shell(shell, commands.write_file_from_stdin(str(target)), work, stdin=b"new").returncode == 0
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    (work / "blocker").write_text("a file, not a directory")
    result = run_shell(shell, commands.write_file_from_stdin(str(work / "blocker" / "x")), work, stdin=b"data")
    assert result.returncode != 0
    assert sorted(p.name for p in work.iterdir()) == ["blocker", "spec.yaml"]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "missing",
    ["nope", "no dir/nope", "dangling", f"{INJECT}: No such file or directory"],
    ids=["file", "directory-above", "dangling-link", "hostile-name"],
)
def test_read_file_of_a_missing_file_exits_with_its_own_status(shell: str, missing: str, work: Path) -> None:
    (work / "dangling").symlink_to(work / "gone")
    result = run_shell(shell, commands.read_file(str(work / missing), 10), work)
    assert (result.returncode, result.stdout) == (commands.MISSING_FILE_STATUS, b"")
    assert b"No such file or directory" in result.stderr
    assert_no_canary(work)


def _read_as_another_user(shell: str, path: Path) -> subprocess.CompletedProcess[bytes]:
    """Read ``path`` (mode 000) as a user it does not belong to: ``nobody`` when the tests run as root."""
    path.chmod(0o000)
    other = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
    command = commands.read_file(str(path), 10)
    return subprocess.run([shell, "-c", command], cwd="/", capture_output=True, timeout=60, check=False, **other)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", ["directory", "not-a-directory-above", "io-error", "permission", "killed"])
def test_a_read_that_fails_otherwise_keeps_its_status_and_says_why(
    shell: str, case: str, work: Path, tmp_path: Path
) -> None:
    """EIO, a denied read, a directory, a killed reader: none of them is "missing", whatever the file is called."""
    plain = work / "status.json"
    plain.write_text("{}")
    if case == "permission":
        unreadable = work / "x: No such file or directory"
        unreadable.write_text("{}")
        result = _read_as_another_user(shell, unreadable)
        why = b"Permission denied"
    elif case == "killed":
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        _tool(bin_dir, "head", "kill -9 $$")
        env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
        result = run_shell(shell, commands.read_file(str(plain), 10), work, env=env)
        why = b""
    else:
        path, why = {
            "directory": (work, b"Is a directory"),
            "not-a-directory-above": (plain / "x", b"Not a directory"),
            "io-error": (Path("/proc/self/mem"), b"Input/output error"),
        }[case]
        if case == "io-error" and not path.exists():
            pytest.skip("no /proc/self/mem to fail a read with EIO")
        result = run_shell(shell, commands.read_file(str(path), 10), work)
    assert result.returncode not in (0, commands.MISSING_FILE_STATUS), result.stderr
    assert why in result.stderr
    assert result.stdout == b""


@pytest.mark.parametrize("shell", SHELLS)
def test_writable_dir(shell: str, work: Path) -> None:
    assert run_shell(shell, commands.writable_dir(str(work / INJECT)), work.parent).returncode != 0
    (work / INJECT).mkdir()
    assert run_shell(shell, commands.writable_dir(str(work / INJECT)), work.parent).returncode == 0
    assert list((work / INJECT).iterdir()) == []
    assert_no_canary(work)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", ["plain.sqsh", *HOSTILE.values()], ids=["plain", *HOSTILE])
def test_sqsh_check(shell: str, name: str, work: Path) -> None:
    path = work / name
    result = run_shell(shell, commands.sqsh_check(str(path)), work.parent)
    assert commands.parse_sqsh_check(result.stdout.decode()) is None
    path.write_bytes(b"hsqs" + b"\x00" * 96)
    result = run_shell(shell, commands.sqsh_check(str(path)), work.parent)
    assert commands.parse_sqsh_check(result.stdout.decode()) == (100, commands.SQUASHFS_MAGIC_HEX + "00" * 44)
    path.write_bytes(b"<htm")
    result = run_shell(shell, commands.sqsh_check(str(path)), work.parent)
    assert commands.parse_sqsh_check(result.stdout.decode()) == (4, "3c68746d")
    assert_no_canary(work)


# ------------------------------------------------------------------ log tailing


def _read_all(shell: str, path: Path, cwd: Path, offset: int, max_bytes: int) -> tuple[bytes, int, bool]:
    """Read like a trigger does: chunk after chunk until nothing is new."""
    data = b""
    restarted = False
    while True:
        result = run_shell(shell, commands.tail_bytes(str(path), offset, max_bytes), cwd)
        assert result.returncode == 0, result.stderr
        raw = result.stdout.partition(b"\n")[2]
        size, length = commands.parse_tail(result.stdout.decode("utf-8", "replace"))
        assert len(raw) == length
        offset, again = commands.next_offset(offset, size, length)
        restarted |= again
        if again:
            continue
        data += raw
        if length == 0:
            return data, offset, restarted


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", ["main.out", *HOSTILE.values()], ids=["plain", *HOSTILE])
def test_tail_bytes_reads_everything_once(shell: str, name: str, work: Path) -> None:
    log = work / name
    content = "héllo wörld ✓ 日本\n".encode() * 7 + b"\xff\xfe raw"
    log.write_bytes(content[:50])
    first, offset, _ = _read_all(shell, log, work.parent, 0, 7)
    assert (first, offset) == (content[:50], 50)
    log.write_bytes(content)
    rest, offset, restarted = _read_all(shell, log, work.parent, offset, 7)
    assert first + rest == content
    assert (offset, restarted) == (len(content), False)
    assert_no_canary(work)


@pytest.mark.parametrize("shell", SHELLS)
def test_tail_bytes_restarts_after_truncation_and_handles_missing(shell: str, work: Path) -> None:
    log = work / "main.out"
    result = run_shell(shell, commands.tail_bytes(str(log), 0, 10), work)
    assert commands.parse_tail(result.stdout.decode()) == (None, 0)
    log.write_bytes(b"first run " * 10)
    _, offset, _ = _read_all(shell, log, work, 0, 64)
    assert offset == 100
    log.write_bytes(b"rerun\n")
    data, offset, restarted = _read_all(shell, log, work, offset, 64)
    assert (data, offset, restarted) == (b"rerun\n", 6, True)


# ------------------------------------------------------------------ Enroot credentials


def _credentials(home: Path) -> Path:
    return home / ".config" / "enroot" / ".credentials"


def _install(shell: str, home: Path, machine: str, login: str, password: bytes) -> subprocess.CompletedProcess[bytes]:
    return run_shell(
        shell, commands.install_enroot_credentials(machine, login), home, stdin=password, env={"HOME": str(home)}
    )


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "password",
    [
        "nvapi-abc123",
        INJECT.replace(" ", "${IFS}"),
        "`touch${IFS}canary`",
        "p;w&&x||y|z'\"",
        "$NGC_API_KEY",
        "ünïcødé",
        "*?[x]",
        "-rf",
        "\\back",
        "%s%n",
        "k" * 4096,
    ],
    ids=[
        "plain",
        "command-substitution",
        "backticks",
        "metachars",
        "env-reference",
        "unicode",
        "globs",
        "leading-dash",
        "backslash",
        "percent",
        "very-long",
    ],
)
def test_install_enroot_credentials(shell: str, password: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    command = commands.install_enroot_credentials("nvcr.io", "$oauthtoken")
    assert password not in command
    result = _install(shell, home, "nvcr.io", "$oauthtoken", password.encode())
    assert result.returncode == 0, result.stderr
    path = _credentials(home)
    assert path.read_text() == commands.credentials_line("nvcr.io", "$oauthtoken", password)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == [".credentials"]
    assert password.encode() not in result.stdout + result.stderr
    assert not list(tmp_path.rglob(CANARY))


@pytest.mark.parametrize("shell", SHELLS)
def test_install_enroot_credentials_replaces_only_its_machine(shell: str, tmp_path: Path) -> None:
    home = tmp_path
    path = _credentials(home)
    path.parent.mkdir(parents=True)
    path.write_text(
        "machine ghcr.io login bob password gh-old\n"
        "machine nvcr.io login $oauthtoken password ngc-old\n"
        "machine nvcr.io.example.org login x password keep-me"
    )
    path.chmod(0o644)
    for machine in commands.enroot_credential_machines("nvcr.io"):
        assert _install(shell, home, machine, "$oauthtoken", b"ngc-new\n").returncode == 0
    assert path.read_text() == (
        "machine ghcr.io login bob password gh-old\n"
        "machine nvcr.io.example.org login x password keep-me\n"
        "machine nvcr.io login $oauthtoken password ngc-new\n"
        "machine authn.nvidia.com login $oauthtoken password ngc-new\n"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _install(shell, home, "nvcr.io", "$oauthtoken", b"ngc-newer").returncode == 0
    assert path.read_text().count("machine nvcr.io ") == 1
    assert path.read_text().endswith("machine nvcr.io login $oauthtoken password ngc-newer\n")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "stdin",
    [b"", b"\n", b"two words", b"line1\nline2", b"tab\tsep"],
    ids=["empty", "blank-line", "space", "two-lines", "tab"],
)
def test_install_enroot_credentials_refuses_a_bad_secret_and_keeps_the_file(
    shell: str, stdin: bytes, tmp_path: Path
) -> None:
    path = _credentials(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("machine nvcr.io login $oauthtoken password old\n")
    result = _install(shell, tmp_path, "nvcr.io", "$oauthtoken", stdin)
    assert result.returncode != 0
    assert path.read_text() == "machine nvcr.io login $oauthtoken password old\n"
    assert os.listdir(path.parent) == [".credentials"]


def _files_holding(secret: bytes, tree: Path, since: float) -> list[Path]:
    """Regular files under ``tree``, and those in ``/tmp`` changed since ``since``, that contain ``secret``."""
    candidates = [path for path in tree.rglob("*") if path.is_file() and not path.is_symlink()]
    for entry in os.scandir("/tmp"):
        if entry.is_file(follow_symlinks=False) and entry.stat().st_ctime >= since:
            candidates.append(Path(entry.path))
    holding = []
    for path in candidates:
        try:
            if secret in path.read_bytes():
                holding.append(path)
        except OSError:
            continue
    return sorted(set(holding))


@pytest.mark.parametrize("shell", SHELLS)
def test_install_enroot_credentials_writes_the_key_to_no_other_file(shell: str, tmp_path: Path) -> None:
    """The key goes stdin -> awk -> the credentials file. While it is being sent (stdin still open) no file
    holds it; afterwards only the credentials file does: nothing in the home, in ``$TMPDIR`` or in ``/tmp``."""
    home, tmpdir = tmp_path / "home", tmp_path / "tmp"
    tmpdir.mkdir()
    path = _credentials(home)
    path.parent.mkdir(parents=True)
    path.write_text("machine ghcr.io login bob password gh-old\n")
    key = f"nvapi-{uuid.uuid4().hex}".encode()
    started = time.time() - 1
    process = subprocess.Popen(
        [shell, "-c", commands.install_enroot_credentials("nvcr.io", "$oauthtoken")],
        cwd=home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOME": str(home), "TMPDIR": str(tmpdir)},
    )
    assert process.stdin is not None
    process.stdin.write(key)
    process.stdin.flush()
    deadline = time.monotonic() + 1.5
    while_sending: list[Path] = []
    while not while_sending and time.monotonic() < deadline:
        while_sending = _files_holding(key, tmp_path, started)
        time.sleep(0.02)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert while_sending == [], "a file held the key before the credentials file was complete"
    assert _files_holding(key, tmp_path, started) == [path]
    assert sorted(os.listdir(path.parent)) == [".credentials"]
    assert list(tmpdir.iterdir()) == []
    assert path.read_text() == "machine ghcr.io login bob password gh-old\n" + commands.credentials_line(
        "nvcr.io", "$oauthtoken", key.decode()
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key not in stdout + stderr


# ------------------------------------------------------------------ a cancel handed to the login host


def _hand_off(tmp_path: Path, scancel_body: str, within_s: float) -> tuple[Path, Path, float]:
    """Run the handed-off cancel of job 12 with a stand-in scancel; return its log, the calls and the seconds the
    command took to return."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _tool(bin_dir, "scancel", f"printf '%s\\n' \"$*\" >> {calls}; {scancel_body}")
    log = tmp_path / "records with space" / "tao-x.cancel.log"
    log.parent.mkdir()
    command = commands.scancel_handed_off(
        ["12"], name="tao-x", user="u", within_s=within_s, every_s=0.1, log_path=str(log)
    )
    started = time.monotonic()
    result = run_shell("sh", command, tmp_path, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    return log, calls, time.monotonic() - started


def _log_says(log: Path, words: str) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if words in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{log} never said {words!r}: {text!r}")


def test_a_handed_off_cancel_tries_until_slurmctld_takes_it_and_returns_at_once(tmp_path: Path) -> None:
    """slurmctld answers the third scancel. Expected: the command returns before the first retry (the loop holds
    no stream of the SSH session); the log has both errors and the success; every try is the guarded scancel."""
    tries = tmp_path / "tries"
    body = (
        f'echo x >> {tries}; [ "$(wc -l < {tries})" -ge 3 ] && exit 0; '
        "echo 'scancel: error: Unable to contact slurm controller (connect failure)' >&2; exit 1"
    )
    log, calls, took = _hand_off(tmp_path, body, within_s=60)

    text = _log_says(log, "scancel went through")
    assert took < 2
    assert text.count("scancel failed (1): scancel: error: Unable to contact slurm controller") == 2
    assert calls.read_text().splitlines() == ["-Q --name=tao-x --user=u 12"] * 3


def test_a_handed_off_cancel_of_a_job_no_longer_live_ends_at_once(tmp_path: Path) -> None:
    """scancel -Q's silent exit 1: the name matched no live job. Expected: one try, the loop ends."""
    log, calls, _ = _hand_off(tmp_path, "exit 1", within_s=60)

    _log_says(log, "scancel went through")
    time.sleep(0.3)
    assert calls.read_text().splitlines() == ["-Q --name=tao-x --user=u 12"]


def test_a_handed_off_cancel_gives_up_after_its_window_and_says_so(tmp_path: Path) -> None:
    """scancel fails every 0.1 s for a 2 s window. Expected: several tries, then the log says to cancel by hand.

    (The loop's window is in whole seconds of ``date +%s``: a 1 s window ended after one try whenever the first
    try crossed a second, about once in twenty runs under load.)"""
    log, calls, _ = _hand_off(tmp_path, "echo 'scancel: error: Socket timed out' >&2; exit 1", within_s=2)

    text = _log_says(log, "gave up: cancel the job by hand")
    assert "went through" not in text
    assert len(calls.read_text().splitlines()) >= 2


# ------------------------------------------------------------------ held submission and staging


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("reply", "expected_id"), [("42", "42"), ("banner line\n42;mini", "42")], ids=["plain", "banner-cluster"]
)
def test_sbatch_submit_held_creates_log_dir_then_releases(
    shell: str, reply: str, expected_id: str, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _tool(bin_dir, "sbatch", f"printf '%s\\n' \"$*\" >> {calls}; printf '{reply}\\n'")
    _tool(bin_dir, "scontrol", f"printf 'scontrol %s\\n' \"$*\" >> {calls}")
    _tool(bin_dir, "squeue", f"printf '{expected_id}\\n'")
    logs = tmp_path / "logs with space"
    command = commands.sbatch_submit_held(
        "/lustre/j.sbatch", log_dir=str(logs), job_name="tao-x", user="u", extra_args=["--exclude=n2"]
    )
    result = run_shell(shell, command, tmp_path, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines()[-1] == reply.splitlines()[-1]
    assert (logs / f"tao-x-{expected_id}").is_dir()
    assert calls.read_text().splitlines() == [
        "--parsable --hold --export=ALL --job-name=tao-x --exclude=n2 /lustre/j.sbatch",
        f"scontrol release {expected_id}",
    ]


@pytest.mark.parametrize("shell", SHELLS)
def test_sbatch_submit_held_refusal_is_passed_through(shell: str, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "sbatch", "echo 'sbatch: error: invalid partition specified: x' >&2; exit 1")
    _tool(bin_dir, "scontrol", f"touch {tmp_path}/released")
    command = commands.sbatch_submit_held("/l/j.sbatch", log_dir=str(tmp_path), job_name="tao-x", user="u")
    result = run_shell(shell, command, tmp_path, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 1
    assert b"invalid partition" in result.stderr
    assert not (tmp_path / "released").exists()


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("live", "kept", "calls_after_sbatch"),
    [
        pytest.param("42\n", "42", ["squeue -h --name=tao-x --user=u -o %i", "scontrol release 42"], id="alone"),
        pytest.param(
            "45\n42\n", "42", ["squeue -h --name=tao-x --user=u -o %i", "scontrol release 42"], id="we-are-older"
        ),
        pytest.param(
            "42\n40\n",
            "40",
            ["squeue -h --name=tao-x --user=u -o %i", "scancel 42", "scontrol release 40"],
            id="another-try-was-first",
        ),
        pytest.param("", "42", ["squeue -h --name=tao-x --user=u -o %i", "scontrol release 42"], id="squeue-silent"),
    ],
)
def test_two_tries_submitting_at_once_keep_only_the_oldest_job(
    shell: str, live: str, kept: str, calls_after_sbatch: list[str], tmp_path: Path
) -> None:
    """Our held job is 42; squeue lists the user's live jobs of the name. An older one wins: 42 is cancelled."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _tool(bin_dir, "sbatch", "echo 42")
    for tool, output in (("squeue", live), ("scancel", ""), ("scontrol", "")):
        _tool(bin_dir, tool, f"printf '{tool} %s\\n' \"$*\" >> {calls}; printf '{output}'")
    command = commands.sbatch_submit_held("/l/j.sbatch", log_dir=str(tmp_path / "logs"), job_name="tao-x", user="u")
    result = run_shell(shell, command, tmp_path, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[-1] == kept
    assert ("#concurrent 42 40" in lines) == (kept == "40")
    assert calls.read_text().splitlines() == calls_after_sbatch
    assert (tmp_path / "logs" / f"tao-x-{kept}").is_dir()


def test_extract_tar_keeps_modes(tmp_path: Path) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, mode in (("jobs/j1/.secrets.env", 0o600), ("jobs/j1/specs/spec.yaml", 0o644)):
            info = tarfile.TarInfo(name)
            info.size = 3
            info.mode = mode
            archive.addfile(info, io.BytesIO(b"abc"))
    base = tmp_path / "base dir"
    result = run_shell(
        "bash",
        commands.extract_tar(str(base), ["jobs/j1/.secrets.env", "jobs/j1/specs/spec.yaml"]),
        tmp_path,
        stdin=buffer.getvalue(),
    )
    assert result.returncode == 0, result.stderr
    assert (base / "jobs/j1/.secrets.env").stat().st_mode & 0o777 == 0o600
    assert (base / "jobs/j1/specs/spec.yaml").read_bytes() == b"abc"


def test_prepare_job_logs() -> None:
    assert commands.prepare_job_logs("/l/logs", "tao-x", "12", base="/l") == (
        f"{commands.secure_dirs('/l', ['/l/logs', '/l/logs/tao-x-12'])}; "
        "mkdir -p -- /l/logs/tao-x-12 && { scontrol release 12 2>/dev/null || true; }"
    )


def test_existing_nodes() -> None:
    assert commands.existing_nodes("n[1-2],gpu3") == "sinfo -a -h -N -o %N -n 'n[1-2],gpu3'"


@pytest.mark.parametrize("bad", ["", "-n1", "n1;id", "n 1", "n1\nn2"])
def test_existing_nodes_rejects(bad: str) -> None:
    with pytest.raises(ValidationError):
        commands.existing_nodes(bad)


# ------------------------------------------------------------------ preflight builders

SRUN_HELP = """Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]] [ : [OPTIONS(N)...]] executable(N) [args(N)...]
      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH
                              [pyxis] the image to use for the container
      --container-mounts=SRC:DST[:FLAGS][,SRC:DST...]
      --no-container-mount-home
                              [pyxis] do not bind mount the user's home directory
      --container-workdir-extra  not the option itself
  -h, --help                  show this help message
"""


@pytest.mark.parametrize(
    ("help_text", "options", "missing"),
    [
        (SRUN_HELP, list(PYXIS_SRUN_OPTIONS), []),
        (SRUN_HELP, ["--container-image", "--container-workdir"], ["--container-workdir"]),
        (SRUN_HELP, ["--container-mount-home"], ["--container-mount-home"]),
        ("", ["--container-image"], ["--container-image"]),
    ],
    ids=["all-present", "prefix-of-longer-option-is-not-enough", "no-prefix-is-not-enough", "empty-help"],
)
def test_missing_srun_options(help_text: str, options: list[str], missing: list[str]) -> None:
    assert commands.missing_srun_options(help_text, options) == missing


#: The preflight's enroot step as the shell is given it: a start line, then the command words.
STEP = """sh -c 'echo '"'"'#tao-slurm-step-started'"'"'; exec "$@"' sh enroot version"""


def test_srun_probe_and_help_command_lines() -> None:
    """The probe runs its words behind a start line that srun's own refusals never print."""
    assert commands.srun_help() == "srun --help"
    assert commands.srun_probe("cpu_long", ["enroot", "version"], account="gpu_proj", wait_seconds=30) == (
        f"srun --partition=cpu_long --account=gpu_proj --nodes=1 --ntasks=1 --time=1 --immediate=30 --input=none {STEP}"
    )
    assert commands.srun_probe("cpu", ["enroot", "version"]) == (
        f"srun --partition=cpu --nodes=1 --ntasks=1 --time=1 --immediate=60 --input=none {STEP}"
    )


@pytest.mark.parametrize(
    ("stdout", "started"),
    [
        ("#tao-slurm-step-started\n3.4.1\n", True),
        ("\n#tao-slurm-step-started\nNODE n1\n", True),
        ("", False),
        ("3.4.1\n#tao-slurm-step-started\n", False),  # the line comes first, from the step itself
    ],
    ids=["ran", "ran-after-blank", "never-started", "not-first"],
)
def test_step_started(stdout: str, started: bool) -> None:
    assert commands.step_started(stdout) is started


@pytest.mark.parametrize(
    "build",
    [
        lambda: commands.missing_srun_options("", []),
        lambda: commands.missing_srun_options("", "--container-image"),
        lambda: commands.missing_srun_options("", ["-c"]),
        lambda: commands.missing_srun_options("", ["--container-image;id"]),
        lambda: commands.srun_probe("cpu long", ["enroot"]),
        lambda: commands.srun_probe("cpu", ["enroot"], account="a;b"),
        lambda: commands.srun_probe("cpu", ["enroot", "$(id)"]),
        lambda: commands.srun_probe("cpu", ["enroot"], wait_seconds=0),
        lambda: commands.srun_probe("-p", ["enroot"]),
        lambda: commands.enroot_credentials_present([]),
        lambda: commands.enroot_credentials_present("nvcr.io"),
        lambda: commands.enroot_credentials_present(["nvcr.io;id"]),
    ],
    ids=[
        "no-options",
        "option-string",
        "short-option",
        "option-with-metachar",
        "partition-space",
        "account-metachar",
        "command-substitution",
        "zero-wait",
        "partition-dash",
        "no-machines",
        "machine-string",
        "machine-metachar",
    ],
)
def test_preflight_builders_reject(build: Callable[[], Any]) -> None:
    with pytest.raises(ValidationError):
        build()


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("", []),
        (
            "mini|gpu_proj|slurmuser||normal\n\nmini|gpu_proj|slurmuser|polar|high\n",
            [
                commands.Association("mini", "gpu_proj", "slurmuser", None, "normal"),
                commands.Association("mini", "gpu_proj", "slurmuser", "polar", "high"),
            ],
        ),
    ],
    ids=["no-association", "two-rows"],
)
def test_parse_sacctmgr_assoc(stdout: str, expected: list[commands.Association]) -> None:
    assert commands.parse_sacctmgr_assoc(stdout) == expected


def test_parse_sacctmgr_assoc_rejects_other_output() -> None:
    with pytest.raises(RemoteCommandError, match="Cluster\\|Account"):
        commands.parse_sacctmgr_assoc("sacctmgr: error: something\n")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("content", "missing"),
    [
        (None, ["nvcr.io", "authn.nvidia.com"]),
        ("machine nvcr.io login $oauthtoken password s3cr3t\n", ["authn.nvidia.com"]),
        (
            "machine nvcr.io.evil login x password s3cr3t\nmachine authn.nvidia.com login a password s3cr3t\n",
            ["nvcr.io"],
        ),
        ("machine nvcr.io login a password s3cr3t\nmachine authn.nvidia.com login a password s3cr3t", []),
    ],
    ids=["no-file", "one-of-two", "longer-name-does-not-count", "both"],
)
def test_enroot_credentials_present(shell: str, content: str | None, missing: list[str], tmp_path: Path) -> None:
    machines = ["nvcr.io", "authn.nvidia.com"]
    if content is not None:
        _credentials(tmp_path).parent.mkdir(parents=True)
        _credentials(tmp_path).write_text(content)
    result = run_shell(shell, commands.enroot_credentials_present(machines), tmp_path, env={"HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert commands.parse_enroot_credentials_present(result.stdout.decode(), machines) == missing
    assert b"s3cr3t" not in result.stdout + result.stderr


# ------------------------------------------------------------------ jobs by name (own user only) and node states

JOBS_BY_NAME = (
    "squeue -h -t all --name={name} --user={user} -o '%i|%u'; echo \"#rc squeue $?\"; "
    'sacct -X -n -P --name={name} --user={user} -o JobIDRaw,User --starttime={start}; echo "#rc sacct $?"'
)


@pytest.mark.parametrize(
    ("name", "user", "start"),
    [
        pytest.param("tao-demo.train-0123", "alice", "now-7days", id="plain"),
        pytest.param("tao-x", "svc_tao.bot@corp", "2024-05-01T00:00:00", id="dotted-user-iso-start"),
        pytest.param("a", "_u1", "now-2hours", id="short-name-underscore-user"),
    ],
)
def test_jobs_by_name_asks_both_tools_for_our_user_and_prints_their_exit_status(
    name: str, user: str, start: str
) -> None:
    command = commands.jobs_by_name(name, user, start)
    assert command == JOBS_BY_NAME.format(name=name, user=user, start=start)
    assert command.count(f"--user={user}") == 2  # squeue and sacct both filter on the server side


@pytest.mark.parametrize(
    ("name", "user", "start"),
    [
        pytest.param(HOSTILE["semicolon"], "alice", "now-7days", id="hostile-name"),
        pytest.param(INJECT, "alice", "now-7days", id="substitution-name"),
        pytest.param("-x", "alice", "now-7days", id="option-name"),
        pytest.param("tao-x", "", "now-7days", id="empty-user"),
        pytest.param("tao-x", "a b", "now-7days", id="user-with-space"),
        pytest.param("tao-x", INJECT, "now-7days", id="substitution-user"),
        pytest.param("tao-x", "-u", "now-7days", id="option-user"),
        pytest.param("tao-x", "alice\nbob", "now-7days", id="newline-user"),
        pytest.param("tao-x", "al'ice", "now-7days", id="quote-user"),
        pytest.param("tao-x", "alice", "now-7days;id", id="hostile-start"),
    ],
)
def test_jobs_by_name_refuses_hostile_names_users_and_times(name: str, user: str, start: str) -> None:
    with pytest.raises(ValidationError):
        commands.jobs_by_name(name, user, start)


@pytest.mark.parametrize(
    ("ids", "name", "user", "expected"),
    [
        pytest.param(["12"], "tao-x", "alice", "scancel -Q --name=tao-x --user=alice 12", id="id-name-user"),
        pytest.param([], "tao-x", "alice", "scancel -Q --name=tao-x --user=alice", id="all-of-name-for-user"),
        pytest.param(["1", "2_3"], None, "a.b@c", "scancel -Q --user=a.b@c 1 2_3", id="ids-user-only"),
        pytest.param(["12"], "tao-x", None, "scancel -Q --name=tao-x 12", id="no-user-as-before"),
    ],
)
def test_scancel_with_user(ids: list[str], name: str | None, user: str | None, expected: str) -> None:
    assert commands.scancel(ids, name=name, user=user) == expected


@pytest.mark.parametrize(
    ("ids", "name", "user"),
    [
        pytest.param([], None, "alice", id="user-alone-never-cancels-everything"),
        pytest.param(["12"], "tao-x", INJECT, id="hostile-user"),
        pytest.param(["12"], "tao-x", "--all", id="option-user"),
        pytest.param(["12"], "tao-x", "", id="empty-user"),
    ],
)
def test_scancel_refuses(ids: list[str], name: str | None, user: str | None) -> None:
    with pytest.raises(ValidationError):
        commands.scancel(ids, name=name, user=user)


LOOKUP_STAND_IN = """#!/bin/sh
case "$(basename "$0")" in
  squeue) printf '%s' "$SQUEUE_OUT"; exit "${SQUEUE_RC:-0}" ;;
  sacct) printf '%s' "$SACCT_OUT"; exit "${SACCT_RC:-0}" ;;
esac
"""


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("squeue", "sacct", "mine", "failure"),
    [
        pytest.param(("11|alice\n", 0), ("11|alice\n12|alice\n", 0), ("11", "12"), None, id="both-answer"),
        pytest.param(("13|bob\n", 0), ("", 0), (), None, id="only-foreign"),
        pytest.param(("", 1), ("11|alice\n", 0), None, "squeue exited 1", id="controller-down"),
        pytest.param(("11|alice\n", 0), ("", 1), None, "sacct exited 1", id="accounting-down"),
    ],
)
def test_jobs_by_name_markers_carry_each_tools_exit_status_through_a_real_shell(
    shell: str,
    tmp_path: Path,
    squeue: tuple[str, int],
    sacct: tuple[str, int],
    mine: tuple[str, ...] | None,
    failure: str | None,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sacct"):
        (bin_dir / tool).write_text(LOOKUP_STAND_IN)
        (bin_dir / tool).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SQUEUE_OUT": squeue[0],
        "SQUEUE_RC": str(squeue[1]),
        "SACCT_OUT": sacct[0],
        "SACCT_RC": str(sacct[1]),
    }
    result = run_shell(shell, commands.jobs_by_name("tao-x", "alice", "now-7days"), tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    stdout = result.stdout.decode()
    if failure is None:
        assert parse_jobs_by_name(stdout, "alice").job_ids == mine
    else:
        with pytest.raises(JobLookupError, match=failure):
            parse_jobs_by_name(stdout, "alice")


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        pytest.param(
            "n1|polar*|idle\nn2|polar*|down*\n",
            [commands.NodeRow("n1", "polar", "idle"), commands.NodeRow("n2", "polar", "down*")],
            id="default-partition-marker-dropped",
        ),
        pytest.param(
            "n1|gpu|MIX\nn1|cpu|mix\n",
            [commands.NodeRow("n1", "gpu", "mix"), commands.NodeRow("n1", "cpu", "mix")],
            id="one-node-two-partitions-state-lowercased",
        ),
        pytest.param(
            "  n3|polar|drain  \n\n\nn4|polar|alloc\n",
            [commands.NodeRow("n3", "polar", "drain"), commands.NodeRow("n4", "polar", "alloc")],
            id="padding-and-blank-lines",
        ),
        pytest.param("", [], id="empty"),
    ],
)
def test_parse_node_states(stdout: str, expected: list[commands.NodeRow]) -> None:
    assert commands.parse_node_states(stdout) == expected


@pytest.mark.parametrize(
    "stdout",
    [
        pytest.param("n1 polar idle\n", id="no-separator"),
        pytest.param("n1|polar\n", id="two-fields"),
        pytest.param("n1|polar|idle|extra\n", id="four-fields"),
        pytest.param("n1||idle\n", id="empty-partition"),
        pytest.param("|polar|idle\n", id="empty-node"),
        pytest.param("n1|polar|\n", id="empty-state"),
        pytest.param("n1|polar|idle\nsinfo: error: slurm_load_partitions\n", id="error-after-rows"),
    ],
)
def test_parse_node_states_rejects_bad_lines(stdout: str) -> None:
    with pytest.raises(RemoteCommandError, match=r"expected 'NODE\|PARTITION\|STATE'"):
        commands.parse_node_states(stdout)


@pytest.mark.parametrize(
    ("state", "usable"),
    [
        pytest.param("idle", True, id="idle"),
        pytest.param("mix", True, id="mix"),
        pytest.param("alloc", True, id="alloc"),
        pytest.param("comp", True, id="completing"),
        pytest.param("down", False, id="down"),
        pytest.param("down*", False, id="down-not-responding"),
        pytest.param("idle*", False, id="idle-not-responding"),
        pytest.param("drain", False, id="drain"),
        pytest.param("drng", False, id="draining"),
        pytest.param("drain*", False, id="drain-not-responding"),
        pytest.param("fail", False, id="fail"),
        pytest.param("failg", False, id="failing"),
        pytest.param("maint", False, id="maint"),
        pytest.param("unk", False, id="unknown"),
        pytest.param("inval", False, id="invalid"),
        pytest.param("futr", False, id="future"),
        pytest.param("boot", False, id="booting"),
    ],
)
def test_node_row_usable(state: str, usable: bool) -> None:
    assert commands.NodeRow("n1", "polar", state).usable is usable


# ---------------------------------------------------------------------- shared storage: planted links and files
#
# Another user of a shared file system plants links or directories in our results tree; every writer
# must stop before writing (exit 86, ``UNSAFE <path>: <reason>``), write nothing through the plant and
# submit nothing. Ownership needs root to arrange (files are given to ``nobody``), as in CI.

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting files of another user needs root")


def _give_away(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def _plant_world_writable_base(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    base.chmod(0o1777)
    return base, "is writable by other users"


def _plant_group_writable_base(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    base.chmod(0o775)
    return base, "is writable by other users"


def _plant_base_of_another_user(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    _give_away(base)
    return base, "is owned by another user"


def _plant_base_linked_to_another_users_dir(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    base.rmdir()
    base.symlink_to(other)
    return base, "is owned by another user"


def _plant_dir_link(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    (base / "d").symlink_to(other)
    _give_away(base / "d")
    return base / "d", "is a symbolic link"


def _plant_dir_link_to_our_own_dir(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    ours = base.parent / "ours"
    ours.mkdir(mode=0o700)
    (base / "d").symlink_to(ours)
    return base / "d", "is a symbolic link"


def _plant_sticky_shared_dir(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    (base / "d").mkdir()
    (base / "d").chmod(0o1777)
    return base / "d", "is writable by other users"


def _plant_dir_of_another_user(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    (base / "d").mkdir(mode=0o755)
    _give_away(base / "d")
    return base / "d", "is owned by another user"


def _plant_file_for_dir(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    (base / "d").write_text("not a directory")
    return base / "d", "is not a directory"


def _plant_deep_link(base: Path, other: Path, leaf: str) -> tuple[Path, str]:
    (base / "d").mkdir(mode=0o700)
    (base / leaf).symlink_to(other)
    return base / leaf, "is a symbolic link"


PLANTS: dict[str, Callable[[Path, Path, str], tuple[Path, str]]] = {
    "base-world-writable": _plant_world_writable_base,
    "base-group-writable": _plant_group_writable_base,
    "base-of-another-user": _plant_base_of_another_user,
    "base-linked-to-another-users-dir": _plant_base_linked_to_another_users_dir,
    "dir-link": _plant_dir_link,
    "dir-link-to-our-own-dir": _plant_dir_link_to_our_own_dir,
    "sticky-shared-dir": _plant_sticky_shared_dir,
    "dir-of-another-user": _plant_dir_of_another_user,
    "file-instead-of-dir": _plant_file_for_dir,
    "deep-link": _plant_deep_link,
}


def _staging_archive(member: str, content: bytes) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(member)
        info.size = len(content)
        info.mode = 0o600
        archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


#: Each writer of the results tree, writing under ``<base>/d/j1``: (command, stdin, file it writes).
WRITERS: dict[str, Callable[[Path], tuple[str, bytes, str]]] = {
    "write-file": lambda base: (
        commands.write_file_from_stdin(f"{base}/d/j1/.secrets.env", "600", base=str(base)),
        b"export TOKEN=s3cret\n",
        "d/j1/.secrets.env",
    ),
    "stage-files": lambda base: (
        commands.extract_tar(str(base), ["d/j1/.secrets.env"]),
        _staging_archive("d/j1/.secrets.env", b"export TOKEN=s3cret\n"),
        "d/j1/.secrets.env",
    ),
    "submit-held": lambda base: (
        commands.sbatch_submit_held("/l/j.sbatch", log_dir=f"{base}/d", job_name="j1", user="u", base=str(base)),
        b"",
        "d/j1-42",
    ),
    "prepare-job-logs": lambda base: (
        commands.prepare_job_logs(f"{base}/d", "j1", "42", base=str(base)),
        b"",
        "d/j1-42",
    ),
    "partition-cache": lambda base: (
        commands.sinfo_partitions_cached(f"{base}/d/j1/partitions", 600, base=str(base)),
        b"",
        "d/j1/partitions",
    ),
}


#: Writers whose written path is the job's log directory itself (the others write a file).
LOG_DIR_WRITERS = ("submit-held", "prepare-job-logs")


@pytest.fixture
def shared(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """``results`` (ours, 755), another user's world-writable directory, and SLURM stand-ins logging to ``calls``."""
    base = tmp_path / "results"
    base.mkdir(mode=0o755)
    other = tmp_path / "other"
    other.mkdir()
    other.chmod(0o777)
    _give_away(other)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("sbatch", "scontrol", "scancel", "sinfo"):
        _tool(bin_dir, tool, f"printf '{tool} %s\\n' \"$*\" >> {calls}; echo 42")
    _tool(bin_dir, "squeue", "echo 42")
    return base, other, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@as_root
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_link_or_dir_stops_every_writer_before_it_writes(
    shell: str, writer: str, plant: str, shared: tuple[Path, Path, dict[str, str]]
) -> None:
    base, other, env = shared
    command, stdin, written = WRITERS[writer](base)
    leaf = written if writer in LOG_DIR_WRITERS else written.rsplit("/", 1)[0]
    unsafe, reason = PLANTS[plant](base, other, leaf)

    result = run_shell(shell, command, base.parent, stdin=stdin, env=env)

    assert result.returncode == commands.UNSAFE_PATH_STATUS, result.stderr
    assert result.stderr.decode().splitlines() == [f"UNSAFE {unsafe}: {reason}"]
    assert commands.UNSAFE_PATH_RE.search(result.stderr.decode()) is not None
    assert list(other.iterdir()) == []  # nothing written through a link into the other user's directory
    calls = base.parent / "calls"
    if (writer, plant) == ("submit-held", "deep-link"):  # the log dir is named after the job id: known only
        assert calls.read_text().splitlines() == [  # once submitted (held), so the held job is cancelled
            "sbatch --parsable --hold --export=ALL --job-name=j1 /l/j.sbatch",
            "scancel 42",
        ]
    else:
        assert not calls.exists()  # nothing submitted, released or asked


@as_root
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("base_is_our_link", [False, True], ids=["base-dir", "base-linked-to-our-dir"])
def test_a_private_tree_is_written(
    shell: str, writer: str, base_is_our_link: bool, shared: tuple[Path, Path, dict[str, str]]
) -> None:
    """The checks pass on a tree only we can write (a results_dir that is itself a link is fine)."""
    base, _other, env = shared
    if base_is_our_link:
        target = base.parent / "real-results"
        base.rename(target)
        base.symlink_to(target)
    command, stdin, written = WRITERS[writer](base)

    result = run_shell(shell, command, base.parent, stdin=stdin, env=env)

    assert result.returncode == 0, result.stderr
    assert (base / written).exists()


@as_root
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("writer", ["write-file", "stage-files"])
def test_a_leftover_link_at_the_file_name_is_replaced_not_followed(
    shell: str, writer: str, shared: tuple[Path, Path, dict[str, str]]
) -> None:
    """A link another user left at the very name (from a time the tree was open) is replaced by our file."""
    base, other, env = shared
    victim = other / "victim"
    victim.write_text("theirs")
    _give_away(victim)
    (base / "d" / "j1").mkdir(parents=True, mode=0o700)
    planted = base / "d" / "j1" / ".secrets.env"
    planted.symlink_to(victim)
    _give_away(planted)
    command, stdin, _written = WRITERS[writer](base)

    result = run_shell(shell, command, base.parent, stdin=stdin, env=env)

    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "theirs"
    assert not planted.is_symlink()
    assert planted.read_bytes() == b"export TOKEN=s3cret\n"
    assert stat.S_IMODE(planted.stat().st_mode) == 0o600
    assert planted.stat().st_uid == os.geteuid()


@as_root
@pytest.mark.parametrize("shell", SHELLS)
def test_a_planted_partition_cache_is_not_read(shell: str, shared: tuple[Path, Path, dict[str, str]]) -> None:
    """A cache file that is a link (or not a regular file) is ignored: sinfo is asked and a real file written."""
    base, other, env = shared
    forged = other / "forged"
    forged.write_text("evil*|infinite\n")
    (base / "c").mkdir(mode=0o700)
    (base / "c" / "partitions").symlink_to(forged)

    result = run_shell(
        shell, commands.sinfo_partitions_cached(f"{base}/c/partitions", 600, base=str(base)), base.parent, env=env
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == b"42\n"
    assert forged.read_text() == "evil*|infinite\n"
    assert not (base / "c" / "partitions").is_symlink()


@pytest.mark.parametrize(
    ("path", "results_dir", "expected"),
    [
        ("/r/jobs/j/env", "/r", "/r"),
        ("/r/jobs/j/env", "/r/", "/r"),
        ("/r", "/r", "/r"),
        ("/rx/jobs/j/env", "/r", "/rx/jobs/j"),
        ("/elsewhere/f", "/r", "/elsewhere"),
        ("/r/jobs/j/env", None, "/r/jobs/j"),
        ("/f", None, "/"),
    ],
)
def test_trusted_base(path: str, results_dir: str | None, expected: str) -> None:
    assert commands.trusted_base(path, results_dir) == expected


@pytest.mark.parametrize(
    "build",
    [
        lambda: commands.secure_dirs("/r", ["/other/x"]),
        lambda: commands.secure_dirs("r", []),
        lambda: commands.extract_tar("/r", ["../escape"]),
        lambda: commands.extract_tar("/r", ["a/./b"]),
        lambda: commands.extract_tar("/r", [""]),
    ],
    ids=["outside-base", "relative-base", "dotdot-member", "dot-member", "empty-member"],
)
def test_shared_storage_guard_rejects(build: Callable[[], str]) -> None:
    with pytest.raises(ValidationError):
        build()


def test_extract_tar_checks_the_directories_of_files_and_directory_members() -> None:
    """Parents of every member and every directory member, parents before children, then the unpack."""
    command = commands.extract_tar("/r", ["jobs/j/env", "records/j.json"], ["logs", "results/j"])
    assert "_b /r; _c /r/jobs /r/logs /r/records /r/results /r/jobs/j /r/results/j; _st=$(mktemp -d" in command


#: A job's staged tree: two files and two directory members (mode 755, as the hook stages them).
TREE: dict[str, tuple[bytes | None, int]] = {
    "jobs/j/specs/spec.yaml": (b"epochs: 2\n", 0o644),
    "jobs/j/.secrets.env": (b"export T=s\n", 0o600),
    "results/j": (None, 0o755),
    "logs": (None, 0o755),
}


def _unpack_tree(base: Path) -> tuple[str, bytes]:
    """The staging of :data:`TREE` under ``base`` the hook sends: the unpack command and the archive it reads."""
    return commands.staging(str(base), TREE, 1_700_000_000)


def test_extract_tar_places_files_and_directories_with_their_modes_and_replaces_a_link(tmp_path: Path) -> None:
    """New directories get the archive's mode, an existing one keeps its own; a link at a member's name is
    replaced, its target untouched; nothing of the private unpack directory is left."""
    base = tmp_path / "base"
    (base / "logs").mkdir(parents=True, mode=0o700)
    (base / "jobs/j").mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.write_text("theirs")
    (base / "jobs/j/.secrets.env").symlink_to(target)

    command, archive = _unpack_tree(base)
    result = run_shell("bash", command, tmp_path, stdin=archive)

    assert result.returncode == 0, result.stderr
    assert (base / "jobs/j/specs/spec.yaml").read_bytes() == b"epochs: 2\n"
    assert not (base / "jobs/j/.secrets.env").is_symlink()
    assert (base / "jobs/j/.secrets.env").stat().st_mode & 0o777 == 0o600
    assert target.read_text() == "theirs"
    assert (base / "results/j").stat().st_mode & 0o777 == 0o755
    assert (base / "logs").stat().st_mode & 0o777 == 0o700
    assert [p.name for p in base.iterdir() if p.name.startswith(".staging")] == []


def test_two_tries_staging_the_same_files_at_once_both_succeed(tmp_path: Path) -> None:
    """Forty pairs of unpacks of the same tree start together (two tries of one task racing): every unpack
    succeeds. Tar's own replace (unlink, then create) failed with "File exists" in 2 of 33 such races forced
    on the test cluster (``test_faults_concurrency.py`` forces them); here the window is rarely hit, so this
    checks the renames under concurrency rather than proving the old failure."""
    base = tmp_path / "base"
    command, archive = _unpack_tree(base)
    for _ in range(40):
        procs = [
            subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)
        ]
        errors = [proc.communicate(archive)[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], errors
    assert (base / "jobs/j/.secrets.env").read_bytes() == b"export T=s\n"


# ------------------------------------------------------------------ end markers


def test_end_markers_lists_new_markers_of_each_directory_through_a_real_shell(tmp_path: Path) -> None:
    first, second, missing = tmp_path / "ends $(touch pwned) 'x'", tmp_path / "b\nc", tmp_path / "not yet"
    for directory in (first, second):
        directory.mkdir()
    for name in ("7-0-0.end", "8-2-143.end", "junk.end", "9-0-0.endx", "1-0-x.end"):
        (first / name).touch()
    old = second / "5-0-1.end"
    old.touch()
    os.utime(old, (1000, 1000))
    (second / "6-1-0.end").touch()

    command = commands.end_markers({str(first): 0, str(second): 2000, str(missing): 0})
    for shell in ("sh", "bash"):
        done = subprocess.run([shell, "-c", command], capture_output=True, text=True, check=True, cwd=tmp_path)
        markers = commands.parse_end_markers(done.stdout, [str(first), str(second), str(missing)])
        got = sorted((m.directory, m.slurm_job_id, m.restart, m.exit_code) for m in markers)
        assert got == sorted([(str(first), "7", 0, 0), (str(first), "8", 2, 143), (str(second), "6", 1, 0)])
        assert all(m.mtime > 2000 for m in markers)
    assert not (tmp_path / "pwned").exists()


def test_remove_end_markers_removes_every_run_of_that_job_only_and_the_given_files(tmp_path: Path) -> None:
    ends = tmp_path / "ends 'q' $(x)"
    ends.mkdir()
    for name in ("12-0-1.end", "12-1-0.end", "12-2-0.end", "123-0-0.end", "1-0-0.end"):
        (ends / name).touch()
    sidecar = tmp_path / "job 'q'" / ".secrets.env"
    sidecar.parent.mkdir()
    sidecar.write_text("TOKEN=x\n")
    subprocess.run(["sh", "-c", commands.remove_end_markers(str(ends), "12", [str(sidecar)])], check=True)
    assert sorted(path.name for path in ends.iterdir()) == ["1-0-0.end", "123-0-0.end"]
    assert not sidecar.exists()
    subprocess.run(["sh", "-c", commands.remove_end_markers(str(ends), "12")], check=True)  # none left: fine
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ValidationError, match="only plain numeric ids"):
        commands.remove_end_markers(str(ends), "12_3")
    with pytest.raises(ValidationError, match="absolute"):
        commands.remove_end_markers(str(ends), "12", ["relative/.secrets.env"])


@pytest.mark.parametrize(
    ("staging", "rc", "out", "marked"),
    [("true", 0, "ran\n", False), ("(exit 3)", 3, "", True)],
    ids=["staged", "staging-failed"],
)
def test_staged_then_runs_the_command_only_after_its_staging(staging: str, rc: int, out: str, marked: bool) -> None:
    """A failed staging keeps its status and says so on stderr; the command after it never runs."""
    proc = subprocess.run(
        ["bash", "-c", commands.staged_then(staging, "echo ran")], capture_output=True, text=True, check=False
    )
    assert (proc.returncode, proc.stdout, commands.STAGING_FAILED in proc.stderr) == (rc, out, marked)


def test_staging_builds_the_archive_tarfile_would_write() -> None:
    """The archive built block by block in core is byte for byte what :mod:`tarfile` writes for the same members."""
    import io
    import tarfile

    _, archive = commands.staging("/lustre/u", TREE, 1_700_000_000)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as reference:
        for name, (content, mode) in TREE.items():
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 1_700_000_000
            if content is None:
                info.type = tarfile.DIRTYPE
                reference.addfile(info)
            else:
                info.size = len(content)
                reference.addfile(info, io.BytesIO(content))
    assert archive == buffer.getvalue()
