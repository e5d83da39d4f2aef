"""asyncssh is imported by the provider without the DSA deprecation warnings of ``cryptography``."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from airflow_provider_tao_slurm.hooks.async_transport import import_asyncssh
    import_asyncssh()
import asyncssh, sys
print(asyncssh.__name__, sum("DSA" in str(w.message) for w in caught))
"""

PLAIN = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import asyncssh
print(sum("DSA" in str(w.message) for w in caught))
"""


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter (asyncssh not yet imported); return its output."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return proc.stdout.strip()


def test_the_provider_imports_asyncssh_quietly() -> None:
    assert int(_run(PLAIN).splitlines()[-1]) > 0, (
        "asyncssh no longer warns about DSA: this test and import_asyncssh can go"
    )
    assert _run(CHECK).splitlines()[-1] == "asyncssh 0"
