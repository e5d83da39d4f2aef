"""TAO ``status.json``: parse the status lines a TAO job writes and decide what they say.

TAO appends one JSON object per line, e.g.
``{"date": "6/1/2024", "time": "10:00:00", "status": "STARTED", "verbosity": "INFO", "message": "..."}``;
a successful run ends with ``"status": "SUCCESS"``, a failed one with ``"status": "FAILURE"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SUCCESS = "SUCCESS"
FAILURE = "FAILURE"


@dataclass(frozen=True)
class StatusVerdict:
    """What status.json says: ``ok`` True (SUCCESS), False (FAILURE) or None (no verdict yet/missing)."""

    ok: bool | None
    message: str
    entries: int


def parse_status_lines(text: str) -> list[dict[str, Any]]:
    """Parse JSON lines (one object per line) or a single JSON document; junk lines are skipped."""
    text = text.strip()
    if not text:
        return []
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        return [whole]
    if isinstance(whole, list):
        return [item for item in whole if isinstance(item, dict)]
    entries: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            entries.append(item)
    return entries


def status_verdict(entries: list[dict[str, Any]] | None) -> StatusVerdict:
    """Judge ``status.json`` by its LAST SUCCESS or FAILURE line (a resumed run appends after an old FAILURE)."""
    if not entries:
        return StatusVerdict(None, "status.json is missing or empty", 0)
    for entry in reversed(entries):
        status = str(entry.get("status", "")).upper()
        if status == FAILURE:
            return StatusVerdict(False, str(entry.get("message") or "status.json reports FAILURE"), len(entries))
        if status == SUCCESS:
            return StatusVerdict(True, str(entry.get("message") or SUCCESS), len(entries))
    return StatusVerdict(None, f"status.json has no SUCCESS line (last: {entries[-1].get('status')!r})", len(entries))
