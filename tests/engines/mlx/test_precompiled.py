"""Precompiled CUDA kernels: the whole-kernel source kinfer writes for NVRTC, the guard that falls back to
mx.fast.cuda_kernel on any failure, and (where libnvrtc exists) the binary's entry point as MLX calls it.
On a CUDA GPU, tests/engines/mlx/test_kernels.py and test_gated_delta.py compare both paths' outputs."""

from __future__ import annotations

import logging
import re

import mlx.core as mx
import pytest

from kinfer.engines.mlx import gated_delta, kernels, nvrtc
from kinfer.engines.mlx.cuda_source import kernel_name, kernel_source
from kinfer.engines.mlx.precompiled import PrecompiledKernel, outputs_agree
from tests.engines.mlx.fixtures import *  # noqa: F403


def _has_nvrtc() -> bool:
    try:
        nvrtc.library()
    except nvrtc.NvrtcError:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(not _has_nvrtc(), reason="libnvrtc not found (CUDA machines have it)")


def test_the_kernel_takes_inputs_then_outputs_then_scalars_as_precompiled_cuda_kernel_passes_them():
    source = kernel_source(
        "kinfer_scale_bfloat16_4",
        "  out[0] = static_cast<T>(static_cast<float>(x[0]) * s * N);",
        inputs=[("x", mx.bfloat16), ("idx", mx.int32)],
        outputs=[("out", mx.bfloat16), ("count", mx.float32)],
        scalars=[("s", float), ("n", int)],
        template=[("T", mx.bfloat16), ("N", 4), ("FLAG", True)],
    )
    signature = source[source.index('extern "C"') : source.index("{", source.index('extern "C"'))]
    params = [p.strip() for p in signature[signature.index("(") + 1 : signature.rindex(")")].split(",")]
    assert signature.startswith('extern "C" __global__ void kinfer_scale_bfloat16_4(')
    assert params == [
        "const kinfer_bf16* x",
        "const int* idx",
        "kinfer_bf16* out",
        "float* count",
        "const float s",
        "const int n",
    ]
    assert "  using T = kinfer_bf16;\n  constexpr int N = 4;\n  constexpr bool FLAG = true;" in source
    assert "#include" not in source  # compiles without CUDA headers on the machine


def test_an_instantiation_name_is_a_c_identifier():
    name = kernel_name("kinfer_paged_decode", [mx.bfloat16, mx.float32, 128, 2, True])
    assert name == "kinfer_paged_decode_bfloat16_float32_128_2_True"
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)


def test_outputs_agree_within_a_dtype_rounding_and_not_beyond():
    a = mx.array([1.0, 2.0, -3.0], dtype=mx.bfloat16)
    assert outputs_agree([a], [a]) is None
    assert outputs_agree([a], [a + mx.array([0, 0.0078125, 0], dtype=mx.bfloat16)]) is None  # one ulp at 2
    assert "max |difference| 0.5" in outputs_agree([a], [a + 0.5])
    assert "float32" in outputs_agree([a.astype(mx.float32)], [a])


def test_a_failed_compile_turns_the_precompiled_path_off_once_with_its_reason(caplog):
    kernel = PrecompiledKernel("test kernel")
    checks = []
    with caplog.at_level(logging.WARNING, logger="kinfer.engines.mlx.precompiled"):
        got = kernel.binary("k1", "bad", lambda: "this is not C++", lambda *a: checks.append(a))
        again = kernel.binary("k2", "other", lambda: "__global__ void x() {}", lambda *a: checks.append(a))
    assert got is None and again is None and not checks
    # on a CPU machine the reason is the missing device or library; on CUDA, NVRTC's error
    assert kernel.disabled is not None and "compiling bad failed" in kernel.disabled
    assert len(caplog.records) == 1  # logged once, not once per call


