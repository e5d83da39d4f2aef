#!/usr/bin/env python3
"""The test cluster on another SLURM release: a Debian tree per release (standard library only, run as root).

Usage: ``python3 tests/cluster/releases.py COMMAND RELEASE [-- ARGV...]``, where RELEASE is one of
:data:`RELEASES` (``22.05``: Debian 12, ``24.11``: Debian 13, ``26.05``: Debian sid) and COMMAND is

- ``run RELEASE -- ARGV``: run ARGV (say ``make test``) in the checkout on that release, then stop its
  cluster. On the machine's own release ARGV runs here, as it is. On another, ARGV runs in a Debian
  tree of that release's suite: the machine as a Debian 12 or 13 machine of that release would be, with
  its own SLURM, MariaDB, OpenSSH and system Python from Debian's archive, its own cluster state, database
  and config (everything ``harness.py`` makes lives inside the tree), sharing only the kernel, the
  loopback network and this checkout (bound at the same path, with the folder around it, so ``../shared``
  is there too).
- ``prepare RELEASE``: build that release's tree and install in it what its cluster and tests need, starting and
  stopping nothing (``make test`` runs it beside the machine's own cluster tests, so the matrix later starts at
  once).
- ``up RELEASE``: bring that release's cluster up (``harness.py up`` in its tree) and leave it running.
- ``down RELEASE``: stop that release's cluster and unmount its tree.
- ``shell RELEASE``: an interactive shell in the tree, in the checkout.

The tree is built once per machine with ``debootstrap`` (``--variant=minbase``, Python, venv, make, git)
under :data:`ROOT` and reused; ``harness.py up`` inside it installs the cluster's packages as on any
Debian machine. It takes from this machine what a machine of this workplace has besides Debian: the
local CA certificates, pip's configuration and its on-disk wheels and indexes, and pyenv's Pythons
(read-only): the CPU PyTorch wheel the job venv needs is for one of those.

The cluster uses fixed loopback ports, so one cluster runs at a time ("alone"): ``run`` and ``up`` stop
the machine's own cluster and every other tree's first, and ``harness.py up`` on the machine stops any
tree's (:func:`stop_all`). The tree's cluster runs in the machine's network namespace: slurmdbd 24.11
could not listen in a private one here (``getaddrinfo((null):6819)``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent.parent
ROOT = Path("/var/lib/tao-slurm-releases")
MIRROR = "http://deb.debian.org/debian"
#: What the tree gets from debootstrap: enough to create venvs and run ``make``; the harness adds the rest.
BASE_PACKAGES = ("ca-certificates", "python3", "python3-venv", "make", "git", "procps", "iproute2")
#: Read-only binds from this machine: its pip wheels and indexes, pyenv's Pythons (when present).
MACHINE_BINDS = (Path("/opt/wheels"), Path("/opt/pypi"), Path("/opt/pypi-more"), Path("/root/.pyenv"))
#: Files copied into the tree when present: pip's configuration.
MACHINE_FILES = (Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf"), Path("/etc/xdg/pip/constraints.txt"))
LOCAL_CA = Path("/usr/local/share/ca-certificates")
#: Environment passed into the tree (everything else is the tree's own: PATH, HOME, no virtualenv).
PASSED_ENV_PREFIXES = ("PIP_", "BENCH_", "PYTEST_", "TAO_SLURM_")
PASSED_ENV = {"CI", "TERM", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}
TREE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STAMP = ".tao-slurm-tree.json"
CHECKOUT_MARK = ".tao-slurm-checkout"
#: Set in a tree's commands to its release (a tree's os-release may not name its suite: sid's says forky).
TREE_MARK_VAR = "TAO_SLURM_RELEASE_TREE"


@dataclass(frozen=True)
class Release:
    """A SLURM release and the Debian suite that ships it."""

    slurm: str
    suite: str
    #: sid's Release file comes from a dated snapshot: apt must not refuse it as expired.
    snapshot: bool = False

    @property
    def tree(self) -> Path:
        """The release's Debian tree."""
        return ROOT / self.suite


RELEASES = {
    "22.05": Release("22.05", "bookworm"),
    "24.11": Release("24.11", "trixie"),
    "26.05": Release("26.05", "sid", snapshot=True),
}


def step(message: str) -> None:
    """Print a progress line."""
    print(f"releases: {message}", flush=True)


