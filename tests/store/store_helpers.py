"""Helpers for the store tests: install a model the way `pull` does, write tiny MLX folders by hand
(config.json, tokenizer_config.json, safetensors), read real templates, snapshot a folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from kinfer.store.catalog import Store
from kinfer.store.manifest import Manifest, ManifestFile, now_iso
from kinfer.store.models import StoredModel
from tests.fixtures.tiny_gguf import CHATML_TEMPLATE

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"


def install_folder(
    store: Store, name: str, fmt: str, fill: Callable[[Path], None], *, pulled_at: str | None = None
) -> StoredModel:
    """Install a model the way `kinfer pull` does: fill a staging folder, then `install` it."""
    staging = store.staging_dir(store.slug_for(name))
    fill(staging)
    files = tuple(
        ManifestFile(str(p.relative_to(staging)), p.stat().st_size)
        for p in sorted(staging.rglob("*"))
        if p.is_file()
    )
    manifest = Manifest(
        name=name,
        format=fmt,  # type: ignore[arg-type]
        source=f"hf.co/{name.removeprefix('hf.co/').split(':')[0]}",
        revision="0123abcd",
        files=files,
        pulled_at=pulled_at or now_iso(),
    )
    return store.install(staging, manifest)


def write_tiny_mlx(
    folder: Path,
    *,
    model_type: str = "llama",
    chat_template: str | None = CHATML_TEMPLATE,
    template_file: bool = False,
    bits: int | None = None,
    text_config: bool = False,
) -> Path:
    """A Hugging Face style folder: config.json, tokenizer_config.json and one safetensors file.

    `bits` writes MLX-quantized linear weights (packed uint32 + scales + biases, group size 32);
    `text_config` nests the language model's numbers the way qwen3_5 configs do;
    `template_file` puts the chat template in chat_template.jinja instead of tokenizer_config.json.
    """
    folder.mkdir(parents=True, exist_ok=True)
    hidden, layers, vocab = 32, 2, 64
    numbers = {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "vocab_size": vocab,
        "torch_dtype": "bfloat16",
    }
    config: dict = {"model_type": model_type, "architectures": ["LlamaForCausalLM"]}
    if text_config:
        config["text_config"] = {"model_type": f"{model_type}_text", **numbers}
    else:
        config.update(numbers)
    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float16)}
    for i in range(layers):
        prefix = f"model.layers.{i}"
        tensors[f"{prefix}.input_layernorm.weight"] = np.ones(hidden, np.float16)
        for proj in ("q_proj", "o_proj"):
            name = f"{prefix}.self_attn.{proj}"
            if bits:
                tensors[f"{name}.weight"] = np.zeros((hidden, hidden * bits // 32), np.uint32)
                tensors[f"{name}.scales"] = np.ones((hidden, hidden // 32), np.float16)
                tensors[f"{name}.biases"] = np.zeros((hidden, hidden // 32), np.float16)
            else:
                tensors[f"{name}.weight"] = np.zeros((hidden, hidden), np.float16)
    if bits:
        config["quantization"] = {"group_size": 32, "bits": bits}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    tokenizer_config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}
    if chat_template is not None and not template_file:
        tokenizer_config["chat_template"] = chat_template
    if chat_template is not None and template_file:
        (folder / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    return folder


# parameters write_tiny_mlx writes: embeddings + per layer (norm + 2 square projections)
TINY_MLX_PARAMS = 64 * 32 + 2 * (32 + 2 * 32 * 32)


def template(name: str) -> str:
    """A real model's chat template from tests/fixtures/templates."""
    return (TEMPLATES / name).read_text(encoding="utf-8")


def snapshot_tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under root with its size, mtime_ns and first bytes, to prove nothing changed."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, p.read_bytes()[:64])
    return out
