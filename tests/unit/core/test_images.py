"""Image references: accepted forms, hostile input, Pyxis/Enroot forms, cache names and policy."""

from __future__ import annotations

import re

import pytest

from airflow_provider_tao_slurm.core.images import (
    MIN_SQSH_BYTES,
    SQSH_HEADER_BYTES,
    SQSH_MAGIC,
    ImageRef,
    check_sqsh_header,
    needs_conversion,
    parse_image,
    registry_host,
    sqsh_cache_name,
    sqsh_cache_path,
)
from airflow_provider_tao_slurm.exceptions import ImageReferenceError, StoragePathError, ValidationError

DIGEST = "sha256:" + "0123456789abcdef" * 4
TAO = "nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt"


def _registry(raw: str, registry: str | None, repository: str, tag: str | None, digest: str | None = None) -> ImageRef:
    return ImageRef(kind="registry", raw=raw, registry=registry, repository=repository, tag=tag, digest=digest)


ACCEPTED = [
    pytest.param(
        "/lustre/containers/tao.sqsh",
        ImageRef(kind="sqsh", raw="/lustre/containers/tao.sqsh", path="/lustre/containers/tao.sqsh"),
        id="sqsh-path",
    ),
    pytest.param(
        "/lustre//containers/./tao.sqsh",
        ImageRef(kind="sqsh", raw="/lustre//containers/./tao.sqsh", path="/lustre/containers/tao.sqsh"),
        id="sqsh-path-normalised",
    ),
    pytest.param(
        "/lustre/c/nvcr.io+nvidia+tao+5.5.sqsh",
        ImageRef(
            kind="sqsh",
            raw="/lustre/c/nvcr.io+nvidia+tao+5.5.sqsh",
            path="/lustre/c/nvcr.io+nvidia+tao+5.5.sqsh",
        ),
        id="sqsh-cache-name-path",
    ),
    pytest.param(TAO, _registry(TAO, "nvcr.io", "nvidia/tao/tao-toolkit", "5.5.0-pyt"), id="hash-form"),
    pytest.param(
        f"docker://{TAO}",
        _registry(f"docker://{TAO}", "nvcr.io", "nvidia/tao/tao-toolkit", "5.5.0-pyt"),
        id="docker-uri",
    ),
    pytest.param(
        "DOCKER://ubuntu", _registry("DOCKER://ubuntu", None, "ubuntu", "latest"), id="docker-uri-upper-scheme"
    ),
    pytest.param(
        "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt",
        _registry("nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", "nvcr.io", "nvidia/tao/tao-toolkit", "5.5.0-pyt"),
        id="slash-form-registry",
    ),
    pytest.param("NVCR.IO/x:1", _registry("NVCR.IO/x:1", "nvcr.io", "x", "1"), id="registry-lowered"),
    pytest.param("localhost/app:1", _registry("localhost/app:1", "localhost", "app", "1"), id="localhost"),
    pytest.param(
        "localhost:5000/app", _registry("localhost:5000/app", "localhost:5000", "app", "latest"), id="registry-port"
    ),
    pytest.param(
        "registry.example.com:5000#team/app:v1",
        _registry("registry.example.com:5000#team/app:v1", "registry.example.com:5000", "team/app", "v1"),
        id="hash-form-port",
    ),
    pytest.param("ubuntu", _registry("ubuntu", None, "ubuntu", "latest"), id="hub-no-tag"),
    pytest.param("ubuntu:22.04", _registry("ubuntu:22.04", None, "ubuntu", "22.04"), id="hub-tag"),
    pytest.param(
        "nvidia/cuda:12.4.1-devel-ubuntu22.04",
        _registry("nvidia/cuda:12.4.1-devel-ubuntu22.04", None, "nvidia/cuda", "12.4.1-devel-ubuntu22.04"),
        id="hub-namespace",
    ),
    pytest.param(
        "docker.io/library/ubuntu:22.04",
        _registry("docker.io/library/ubuntu:22.04", None, "library/ubuntu", "22.04"),
        id="hub-alias-docker-io",
    ),
    pytest.param(
        "registry-1.docker.io#library/ubuntu",
        _registry("registry-1.docker.io#library/ubuntu", None, "library/ubuntu", "latest"),
        id="hub-alias-registry-1",
    ),
    pytest.param(f"ubuntu@{DIGEST}", _registry(f"ubuntu@{DIGEST}", None, "ubuntu", None, DIGEST), id="digest-only"),
    pytest.param(
        f"nvcr.io#nvidia/x:1.0@{DIGEST}",
        _registry(f"nvcr.io#nvidia/x:1.0@{DIGEST}", "nvcr.io", "nvidia/x", "1.0", DIGEST),
        id="tag-and-digest",
    ),
    pytest.param(
        f"nvcr.io#nvidia/x:{DIGEST}",
        _registry(f"nvcr.io#nvidia/x:{DIGEST}", "nvcr.io", "nvidia/x", None, DIGEST),
        id="enroot-digest-form",
    ),
    pytest.param(
        "a__b/c.d-e_f--g:T_a.g-1",
        _registry("a__b/c.d-e_f--g:T_a.g-1", None, "a__b/c.d-e_f--g", "T_a.g-1"),
        id="repository-separators",
    ),
]


