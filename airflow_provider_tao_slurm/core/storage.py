"""Cluster storage paths: turn user-given dataset and results locations into safe absolute paths.

Data must already be on shared storage (Lustre) that every login and compute node sees, so only
these forms are accepted:

- ``lustre:///abs/path`` (three slashes: the URI has no host);
- ``slurm:///abs/path`` or ``slurm://host/abs/path``: the host is informational only (every login
  host of a cluster sees the same shared storage) and is dropped;
- a plain absolute path ``/abs/path``.

The result is always a normalised absolute path (repeated ``/`` and ``.`` segments removed, no
trailing ``/``). Path segments may only hold ASCII letters, digits and ``. _ - + @ =``, so a
resolved path is safe in a shell word, a YAML spec and a Pyxis ``--container-mounts`` list.
``..`` segments, ``~``, percent-encoding, query strings, fragments, control characters and any
other scheme (``file://``, ``s3://``, ``http://``...) are refused.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from airflow_provider_tao_slurm.core.mounts import parse_mounts, same_path_problem, spec_dataset_paths
from airflow_provider_tao_slurm.exceptions import MissingPathsError, StoragePathError

MAX_PATH_CHARS = 4096
"""Longest accepted path (Linux ``PATH_MAX``)."""

_SHOWN_CHARS = 200
_BAD_SEGMENT_CHAR_RE = re.compile(r"[^A-Za-z0-9._+@=-]")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
_HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_EXAMPLE = "e.g. lustre:///lustre/datasets/coco or /lustre/datasets/coco"


def display_value(value: object, limit: int = _SHOWN_CHARS) -> str:
    """Return ``value`` as a printable, quoted, length-limited text for an error message.

    Non-ASCII and control characters are escaped (``ascii()``), so a hostile value cannot break a
    log line. Only use it for values that are not secrets (paths, names, image references).

    :param value: any value.
    :param limit: at most this many characters of the escaped text are kept.
    :returns: e.g. ``'/data/x'`` or ``'aaaa...' (5000 chars)``.
    """
    shown = ascii(value)
    if len(shown) <= limit:
        return shown
    size = f" ({len(value)} chars)" if isinstance(value, str) else ""
    return f"{shown[:limit]}...{size}"


def _fail(param: str, value: object, problem: str, fix: str) -> StoragePathError:
    return StoragePathError(f"{param}={display_value(value)} {problem}; {fix}")


def _check_segments(param: str, value: str, segments: Sequence[str]) -> None:
    """Refuse ``..`` and any segment character outside the safe set."""
    if ".." in segments:
        raise _fail(
            param,
            value,
            "contains a '..' segment, which could leave the intended directory",
            "remove the '..' segments and give the real absolute path",
        )
    for segment in segments:
        bad = _BAD_SEGMENT_CHAR_RE.search(segment)
        if bad:
            raise _fail(
                param,
                value,
                f"contains {bad.group()!a}, which is not allowed in a cluster path",
                "use only letters, digits and . _ - + @ = in directory and file names "
                "(rename the directory or point to a symlink)",
            )


def resolve_cluster_path(value: str, *, param: str = "path") -> str:
    """Resolve a storage location to a normalised absolute path on the cluster.

    :param value: ``lustre:///abs/path``, ``slurm:///abs/path``, ``slurm://host/abs/path`` or
        ``/abs/path``.
    :param param: the parameter name used in error messages.
    :returns: the absolute path, e.g. ``/lustre/datasets/coco``.
    :raises StoragePathError: naming ``param``, the (truncated) value and the fix.
    """
    if not isinstance(value, str):
        raise _fail(param, value, f"is a {type(value).__name__}, not a path", f"give a string, {_EXAMPLE}")
    if not value.strip():
        raise _fail(param, value, "is empty", f"give the dataset or results location, {_EXAMPLE}")
    if len(value) > MAX_PATH_CHARS:
        raise _fail(param, value, f"is longer than {MAX_PATH_CHARS} characters", "give a shorter path")
    if value != value.strip():
        raise _fail(param, value, "has leading or trailing whitespace", "remove it")
    if _CONTROL_RE.search(value):
        raise _fail(param, value, "contains a control character (newline, tab, NUL...)", "remove it")
    if value.startswith("~"):
        raise _fail(param, value, "starts with '~', which is not expanded", f"give the absolute path, {_EXAMPLE}")
    if "?" in value or "#" in value:
        raise _fail(param, value, "contains a query string or fragment ('?' or '#')", "give a plain path without them")
    if "%" in value:
        raise _fail(param, value, "contains '%': percent-encoding is not supported", "write the path literally")
    path = _strip_scheme(param, value)
    if not path.startswith("/"):
        raise _fail(
            param,
            value,
            "is a relative path",
            f"give an absolute path on shared storage, {_EXAMPLE}",
        )
    segments = [segment for segment in path.split("/") if segment not in ("", ".")]
    _check_segments(param, value, segments)
    if not segments:
        raise _fail(param, value, "is the root directory", f"give the dataset or results directory, {_EXAMPLE}")
    return "/" + "/".join(segments)


def _strip_scheme(param: str, value: str) -> str:
    """Return the path part of a ``lustre://`` or ``slurm://`` URI, or ``value`` if it has no scheme."""
    match = _SCHEME_RE.fullmatch(value)
    if match is None:
        return value
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        raise _fail(
            param,
            value,
            "is a file:// URI: datasets must already be on shared storage",
            "copy the data to Lustre and pass lustre:///path/on/lustre",
        )
    if scheme == "lustre":
        if not rest.startswith("/"):
            raise _fail(
                param,
                value,
                "has a host part, but lustre URIs have none",
                "write lustre:///abs/path (three slashes)",
            )
        return rest
    if scheme == "slurm":
        if rest.startswith("/"):
            return rest
        host, slash, tail = rest.partition("/")
        if not _HOST_RE.fullmatch(host):
            raise _fail(
                param,
                value,
                f"has an invalid host {display_value(host)}",
                "write slurm:///abs/path or slurm://login-host/abs/path",
            )
        if not slash:
            raise _fail(param, value, "has no path after the host", "write slurm://login-host/abs/path")
        return "/" + tail
    raise _fail(
        param,
        value,
        f"uses the unsupported scheme {scheme}://",
        "copy the data to shared storage first and pass lustre:///abs/path, slurm:///abs/path or an absolute path",
    )


