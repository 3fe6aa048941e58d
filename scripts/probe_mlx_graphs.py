"""What MLX's CUDA graphs cost a prefill-shaped pass: host ms to launch, and to finish, a 28-layer
qwen3-0.6b-shaped stack (matmuls, norms, SiLU, causal SDPA) at token counts that change every pass
against counts that repeat.

    PYTHONPATH=/tmp/site python3 scripts/probe_mlx_graphs.py [VAR=V[,VAR=V] ...]   # one child per setting
                                                     # (default: MLX_USE_CUDA_GRAPHS=1, then =0)

Each child prints: tokens, launch ms (inside mx.async_eval), done ms (launch + waiting for the device).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

SEQUENCE = [128, 128, 128, 1024, 1024, 1024, 777, 777, 1500, 1500, 901, 902, 903, 904, 64, 64, 64]


def child() -> None:
    import mlx.core as mx

    layers, hidden, heads, kv_heads, head_dim, inter = 28, 1024, 16, 8, 128, 3072
    mx.random.seed(0)

    def w(*shape):
        return (mx.random.normal(shape) * 0.02).astype(mx.bfloat16)

    weights = [
        (
            w(hidden, (heads + 2 * kv_heads) * head_dim),
            w(heads * head_dim, hidden),
            w(hidden, 2 * inter),
            w(inter, hidden),
        )
        for _ in range(layers)
    ]
    norm = mx.ones((hidden,), dtype=mx.bfloat16)
    mx.eval(weights, norm)

    def forward(x, attention: bool):
        tokens = x.shape[1]
        for wqkv, wo, wgu, wd in weights:
            h = mx.fast.rms_norm(x, norm, 1e-6)
            qkv = h @ wqkv
            q, k, v = mx.split(qkv, [heads * head_dim, (heads + kv_heads) * head_dim], axis=-1)
            q = q.reshape(1, tokens, heads, head_dim).transpose(0, 2, 1, 3)
            k = k.reshape(1, tokens, kv_heads, head_dim).transpose(0, 2, 1, 3)
            v = v.reshape(1, tokens, kv_heads, head_dim).transpose(0, 2, 1, 3)
            if attention:
                o = mx.fast.scaled_dot_product_attention(q, k, v, scale=head_dim**-0.5, mask="causal")
            else:
                o = q
            o = o.transpose(0, 2, 1, 3).reshape(1, tokens, heads * head_dim)
            x = x + o @ wo
            h = mx.fast.rms_norm(x, norm, 1e-6)
            gate, up = mx.split(h @ wgu, 2, axis=-1)
            x = x + (gate * mx.sigmoid(gate) * up) @ wd
        return x

    for attention in (False, True):
        for tokens in SEQUENCE:
            x = mx.random.normal((1, tokens, hidden)).astype(mx.bfloat16)
            mx.eval(x)
            start = time.perf_counter()
            y = forward(x, attention)
            built = time.perf_counter()
            mx.async_eval(y)
            launched = time.perf_counter()
            mx.eval(y)
            done = time.perf_counter()
            print(
                f"attn={int(attention)} tokens={tokens:5d} build={1000 * (built - start):6.1f} "
                f"launch={1000 * (launched - built):7.1f} done={1000 * (done - built):7.1f} ms",
                flush=True,
            )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child()
        return
    settings = sys.argv[1:] or ["MLX_USE_CUDA_GRAPHS=1", "MLX_USE_CUDA_GRAPHS=0"]
    for setting in settings:  # one child each: MLX reads these once per process
        print(f"--- {setting}", flush=True)
        env = dict(os.environ, **dict(pair.split("=", 1) for pair in setting.split(",")))
        subprocess.run([sys.executable, __file__, "child"], env=env, check=True)


if __name__ == "__main__":
    main()
