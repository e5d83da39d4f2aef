"""Pyxis container mounts, and whether a job can see its files through them.

``--container-mounts`` is ``SRC:DST[:FLAGS][,SRC:DST[:FLAGS]...]`` (an entry ``PATH`` alone mounts
``PATH`` at the same path): the host directory ``SRC`` is what the container sees at ``DST``. The
provider binds ``{results_dir}`` and ``{config_path}`` to host paths and uses them inside the
container as they are, so the job directory and the results directory must be shown at their own
path. Dataset paths named in the spec are read inside the container as written, so a mount must
show something there. A job that cannot see its spec or data would fail on its GPU allocation as a
"program error"; this is checked before anything is staged.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
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


def _normal(path: str) -> str | None:
    """``path`` normalised, or None when it is not absolute."""
    return posixpath.normpath("/" + path.lstrip("/")) if path.startswith("/") else None


def _under(path: str, base: str) -> bool:
    return base == "/" or path == base or path.startswith(base + "/")


def _shown_at(mounts: Sequence[Mount], path: str) -> tuple[Mount, str] | None:
    """Return the mount the container shows at ``path`` (the deepest destination holding it; the last of equals)."""
    found: tuple[Mount, str] | None = None
    for mount in mounts:
        destination = _normal(mount.destination)
        if destination is None or not _under(path, destination):
            continue
        if found is None or len(destination) >= len(found[1]):
            found = (mount, destination)
    return found


def same_path_problem(mounts: Sequence[Mount], path: str) -> str | None:
    """Why the container does not show the host's ``path`` at the same path (None when it does)."""
    shown = _shown_at(mounts, path)
    if shown is None:
        return "no mount shows it"
    mount, destination = shown
    source = _normal(mount.source)
    seen = posixpath.normpath(posixpath.join(source, path[len(destination) :].lstrip("/"))) if source else None
    if seen == path:
        return None
    return f"the mount {mount.source}:{mount.destination} shows {seen or mount.source} there instead"


def visible_problem(mounts: Sequence[Mount], path: str) -> str | None:
    """Why the container shows nothing at ``path`` (None when a mount shows something there)."""
    return None if _shown_at(mounts, path) is not None else "no mount shows it"


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
) -> None:
    """Refuse a job whose container cannot see its files, naming every unseen path at once.

    :param container_mounts: the ``--container-mounts`` value (None: no mounts).
    :param same_path: host paths the container must show at the same path, by what they are.
    :param visible: paths the container reads as written (datasets named in the spec), by where they are.
    :param origin: where the mounts came from, for the message (e.g. ``"connection 'slurm_default'"``).
    :raises ValidationError: listing each unseen path, the mounts, and the mount to add.
    """
    mounts = parse_mounts(container_mounts) if container_mounts is not None else ()
    problems: list[tuple[str, str, str]] = []
    for paths, problem_of in ((same_path, same_path_problem), (visible, visible_problem)):
        for what, path in paths.items():
            normal = _normal(path)
            problem = problem_of(mounts, normal) if normal is not None else None
            if normal is not None and problem is not None:
                problems.append((what, normal, problem))
    if not problems:
        return
    tops = sorted({"/" + path.split("/")[1] for _, path, _ in problems})
    fix = ",".join([*([container_mounts] if mounts and container_mounts else []), *(f"{top}:{top}" for top in tops)])
    listing = "\n".join(f"- {what} {path}: {problem}" for what, path, problem in problems)
    shown = f"container_mounts={container_mounts!r} (from {origin})" if mounts else "no container_mounts set"
    raise ValidationError(
        f"the job's container cannot see {len(problems)} of its paths with {shown}, so the job would fail on its "
        f"GPU allocation:\n{listing}\nAdd a mount that shows them at the same path, e.g. container_mounts={fix!r} "
        "(on the operator, or the connection's container_mounts / SLURM_CONTAINER_MOUNTS)"
    )
