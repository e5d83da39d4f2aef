"""Storage paths: accepted forms, hostile input, collected errors and joins that cannot escape."""

from __future__ import annotations

import re

import pytest

from airflow_provider_tao_slurm.core.storage import (
    MAX_PATH_CHARS,
    display_value,
    join_under,
    resolve_cluster_path,
    resolve_paths,
)
from airflow_provider_tao_slurm.exceptions import StoragePathError, ValidationError

ACCEPTED = [
    pytest.param("/lustre/datasets/coco", "/lustre/datasets/coco", id="plain-absolute"),
    pytest.param("lustre:///lustre/datasets/coco", "/lustre/datasets/coco", id="lustre-uri"),
    pytest.param("LUSTRE:///data", "/data", id="lustre-uri-upper-scheme"),
    pytest.param("slurm:///data/x", "/data/x", id="slurm-uri-no-host"),
    pytest.param("slurm://login01/data/x", "/data/x", id="slurm-uri-host-dropped"),
    pytest.param("slurm://login-1.example.org/data/x", "/data/x", id="slurm-uri-fqdn-host"),
    pytest.param("/data//x/./y/", "/data/x/y", id="normalised-slashes-dots"),
    pytest.param("//data/x", "/data/x", id="double-leading-slash"),
    pytest.param("lustre:////data///x//", "/data/x", id="lustre-uri-extra-slashes"),
    pytest.param("/data/set-v1.2_a+b@c=d", "/data/set-v1.2_a+b@c=d", id="all-safe-characters"),
    pytest.param("/data/.hidden/...", "/data/.hidden/...", id="dot-names-not-dotdot"),
    pytest.param("/data/-rf", "/data/-rf", id="dash-segment-under-absolute"),
    pytest.param("/" + "a" * (MAX_PATH_CHARS - 1), "/" + "a" * (MAX_PATH_CHARS - 1), id="max-length"),
]


@pytest.mark.parametrize(("value", "expected"), ACCEPTED)
def test_resolve_cluster_path_accepts(value: str, expected: str) -> None:
    assert resolve_cluster_path(value) == expected


REJECTED = [
    pytest.param("", "is empty", id="empty"),
    pytest.param("   ", "is empty", id="blank"),
    pytest.param(" /data", "leading or trailing whitespace", id="leading-space"),
    pytest.param("/data\t", "leading or trailing whitespace", id="trailing-tab"),
    pytest.param("data/x", "is a relative path", id="relative"),
    pytest.param("./data", "is a relative path", id="dot-relative"),
    pytest.param("../data", "is a relative path", id="dotdot-relative"),
    pytest.param("lustre:/data", "is a relative path", id="lustre-one-slash"),
    pytest.param("file:///data/x", "copy the data to Lustre and pass lustre:///", id="file-uri"),
    pytest.param("FILE:///data/x", "copy the data to Lustre", id="file-uri-upper"),
    pytest.param("s3://bucket/x", "unsupported scheme s3://", id="s3"),
    pytest.param("http://host/x", "unsupported scheme http://", id="http"),
    pytest.param("https://host/x", "unsupported scheme https://", id="https"),
    pytest.param("lustre://mds01/data", "three slashes", id="lustre-with-host"),
    pytest.param("slurm://login01", "no path after the host", id="slurm-host-only"),
    pytest.param("slurm://-login/x", "invalid host", id="slurm-dash-host"),
    pytest.param("slurm://lo;gin/x", "invalid host", id="slurm-hostile-host"),
    pytest.param("/a/../b", "'..' segment", id="dotdot"),
    pytest.param("/a/./../b", "'..' segment", id="dot-then-dotdot"),
    pytest.param("/data/..", "'..' segment", id="trailing-dotdot"),
    pytest.param("lustre:///a/../../etc", "'..' segment", id="lustre-dotdot"),
    pytest.param("slurm://h/../etc", "'..' segment", id="slurm-dotdot"),
    pytest.param("/a/%2e%2e/b", "percent-encoding", id="percent-dotdot"),
    pytest.param("/a/%2E%2E/b", "percent-encoding", id="percent-dotdot-upper"),
    pytest.param("/data%00", "percent-encoding", id="percent-nul"),
    pytest.param("/data?x=1", "query string or fragment", id="query"),
    pytest.param("lustre:///data#frag", "query string or fragment", id="fragment"),
    pytest.param("/data/x\x00", "control character", id="nul"),
    pytest.param("/data/x\ny", "control character", id="newline"),
    pytest.param("/data/a\rb", "control character", id="carriage-return"),
    pytest.param("/data/\x1b[31m", "control character", id="ansi-escape"),
    pytest.param("/data/a\x7fb", "control character", id="delete-char"),
    pytest.param("~/data", "starts with '~'", id="tilde"),
    pytest.param("~root/data", "starts with '~'", id="tilde-user"),
    pytest.param("/data/a b", "contains ' '", id="space"),
    pytest.param("/data/a'b", 'contains "\'"', id="single-quote"),
    pytest.param('/data/a"b', "contains '\"'", id="double-quote"),
    pytest.param("/data/a;rm -rf", "contains ';'", id="semicolon"),
    pytest.param("/data/$(id)", "contains '$'", id="command-substitution"),
    pytest.param("/data/`id`", "contains '`'", id="backticks"),
    pytest.param("/data/*.jpg", "contains '*'", id="glob-star"),
    pytest.param("/data/[ab]", "contains '['", id="glob-bracket"),
    pytest.param("/data/{a,b}", "contains '{'", id="brace"),
    pytest.param("/data/a|b", "contains '|'", id="pipe"),
    pytest.param("/data/a&b", "contains '&'", id="ampersand"),
    pytest.param("/data/a>b", "contains '>'", id="redirect"),
    pytest.param("/data/a\\b", "contains '\\\\'", id="backslash"),
    pytest.param("/data/a,b", "contains ','", id="comma-breaks-mount-list"),
    pytest.param("/data/a:b", "contains ':'", id="colon-breaks-mount-spec"),
    pytest.param("/data/donn\u00e9es", "contains '\\xe9'", id="unicode-letter"),
    pytest.param("/data/\u202eevil", "contains '\\u202e'", id="unicode-bidi-override"),
    pytest.param("/data/\u00a0x", "contains '\\xa0'", id="unicode-nbsp"),
    pytest.param("/", "is the root directory", id="root"),
    pytest.param("///", "is the root directory", id="root-slashes"),
    pytest.param("lustre:///", "is the root directory", id="lustre-root"),
    pytest.param("/" + "a" * MAX_PATH_CHARS, f"longer than {MAX_PATH_CHARS}", id="too-long"),
    pytest.param(123, "is a int, not a path", id="int"),
    pytest.param(None, "is a NoneType, not a path", id="none"),
    pytest.param(b"/data", "is a bytes, not a path", id="bytes"),
]


