"""scripts/probe_chunk_steps.py: a long prompt's steps beside decoding rows, its chunks compiled or not,
in one engine (run here on a CPU with CUDA's buckets forced on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.engines.mlx.fixtures import *  # noqa: F403

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_chunk_steps.py"


def test_both_modes_time_chunk_steps_beside_decoding_rows_and_a_decode_only_control(tiny_qwen35, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLX_DISABLE_COMPILE"}  # compiled for real
    out = tmp_path / "steps.json"
    # a CPU's timed budget cuts chunks of a few tokens: every one counts here
    args = ["--rows", "2", "--prompt", "400", "--block", "2", "--rounds", "1", "--min-chunk", "1"]
    subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_qwen35), *args, "--buckets", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env, check=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    for mode in ("compiled", "module"):
        cells = result["summary"][mode]
        assert cells["chunk_steps"] >= 1 and cells["decode_steps"] >= 4, (mode, cells)
        assert cells["chunk_ms"] > 0 and cells["decode_ms"] > 0
    steps = result["steps"]
    # the switch flips every --block steps while the prompt fills, and the rows decode throughout
    assert {s["mode"] for s in steps[:4]} == {"compiled", "module"}
    assert all(s["decoding"] >= 2 for s in steps)
