"""Pyxis container mounts, and whether a job can see its files through them.

``--container-mounts`` is ``SRC:DST[:FLAGS][,SRC:DST[:FLAGS]...]`` (an entry ``PATH`` alone mounts
``PATH`` at the same path): the host directory ``SRC`` is what the container sees at ``DST``. The
provider binds ``{results_dir}`` and ``{config_path}`` to host paths and uses them inside the
container as they are, so the job directory and the results directory must be shown at their own
path. Dataset paths named in the spec are read inside the container as written, so a mount must
show something there. A job that cannot see its spec or data would fail on its GPU allocation as a
"program error"; this is checked before anything is staged.

The site may mount directories into every container itself: Enroot reads the fstab-like files
``$ENROOT_SYSCONF_PATH/mounts.d/*.fstab`` (default ``/etc/enroot/mounts.d``) on the node, whose lines
read ``SRC DST TYPE OPTIONS ...`` with ``DST`` the path inside the container. The preflight reads them
on a GPU node (:func:`parse_fstab`) and caches them per cluster (:class:`SiteMounts`); the check counts
them. Enroot applies ``mounts.d`` first and Pyxis' ``--container-mounts`` after, so a job's own mount
covers whatever the site mounted at or below its destination: a path is shown by the job's own mounts
when one of them holds it, else by the site's. Pyxis' home mount is not counted: the provider's
templates always pass ``--no-container-mount-home``.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao_slurm.exceptions import ValidationError

#: The top-level key of a TAO spec whose absolute paths name the job's datasets.
DATASET_SECTION = "dataset"


@dataclass(frozen=True)
class Mount:
    """One bind mount: the host's ``source`` seen at ``destination`` in the container (both as written)."""

    source: str
    destination: str


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """Split a ``--container-mounts`` value into its mounts; the flags are dropped.

    :param text: ``SRC:DST[:FLAGS][,...]``.
    :returns: the mounts, in order.
    :raises ValidationError: for an empty value.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValidationError("container_mounts is empty; pass None for no mounts or SRC:DST[,...]")
    mounts = []
    for entry in text.split(","):
        source, colon, rest = entry.strip().partition(":")
        mounts.append(Mount(source, rest.partition(":")[0] if colon else source))
    return tuple(mounts)


#: Where Enroot reads the site's configuration when ``ENROOT_SYSCONF_PATH`` is not set.
ENROOT_SYSCONF_DEFAULT = "/etc/enroot"

_FSTAB_ESCAPE_RE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class SiteMounts:
    """The mounts Enroot adds to every container on the site's GPU nodes, as a preflight read them.

    :param mounts: the mounts, in the order Enroot applies them (destinations absolute).
    :param read_at: when the preflight read them (ISO-8601 UTC).
    :param node: the node they were read on.
    :param directory: the ``mounts.d`` directory read there.
    """

    mounts: tuple[Mount, ...]
    read_at: str
    node: str
    directory: str

    def describe(self) -> str:
        """``SRC at DST, ...`` (``"none"`` without mounts)."""
        return ", ".join(f"{mount.source} at {mount.destination}" for mount in self.mounts) or "none"

    def to_json(self) -> str:
        """Return the cache file's content (compact JSON); read it back with :meth:`from_json`."""
        return json.dumps(
            {
                "read_at": self.read_at,
                "node": self.node,
                "directory": self.directory,
                "mounts": [[mount.source, mount.destination] for mount in self.mounts],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> SiteMounts:
        """Read :meth:`to_json`'s text.

        :raises ValueError: for text that is not such a cache (the caller treats the site mounts as unknown).
        """
        data = json.loads(text)
        mounts = data["mounts"]
        fields = (data["read_at"], data["node"], data["directory"])
        pairs_ok = isinstance(mounts, list) and all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(item, str) for item in pair) for pair in mounts
        )
        if not pairs_ok or not all(isinstance(item, str) for item in fields):
            raise ValueError(f"not a site-mounts cache: {text[:200]!r}")
        return cls(tuple(Mount(source, destination) for source, destination in mounts), *fields)


def parse_fstab(lines: Iterable[str]) -> tuple[Mount, ...]:
    r"""Read the lines of Enroot ``mounts.d`` files (``SRC DST TYPE OPTIONS ...``) into the mounts they add.

    Blank lines and comments are skipped, as is a line with fewer than two fields; ``\040``-style
    escapes (fstab(5): a space, a tab) are decoded; a destination is made absolute (Enroot reads it
    under the container's root either way). Not counted: a destination holding ``$`` (Enroot expands
    environment variables at start, which the login host cannot know) and an ``x-detach`` entry
    (it removes a mount rather than adding one).

    :param lines: the files' lines, in the order Enroot reads them.
    :returns: the mounts, in order.
    """
    mounts = []
    for line in lines:
        fields = line.split()
        if len(fields) < 2 or fields[0].startswith("#"):
            continue
        source, destination = (_FSTAB_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 8)), f) for f in fields[:2])
        options = fields[3].split(",") if len(fields) > 3 else []
        if "$" in destination or "x-detach" in options:
            continue
        mounts.append(Mount(source, posixpath.normpath("/" + destination.lstrip("/"))))
    return tuple(mounts)


def _normal(path: str) -> str | None:
    """``path`` normalised, or None when it is not absolute."""
    return posixpath.normpath("/" + path.lstrip("/")) if path.startswith("/") else None


def _under(path: str, base: str) -> bool:
    return base == "/" or path == base or path.startswith(base + "/")


