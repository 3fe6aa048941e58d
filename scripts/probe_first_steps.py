"""Which steps of a long prompt beside decoding rows are slow, and only the first time? (MLX, CUDA)

    PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_first_steps.py MODEL [ROWS] [PROMPT] [N] [--no-warm-up]

`ROWS` rows decode (128-token prompts, greedy, EOS ignored); then `N` prompts of `PROMPT` tokens
come one after the other (each waits for the last to end), and every step they take is timed on the
host (`engine.step()`, which dispatches a step and reads the previous one back). Prints, per prompt,
the median step and each step over 3x it, with its prompt tokens and decoding rows: a step slow for
the first prompt and not for the next is a first sighting (issue 18's "no stalls" on the H200, where
the warm-up, warm_up.py, took the decode row counts and one-row chunks off but left ~100 ms steps).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

from kinfer.engines.base import GenerationJob  # kinfer first: it picks MLX's BLAS on a CPU
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.protocol import Sampling


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = Path(args[0])
    rows = int(args[1]) if len(args) > 1 else 16
    prompt = int(args[2]) if len(args) > 2 else 3000
    rounds = int(args[3]) if len(args) > 3 else 3
    started = time.perf_counter()
    off = {"warm_up": False} if "--no-warm-up" in sys.argv else {}  # (an older tree has no such switch)
    engine = MlxEngine(path, name=path.name, rows=rows + 1, ctx=max(4096, prompt + 256), **off)
    print(f"loaded in {time.perf_counter() - started:.1f} s")
    rng = random.Random(0)
    vocab = min(engine._batch.vocab - 8, 20000)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(3, vocab) for _ in range(n))

    for i in range(rows):
        engine.submit(GenerationJob(f"row{i}", ids(128), Sampling(temperature=0.0), 100_000, ignore_eos=True))
    while any(r is not None and not r.ready for r in engine._slots):
        engine.step()
    for _ in range(20):
        engine.step()
    for k in range(rounds):
        engine.submit(GenerationJob(f"long{k}", ids(prompt), Sampling(temperature=0.0), 4, ignore_eos=True))
        steps = []
        while any(key[0] == f"long{k}" for key in engine._rows):
            decoding = sum(1 for r in engine._slots if r is not None and r.ready)
            t = time.perf_counter()
            engine.step()
            steps.append(((time.perf_counter() - t) * 1000, engine._step_prefill, decoding))
        median = statistics.median(ms for ms, _, _ in steps)
        slow = [
            f"#{i} {ms:.0f} ms (prefill {p}, decoding {d})"
            for i, (ms, p, d) in enumerate(steps)
            if ms > 3 * median
        ]
        print(
            f"prompt {k}: {len(steps)} steps, median {median:.1f} ms, max {max(s[0] for s in steps):.0f} ms"
        )
        for line in slow:
            print("   ", line)
    engine.close()


if __name__ == "__main__":
    main()
