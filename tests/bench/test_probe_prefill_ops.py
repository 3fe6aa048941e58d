"""scripts/probe_prefill_ops.py: primitives per prompt-chunk pass under CUDA's buckets, on any machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_prefill_ops.py"


def test_qwen35_full_prompt_chunks_build_fewer_primitives_through_the_compiled_layers():
    env = {k: v for k, v in os.environ.items() if k != "MLX_DISABLE_COMPILE"}  # compiled for real
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--chunk", "16", "--prompt", "70"],
        capture_output=True, text=True, timeout=600, env=env, check=True,
    ).stdout  # fmt: skip
    counts = {
        label: [int(n) for n in re.findall(r"\d+", numbers)]
        for label, numbers in re.findall(r"(module code|compiled layers) +primitives.*: \[(.*)\]", out)
    }
    module, compiled = counts["module code"], counts["compiled layers"]
    # a 70-token prompt: its padded odd piece, then four full 16-token chunks, then the decode passes
    assert len(module) == len(compiled) >= 5
    assert all(c < 0.8 * m for c, m in zip(compiled[1:5], module[1:5], strict=True))
