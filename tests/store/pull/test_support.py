"""Which repos each engine can serve, and the per-row memory shape read from config.json or a GGUF."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kinfer.store.gguf_header import read_gguf_header
from kinfer.store.model_shape import shape_from_config, shape_from_gguf
from kinfer.store.support import llama_cpp_supports, mlx_support
from tests.fixtures.tiny_gguf import write_tiny_gguf


@pytest.mark.parametrize(
    ("config", "supported", "module"),
    [
        ({"model_type": "llama", "torch_dtype": "bfloat16"}, True, "llama"),
        ({"model_type": "qwen3_5", "text_config": {"torch_dtype": "bfloat16"}}, True, "qwen3_5"),
        ({"model_type": "mistral"}, True, "llama"),  # through mlx-lm's MODEL_REMAPPING
        ({"model_type": "qwen3", "quantization": {"bits": 4, "group_size": 64}}, True, "qwen3"),
        ({"model_type": "llama", "quantization_config": {"quant_method": "gptq", "bits": 4}}, False, "llama"),
        ({"model_type": "bert"}, False, None),
        ({}, False, None),
    ],
)
def test_mlx_support_follows_the_installed_mlx_lm(config: dict, supported: bool, module: str | None) -> None:
    answer = mlx_support(config)
    assert (answer.supported, answer.module) == (supported, module)
    assert answer.supported or answer.reason


def test_the_pull_and_can_run_code_imports_neither_engine() -> None:
    probe = (
        "import sys\n"
        "from kinfer.store.can_run import can_run\n"
        "from kinfer.store.pull import pull\n"
        "from kinfer.store.support import mlx_support\n"
        "assert mlx_support({'model_type': 'mistral'}).module == 'llama'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'llama_cpp')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_llama_cpp_knows_gguf_architectures_by_name() -> None:
    assert llama_cpp_supports("llama") is True
    assert llama_cpp_supports("qwen35") is True
    assert llama_cpp_supports("not-an-arch") is False
    assert llama_cpp_supports(None) is None


def test_a_dense_config_keeps_kv_in_every_layer() -> None:
    shape = shape_from_config(
        {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "max_position_embeddings": 8192}
    )  # fmt: skip
    assert (shape.attention_layers, shape.recurrent_layers, shape.head_dim) == (30, 0, 64)
    assert shape.kv_bytes(ctx=1, rows=1) == 30 * 3 * 64 * 2 * 2  # SmolLM2-135M: K and V, f16
    assert shape.state_bytes(rows=4) == 0


def test_a_hybrid_gguf_header_splits_recurrent_and_attention_layers(tmp_path) -> None:
    [path] = write_tiny_gguf(
        tmp_path / "hybrid.gguf",
        arch="qwen35",
        blocks=4,
        extra={
            "qwen35.full_attention_interval": 2,
            "qwen35.ssm.conv_kernel": 4,
            "qwen35.ssm.state_size": 16,
            "qwen35.ssm.group_count": 2,
            "qwen35.ssm.inner_size": 64,
            "qwen35.ssm.time_step_rank": 4,
        },
    )
    shape = shape_from_gguf(read_gguf_header(path))

    assert shape.architecture == "qwen35"
    assert (shape.attention_layers, shape.recurrent_layers) == (2, 2)
    assert shape.kv_bytes(ctx=1, rows=1) == 2 * 2 * (8 + 8) * 2  # 2 layers x 2 KV heads x (K 8 + V 8), f16
    # llama.cpp's recurrent state per layer: conv (kernel-1) x (inner + 2 x groups x state) and
    # ssm state x inner, both f32
    per_layer = (3 * (64 + 2 * 2 * 16) + 16 * 64) * 4
    assert shape.state_bytes(rows=3) == 2 * per_layer * 3
