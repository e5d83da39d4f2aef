"""Unit-test setup: the shared hook fake (``fakes.py`` beside this file) imports as ``fakes`` everywhere below."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
