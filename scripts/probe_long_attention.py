"""Device time of one prompt chunk's attention over a long context, by how the call is made (H200).

A long prompt beside decoding rows arrives in 256-token chunks; past ~20,000 keys qwen3-0.6b's chunk
steps waited 27-29 ms for the GPU and alternate ones took ~100 ms (docs/benchmarks.md, "H200, fifth
session of 2026-12-03"). This times the attention of one such chunk (16 query heads, 8 KV heads,
head size 128, bf16: the qwen3-0.6b shape) for each form the engine could send:

  causal_exact   the exact key length, mask "causal" (cuDNN, no bias)
  bool_padded    keys padded to the shape bucket, a boolean mask (what sdpa_buckets does today)
  bias_padded    the same mask as an additive bf16 array
  none_exact     the exact keys, no mask at all (the kernel's floor for this shape)
  ops_bool_padded  MLX ops (attention_ops.py: two matrix products around a masked softmax), the padded
                 keys and boolean mask: no flash attention, the [L, K] scores written and read
  ops_bias_padded  the same with the additive mask
  ops_addmm_padded the same with the mask added by the first product (`mx.addmm`: cuBLASLt's C input,
                 no pass of its own over the scores) and the scale as its alpha: the engine's
                 (attention_ops.attention_bias_in_product)
  gather         the row's K/V gathered out of a paged pool token row by token row
  gather_blocks  the same by 64-token blocks, as the engine does, then padded to the bucket
  gather_blocks_padded  the block table padded to the bucket instead (one copy fewer)
  take_headmajor the pool rows taken in cuDNN's order, padding included (long_context.py's `take`)
  copy_kernel    long_kv_copy.py's kernel: whole blocks, keys and values in one launch (timed for both
                 pools: compare it with twice a gather; CUDA only)

and the same at other chunk lengths, so the time per query says whether the kernel is short of work
(a 256-query chunk gives cuDNN 16 heads x 2 query tiles: 32 thread blocks for 132 SMs). Each result
carries `max_diff`, its largest difference from its reference (the exact causal call; the row-by-row
gather over the real keys): the forms are the same computation.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_long_attention.py --contexts 8192,16384,30000,49152 \
        --json OUT.json

`queued_ms` is throughput, not one call's time: independent calls in one MLX graph run concurrently on
the GPU (a 256-query chunk's attention fills 64 of the H200's 132 SMs), so it read 0.26-0.30 ms for an
attention call that takes 0.68 ms alone. `--kernels` times the device work of the `--forms` named
(default `bias_padded`: cuDNN's kernel) through CUPTI (kernel_times.py; torch on the machine): queued,
one at a time with the GPU idle between calls, and for cuDNN on 30x larger values (docs/benchmarks.md,
"H200, second session of 2026-12-04"); `--forms bias_padded,ops_bias_padded,ops_bool_padded` sets
flash attention beside MLX's composition, whose time grows with the chunk where cuDNN's does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kinfer.engines.mlx import kernels, long_context, long_kv_copy
from kinfer.engines.mlx.attention_ops import attention_bias_in_product, attention_ops
from kinfer.engines.mlx.shape_buckets import bucket

HEADS, KV_HEADS, DIM, BLOCK = 16, 8, 128, 64


def _timed(fn, repeats: int) -> dict[str, float]:
    """Per-call wall ms evaluated one by one (host + device), and per call when `repeats` are queued
    before one wait (the device's own time, the host's overlapped)."""
    for _ in range(3):  # plans, kernels and buffers first
        mx.eval(fn())
    mx.synchronize()
    single = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        single.append((time.perf_counter() - start) * 1e3)
    start = time.perf_counter()
    outs = [fn() for _ in range(repeats)]
    mx.eval(outs)
    mx.synchronize()
    queued = (time.perf_counter() - start) * 1e3 / repeats
    single.sort()
    return {"single_ms": round(single[len(single) // 2], 3), "queued_ms": round(queued, 3)}


def _forms(length: int, context: int) -> dict:
    scale = DIM**-0.5
    q = mx.random.normal((1, HEADS, length, DIM)).astype(mx.bfloat16)
    k = mx.random.normal((1, KV_HEADS, context, DIM)).astype(mx.bfloat16)
    v = mx.random.normal((1, KV_HEADS, context, DIM)).astype(mx.bfloat16)
    padded = bucket(context)
    kp = mx.pad(k, [(0, 0), (0, 0), (0, padded - context), (0, 0)])
    vp = mx.pad(v, [(0, 0), (0, 0), (0, padded - context), (0, 0)])
    query_pos = mx.arange(length)[:, None] + (context - length)
    allowed = (mx.arange(padded)[None, :] <= query_pos)[None, None]
    bias = mx.where(allowed, 0.0, -float("inf")).astype(mx.bfloat16)
    blocks = (context + BLOCK - 1) // BLOCK
    pool = mx.random.normal((2 * blocks * KV_HEADS * BLOCK, DIM)).astype(mx.bfloat16)
    ids = mx.array(list(range(0, 2 * blocks, 2)), dtype=mx.int32)  # every other block: a real table
    rows = (ids[:, None, None] * (KV_HEADS * BLOCK) + mx.arange(KV_HEADS * BLOCK)[None, None]).reshape(-1)
    mx.eval(q, k, v, kp, vp, allowed, bias, pool, rows)
    sdpa = mx.fast.scaled_dot_product_attention

    def gather():
        g = mx.take(pool, rows, axis=0).reshape(blocks, KV_HEADS, BLOCK, DIM)
        return mx.contiguous(g.transpose(1, 0, 2, 3).reshape(1, KV_HEADS, blocks * BLOCK, DIM))

    view = pool.reshape(2 * blocks, KV_HEADS, BLOCK, DIM)
    wide = (padded + BLOCK - 1) // BLOCK
    padded_ids = mx.concatenate([ids, mx.full((wide - blocks,), ids[-1].item(), dtype=mx.int32)])
    mx.eval(padded_ids)

    def gather_blocks():  # the engine's today: blocks, a [heads, T, dim] copy, then padded to the bucket
        g = view[ids].transpose(1, 0, 2, 3).reshape(1, KV_HEADS, blocks * BLOCK, DIM)[:, :, :context]
        return mx.pad(g, [(0, 0), (0, 0), (0, padded - context), (0, 0)])

    def gather_blocks_padded():  # the table padded to the bucket instead: one copy fewer
        return view[padded_ids].transpose(1, 0, 2, 3).reshape(1, KV_HEADS, wide * BLOCK, DIM)

    table = np.array(ids)
    long_rows = long_context.pool_rows(table, KV_HEADS, BLOCK, context)
    mx.eval(long_rows)

    def take_headmajor():  # one take in cuDNN's layout, padding included (the engine's off CUDA)
        return long_context.gathered(pool, long_rows, KV_HEADS)

    end = mx.array([context], dtype=mx.int32)

    def copy_kernel():  # the engine's on CUDA: keys and values (here the same pool) in one launch
        return long_kv_copy.copy_row(pool, pool, ids, end, KV_HEADS, BLOCK, padded)

    forms = {
        "causal_exact": lambda: sdpa(q, k, v, scale=scale, mask="causal"),
        "bool_padded": lambda: sdpa(q, kp, vp, scale=scale, mask=allowed),
        "bias_padded": lambda: sdpa(q, kp, vp, scale=scale, mask=bias),
        "bias_padded_large": lambda: sdpa(q * 30, kp * 30, vp, scale=scale, mask=bias),
        "none_exact": lambda: sdpa(q, k, v, scale=scale),
        "ops_bool_padded": lambda: attention_ops(q, kp, vp, scale, allowed),
        "ops_bias_padded": lambda: attention_ops(q, kp, vp, scale, bias),
        "ops_addmm_padded": lambda: attention_bias_in_product(q, kp, vp, scale, bias),
        "gather": gather,
        "gather_blocks": gather_blocks,
        "gather_blocks_padded": gather_blocks_padded,
        "take_headmajor": take_headmajor,
    }
    if kernels.on_cuda_gpu():  # the kernel exists only there
        forms["copy_kernel"] = copy_kernel
    return forms


def _kernel_times(forms: dict, context: int, repeats: int, names: list[str]) -> list[dict]:
    """Each named form's kernels through CUPTI (kernel_times.py; torch on the machine): device time per
    call, all its kernels together, three ways: queued back to back, one by one with the GPU idle 5 ms
    between calls, and (`bias_padded` only) on keys and values 30x larger (a model's are not unit
    normal): whether a kernel's own time depends on how busy the GPU was kept or on the values."""
    from kernel_times import KernelTimes

    out = []
    queries = forms["bias_padded"]().shape[2]
    for name in names:
        ways = ("queued", "spaced", "large") if name == "bias_padded" else ("queued", "spaced")
        for way in ways:
            call = forms["bias_padded_large" if way == "large" else name]
            mx.eval(call())
            mx.synchronize()
            with KernelTimes() as times:
                if way == "spaced":
                    for _ in range(repeats):
                        mx.eval(call())
                        mx.synchronize()
                        time.sleep(0.005)
                else:
                    mx.eval([call() for _ in range(repeats)])
                    mx.synchronize()
            kernels_seen = times.by_kernel()
            per_call_us = sum(k["total_ms"] for k in kernels_seen) * 1000 / repeats
            top = kernels_seen[0]
            out.append({"context": context, "form": name, "way": way, "per_call_us": per_call_us, **top})
            print(
                f"context {context:>6}  chunk {queries:>4}  {name:<16} {way:<7} {per_call_us:9.1f} us a call"
                f"  (top: {top['calls']:3d} x {top['mean_us']:8.1f} us {top['kernel'][:50]})",
                flush=True,
            )
    return out