@pytest.mark.parametrize(("ref", "expected"), ACCEPTED)
def test_parse_image_accepts(ref: str, expected: ImageRef) -> None:
    assert parse_image(ref) == expected


PYXIS_FORMS = [
    pytest.param(TAO, TAO, False, id="hash-form"),
    pytest.param("nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", TAO, False, id="slash-form-converted"),
    pytest.param("ubuntu", "ubuntu:latest", True, id="hub-implicit-latest"),
    pytest.param("ubuntu:latest", "ubuntu:latest", True, id="hub-explicit-latest"),
    pytest.param("localhost:5000/app:1", "localhost:5000#app:1", False, id="port"),
    pytest.param(f"nvcr.io#x:latest@{DIGEST}", f"nvcr.io#x:{DIGEST}", False, id="digest-pins-latest"),
    pytest.param(f"x@{DIGEST}", f"x:{DIGEST}", False, id="digest-only"),
]


@pytest.mark.parametrize(("ref", "pyxis", "latest"), PYXIS_FORMS)
def test_pyxis_and_enroot_forms(ref: str, pyxis: str, latest: bool) -> None:
    image = parse_image(ref)
    assert image.pyxis_image == pyxis
    assert image.enroot_uri == f"docker://{pyxis}"
    assert image.is_latest is latest


def test_sqsh_image_forms() -> None:
    image = parse_image("/lustre/c/tao.sqsh")
    assert image.pyxis_image == "/lustre/c/tao.sqsh"
    assert image.is_latest is False
    with pytest.raises(ImageReferenceError, match=re.escape("already a .sqsh file and has no registry URI")):
        _ = image.enroot_uri


HOSTILE = [
    pytest.param("nvcr.io#nvidia/x:1;rm -rf /", "contains ';'", id="semicolon"),
    pytest.param("ubuntu && id", "contains ' '", id="space"),
    pytest.param(" ubuntu", "contains ' '", id="leading-space"),
    pytest.param("ubuntu|id", "contains '|'", id="pipe"),
    pytest.param("ubuntu&", "contains '&'", id="ampersand"),
    pytest.param("$(id)", "contains '$'", id="command-substitution"),
    pytest.param("${HOME}", "contains '$'", id="variable"),
    pytest.param("`id`", "contains '`'", id="backticks"),
    pytest.param("ubuntu\n", "contains '\\n'", id="newline"),
    pytest.param("ubuntu\r", "contains '\\r'", id="carriage-return"),
    pytest.param("ubu\x00ntu", "contains '\\x00'", id="nul"),
    pytest.param("ubuntu\x1b[0m", "contains '\\x1b'", id="ansi-escape"),
    pytest.param("ubu'ntu", 'contains "\'"', id="single-quote"),
    pytest.param('ubu"ntu', "contains '\"'", id="double-quote"),
    pytest.param("ubuntu*", "contains '*'", id="glob-star"),
    pytest.param("ubuntu?", "contains '?'", id="glob-question"),
    pytest.param("ubuntu[1]", "contains '['", id="glob-bracket"),
    pytest.param("{a,b}", "contains '{'", id="brace"),
    pytest.param("a<b", "contains '<'", id="redirect-in"),
    pytest.param("a>b", "contains '>'", id="redirect-out"),
    pytest.param("(x)", "contains '('", id="subshell"),
    pytest.param("a\\b", "contains '\\\\'", id="backslash"),
    pytest.param("a!b", "contains '!'", id="history"),
    pytest.param("~/x.sqsh", "contains '~'", id="tilde"),
    pytest.param("a%b", "contains '%'", id="percent"),
    pytest.param("a=b", "contains '='", id="equals"),
    pytest.param("a,b", "contains ','", id="comma"),
    pytest.param("ubunt\u00fc", "contains '\\xfc'", id="unicode"),
    pytest.param("ubuntu\u200b", "contains '\\u200b'", id="zero-width-space"),
    pytest.param("-ubuntu", "starts with '-'", id="leading-dash"),
    pytest.param("--help", "starts with '-'", id="option"),
    pytest.param("", "is empty", id="empty"),
    pytest.param("   ", "is empty", id="blank"),
    pytest.param("\t", "is empty", id="tab"),
    pytest.param("x" * 513, "longer than 512", id="too-long"),
]


