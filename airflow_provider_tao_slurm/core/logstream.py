"""Live job logs: read what many jobs appended to their logs in one command, and make task-log lines of it.

Pure: :func:`tail_script` builds one POSIX shell script (sent over stdin, so a thousand paths never
reach argv) that reads, for every watched file, the bytes appended since an offset;
:func:`parse_tail_output` reads its framed answer; a :class:`LineStream` per file turns the bytes
into bounded, redacted, unforgeable lines (:func:`line_streams` builds them from the descriptions a
trigger serializes, :func:`shown_offsets` says what they showed), :func:`progress_line` turns a TAO
``status.json`` entry into a readable one, and :func:`show_lines` logs lines a few per record.

Offsets survive a triggerer restart: the script writes each file's new offset to a small cursor
file beside the logs, and a stream that starts without an offset reads it from there. A job that
writes more than the per-poll budget has the excess skipped (the stream says how many bytes), so it
cannot starve the other jobs of the same poll.
"""

from __future__ import annotations

import json
import re
import secrets as _random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, AnyStr, Generic, Protocol

from airflow_provider_tao_slurm.core.defaults import DEFAULT_BYTES_PER_POLL
from airflow_provider_tao_slurm.core.secrets import KeyBlock, key_block_at, redact_chunk
from airflow_provider_tao_slurm.core.shell import quote
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, ValidationError

#: Longest line shown, in characters; a longer one is cut and says how much was cut.
MAX_LINE_CHARS = 2000
#: A line still unfinished after this many bytes is shown (cut) rather than held back.
MAX_PENDING_BYTES = 8 * MAX_LINE_CHARS
#: Most characters of live lines in one log record (:func:`show_lines`); more go into the next record.
MAX_RECORD_CHARS = 64 * 1024
#: Label of the TAO progress stream (``status.json``).
PROGRESS = "status.json"

_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
_ESCAPE = re.compile(r"\x1b[@-_]?")
#: C0/C1 controls (tab kept), line/paragraph separators and bidi overrides (which can make text read backwards).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

#: Files per ``stat`` call (keeps each call's argv far below the kernel's limits).
STAT_BATCH = 500

#: The reader, defined once per script: ``_t INDEX FILE OFFSET|- MAX_BYTES CURSOR|-``. It runs in a
#: block reading ``stat``'s ``SIZE NAME`` lines (in request order, missing files left out) from
#: stdin, current line in ``$l``; an unchanged file costs no process at all.
_READER = r"""_t() {
  o=$3
  if [ "$o" = - ]; then
    o=0; if [ "$5" != - ]; then { read -r o < "$5"; } 2>/dev/null || :; fi
    case $o in ''|*[!0-9]*) o=0;; esac
  fi
  s=
  if [ "${l#* }" = "$2" ]; then s=${l%% *}; IFS= read -r l || l=; fi
  if [ -z "$s" ] || [ ! -f "$2" ]; then printf '@@tail %s %s MISSING\n' "$N" "$1"; return 0; fi
  if [ "$s" -lt "$o" ]; then o=0; fi
  n=$((s - o)); k=0
  if [ "$n" -gt "$4" ]; then k=$((n - $4)); n=$4; fi
  printf '@@tail %s %s OFFSET %s SKIP %s\n' "$N" "$1" "$o" "$k"
  if [ "$n" -gt 0 ]; then dd if="$2" iflag=skip_bytes,count_bytes skip=$((o + k)) count="$n" bs=65536 status=none; fi
  printf '\n@@end %s %s\n' "$N" "$1"
  e=$((o + k + n))
  if [ "$5" != - ] && [ "$e" != "$3" ]; then
    { printf '%s\n' "$e" > "$5.$N" && mv -f -- "$5.$N" "$5"; } 2>/dev/null
  fi
  return 0
}
"""


#: Gathers the script's answer into 64 KiB writes: each ``printf`` and ``dd`` of :data:`_READER` would
#: otherwise be its own write, hence its own SSH packet (thousands per poll, each one decrypted and
#: verified by the triggerer's SSH client); the answer is read whole anyway.
_COALESCE = "dd ibs=65536 obs=65536 status=none"


@dataclass(frozen=True)
class TailRequest:
    """One file to read.

    :param path: absolute path of the file.
    :param offset: bytes already shown; ``None`` resumes from ``cursor_path`` (0 when there is none).
    :param max_bytes: the most bytes to read this time; what is beyond is skipped.
    :param cursor_path: absolute path of the file that keeps the offset between polls and restarts.
    """

    path: str
    offset: int | None
    max_bytes: int
    cursor_path: str | None = None


#: ``data`` of a chunk built without it (a missing file's): no bytes.
_NO_DATA: Any = b""


