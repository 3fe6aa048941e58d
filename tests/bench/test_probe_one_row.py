"""scripts/probe_one_row.py: one row's decode with its residual products as addmm or apart, two engines
in one process taking turns (a smoke run on a CPU, tiny shapes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_one_row.py"


def test_both_forms_decode_one_row_in_turns(tmp_path):
    out = tmp_path / "one-row.json"
    env = {**os.environ, "MLX_DISABLE_COMPILE": "1"}
    args = ["--tiny", "--rounds", "2", "--tokens", "8", "--json", str(out)]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"apart", "addmm"}
    for name, rounds in runs.items():
        assert len(rounds) == 2 and all(r["tok_s"] > 0 and r["total"] > 0 for r in rounds), name
    assert "median apart" in run.stdout and "median addmm" in run.stdout
