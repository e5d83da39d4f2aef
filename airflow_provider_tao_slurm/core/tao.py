"""Is a job a TAO action? Decided from what the job is, once, when its record is opened.

A TAO action reports its outcome in ``<results_dir>/status.json``: the job is COMPLETE only when
that file says SUCCESS, whatever the exit code. A plain container job has no such file. The record's
``network_arch`` carries the decision (``custom`` for a plain job, anything else for a TAO action), so
the sensor applies the rule from the record, also to records written before the decision was made
here and to resubmissions, which copy it.

Without an explicit ``network_arch`` a job is a TAO action when its command starts with a TAO entry
point (``classification_pyt train ...``, ``dino_tf ...``, the ``tao`` launcher) or its image is TAO's
(:func:`~airflow_provider_tao_slurm.core.images.is_tao_image`); an explicit ``network_arch="custom"``
makes any job a plain one.
"""

from __future__ import annotations

import posixpath
import re

from airflow_provider_tao_slurm.core.images import ImageRef, is_tao_image

#: ``network_arch`` of a plain container job: ``status.json`` is not required.
CUSTOM_NETWORK_ARCH = "custom"
#: ``network_arch`` recorded for a TAO action whose network is not known (a TAO image, no entry point).
TAO_NETWORK_ARCH = "tao"

_ASSIGNMENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")
_ENTRY_POINT_RE = re.compile(r"[a-z][a-z0-9_]*_(?:pyt|tf|tf1|tf2)")
_NETWORK_RE = re.compile(r"[a-z][a-z0-9_]*")
_LAUNCHER = "tao"
_LAUNCHER_GROUPS = frozenset({"model", "dataset", "deploy"})


def tao_entry_point(command: str) -> str | None:
    """Return the TAO network a command starts, if it starts with a TAO entry point.

    Leading ``NAME=value`` assignments are skipped; the first word may be a path. ``<network>_pyt``,
    ``_tf``, ``_tf1`` and ``_tf2`` entry points give themselves; the ``tao`` launcher gives the network
    it names (``tao model classification_pyt train`` or ``tao classification_pyt train``), else ``tao``.

    :param command: the shell command run in the container.
    :returns: the network (e.g. ``classification_pyt``), or None when the command is not TAO's.
    """
    words = command.split()
    while words and _ASSIGNMENT_RE.fullmatch(words[0]):
        words.pop(0)
    if not words:
        return None
    first = posixpath.basename(words[0])
    if _ENTRY_POINT_RE.fullmatch(first):
        return first
    if first != _LAUNCHER:
        return None
    rest = words[1:]
    if rest and rest[0] in _LAUNCHER_GROUPS:
        rest = rest[1:]
    return rest[0] if rest and _NETWORK_RE.fullmatch(rest[0]) else TAO_NETWORK_ARCH


def job_network_arch(network_arch: str | None, image: ImageRef, command: str) -> str:
    """Return the ``network_arch`` a job's record gets, which decides whether it is a TAO action.

    :param network_arch: what the user passed (None: not given); kept as it is when given.
    :param image: the job's image.
    :param command: the shell command run in the container.
    :returns: ``network_arch``; else the command's TAO network (:func:`tao_entry_point`); else
        :data:`TAO_NETWORK_ARCH` for a TAO image; else :data:`CUSTOM_NETWORK_ARCH`.
    """
    if network_arch is not None:
        return network_arch
    network = tao_entry_point(command)
    if network is not None:
        return network
    return TAO_NETWORK_ARCH if is_tao_image(image) else CUSTOM_NETWORK_ARCH


def is_tao_action(network_arch: str) -> bool:
    """Whether a record's ``network_arch`` says TAO action (``status.json`` SUCCESS required)."""
    return network_arch != CUSTOM_NETWORK_ARCH
