"""Where the MLX engine's unnamed memory lives, step by step: a burst of prompts, then decoding.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_mlx_memory.py MODEL_DIR [ROWS] [PROMPT] [TOKENS] [pool]

For each step: what it dispatched (prompt positions, decoding rows), MLX's active memory before it,
right after it (where the worker reads the engine's account), 20 ms later, and on every fifth step
after `mx.synchronize()` (nothing in flight), each as the bytes no named part holds (active minus
weights, KV, state and pool), beside the account's scratch (the dispatched step's growth). Diagnostic
for issue 18's memory account (on the H200 the account left 1.9 GB unnamed at 16 and 64 streams of a
qwen3-0.6b shape while its scratch read ~0). Greedy, EOS ignored, random prompt ids, no prefix pool
unless the fifth argument is `pool`.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import mlx.core as mx

from kinfer.engines.base import GenerationJob
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.protocol import Sampling

MB = 1e6


def unnamed(engine: MlxEngine) -> tuple[float, float]:
    memory = engine.stats().memory
    named = memory["weights"] + memory["kv"] + memory["state"] + memory["pool"]
    return (mx.get_active_memory() - named) / MB, memory["scratch"] / MB


def main() -> None:
    path = Path(sys.argv[1])
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    pool = len(sys.argv) > 5 and sys.argv[5] == "pool"
    engine = MlxEngine(path, name=path.name, rows=rows, ctx=prompt + tokens + 64, prefix_cache=pool)
    rng = random.Random(0)
    vocab = min(engine._batch.vocab - 8, 20000)
    for i in range(rows):
        ids = tuple(rng.randrange(3, vocab) for _ in range(prompt))
        engine.submit(GenerationJob(f"j{i}", ids, Sampling(temperature=0.0), tokens, ignore_eos=True))
    print("step prefill decoding | unnamed MB: before after +20ms synced | scratch MB | run's peak MB")
    step = 0
    while engine.has_work:
        before, _ = unnamed(engine)
        engine.step()
        after, scratch = unnamed(engine)
        time.sleep(0.02)
        later, _ = unnamed(engine)
        synced = "-"
        if step % 5 == 0:
            mx.synchronize()
            synced = f"{unnamed(engine)[0]:.0f}"
        active = [r for r in engine._slots if r is not None]
        decoding = sum(1 for r in active if r.ready)
        print(
            f"{step:4d} {engine._step_prefill:6d} {decoding:4d} | {before:8.0f} {after:8.0f} {later:8.0f}"
            f" {synced:>8s} | {scratch:8.0f} | {engine._peaks.lifetime / MB:8.0f}"
        )
        step += 1
        if step > 60:
            break


if __name__ == "__main__":
    main()
