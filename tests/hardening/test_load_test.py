"""scripts/load_test.py at a small size: 32 streaming clients against `kinfer --headless`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "load_test.py"


@pytest.mark.slow
def test_32_clients_some_leaving_get_whole_replies_and_the_server_drains(tmp_path: Path):
    report_path = tmp_path / "report.json"
    # a quarter of the clients leave, so a run of 32 has some leavers for sure
    command = [
        sys.executable,
        str(SCRIPT),
        "--clients",
        "32",
        "--disconnect",
        "0.25",
        "--max-tokens",
        "16",
        "--time-limit",
        "600",
        "--json",
        str(report_path),
        "--quiet",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    report = json.loads(report_path.read_text())
    assert done.returncode == 0, (done.stdout[-2000:], report["failures"])
    assert report["ok"] and report["failures"] == []
    assert report["statuses"] == {"200": 32}
    assert report["planned_leavers"] > 0 and report["left_early"] == report["planned_leavers"]
    assert report["finished"] == 32 - report["left_early"]
    assert report["mismatched"] == [] and report["server_errors"] == []
    assert report["max_rows_busy"] > 1  # the clients really were batched together
    assert report["rows_busy_after"] == 0 and report["requests_active_after"] == 0
