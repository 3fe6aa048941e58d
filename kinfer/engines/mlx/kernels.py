"""A fused paged decode-attention kernel for MLX's CUDA backend.

One thread block per (row, KV head) walks that row's own blocks through its block table with an
online softmax; its warps take interleaved positions and merge at the end. All the query heads that
share a KV head are served from one read of each key and value. This replaces the ~25 small MLX ops of
the portable path (`PagedKV._attend_decode_ops`) with one launch per layer, which is what decides
speed when a step is a few milliseconds of many tiny kernels.

Used only when MLX runs on CUDA, the head sizes are multiples of 32, the layer has no attention sinks
and its `PagedLayer.fused_decode` is on (the engine's `fused_decode`, from the `mlx_fused_decode`
setting: `KINFER_MLX_FUSED_DECODE=0` forces the portable path).
"""

from __future__ import annotations

import logging

import mlx.core as mx

log = logging.getLogger(__name__)

_SOURCE = """
    const float NEG_INF = __int_as_float(0xff800000);
    constexpr int PD = D / 32;
    constexpr int PV = DV / 32;
    constexpr int U = 2;  // positions per iteration: two loads in flight hide memory latency
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row = blockIdx.y / HKV;
    const int kvh = blockIdx.y % HKV;
    const int width = tables_shape[1];
    const int lo = bounds[2 * row];
    const int hi = bounds[2 * row + 1];
    const float sc = scale[0];

    float qr[G][PD];
    for (int g = 0; g < G; ++g) {
        const T* qp = q + ((size_t)(row * HKV + kvh) * G + g) * D + lane * PD;
        for (int i = 0; i < PD; ++i) qr[g][i] = static_cast<float>(qp[i]) * sc;
    }
    float m[G], l[G], acc[G][PV];
    for (int g = 0; g < G; ++g) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
        for (int i = 0; i < PV; ++i) acc[g][i] = 0.0f;
    }
    for (int p0 = lo + warp * U; p0 < hi; p0 += NW * U) {
        float kr[U][PD];
        float vr[U][PV];
        bool ok[U];
        for (int u = 0; u < U; ++u) {
            const int p = p0 + u;
            ok[u] = p < hi;
            if (ok[u]) {
                const int blk = tables[row * width + p / BLOCK];
                const size_t base = ((size_t)blk * HKV + kvh) * BLOCK + (p % BLOCK);
                const T* kp = k + base * D + lane * PD;
                const T* vp = v + base * DV + lane * PV;
                for (int i = 0; i < PD; ++i) kr[u][i] = static_cast<float>(kp[i]);
                for (int i = 0; i < PV; ++i) vr[u][i] = static_cast<float>(vp[i]);
            }
        }
        for (int g = 0; g < G; ++g) {
            float s[U];
            for (int u = 0; u < U; ++u) {
                s[u] = 0.0f;
                if (ok[u]) {
                    for (int i = 0; i < PD; ++i) s[u] += qr[g][i] * kr[u][i];
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                for (int u = 0; u < U; ++u) s[u] += __shfl_xor_sync(0xffffffff, s[u], o);
            }
            for (int u = 0; u < U; ++u) {
                if (!ok[u]) continue;
                const float mn = fmaxf(m[g], s[u]);
                const float c = __expf(m[g] - mn);
                const float e = __expf(s[u] - mn);
                l[g] = l[g] * c + e;
                for (int i = 0; i < PV; ++i) acc[g][i] = acc[g][i] * c + e * vr[u][i];
                m[g] = mn;
            }
        }
    }
    __shared__ float sm[NW][G];
    __shared__ float sl[NW][G];
    __shared__ float sacc[NW][G][DV];
    for (int g = 0; g < G; ++g) {
        if (lane == 0) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
        }
        for (int i = 0; i < PV; ++i) sacc[warp][g][lane * PV + i] = acc[g][i];
    }
    __syncthreads();
    // every warp finishes some of the G heads
    for (int g = warp; g < G; g += NW) {
        float top = NEG_INF;
        for (int w = 0; w < NW; ++w) top = fmaxf(top, sm[w][g]);
        float total = 0.0f;
        float wt[NW];
        for (int w = 0; w < NW; ++w) {
            wt[w] = sm[w][g] == NEG_INF ? 0.0f : __expf(sm[w][g] - top);
            total += sl[w][g] * wt[w];
        }
        T* op = out + ((size_t)(row * HKV + kvh) * G + g) * DV + lane * PV;
        for (int i = 0; i < PV; ++i) {
            float o = 0.0f;
            for (int w = 0; w < NW; ++w) o += sacc[w][g][lane * PV + i] * wt[w];
            op[i] = static_cast<T>(o / total);
        }
    }
"""

_kernel = None


SHARED_MEMORY = 44 * 1024  # static shared memory per block stays under CUDA's 48 KB


def _warps(group: int, dim_v: int) -> int:
    """Warps per block: as many as the partial results' shared memory allows (more warps, shorter
    dependent chains of loads per warp)."""
    for warps in (16, 8, 4, 2):
        if warps * group * (dim_v + 2) * 4 <= SHARED_MEMORY:
            return warps
    return 1


_cuda: bool | None = None
_calls: dict[tuple, dict] = {}


def on_cuda_gpu() -> bool:
    """MLX computes on a CUDA GPU (where kinfer's CUDA kernels can run)."""
    return hasattr(mx, "cuda") and mx.cuda.is_available() and mx.default_device() == mx.gpu


def fused_decode_available(dim: int, dim_v: int, dtype: mx.Dtype) -> bool:
    """The kernel can serve a layer of these head sizes and dtype on this device."""
    global _cuda
    if _cuda is None:
        _cuda = on_cuda_gpu()
    return _cuda and dim % 32 == 0 and dim_v % 32 == 0 and dtype in (mx.float32, mx.float16, mx.bfloat16)


def paged_decode_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    kv_heads: int,
    block: int,
    tables: mx.array,
    bounds: mx.array,
    scale: float,
) -> mx.array:
    """queries [B, Hq, 1, D]; keys / values: the flat pools [blocks * kv_heads * block, D]; tables [B, W]
    int32 block ids (`block` tokens each); bounds [B, 2] int32: the positions [lo, hi) each row attends to.
    Returns [B, Hq, 1, Dv]."""
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(
            name="kinfer_paged_decode",
            input_names=["q", "k", "v", "tables", "bounds", "scale"],
            output_names=["out"],
            source=_SOURCE,
        )
    batch, q_heads, _, dim = queries.shape
    dim_v = values.shape[-1]
    key = (queries.dtype, dim, dim_v, q_heads, kv_heads, block, scale)
    call = _calls.get(key)
    if call is None:
        # the template list and launch shape depend only on the layer: build them once
        warps = _warps(q_heads // kv_heads, dim_v)
        call = _calls[key] = {
            "template": [
                ("T", queries.dtype),
                ("D", dim),
                ("DV", dim_v),
                ("G", q_heads // kv_heads),
                ("HKV", kv_heads),
                ("BLOCK", block),
                ("NW", warps),
            ],
            "threadgroup": (32 * warps, 1, 1),
            "scale": mx.array([scale], dtype=mx.float32),
            "warps": warps,
        }
    (out,) = _kernel(
        inputs=[queries, keys, values, tables, bounds, call["scale"]],
        template=call["template"],
        grid=(32 * call["warps"], batch * kv_heads, 1),
        threadgroup=call["threadgroup"],
        output_shapes=[(batch, q_heads, 1, dim_v)],
        output_dtypes=[queries.dtype],
    )
    return out