@needs_nvrtc
def test_a_binary_is_used_only_after_its_self_check_passes(monkeypatch):
    monkeypatch.setattr(nvrtc, "device_capability", lambda: (9, 0))
    source = kernel_source(
        "kinfer_probe", "  out[0] = x[0];", inputs=[("x", mx.float32)], outputs=[("out", mx.float32)]
    )
    built = []

    def compile_once() -> str:
        built.append(1)
        return source

    good = PrecompiledKernel("good")
    first = good.binary("key", "kinfer_probe", compile_once, lambda data, name: None)
    assert first is not None and first[1] == "kinfer_probe" and len(first[0]) > 0
    assert good.binary("key", "kinfer_probe", compile_once, lambda data, name: "never asked") is first
    assert len(built) == 1 and good.disabled is None

    bad = PrecompiledKernel("bad")
    assert bad.binary("key", "kinfer_probe", lambda: source, lambda data, name: "out 0 differs") is None
    assert bad.disabled is not None and "out 0 differs" in bad.disabled


def _attention_launch(dtype: mx.Dtype):
    q = mx.zeros((2, 16, 1, 128), dtype=dtype)
    pool = mx.zeros((64, 128), dtype=dtype)
    table, bounds = mx.zeros((2, 4), dtype=mx.int32), mx.zeros((2, 2), dtype=mx.int32)
    return kernels.launch_for(q, pool, pool, table, bounds, 8, 64, 128**-0.5)


def _gated_delta_launch(dtype: mx.Dtype):
    q = mx.zeros((2, 1, 16, 128), dtype=dtype)
    v = mx.zeros((2, 1, 32, 128), dtype=dtype)
    g = mx.zeros((2, 1, 32), dtype=mx.float32)
    return gated_delta.launch_for(q, q, v, g, g.astype(dtype), mx.zeros((2, 32, 128, 128)))


@needs_nvrtc
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
def test_both_kernels_compile_to_the_entry_point_mlx_calls(dtype):
    # .u64 pointers for the inputs and outputs, then the scalars: what CustomKernel::eval_gpu passes
    for module, call, pointers, scalars in (
        (kernels, _attention_launch(dtype), 6, [".u32", ".f32"]),
        (gated_delta, _gated_delta_launch(dtype), 8, [".u32"]),
    ):
        name = f"kinfer_test_{module.__name__.rsplit('.', 1)[1]}"
        ptx = nvrtc.compile_source(module.precompiled_source(call, name), name, (9, 0), cubin=False)
        assert ptx.kind == "ptx" and ptx.arch == "compute_90"
        text = ptx.data.decode(errors="replace")
        entry = text[text.index(f".entry {name}(") : text.index(")", text.index(f".entry {name}("))]
        kinds = re.findall(r"\.param (\.\w+)", entry)
        assert kinds == [".u64"] * pointers + scalars, kinds
        cubin = nvrtc.compile_source(module.precompiled_source(call, name), name, (9, 0))
        assert cubin.kind == "cubin" and cubin.data[:4] == b"\x7fELF"


def test_on_a_cpu_the_engine_takes_the_portable_paths_and_compiles_nothing(make_mlx, tiny_qwen35):
    if kernels.on_cuda_gpu():
        pytest.skip("this machine has a CUDA GPU")
    compiled = (dict(kernels._precompiled._ready), dict(gated_delta._precompiled._ready))
    engine = make_mlx(tiny_qwen35, self_check=False, precompiled_kernels=True)
    on = run_jobs(engine, [job("a", [1, 2, 3, 4], max_tokens=6)])  # noqa: F405
    engine = make_mlx(tiny_qwen35, self_check=False, precompiled_kernels=False)
    off = run_jobs(engine, [job("a", [1, 2, 3, 4], max_tokens=6)])  # noqa: F405
    assert on["a"].text == off["a"].text and on["a"].new_tokens == 6
    assert (kernels._precompiled._ready, gated_delta._precompiled._ready) == compiled == ({}, {})
    assert not kernels.fused_decode_available(128, 128, mx.bfloat16) and not gated_delta.kernel_available()
