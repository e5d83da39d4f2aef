"""TAO ``status.json``: parse the status lines a TAO job writes and decide what they say.

TAO appends one JSON object per line, e.g.
``{"date": "6/1/2024", "time": "10:00:00", "status": "STARTED", "verbosity": "INFO", "message": "..."}``;
a successful run ends with ``"status": "SUCCESS"``, a failed one with ``"status": "FAILURE"``.
TAO's status logger puts the KPIs it holds under a line's ``"kpi"`` mapping, e.g.
``{"status": "SUCCESS", "message": "Evaluation finished successfully.", "kpi": {"mAP": 0.81}}``,
and repeats them on every later line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
#: The key of a status line under which TAO writes its KPIs.
KPI = "kpi"


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


def status_kpis(entries: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """Return the KPIs ``status.json`` reports: each name with its value on the last line that carries it.

    A line carries KPIs in its ``"kpi"`` mapping (anything else there is ignored). Numbers, strings,
    booleans and nulls are kept as they are; a nested mapping or list is kept with the same rules (its
    keys made strings); a non-finite number (TAO writes ``NaN`` for a diverged loss) becomes its JSON
    token as a string (``"NaN"``, ``"Infinity"``, ``"-Infinity"``); any other value becomes its ``str``.
    So the result is JSON-safe (an XCom, an Asset event's extra).

    :param entries: the status lines, oldest first (None or empty: no KPIs).
    :returns: KPI name -> value; empty when no line carries any.
    """
    kpis: dict[str, Any] = {}
    for entry in entries or ():
        values = entry.get(KPI)
        if isinstance(values, Mapping):
            kpis.update({str(name): _json_safe(value) for name, value in values.items()})
    return kpis


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return str(value)