def _difference(forms: dict, name: str, context: int) -> float | None:
    """The form's largest difference from its reference (the same attention or the same keys): masked
    attention against the exact causal call, gathers against the row-by-row one, over the real keys."""
    if name == "none_exact":
        return None  # no mask: another attention
    gathers = name.startswith(("gather", "take", "copy"))
    reference = forms["gather" if gathers else "causal_exact"]()
    got = forms[name]()
    if name == "copy_kernel":
        got = got[0]  # the keys (the values are the same pool)
    if gathers:
        reference, got = reference[:, :, :context], got[:, :, :context]
    return float(mx.abs(got.astype(mx.float32) - reference.astype(mx.float32)).max().item())


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--contexts", default="8192,16384,30000,49152")
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--kernels", action="store_true", help="device time of --forms only (CUPTI)")
    parser.add_argument("--forms", default="bias_padded", help="with --kernels: the forms to time")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"MLX {mx.__version__} on {mx.default_device()}", flush=True)
    results = []
    if args.kernels:
        for context in [int(c) for c in args.contexts.split(",")]:
            for length in [int(n) for n in args.lengths.split(",")]:
                names = args.forms.split(",")
                timed = _kernel_times(_forms(length, context), context, args.repeats, names)
                results += [{"length": length} | r for r in timed]
        if args.json:
            args.json.write_text(json.dumps({"mlx": mx.__version__, "kernels": results}, indent=1))
        return
    for context in [int(c) for c in args.contexts.split(",")]:
        for length in [int(n) for n in args.lengths.split(",")]:
            forms = _forms(length, context)
            for name, fn in forms.items():
                if name == "bias_padded_large":
                    continue  # --kernels only
                if name.startswith(("gather", "take", "copy")) and length != int(args.lengths.split(",")[0]):
                    continue  # the gathers do not depend on the chunk
                timing = _timed(fn, args.repeats)
                diff = _difference(forms, name, context)
                results.append(
                    {"context": context, "length": length, "form": name, **timing, "max_diff": diff}
                )
                print(
                    f"context {context:>6}  chunk {length:>5}  {name:<20} "
                    f"one by one {timing['single_ms']:8.3f} ms  queued {timing['queued_ms']:8.3f} ms"
                    f"  max diff {diff if diff is not None else '-'}",
                    flush=True,
                )
            mx.clear_cache()
    if args.json:
        args.json.write_text(json.dumps({"mlx": mx.__version__, "results": results}, indent=1))


if __name__ == "__main__":
    main()