@pytest.mark.parametrize(("value", "fragment"), REJECTED)
def test_resolve_cluster_path_rejects(value: str, fragment: str) -> None:
    with pytest.raises(StoragePathError) as caught:
        resolve_cluster_path(value, param="dataset")
    message = str(caught.value)
    assert fragment in message
    assert message.startswith("dataset=")
    assert "; " in message, "every message names a fix after the problem"
    assert not re.search(r"[\x00-\x1f\x7f]", message), "hostile characters are escaped"
    assert len(message) < 600


def test_storage_error_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        resolve_cluster_path("relative")


def test_long_value_is_truncated_in_message() -> None:
    value = "/data/" + "x" * 5000 + " y"
    with pytest.raises(StoragePathError) as caught:
        resolve_cluster_path(value)
    assert "(5008 chars)" in str(caught.value)
    assert "x" * 300 not in str(caught.value)


DISPLAYED = [
    pytest.param("/data/x", 200, "'/data/x'", id="short"),
    pytest.param("a\nb", 200, "'a\\nb'", id="control-escaped"),
    pytest.param("\u00e9", 200, "'\\xe9'", id="unicode-escaped"),
    pytest.param("abcdef", 4, "'abc... (6 chars)", id="truncated-string"),
    pytest.param(12345678, 4, "1234...", id="truncated-non-string"),
    pytest.param(None, 200, "None", id="none"),
]


@pytest.mark.parametrize(("value", "limit", "expected"), DISPLAYED)
def test_display_value(value: object, limit: int, expected: str) -> None:
    assert display_value(value, limit) == expected


def test_resolve_paths_keeps_list_shape() -> None:
    assert resolve_paths(["lustre:///d/train", "/d//val/", "slurm://h/d/test"]) == [
        "/d/train",
        "/d/val",
        "/d/test",
    ]


def test_resolve_paths_tuple_gives_list() -> None:
    assert resolve_paths(("/d/a",)) == ["/d/a"]


def test_resolve_paths_keeps_dict_keys_and_order() -> None:
    result = resolve_paths({"val": "/d/val/", "train": "lustre:///d/train"})
    assert result == {"val": "/d/val", "train": "/d/train"}
    assert isinstance(result, dict)
    assert list(result) == ["val", "train"]


def test_resolve_paths_lists_every_bad_list_entry() -> None:
    with pytest.raises(StoragePathError) as caught:
        resolve_paths(["/ok/a", "file:///x", "/ok/b", "rel/x", "/a/../b"], param="datasets")
    message = str(caught.value)
    assert message.startswith("3 of 5 entries of datasets are invalid:\n")
    assert "- datasets[1]='file:///x' is a file:// URI" in message
    assert "- datasets[3]='rel/x' is a relative path" in message
    assert "- datasets[4]='/a/../b' contains a '..' segment" in message
    assert "datasets[0]" not in message
    assert "datasets[2]" not in message


