"""Secret lint and redaction: one set of rules for finding literal credential material.

What counts as literal credential material:

- an assignment (``NAME=value``, ``export NAME=value``, ``name='value'`` in a command, ``?name=``
  in a URL), a ``--name value`` / ``--name=value`` option (also as two items of a list,
  ``["--token", "X"]``) or a ``name: value`` mapping (YAML, JSON) whose name is credential-named
  (:func:`is_secret_name`) and whose value is a literal, also when only part of it is quoted
  (``NGC_API_KEY=nvapi-"X"``) or a backslash-newline splices it;
- a literal default in a parameter expansion of a credential-named variable (``${NGC_API_KEY:-X}``);
- a name/value environment entry whose name is credential-named and whose value is a literal, in
  block YAML (``- name: NGC_API_KEY`` then ``value: X``), flow YAML or JSON (``{"name": ..., "value": ...}``);
  ``value: $(VAR)`` is a reference;
- a registry password given on the command line: ``docker login -p X`` / ``-pX`` (also podman,
  nerdctl, buildah, skopeo, helm registry, oras);
- well-known token shapes anywhere: GitHub (``ghp_`` ..., ``github_pat_``), Hugging Face (``hf_``),
  AWS access key ids (``AKIA``/``ASIA``), Slack (``xox?-``), ``sk-`` API keys, NVIDIA ``nvapi-``
  keys, JWTs, ``Bearer``/``Basic`` credentials and PEM private keys;
- a password in a URL (``https://user:pass@host``) and presigned URL signatures
  (``X-Amz-Signature=``, ``X-Goog-Signature=``, ``Signature=``, Azure SAS ``sig=``).

Not secrets: references (``$HF_TOKEN``, ``${NGC_API_KEY}``, ``"$PASSWORD"``, ``$(cat file)``) and
the redaction placeholder :data:`REDACTED` itself (it reads as a reference, so redacted text lints
clean and redacting twice changes nothing),
empty values, the words ``true false yes no on off none null 0 1`` and the HTTP auth schemes
``Bearer``/``Basic`` (the credential after them is a pattern of its own), and names that describe a
secret rather than hold it: the last word of the name decides, so ``PASSWORD_FILE=/path``,
``HF_TOKEN_PATH``, ``--token-file path``, ``TOKENIZERS_PARALLELISM`` and ``max_new_tokens`` are
not credential-named. A single-quoted value is a literal even if it starts with ``$``.
"""

from __future__ import annotations

import base64
import enum
import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, quote_plus

from airflow_provider_tao_slurm.core.shell import quote as shell_quote
from airflow_provider_tao_slurm.exceptions import SecretLeakError

#: What a secret is replaced with: a reference to an unset variable, never a literal.
REDACTED = "${REDACTED}"
MIN_SECRET_LENGTH = 4

# The last word of a name (split on '_', '-', '.' and camelCase) that makes it credential-named.
_SECRET_WORDS = frozenset(
    {"TOKEN", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "SECRET", "APIKEY", "PAT", "AUTHORIZATION", "COOKIE"}
)
_SECRET_SUFFIXES = ("TOKEN", "PASSWORD", "SECRET", "APIKEY")
# "KEY" only counts after one of these words (API_KEY, NGC_API_KEY, AWS_SECRET_ACCESS_KEY, ...).
_KEY_QUALIFIERS = frozenset({"API", "ACCESS", "SECRET", "PRIVATE", "ACCOUNT", "SIGNING", "AUTH", "NGC"})
# Values that are never the secret: flags, and HTTP auth schemes (the credential after the scheme
# is matched by the "bearer token" and "basic auth" patterns).
_NOT_SECRET_VALUES = frozenset(
    {"", "true", "false", "yes", "no", "on", "off", "none", "null", "0", "1", "bearer", "basic"}
)

