"""Fixtures for pull and can-run: a fake Hub on 127.0.0.1, tiny repos to put on it, an empty store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as save_safetensors

from kinfer.store.catalog import Store
from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.fixtures.tiny_gguf import write_tiny_gguf

# big enough that a transfer takes several chunks, so it can be cut or cancelled part way
RESUMABLE_VOCAB = 4096


@pytest.fixture(scope="session")
def gguf_bytes(tmp_path_factory: pytest.TempPathFactory):
    """Bytes of tiny GGUF files, by (quant, n_vocab, blocks); shards as a list per split count."""
    root = tmp_path_factory.mktemp("gguf")
    cache: dict[tuple, bytes | list[bytes]] = {}

    def make(quant: str = "F32", n_vocab: int = 64, blocks: int = 2, split: int = 0):
        key = (quant, n_vocab, blocks, split)
        if key not in cache:
            folder = root / "-".join(map(str, key))
            files = write_tiny_gguf(
                folder / "m.gguf", quant=quant, n_vocab=n_vocab, blocks=blocks, split=split
            )
            data = [Path(f).read_bytes() for f in files]
            cache[key] = data if split else data[0]
        return cache[key]

    return make


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A running fake Hub with no repos yet; huggingface_hub and kinfer point at it."""
    with HubServer() as server:
        server.patch_env(monkeypatch, token_dir=str(tmp_path))
        yield server


@pytest.fixture
def store(kinfer_home: Path) -> Store:
    """An empty store that borrows nothing (no Ollama models, no bundled model)."""
    return Store(kinfer_home, ollama_models=None, bundled=False)


def tiny_safetensors() -> bytes:
    """A real (tiny) safetensors file."""
    rng = np.random.default_rng(0)
    return save_safetensors({"model.embed_tokens.weight": rng.standard_normal((16, 8)).astype(np.float32)})


def mlx_repo_files(config: dict | None = None) -> dict[str, bytes]:
    """An HF-style directory as a repo holds it, with files kinfer must leave behind."""
    config = config or {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 2048,
    }
    return {
        "config.json": json.dumps(config).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "tokenizer_config.json": json.dumps({"eos_token": "<|im_end|>"}).encode(),
        "generation_config.json": b'{"eos_token_id": 2}',
        "special_tokens_map.json": b'{"eos_token": "<|im_end|>"}',
        "chat_template.jinja": b"{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "model-00001-of-00002.safetensors": tiny_safetensors(),
        "model-00002-of-00002.safetensors": tiny_safetensors(),
        "model.safetensors.index.json": b'{"metadata": {}, "weight_map": {}}',
        # what a repo also holds and a pull must not fetch
        "README.md": b"# a model card",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text",
        "pytorch_model.bin": b"\0" * 1000,
        "original/consolidated.safetensors": tiny_safetensors(),
        "onnx/model.onnx": b"\0" * 100,
    }


__all__ = ["FakeRepo", "mlx_repo_files", "tiny_safetensors"]
