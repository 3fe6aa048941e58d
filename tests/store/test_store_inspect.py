"""`describe`: a model's traits from its headers (GGUF header, config.json, safetensors headers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinfer.errors import StoreError
from kinfer.store.catalog import Store
from kinfer.store.inspect import describe, human_number
from tests.fixtures.tiny_gguf import tiny_gguf_parameter_count, write_tiny_gguf
from tests.store.store_helpers import TINY_MLX_PARAMS, install_folder, template, write_tiny_mlx


def test_the_bundled_smollm2(kinfer_home: Path, smollm2_gguf: Path) -> None:
    details = describe(Store(kinfer_home).resolve("smollm2"))

    assert details.architecture == "llama"
    assert details.parameters == 134_515_008
    assert details.parameter_label == "135M"
    assert details.quantization == "Q4_1"
    assert details.context_length == 8192
    assert details.embedding_length == 576
    assert details.block_count == 30
    assert (details.head_count, details.head_count_kv) == (9, 3)
    assert details.vocab_size == 49152
    assert details.has_chat_template and "<|im_start|>" in details.chat_template
    assert not details.thinking
    # its template never reads `tools`: kinfer writes the tool prompt itself, so tools work
    assert details.tool_format == "default"
    assert details.capabilities == ("completion", "tools")
    assert details.files[0].path == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert details.kind == "bundled"


def test_a_pulled_gguf(store: Store, pull_gguf) -> None:
    pull_gguf("hf.co/owner/repo:q8_0", quant="Q8_0", n_ctx=32768)

    details = describe(store.resolve("hf.co/owner/repo"))

    assert details.parameters == tiny_gguf_parameter_count()
    assert details.quantization == "Q8_0"
    assert details.context_length == 32768
    assert details.engine == "llama.cpp"
    assert details.kind == "kinfer, llama.cpp"


def test_quantization_falls_back_to_the_dominant_tensor_type(store: Store) -> None:
    write_tiny_gguf(store.models_dir / "no-ftype.gguf", quant="F16", file_type=False)

    assert describe(store.resolve("no-ftype")).quantization == "F16"


def test_a_split_gguf_counts_every_shard(store: Store) -> None:
    write_tiny_gguf(store.models_dir / "big.gguf", split=3)

    details = describe(store.resolve("big"))

    assert details.parameters == tiny_gguf_parameter_count()
    assert [f.path for f in details.files] == [f"big-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


@pytest.mark.parametrize(
    ("template_file", "thinking", "tool_format"),
    [
        ("smollm2-135m-instruct.jinja", False, "default"),
        ("llama-3.2-3b-instruct.jinja", False, "none"),
        ("qwen3-0.6b.jinja", True, "hermes"),
        ("qwen3.5-4b.jinja", True, "qwen3_5_xml"),
        ("qwen3-coder.jinja", False, "qwen3_5_xml"),
    ],
)
def test_template_traits_of_real_templates(
    store: Store, template_file: str, thinking: bool, tool_format: str
) -> None:
    write_tiny_gguf(store.models_dir / "t.gguf", chat_template=template(template_file))

    details = describe(store.resolve("t"))

    assert (details.thinking, details.tool_format) == (thinking, tool_format)
    assert ("tools" in details.capabilities) == (tool_format != "none")
    assert ("thinking" in details.capabilities) == thinking


def test_no_template(store: Store) -> None:
    write_tiny_gguf(store.models_dir / "bare.gguf", chat_template=None)

    details = describe(store.resolve("bare"))

    assert details.chat_template is None
    assert not details.has_chat_template
    assert details.tool_format == "default"  # the ChatML fallback with kinfer's tool prompt


def test_an_mlx_folder(store: Store) -> None:
    write_tiny_mlx(store.models_dir / "Tiny-MLX", chat_template=template("qwen3-0.6b.jinja"))

    details = describe(store.resolve("Tiny-MLX"))

    assert details.format == "mlx"
    assert details.engine == "mlx"
    assert details.architecture == "llama"
    assert details.parameters == TINY_MLX_PARAMS
    assert details.quantization == "BF16"
    assert details.context_length == 4096
    assert (details.embedding_length, details.block_count, details.head_count_kv) == (32, 2, 2)
    assert details.thinking and details.tool_format == "hermes"
    assert {f.path for f in details.files} >= {"config.json", "model.safetensors"}


def test_an_mlx_quantized_folder_counts_unpacked_parameters(store: Store) -> None:
    install_folder(store, "hf.co/mlx-community/Tiny-4bit", "mlx", lambda f: write_tiny_mlx(f, bits=4))

    details = describe(store.resolve("hf.co/mlx-community/Tiny-4bit"))

    assert details.parameters == TINY_MLX_PARAMS
    assert details.quantization == "4-bit"


def test_an_mlx_folder_with_text_config_and_template_file(store: Store) -> None:
    write_tiny_mlx(
        store.models_dir / "Qwen35-ish",
        model_type="qwen3_5",
        text_config=True,
        template_file=True,
        chat_template=template("qwen3.5-4b.jinja"),
    )

    details = describe(store.resolve("Qwen35-ish"))

    assert details.architecture == "qwen3_5"
    assert details.context_length == 4096
    assert details.tool_format == "qwen3_5_xml"


def test_to_dict_is_json(store: Store, pull_gguf) -> None:
    model = pull_gguf("hf.co/owner/repo:f32")

    data = json.loads(json.dumps(describe(store.resolve("hf.co/owner/repo")).to_dict()))

    assert data["architecture"] == "llama"
    assert data["files"] == [{"path": "model.gguf", "size": model.path.stat().st_size}]
    assert data["capabilities"] == ["completion", "tools"]  # plain ChatML: kinfer's tool prompt
    assert data["tool_format"] == "default"
    assert data["parameter_label"] == "22.7K"


def test_an_unreadable_model_is_a_store_error(store: Store) -> None:
    store.models_dir.mkdir(parents=True)
    (store.models_dir / "junk.gguf").write_bytes(b"<html>not a model</html>")

    with pytest.raises(StoreError, match="cannot read junk"):
        describe(store.resolve("junk"))


@pytest.mark.parametrize(
    ("n", "label"), [(134_515_008, "135M"), (7_615_616_512, "7.62B"), (1_000_000_000, "1B"), (950, "950")]
)
def test_human_number(n: int, label: str) -> None:
    assert human_number(n) == label


def test_a_pulled_split_gguf_in_a_subfolder(store: Store) -> None:
    install_folder(store, "hf.co/o/r:f32", "gguf", lambda f: write_tiny_gguf(f / "F32" / "r.gguf", split=2))
    model = store.resolve("hf.co/o/r")

    details = describe(model)

    assert model.path.relative_to(model.folder) == Path("F32/r-00001-of-00002.gguf")
    assert details.parameters == tiny_gguf_parameter_count()
    assert [f.path for f in details.files] == ["F32/r-00001-of-00002.gguf", "F32/r-00002-of-00002.gguf"]