# A value: one quoted string, or a shell word that starts unquoted and may go on with quoted parts.
_VALUE = r"""(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s;&|()<>`"']+(?:(?:"[^"\n]*"|'[^'\n]*')[^\s;&|()<>`"']*)*)"""
_BOUNDARY = r"""(?<![^\s;&|(`{"',?])"""
# NAME=value (shell, kwargs, URL query), --name value / --name=value, and name: value (YAML, JSON).
_NAMED_VALUES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("assignment", re.compile(_BOUNDARY + r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)=" + _VALUE)),
    ("option", re.compile(_BOUNDARY + r"(?P<name>--[A-Za-z][A-Za-z0-9_-]*)(?:=|[ \t]+)(?!-)" + _VALUE)),
    (
        "mapping",
        re.compile(
            _BOUNDARY + r"""(?<!\$\{)["']?(?P<name>[A-Za-z_][A-Za-z0-9_-]*)["']?[ \t]*:(?![-?+=])[ \t]*""" + _VALUE
        ),
    ),
    # ["--token", "X"] and [--token, X]: an option and its value as two items of a list.
    ("option", re.compile(r"""(?P<q>["']?)(?P<name>--[A-Za-z][A-Za-z0-9_-]*)(?P=q)[ \t]*,[ \t]*""" + _VALUE)),
    # ${NAME:-default} / ${NAME-default} / ${NAME:=default}: the default is a literal unless it is a reference.
    ("default", re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):?[-=](?P<value>[^}\s]+)\}")),
    # {name: X, value: Y} (flow YAML, JSON) in an env list.
    (
        "env-list",
        re.compile(
            r"""\{[ \t]*["']?name["']?[ \t]*:[ \t]*["']?(?P<name>[A-Za-z_][A-Za-z0-9_]*)["']?[ \t]*,[ \t]*"""
            r"""["']?value["']?[ \t]*:[ \t]*""" + _VALUE
        ),
    ),
    # {value: Y, name: X}: the same entry with the value first.
    (
        "env-list",
        re.compile(
            r"""\{[ \t]*["']?value["']?[ \t]*:[ \t]*""" + _VALUE + r"""[ \t]*,[ \t]*"""
            r"""["']?name["']?[ \t]*:[ \t]*["']?(?P<name>[A-Za-z_][A-Za-z0-9_]*)["']?[ \t]*[,}]"""
        ),
    ),
    # docker login -u U -p X / -pX (and the other registry clients).
    (
        "option",
        re.compile(
            r"\b(?:docker|podman|nerdctl|buildah|skopeo|oras|helm[ \t]+registry)[ \t]+login\b[^\n;|&]*?[ \t]"
            r"(?P<name>-p)(?:[ \t]+|=)?(?!-)" + _VALUE
        ),
    ),
)
# Rules whose name is a credential by where it stands (``-p`` of a registry login), not by its words.
_CONTEXT_NAMES = frozenset({"-p"})
# Block YAML env lists: "- name: NGC_API_KEY" and, on one of the next lines, "value: X".
_ENV_NAME_LINE = re.compile(
    r"""^(?P<indent>[ \t]*)-[ \t]+name[ \t]*:[ \t]*["']?(?P<name>[A-Za-z_][A-Za-z0-9_]*)["']?[ \t]*$"""
)
_ENV_VALUE_LINE = re.compile(r"""^[ \t]+value[ \t]*:[ \t]*""" + _VALUE)
_SPLICE = "\\\n"
_PEM_BLOCK = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)")
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")
# A line that may be a row of a private key's base64 body (PEM, OpenSSH): base64 characters only, padding last.
#: The rank ``srun --label`` puts before each line of a multi-node job (``0: ``, `` 1: ``).
_RANK_LABEL = re.compile(r"^ *\d+: ")
_KEY_ROW = re.compile(r"[A-Za-z0-9+/]*={0,2}")  # the line is stripped, and not blank
#: Shortest line taken for a whole row of a key's body where the key block is not known (rows are 64 or 70).
MIN_KEY_ROW_CHARS = 16