def test_resolve_paths_lists_every_bad_dict_entry() -> None:
    with pytest.raises(StoragePathError) as caught:
        resolve_paths({"train": "/ok", "val": "s3://b/v", "test": "/d/$(id)", 7: "/ok"})  # type: ignore[dict-item]
    message = str(caught.value)
    assert message.startswith("3 of 4 entries of paths are invalid:\n")
    assert "paths['val']='s3://b/v' uses the unsupported scheme s3://" in message
    assert "paths['test']='/d/$(id)' contains '$'" in message
    assert "paths[7]=7 has a key that is not a string" in message
    assert "paths['train']" not in message


def test_resolve_paths_reports_a_bad_key_once() -> None:
    with pytest.raises(StoragePathError) as caught:
        resolve_paths({7: "relative"})  # type: ignore[dict-item]
    assert str(caught.value) == (
        "1 of 1 entries of paths are invalid:\n- paths[7]=7 has a key that is not a string; use names as keys"
    )


SHAPE_REJECTED = [
    pytest.param("/data/x", "is a single string, not a list or dict", id="lone-string"),
    pytest.param(b"/data/x", "is a single string, not a list or dict", id="lone-bytes"),
    pytest.param([], "is empty", id="empty-list"),
    pytest.param({}, "is empty", id="empty-dict"),
    pytest.param(None, "is a NoneType", id="none"),
    pytest.param(42, "is a int", id="int"),
    pytest.param({"/data/x"}, "is a set", id="set"),
]


@pytest.mark.parametrize(("paths", "fragment"), SHAPE_REJECTED)
def test_resolve_paths_rejects_shape(paths: object, fragment: str) -> None:
    with pytest.raises(StoragePathError, match=re.escape(fragment)):
        resolve_paths(paths)  # type: ignore[arg-type]


JOINED = [
    pytest.param("/base", (), "/base", id="no-parts"),
    pytest.param("/base", ("job1",), "/base/job1", id="one-part"),
    pytest.param("/base", ("jobs", "tao-1.2_x", "specs/spec.yaml"), "/base/jobs/tao-1.2_x/specs/spec.yaml", id="deep"),
    pytest.param("/base", ("-rf",), "/base/-rf", id="dash-name-stays-under-base"),
    pytest.param("/base", ("...",), "/base/...", id="three-dots-is-a-name"),
]


@pytest.mark.parametrize(("base", "parts", "expected"), JOINED)
def test_join_under(base: str, parts: tuple[str, ...], expected: str) -> None:
    assert join_under(base, *parts) == expected


BAD_PARTS = [
    pytest.param("..", "'..' segment", id="dotdot"),
    pytest.param("../etc", "'..' segment", id="dotdot-prefix"),
    pytest.param("a/../../etc", "'..' segment", id="dotdot-inside"),
    pytest.param("/etc/passwd", "is absolute", id="absolute"),
    pytest.param("", "not a non-empty string", id="empty"),
    pytest.param(".", "empty or '.' segment", id="dot"),
    pytest.param("a//b", "empty or '.' segment", id="double-slash"),
    pytest.param("a/", "empty or '.' segment", id="trailing-slash"),
    pytest.param("a b", "contains ' '", id="space"),
    pytest.param("$(reboot)", "contains '$'", id="command-substitution"),
    pytest.param("a\nb", "contains '\\n'", id="newline"),
    pytest.param("*", "contains '*'", id="glob"),
    pytest.param("~", "contains '~'", id="tilde"),
    pytest.param("%2e%2e", "contains '%'", id="percent"),
    pytest.param(7, "not a non-empty string", id="int"),
]


@pytest.mark.parametrize(("part", "fragment"), BAD_PARTS)
def test_join_under_refuses_escaping_parts(part: str, fragment: str) -> None:
    with pytest.raises(StoragePathError) as caught:
        join_under("/base", "jobs", part)
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("part=")


BAD_BASES = [
    pytest.param("base", "is a relative path", id="relative"),
    pytest.param("/base/", "use '/base'", id="trailing-slash"),
    pytest.param("/a//b", "use '/a/b'", id="double-slash"),
    pytest.param("/a/./b", "use '/a/b'", id="dot"),
    pytest.param("lustre:///base", "use '/base'", id="uri"),
    pytest.param("/a/../b", "'..' segment", id="dotdot"),
    pytest.param("", "is empty", id="empty"),
    pytest.param("/", "root directory", id="root"),
]


@pytest.mark.parametrize(("base", "fragment"), BAD_BASES)
def test_join_under_requires_normalised_base(base: str, fragment: str) -> None:
    with pytest.raises(StoragePathError) as caught:
        join_under(base, "job1", param="results_dir")
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("results_dir=")
