"""The whole CUDA source of a kernel whose body kinfer writes for `mx.fast.cuda_kernel`, for NVRTC.

`mx.fast.cuda_kernel` takes only a kernel's body and wraps it, on every call, in a `__global__` function
(MLX's `build_kernel` in mlx/backend/cuda/custom_kernel.cpp): the inputs as `const T*`, each followed by
its `_shape` / `_strides` / `_ndim` where the body names them, then the outputs as `T*`, then the template
arguments as `constexpr` / `using` lines at the top of the body. `mx.fast.precompiled_cuda_kernel`
launches a finished binary instead and passes (`CustomKernel::eval_gpu`) the inputs' data pointers, the
outputs' data pointers, then the scalars, in that order and nothing else. This module writes that
function: `extern "C"` so the symbol is the name MLX looks up, shapes as explicit scalars, and no
`#include` at all (NVRTC's built-in intrinsics suffice; bf16 / f16 are two-byte types with their own
conversions), so compiling needs no CUDA headers on the machine.

Pure string work: it runs (and is tested) anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import mlx.core as mx

# Two-byte float types that convert like CUDA's __nv_bfloat16 / __half do under static_cast: widening
# is exact, narrowing rounds to nearest even (NaN stays NaN), so a body computes the same bits as it
# does with MLX's headers.
PRELUDE = r"""
struct kinfer_bf16 {
  unsigned short bits;
  __device__ explicit operator float() const { return __uint_as_float(((unsigned int)bits) << 16); }
  __device__ kinfer_bf16(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = (unsigned short)((u >> 16) | 0x40u);
    } else {
      bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
};
struct kinfer_f16 {
  unsigned short bits;
  __device__ explicit operator float() const {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
  }
  __device__ kinfer_f16(float f) { asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f)); }
};
"""

_TYPES = {
    mx.float32: "float",
    mx.float16: "kinfer_f16",
    mx.bfloat16: "kinfer_bf16",
    mx.int32: "int",
    mx.uint32: "unsigned int",
    mx.int64: "long long",
    mx.uint8: "unsigned char",
    mx.bool_: "bool",
}
SCALAR_TYPES = {bool: "bool", int: "int", float: "float"}


def cuda_type(dtype: mx.Dtype) -> str:
    """The C type a kernel sees for an array of `dtype`."""
    try:
        return _TYPES[dtype]
    except KeyError:
        raise ValueError(f"no CUDA type for {dtype}") from None


def template_line(name: str, value: bool | int | mx.Dtype) -> str:
    """One template argument as MLX's JIT writes it at the top of the body."""
    if isinstance(value, bool):
        return f"  constexpr bool {name} = {'true' if value else 'false'};"
    if isinstance(value, int):
        return f"  constexpr int {name} = {value};"
    return f"  using {name} = {cuda_type(value)};"


def kernel_name(base: str, parts: Sequence[object]) -> str:
    """A C identifier naming one instantiation, e.g. kinfer_paged_decode_bfloat16_128_2 (the binary's
    symbol and MLX's module name, so every instantiation needs its own)."""
    suffix = "_".join(re.sub(r"[^0-9A-Za-z]", "", str(p).removeprefix("mlx.core.")) for p in parts)
    return f"{base}_{suffix}" if suffix else base


def kernel_source(
    name: str,
    body: str,
    *,
    inputs: Sequence[tuple[str, mx.Dtype]],
    outputs: Sequence[tuple[str, mx.Dtype]],
    scalars: Sequence[tuple[str, type]] = (),
    template: Sequence[tuple[str, bool | int | mx.Dtype]] = (),
) -> str:
    """The complete translation unit of one kernel: parameters in the order precompiled_cuda_kernel
    passes them (inputs, outputs, scalars), then the template arguments and the body."""
    params = [f"    const {cuda_type(dtype)}* {arg}" for arg, dtype in inputs]
    params += [f"    {cuda_type(dtype)}* {arg}" for arg, dtype in outputs]
    params += [f"    const {SCALAR_TYPES[kind]} {arg}" for arg, kind in scalars]
    lines = [PRELUDE, f'extern "C" __global__ void {name}(', ",\n".join(params) + ") {"]
    lines += [template_line(arg, value) for arg, value in template]
    lines += [body, "}", ""]
    return "\n".join(lines)
