"""How a pull lands in the store: staged under partial/, then renamed into models/<slug> in one step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kinfer.errors import StoreError
from kinfer.store.catalog import Store
from kinfer.store.manifest import MANIFEST_NAME, Manifest, ManifestFile, now_iso, read_manifest
from kinfer.store.names import slug_for
from tests.fixtures.tiny_gguf import write_tiny_gguf


def _staged(store: Store, name: str, **kwargs) -> tuple[Path, Manifest]:
    staging = store.staging_dir(slug_for(name))
    [gguf] = write_tiny_gguf(staging / "model.gguf", **kwargs)
    manifest = Manifest(
        name=name,
        format="gguf",
        source="hf.co/owner/repo",
        revision="r1",
        files=(ManifestFile("model.gguf", gguf.stat().st_size),),
        pulled_at=now_iso(),
    )
    return staging, manifest


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("hf.co/owner/repo:Q4_K_M", "hf.co--owner--repo--q4_k_m"),
        ("hf.co/mlx-community/Qwen3-0.6B-4bit", "hf.co--mlx-community--qwen3-0.6b-4bit"),
        ("smollm2:135m", "smollm2--135m"),
        ("../../etc", "etc"),
        ("weird name/with spaces?", "weird_name--with_spaces"),
    ],
)
def test_slugs_are_one_safe_folder_name(name: str, slug: str) -> None:
    assert slug_for(name) == slug


def test_a_very_long_name_gets_a_short_unique_slug() -> None:
    a, b = slug_for("hf.co/o/" + "x" * 300 + ":a"), slug_for("hf.co/o/" + "x" * 300 + ":b")

    assert len(a) <= 120 and a != b


def test_install_renames_the_staging_folder_into_models(store: Store) -> None:
    staging, manifest = _staged(store, "hf.co/owner/repo:q4_k_m")
    inode = staging.stat().st_ino

    model = store.install(staging, manifest)

    target = store.models_dir / "hf.co--owner--repo--q4_k_m"
    assert model.folder == target
    # one rename: the same directory, never a copy that could be seen half-written
    assert target.stat().st_ino == inode
    assert not staging.exists()
    assert read_manifest(target / MANIFEST_NAME) == manifest
    assert [m.name for m in store.list()] == ["hf.co/owner/repo:q4_k_m"]


def test_installing_the_same_model_again_replaces_it(store: Store) -> None:
    staging, manifest = _staged(store, "hf.co/owner/repo:q4_k_m", n_ctx=1024)
    store.install(staging, manifest)
    staging, manifest = _staged(store, "hf.co/owner/repo:Q4_K_M", n_ctx=4096)

    model = store.install(staging, replace(manifest, revision="r2"))

    assert model.manifest.revision == "r2"
    assert [m.manifest.revision for m in store.list()] == ["r2"]
    assert not [p for p in (store.home / "partial").iterdir() if p.name.startswith(".replaced")]


def test_installing_over_a_different_model_is_refused(store: Store) -> None:
    # "a/b" and "a:b" share a slug; the second must not replace the first
    staging, manifest = _staged(store, "a/b")
    store.install(staging, manifest)
    staging, manifest = _staged(store, "a:b")

    with pytest.raises(StoreError, match=r"holds a different model \(a/b\)"):
        store.install(staging, manifest)

    assert [m.name for m in store.list()] == ["a/b"]
    assert staging.exists()


def test_installing_over_a_hand_made_folder_is_refused(store: Store) -> None:
    write_tiny_gguf(store.models_dir / "hf.co--owner--repo--f32" / "mine.gguf")
    staging, manifest = _staged(store, "hf.co/owner/repo:f32")

    with pytest.raises(StoreError, match="was not made by kinfer pull"):
        store.install(staging, manifest)


def test_a_file_of_the_wrong_size_is_refused_and_nothing_lands(store: Store) -> None:
    staging, manifest = _staged(store, "hf.co/owner/repo:f32")
    wrong = replace(manifest, files=(ManifestFile("model.gguf", 7),))

    with pytest.raises(StoreError, match="manifest says 7"):
        store.install(staging, wrong)

    assert store.list() == []
    assert not (store.models_dir / slug_for("hf.co/owner/repo:f32")).exists()


def test_a_missing_file_is_refused(store: Store) -> None:
    staging, manifest = _staged(store, "hf.co/owner/repo:f32")
    more = replace(manifest, files=(*manifest.files, ManifestFile("tokenizer.json", 2)))

    with pytest.raises(StoreError, match=r"tokenizer\.json is missing"):
        store.install(staging, more)


def test_only_folders_under_partial_can_be_installed(store: Store, tmp_path: Path) -> None:
    _, manifest = _staged(store, "hf.co/owner/repo:f32")
    elsewhere = tmp_path / "elsewhere"
    write_tiny_gguf(elsewhere / "model.gguf")

    with pytest.raises(StoreError, match="can only install from"):
        store.install(elsewhere, manifest)


def test_staging_dir_wants_a_slug(store: Store) -> None:
    with pytest.raises(StoreError, match="not a slug"):
        store.staging_dir("../escape")