@pytest.mark.parametrize(("ref", "fragment"), HOSTILE)
def test_parse_image_rejects_hostile(ref: str, fragment: str) -> None:
    with pytest.raises(ImageReferenceError) as caught:
        parse_image(ref)
    message = str(caught.value)
    assert fragment in message
    assert "e.g. nvcr.io#nvidia/tao/tao-toolkit:5.5.0-pyt" in message, "shows a valid form"
    assert not re.search(r"[\x00-\x1f\x7f]", message), "hostile characters are escaped"
    assert len(message) < 600


MALFORMED = [
    pytest.param(None, "is empty or not a string", id="none"),
    pytest.param(5, "is empty or not a string", id="int"),
    pytest.param("/a/../b.sqsh", "'..' segment", id="dotdot-path"),
    pytest.param("/lustre/../etc/x.sqsh", "'..' segment", id="dotdot-escape"),
    pytest.param("/lustre/a#b.sqsh", "query string or fragment", id="hash-in-path"),
    pytest.param("/lustre/a:b.sqsh", "contains ':'", id="colon-in-path"),
    pytest.param("x.sqsh", "is a relative path", id="relative-sqsh"),
    pytest.param("./x.sqsh", "is a relative path", id="dot-relative-sqsh"),
    pytest.param("../x.sqsh", "is a relative path", id="dotdot-relative-sqsh"),
    pytest.param("images/x.sqsh", "is a relative path", id="dir-relative-sqsh"),
    pytest.param("/lustre/c/tao.tar", "is a path but not a .sqsh file", id="tar-path"),
    pytest.param("/lustre/c/tao", "is a path but not a .sqsh file", id="bare-path"),
    pytest.param("/lustre/c/tao.SQSH", "is a path but not a .sqsh file", id="upper-suffix"),
    pytest.param("file:///lustre/c/tao.sqsh", "is a file:// URI", id="file-uri"),
    pytest.param("http://nvcr.io/nvidia/x", "is a web URL", id="http"),
    pytest.param("https://nvcr.io/nvidia/x:1", "is a web URL", id="https"),
    pytest.param("s3://bucket/x", "unsupported scheme s3://", id="s3"),
    pytest.param("docker:///lustre/x.sqsh", "names a file after docker://", id="docker-file"),
    pytest.param("docker://x.sqsh", "names a file after docker://", id="docker-sqsh"),
    pytest.param("Nvidia/tao:1", "upper-case letters in the repository", id="upper-hub"),
    pytest.param("nvcr.io#NVIDIA/Tao:1", "write 'nvidia/tao'", id="upper-hash-form"),
    pytest.param("nvcr.io#", "has no image name", id="registry-only"),
    pytest.param("nvcr.io#:1", "has no image name", id="tag-only"),
    pytest.param("#ubuntu", "invalid registry host ''", id="empty-registry"),
    pytest.param("a#b#c", "more than one '#'", id="two-hashes"),
    pytest.param("user@nvcr.io#nvidia/x", "credentials belong in ~/.config/enroot/.credentials", id="user-hash"),
    pytest.param("user:key@nvcr.io/nvidia/x", "holds a user name or credentials", id="user-slash"),
    pytest.param("bad_host.io#x", "invalid registry host 'bad_host.io'", id="underscore-host"),
    pytest.param("host-.io#x", "invalid registry host", id="dash-end-host"),
    pytest.param("host.io:port#x", "invalid registry host", id="port-not-number"),
    pytest.param("nvcr.io#nvidia//x", "empty, '.' or '..' component", id="double-slash"),
    pytest.param("nvcr.io#nvidia/x/", "empty, '.' or '..' component", id="trailing-slash"),
    pytest.param("nvcr.io#nvidia/../x", "empty, '.' or '..' component", id="dotdot-component"),
    pytest.param("nvcr.io#nvidia/./x", "empty, '.' or '..' component", id="dot-component"),
    pytest.param("nvcr.io#nvidia/-x", "invalid repository component '-x'", id="dash-component"),
    pytest.param("nvcr.io#nvidia/x_", "invalid repository component 'x_'", id="trailing-separator"),
    pytest.param("nvcr.io#nvidia/a+b", "invalid repository component 'a+b'", id="plus-component"),
    pytest.param("nvcr.io#nvidia/x:", "invalid tag ''", id="empty-tag"),
    pytest.param("nvcr.io#nvidia/x:-bad", "invalid tag '-bad'", id="dash-tag"),
    pytest.param("nvcr.io#nvidia/x:" + "a" * 129, "invalid tag", id="long-tag"),
    pytest.param("nvcr.io#nvidia/x:a:b", "invalid tag 'a:b'", id="colon-tag"),
    pytest.param("nvcr.io#nvidia/x@sha256:abc", "invalid digest 'sha256:abc'", id="short-digest"),
    pytest.param("nvcr.io#x@md5:" + "0" * 32, "invalid digest", id="md5-digest"),
    pytest.param("nvcr.io#x@sha256:" + "A" * 64, "invalid digest", id="upper-digest"),
    pytest.param(f"nvcr.io#x:{DIGEST}@{DIGEST}", "invalid tag", id="two-digests"),
]


