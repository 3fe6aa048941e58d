"""Borrowing from an Ollama store: listed under Ollama's own names, shown, never modified."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinfer.store.catalog import Store
from kinfer.store.inspect import describe
from kinfer.store.ollama import scan_ollama
from tests.fixtures.tiny_gguf import make_ollama_store, write_tiny_gguf
from tests.store.store_helpers import snapshot_tree


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "src" / "tiny.gguf", n_ctx=1024)[0]


def test_names_follow_ollama(ollama_root: Path, gguf: Path) -> None:
    make_ollama_store(ollama_root, gguf, "llama3.2", "latest")
    make_ollama_store(ollama_root, gguf, "mymodel", "v1", namespace="someone")
    make_ollama_store(ollama_root, gguf, "Repo-GGUF", "Q4_K_M", registry="hf.co", namespace="owner")

    models, warnings = scan_ollama(ollama_root)

    assert sorted(m.name for m in models) == [
        "hf.co/owner/Repo-GGUF:Q4_K_M",
        "llama3.2:latest",
        "someone/mymodel:v1",
    ]
    assert warnings == []


def test_listed_as_borrowed_gguf(store: Store, ollama_root: Path, gguf: Path) -> None:
    blob = make_ollama_store(ollama_root, gguf, "llama3.2", "latest")

    [model] = store.list()

    assert model.name == "llama3.2:latest"
    assert model.source == "ollama"
    assert model.kind_label == "ollama"
    assert model.engine == "llama.cpp"
    assert model.path == blob
    assert model.size == gguf.stat().st_size
    assert not model.removable


def test_shown_from_the_blob(store: Store, ollama_root: Path, gguf: Path) -> None:
    make_ollama_store(ollama_root, gguf, "llama3.2", "latest")

    details = describe(store.resolve("llama3.2"))

    assert details.architecture == "llama"
    assert details.context_length == 1024
    assert details.files[0].path.startswith("sha256-")


def test_nothing_in_the_ollama_store_changes(store: Store, ollama_root: Path, gguf: Path) -> None:
    make_ollama_store(ollama_root, gguf, "llama3.2", "latest")
    before = snapshot_tree(ollama_root)

    store.list()
    describe(store.resolve("llama3.2"))
    with pytest.raises(Exception, match="borrowed from Ollama"):
        store.remove("llama3.2")
    store.copy("llama3.2", "my-llama")
    store.remove("my-llama")

    assert snapshot_tree(ollama_root) == before


def test_models_without_a_gguf_layer_are_skipped(store: Store, ollama_root: Path, gguf: Path) -> None:
    make_ollama_store(ollama_root, gguf, "llama3.2", "latest")
    cloud = ollama_root / "manifests" / "registry.ollama.ai" / "library" / "gpt-oss" / "120b-cloud"
    cloud.parent.mkdir(parents=True)
    cloud.write_text(json.dumps({"schemaVersion": 2, "layers": []}))

    assert [m.name for m in store.list()] == ["llama3.2:latest"]
    assert store.warnings == []


def test_a_missing_blob_or_bad_manifest_is_a_warning(store: Store, ollama_root: Path, gguf: Path) -> None:
    blob = make_ollama_store(ollama_root, gguf, "gone", "latest")
    blob.unlink()
    broken = ollama_root / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    broken.parent.mkdir(parents=True)
    broken.write_text("{")

    assert store.list() == []
    assert len(store.warnings) == 2
    assert any("Ollama model broken:latest: unreadable manifest" in w for w in store.warnings)
    assert any("Ollama model gone:latest: blob" in w and "missing" in w for w in store.warnings)


def test_borrowing_can_be_switched_off(kinfer_home: Path, ollama_root: Path, gguf: Path) -> None:
    make_ollama_store(ollama_root, gguf, "llama3.2", "latest")

    assert Store(kinfer_home, ollama_models=None, bundled=False).list() == []


def test_the_default_location_comes_from_ollama_models(
    kinfer_home: Path, ollama_root: Path, gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ollama_store(ollama_root, gguf, "llama3.2", "latest")
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama_root))

    assert [m.name for m in Store(kinfer_home, bundled=False).list()] == ["llama3.2:latest"]