@dataclass(frozen=True)
class TailChunk(Generic[AnyStr]):
    """A bounded piece of a remote file read from a byte offset: the one chunk type of every log reader.

    Two readers fill it, each with what its command reports (the rest keep their defaults):

    - the batched reader (:func:`parse_tail_output`, ``SlurmHook.tail_many``) reads bytes:
      ``missing``, ``offset``, ``skipped`` and ``data``;
    - the single read (``SlurmHook.read_log``) decodes text: ``size``, ``data``, ``next_offset`` and
      ``restarted``.

    :attr:`end` is where the next read starts, for either.

    :param missing: the file does not exist (yet).
    :param offset: where reading started (0 after the file was truncated or replaced).
    :param skipped: bytes skipped beyond the per-poll budget.
    :param data: what was read: bytes (batched reader) or UTF-8 text (single read; a character cut at
        the end is left for the next read).
    :param size: the file's size when read (0 when it does not exist).
    :param next_offset: where the next read starts, when the reader says so (``None``: right after ``data``).
    :param restarted: the file shrank (a requeued rerun truncated it) and reading starts again at 0.
    """

    missing: bool = False
    offset: int = 0
    skipped: int = 0
    data: AnyStr = _NO_DATA
    size: int = 0
    next_offset: int | None = None
    restarted: bool = False

    @property
    def end(self) -> int:
        """Where the next read starts."""
        if self.next_offset is not None:
            return self.next_offset
        return self.offset + self.skipped + len(self.data)


