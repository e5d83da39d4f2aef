"""MkDocs hook: render the Sphinx roles of the docstrings (``:class:`X```) as plain code.

The API reference is generated from Sphinx-style docstrings, whose cross-references
(``:class:``, ``:meth:``, ``:attr:``, ...) Markdown does not know: without this hook a page shows
``:class:SbatchSubmitOperator``. ``:class:`~a.b.C``` becomes ``C``, as Sphinx writes it.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|const|type):<code>(?P<tilde>~?)(?P<target>[^<]*)</code>"
)


def _code(match: re.Match[str]) -> str:
    target = match["target"]
    if match["tilde"]:
        target = target.rsplit(".", 1)[-1]
    return f"<code>{target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    """Replace every Sphinx role left in a page's HTML by its target in code."""
    return ROLE.sub(_code, html)