def _shown_at(mounts: Sequence[Mount], path: str) -> tuple[Mount, str] | None:
    """Return the mount of ``mounts`` that shows ``path`` (the deepest destination holding it; the last of equals)."""
    found: tuple[Mount, str] | None = None
    for mount in mounts:
        destination = _normal(mount.destination)
        if destination is None or not _under(path, destination):
            continue
        if found is None or len(destination) >= len(found[1]):
            found = (mount, destination)
    return found


def _shown(mounts: Sequence[Mount], site: Sequence[Mount], path: str) -> tuple[Mount, str, str] | None:
    """Return the mount the container shows at ``path``, its normal destination and whose it is (for messages).

    The job's own mounts are applied after the site's and cover them: one holding ``path`` wins.
    """
    for shown, kind in ((_shown_at(mounts, path), "the mount"), (_shown_at(site, path), "the site mount")):
        if shown is not None:
            return (*shown, kind)
    return None


def same_path_problem(mounts: Sequence[Mount], path: str, site: Sequence[Mount] = ()) -> str | None:
    """Why the container does not show the host's ``path`` at the same path (None when it does).

    :param mounts: the job's own mounts.
    :param path: a normalised absolute path.
    :param site: the site's mounts (applied first, so covered by the job's own).
    """
    shown = _shown(mounts, site, path)
    if shown is None:
        return "no mount shows it"
    mount, destination, kind = shown
    source = _normal(mount.source)
    seen = posixpath.normpath(posixpath.join(source, path[len(destination) :].lstrip("/"))) if source else None
    if seen == path:
        return None
    return f"{kind} {mount.source}:{mount.destination} shows {seen or mount.source} there instead"


def visible_problem(mounts: Sequence[Mount], path: str, site: Sequence[Mount] = ()) -> str | None:
    """Why the container shows nothing at ``path`` (None when a mount, the job's or the site's, shows one)."""
    return None if _shown(mounts, site, path) is not None else "no mount shows it"


def spec_dataset_paths(spec: Mapping[str, Any] | None) -> dict[str, str]:
    """Return the absolute paths in the spec's ``dataset`` section, by their place in the spec.

    :param spec: the (bound) spec.
    :returns: e.g. ``{"spec dataset.train": "/lustre/data/train"}``.
    """
    found: dict[str, str] = {}
    stack: list[tuple[str, Any]] = [(DATASET_SECTION, (spec or {}).get(DATASET_SECTION))]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str) and value.startswith("/"):
            found[f"spec {where}"] = value
        elif isinstance(value, Mapping):
            stack.extend((f"{where}.{key}", item) for key, item in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}[{index}]", item) for index, item in enumerate(value))
    return dict(sorted(found.items()))


def check_mounts(
    container_mounts: str | None,
    *,
    same_path: Mapping[str, str],
    visible: Mapping[str, str],
    origin: str,
    site_mounts: SiteMounts | None = None,
) -> None:
    """Refuse a job whose container cannot see its files, naming every unseen path at once.

    :param container_mounts: the ``--container-mounts`` value (None: no mounts).
    :param same_path: host paths the container must show at the same path, by what they are.
    :param visible: paths the container reads as written (datasets named in the spec), by where they are.
    :param origin: where the mounts came from, for the message (e.g. ``"connection 'slurm_default'"``).
    :param site_mounts: the site's own mounts as the last preflight cached them, counted as mounts under the
        job's own; ``None`` when no preflight cached them (the message says they were not known).
    :raises ValidationError: listing each unseen path, the mounts counted, and the mount to add.
    """
    mounts = parse_mounts(container_mounts) if container_mounts is not None else ()
    site = site_mounts.mounts if site_mounts is not None else ()
    problems: list[tuple[str, str, str]] = []
    for paths, problem_of in ((same_path, same_path_problem), (visible, visible_problem)):
        for what, path in paths.items():
            normal = _normal(path)
            problem = problem_of(mounts, normal, site) if normal is not None else None
            if normal is not None and problem is not None:
                problems.append((what, normal, problem))
    if not problems:
        return
    tops = sorted({"/" + path.split("/")[1] for _, path, _ in problems})
    fix = ",".join([*([container_mounts] if mounts and container_mounts else []), *(f"{top}:{top}" for top in tops)])
    listing = "\n".join(f"- {what} {path}: {problem}" for what, path, problem in problems)
    shown = f"container_mounts={container_mounts!r} (from {origin})" if mounts else "no container_mounts set"
    raise ValidationError(
        f"the job's container cannot see {len(problems)} of its paths with {shown} and {_site_text(site_mounts)}, "
        f"so the job would fail on its GPU allocation:\n{listing}\nAdd a mount that shows them at the same path, "
        f"e.g. container_mounts={fix!r} (on the operator, or the connection's container_mounts / "
        "SLURM_CONTAINER_MOUNTS)"
    )


def _site_text(site_mounts: SiteMounts | None) -> str:
    """Say which site mounts were counted, for :func:`check_mounts`' refusal."""
    if site_mounts is None:
        return (
            "the site's own container mounts (Enroot mounts.d) not known: no preflight has read them on this "
            "cluster (run SlurmPreflightOperator to count them)"
        )
    counted = f"the site mounts {site_mounts.describe()}" if site_mounts.mounts else "no site mounts"
    return (
        f"{counted} (site mounts read by the preflight on {site_mounts.read_at[:10]}; run SlurmPreflightOperator "
        "again after the site changes them)"
    )
