"""A fused paged decode-attention kernel for MLX's CUDA backend.

One thread block per (row, KV head) walks that row's own blocks through its block table with an
online softmax; its warps take interleaved positions and merge at the end. All the query heads that
share a KV head are served from one read of each key and value. This replaces the ~25 small MLX ops of
the portable path (`PagedKV._attend_decode_ops`) with one launch per layer, which is what decides
speed when a step is a few milliseconds of many tiny kernels.

Used only when MLX runs on CUDA, the head sizes are multiples of 32, the layer has no attention sinks
and its `PagedLayer.fused_decode` is on (the engine's `fused_decode`, from the `mlx_fused_decode`
setting: `KINFER_MLX_FUSED_DECODE=0` forces the portable path). It runs through `mx.fast.cuda_kernel`,
or with `precompiled` (the `mlx_precompiled_kernels` setting, off by default) compiled once per
instantiation and launched precompiled (precompiled.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import mlx.core as mx

from kinfer.engines.mlx.cuda_source import kernel_name, kernel_source
from kinfer.engines.mlx.precompiled import PrecompiledKernel, outputs_agree

log = logging.getLogger(__name__)

# the body shared by both paths; `width` (a block table's length) and `sc` (the softmax scale) come
# from the JIT's shape parameter and scale array, or as scalars of the precompiled kernel
HEAD = """
    const float NEG_INF = __int_as_float(0xff800000);
    constexpr int PD = D / 32;
    constexpr int PV = DV / 32;
    constexpr int U = 2;  // positions per iteration: two loads in flight hide memory latency
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row = blockIdx.y / HKV;
    const int kvh = blockIdx.y % HKV;
"""
_BOUNDS = """    const int lo = bounds[2 * row];
    const int hi = bounds[2 * row + 1];
"""
# the positions [lo, hi) walked with an online softmax; each warp's partial result left in shared memory
WALK = """
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
"""
# each warp takes some of the G heads and merges the warps' partial results of each (`top`, `total`, `wt`)
WARPS_MERGED = """
    for (int g = warp; g < G; g += NW) {
        float top = NEG_INF;
        for (int w = 0; w < NW; ++w) top = fmaxf(top, sm[w][g]);
        float total = 0.0f;
        float wt[NW];
        for (int w = 0; w < NW; ++w) {
            wt[w] = sm[w][g] == NEG_INF ? 0.0f : __expf(sm[w][g] - top);
            total += sl[w][g] * wt[w];
        }
"""
_FINISH = (
    """    // every warp finishes some of the G heads"""
    + WARPS_MERGED
    + """        T* op = out + ((size_t)(row * HKV + kvh) * G + g) * DV + lane * PV;
        for (int i = 0; i < PV; ++i) {
            float o = 0.0f;
            for (int w = 0; w < NW; ++w) o += sacc[w][g][lane * PV + i] * wt[w];
            op[i] = static_cast<T>(o / total);
        }
    }
"""
)
_BODY = HEAD + _BOUNDS + WALK + _FINISH

# what mx.fast.cuda_kernel's generated signature offers in place of the precompiled kernel's scalars
_JIT_PROLOGUE = """
    const int width = tables_shape[1];
    const float sc = scale[0];
"""
_NAME = "kinfer_paged_decode"
_INPUTS = ("q", "k", "v", "tables", "bounds")

_jit = None
_precompiled = PrecompiledKernel("paged decode attention")

SHARED_MEMORY = 44 * 1024  # static shared memory per block stays under CUDA's 48 KB


def _warps(group: int, dim_v: int) -> int:
    """Warps per block: as many as the partial results' shared memory allows (more warps, shorter
    dependent chains of loads per warp)."""
    for warps in (16, 8, 4, 2):
        if warps * group * (dim_v + 2) * 4 <= SHARED_MEMORY:
            return warps
    return 1


_cuda: bool | None = None


@dataclass
class Launch:
    """One layer configuration's launch parameters, built once (its template list, block shape)."""

    key: tuple
    dtypes: tuple[mx.Dtype, ...]  # of the inputs q, k, v, tables, bounds
    template: list[tuple[str, mx.Dtype | int]]
    warps: int
    q_heads: int
    kv_heads: int
    dim_v: int
    scale: float
    scale_array: mx.array
    binary: tuple[bytes, str] | None = None  # the precompiled module, once checked
    resolved: bool = False  # whether `binary` was looked up

    @property
    def threadgroup(self) -> tuple[int, int, int]:
        return (32 * self.warps, 1, 1)

    def grid(self, batch: int) -> tuple[int, int, int]:
        return (32 * self.warps, batch * self.kv_heads, 1)


_calls: dict[tuple, Launch] = {}


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
    *,
    precompiled: bool = False,
) -> mx.array:
    """queries [B, Hq, 1, D]; keys / values: the flat pools [blocks * kv_heads * block, D]; tables [B, W]
    int32 block ids (`block` tokens each); bounds [B, 2] int32: the positions [lo, hi) each row attends to.
    Returns [B, Hq, 1, Dv]. `precompiled`: take the precompiled kernel where it is ready and checked."""
    call = launch_for(queries, keys, values, tables, bounds, kv_heads, block, scale)
    inputs = (queries, keys, values, tables, bounds)
    if precompiled:
        binary = resolve_precompiled(call)
        if binary is not None and _precompiled.disabled is None:
            return launch_precompiled(call, binary, inputs)
    return launch_jit(call, inputs)


