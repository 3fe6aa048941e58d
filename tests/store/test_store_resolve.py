"""Finding a model by name: exact (any case, `:latest`), alias, unique prefix; the default model; aliases."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinfer.errors import AmbiguousModel, ModelNotFound, StoreError
from kinfer.store.catalog import Store
from tests.fixtures.tiny_gguf import make_ollama_store, write_tiny_gguf
from tests.store.store_helpers import install_folder


@pytest.fixture
def three(store: Store, pull_gguf) -> Store:
    pull_gguf("hf.co/bartowski/Qwen3-0.6B-GGUF:q4_k_m")
    pull_gguf("hf.co/bartowski/Qwen3-0.6B-GGUF:q8_0")
    write_tiny_gguf(store.models_dir / "tiny.gguf")
    write_tiny_gguf(store.models_dir / "tiny-2.gguf")
    return store


def test_exact_name(three: Store) -> None:
    assert (
        three.resolve("hf.co/bartowski/Qwen3-0.6B-GGUF:q8_0").name == "hf.co/bartowski/Qwen3-0.6B-GGUF:q8_0"
    )


def test_exact_name_in_any_case(three: Store) -> None:
    assert (
        three.resolve("HF.CO/BARTOWSKI/qwen3-0.6b-gguf:Q8_0").name == "hf.co/bartowski/Qwen3-0.6B-GGUF:q8_0"
    )


def test_exact_beats_prefix(three: Store) -> None:
    # "tiny" is also a prefix of "tiny-2"
    assert three.resolve("tiny").name == "tiny"


def test_latest_tag_is_the_bare_name(three: Store) -> None:
    assert three.resolve("tiny:latest").name == "tiny"


def test_unique_prefix(three: Store) -> None:
    assert three.resolve("tiny-").name == "tiny-2"
    assert (
        three.resolve("hf.co/bartowski/qwen3-0.6b-gguf:q4").name == "hf.co/bartowski/Qwen3-0.6B-GGUF:q4_k_m"
    )


def test_prefix_without_the_host(three: Store) -> None:
    assert three.resolve("bartowski/Qwen3-0.6B-GGUF:q8").name == "hf.co/bartowski/Qwen3-0.6B-GGUF:q8_0"


def test_ambiguous_prefix_lists_the_candidates(three: Store) -> None:
    with pytest.raises(AmbiguousModel) as caught:
        three.resolve("hf.co/bartowski/Qwen3")

    message = caught.value.message
    assert "matches 2 models" in message
    assert "hf.co/bartowski/Qwen3-0.6B-GGUF:q4_k_m" in message
    assert "hf.co/bartowski/Qwen3-0.6B-GGUF:q8_0" in message
    assert caught.value.status == 400


def test_unknown_name_lists_what_exists(three: Store) -> None:
    with pytest.raises(ModelNotFound) as caught:
        three.resolve("llama3")

    assert "'llama3' not found" in caught.value.message
    assert "tiny-2" in caught.value.message
    assert caught.value.status == 404


def test_unknown_name_in_an_empty_store_says_how_to_pull(store: Store) -> None:
    with pytest.raises(ModelNotFound, match="the store is empty"):
        store.resolve("anything")


def test_ollama_latest_is_found_by_bare_name(store: Store, ollama_root: Path, tmp_path: Path) -> None:
    [gguf] = write_tiny_gguf(tmp_path / "t.gguf")
    make_ollama_store(ollama_root, gguf, "llama3.2", "latest")

    assert store.resolve("llama3.2").name == "llama3.2:latest"
    assert store.resolve("LLAMA3.2:latest").name == "llama3.2:latest"


def test_own_model_wins_a_name_tie_with_ollama(
    store: Store, pull_gguf, ollama_root: Path, tmp_path: Path
) -> None:
    [gguf] = write_tiny_gguf(tmp_path / "t.gguf")
    make_ollama_store(ollama_root, gguf, "repo", "Q8_0", registry="hf.co", namespace="owner")
    pull_gguf("hf.co/owner/repo:q8_0")

    assert {m.source for m in store.list()} == {"kinfer", "ollama"}
    assert store.resolve("hf.co/owner/repo:Q8_0").source == "kinfer"


# ---- the default model ----------------------------------------------------------------------------


def test_no_default_in_an_empty_store(store: Store) -> None:
    assert store.default_model() is None


def test_the_bundled_model_is_the_last_resort(kinfer_home: Path, smollm2_gguf: Path) -> None:
    assert Store(kinfer_home).default_model().name == "smollm2:135m"


def test_the_newest_pulled_model_beats_the_bundled_one(kinfer_home: Path, smollm2_gguf: Path) -> None:
    store = Store(kinfer_home)
    for name, when in (
        ("hf.co/a/old:f32", "2026-01-01T00:00:00Z"),
        ("hf.co/a/new:f32", "2026-06-01T00:00:00Z"),
    ):
        install_folder(store, name, "gguf", lambda f: write_tiny_gguf(f / "m.gguf"), pulled_at=when)

    assert store.default_model().name == "hf.co/a/new:f32"


def test_the_marked_default_beats_the_newest(three: Store) -> None:
    three.set_default("tiny-2")

    assert (three.home / "default").read_text().strip() == "tiny-2"
    assert three.default_model().name == "tiny-2"


def test_the_configured_model_beats_everything(three: Store) -> None:
    three.set_default("tiny-2")
    configured = Store(three.home, ollama_models=None, bundled=False, configured_model="tiny")

    assert configured.default_model().name == "tiny"
    assert three.default_model("hf.co/bartowski/qwen3-0.6b-gguf:q8_0").name.endswith(":q8_0")


def test_a_configured_model_that_does_not_exist_is_an_error(three: Store) -> None:
    with pytest.raises(ModelNotFound):
        three.default_model("nope")


def test_a_marked_default_that_was_deleted_by_hand_falls_through(three: Store) -> None:
    three.set_default("tiny-2")
    (three.models_dir / "tiny-2.gguf").unlink()

    assert three.default_model() is not None
    assert any("default model 'tiny-2' is gone" in w for w in three.warnings)


# ---- aliases (Ollama's /api/copy) -----------------------------------------------------------------


def test_an_alias_lists_as_its_own_entry_sharing_the_files(three: Store) -> None:
    alias = three.copy("tiny-2", "my-assistant")

    listed = {m.name: m for m in three.list()}
    assert alias.name == "my-assistant"
    assert listed["my-assistant"].alias_of == "tiny-2"
    assert listed["my-assistant"].path == listed["tiny-2"].path
    assert listed["my-assistant"].removable
    assert three.resolve("my-assistant:latest").alias_of == "tiny-2"


def test_an_alias_of_an_alias_points_at_the_model(three: Store) -> None:
    three.copy("tiny-2", "first")
    three.copy("first", "second")

    assert three.resolve("second").alias_of == "tiny-2"


def test_an_alias_may_not_take_a_model_name(three: Store) -> None:
    with pytest.raises(StoreError, match="a model already has that name"):
        three.copy("tiny-2", "TINY")


def test_copying_an_unknown_model_fails(three: Store) -> None:
    with pytest.raises(ModelNotFound):
        three.copy("nope", "alias")


def test_removing_an_alias_keeps_the_model(three: Store) -> None:
    three.copy("tiny-2", "my-assistant")

    removed = three.remove("my-assistant")

    assert removed.is_alias
    assert (three.models_dir / "tiny-2.gguf").exists()
    assert "my-assistant" not in {m.name for m in three.list()}


def test_removing_the_model_removes_its_aliases(three: Store) -> None:
    three.copy("tiny-2", "my-assistant")

    three.remove("tiny-2")

    names = {m.name for m in three.list()}
    assert "my-assistant" not in names
    assert three.warnings == []