def resolve_paths(paths: Mapping[str, str] | Sequence[str], *, param: str = "paths") -> dict[str, str] | list[str]:
    """Resolve every path of a list or dict, keeping its shape, and report all bad entries at once.

    :param paths: a dict (keys kept) or a list of locations accepted by :func:`resolve_cluster_path`.
    :param param: the parameter name used in error messages (entries read ``paths[0]``,
        ``paths['train']``).
    :returns: a dict with the same keys, or a list in the same order, of absolute paths.
    :raises StoragePathError: one error listing every invalid entry; also for an empty collection,
        a lone string or another type.
    """
    if isinstance(paths, str | bytes):
        raise _fail(
            param, paths, "is a single string, not a list or dict", f"wrap it in a list: [{display_value(paths)}]"
        )
    entries: list[tuple[str, object, str]]
    if isinstance(paths, Mapping):
        entries = [(f"{param}[{display_value(key)}]", key, value) for key, value in paths.items()]
    elif isinstance(paths, Sequence):
        entries = [(f"{param}[{index}]", index, value) for index, value in enumerate(paths)]
    else:
        raise _fail(param, paths, f"is a {type(paths).__name__}", "give a list or a dict of paths")
    if not entries:
        raise _fail(param, paths, "is empty", f"give at least one path, {_EXAMPLE}")
    resolved: list[str] = []
    errors: list[str] = []
    for label, key, value in entries:
        if isinstance(paths, Mapping) and not isinstance(key, str):
            errors.append(str(_fail(label, key, "has a key that is not a string", "use names as keys")))
            continue
        try:
            resolved.append(resolve_cluster_path(value, param=label))
        except StoragePathError as exc:
            errors.append(str(exc))
    if errors:
        listing = "\n".join(f"- {error}" for error in errors)
        raise StoragePathError(f"{len(errors)} of {len(entries)} entries of {param} are invalid:\n{listing}")
    if isinstance(paths, Mapping):
        return dict(zip(paths.keys(), resolved, strict=True))
    return resolved


