"""Primitives per prompt-chunk pass of the MLX engine with CUDA's shape buckets, compiled layers on or off.

    python scripts/probe_prefill_ops.py [--size qwen3.5-0.8b] [--chunk 256] [--prompt 1124]

Issue 18's proxy for a prefill pass's host cost where no GPU is at hand: MLX encodes a graph primitive
by primitive, so the count of a pass is what its launch costs. The engine runs with the buckets a CUDA
GPU gets (shape_buckets.set_enabled), tiny widths at the real depth, one prompt cut into `--chunk`-token
chunks (the odd piece first, padded; then full chunks), and `graph_ops.OpCounter` counts each launched
pass. A CPU's recurrence is a loop of ops per token where CUDA runs one kernel, so it is counted here as
one primitive (mlx-lm's `gated_delta_update` replaced by one op of its output's shape) and the counts
compare the code around it; a CPU still builds RMSNorm and RoPE from their fallback ops, so the totals
run above a GPU's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from kinfer.engines.mlx import blas  # noqa: F401  (before the first `import mlx`)

# isort: split

import mlx.core as mx
from bench_mlx_engine import TINY, build_model_dir, make_prompts, with_layers

from kinfer.engines.base import GenerationJob
from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.engines.mlx.graph_ops import OpCounter
from kinfer.protocol import Sampling

LAYERS = {"qwen3-0.6b": 28, "qwen3.5-0.8b": 24}


def one_op_recurrence(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, use_kernel=True):
    """The recurrence as one primitive (CUDA's kernel), with its outputs' shapes."""
    batch, _, v_heads, v_dim = v.shape
    if state is None:
        state = mx.zeros((batch, v_heads, v_dim, q.shape[-1]), dtype=q.dtype)
    return v * 1, state


def passes(path: Path, prompt: list[int], chunk: int, compiled: bool) -> list[int]:
    engine = MlxEngine(
        path, name="probe", rows=2, ctx=4096, prefill_chunk=chunk, compiled_step=compiled, warm_up=False
    )
    counter = OpCounter()
    engine.step_timer = counter
    engine.submit(GenerationJob("p", tuple(prompt), Sampling(temperature=0.0), max_tokens=2))
    while engine.has_work:
        engine.step()
    engine.close()
    return [sum(step.values()) for step in counter.steps]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="qwen3.5-0.8b", choices=sorted(LAYERS))
    parser.add_argument("--chunk", type=int, default=256, help="prompt tokens per pass (a bucket size)")
    parser.add_argument("--prompt", type=int, default=1124, help="prompt tokens")
    args = parser.parse_args()

    from mlx_lm.models import qwen3_5

    qwen3_5.gated_delta_update = one_op_recurrence
    shape_buckets.set_enabled(True)
    config = with_layers(TINY[args.size], LAYERS[args.size])
    vocab = config.get("text_config", config)["vocab_size"]
    prompt = make_prompts(1, args.prompt, vocab)[0]
    with tempfile.TemporaryDirectory(prefix="kinfer-prefill-ops-") as workdir:
        path = build_model_dir(Path(workdir) / args.size, config, "float32")
        for compiled in (False, True):
            counts = passes(path, prompt, args.chunk, compiled)
            label = "compiled layers" if compiled else "module code"
            print(f"{args.size} {label:15s} primitives per pass (prompt chunks, then decode): {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
