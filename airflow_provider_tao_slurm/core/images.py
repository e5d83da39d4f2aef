"""Container image references, ``.sqsh`` cache naming and the conversion cache policy.

GPU jobs only ever run from a squashfs file on shared storage; registry images are converted once
with ``enroot import`` on a CPU partition. Accepted references:

- ``/abs/path/image.sqsh``: an already converted image;
- ``registry#repo/name:tag`` and ``docker://registry#repo/name:tag`` (the Enroot/Pyxis form);
- ``registry/repo/name:tag``: the first component is a registry when it holds a ``.`` or a ``:``
  or is ``localhost`` (Docker's rule); it is turned into the ``#`` form, because Pyxis reads
  ``nvcr.io/nvidia/x`` as a Docker Hub repository (``NVIDIA/pyxis#39``);
- ``name:tag`` or ``name``: Docker Hub (``docker.io``, ``index.docker.io`` and
  ``registry-1.docker.io`` are treated as Docker Hub too);
- any of these with a ``@sha256:<64 hex>`` digest (Enroot's own ``:sha256:<hex>`` form is read too).

A missing tag (without a digest) means ``latest``. Credentials never go into a reference: they
belong in Enroot's credentials file.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Literal

from airflow_provider_tao_slurm.core.storage import display_value, join_under, resolve_cluster_path
from airflow_provider_tao_slurm.exceptions import ImageReferenceError, StoragePathError

SQSH_MAGIC = b"hsqs"
"""First four bytes of a squashfs image."""
MIN_SQSH_BYTES = 4096
"""Smallest plausible image: mksquashfs pads its output to a multiple of 4 KiB."""
SQSH_HEADER_BYTES = 48
"""Read this many leading bytes for :func:`check_sqsh_header` (magic up to ``bytes_used``)."""
MAX_IMAGE_REF_CHARS = 512
MAX_CACHE_NAME_CHARS = 255
DOCKER_HUB_HOST = "registry-1.docker.io"
"""The host Enroot contacts for Docker Hub images."""

_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", DOCKER_HUB_HOST})
_EXAMPLE = "e.g. nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt or /lustre/containers/tao.sqsh"
_BAD_CHAR_RE = re.compile(r"[^A-Za-z0-9._/:#@+-]")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_REGISTRY_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*(?::[0-9]{1,5})?")
_COMPONENT_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_SHORT_DIGEST_HEX = 16
_WORD_RE = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference; build it with :func:`parse_image`.

    A ``sqsh`` image has only ``path``; a ``registry`` image has ``repository`` and a ``tag``
    and/or a ``digest`` (``registry`` is ``None`` for Docker Hub).
    """

    kind: Literal["sqsh", "registry"]
    raw: str
    path: str | None = None
    registry: str | None = None
    repository: str | None = None
    tag: str | None = None
    digest: str | None = None

    @property
    def pyxis_image(self) -> str:
        """The value for ``--container-image``: the path, or ``[REGISTRY#]repo:tag``.

        A digest wins over a tag and is written ``repo:sha256:<hex>`` (what Enroot understands).
        In an ``#SBATCH`` line the ``#`` must be escaped by the template.
        """
        if self.path is not None:
            return self.path
        prefix = f"{self.registry}#" if self.registry else ""
        return f"{prefix}{self.repository}:{self.digest or self.tag}"

    @property
    def enroot_uri(self) -> str:
        """The ``enroot import`` source: ``docker://[REGISTRY#]repo:tag``.

        :raises ImageReferenceError: for a ``.sqsh`` image, which needs no import.
        """
        if self.path is not None:
            raise ImageReferenceError(
                f"image {display_value(self.raw)} is already a .sqsh file and has no registry URI; "
                "give the path to --container-image as it is"
            )
        return f"docker://{self.pyxis_image}"

    @property
    def is_latest(self) -> bool:
        """True for a registry image tagged ``latest`` (or untagged) and not pinned by a digest."""
        return self.kind == "registry" and self.digest is None and self.tag == "latest"


def _fail(ref: object, problem: str, fix: str = _EXAMPLE) -> ImageReferenceError:
    return ImageReferenceError(f"image={display_value(ref)} {problem}; {fix}")


