"""Check kinfer's precompiled CUDA kernels against the mx.fast.cuda_kernel (JIT) path, and time both.

    python scripts/check_cuda_kernels.py              # on the CUDA machine; exits 1 if the paths disagree
    python scripts/check_cuda_kernels.py --calls 500 --json out.json

For the paged decode-attention kernel (kinfer/engines/mlx/kernels.py) and the GatedDeltaNet kernel
(gated_delta.py), in the qwen3-0.6b and qwen3.5-0.8b shapes at a few batch sizes: compiles the
precompiled instantiation (NVRTC, then its own self-check), compares its output with the JIT kernel's on
the same random inputs (bit-exact, else within one rounding of the dtype), and times the host side of N
calls of each path:

- build us/call: Python making the N lazy calls (the binding, and for the JIT its source text);
- eval us/call: one mx.eval of those N outputs, divided by N (MLX encoding + the device);
- one-by-one us/call: N times (call, mx.eval), divided by N (a call's whole round trip).

Each timing runs twice per path, alternated (JIT, precompiled, JIT, precompiled); the table shows the best.

On a machine where MLX has no CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from kinfer.engines.mlx import blas  # noqa: F401  (before the first `import mlx`)

# isort: split

import mlx.core as mx
import numpy as np

ATTENTION = {  # name: (query heads, kv heads, head dim), from scripts/bench_mlx_engine.py's SHAPES
    "qwen3-0.6b": (16, 8, 128),
    "qwen3.5-0.8b": (8, 2, 256),
}
GATED_DELTA = {"qwen3.5-0.8b": (16, 16, 128, 128)}  # (key heads, value heads, key dim, value dim)


def _time(launch, calls: int) -> dict[str, float]:
    """Host microseconds per call: building N lazy calls, evaluating them at once, and one by one."""
    mx.eval(launch())  # warm: module loaded, buffers cached
    began = time.perf_counter()
    outs = [launch() for _ in range(calls)]
    built = time.perf_counter()
    mx.eval(outs)
    evaluated = time.perf_counter()
    for _ in range(calls):
        mx.eval(launch())
    ended = time.perf_counter()
    scale = 1e6 / calls
    return {
        "build_us": (built - began) * scale,
        "eval_us": (evaluated - built) * scale,
        "one_by_one_us": (ended - evaluated) * scale,
    }


def _agree(got, want) -> tuple[bool, str]:
    from kinfer.engines.mlx.precompiled import outputs_agree

    got, want = list(got), list(want)
    if all(mx.array_equal(a, b).item() for a, b in zip(got, want, strict=True)):
        return True, "exact"
    reason = outputs_agree(got, want)
    return reason is None, reason or "within rounding"


def check_attention(size: str, batch: int, calls: int, dtype: mx.Dtype, rng) -> dict:
    from kinfer.engines.mlx import kernels
    from kinfer.engines.mlx.kv import BLOCK

    q_heads, kv_heads, dim = ATTENTION[size]
    lengths = rng.integers(1, 1024, batch)
    lengths[0] = 1  # a one-token row
    per_row = (lengths + BLOCK - 1) // BLOCK
    width, blocks = int(per_row.max()), int(per_row.sum()) + 1
    tables = np.zeros((batch, width), dtype=np.int32)
    ids = rng.permutation(blocks).astype(np.int32)
    at = 0
    for i, n in enumerate(per_row):
        tables[i, :n] = ids[at : at + n]
        at += n
    bounds = np.stack([np.zeros(batch), lengths], axis=1).astype(np.int32)
    q = mx.array(rng.standard_normal((batch, q_heads, 1, dim)).astype(np.float32)).astype(dtype)
    k = mx.array(rng.standard_normal((blocks * kv_heads * BLOCK, dim)).astype(np.float32)).astype(dtype)
    v = mx.array(rng.standard_normal((blocks * kv_heads * BLOCK, dim)).astype(np.float32)).astype(dtype)
    inputs = (q, k, v, mx.array(tables), mx.array(bounds))
    call = kernels.launch_for(*inputs, kv_heads, BLOCK, dim**-0.5)
    return _compare(
        "paged decode attention",
        f"{size} {str(dtype).rsplit('.', 1)[-1]} rows {batch}",
        kernels.resolve_precompiled(call),
        kernels._precompiled.disabled,
        lambda binary: kernels.launch_precompiled(call, binary, inputs),
        lambda: kernels.launch_jit(call, inputs),
        calls,
    )


def check_gated_delta(size: str, batch: int, length: int, calls: int, rng) -> dict:
    from kinfer.engines.mlx import gated_delta

    hk, hv, dk, dv = GATED_DELTA[size]

    def rand(*shape, dtype=mx.bfloat16):
        return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

    q = rand(batch, length, hk, dk) / dk**0.5
    k = rand(batch, length, hk, dk) / dk**0.5
    g = mx.array(rng.uniform(0.8, 1.0, (batch, length, hv)).astype(np.float32))
    beta = mx.sigmoid(rand(batch, length, hv))
    inputs = (q, k, rand(batch, length, hv, dv), g, beta, rand(batch, hv, dv, dk, dtype=mx.float32))
    call = gated_delta.launch_for(*inputs)
    return _compare(
        "gated delta",
        f"{size} rows {batch} x {length} tokens",
        gated_delta.resolve_precompiled(call),
        gated_delta._precompiled.disabled,
        lambda binary: gated_delta.launch_precompiled(call, binary, inputs),
        lambda: gated_delta.launch_jit(call, inputs),
        calls,
    )


def _compare(kernel: str, case: str, binary, disabled, precompiled, jit, calls: int) -> dict:
    row = {"kernel": kernel, "case": case}
    if binary is None:
        return {**row, "ok": False, "detail": f"no precompiled kernel: {disabled}"}
    got, want = precompiled(binary), jit()
    got, want = (got,) if isinstance(got, mx.array) else got, (want,) if isinstance(want, mx.array) else want
    mx.eval(*got, *want)
    ok, detail = _agree(got, want)
    runs: dict[str, list[dict[str, float]]] = {"jit": [], "precompiled": []}
    for _ in range(2):  # alternated, the best of two: neither path gets the colder clocks
        runs["jit"].append(_time(jit, calls))
        runs["precompiled"].append(_time(lambda: precompiled(binary), calls))
    best = {path: {key: min(t[key] for t in times) for key in times[0]} for path, times in runs.items()}
    return {**row, "ok": ok, "detail": detail, "binary_bytes": len(binary[0]), **best}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="calls per timing (default 200)")
    parser.add_argument("--rows", default="1,64,256", help="batch sizes (comma separated)")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from kinfer.engines.mlx import nvrtc
    from kinfer.engines.mlx.kernels import on_cuda_gpu

    if not on_cuda_gpu():
        print(f"MLX has no CUDA GPU here (default device {mx.default_device()}): nothing to check.")
        return 0
    print(f"device {mx.device_info().get('device_name')}, compute capability {nvrtc.device_capability()}")
    print(f"NVRTC {nvrtc.version()}, mlx {mx.__version__}, {args.calls} calls per timing")
    rng = np.random.default_rng(0)
    rows = [int(r) for r in args.rows.split(",") if r]
    results = []
    for size in ATTENTION:
        for batch in rows:
            results.append(check_attention(size, batch, args.calls, mx.bfloat16, rng))
    results.append(check_attention("qwen3-0.6b", 8, args.calls, mx.float32, rng))
    for batch in rows:
        results.append(check_gated_delta("qwen3.5-0.8b", batch, 1, args.calls, rng))
    results.append(check_gated_delta("qwen3.5-0.8b", 4, 128, args.calls, rng))

    print()
    print(
        "| kernel | case | agree | binary | JIT build / eval / one-by-one us | "
        "precompiled build / eval / one-by-one us |"
    )
    print("|---|---|---|---:|---|---|")
    for r in results:
        if "jit" not in r:
            print(f"| {r['kernel']} | {r['case']} | NO: {r['detail']} | | | |")
            continue
        j, p = r["jit"], r["precompiled"]
        cells = [f"{t['build_us']:.1f} / {t['eval_us']:.1f} / {t['one_by_one_us']:.1f}" for t in (j, p)]
        agree = r["detail"] if r["ok"] else f"NO: {r['detail']}"
        print(f"| {r['kernel']} | {r['case']} | {agree} | {r['binary_bytes']} | {cells[0]} | {cells[1]} |")
    failed = [r for r in results if not r["ok"]]
    if args.json:
        args.json.write_text(
            json.dumps({"device": mx.device_info(), "results": results}, indent=2, default=str)
        )
    print()
    print("all agree" if not failed else f"{len(failed)} case(s) disagree or did not compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