# (kind, name, pattern): the named group "s", when present, is the secret part of the match.
_PATTERNS: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("token", "github token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("token", "hugging face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("token", "aws access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("token", "slack token", re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}")),
    ("token", "sk- api key", re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}")),
    ("token", "nvidia api key", re.compile(r"\bnvapi-[A-Za-z0-9_-]{20,}")),
    ("token", "jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")),
    ("token", "bearer token", re.compile(r"(?i)\bbearer\s+(?P<s>[A-Za-z0-9._~+/-]{16,}=*)")),
    ("token", "basic auth", re.compile(r"(?i)\bbasic\s+(?P<s>[A-Za-z0-9+/]{12,}={0,2})(?![A-Za-z0-9+/=_-])")),
    ("private-key", "private key", _PEM_BEGIN),
    ("url-userinfo", "url password", re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]+:(?P<s>[^\s/@]+)@")),
    (
        "presigned-url",
        "url signature",
        re.compile(r"(?i)[?&](?:X-Amz-Signature|X-Goog-Signature|Signature|sig)=(?P<s>[^&\s\"'#]+)"),
    ),
)


class SecretFinding(NamedTuple):
    """Where literal credential material was found; never holds the value.

    :param line: 1-based line number.
    :param name: the variable or option name, or the token kind (e.g. ``github token``).
    :param kind: ``assignment``, ``option``, ``mapping`` (``name: value``), ``token``,
        ``private-key``, ``url-userinfo`` or ``presigned-url``.
    """

    line: int
    name: str
    kind: str


def is_secret_name(name: str) -> bool:
    """Return whether ``name`` (variable, option, dict key or header) names a credential.

    The last word decides: ``HF_TOKEN``, ``db_password``, ``NGC_API_KEY``, ``--api-key``,
    ``accessToken`` and ``Authorization`` are credential-named; ``PASSWORD_FILE``,
    ``TOKENIZERS_PARALLELISM``, ``max_new_tokens`` and ``--token-file`` are not.

    :param name: the name, in any case; leading dashes are ignored.
    """
    spaced = re.sub(r"([a-z0-9])([A-Z])|([A-Z])([A-Z][a-z])", r"\1\3_\2\4", name)
    words = [word for word in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if word]
    if not words:
        return False
    last = words[-1]
    if last in _SECRET_WORDS or last.endswith(_SECRET_SUFFIXES):
        return True
    return last == "KEY" and len(words) > 1 and words[-2] in _KEY_QUALIFIERS


def lint_script(text: str) -> list[SecretFinding]:
    """Find literal credential material in a script (or any text), by line.

    :param text: the script.
    :returns: the findings in line order, each ``(line, name, kind)``; empty when clean.
    """
    findings = (
        SecretFinding(text.count("\n", 0, start) + 1, name, kind) for name, kind, start, _end in _text_spans(text)
    )
    return sorted(dict.fromkeys(findings), key=lambda finding: finding.line)


def assert_no_secrets(text: str, where: str) -> None:
    """Refuse text that holds literal credential material.

    :param text: the text that is about to be written or sent.
    :param where: what the text is, for the message (e.g. ``sbatch script``).
    :raises SecretLeakError: naming every ``line (name)``, never a value.
    """
    pairs = list(dict.fromkeys((finding.line, finding.name) for finding in lint_script(text)))
    if pairs:
        listed = ", ".join(f"line {line} ({name})" for line, name in pairs)
        raise SecretLeakError(
            f"literal credential material in {where}: {listed}; pass it through secret_env instead", pairs
        )