@pytest.mark.parametrize(("ref", "fragment"), MALFORMED)
def test_parse_image_rejects_malformed(ref: str, fragment: str) -> None:
    with pytest.raises(ImageReferenceError) as caught:
        parse_image(ref)
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("image=")


def test_image_error_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        parse_image("")


CACHE_NAMES = [
    pytest.param(TAO, "nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh", id="tao"),
    pytest.param(TAO.replace("#", "/"), "nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh", id="slash"),
    pytest.param("ubuntu", "docker.io+library+ubuntu+latest.sqsh", id="hub-official"),
    pytest.param("library/ubuntu:latest", "docker.io+library+ubuntu+latest.sqsh", id="hub-library"),
    pytest.param("docker.io/ubuntu", "docker.io+library+ubuntu+latest.sqsh", id="hub-alias"),
    pytest.param("registry-1.docker.io#library/ubuntu", "docker.io+library+ubuntu+latest.sqsh", id="hub-registry-1"),
    pytest.param("nvidia/cuda:12", "docker.io+nvidia+cuda+12.sqsh", id="hub-namespace"),
    pytest.param("localhost:5000/app:1", "localhost_5000+app+1.sqsh", id="port"),
    pytest.param(f"nvcr.io#x@{DIGEST}", "nvcr.io+x++sha256-0123456789abcdef.sqsh", id="digest"),
    pytest.param(f"nvcr.io#x:1.0@{DIGEST}", "nvcr.io+x+1.0++sha256-0123456789abcdef.sqsh", id="tag-and-digest"),
]


@pytest.mark.parametrize(("ref", "expected"), CACHE_NAMES)
def test_sqsh_cache_name(ref: str, expected: str) -> None:
    name = sqsh_cache_name(parse_image(ref))
    assert name == expected
    assert re.fullmatch(r"[A-Za-z0-9._+-]+\.sqsh", name)


def test_sqsh_cache_names_never_collide() -> None:
    refs = [
        "nvcr.io#a/b:c",
        "nvcr.io#a/b/c",
        "nvcr.io#a:b",
        "nvcr.io#a/b",
        "localhost:5000#app:1",
        "localhost#5000/app:1",
        "nvcr.io:443#a:b",
        "nvcr.io#a:sha256-0123456789abcdef",
        f"nvcr.io#a@{DIGEST}",
        "a/b:c",
        "nvcr.io#a.b:c",
        "nvcr.io#a-b:c",
    ]
    names = {sqsh_cache_name(parse_image(ref)) for ref in refs}
    assert len(names) == len(refs)


CACHE_NAME_REJECTED = [
    pytest.param("/lustre/c/tao.sqsh", "already a .sqsh file", id="sqsh"),
    pytest.param("nvcr.io#" + "/".join(["a" * 60] * 7) + ":1", "pass sqsh_path explicitly", id="too-long"),
]


@pytest.mark.parametrize(("ref", "fragment"), CACHE_NAME_REJECTED)
def test_sqsh_cache_name_rejects(ref: str, fragment: str) -> None:
    with pytest.raises(ImageReferenceError, match=re.escape(fragment)):
        sqsh_cache_name(parse_image(ref))


def test_sqsh_cache_path() -> None:
    assert (
        sqsh_cache_path(parse_image(TAO), "/lustre/containers")
        == "/lustre/containers/nvcr.io+nvidia+tao+tao-toolkit+5.5.0-pyt.sqsh"
    )


