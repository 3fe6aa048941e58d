"""Which kernel each one-row product of the compiled decode step takes on CUDA (MLX's GEMV or cuBLASLt).

    PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_products.py MODEL_DIR   # on the H200 (torch: CUPTI)

Loads MODEL_DIR on kinfer's MLX engine and runs, for each dense projection of the first layer as the
compiled decode step holds it (`compiled_step.Projection.arrays`: the weight's transposed view), one
[1, 1, K] row's product and its `addmm` form, then the compiled step's first function; each 10 times in
a CUPTI window (kernel_times.py), printing the kernels it ran and its top host CUDA calls. MLX's CUDA
backend takes its GEMV kernel for a one-row Matmul against a transposed weight and cuBLASLt (a stream
captured per call) for every AddMM and for two rows or more (docs/benchmarks.md, 2026-12-04).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import mlx.core as mx
from kernel_times import KernelTimes

from kinfer.engines.mlx.engine import MlxEngine


def cases(engine: MlxEngine) -> dict[str, Callable[[], mx.array]]:
    decoder = engine._decoder
    layer = decoder._layers[0]
    found: dict[str, Callable[[], mx.array]] = {}
    for name, arrays in layer.items():
        a = arrays[0] if isinstance(arrays, list) else arrays
        if not isinstance(a, dict) or "weight" not in a:
            continue
        weight = a["weight"]
        x = mx.random.normal((1, 1, weight.shape[0])).astype(weight.dtype)
        c = mx.zeros((1, 1, weight.shape[1]), dtype=weight.dtype)
        found[f"{name} product"] = lambda x=x, w=weight: x @ w
        found[f"{name} addmm"] = lambda c=c, x=x, w=weight: mx.addmm(c, x, w)
    hidden = engine._model.args.hidden_size
    x = mx.random.normal((1, 1, hidden)).astype(mx.bfloat16)
    offsets = mx.array([5], dtype=mx.int32)
    found["decoder first (compiled)"] = lambda: decoder._first(x, offsets, layer)
    return found


def main() -> None:
    engine = MlxEngine(Path(sys.argv[1]), name="probe", rows=1, ctx=512, prefix_cache=False)
    if engine._decoder is None:
        sys.exit("no compiled decode step for this model")
    for label, product in cases(engine).items():
        mx.eval(product())
        mx.synchronize()
        with KernelTimes() as times:
            for _ in range(10):
                mx.eval(product())
            mx.synchronize()
        kernels = [r["kernel"][:70] for r in times.by_kernel()]
        calls = {r["call"]: r["calls"] for r in times.by_api_call()[:4]}
        print(f"{label:28s} {kernels} {calls}", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