def parse_image(ref: str) -> ImageRef:
    """Parse and validate an image reference.

    :param ref: a ``.sqsh`` path or a registry reference (see the module docstring).
    :returns: the :class:`ImageRef`; the registry is lower-cased, a missing tag becomes ``latest``.
    :raises ImageReferenceError: saying what is wrong, with an example of a valid form.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise _fail(ref, "is empty or not a string", f"give an image, {_EXAMPLE}")
    if len(ref) > MAX_IMAGE_REF_CHARS:
        raise _fail(ref, f"is longer than {MAX_IMAGE_REF_CHARS} characters")
    bad = _BAD_CHAR_RE.search(ref)
    if bad:
        raise _fail(
            ref,
            f"contains {bad.group()!a}, which is not allowed in an image reference "
            "(only letters, digits and . _ - + / : # @)",
        )
    if ref.startswith("-"):
        raise _fail(ref, "starts with '-' and would be read as a command option")
    body = ref
    scheme = _SCHEME_RE.match(ref)
    if scheme:
        name = scheme.group(1).lower()
        if name == "file":
            raise _fail(ref, "is a file:// URI", "give the absolute .sqsh path, e.g. /lustre/containers/tao.sqsh")
        if name in ("http", "https"):
            raise _fail(ref, "is a web URL, not an image reference")
        if name != "docker":
            raise _fail(ref, f"uses the unsupported scheme {name}://")
        body = ref[scheme.end() :]
    if body.startswith(("/", ".")) or body.endswith(".sqsh"):
        if scheme:
            raise _fail(
                ref, "names a file after docker://", "give a registry image after docker://, or the .sqsh path alone"
            )
        return ImageRef(kind="sqsh", raw=ref, path=_sqsh_path(ref))
    return _parse_registry(ref, body)


def _sqsh_path(ref: str) -> str:
    """Validate an absolute ``.sqsh`` path and return it normalised."""
    if not ref.startswith("/"):
        raise _fail(
            ref, "is a relative path", "give the absolute .sqsh path on shared storage, e.g. /lustre/containers/x.sqsh"
        )
    if not ref.endswith(".sqsh"):
        raise _fail(
            ref,
            "is a path but not a .sqsh file",
            "give a squashfs image ending in .sqsh, or a registry image to convert (nvcr.io#nvidia/x:tag)",
        )
    try:
        return resolve_cluster_path(ref, param="image")
    except StoragePathError as exc:
        raise ImageReferenceError(str(exc)) from None


def _parse_registry(ref: str, body: str) -> ImageRef:
    """Split ``[registry#]repo[:tag][@digest]`` (or ``registry/repo...``) and validate each part."""
    registry: str | None
    if "#" in body:
        registry, _, rest = body.partition("#")
    else:
        first, slash, remainder = body.partition("/")
        is_registry = slash and ("." in first or ":" in first or first.lower() == "localhost")
        registry, rest = (first, remainder) if is_registry else (None, body)
    if registry is not None:
        if "@" in registry:
            raise _fail(
                ref,
                "holds a user name or credentials",
                "remove them; registry credentials belong in ~/.config/enroot/.credentials",
            )
        registry = registry.lower()
        if not _REGISTRY_RE.fullmatch(registry):
            raise _fail(ref, f"has an invalid registry host {display_value(registry)}")
        if registry in _DOCKER_HUB_ALIASES:
            registry = None
    if "#" in rest:
        raise _fail(ref, "has more than one '#'", "write one '#' between the registry and the image")
    name, at, digest_text = rest.partition("@")
    repository, colon, tag_text = name.partition(":")
    digest = digest_text if at else None
    tag: str | None = tag_text if colon else None
    if tag is not None and _DIGEST_RE.fullmatch(tag) and digest is None:
        digest, tag = tag, None
    if digest is not None and not _DIGEST_RE.fullmatch(digest):
        raise _fail(
            ref, f"has an invalid digest {display_value(digest)}", "write @sha256: and 64 lower-case hex digits"
        )
    if tag is not None and not _TAG_RE.fullmatch(tag):
        raise _fail(
            ref,
            f"has an invalid tag {display_value(tag)}",
            "a tag is up to 128 letters, digits, '_', '.' and '-', e.g. :5.5.0-pyt",
        )
    _check_repository(ref, repository)
    return ImageRef(
        kind="registry",
        raw=ref,
        registry=registry,
        repository=repository,
        tag="latest" if tag is None and digest is None else tag,
        digest=digest,
    )


def _check_repository(ref: str, repository: str) -> None:
    if not repository:
        raise _fail(ref, "has no image name")
    for component in repository.split("/"):
        if component in ("", ".", ".."):
            raise _fail(ref, f"has an empty, '.' or '..' component in {display_value(repository)}")
        if component != component.lower():
            raise _fail(
                ref,
                "has upper-case letters in the repository (Docker allows only lower case)",
                f"write {display_value(repository.lower())}",
            )
        if not _COMPONENT_RE.fullmatch(component):
            raise _fail(
                ref,
                f"has an invalid repository component {display_value(component)}",
                "use lower-case letters and digits joined by '.', '_', '__' or '-', e.g. nvidia/tao/tao-toolkit",
            )


def sqsh_cache_name(image: ImageRef) -> str:
    """Return a deterministic, safe file name for the converted image, in the style of Enroot's.

    ``nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt`` gives ``nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh``.
    Docker Hub images are named ``docker.io+library+ubuntu+22.04.sqsh`` whatever alias was used; a
    registry port is written ``host_5000``; a digest adds ``++sha256-<first 16 hex>``. Different
    images never share a name (``+`` appears in no component, ``++`` only before a digest).

    :param image: a registry image.
    :returns: a name of ``[A-Za-z0-9._+-]`` characters ending in ``.sqsh``.
    :raises ImageReferenceError: for a ``.sqsh`` image, or a name over 255 characters.
    """
    if image.kind != "registry" or image.repository is None:
        raise ImageReferenceError(
            f"image {display_value(image.raw)} is already a .sqsh file; use its path, there is nothing to cache"
        )
    repository = image.repository
    if image.registry is None and "/" not in repository:
        repository = f"library/{repository}"
    parts = [(image.registry or "docker.io").replace(":", "_"), *repository.split("/")]
    if image.tag:
        parts.append(image.tag)
    name = "+".join(parts)
    if image.digest:
        name += "++" + image.digest.replace(":", "-")[: len("sha256-") + _SHORT_DIGEST_HEX]
    name += ".sqsh"
    if len(name) > MAX_CACHE_NAME_CHARS:
        raise ImageReferenceError(
            f"image {display_value(image.raw)} gives a cache file name of {len(name)} characters, over the "
            f"{MAX_CACHE_NAME_CHARS} a file system allows; pass sqsh_path explicitly"
        )
    return name


def sqsh_cache_path(image: ImageRef, containers_dir: str) -> str:
    """Return the cache file of ``image`` inside ``containers_dir``.

    :param image: a registry image.
    :param containers_dir: a normalised absolute directory on shared storage.
    :returns: ``<containers_dir>/<sqsh_cache_name(image)>``.
    :raises ImageReferenceError: see :func:`sqsh_cache_name`.
    :raises StoragePathError: if ``containers_dir`` is not a normalised absolute path.
    """
    return join_under(containers_dir, sqsh_cache_name(image), param="containers_dir")


def registry_host(image: ImageRef) -> str | None:
    """Return the host name a credentials line must name (``machine <host> ...``) to pull ``image``.

    The port is dropped, as Enroot does when it looks up credentials. Docker Hub images give
    :data:`DOCKER_HUB_HOST`. NGC also needs a line for its authentication host, which this
    function does not know about.

    :param image: any image.
    :returns: the host, or ``None`` for a ``.sqsh`` image (nothing is pulled).
    """
    if image.kind != "registry":
        return None
    return (image.registry or DOCKER_HUB_HOST).split(":")[0]


def is_tao_image(image: ImageRef) -> bool:
    """Whether ``image`` is an NVIDIA TAO image: its name has the word ``tao``.

    The name is the repository of a registry image (``nvidia/tao/tao-toolkit``) or the file name of a
    ``.sqsh`` (its cache name ``nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh``, or ``tao.sqsh``); words
    are split at anything but letters and digits, so ``potato.sqsh`` is not one.

    :param image: a parsed image.
    :returns: True for a TAO image.
    """
    name = image.repository if image.repository is not None else posixpath.basename(image.path or "")
    return "tao" in _WORD_RE.findall(name.removesuffix(".sqsh").lower())


def check_sqsh_header(first_bytes: bytes, size: int) -> str | None:
    """Check that a file looks like a complete squashfs image.

    A killed ``enroot import`` leaves a file that ``test -e`` accepts; this catches it.

    :param first_bytes: the file's first bytes, ideally :data:`SQSH_HEADER_BYTES` of them (with
        fewer, the superblock's ``bytes_used`` cannot be compared with ``size``).
    :param size: the file size in bytes.
    :returns: a description of the problem and the fix, or ``None`` if the file looks valid.
    """
    redo = "delete it and convert the image again"
    if size < MIN_SQSH_BYTES:
        return f"the file has {size} bytes, fewer than the smallest squashfs image ({MIN_SQSH_BYTES}); {redo}"
    if first_bytes[: len(SQSH_MAGIC)] != SQSH_MAGIC:
        return (
            f"the file starts with {first_bytes[: len(SQSH_MAGIC)]!r}, not the squashfs magic {SQSH_MAGIC!r}, "
            f"so it is not a squashfs image (or its conversion was interrupted); {redo}"
        )
    if len(first_bytes) >= SQSH_HEADER_BYTES:
        bytes_used = int.from_bytes(first_bytes[40:48], "little")
        if bytes_used > size:
            return f"the squashfs header says {bytes_used} bytes but the file has only {size}: it is truncated; {redo}"
    return None


def needs_conversion(image: ImageRef, existing_valid: bool, force_reconvert_latest: bool) -> bool:
    """Apply the cache policy: tell whether ``image`` should be converted to ``.sqsh`` now.

    :param image: the requested image; a ``.sqsh`` image is never converted (the caller checks it).
    :param existing_valid: a valid ``.sqsh`` already exists at the cache path.
    :param force_reconvert_latest: convert a ``:latest`` image again even if a valid file exists.
    :returns: ``True`` if there is no valid file, or the image is ``:latest`` and a reconversion
        is forced; ``False`` otherwise (an existing valid file is reused).
    """
    if image.kind != "registry":
        return False
    return not existing_valid or (force_reconvert_latest and image.is_latest)