def fail(message: str) -> NoReturn:
    """Stop with an error that names the problem."""
    print(f"releases: ERROR: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(argv: list[str], *, timeout: float = 1800, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; fail with its stderr when ``check`` and it exits non-zero."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        fail(f"`{' '.join(argv)}` exited {proc.returncode}: {(proc.stderr.strip() or proc.stdout.strip())[-2000:]}")
    return proc


def own_release() -> Release | None:
    """The release this machine runs itself: a tree's own (:data:`TREE_MARK_VAR`), else the one its Debian
    codename ships (``VERSION_CODENAME`` of os-release); None for a suite not in :data:`RELEASES`."""
    inside = os.environ.get(TREE_MARK_VAR)
    if inside:
        return release(inside)
    for line in Path("/etc/os-release").read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME":
            return next((rel for rel in RELEASES.values() if rel.suite == value.strip('"')), None)
    return None


def release(name: str) -> Release:
    """The release named ``name``, or an error listing the known ones."""
    if name not in RELEASES:
        fail(f"unknown SLURM release {name!r}: choose one of {', '.join(RELEASES)}")
    return RELEASES[name]


def mounted() -> set[str]:
    """The mount points of this mount namespace."""
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def ensure_tree(rel: Release) -> None:
    """Build the release's Debian tree once (debootstrap into a partial folder, renamed when complete)."""
    wanted = {"suite": rel.suite, "mirror": MIRROR, "packages": list(BASE_PACKAGES)}
    stamp = rel.tree / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        step(f"tree: {rel.tree} ({rel.suite}) present")
        return
    if shutil.which("debootstrap") is None:
        step("tree: installing debootstrap")
        env_run(["apt-get", "update", "-qq"])
        env_run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"])
    started = time.monotonic()
    partial = rel.tree.with_name(rel.suite + ".partial")
    unmount(partial)
    shutil.rmtree(partial, ignore_errors=True)
    unmount(rel.tree)
    shutil.rmtree(rel.tree, ignore_errors=True)
    ROOT.mkdir(parents=True, exist_ok=True)
    step(f"tree: debootstrap {rel.suite} from {MIRROR} into {partial}")
    run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", rel.suite, str(partial), MIRROR],
        timeout=1800,
    )
    if rel.snapshot:
        (partial / "etc/apt/apt.conf.d/99tao-slurm-snapshot").write_text('Acquire::Check-Valid-Until "false";\n')
    (partial / STAMP).write_text(json.dumps(wanted) + "\n")
    partial.rename(rel.tree)
    step(f"tree: {rel.suite} built in {time.monotonic() - started:.0f} s")


def env_run(argv: list[str]) -> None:
    """Run an apt command on this machine, non-interactively."""
    subprocess.run(argv, check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=1800)


def sync_machine_files(rel: Release) -> None:
    """Give the tree this machine's name resolution, local CA certificates and pip configuration."""
    tree = rel.tree
    shutil.copy2("/etc/resolv.conf", tree / "etc/resolv.conf")
    hosts = tree / "etc/hosts"
    if not hosts.exists() or "localhost" not in hosts.read_text():
        shutil.copy2("/etc/hosts", hosts)
    for source in MACHINE_FILES:
        if source.is_file():
            (tree / source.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / source.relative_to("/"))
    certificates = sorted(LOCAL_CA.glob("*.crt")) if LOCAL_CA.is_dir() else []
    target = tree / LOCAL_CA.relative_to("/")
    target.mkdir(parents=True, exist_ok=True)
    changed = False
    for certificate in certificates:
        copy = target / certificate.name
        if not copy.exists() or copy.read_bytes() != certificate.read_bytes():
            shutil.copy2(certificate, copy)
            changed = True
    if changed:
        run(["chroot", str(tree), "update-ca-certificates"])
        step(f"tree: {len(certificates)} local CA certificate(s) added")


def bind(source: Path, target: Path, *, read_only: bool = False) -> None:
    """Bind ``source`` on ``target`` (creating it) unless something is mounted there already."""
    if str(target) in mounted():
        return
    target.mkdir(parents=True, exist_ok=True)
    run(["mount", "--bind", str(source), str(target)])
    if read_only:
        run(["mount", "-o", "remount,bind,ro", str(target)])


def ensure_mounts(rel: Release) -> None:
    """Mount the tree for use: itself (``unshare`` needs its root to be a mount point), /proc, /sys, /dev,
    this checkout's folder at the same path, and the machine's read-only stores."""
    tree = rel.tree
    points = mounted()
    bind(tree, tree)
    if str(tree / "proc") not in points:
        run(["mount", "-t", "proc", "proc", str(tree / "proc")])
    for special in ("sys", "dev"):
        if str(tree / special) not in points:
            # Recursively, so slurmd finds the cgroup mounts under /sys and /dev/pts, /dev/shm are there.
            run(["mount", "--rbind", f"/{special}", str(tree / special)])
            run(["mount", "--make-rslave", str(tree / special)])
    # The folder around the checkout (../shared is there), unless that is the machine's root.
    workspace = CHECKOUT.parent if CHECKOUT.parent != Path("/") else CHECKOUT
    bind(workspace, tree / workspace.relative_to("/"))
    (tree / CHECKOUT_MARK).write_text(f"{CHECKOUT}\n")
    for source in MACHINE_BINDS:
        if source.is_dir():
            bind(source, tree / source.relative_to("/"), read_only=True)


def unmount(tree: Path) -> None:
    """Unmount everything under ``tree`` (lazily: a mount some process still holds goes when it exits)."""
    if any(point == str(tree) or point.startswith(f"{tree}/") for point in mounted()):
        run(["umount", "-R", "-l", str(tree)], check=False)


