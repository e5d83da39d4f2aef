"""Secret lint and redaction: a corpus of lines that must and must not be flagged.

Token-shaped values are assembled at import time so that this file itself holds no string a
secret scanner would take for a real credential.
"""

from __future__ import annotations

import base64
import json
import random
import textwrap
import urllib.parse
from typing import Any

import pytest

from airflow_provider_tao_slurm.core.secrets import (
    REDACTED,
    KeyBlock,
    SecretFinding,
    assert_no_secrets,
    is_secret_name,
    key_block_at,
    lint_script,
    redact_chunk,
    redact_obj,
    redact_text,
    withheld_note,
)
from airflow_provider_tao_slurm.exceptions import SecretLeakError

GHP = "ghp_" + "A1b2" * 9
GITHUB_PAT = "github_pat_" + "11AAAA" * 6
HF = "hf_" + "aBcD" * 9
AKIA = "AKIA" + "IOSFODNN7EXAMPL1"
SLACK = "xoxb-" + "1234-5678-abcdEFGH"
SK = "sk-" + "proj-" + "a1B2c3" * 5
NVAPI = "nvapi-" + "Zz9_" * 8
JWT = "eyJhbGciOiJIUzI1NiJ9" + "." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0" + "." + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
BEARER = "Zm9vYmFyYmF6cXV4cXV1eA"
PEM_BEGIN = "-----BEGIN " + "RSA PRIVATE KEY-----"

