"""scripts/probe_warm_shapes.py: the attention shapes serving meets that the warm-up never ran (CUDA's
buckets forced on here, on a CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from tests.engines.mlx.fixtures import *  # noqa: F403

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_warm_shapes.py"


def test_it_lists_the_shapes_serving_met_beyond_the_warm_ups(tiny_qwen3, tmp_path):
    out = tmp_path / "shapes.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_qwen3), "--ctx", "3000", "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["warm_up_shapes"] > 0 and result["serving_shapes"] > 0
    assert result["long_prompt_tokens"] > 256  # several chunks beside the streaming rows
    # (rows, queries, keys padded to a bucket): a chunk attends to itself and what came before
    assert all(rows >= 1 and 1 <= queries <= keys <= SHORT_CONTEXT for rows, queries, keys in result["new"])
    assert f"new in serving {len(result['new'])}" in done.stdout
