"""What `Store.list()` shows: pulled models, loose files, split sets as one, MLX folders, the bundled one."""

from __future__ import annotations

from pathlib import Path

from kinfer.store.bundled import BUNDLED_NAME
from kinfer.store.catalog import Store
from kinfer.store.manifest import MANIFEST_NAME
from tests.fixtures.tiny_gguf import write_tiny_gguf
from tests.store.store_helpers import install_folder, write_tiny_mlx


def test_an_empty_home_lists_nothing(store: Store) -> None:
    assert store.list() == []
    assert store.warnings == []


def test_the_bundled_model_on_an_empty_home(kinfer_home: Path, smollm2_gguf: Path) -> None:
    [model] = Store(kinfer_home).list()

    assert model.name == BUNDLED_NAME == "smollm2:135m"
    assert model.source == "bundled"
    assert model.kind_label == "bundled"
    assert model.engine == "llama.cpp"
    assert model.path == smollm2_gguf
    assert model.size == smollm2_gguf.stat().st_size
    assert not model.removable


def test_a_pulled_gguf(store: Store, pull_gguf) -> None:
    pulled = pull_gguf("hf.co/owner/repo:q8_0", filename="repo-Q8_0.gguf", quant="Q8_0")

    [model] = store.list()

    assert model == pulled
    assert model.name == "hf.co/owner/repo:q8_0"
    assert model.kind_label == "kinfer, llama.cpp"
    assert model.path == store.models_dir / "hf.co--owner--repo--q8_0" / "repo-Q8_0.gguf"
    assert model.size == model.path.stat().st_size
    assert model.manifest is not None and model.manifest.source == "hf.co/owner/repo"
    assert model.removable


def test_a_pulled_split_gguf_is_one_model_opened_at_its_first_shard(store: Store, pull_gguf) -> None:
    pull_gguf("hf.co/owner/big:f16", filename="big-F16.gguf", quant="F16", split=3)

    [model] = store.list()

    assert model.path.name == "big-F16-00001-of-00003.gguf"
    assert len(model.files) == 3
    assert model.size == sum(f.stat().st_size for f in model.files)


def test_loose_gguf_files_are_named_by_their_stem(store: Store) -> None:
    write_tiny_gguf(store.models_dir / "my-model.Q8_0.gguf")
    write_tiny_gguf(store.models_dir / "Sharded.gguf", split=2)
    (store.models_dir / "notes.txt").write_text("not a model")
    (store.models_dir / ".hidden.gguf").write_bytes(b"GGUF")

    models = {m.name: m for m in store.list()}

    assert sorted(models) == ["Sharded", "my-model.Q8_0"]
    sharded = models["Sharded"]
    assert [f.name for f in sharded.files] == ["Sharded-00001-of-00002.gguf", "Sharded-00002-of-00002.gguf"]
    assert sharded.path.name == "Sharded-00001-of-00002.gguf"
    assert sharded.kind_label == "kinfer, llama.cpp"
    assert sharded.manifest is None


def test_a_split_set_with_a_missing_shard_is_listed_with_a_warning(store: Store) -> None:
    paths = write_tiny_gguf(store.models_dir / "gap.gguf", split=3)
    paths[1].unlink()

    [model] = store.list()

    assert model.name == "gap"
    assert store.warnings == [f"split model gap in {store.models_dir}: shard(s) 2 missing"]


def test_an_mlx_folder_dropped_in_by_hand(store: Store) -> None:
    folder = write_tiny_mlx(store.models_dir / "Tiny-MLX")

    [model] = store.list()

    assert model.name == "Tiny-MLX"
    assert model.format == "mlx"
    assert model.engine == "mlx"
    assert model.kind_label == "kinfer, MLX"
    assert model.path == folder
    assert {f.name for f in model.files} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_a_pulled_mlx_folder(store: Store) -> None:
    install_folder(store, "hf.co/mlx-community/Tiny-4bit", "mlx", lambda f: write_tiny_mlx(f, bits=4))

    [model] = store.list()

    assert model.name == "hf.co/mlx-community/Tiny-4bit"
    assert model.kind_label == "kinfer, MLX"
    assert model.path == store.models_dir / "hf.co--mlx-community--tiny-4bit"


def test_a_corrupt_manifest_is_a_warning_and_the_rest_still_list(store: Store, pull_gguf) -> None:
    pull_gguf("hf.co/owner/good:f32")
    broken = pull_gguf("hf.co/owner/broken:f32")
    (broken.folder / MANIFEST_NAME).write_text("{ not json")

    models = store.list()

    assert [m.name for m in models] == ["hf.co/owner/good:f32"]
    [warning] = store.warnings
    assert "models/hf.co--owner--broken--f32" in warning
    assert "not valid JSON" in warning


def test_a_pulled_model_missing_a_file_is_listed_with_a_warning(store: Store, pull_gguf) -> None:
    model = pull_gguf("hf.co/owner/repo:f32")
    model.path.unlink()

    [listed] = store.list()

    assert listed.name == "hf.co/owner/repo:f32"
    assert "missing file(s) model.gguf" in store.warnings[0]


def test_pulls_in_progress_never_list(store: Store) -> None:
    staging = store.staging_dir(store.slug_for("hf.co/owner/repo:q4_k_m"))
    write_tiny_gguf(staging / "model.gguf")

    assert staging.parent == store.home / "partial"
    assert store.list() == []


def test_newest_first(store: Store) -> None:
    install_folder(
        store,
        "hf.co/a/old:f32",
        "gguf",
        lambda f: write_tiny_gguf(f / "m.gguf"),
        pulled_at="2026-01-01T00:00:00Z",
    )
    install_folder(
        store,
        "hf.co/a/new:f32",
        "gguf",
        lambda f: write_tiny_gguf(f / "m.gguf"),
        pulled_at="2026-06-01T00:00:00Z",
    )

    assert [m.name for m in store.list()] == ["hf.co/a/new:f32", "hf.co/a/old:f32"]