# (line, expected findings as (name, kind), the secret text that redaction must remove)
POSITIVE = [
    ("HF_TOKEN=abc123def", [("HF_TOKEN", "assignment")], "abc123def"),
    ("export HF_TOKEN=abc123def", [("HF_TOKEN", "assignment")], "abc123def"),
    ('export NGC_API_KEY="nvkey-123456"', [("NGC_API_KEY", "assignment")], "nvkey-123456"),
    ("export PASSWORD='p@ss w0rd'", [("PASSWORD", "assignment")], "p@ss w0rd"),
    ("PASSWORD='$not_a_reference'", [("PASSWORD", "assignment")], "$not_a_reference"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", [("AWS_SECRET_ACCESS_KEY", "assignment")], "wJalrXUtnFEMI"),
    ("export AWS_SESSION_TOKEN=FwoGZXIvYXdzE", [("AWS_SESSION_TOKEN", "assignment")], "FwoGZXIvYXdzE"),
    ("GITHUB_TOKEN=tok123 python x.py", [("GITHUB_TOKEN", "assignment")], "tok123"),
    ("declare -x DB_PASSWD=hunter22", [("DB_PASSWD", "assignment")], "hunter22"),
    ("WANDB_API_KEY=0123abcd; run", [("WANDB_API_KEY", "assignment")], "0123abcd"),
    ("CLIENT_SECRET=cs-value-9", [("CLIENT_SECRET", "assignment")], "cs-value-9"),
    ("AUTHTOKEN=xyz987", [("AUTHTOKEN", "assignment")], "xyz987"),
    ("python -c \"login(hf_token='abc123')\"", [("hf_token", "assignment")], "abc123"),
    ("train --password hunter22 --epochs 3", [("--password", "option")], "hunter22"),
    ("train --token=abc123", [("--token", "option")], "abc123"),
    ("ngc config set --api-key 'k3y-value'", [("--api-key", "option")], "k3y-value"),
    ("run --secret s3cr3t", [("--secret", "option")], "s3cr3t"),
    ("run --hf_token abcdef", [("--hf_token", "option")], "abcdef"),
    ("password: hunter22", [("password", "mapping")], "hunter22"),
    ('{"api_key": "k-123456", "epochs": 3}', [("api_key", "mapping")], "k-123456"),
    (f"git clone https://x:{GHP}@github.com/o/r", [("github token", "token"), ("url password", "url-userinfo")], GHP),
    (f"echo {GITHUB_PAT}", [("github token", "token")], GITHUB_PAT),
    (f"HF_HUB=1 cli login {HF}", [("hugging face token", "token")], HF),
    (f"aws configure set aws_access_key_id {AKIA}", [("aws access key id", "token")], AKIA),
    (f"curl -d token={SLACK}", [("token", "assignment"), ("slack token", "token")], SLACK),
    (f"OPENAI={SK}", [("sk- api key", "token")], SK),
    (f"NGC={NVAPI}", [("nvidia api key", "token")], NVAPI),
    (f"cookie {JWT}", [("jwt", "token")], JWT),
    (f'curl -H "X-Auth: Bearer {BEARER}"', [("bearer token", "token")], BEARER),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", [("basic auth", "token")], "dXNlcjpwYXNzd29yZA=="),
    (PEM_BEGIN, [("private key", "private-key")], PEM_BEGIN),
    ("wget https://alice:Sup3rS3cret@files.example.org/data.tar", [("url password", "url-userinfo")], "Sup3rS3cret"),
    (
        "curl 'https://b.s3.amazonaws.com/k?X-Amz-Credential=a&X-Amz-Signature=fe5f80f77d5fa3beca038a248ff027'",
        [("url signature", "presigned-url")],
        "fe5f80f77d5fa3beca038a248ff027",
    ),
    (
        "https://d.cloudfront.net/f?Expires=1700000000&Signature=nitfHRCrtziwO2HwPfWw~yYDhUF5EwRunQA&Key-Pair-Id=K",
        [("url signature", "presigned-url")],
        "nitfHRCrtziwO2HwPfWw~yYDhUF5EwRunQA",
    ),
    (
        "azcopy copy 'https://a.blob.core.windows.net/c?sv=2022-11-02&se=2024&sig=bQ%2Bv9kW8%3D'",
        [("url signature", "presigned-url")],
        "bQ%2Bv9kW8%3D",
    ),
    ("https://api.example.org/v1?access_token=at-98765", [("access_token", "assignment")], "at-98765"),
]

NEGATIVE = [
    'HF_TOKEN="$HF_TOKEN"',
    "export HF_TOKEN=$HF_TOKEN",
    "export NGC_API_KEY=${NGC_API_KEY}",
    'train --password "$PASSWORD"',
    "train --token ${TOKEN:?set TOKEN}",
    "PASSWORD=$(cat /run/secrets/db)",
    "PASSWORD=`cat /run/secrets/db`",
    "HF_TOKEN=",
    'HF_TOKEN=""',
    "export HF_TOKEN",
    'echo "${HF_TOKEN:-}" "${NGC_API_KEY:?missing}" "${HF_TOKEN:0:4}"',
    "TOKENIZERS_PARALLELISM=false",
    "python generate.py max_new_tokens=128 num_tokens=4096",
    "run --max-new-tokens 128",
    "PASSWORD_FILE=/run/secrets/db_password",
    "HF_TOKEN_PATH=/lustre/proj/.hf_token",
    "run --token-file /lustre/proj/token.txt",
    "docker login --password-stdin nvcr.io",
    "USE_AUTH_TOKEN=true",
    "run --use_auth_token True",
    "SECRET_NAME=my-k8s-secret",
    "TOKEN_LIMIT=4096",
    "key: tlt_encode",
    "encryption_key: nvidia_tao",
    "tao model classification_tf2 train -e spec.yaml -k $KEY",
    "export NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=eth0",
    "ssh://git@github.com/org/repo.git",
    "https://host.example.org:8443/path?page=2&sort=asc",
    'curl -H "Authorization: Bearer $TOKEN" https://api.example.org',
    "git clone https://$USER:$PASS@example.org/r.git",
    "hf_model_name=bert-base",
    "task-sk-learn-model",
    "# pass the key via secret_env",
    "bypass=1",
    "basic building-blocks for training",
    'echo "TAO_SLURM: step exit code ${TAO_SLURM_STEP_RC}"',
]


@pytest.mark.parametrize(("line", "expected", "secret"), POSITIVE, ids=[f"pos{i:02d}" for i in range(len(POSITIVE))])
def test_corpus_positive(line: str, expected: list[tuple[str, str]], secret: str) -> None:
    assert [(finding.name, finding.kind) for finding in lint_script(line)] == expected
    redacted = redact_text(line)
    assert secret not in redacted
    assert REDACTED in redacted


@pytest.mark.parametrize("line", NEGATIVE, ids=[f"neg{i:02d}" for i in range(len(NEGATIVE))])
def test_corpus_negative(line: str) -> None:
    assert lint_script(line) == []
    assert redact_text(line) == line


def test_corpus_size() -> None:
    assert len(POSITIVE) >= 30
    assert len(NEGATIVE) >= 30


def test_lint_reports_line_numbers_and_never_values() -> None:
    script = f"#!/bin/bash\nset -e\nexport HF_TOKEN=abc123def\necho ok\nrun --token={GHP}\n"
    findings = lint_script(script)
    assert findings == [
        SecretFinding(3, "HF_TOKEN", "assignment"),
        SecretFinding(5, "--token", "option"),
        SecretFinding(5, "github token", "token"),
    ]
    assert not any("abc123def" in field or GHP in field for finding in findings for field in map(str, finding))


def test_assert_no_secrets_message_names_lines_not_values() -> None:
    script = f"a=1\nb=2\nexport HF_TOKEN=abc123def\nrun --token={GHP}\n"
    with pytest.raises(SecretLeakError) as raised:
        assert_no_secrets(script, "sbatch script job_x.sbatch")
    message = str(raised.value)
    assert message == (
        "literal credential material in sbatch script job_x.sbatch: line 3 (HF_TOKEN), line 4 (--token), "
        "line 4 (github token); pass it through secret_env instead"
    )
    assert raised.value.findings == [(3, "HF_TOKEN"), (4, "--token"), (4, "github token")]


def test_assert_no_secrets_passes_clean_text() -> None:
    assert_no_secrets("\n".join(NEGATIVE), "script")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("HF_TOKEN", True),
        ("hf_token", True),
        ("NGC_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("PASSWORD", True),
        ("db_pass", True),
        ("--api-key", True),
        ("accessToken", True),
        ("NGCApiKey", True),
        ("Authorization", True),
        ("x-api-key", True),
        ("GH_PAT", True),
        ("PASSWORD_FILE", False),
        ("HF_TOKEN_PATH", False),
        ("--token-file", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("max_new_tokens", False),
        ("AWS_ACCESS_KEY_ID", False),
        ("key", False),
        ("encryption_key", False),
        ("SSH_KEY", False),
        ("PWD", False),
        ("", False),
        ("--", False),
    ],
    ids=lambda value: str(value) or "empty",
)
def test_is_secret_name(name: str, expected: bool) -> None:
    assert is_secret_name(name) is expected


@pytest.mark.parametrize(
    ("text", "secrets", "expected"),
    [
        pytest.param("user s3cr3t-v4lue here", ["s3cr3t-v4lue"], "user ${REDACTED} here", id="given-value"),
        pytest.param("abcdef and abc", ["abc", "abcdef"], "${REDACTED} and abc", id="short-value-kept"),
        pytest.param("pre-abcdefgh-post", ["abcd", "abcdefgh"], "pre-${REDACTED}-post", id="longest-first"),
        pytest.param("value: 'k3y!'", ["k3y!", ""], "value: '${REDACTED}'", id="empty-secret-ignored"),
        pytest.param("multi\nline s3cr3t\n", ["s3cr3t"], "multi\nline ${REDACTED}\n", id="keeps-newlines"),
        pytest.param("export HF_TOKEN=abc x=1", [], "export HF_TOKEN=${REDACTED} x=1", id="assignment"),
        pytest.param('HF_TOKEN="abc def" next', [], 'HF_TOKEN="${REDACTED}" next', id="quoted-assignment"),
        pytest.param(f"HF_TOKEN={HF}", [], "HF_TOKEN=${REDACTED}", id="overlapping-spans"),
        pytest.param("a\n" + PEM_BEGIN + "\nMIIEow\nAAAA\n-----END RSA PRIVATE KEY-----\nb\n", [],
                     "a\n${REDACTED}\nb\n",
                     id="pem-block"),
        pytest.param(PEM_BEGIN + "\nMIIEow\n", [], "${REDACTED}", id="pem-truncated"),
    ],
)  # fmt: skip
def test_redact_text(text: str, secrets: list[str], expected: str) -> None:
    assert redact_text(text, secrets) == expected


def test_redact_text_accepts_a_generator_and_is_idempotent() -> None:
    once = redact_text(f"t=s3cr3t-xyz {HF}", (value for value in ["s3cr3t-xyz"]))
    assert once == f"t={REDACTED} {REDACTED}"
    assert redact_text(once, ["s3cr3t-xyz"]) == once


def test_redact_obj_walks_containers_and_keys() -> None:
    record = {
        "job_id": "tao-1",
        "secret_env": {"HF_TOKEN": "abc123def", "EMPTY_TOKEN": "", "NONE_PASSWORD": None},
        "env": {"MSG": "uses s3cr3t-value inline", "TOKENIZERS_PARALLELISM": "false"},
        "transitions": [("RUNNING", f"login with {GHP}"), {"message": "export PASSWORD=hunter22"}],
        "apiKey": 12345,
        "count": 3,
        ("tuple", "key"): "s3cr3t-value",
    }
    assert redact_obj(record, ["s3cr3t-value"]) == {
        "job_id": "tao-1",
        "secret_env": {"HF_TOKEN": REDACTED, "EMPTY_TOKEN": "", "NONE_PASSWORD": None},
        "env": {"MSG": "uses ${REDACTED} inline", "TOKENIZERS_PARALLELISM": "false"},
        "transitions": [("RUNNING", "login with ${REDACTED}"), {"message": "export PASSWORD=${REDACTED}"}],
        "apiKey": REDACTED,
        "count": 3,
        ("tuple", "key"): REDACTED,
    }
    assert record["secret_env"] == {"HF_TOKEN": "abc123def", "EMPTY_TOKEN": "", "NONE_PASSWORD": None}


# --- as strict as the TAO workflow's own lint (issue 19) ---------------------------------------------

STRICTER = [
    ("docker login -u '$oauthtoken' -p nvk-12345678 nvcr.io", [("-p", "option")], "nvk-12345678"),
    ("docker login -u x -pnvk-12345678 nvcr.io", [("-p", "option")], "nvk-12345678"),
    ("podman login --username x -p=pw-98765432 registry.example.org", [("-p", "option")], "pw-98765432"),
    ('args: ["--token", "tk-5566778899"]', [("--token", "option")], "tk-5566778899"),
    ("args: [--epochs, 3, --token, tk-5566778899]", [("--token", "option")], "tk-5566778899"),
    ('command: ["train", "--api-key", "k-1234567"]', [("--api-key", "option")], "k-1234567"),
    ('echo "${NGC_API_KEY:-nvk-default-123}"', [("NGC_API_KEY", "default")], "nvk-default-123"),
    ("export HF_TOKEN=${HF_TOKEN:=hf-fallback-99}", [("HF_TOKEN", "default")], "hf-fallback-99"),
    ("env: [{name: NGC_KEY, value: nvk-flow-1234}]", [("NGC_KEY", "env-list")], "nvk-flow-1234"),
    ('"env": [{"name": "NGC_API_KEY", "value": "nvk-json-1234"}]', [("NGC_API_KEY", "env-list")], "nvk-json-1234"),
    # the value before the name (issue 32, item 9)
    ("- {value: nvk-flow-1234, name: NGC_KEY}", [("NGC_KEY", "env-list")], "nvk-flow-1234"),
    ("env: [{value: 'nvk flow 5678', name: HF_TOKEN}]", [("HF_TOKEN", "env-list")], "nvk flow 5678"),
    ('"env": [{"value": "nvk-json-1234", "name": "NGC_API_KEY"}]', [("NGC_API_KEY", "env-list")], "nvk-json-1234"),
    ("- {value: nvk-x-9876,name: NGC_KEY, extra: 1}", [("NGC_KEY", "env-list")], "nvk-x-9876"),
    ('NGC_API_KEY=nvapi-"Zz9Zz9Zz9"', [("NGC_API_KEY", "assignment")], "Zz9Zz9Zz9"),
    ("PASSWORD=pre'mid dle'post", [("PASSWORD", "assignment")], "mid dle"),
]
STILL_CLEAN = [
    "docker login -u x --password-stdin nvcr.io",
    "docker login -u x -p $NGC_API_KEY nvcr.io",
    "ssh -p 22 login1",
    "docker run -p 8080:80 img",
    'args: ["--epochs", "3", "--token", "$TOKEN"]',
    'echo "${NGC_API_KEY:-}" "${NGC_API_KEY:?set it}" "${HF_TOKEN:-$FALLBACK}"',
    "env: [{name: NGC_KEY, value: $(NGC_KEY)}]",
    "env: [{name: EPOCHS, value: 3}]",
    "- {value: $(NGC_KEY), name: NGC_KEY}",
    "- {value: 3, name: EPOCHS}",
    "- {value: nvk-path-1234, name: NGC_KEY_FILE}",
    "max_new_tokens=128 TOKENIZERS_PARALLELISM=false",
]


@pytest.mark.parametrize(("line", "expected", "secret"), STRICTER, ids=[f"strict{i:02d}" for i in range(len(STRICTER))])
def test_the_lint_catches_what_the_workflows_lint_catches(
    line: str, expected: list[tuple[str, str]], secret: str
) -> None:
    assert [(finding.name, finding.kind) for finding in lint_script(line)] == expected
    redacted = redact_text(line)
    assert secret not in redacted
    assert lint_script(redacted) == [], redacted


@pytest.mark.parametrize("line", STILL_CLEAN, ids=[f"clean{i:02d}" for i in range(len(STILL_CLEAN))])
def test_the_false_positive_guards_hold(line: str) -> None:
    assert lint_script(line) == []
    assert redact_text(line) == line


def test_a_block_yaml_env_list_names_the_secret_on_the_line_above() -> None:
    text = (
        "env:\n  - name: EPOCHS\n    value: 3\n  - name: NGC_API_KEY\n    value: nvk-block-1234\n"
        "  - name: REF_TOKEN\n    value: $(REF)\n"
    )
    assert lint_script(text) == [SecretFinding(5, "NGC_API_KEY", "env-list")]
    redacted = redact_text(text)
    assert "nvk-block-1234" not in redacted
    assert "value: 3" in redacted
    assert lint_script(redacted) == []


def test_a_backslash_newline_splice_does_not_hide_the_value() -> None:
    text = "export NGC_API_KEY=nvk-first-\\\nsecond-half && run\n"
    assert lint_script(text) == [SecretFinding(1, "NGC_API_KEY", "assignment")]
    redacted = redact_text(text)
    assert "second-half" not in redacted
    assert "nvk-first" not in redacted
    assert redacted.endswith(" && run\n")


@pytest.mark.parametrize("line", [p[0] for p in POSITIVE] + [s[0] for s in STRICTER])
def test_redacted_text_lints_clean_and_redacting_twice_changes_nothing(line: str) -> None:
    once = redact_text(line)
    assert lint_script(once) == []
    assert redact_text(once) == once


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(lambda s: s, id="plain"),
        pytest.param(lambda s: base64.b64encode(s.encode()).decode(), id="base64"),
        pytest.param(lambda s: base64.urlsafe_b64encode(s.encode()).decode().rstrip("="), id="base64url"),
        pytest.param(lambda s: urllib.parse.quote(s, safe=""), id="url-encoded"),
        pytest.param(lambda s: json.dumps(s)[1:-1], id="json-escaped"),
    ],
)
def test_a_known_secret_is_redacted_in_its_encoded_forms(form: Any) -> None:
    secret = 'p@ss"w0rd $(x) &;|'
    shown = form(secret)
    assert shown not in redact_text(f"log: {shown} end", [secret])


