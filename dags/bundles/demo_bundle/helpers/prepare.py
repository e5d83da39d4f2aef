"""Supporting file of the demo spec bundle: records that the pre-command ran before training."""

from __future__ import annotations

import sys
from pathlib import Path

results = Path(sys.argv[1])
results.mkdir(parents=True, exist_ok=True)
with (results / "order.txt").open("a") as out:
    out.write("pre\n")