def _absolute(path: str, what: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or "\n" in path:
        raise ValidationError(f"{what} must be an absolute path without newlines, not {path!r}")
    return path


def tail_script(requests: Sequence[TailRequest], nonce: str | None = None) -> tuple[str, str]:
    """Return the script reading every request in order, and the nonce that frames its answer.

    Send the script to ``sh -s`` on stdin. Each file's answer is a header
    ``@@tail NONCE I OFFSET O SKIP K`` (or ``@@tail NONCE I MISSING``), the bytes, and a trailer
    ``@@end NONCE I``; the random nonce keeps a job's own output from forging the framing.

    :param requests: the files to read.
    :param nonce: the framing token (random when not given; tests pass one).
    :returns: ``(script, nonce)``.
    :raises ValidationError: for a relative path, a negative offset or a byte budget below 1.
    """
    token = nonce or _random.token_hex(12)
    lines = ["export LC_ALL=C", "umask 077", _READER.rstrip(), f"N={token}"]
    calls: list[tuple[str, str]] = []
    for index, request in enumerate(requests):
        offset = request.offset
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
            raise ValidationError(f"log offset must be a non-negative integer, not {offset!r}")
        budget = request.max_bytes
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValidationError(f"log bytes per poll must be a positive integer, not {budget!r}")
        cursor = _absolute(request.cursor_path, "log cursor path") if request.cursor_path else "-"
        path = quote(_absolute(request.path, "log path"))
        calls.append((path, f"_t {index} {path} {'-' if offset is None else offset} {budget} {quote(cursor)}"))
    lines.append("{")
    for first in range(0, len(calls), STAT_BATCH):
        batch = calls[first : first + STAT_BATCH]
        lines.append(f"stat -L --printf '%s %n\\n' -- {' '.join(path for path, _ in batch)} 2>/dev/null | {{")
        lines.append("IFS= read -r l || l=")
        lines += [call for _, call in batch]
        lines.append("}")
    lines.append(f"}} | {_COALESCE}")
    return "\n".join(lines) + "\n", token


def parse_tail_output(stdout: bytes, count: int, nonce: str) -> list[TailChunk[bytes]]:
    """Read :func:`tail_script`'s answer for ``count`` requests.

    :raises RemoteCommandError: when an answer is missing or malformed (the shell failed half-way).
    """
    token = re.escape(nonce.encode())
    header = re.compile(rb"@@tail " + token + rb" (\d+) (?:MISSING|OFFSET (\d+) SKIP (\d+))\n")
    chunks: list[TailChunk[bytes]] = []
    position = 0
    for index in range(count):
        match = header.match(stdout, position)
        if match is None or int(match.group(1)) != index:
            raise RemoteCommandError(
                f"log read answered {len(chunks)} of {count} file(s); the rest of its output was "
                f"{stdout[position : position + 200]!r}; it is read again next poll"
            )
        if match.group(2) is None:
            chunks.append(TailChunk(missing=True))
            position = match.end()
            continue
        trailer = b"\n@@end " + nonce.encode() + b" " + str(index).encode() + b"\n"
        end = stdout.find(trailer, match.end())
        if end < 0:
            raise RemoteCommandError(f"log read of file {index} has no end marker; it is read again next poll")
        chunks.append(TailChunk(False, int(match.group(2)), int(match.group(3)), stdout[match.end() : end]))
        position = end + len(trailer)
    return chunks


def clean_line(raw: bytes | str, secrets: Iterable[str] = ()) -> str:
    r"""One line of job output made safe for the task log.

    Invalid UTF-8 is replaced; a carriage-return progress bar keeps what a terminal would show
    last; ANSI escapes go; other control characters become ``\ufffd`` (so no line can end a log
    record or start a forged one); secrets are redacted; the line is cut at :data:`MAX_LINE_CHARS`.
    Lines of a stream (where a private key may span lines) are cleaned with :func:`clean_lines`.
    """
    return clean_lines([raw], secrets)[0][0]


def clean_lines(
    raws: Sequence[bytes | str], secrets: Iterable[str] = (), state: KeyBlock = KeyBlock.OUTSIDE
) -> tuple[list[str], KeyBlock]:
    """Lines of a stream of job output, each cleaned as :func:`clean_line`, with private keys redacted across lines.

    Redaction is :func:`~airflow_provider_tao_slurm.core.secrets.redact_chunk`'s, which holds at every
    boundary: pass the state the lines before returned only when these lines follow them directly, else
    :func:`~airflow_provider_tao_slurm.core.secrets.key_block_at` the offset they were read from (lines
    that may be a key's body are then withheld, each run of them replaced by one line that says so).

    :param raws: the lines, without their newlines.
    :param secrets: known secret values.
    :param state: where the lines start with respect to a private key block.
    :returns: the cleaned lines (fewer where lines were withheld), and the state after them.
    """
    if not raws:
        return [], state
    text, state = redact_chunk("\n".join(_clean_text(raw) for raw in raws), secrets, state)
    lines = text.split("\n")
    return [
        f"{line[:MAX_LINE_CHARS]} … [{len(line) - MAX_LINE_CHARS} more characters]"
        if len(line) > MAX_LINE_CHARS
        else line
        for line in lines
    ], state


def _clean_text(raw: bytes | str) -> str:
    """One line decoded, its carriage-return progress reduced to what shows last, escapes and controls gone."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.rstrip("\r")
    if "\r" in text:
        text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
    text = _ESCAPE.sub("", _CSI.sub("", _OSC.sub("", text)))
    return _CONTROL.sub("\ufffd", text)


def progress_line(entry: Mapping[str, Any]) -> str:
    """Render a TAO ``status.json`` entry as one readable line: status, epoch, iteration, loss, KPIs, message."""
    parts: list[str] = []
    if entry.get("status"):
        parts.append(str(entry["status"]))
    for key, limit in (("epoch", "max_epoch"), ("cur_iter", "max_iter")):
        if entry.get(key) is not None:
            name = "epoch" if key == "epoch" else "iteration"
            parts.append(
                f"{name} {entry[key]}/{entry[limit]}" if entry.get(limit) is not None else f"{name} {entry[key]}"
            )
    for key in ("loss", "learning_rate", "time_per_epoch", "eta"):
        if entry.get(key) is not None and not isinstance(entry[key], Mapping | list):
            parts.append(f"{key}={entry[key]}")
    kpi = entry.get("kpi")
    if isinstance(kpi, Mapping):
        parts += [f"{name}={value}" for name, value in kpi.items() if not isinstance(value, Mapping | list)]
    message = entry.get("message")
    text = " ".join(parts)
    if message:
        text = f"{text}: {message}" if text else str(message)
    return text or json.dumps(entry, sort_keys=True)


class InfoLog(Protocol):
    """What :func:`show_lines` logs to: a stdlib logger, or the structlog-style logger of an Airflow task or trigger."""

    def info(self, msg: str, /, *args: Any) -> Any:
        """Log ``msg % args`` at INFO."""


def show_lines(log: InfoLog, lines: Iterable[str]) -> None:
    """Log live lines (cleaned and prefixed ``label | `` by a :class:`LineStream`) in order, a few per record.

    The lines of one read share a record, joined by newlines (the UI shows each on its own line, prefix
    first, under the record's time), up to :data:`MAX_RECORD_CHARS` per record: each record costs the
    log pipeline (the triggerer's especially) far more than its characters do. The trigger, the
    sensor's poke and the sensor's end of log all print live lines with this.
    """
    batch: list[str] = []
    size = 0
    for line in lines:
        if batch and size + len(line) > MAX_RECORD_CHARS:
            log.info("%s", "\n".join(batch))
            batch, size = [], 0
        batch.append(line)
        size += len(line) + 1
    if batch:
        log.info("%s", "\n".join(batch))


@dataclass
class LineStream:
    """One watched file, turned into task-log lines poll after poll.

    :param label: what each line starts with (``main.out``, ``main.err``, ``status.json``).
    :param path: the file.
    :param cursor_path: where the offset is kept between polls and triggerer restarts.
    :param max_bytes: bytes read per poll at most; more is skipped and said.
    :param offset: bytes already shown; ``None`` until the first read (resumed from the cursor).
    :param secrets: values redacted from every line (a private key block the job prints over many lines is
        redacted whole, also across polls: see :func:`clean_lines`).

    Where a private key block stands is carried from one read to the next only when the next read starts
    where the last one ended. A read from anywhere else (the first read of a stream resumed from its
    cursor after a triggerer restart, a read after skipped bytes, a truncated file read again) starts
    from :func:`~airflow_provider_tao_slurm.core.secrets.key_block_at` its offset: outside any block at
    the file's start, unknown elsewhere, where every line that may be a key's body is withheld until a
    ``BEGIN`` or ``END`` line says where the stream stands.
    """

    label: str
    path: str
    cursor_path: str | None = None
    max_bytes: int = DEFAULT_BYTES_PER_POLL
    offset: int | None = None
    secrets: tuple[str, ...] = ()
    _pending: bytes = field(default=b"", repr=False)
    _asked: int = field(default=0, repr=False)
    _key_block: KeyBlock = field(default=KeyBlock.UNKNOWN, repr=False)

    def __post_init__(self) -> None:
        if not _LABEL_RE.fullmatch(self.label):
            raise ValidationError(f"log stream label {self.label!r} must be a short name like 'main.out'")
        _absolute(self.path, "log path")
        if self.cursor_path is not None:
            _absolute(self.cursor_path, "log cursor path")

    def request(self, budget: int | None = None) -> TailRequest:
        """Return what to read next: from the offset, at most ``max_bytes`` (or ``budget`` when smaller)."""
        self._asked = self.max_bytes if budget is None else max(1, min(self.max_bytes, budget))
        return TailRequest(self.path, self.offset, self._asked, self.cursor_path)

    def feed(self, chunk: TailChunk[bytes]) -> list[str]:
        """Take one read; return the complete lines it finished, each starting with ``label | ``."""
        if chunk.missing:
            return []
        notes: list[str] = []
        data = chunk.data
        key_block = self._key_block
        if self.offset is None or chunk.offset != self.offset:  # not where the last read ended
            key_block = key_block_at(chunk.offset)
        if self.offset is not None and chunk.offset < self.offset:
            notes.append(f"{self.path} was truncated or replaced (a requeued run?): showing it again from the start")
            self._pending = b""
        if chunk.skipped:
            notes.append(
                f"… {chunk.skipped} bytes of {self.path} skipped: the job wrote more than "
                f"{self._asked or self.max_bytes} bytes since the last poll; the whole log is in that file"
            )
            self._pending = b""
            cut, _, data = data.partition(b"\n")
            # The first line is cut: it is dropped, but it is read (from an unknown state: the skipped bytes may
            # have opened a key block) to know where the lines after it stand.
            key_block = clean_lines([cut], self.secrets, KeyBlock.UNKNOWN)[1]
        self.offset = chunk.end
        *complete, rest = (self._pending + data).split(b"\n")
        if len(rest) > MAX_PENDING_BYTES:
            complete.append(rest)
            rest = b""
        self._pending = rest
        cleaned, self._key_block = clean_lines([self._format(raw) for raw in complete], self.secrets, key_block)
        return [f"{self.label} | {line}" for line in [*notes, *cleaned]]

    @property
    def shown_offset(self) -> int | None:
        """Bytes of the file shown as lines (an unfinished last line is not shown yet)."""
        return None if self.offset is None else self.offset - len(self._pending)

    def _format(self, raw: bytes) -> bytes | str:
        """Return the line to clean: a ``status.json`` entry rendered by :func:`progress_line`, else the line."""
        if self.label == PROGRESS:
            try:
                entry = json.loads(raw)
            except (ValueError, RecursionError):
                entry = None
            if isinstance(entry, Mapping):
                return progress_line(entry)
        return raw


def line_streams(
    descriptions: Iterable[Mapping[str, str | None]], secrets: Iterable[str], max_bytes: int
) -> list[LineStream]:
    """Return a :class:`LineStream` per description, each redacting ``secrets``.

    :param descriptions: the files to follow, each ``{"label": ..., "path": ..., "cursor_path": ...}`` (the
        cursor optional): what the sensor hands its trigger, JSON all through.
    :param secrets: the job's secret values.
    :param max_bytes: bytes read per file per poll at most.
    """
    values = tuple(secrets)
    return [
        LineStream(
            str(item["label"]),
            str(item["path"]),
            str(item["cursor_path"]) if item.get("cursor_path") else None,
            max_bytes=max_bytes,
            secrets=values,
        )
        for item in descriptions
    ]


def shown_offsets(streams: Iterable[LineStream]) -> dict[str, int]:
    """Per stream label, the bytes already shown as lines (streams not read yet left out)."""
    shown = {stream.label: stream.shown_offset for stream in streams}
    return {label: offset for label, offset in shown.items() if offset is not None}