# --- a private key printed over many lines, redacted line by line (issue 32, item 9) ------------------

PEM_END = "-----END " + "RSA PRIVATE KEY-----"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param(
            ["before", PEM_BEGIN, "MIIEowIBAAKCAQEA", "x9Zq/body==", PEM_END, "after"],
            ["before", REDACTED, REDACTED, REDACTED, REDACTED, "after"],
            id="block",
        ),
        pytest.param(
            ["key: " + PEM_BEGIN, "MIIEowIBAAKCAQEA", PEM_END + " done"],
            ["key: " + REDACTED, REDACTED, REDACTED + " done"],
            id="text-around-the-block",
        ),
        pytest.param([PEM_BEGIN + "MIIE" + PEM_END, "after"], [REDACTED, "after"], id="one-line-block"),
        pytest.param([PEM_BEGIN, "MIIEowIBAAKCAQEA", "plain words"], [REDACTED] * 3, id="never-ends"),
        pytest.param(
            [PEM_BEGIN, "body1", PEM_END + PEM_BEGIN, "body2", PEM_END, "x"],
            [REDACTED, REDACTED, REDACTED + REDACTED, REDACTED, REDACTED, "x"],
            id="two-blocks",
        ),
        pytest.param(
            ["-----BEGIN " + "OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXk", "-----END " + "OPENSSH PRIVATE KEY-----"],
            [REDACTED] * 3,
            id="openssh",
        ),
        pytest.param(
            ["-----BEGIN CERTIFICATE-----", "MIIC", "-----END CERTIFICATE-----"],
            ["-----BEGIN CERTIFICATE-----", "MIIC", "-----END CERTIFICATE-----"],
            id="certificate-is-public",
        ),
        pytest.param(
            [PEM_BEGIN, "MIIE", PEM_END + " token " + GHP],
            [REDACTED, REDACTED, REDACTED + " token " + REDACTED],
            id="pattern-after-the-end",
        ),
    ],
)
def test_redact_chunk_redacts_a_private_key_spread_over_lines(lines: list[str], expected: list[str]) -> None:
    shown, state = [], KeyBlock.OUTSIDE
    for line in lines:
        text, state = redact_chunk(line, (), state)
        shown.append(text)
    assert shown == expected
    assert redact_chunk("\n".join(lines)) == ("\n".join(expected), state)  # one piece: the same
    assert redact_chunk(lines[0])[0] == redact_text(lines[0])  # one line alone: as redact_text


