"""MkDocs hook: include code between ``# [START name]`` and ``# [END name]`` markers of a repo file.

In a page, ``--8<-- "dags/example_tao_singlenode.py:howto_operator_sbatch_submit"`` on a line of its
own is replaced by that region, dedented, in a fenced Python block. A missing file or marker fails
the build, so the docs can only quote code that exists (and the example DAGs are run by the tests).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^# \[(START|END) [A-Za-z0-9_]+\]$")
DIRECTIVE = re.compile(r'^--8<-- "(?P<path>[^":]+):(?P<name>[A-Za-z0-9_]+)"$', re.MULTILINE)


class SnippetError(Exception):
    """A snippet directive names a file or marker that does not exist."""


def extract(path: str, name: str) -> str:
    """The dedented lines strictly between the START and END markers of ``name`` in ``path``."""
    lines = (ROOT / path).read_text().splitlines()
    start = [i for i, line in enumerate(lines) if line.strip() == f"# [START {name}]"]
    end = [i for i, line in enumerate(lines) if line.strip() == f"# [END {name}]"]
    if len(start) != 1 or len(end) != 1 or end[0] <= start[0]:
        raise SnippetError(f"{path}: markers for {name!r} missing, repeated or out of order")
    body = [line for line in lines[start[0] + 1 : end[0]] if not MARKER.match(line.strip())]
    return textwrap.dedent("\n".join(body)).strip("\n")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace every snippet directive of a page."""

    def replace(match: re.Match[str]) -> str:
        code = extract(match["path"], match["name"])
        return f"```python\n# {match['path']}\n{code}\n```"

    return DIRECTIVE.sub(replace, markdown)
