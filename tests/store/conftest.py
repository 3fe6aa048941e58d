"""Store fixtures: a store on an empty KINFER_HOME with no bundled model, and pulled tiny GGUFs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kinfer.store.catalog import Store
from kinfer.store.models import StoredModel
from tests.fixtures.tiny_gguf import write_tiny_gguf
from tests.store.store_helpers import install_folder


@pytest.fixture
def ollama_root(tmp_path: Path) -> Path:
    """Where the store looks for an Ollama store (empty unless a test fills it)."""
    return tmp_path / "ollama-models"


@pytest.fixture
def store(kinfer_home: Path, ollama_root: Path) -> Store:
    """A store on an empty KINFER_HOME, without the bundled model."""
    return Store(kinfer_home, ollama_models=ollama_root, bundled=False)


@pytest.fixture
def pull_gguf(store: Store) -> Callable[..., StoredModel]:
    """Install a tiny GGUF under a store name: pull_gguf("hf.co/o/r:q8_0", quant="Q8_0", split=2)."""

    def pull(name: str, *, filename: str = "model.gguf", **kwargs) -> StoredModel:
        return install_folder(
            store, name, "gguf", lambda folder: write_tiny_gguf(folder / filename, **kwargs)
        )

    return pull