# ---------------------------------------------------------------------- a key block read in pieces, from anywhere

# A realistic key body: 24 rows of 64 base64 characters and a short last row (8, padded).
KEY_ROWS = textwrap.wrap(base64.b64encode(random.Random(41).randbytes(1157)).decode(), 64)
ROW, ROW2, LAST = KEY_ROWS[0], KEY_ROWS[1], KEY_ROWS[-1]
KEY_TEXT = "\n".join(["epoch 1 loss=0.5", f"key: {PEM_BEGIN}", *KEY_ROWS, f"{PEM_END} ok", "done", "epoch 2", ""])
UNKNOWN, AFTER_TEXT = KeyBlock.UNKNOWN, KeyBlock.UNKNOWN_AFTER_TEXT
OUTSIDE, INSIDE = KeyBlock.OUTSIDE, KeyBlock.INSIDE


@pytest.mark.parametrize(
    ("lines", "start", "expected", "end"),
    [
        pytest.param(
            [ROW, ROW2, LAST, PEM_END + " ok", "after"],
            UNKNOWN,
            [withheld_note(3), REDACTED + " ok", "after"],
            OUTSIDE,
            id="unknown-rows-then-the-end",
        ),
        pytest.param(
            ["x9Z", ROW, "epoch 3 loss=0.1"],
            UNKNOWN,
            [withheld_note(2), "epoch 3 loss=0.1"],
            AFTER_TEXT,
            id="unknown-a-cut-row-first-however-short",
        ),
        pytest.param([ROW, LAST], UNKNOWN, [withheld_note(2)], UNKNOWN, id="unknown-the-short-last-row"),
        pytest.param(
            [ROW, "", LAST], UNKNOWN, [withheld_note(1), "", withheld_note(1)], UNKNOWN, id="unknown-blank-keeps-it"
        ),
        pytest.param(
            ["epoch 3 loss=0.1", "done", "[rank0] ok."],
            UNKNOWN,
            ["epoch 3 loss=0.1", "done", "[rank0] ok."],
            AFTER_TEXT,
            id="unknown-text-shows",
        ),
        pytest.param(["done"], AFTER_TEXT, ["done"], AFTER_TEXT, id="after-text-a-short-word-shows"),
        pytest.param(
            ["0: epoch 3", f"1: {ROW}", f" 1: {LAST}", "0: epoch 4"],
            AFTER_TEXT,
            ["0: epoch 3", withheld_note(2), "0: epoch 4"],
            AFTER_TEXT,
            id="multi-node-rows-carry-their-rank",
        ),
        pytest.param(["done"], UNKNOWN, [withheld_note(1)], UNKNOWN, id="unknown-a-short-word-first-is-withheld"),
        pytest.param(
            ["epoch 3", ROW, LAST, "epoch 4"],
            AFTER_TEXT,
            ["epoch 3", withheld_note(2), "epoch 4"],
            AFTER_TEXT,
            id="after-text-a-whole-row",
        ),
        pytest.param(
            ["epoch 3", PEM_BEGIN, ROW, PEM_END, ROW],
            UNKNOWN,
            ["epoch 3", REDACTED, REDACTED, REDACTED, ROW],
            OUTSIDE,
            id="unknown-a-begin-makes-it-known",
        ),
        pytest.param(
            ["Proc-Type: 4,ENCRYPTED", "DEK-Info: AES-128-CBC,0123ABCD", "", ROW, LAST, PEM_END],
            UNKNOWN,
            ["Proc-Type: 4,ENCRYPTED", "DEK-Info: AES-128-CBC,0123ABCD", "", withheld_note(2), REDACTED],
            OUTSIDE,
            id="unknown-encrypted-key-headers",
        ),
        pytest.param(
            ["RSA PRIVATE KEY-----", ROW, LAST, "-----END RSA PRIV"],
            UNKNOWN,
            ["RSA PRIVATE KEY-----", withheld_note(2), "-----END RSA PRIV"],
            AFTER_TEXT,
            id="unknown-cut-marker-lines",
        ),
        pytest.param(
            [PEM_BEGIN + "MIIE" + PEM_END + " x", ROW],
            UNKNOWN,
            [REDACTED + " x", ROW],
            OUTSIDE,
            id="unknown-a-one-line-block-makes-it-known",
        ),
        pytest.param(["token " + GHP], UNKNOWN, ["token " + REDACTED], AFTER_TEXT, id="unknown-patterns-redacted"),
        pytest.param(
            [f"x{ROW2}{PEM_END} ok"], OUTSIDE, [REDACTED + " ok"], OUTSIDE, id="outside-a-stray-end-ends-a-block"
        ),
        pytest.param([ROW, "done"], OUTSIDE, [ROW, "done"], OUTSIDE, id="outside-base64-shows"),
        pytest.param(
            [ROW, LAST, PEM_END + " ok", ROW],
            INSIDE,
            [REDACTED, REDACTED, REDACTED + " ok", ROW],
            OUTSIDE,
            id="inside-to-the-end",
        ),
    ],
)
def test_redact_chunk_from_each_state(lines: list[str], start: KeyBlock, expected: list[str], end: KeyBlock) -> None:
    """Each state a piece can start in: what is withheld (a run of rows: one note), shown, and where it ends."""
    assert redact_chunk("\n".join(lines), (), start) == ("\n".join(expected), end)


