"""What a first-seen shape costs the MLX engine's host: jobs run one after another, each run's step times.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_mlx_shapes.py MODEL_DIR [1|0]   # compiled step on/off

A run whose shapes were seen before should be as fast as the "again" line that repeats it; on MLX's
CUDA backend (2026-12-02, H200) a prefill at a new length cost ~85-105 ms the first time and 12 ms
again (docs/benchmarks/h200-2026-12-02c/shapes-probe.txt): what kinfer/engines/mlx/sdpa_buckets.py is
for. Greedy, EOS ignored, random prompt ids, no prefix pool.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from kinfer.engines.base import GenerationJob
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.protocol import Sampling

RUNS = [
    ("warm 1x100", [100], 3),
    *(
        (label, lengths, 3)
        for label, lengths in [
            ("1x300", [300]),
            ("1x300 again", [300]),
            ("1x301", [301]),
            ("1x302", [302]),
            ("1x301 again", [301]),
            ("1x512", [512]),
            ("1x512 again", [512]),
            ("1x1000", [1000]),
            ("1x1000 again", [1000]),
            ("2x300", [300, 300]),
            ("2x300 again", [300, 300]),
            ("3x300", [300] * 3),
            ("3x300 again", [300] * 3),
            ("2x(300,200)", [300, 200]),
            ("2x(300,200) again", [300, 200]),
        ]
    ),
    *((f"decode {k}x64 20 tokens", [64] * k, 20) for k in (5, 5, 6, 6, 7, 9, 17, 17, 33, 33)),
]


def main() -> None:
    path = Path(sys.argv[1])
    compiled = sys.argv[2] != "0" if len(sys.argv) > 2 else True
    engine = MlxEngine(
        path, name="probe", rows=64, ctx=4096, prefix_cache=False, prefill_chunk=2048, compiled_step=compiled
    )
    rng = random.Random(1)
    vocab = min(engine._batch.vocab - 8, 5000)
    submitted = 0
    for label, lengths, max_tokens in RUNS:
        for length in lengths:
            submitted += 1
            prompt = tuple(rng.randrange(3, vocab) for _ in range(length))
            engine.submit(
                GenerationJob(
                    f"j{submitted}", prompt, Sampling(temperature=0.0), max_tokens=max_tokens, ignore_eos=True
                )
            )
        times = []
        began = time.perf_counter()
        while engine.has_work:
            start = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - start) * 1000)
        total = (time.perf_counter() - began) * 1000
        steps = " ".join(f"{t:.0f}" for t in times[:12])
        print(
            f"{label:34s} steps={len(times):3d} total={total:7.1f}ms max={max(times):6.1f} {steps}",
            flush=True,
        )
    engine.close()


if __name__ == "__main__":
    main()
