"""scripts/probe_long_attention.py: one chunk's attention over a long context, by how it is called (run
here on a CPU with small sizes: every form runs and gives its reference's result; the timings are the
H200's business)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_long_attention.py"
CUDNN = {"causal_exact", "bool_padded", "bias_padded"}  # mx.fast's attention, cuDNN's on CUDA
ATTENTION = CUDNN | {"ops_bool_padded", "ops_bias_padded", "ops_addmm_padded"}  # and MLX's composition
FORMS = ATTENTION | {"none_exact", "gather", "gather_blocks"}


def test_every_form_is_timed_at_every_context_and_the_gathers_once_per_context(tmp_path):
    out = tmp_path / "attention.json"
    args = ["--contexts", "4200", "--lengths", "16,32", "--repeats", "1", "--json", str(out)]
    subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, check=True
    )
    results = json.loads(out.read_text())["results"]
    by_length = {n: {r["form"] for r in results if r["length"] == n} for n in (16, 32)}
    assert FORMS | {"gather_blocks_padded", "take_headmajor"} == by_length[16]
    assert not any(form.startswith(("gather", "take")) for form in by_length[32])  # keys only: once
    assert all(r["context"] == 4200 and r["single_ms"] > 0 and r["queued_ms"] > 0 for r in results)
    # the same attention (bf16 rounding apart: MLX's composition, with its mask in the product or not,
    # is what the engine runs past 4,096 keys) and exactly the same keys, whichever way they are made
    masked = [r["max_diff"] for r in results if r["form"] in ATTENTION]
    gathered = [r["max_diff"] for r in results if r["form"].startswith(("gather", "take"))]
    assert len(masked) == 2 * len(ATTENTION) and max(masked) < 0.05
    assert len(gathered) == 4 and max(gathered) == 0
