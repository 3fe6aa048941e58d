"""`kinfer --headless` must not pay for (or depend on) the dashboard."""

from __future__ import annotations

import subprocess
import sys

HEADLESS_IMPORTS = """
import sys
import kinfer.cli
kinfer.cli.build_parser()
import kinfer.runtime, kinfer.server.app, kinfer.server.http
from kinfer.commands.serve import serve
loaded = sorted(m for m in sys.modules if m == "textual" or m.startswith(("textual.", "kinfer.tui")))
print(loaded)
"""


def test_headless_serving_never_imports_textual() -> None:
    done = subprocess.run(
        [sys.executable, "-c", HEADLESS_IMPORTS], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
