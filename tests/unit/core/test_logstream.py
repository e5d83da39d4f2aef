"""Live log lines: the batched read script run by real ``sh``/``dash`` on local files, and the line cleaning."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from airflow_provider_tao_slurm.core.logstream import (
    MAX_LINE_CHARS,
    MAX_PENDING_BYTES,
    MAX_RECORD_CHARS,
    PROGRESS,
    LineStream,
    TailChunk,
    TailRequest,
    clean_line,
    line_streams,
    parse_tail_output,
    progress_line,
    show_lines,
    shown_offsets,
    tail_script,
)
from airflow_provider_tao_slurm.core.secrets import REDACTED, withheld_note
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, ValidationError

SHELLS = [shell for shell in ("sh", "dash", "bash") if shutil.which(shell)]
SECRET = "nvapi-Zq3$(touch /tmp/x)'\"9kLmN0pQ"


def read(requests: list[TailRequest], shell: str = "sh") -> list[TailChunk]:
    script, nonce = tail_script(requests)
    done = subprocess.run([shell, "-s"], input=script.encode(), capture_output=True, check=True)
    assert done.stderr == b""
    return parse_tail_output(done.stdout, len(requests), nonce)


def follow(stream: LineStream, shell: str = "sh") -> list[str]:
    return stream.feed(read([stream.request()], shell)[0])


# ---------------------------------------------------------------------- clean_line

CLEAN_CASES = [
    ("plain", b"epoch 1 loss 0.5", "epoch 1 loss 0.5"),
    ("crlf", b"done\r", "done"),
    ("progress bar keeps the last frame", b"10%|#   |\r50%|##  |\r100%|####|", "100%|####|"),
    ("progress bar ending in a bare CR", b"step 1\rstep 2\r", "step 2"),
    ("ANSI colours", b"\x1b[1;31mERROR\x1b[0m: bad", "ERROR: bad"),
    ("ANSI cursor moves", b"\x1b[2K\x1b[1Gtraining", "training"),
    ("OSC title", b"\x1b]0;pwned\x07visible", "visible"),
    ("invalid UTF-8", b"caf\xc3 \xff ok", "caf\ufffd \ufffd ok"),
    ("NUL and bell", b"a\x00b\x07c", "a\ufffdb\ufffdc"),
    ("tab kept", b"a\tb", "a\tb"),
    ("unicode line separator", "x\u2028[2026-01-01] INFO - fake".encode(), "x\ufffd[2026-01-01] INFO - fake"),
    ("C1 control", "a\u0085b".encode(), "a\ufffdb"),
    ("bidi override", "file\u202etxt.exe".encode(), "file\ufffdtxt.exe"),
    ("literal credential", b"export NGC_API_KEY=nvapi-abcdefghijklmnop", f"export NGC_API_KEY={REDACTED}"),
]


@pytest.mark.parametrize(("raw", "expected"), [case[1:] for case in CLEAN_CASES], ids=[c[0] for c in CLEAN_CASES])
def test_clean_line(raw: bytes, expected: str) -> None:
    assert clean_line(raw) == expected


def test_clean_line_redacts_a_known_secret_and_its_encodings() -> None:
    import base64

    line = f"token {SECRET} b64 {base64.b64encode(SECRET.encode()).decode()}"
    cleaned = clean_line(line.encode(), [SECRET])
    assert SECRET not in cleaned
    assert base64.b64encode(SECRET.encode()).decode() not in cleaned
    assert cleaned.count(REDACTED) == 2


def test_a_long_line_is_cut_and_says_how_much() -> None:
    cleaned = clean_line(b"x" * (MAX_LINE_CHARS + 500))
    assert cleaned.startswith("x" * MAX_LINE_CHARS)
    assert cleaned.endswith("[500 more characters]")
    assert len(cleaned) < MAX_LINE_CHARS + 40


# ---------------------------------------------------------------------- progress_line

PROGRESS_CASES = [
    ({"status": "STARTED", "message": "Starting training"}, "STARTED: Starting training"),
    (
        {"status": "RUNNING", "epoch": 3, "max_epoch": 10, "loss": 0.12, "message": "epoch 3 done"},
        "RUNNING epoch 3/10 loss=0.12: epoch 3 done",
    ),
    (
        {"status": "RUNNING", "cur_iter": 50, "max_iter": 100, "kpi": {"mAP": 0.5, "nested": {"x": 1}}, "eta": "0:10"},
        "RUNNING iteration 50/100 eta=0:10 mAP=0.5",
    ),
    ({"epoch": 2}, "epoch 2"),
    ({"date": "1/1/2026"}, '{"date": "1/1/2026"}'),
]


@pytest.mark.parametrize(("entry", "expected"), PROGRESS_CASES)
def test_progress_line(entry: dict[str, object], expected: str) -> None:
    assert progress_line(entry) == expected


# ---------------------------------------------------------------------- the batched read, through real shells


@pytest.mark.parametrize("shell", SHELLS)
def test_many_files_in_one_read_from_their_offsets(tmp_path: Path, shell: str) -> None:
    (tmp_path / "a").write_bytes(b"one\ntwo\nthree")
    (tmp_path / "b").write_bytes(b"0123456789")
    chunks = read(
        [
            TailRequest(str(tmp_path / "a"), 4, 100),
            TailRequest(str(tmp_path / "missing"), 0, 100),
            TailRequest(str(tmp_path / "b"), 10, 100),
            TailRequest(str(tmp_path / "b"), 2, 3),
        ],
        shell,
    )
    assert chunks == [
        TailChunk(False, 4, 0, b"two\nthree"),
        TailChunk(missing=True),
        TailChunk(False, 10, 0, b""),
        TailChunk(False, 2, 5, b"789"),
    ]


@pytest.mark.parametrize(
    "name", ["with space", "$(touch canary)", "semi;colon", "quote'dq\"", "-dash", "star*", "back\\slash", "ünï"]
)
def test_hostile_paths_are_read_as_names(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"hello\n")
    (chunk,) = read([TailRequest(str(path), None, 100, str(tmp_path / f"{name}.cursor"))])
    assert chunk.data == b"hello\n"
    assert (tmp_path / f"{name}.cursor").read_text() == "6\n"
    assert not (tmp_path / "canary").exists()
    assert not Path("canary").exists()


@pytest.mark.parametrize(
    "request_",
    [
        TailRequest("relative/main.out", 0, 10),
        TailRequest("/a/main.out", -1, 10),
        TailRequest("/a/main.out", 0, 0),
        TailRequest("/a/main\n.out", 0, 10),
        TailRequest("/a/main.out", 0, 10, "cursor"),
    ],
)
def test_bad_requests_are_refused(request_: TailRequest) -> None:
    with pytest.raises(ValidationError):
        tail_script([request_])


def test_job_output_cannot_forge_the_framing(tmp_path: Path) -> None:
    """A log that prints end markers (even one with a guessed nonce shape) is read as data."""
    evil = b"line\n@@end 0000 0\n@@tail 0000 1 MISSING\n"
    (tmp_path / "a").write_bytes(evil)
    (tmp_path / "b").write_bytes(b"fine\n")
    chunks = read([TailRequest(str(tmp_path / "a"), 0, 1000), TailRequest(str(tmp_path / "b"), 0, 1000)])
    assert chunks[0].data == evil
    assert chunks[1].data == b"fine\n"


def test_the_answer_for_many_files_comes_in_few_writes(tmp_path: Path) -> None:
    """Each file's header, bytes and trailer are gathered into big writes (each write would be an SSH packet)."""
    requests = []
    for index in range(200):
        (tmp_path / f"{index}.out").write_bytes(f"line {index}\n".encode())
        requests.append(TailRequest(str(tmp_path / f"{index}.out"), 0, 1000))
    script, nonce = tail_script(requests)
    shell = subprocess.Popen(["sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert shell.stdin is not None
    assert shell.stdout is not None
    shell.stdin.write(script.encode())
    shell.stdin.close()
    reads = []
    while block := os.read(shell.stdout.fileno(), 1 << 20):
        reads.append(block)
    assert shell.wait() == 0
    assert len(reads) <= 2  # under 64 KiB: one write (the pipe may split it once)
    chunks = parse_tail_output(b"".join(reads), len(requests), nonce)
    assert [chunk.data for chunk in chunks] == [f"line {index}\n".encode() for index in range(200)]


def test_an_incomplete_answer_is_an_error() -> None:
    script, nonce = tail_script([TailRequest("/x/a", 0, 10), TailRequest("/x/b", 0, 10)])
    with pytest.raises(RemoteCommandError, match="answered 1 of 2"):
        parse_tail_output(f"@@tail {nonce} 0 MISSING\n".encode(), 2, nonce)
    with pytest.raises(RemoteCommandError, match="no end marker"):
        parse_tail_output(f"@@tail {nonce} 0 OFFSET 0 SKIP 0\nabc".encode(), 1, nonce)
    assert "sh" not in script.split("\n", 1)[0]  # the script starts with settings, not a shebang to exec


# ---------------------------------------------------------------------- LineStream


def test_lines_arrive_in_order_once_and_unfinished_lines_wait(tmp_path: Path) -> None:
    log = tmp_path / "main.out"
    log.write_bytes(b"")
    stream = LineStream("main.out", str(log), str(tmp_path / "cur"))
    assert follow(stream) == []
    with log.open("ab") as out:
        out.write(b"epoch 1\nepoch 2\nepo")
    assert follow(stream) == ["main.out | epoch 1", "main.out | epoch 2"]
    assert follow(stream) == []
    with log.open("ab") as out:
        out.write(b"ch 3\n")
    assert follow(stream) == ["main.out | epoch 3"]
    assert stream.shown_offset == log.stat().st_size


def test_a_new_stream_resumes_from_the_cursor_without_duplicates(tmp_path: Path) -> None:
    """A triggerer restart: the new trigger's stream has no offset and reads the cursor the old one left."""
    log, cursor = tmp_path / "main.out", tmp_path / ".main.out.offset"
    log.write_bytes(b"a\nb\n")
    first = LineStream("main.out", str(log), str(cursor))
    assert follow(first) == ["main.out | a", "main.out | b"]
    with log.open("ab") as out:
        out.write(b"c d\n")  # a base64-only word would be withheld here: the stream resumes in an unknown place
    second = LineStream("main.out", str(log), str(cursor))
    assert follow(second) == ["main.out | c d"]
    assert cursor.read_text() == "8\n"


def test_a_corrupt_cursor_restarts_at_zero(tmp_path: Path) -> None:
    log, cursor = tmp_path / "main.out", tmp_path / "cur"
    log.write_bytes(b"a\n")
    cursor.write_text("12; rm -rf /\n")
    assert follow(LineStream("main.out", str(log), str(cursor))) == ["main.out | a"]


def test_a_flood_is_skipped_with_a_note_and_the_cut_line_dropped(tmp_path: Path) -> None:
    log = tmp_path / "main.out"
    log.write_bytes(b"start\n")
    stream = LineStream("main.out", str(log), None, max_bytes=64)
    assert follow(stream) == ["main.out | start"]
    with log.open("ab") as out:
        out.write(b"".join(b"flood line %05d\n" % i for i in range(10000)))
    lines = follow(stream)
    assert "bytes of" in lines[0]
    assert "skipped" in lines[0]
    assert lines[1:] == [f"main.out | flood line {i:05d}" for i in range(9997, 10000)]
    assert stream.offset == log.stat().st_size


def test_a_truncated_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "main.out"
    log.write_bytes(b"first run line one\nfirst run line two\n")
    stream = LineStream("main.out", str(log))
    assert len(follow(stream)) == 2
    log.write_bytes(b"rerun\n")
    lines = follow(stream)
    assert "truncated or replaced" in lines[0]
    assert lines[1:] == ["main.out | rerun"]


def test_a_line_without_end_is_shown_cut_once_it_is_too_long(tmp_path: Path) -> None:
    log = tmp_path / "main.out"
    log.write_bytes(b"y" * (MAX_PENDING_BYTES + 10))
    (line,) = follow(LineStream("main.out", str(log), max_bytes=MAX_PENDING_BYTES * 2))
    assert line.endswith("more characters]")


def test_progress_lines_from_status_json(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    entries = [
        {"status": "STARTED", "message": "Starting"},
        {"status": "RUNNING", "epoch": 1, "max_epoch": 2, "loss": 0.3},
    ]
    status.write_text("".join(json.dumps(e) + "\n" for e in entries) + "not json\n" + "[" * 5000 + "\n")
    lines = follow(LineStream(PROGRESS, str(status)))
    assert lines[:3] == [
        "status.json | STARTED: Starting",
        "status.json | RUNNING epoch 1/2 loss=0.3",
        "status.json | not json",
    ]
    assert lines[3].startswith("status.json | [[[[")


def test_labels_are_short_names() -> None:
    with pytest.raises(ValidationError):
        LineStream("main.out | fake", "/a")
    with pytest.raises(ValidationError):
        LineStream("main.out", "relative")


# ---------------------------------------------------------------------- a private key printed over many lines

PEM_BEGIN = "-----BEGIN " + "RSA PRIVATE KEY-----"
PEM_END = "-----END " + "RSA PRIVATE KEY-----"
KEY_BODY = [
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo",
    "4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onL",
    "Rnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKf",
]
KEY_LOG = "\n".join(["epoch 1", f"key: {PEM_BEGIN}", *KEY_BODY, f"{PEM_END} ok", "epoch 2", ""]).encode()
KEY_LINES = ["epoch 1", f"key: {REDACTED}", REDACTED, REDACTED, REDACTED, f"{REDACTED} ok", "epoch 2"]


def _cuts() -> list[tuple[int, ...]]:
    """Where the log's bytes are split into poll chunks: every single cut, and cuts inside the markers and the body."""
    begin, end = KEY_LOG.index(b"-----BEGIN"), KEY_LOG.index(b"-----END")
    body = KEY_LOG.index(KEY_BODY[1].encode())
    return [(cut,) for cut in range(1, len(KEY_LOG))] + [
        (begin + 5, body, end + 3),
        (begin - 1, begin + 1, body + 10, end),
        tuple(range(1, len(KEY_LOG), 7)),
    ]


@pytest.mark.parametrize("cuts", _cuts(), ids=lambda cuts: "-".join(map(str, cuts[:4])))
@pytest.mark.parametrize("label", ["main.out", PROGRESS])
def test_a_private_key_spread_over_lines_and_polls_leaks_no_line(cuts: tuple[int, ...], label: str) -> None:
    """However the polls cut the job's output, no line of a key block reaches the task log; the lines around it do."""
    stream = LineStream(label, "/lustre/logs/main.out")
    lines: list[str] = []
    offset = 0
    for end in [*cuts, len(KEY_LOG)]:
        lines += stream.feed(TailChunk(False, offset, 0, KEY_LOG[offset:end]))
        offset = end
    assert lines == [f"{label} | {line}" for line in KEY_LINES]
    shown = "\n".join(lines)
    assert not any(part in shown for part in KEY_BODY)


def test_a_truncated_file_ends_the_key_block_of_the_run_before() -> None:
    """A requeued run's new log starts outside any key block, even when the old one ended inside one."""
    stream = LineStream("main.out", "/lustre/logs/main.out")
    first = f"{PEM_BEGIN}\n{KEY_BODY[0]}\n".encode()
    assert stream.feed(TailChunk(False, 0, 0, first)) == [f"main.out | {REDACTED}"] * 2
    lines = stream.feed(TailChunk(False, 0, 0, b"rerun\n"))
    assert lines[1:] == ["main.out | rerun"]


# A key whose BEGIN a reader may never see: rows of 64 base64 characters and a short last one.
ROWS = [
    *(("MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunV" + str(n))[-64:] for n in range(6)),
    "TLw7o==",
]
BLOCK = "\n".join(["epoch 1", f"key: {PEM_BEGIN}", *ROWS, f"{PEM_END} ok", "epoch 2", ""]).encode()


def _shown_rows(lines: list[str]) -> list[str]:
    """The shown lines that are a key row or a piece of one (after the ``label | `` prefix)."""
    texts = [line.split(" | ", 1)[1].strip() for line in lines]
    return [text for text in texts if text and any(text in row for row in ROWS)]


@pytest.mark.parametrize("cut", range(BLOCK.index(b"key:") + 1, BLOCK.index(b"-----END") + 1))
@pytest.mark.parametrize("label", ["main.out", PROGRESS])
def test_bytes_skipped_into_a_key_block_show_none_of_it(cut: int, label: str) -> None:
    """A poll skips bytes (the job wrote more than the budget) up to anywhere in a key block, its BEGIN among them:
    the stream knew nothing of the block, yet no row shows; the skip is said, the lines after the block show."""
    stream = LineStream(label, "/lustre/logs/main.out")
    head = BLOCK.index(b"key:")
    assert stream.feed(TailChunk(False, 0, 0, BLOCK[:head])) == [f"{label} | epoch 1"]
    lines = stream.feed(TailChunk(False, head, cut - head, BLOCK[cut:]))
    assert "skipped" in lines[0]
    assert _shown_rows(lines) == []
    assert lines[-1] == f"{label} | epoch 2"


@pytest.mark.parametrize("cut", range(BLOCK.index(b"key:") + 1, BLOCK.index(b"-----END") + 1))
def test_a_stream_resumed_inside_a_key_block_shows_none_of_it(tmp_path: Path, cut: int) -> None:
    """A triggerer restart while a key block was being shown, the cursor anywhere in it (in a row, in the BEGIN
    line): the new stream starts without the old one's state, yet no row (nor the rest of a cut one) shows."""
    log, cursor = tmp_path / "main.out", tmp_path / "cur"
    log.write_bytes(BLOCK[:cut])
    first = follow(LineStream("main.out", str(log), str(cursor)))
    assert first[0] == "main.out | epoch 1"
    with log.open("ab") as out:
        out.write(BLOCK[cut:])
    second = follow(LineStream("main.out", str(log), str(cursor)))
    assert _shown_rows(first + second) == []
    assert second[-1] == "main.out | epoch 2"


def test_a_stream_resumed_in_an_unknown_place_withholds_only_what_may_be_a_key_row(tmp_path: Path) -> None:
    """Resumed from its cursor, a stream shows text; a base64-only line (a key row, or the rest of a cut one) is
    withheld under one line that says so; once an END or BEGIN says where the stream stands, all shows again."""
    log, cursor = tmp_path / "main.out", tmp_path / "cur"
    log.write_bytes(b"epoch 1\n")
    follow(LineStream("main.out", str(log), str(cursor)))
    with log.open("ab") as out:
        out.write(f"nQ==\nepoch 2\n{ROWS[0]}\n{ROWS[-1]}\n{PEM_END}\n{ROWS[0]}\nok\n".encode())
    assert follow(LineStream("main.out", str(log), str(cursor))) == [
        f"main.out | {withheld_note(1)}",
        "main.out | epoch 2",
        f"main.out | {withheld_note(2)}",
        f"main.out | {REDACTED}",
        f"main.out | {ROWS[0]}",
        "main.out | ok",
    ]


def test_a_stream_read_from_the_files_start_withholds_nothing() -> None:
    """Where the stream knows it is outside any block (the file's start, and every poll after it), base64 shows."""
    stream = LineStream("main.out", "/lustre/logs/main.out")
    assert stream.feed(TailChunk(False, 0, 0, f"{ROWS[0]}\n".encode())) == [f"main.out | {ROWS[0]}"]
    assert stream.feed(TailChunk(False, 65, 0, b"ok\n")) == ["main.out | ok"]


@pytest.mark.parametrize("cut", range(1, len(PEM_BEGIN)))
def test_a_too_long_line_cut_inside_a_key_marker_shows_no_key(cut: int) -> None:
    """A line too long to wait for (a JSON value holding an escaped key) is shown unfinished, cut inside its BEGIN
    marker: the rest, read as a line of its own, ends the block with its END, so what comes before that is redacted."""
    stream = LineStream("main.out", "/lustre/logs/main.out")
    head = b"{" + b"y" * MAX_PENDING_BYTES + b' "key": "' + PEM_BEGIN.encode()[:cut]
    body = PEM_BEGIN.encode()[cut:] + f'\\n{ROWS[0]}\\n{PEM_END}\\n"}}\n'.encode()
    lines = stream.feed(TailChunk(False, 0, 0, head)) + stream.feed(TailChunk(False, len(head), 0, body))
    assert ROWS[0][:8] not in "".join(lines)
    assert lines[-1].endswith(f'{REDACTED}\\n"}}')


# ---------------------------------------------------------------------- line_streams, shown_offsets


def test_streams_are_built_from_their_descriptions_with_the_secrets() -> None:
    """The descriptions a trigger serializes become streams; an empty or absent cursor is none."""
    descriptions = [
        {"label": "main.out", "path": "/logs/main.out", "cursor_path": "/logs/.out.offset"},
        {"label": "main.err", "path": "/logs/main.err", "cursor_path": ""},
        {"label": PROGRESS, "path": "/results/status.json"},
    ]

    streams = line_streams(descriptions, iter(["tok-1f3a9c5e7b"]), 4096)

    assert [(s.label, s.path, s.cursor_path) for s in streams] == [
        ("main.out", "/logs/main.out", "/logs/.out.offset"),
        ("main.err", "/logs/main.err", None),
        (PROGRESS, "/results/status.json", None),
    ]
    assert {(s.max_bytes, s.secrets) for s in streams} == {(4096, ("tok-1f3a9c5e7b",))}
    assert streams[0].feed(TailChunk(offset=0, data=b"leaked tok-1f3a9c5e7b\n")) == [f"main.out | leaked {REDACTED}"]


def test_shown_offsets_leave_out_the_streams_not_read_yet_and_an_unfinished_line() -> None:
    read, unread = LineStream("main.out", "/logs/main.out"), LineStream("main.err", "/logs/main.err")
    read.feed(TailChunk(offset=10, data=b"epoch 1\nepo"))
    assert shown_offsets([read, unread]) == {"main.out": 18}
    assert shown_offsets([]) == {}


# ---------------------------------------------------------------------- show_lines


def test_a_reads_lines_share_one_record_in_order(caplog: pytest.LogCaptureFixture) -> None:
    """Every line shows, prefixed and in order, one per line of a single record."""
    lines = [f"main.out | epoch {number}" for number in range(1, 501)] + ["status.json | RUNNING epoch 1/3"]
    with caplog.at_level(logging.INFO, logger="live"):
        show_lines(logging.getLogger("live"), lines)
    assert [record.getMessage().split("\n") for record in caplog.records] == [lines]


def test_lines_beyond_a_records_budget_go_into_the_next_record(caplog: pytest.LogCaptureFixture) -> None:
    """No record holds more than MAX_RECORD_CHARS of lines; none is dropped, cut or reordered."""
    lines = [f"main.out | {number:05d} " + "x" * MAX_LINE_CHARS for number in range(100)]
    with caplog.at_level(logging.INFO, logger="live"):
        show_lines(logging.getLogger("live"), lines)
        show_lines(logging.getLogger("live"), [])
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) > 1
    assert all(len(message) <= MAX_RECORD_CHARS for message in messages)
    assert [line for message in messages for line in message.split("\n")] == lines