def sidecar_text(secrets: Mapping[str, str]) -> str:
    """Return the mode-600 sidecar a job's batch script sources: one ``export NAME='value'`` line per secret.

    :param secrets: ``{variable name: resolved value}``.
    :returns: the file's text (values shell-quoted), names in order.
    """
    return "".join(f"export {name}={shell_quote(value)}\n" for name, value in sorted(secrets.items()))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace secret values and everything :func:`lint_script` would flag with :data:`REDACTED`.

    :param text: any text (log output, messages, command lines).
    :param secrets: known secret values; each one of at least ``MIN_SECRET_LENGTH`` characters is
        replaced wherever it occurs, also base64-, URL- and JSON-encoded, longest first (shorter
        values would mangle ordinary text).
    :returns: the redacted text; redacting it again changes nothing.
    """
    forms = {form for secret in secrets if len(secret) >= MIN_SECRET_LENGTH for form in _encoded_forms(secret)}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    text = _PEM_BLOCK.sub(REDACTED, text)
    pieces: list[str] = []
    position = 0
    for start, end in sorted((start, end) for _name, _kind, start, end in _text_spans(text)):
        if start >= position:
            pieces += [text[position:start], REDACTED]
        position = max(position, end)
    pieces.append(text[position:])
    return "".join(pieces)


class KeyBlock(enum.Enum):
    """Where a text read piece by piece stands with respect to a private key block, between two pieces.

    A piece of a log read from an offset inherits the state of the piece before it only when it starts
    exactly where that piece ended. Anywhere else (after skipped bytes, a triggerer restart that lost the
    in-memory state, a log tail, any read from the middle of a file) the state is :attr:`UNKNOWN`: see
    :func:`key_block_at`.
    """

    #: Outside any block: the start of a file, or after a block's ``END``.
    OUTSIDE = "outside"
    #: Inside a block whose ``BEGIN`` was read and whose ``END`` was not yet.
    INSIDE = "inside"
    #: Not known, and the next line may be the rest of a key row (the start of a piece read from the
    #: middle of a file, which may be the middle of a line, or right after a withheld row): any
    #: base64-only line is withheld.
    UNKNOWN = "unknown"
    #: Not known, after a line that was shown: a line that may be a whole key row
    #: (:data:`MIN_KEY_ROW_CHARS` base64 characters or more, nothing else) is withheld.
    UNKNOWN_AFTER_TEXT = "unknown-after-text"


def key_block_at(offset: int) -> KeyBlock:
    """Return the state at ``offset`` of a file when nothing before it was read: outside at 0, else unknown."""
    return KeyBlock.OUTSIDE if offset == 0 else KeyBlock.UNKNOWN


def withheld_note(count: int) -> str:
    """Return the line that stands for ``count`` withheld lines (they may be a private key's body)."""
    lines = "1 line" if count == 1 else f"{count} lines"
    return (
        f"{REDACTED} ({lines} withheld: read without the start of the private key block they may belong to; "
        "the log file keeps them)"
    )


def redact_chunk(text: str, secrets: Iterable[str] = (), state: KeyBlock = KeyBlock.OUTSIDE) -> tuple[str, KeyBlock]:
    """Redact one piece of a text read in pieces (a log read from an offset), as :func:`redact_text`, line by line.

    The one redaction of job output read in pieces: live lines, poll after poll, and every log tail.
    Private key blocks (``-----BEGIN ... PRIVATE KEY-----`` to ``-----END ... PRIVATE KEY-----``) are
    redacted across lines and across pieces, and correctness never depends on the state remembered from
    the piece before:

    - :attr:`KeyBlock.OUTSIDE` (a file's start, or a piece that starts where a known-outside piece
      ended): every line from a ``BEGIN`` on is :data:`REDACTED` up to its ``END``, of which only what
      follows the ``END`` is shown; a block that never ends redacts the rest, as :func:`redact_text` does.
    - :attr:`KeyBlock.INSIDE`: as if the ``BEGIN`` were just before the piece.
    - :attr:`KeyBlock.UNKNOWN` (a piece read from the middle of a file with no state: after skipped
      bytes, after a triggerer restart, a tail): a line may be part of a key block whose ``BEGIN`` was
      not read. Such a block's secret is its base64 body, so every line that may be a row of it
      (base64 characters only; :data:`MIN_KEY_ROW_CHARS` of them or more, or any number for the first
      line of the piece, which may be the rest of a cut row, and for a line right after a withheld one,
      which may be a block's short last row) is withheld; each run of withheld lines is replaced by one
      :func:`withheld_note` line, never dropped silently. Other lines (which cannot be a key's body)
      are redacted and shown. The first ``BEGIN`` or ``END`` makes the state known again.

    In every state, the text of a line before an ``END`` that no ``BEGIN`` on the line opened is
    redacted: it can only be the end of a block.

    :param text: the piece: lines separated by newlines.
    :param secrets: known secret values, as for :func:`redact_text`.
    :param state: the state where the piece starts: the state the piece before it returned when that
        piece ended with a whole line and this one starts right after it; else (this piece starts
        elsewhere, or may start in the middle of a line, even of a ``BEGIN`` line) :func:`key_block_at`
        its offset.
    :returns: the redacted piece (as many lines, less those withheld beyond one per run), and the state
        where it ends (pass it with the next piece).
    """
    secrets = tuple(secrets)
    shown: list[str] = []
    run = -1  # index in shown of the note of the current run of withheld lines; -1: no run
    counts: dict[int, int] = {}
    for line in text.split("\n"):
        text_line, state = _redact_line(line, secrets, state)
        if text_line is not None:
            shown.append(text_line)
            run = -1
            continue
        if run < 0:
            run = len(shown)
            shown.append("")
        counts[run] = counts.get(run, 0) + 1
    for index, count in counts.items():
        shown[index] = withheld_note(count)
    return "\n".join(shown), state


def _redact_line(line: str, secrets: tuple[str, ...], state: KeyBlock) -> tuple[str | None, KeyBlock]:
    """Redact one line in ``state``; return it (None: withheld) and the state after it."""
    shown = ""
    end = _PEM_END.search(line)
    if state is KeyBlock.INSIDE:
        if end is None:
            return REDACTED, KeyBlock.INSIDE
    else:
        begin = _PEM_BEGIN.search(line)
        if begin is not None and (end is None or begin.start() < end.start()):
            end = None  # the block opens on this line: redact_text takes it from its BEGIN
        elif end is None:
            if not line.strip():
                return line, state  # a blank line tells nothing
            if state is not KeyBlock.OUTSIDE and _may_be_key_row(line, state is KeyBlock.UNKNOWN):
                return None, KeyBlock.UNKNOWN
            after = KeyBlock.OUTSIDE if state is KeyBlock.OUTSIDE else KeyBlock.UNKNOWN_AFTER_TEXT
            return redact_text(line, secrets), after
    if end is not None:
        shown, line = REDACTED, line[end.end() :]
    still_open = any(_PEM_END.search(match.group()) is None for match in _PEM_BLOCK.finditer(line))
    return shown + redact_text(line, secrets), KeyBlock.INSIDE if still_open else KeyBlock.OUTSIDE


def _may_be_key_row(line: str, any_length: bool) -> bool:
    """Tell whether ``line`` may be a row of a private key's base64 body (any length, or a whole row's).

    A multi-node job's lines carry their rank (``srun --label``: ``0: ``), which is not part of the row.
    """
    word = _RANK_LABEL.sub("", line, count=1).strip()
    return _KEY_ROW.fullmatch(word) is not None and (any_length or len(word) >= MIN_KEY_ROW_CHARS)


@functools.lru_cache(maxsize=256)
def _encoded_forms(secret: str) -> frozenset[str]:
    """Return the secret and the forms it takes when a program encodes it (base64, URL, JSON string).

    Cached: a live stream redacts every line with the same few secrets.
    """
    raw = secret.encode()
    forms = {
        secret,
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
        json.dumps(secret)[1:-1],
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }
    return frozenset(form for form in forms if len(form) >= MIN_SECRET_LENGTH)


def redact_obj(obj: Any, secrets: Iterable[str] = ()) -> Any:
    """Return a copy of ``obj`` with every string redacted by :func:`redact_text`.

    Dicts, lists and tuples are walked; dict keys are kept, but the value of a credential-named
    key (:func:`is_secret_name`) is replaced by :data:`REDACTED` unless it is ``None`` or empty.

    :param obj: a JSON-like value.
    :param secrets: known secret values, as for :func:`redact_text`.
    :returns: the redacted copy; other values are returned unchanged.
    """
    return _redact(obj, tuple(secrets))


def _redact(obj: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    if isinstance(obj, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and is_secret_name(key) and value not in (None, "")
            else _redact(value, secrets)
            for key, value in obj.items()
        }
    if isinstance(obj, list):
        return [_redact(item, secrets) for item in obj]
    if isinstance(obj, tuple):
        return tuple(_redact(item, secrets) for item in obj)
    return obj


def _text_spans(text: str) -> Iterator[tuple[str, str, int, int]]:
    """Yield ``(name, kind, start, end)`` for each piece of literal credential material in ``text``.

    Lines joined by a backslash-newline are read as one; a span that crosses the splice covers it.
    """
    where: Sequence[int] = range(len(text))
    logical = text
    if _SPLICE in text:  # most text has no splice: no map of its characters
        where, logical = _unspliced(text)
    offset = 0
    lines = logical.splitlines(keepends=True)
    for number, line in enumerate(lines):
        for name, kind, start, end in [*_secret_spans(line), *_env_block_spans(lines, number)]:
            yield name, kind, where[offset + start], where[offset + end - 1] + 1
        offset += len(line)


def _unspliced(text: str) -> tuple[list[int], str]:
    """Return where each character of ``text`` without its backslash-newline splices came from, and that text."""
    where: list[int] = []
    start = 0
    for piece in text.split(_SPLICE):  # splices never overlap: the second character is no backslash
        where += range(start, start + len(piece))
        start += len(piece) + len(_SPLICE)
    return where, text.replace(_SPLICE, "")


def _env_block_spans(lines: list[str], number: int) -> Iterator[tuple[str, str, int, int]]:
    """Yield the literal ``value:`` of a block-YAML env entry whose credential-named ``- name:`` is above ``number``."""
    match = _ENV_VALUE_LINE.match(lines[number])
    if match is None:
        return
    for above in range(number - 1, max(number - 4, -1), -1):
        named = _ENV_NAME_LINE.match(lines[above].rstrip("\n"))
        if named is not None:
            start, end = _literal_span(match)
            if start < end and is_secret_name(named.group("name")):
                yield named.group("name"), "env-list", start, end
            return
        if lines[above].lstrip().startswith("-"):
            return


def _secret_spans(line: str) -> Iterator[tuple[str, str, int, int]]:
    """Yield ``(name, kind, start, end)`` for each piece of literal credential material in ``line``."""
    for kind, pattern in _NAMED_VALUES:
        for match in pattern.finditer(line):
            start, end = _literal_span(match)
            name = match.group("name")
            if start < end and (name in _CONTEXT_NAMES or is_secret_name(name)):
                yield name, kind, start, end
    for kind, name, pattern in _PATTERNS:
        for match in pattern.finditer(line):
            group = "s" if "s" in pattern.groupindex else 0
            if not match.group(group).startswith("$"):
                yield name, kind, match.start(group), match.end(group)


def _literal_span(match: re.Match[str]) -> tuple[int, int]:
    """Return the span of the literal value inside any quotes; an empty span if it is no literal."""
    value = match.group("value")
    start, end = match.span("value")
    whole = len(value) >= 2 and value[0] in "'\"" and value[-1] == value[0] and value[0] not in value[1:-1]
    if whole:
        value, start, end = value[1:-1], start + 1, end - 1
    is_reference = match.group("value")[0] != "'" and value[:1] in ("$", "`")
    if is_reference or value == REDACTED or value.lower() in _NOT_SECRET_VALUES:
        return start, start
    return start, end
