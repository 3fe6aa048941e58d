"""Time decode attention over long rows: the fused kernel whole vs split into spans (split_decode.py).

    python scripts/bench_split_decode.py                      # on the CUDA machine
    python scripts/bench_split_decode.py --lengths 1024,50000 --json out.json

For the qwen3-0.6b (16 query heads, 8 KV heads, head size 128) and qwen3.5-0.8b (8 / 2 / 256) shapes,
a batch of 1 or 17 rows (one of them `length` positions long, the others 300), random bf16 keys and
values in scattered blocks: the GPU time of one layer's decode attention, as N calls evaluated
together divided by N, both paths alternated twice (whole, split, whole, split; the best of each),
and the largest difference between their outputs. On a machine where MLX has no CUDA GPU it says so
and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial

from kinfer.engines.mlx import blas  # noqa: F401  (before the first `import mlx`)

# isort: split

import mlx.core as mx
import numpy as np

from kinfer.engines.mlx.kernels import fused_decode_available, launch_for, paged_decode_attention
from kinfer.engines.mlx.kv import BLOCK
from kinfer.engines.mlx.split_decode import split_decode_attention, splits_for

SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3.5-0.8b": (8, 2, 256)}


def inputs(lengths: list[int], heads: int, kv_heads: int, dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    needed = [(n + BLOCK - 1) // BLOCK for n in lengths]
    ids = rng.permutation(sum(needed))
    table = np.zeros((len(lengths), max(needed)), dtype=np.int32)
    at = 0
    for i, n in enumerate(needed):
        table[i, :n] = ids[at : at + n]
        at += n
    rows = sum(needed) * kv_heads * BLOCK
    keys = mx.random.normal((rows, dim)).astype(mx.bfloat16)
    values = mx.random.normal((rows, dim)).astype(mx.bfloat16)
    queries = mx.random.normal((len(lengths), heads, 1, dim)).astype(mx.bfloat16)
    bounds = mx.array(np.stack([np.zeros(len(lengths)), np.array(lengths)], axis=1).astype(np.int32))
    mx.eval(keys, values, queries)
    return queries, keys, values, mx.array(table), bounds


def timed(fn, calls: int) -> float:
    mx.eval(fn())  # compiled and warm
    started = time.perf_counter()
    mx.eval([fn() for _ in range(calls)])
    return (time.perf_counter() - started) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="1024,4096,16384,50000,100000")
    parser.add_argument("--batches", default="1,17")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    if not fused_decode_available(128, 128, mx.bfloat16):
        print("MLX has no CUDA GPU here: nothing to time")
        return 0
    results = []
    print(
        f"{'shape':14s} {'rows':>4s} {'length':>7s} {'splits':>6s} {'whole us':>9s} {'split us':>9s} "
        f"{'speed-up':>8s} {'max diff':>9s}"
    )
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for batch in (int(b) for b in args.batches.split(",")):
            for length in (int(n) for n in args.lengths.split(",")):
                q, k, v, table, bounds = inputs([length] + [300] * (batch - 1), heads, kv_heads, dim)
                splits = splits_for(length)
                scale = dim**-0.5

                args_ = (q, k, v, kv_heads, BLOCK, table, bounds, scale)
                whole = partial(paged_decode_attention, *args_)
                call = launch_for(q, k, v, table, bounds, kv_heads, BLOCK, scale)
                split = partial(split_decode_attention, call, (q, k, v, table, bounds), max(2, splits))

                times = {"whole": [], "split": []}
                for _ in range(2):
                    times["whole"].append(timed(whole, args.calls))
                    times["split"].append(timed(split, args.calls))
                best = {key: min(values) for key, values in times.items()}
                diff = float(mx.abs(whole().astype(mx.float32) - split().astype(mx.float32)).max())
                row = {
                    "shape": name,
                    "rows": batch,
                    "length": length,
                    "splits": max(2, splits),
                    **best,
                    "max_diff": diff,
                }
                results.append(row)
                print(
                    f"{name:14s} {batch:4d} {length:7d} {row['splits']:6d} {best['whole']:9.1f} "
                    f"{best['split']:9.1f} {best['whole'] / best['split']:7.2f}x {diff:9.2e}"
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