@pytest.mark.parametrize(
    ("containers_dir", "fragment"),
    [
        pytest.param("containers", "is a relative path", id="relative"),
        pytest.param("/lustre/containers/", "use '/lustre/containers'", id="trailing-slash"),
        pytest.param("/lustre/../containers", "'..' segment", id="dotdot"),
        pytest.param("lustre:///containers", "use '/containers'", id="uri"),
        pytest.param("", "is empty", id="empty"),
        pytest.param("/lustre/$(id)", "contains '$'", id="hostile"),
    ],
)
def test_sqsh_cache_path_requires_normalised_dir(containers_dir: str, fragment: str) -> None:
    with pytest.raises(StoragePathError) as caught:
        sqsh_cache_path(parse_image(TAO), containers_dir)
    assert str(caught.value).startswith("containers_dir=")
    assert fragment in str(caught.value)


REGISTRY_HOSTS = [
    pytest.param(TAO, "nvcr.io", id="ngc"),
    pytest.param("localhost:5000/app", "localhost", id="port-dropped"),
    pytest.param("Registry.Example.com:443#x", "registry.example.com", id="lowered"),
    pytest.param("ubuntu", "registry-1.docker.io", id="docker-hub"),
    pytest.param("docker.io/nvidia/cuda:12", "registry-1.docker.io", id="docker-hub-alias"),
    pytest.param("/lustre/c/tao.sqsh", None, id="sqsh"),
]


@pytest.mark.parametrize(("ref", "expected"), REGISTRY_HOSTS)
def test_registry_host(ref: str, expected: str | None) -> None:
    assert registry_host(parse_image(ref)) == expected


def _superblock(bytes_used: int) -> bytes:
    """The first 48 bytes of a squashfs 4.0 superblock (as mksquashfs writes them)."""
    header = SQSH_MAGIC + bytes(24) + (4).to_bytes(2, "little") + bytes(10) + bytes_used.to_bytes(8, "little")
    assert len(header) == SQSH_HEADER_BYTES
    return header


HEADERS = [
    pytest.param(_superblock(213), 4096, None, id="smallest-valid"),
    pytest.param(_superblock(5_000_000), 5_001_216, None, id="padded"),
    pytest.param(_superblock(8192), 8192, None, id="bytes-used-equals-size"),
    pytest.param(SQSH_MAGIC, 10**9, None, id="magic-only-cannot-check-size"),
    pytest.param(_superblock(213), MIN_SQSH_BYTES - 1, "has 4095 bytes, fewer than", id="too-small"),
    pytest.param(b"", 0, "has 0 bytes", id="empty-file"),
    pytest.param(bytes(48), 8192, "starts with b'\\x00\\x00\\x00\\x00', not the squashfs magic", id="zeros"),
    pytest.param(b"", 8192, "starts with b'', not the squashfs magic", id="nothing-read"),
    pytest.param(b"hsq", 8192, "not the squashfs magic", id="partial-magic"),
    pytest.param(b"\x1f\x8b\x08\x00", 8192, "not the squashfs magic", id="gzip"),
    pytest.param(b"sqsh" + bytes(44), 8192, "not the squashfs magic", id="big-endian-magic"),
    pytest.param(_superblock(10_000_000), 8192, "says 10000000 bytes but the file has only 8192", id="truncated"),
]


@pytest.mark.parametrize(("first_bytes", "size", "fragment"), HEADERS)
def test_check_sqsh_header(first_bytes: bytes, size: int, fragment: str | None) -> None:
    problem = check_sqsh_header(first_bytes, size)
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None
        assert fragment in problem
        assert problem.endswith("delete it and convert the image again")


POLICY = [
    pytest.param("/lustre/c/tao.sqsh", True, False, False, id="sqsh-never-converted"),
    pytest.param("/lustre/c/tao.sqsh", False, True, False, id="sqsh-never-converted-even-forced"),
    pytest.param("nvcr.io#x:1", False, False, True, id="missing-converts"),
    pytest.param("nvcr.io#x:1", True, False, False, id="valid-reused"),
    pytest.param("nvcr.io#x:1", True, True, False, id="force-only-applies-to-latest"),
    pytest.param("nvcr.io#x:latest", False, False, True, id="latest-missing-converts"),
    pytest.param("nvcr.io#x:latest", True, False, False, id="latest-reused"),
    pytest.param("nvcr.io#x:latest", True, True, True, id="latest-forced"),
    pytest.param("nvcr.io#x", True, True, True, id="implicit-latest-forced"),
    pytest.param(f"nvcr.io#x:latest@{DIGEST}", True, True, False, id="pinned-latest-reused"),
]


@pytest.mark.parametrize(("ref", "existing_valid", "force", "expected"), POLICY)
def test_needs_conversion(ref: str, existing_valid: bool, force: bool, expected: bool) -> None:
    assert needs_conversion(parse_image(ref), existing_valid, force) is expected