def _leaked(shown: str) -> list[str]:
    """The lines of ``shown`` that are a key row or a piece of one."""
    return [line for line in shown.split("\n") if line.strip() and any(line.strip() in row for row in KEY_ROWS)]


@pytest.mark.parametrize("cut", range(len(KEY_TEXT)))
def test_a_piece_read_from_anywhere_shows_no_piece_of_a_key(cut: int) -> None:
    """A piece read from any offset without the state before it (after skipped bytes, a restart, a log tail):
    no row of the key and no piece of one shows, however the offset cuts a row or a marker line; the lines after
    the block do (as the text before it when read whole)."""
    shown, end = redact_chunk(KEY_TEXT[cut:], (), key_block_at(cut))
    assert _leaked(shown) == []
    assert not any(row in shown for row in KEY_ROWS)
    if cut <= KEY_TEXT.index("epoch 2"):
        assert "epoch 2" in shown.split("\n")
    if PEM_END in KEY_TEXT[cut:]:
        assert end is OUTSIDE
    assert end is not INSIDE


@pytest.mark.parametrize("cut", [index + 1 for index, char in enumerate(KEY_TEXT) if char == "\n"])
def test_pieces_cut_between_lines_with_the_state_carried_read_as_one(cut: int) -> None:
    """Pieces that follow each other, each started with the state the one before returned, read as the whole text."""
    first, state = redact_chunk(KEY_TEXT[: cut - 1], (), OUTSIDE)
    second, state = redact_chunk(KEY_TEXT[cut:], (), state)
    assert (f"{first}\n{second}", state) == redact_chunk(KEY_TEXT, (), OUTSIDE)
    assert _leaked(f"{first}\n{second}") == []
