"""One stream's decode speed, a one-row residual product as addmm or as a product and an add (MLX, CUDA).

    python scripts/probe_one_row.py [--size qwen3-0.6b] [--rounds 8] [--tokens 256] [--json out.json]

`compiled_step.one_row_apart` decides, when a compiled function is traced, whether one row's residual
products are `addmm` (cuBLASLt on MLX's CUDA backend) or a Matmul (MLX's GEMV kernel) and an add. Two
engines on the same random weights live in this one process, `apart` traced with the switch on and
`addmm` with it off, and decode one row in turns (ABAB...), so the comparison carries no difference
between processes (on the H200 host one row's tok/s swung 140-210 between runs of the same code).
Prints each round's tok/s and host ms per step by phase (step_timer.py), then the medians. The engines
have one slot, whose decode pass is one row (`shape_buckets.decode_rows`; until 2026-12-04 two, the
slot and the scratch one, so neither form reached the GEMV and this probe's first run compared two
cuBLASLt paths).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from kinfer.engines.mlx import blas  # noqa: F401  (before the first `import mlx`)

# isort: split

from bench_mlx_engine import SHAPES, TINY, build_model_dir, make_prompts

from kinfer.engines.base import GenerationJob
from kinfer.engines.mlx import compiled_step
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.engines.mlx.step_timer import StepTimer
from kinfer.protocol import Sampling


def make_engine(path: Path, ctx: int, apart: bool) -> MlxEngine:
    """An engine whose compiled functions are traced with the switch as given (its load traces them)."""
    compiled_step.one_row_apart = lambda: apart
    engine = MlxEngine(path, name="apart" if apart else "addmm", rows=1, ctx=ctx, prefix_cache=False)
    decode_one(engine, [1, 2, 3], 8, StepTimer())  # the one-row shapes traced now, with this switch
    return engine


def decode_one(engine: MlxEngine, prompt: list[int], tokens: int, timer: StepTimer) -> float:
    """Decode tok/s of one row over `tokens` tokens (the window after its first token)."""
    engine.step_timer = timer
    engine.submit(
        GenerationJob("r", tuple(prompt), Sampling(temperature=0.0), max_tokens=tokens, ignore_eos=True)
    )
    start, counted = None, 0
    while engine.has_work:
        for update in engine.step():
            if start is not None:
                counted += update.new_tokens
            elif update.new_tokens:
                start = time.perf_counter()
                timer.clear()
    return counted / (time.perf_counter() - start) if start and counted else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="qwen3-0.6b", choices=sorted(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="the tiny shapes (a smoke test on a CPU)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    config = (TINY if args.tiny else SHAPES)[args.size]
    vocab = config.get("text_config", config)["vocab_size"]
    prompt = make_prompts(1, 128, vocab)[0]
    results: dict[str, list[dict]] = {"apart": [], "addmm": []}
    with tempfile.TemporaryDirectory(prefix="kinfer-one-row-") as workdir:
        path = build_model_dir(Path(workdir) / args.size, config, "bfloat16")
        ctx = len(prompt) + args.tokens + 8
        engines = {"apart": make_engine(path, ctx, True), "addmm": make_engine(path, ctx, False)}
        for round_ in range(args.rounds):
            order = ("apart", "addmm") if round_ % 2 == 0 else ("addmm", "apart")
            for name in order:
                timer = StepTimer()
                tok_s = decode_one(engines[name], prompt, args.tokens, timer)
                phases = timer.mean_ms()
                results[name].append({"tok_s": tok_s, **phases})
                cells = "  ".join(f"{k} {v:.3f}" for k, v in phases.items())
                print(f"round {round_ + 1} {name:6s} {tok_s:7.1f} tok/s  {cells}", flush=True)
        for engine in engines.values():
            engine.close()
    for name, runs in results.items():
        median = statistics.median(r["tok_s"] for r in runs)
        print(f"median {name:6s} {median:7.1f} tok/s over {len(runs)} rounds")
    if args.json:
        args.json.write_text(
            json.dumps({"size": args.size, "tokens": args.tokens, "runs": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