def tree_env(rel: Release) -> dict[str, str]:
    """The environment of commands in a tree: the tree's PATH and HOME, and what the run needs from here.

    ``VENV`` (the Makefile's) names the tree's own provider venv in the shared checkout: its Python is
    the tree's.
    """
    env = {"PATH": TREE_PATH, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root", "LOGNAME": "root"}
    env["VENV"] = f".venv-{rel.suite}"
    env[TREE_MARK_VAR] = rel.slurm
    for key, value in os.environ.items():
        if key in PASSED_ENV or key.startswith(PASSED_ENV_PREFIXES):
            env[key] = value
    return env


def in_tree(rel: Release, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the checkout inside the release's tree."""
    command = ["chroot", str(rel.tree), "/bin/sh", "-c", 'cd "$0" && exec "$@"', str(CHECKOUT), *argv]
    return subprocess.run(command, env=tree_env(rel), check=False, text=True)


def harness_down_here() -> None:
    """Stop this machine's own cluster (when its harness state exists)."""
    if Path("/var/lib/slurmtest").is_dir():
        step("stopping this machine's own cluster (one cluster at a time)")
        subprocess.run([sys.executable, str(HERE / "harness.py"), "down"], check=False)


def stop_tree(rel: Release) -> None:
    """Stop a tree's cluster (through the checkout its mounts carry) and unmount the tree."""
    tree = rel.tree
    if str(tree / "proc") in mounted() and (tree / "var/lib/slurmtest").is_dir():
        mark = tree / CHECKOUT_MARK
        checkout = Path(mark.read_text().strip()) if mark.is_file() else CHECKOUT
        harness = checkout / "tests/cluster/harness.py"
        if (tree / harness.relative_to("/")).is_file():
            step(f"stopping the {rel.slurm} cluster in {tree}")
            command = ["chroot", str(tree), "python3", str(harness), "down"]
            subprocess.run(command, env=tree_env(rel), check=False)
    unmount(tree)


def stop_all(*, keep: Release | None = None) -> None:
    """Stop every tree's cluster but ``keep``'s (the machine's own harness calls this before ``up``)."""
    for rel in RELEASES.values():
        if rel != keep and rel.tree.is_dir():
            stop_tree(rel)


def prepare(rel: Release) -> None:
    """Make the release's tree ready and alone: built, mounted, the other clusters stopped."""
    if os.geteuid() != 0:
        fail("run as root (debootstrap, mount, chroot)")
    harness_down_here()
    stop_all(keep=rel)
    ensure_tree(rel)
    ensure_mounts(rel)
    sync_machine_files(rel)


def prepare_beside(rel: Release) -> int:
    """Build the release's tree and install in it what its cluster and tests need (the provider's venv, the
    harness's packages), starting nothing and stopping nothing: this runs while the machine's own cluster runs
    its tests (``make test``), so that ``run`` later only starts the tree's cluster. The tree is unmounted after."""
    if os.geteuid() != 0:
        fail("run as root (debootstrap, mount, chroot)")
    started = time.monotonic()
    ensure_tree(rel)
    ensure_mounts(rel)
    try:
        sync_machine_files(rel)
        for argv in (["make", "venv"], ["python3", "tests/cluster/harness.py", "install"]):
            code = in_tree(rel, argv).returncode
            if code != 0:
                step(f"prepare: `{' '.join(argv)}` exited {code} in {rel.tree}")
                return code
    finally:
        unmount(rel.tree)
    step(f"prepare: {rel.slurm} ready in {rel.tree} in {time.monotonic() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "prepare", "up", "down", "shell"))
    parser.add_argument(
        "--not-on-host", action="store_true", help="run: do nothing when RELEASE is the machine's own release"
    )
    parser.add_argument("release", help=f"one of {', '.join(RELEASES)}")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="for run: the command, after --")
    args = parser.parse_args(argv)
    rel = release(args.release)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if rel == own_release():
        if args.command == "prepare":
            step(f"{rel.slurm} is this machine's own release: there is no tree to prepare")
            return 0
        if args.command == "run" and args.not_on_host:
            step(f"{rel.slurm} is this machine's own release: its tests ran on it already")
            return 0
        if args.command == "run":
            # Without SLURM: make's SLURM=<this release> would hand the command back here.
            env = {key: value for key, value in os.environ.items() if key != "SLURM"}
            return subprocess.run(command, check=False, env=env).returncode
        if args.command in ("up", "down"):
            return subprocess.run([sys.executable, str(HERE / "harness.py"), args.command], check=False).returncode
        fail(f"{rel.slurm} is this machine's own release: there is no tree to open a shell in")
    if args.command == "down":
        stop_tree(rel)
        return 0
    if args.command == "prepare":
        return prepare_beside(rel)
    if args.command == "run" and not command:
        fail("run: give the command after --, e.g. `releases.py run 26.05 -- make test`")
    prepare(rel)
    step(f"SLURM {rel.slurm} in {rel.tree} ({rel.suite})")
    if args.command == "shell":
        return in_tree(rel, ["bash", "-i"]).returncode
    if args.command == "up":
        return in_tree(rel, ["python3", "tests/cluster/harness.py", "up"]).returncode
    try:
        return in_tree(rel, command).returncode
    finally:
        stop_tree(rel)


if __name__ == "__main__":
    sys.exit(main())