def launch_for(queries, keys, values, tables, bounds, kv_heads: int, block: int, scale: float) -> Launch:
    """The launch parameters of this layer configuration, built on first use."""
    dtypes = (queries.dtype, keys.dtype, values.dtype, tables.dtype, bounds.dtype)
    key = (*dtypes, queries.shape[1], queries.shape[3], values.shape[-1], kv_heads, block, scale)
    call = _calls.get(key)
    if call is None:
        q_heads, dim, dim_v = queries.shape[1], queries.shape[3], values.shape[-1]
        warps = _warps(q_heads // kv_heads, dim_v)
        template = [
            ("T", queries.dtype),
            ("D", dim),
            ("DV", dim_v),
            ("G", q_heads // kv_heads),
            ("HKV", kv_heads),
            ("BLOCK", block),
            ("NW", warps),
        ]
        scale_array = mx.array([scale], dtype=mx.float32)
        # the kernel's scale is a C float: precompiled_cuda_kernel refuses a Python float it cannot
        # hold exactly, so pass the float32 value the JIT path reads from its array
        scale = scale_array.item()
        call = _calls[key] = Launch(
            key, dtypes, template, warps, q_heads, kv_heads, dim_v, scale, scale_array
        )
    return call


def resolve_precompiled(call: Launch) -> tuple[bytes, str] | None:
    """The checked precompiled module of this configuration (compiled and checked on first use), or
    None: the JIT kernel serves it."""
    if not call.resolved:
        name = kernel_name(_NAME, [*call.dtypes[:3], *(value for _, value in call.template[1:])])
        call.binary = _precompiled.binary(
            call.key,
            name,
            lambda: precompiled_source(call, name),
            lambda data, sym: self_check(call, (data, sym)),
        )
        call.resolved = True
    return call.binary


def launch_jit(call: Launch, inputs: tuple[mx.array, ...]) -> mx.array:
    """The kernel through mx.fast.cuda_kernel (its source rebuilt by MLX on every call)."""
    global _jit
    if _jit is None:
        _jit = mx.fast.cuda_kernel(
            name=_NAME,
            input_names=[*_INPUTS, "scale"],
            output_names=["out"],
            source=_JIT_PROLOGUE + _BODY,
        )
    queries = inputs[0]
    (out,) = _jit(
        inputs=[*inputs, call.scale_array],
        template=call.template,
        grid=call.grid(queries.shape[0]),
        threadgroup=call.threadgroup,
        output_shapes=[(queries.shape[0], call.q_heads, 1, call.dim_v)],
        output_dtypes=[queries.dtype],
    )
    return out


def launch_precompiled(call: Launch, binary: tuple[bytes, str], inputs: tuple[mx.array, ...]) -> mx.array:
    """The kernel from its compiled module (the inputs made row-contiguous, as the JIT path does)."""
    queries, tables = inputs[0], inputs[3]
    (out,) = mx.fast.precompiled_cuda_kernel(
        name=binary[1],
        compiled_source=binary[0],
        inputs=list(inputs),
        output_shapes=[(queries.shape[0], call.q_heads, 1, call.dim_v)],
        output_dtypes=[queries.dtype],
        scalars=[tables.shape[1], call.scale],
        grid=call.grid(queries.shape[0]),
        threadgroup=call.threadgroup,
        ensure_row_contiguous=True,
    )
    return out


def precompiled_source(call: Launch, name: str) -> str:
    """The whole CUDA source of one instantiation (cuda_source.py)."""
    return kernel_source(
        name,
        _BODY,
        inputs=list(zip(_INPUTS, call.dtypes, strict=True)),
        outputs=[("out", call.dtypes[0])],
        scalars=[("width", int), ("sc", float)],
        template=call.template,
    )


def self_check(call: Launch, binary: tuple[bytes, str], batch: int = 3) -> str | None:
    """Both paths on the same synthetic inputs of this instantiation's shapes: None when they agree."""
    d, dv, block = call.template[1][1], call.template[2][1], call.template[5][1]
    width, blocks = 4, 6
    keys = mx.random.split(mx.random.key(20), 4)
    q = mx.random.normal((batch, call.q_heads, 1, d), key=keys[0]).astype(call.dtypes[0])
    k = mx.random.normal((blocks * call.kv_heads * block, d), key=keys[1]).astype(call.dtypes[1])
    v = mx.random.normal((blocks * call.kv_heads * block, dv), key=keys[2]).astype(call.dtypes[2])
    tables = mx.random.randint(0, blocks, (batch, width), key=keys[3]).astype(call.dtypes[3])
    # a one-token row, a nearly full table, and a window starting mid-block
    spans = [(0, 1), (0, width * block - 3), (block + 1, 3 * block + 2)]
    bounds = mx.array([spans[i % len(spans)] for i in range(batch)]).astype(call.dtypes[4])
    inputs = (q, k, v, tables, bounds)
    got, want = launch_precompiled(call, binary, inputs), launch_jit(call, inputs)
    mx.eval(got, want)
    return outputs_agree([got], [want])
