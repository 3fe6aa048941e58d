"""A long prompt's steps beside decoding rows, its chunks compiled or not, in one process (MLX, CUDA).

    PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_chunk_steps.py MODEL_DIR [--rows 16] [--prompt 30000]
        [--block 8] [--rounds 2] [--json out.json]

On CUDA one row's prompt chunks run the compiled layers (shape_buckets.compiled_chunk). Through HTTP
two servers differ by more than that change (the H200 host's speed swings from process to process),
so here one engine does both: `--rows` rows decode (128-token prompts, greedy, EOS ignored), then a
`--prompt`-token prompt arrives, and every `--block` steps its chunks switch between the compiled
functions and the module code (the switch `check.py` turns off on a failed load check). Every step is
timed by phase (step_timer.py). Printed per mode: the median step with `--min-chunk` or more prompt
tokens (a long prompt's steady chunks on CUDA; its first and last are shorter) and the median
decode-only step after the prompt ended (a control: the switch does not touch it), and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from kinfer.engines.base import GenerationJob  # kinfer first: it picks MLX's BLAS on a CPU
from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.check import set_compiled_chunks
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.engines.mlx.step_timer import StepTimer
from kinfer.protocol import Sampling


def timed_step(engine: MlxEngine, timer: StepTimer, mode: str) -> dict:
    decoding = sum(1 for r in engine._slots if r is not None and r.ready)
    engine.step()
    step = {k: round(v * 1000, 3) for k, v in timer.steps[-1].items()}
    return step | {"mode": mode, "prefill": engine._step_prefill, "decoding": decoding}


def summary(steps: list[dict], mode: str, min_chunk: int) -> dict:
    def median(rows: list[dict], key: str = "total") -> float | None:
        return round(statistics.median(s[key] for s in rows), 2) if rows else None

    mine = [s for s in steps if s["mode"] == mode]
    chunk = [s for s in mine if s["prefill"] >= min_chunk and s["decoding"]]
    decode = [s for s in mine if not s["prefill"] and s["decoding"]]
    out = {
        "chunk_steps": len(chunk),
        "chunk_ms": median(chunk),
        "chunk_build_ms": median(chunk, "build"),
        "chunk_launch_ms": median(chunk, "launch"),
        "chunk_max_ms": max((s["total"] for s in chunk), default=None),
        "decode_steps": len(decode),
        "decode_ms": median(decode),
    }
    if out["chunk_ms"] and out["decode_ms"]:
        out["ratio"] = round(out["chunk_ms"] / out["decode_ms"], 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=30000)
    parser.add_argument("--block", type=int, default=8, help="steps per mode before switching")
    parser.add_argument("--rounds", type=int, default=2, help="long prompts, one after the other")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--min-chunk", type=int, default=128, help="prompt tokens a chunk step counts from")
    parser.add_argument("--buckets", action="store_true", help="CUDA's shape buckets on a CPU (a smoke run)")
    args = parser.parse_args()
    if args.buckets:
        shape_buckets.set_enabled(True)

    started = time.perf_counter()
    engine = MlxEngine(args.model, name=args.model.name, rows=args.rows + 1, ctx=max(4096, args.prompt + 256))
    print(f"loaded in {time.perf_counter() - started:.1f} s", flush=True)
    timer = StepTimer()
    engine.step_timer = timer
    rng = random.Random(0)
    vocab = min(engine._batch.vocab - 8, 20000)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(3, vocab) for _ in range(n))

    for i in range(args.rows):
        engine.submit(GenerationJob(f"row{i}", ids(128), Sampling(temperature=0.0), 10**6, ignore_eos=True))
    for _ in range(40):  # the rows' own prompts, then decode-only steps
        engine.step()
    steps: list[dict] = []
    modes = ("compiled", "module")
    for k in range(args.rounds):
        engine.submit(
            GenerationJob(f"long{k}", ids(args.prompt), Sampling(temperature=0.0), 4, ignore_eos=True)
        )
        n = 0
        while any(key[0] == f"long{k}" for key in engine._rows):
            mode = modes[(n // args.block + k) % 2]
            set_compiled_chunks(engine, mode == "compiled")
            steps.append(timed_step(engine, timer, mode))
            n += 1
        for n in range(4 * args.block):  # the control: decode-only steps, the switch flipping alike
            mode = modes[(n // args.block) % 2]
            set_compiled_chunks(engine, mode == "compiled")
            steps.append(timed_step(engine, timer, mode))
    set_compiled_chunks(engine, True)
    engine.close()
    result = {mode: summary(steps, mode, args.min_chunk) for mode in modes}
    for mode, cells in result.items():
        print(mode, json.dumps(cells), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "summary": result, "steps": steps},
                indent=0,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