def join_under(base: str, *parts: str, param: str = "base") -> str:
    """Join ``parts`` below ``base`` so that the result can never leave ``base``.

    :param base: a normalised absolute path (as returned by :func:`resolve_cluster_path`).
    :param parts: relative names, e.g. a job id or ``"specs/spec.yaml"``; every ``/``-separated
        segment must be non-empty, not ``.`` or ``..`` and use only safe characters.
    :param param: the name of ``base`` in error messages.
    :returns: ``base/part1/part2...`` (``base`` itself when no part is given).
    :raises StoragePathError: if ``base`` is not normalised or absolute, or a part is unsafe.
    """
    resolved = resolve_cluster_path(base, param=param)
    if resolved != base:
        raise _fail(param, base, "is not a normalised absolute path", f"use {resolved!r}")
    segments: list[str] = []
    for part in parts:
        if not isinstance(part, str) or not part:
            raise _fail("part", part, "is not a non-empty string", f"give a relative name to put under {base}")
        if part.startswith("/"):
            raise _fail("part", part, "is absolute and would replace the base", f"give a name relative to {base}")
        pieces = part.split("/")
        if "" in pieces or "." in pieces:
            raise _fail("part", part, "has an empty or '.' segment", "give a name like 'specs/spec.yaml'")
        _check_segments("part", part, pieces)
        segments.extend(pieces)
    return "/".join([base, *segments])


def spec_dataset_checks(
    spec: Mapping[str, Any] | None, container_mounts: str | None, *, own: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """Return the spec's dataset paths the login host can check, labelled with their place in the spec.

    A path is checked as written when the job's mounts show the host's path there (``/lustre:/lustre``);
    one the container reads elsewhere than the host (``/lustre/datasets:/data``) or through the site's
    own mounts is left to the job, as is one under a directory of ``own`` (the job's own directories,
    created when it is staged).

    :param spec: the (bound) spec.
    :param container_mounts: the job's ``--container-mounts`` (None: none).
    :param own: host directories the job's staging creates.
    :returns: ``(label, path)`` pairs (``("spec dataset.train", "/lustre/data/train")``), in the spec's order.
    """
    mounts = parse_mounts(container_mounts) if container_mounts is not None else ()
    mine = [posixpath.normpath(directory) for directory in own]
    checks = []
    for where, path in spec_dataset_paths(spec).items():
        normal = posixpath.normpath("/" + path.lstrip("/"))
        inside = any(normal == directory or normal.startswith(directory + "/") for directory in mine)
        if not inside and same_path_problem(mounts, normal) is None:
            checks.append((where, normal))
    return checks


def missing_paths_error(
    labelled: Sequence[tuple[str, str]], missing: Collection[str], cluster: str, *, outcome: str = "", fix: str
) -> MissingPathsError:
    """Return the error naming every missing dataset path at once, and the fix.

    :param labelled: ``(label, path)`` pairs as checked, in order (a path may carry several labels).
    :param missing: the paths the check found missing.
    :param cluster: the cluster's name.
    :param outcome: what the refusal spared, appended to the first line (e.g. ``", so nothing was submitted"``).
    :param fix: what to correct besides copying the data (e.g. ``"correct the paths"``).
    """
    shown = [(label, path) for label, path in labelled if path in missing]
    paths = list(dict.fromkeys(path for _, path in shown))
    listing = "\n".join(f"- {label} = {path}" for label, path in shown)
    return MissingPathsError(
        f"{len(paths)} dataset path(s) do not exist on cluster {cluster!r} (checked from the login host){outcome}:\n"
        f"{listing}\nCopy the data to shared storage (Lustre) first, or {fix}.",
        missing=paths,
    )
