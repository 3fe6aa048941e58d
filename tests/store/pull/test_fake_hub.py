"""The fake Hub answers huggingface_hub's own client as the real one does, so other tests can trust it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from tests.fixtures.hub_server import DEFAULT_COMMIT, FakeRepo, HubServer, git_blob_id

WEIGHTS = bytes(range(256)) * 64
CARD = b"# a model card\n"


@pytest.fixture
def repo(hub: HubServer) -> str:
    hub.repos["o/r"] = FakeRepo({"model-Q4_K_M.gguf": WEIGHTS, "README.md": CARD})
    return "o/r"


def test_model_info_lists_files_with_lfs_hashes(hub: HubServer, repo: str) -> None:
    info = HfApi().model_info(repo, files_metadata=True)
    assert info.sha == DEFAULT_COMMIT
    by_name = {s.rfilename: s for s in info.siblings}
    assert by_name["model-Q4_K_M.gguf"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert by_name["model-Q4_K_M.gguf"].size == len(WEIGHTS)
    assert by_name["README.md"].lfs is None and by_name["README.md"].blob_id == git_blob_id(CARD)


def test_the_tree_listing_matches(hub: HubServer, repo: str) -> None:
    files = {f.path: f for f in HfApi().list_repo_tree(repo, recursive=True)}
    assert files["model-Q4_K_M.gguf"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert files["README.md"].size == len(CARD)


def test_hf_hub_download_fetches_through_the_cdn_redirect(hub: HubServer, repo: str, tmp_path: Path) -> None:
    path = hf_hub_download(repo, "model-Q4_K_M.gguf", cache_dir=tmp_path)
    assert Path(path).read_bytes() == WEIGHTS
    assert Path(hf_hub_download(repo, "README.md", cache_dir=tmp_path)).read_bytes() == CARD


def test_file_metadata_carries_the_hub_headers(hub: HubServer, repo: str) -> None:
    meta = get_hf_file_metadata(hf_hub_url(repo, "model-Q4_K_M.gguf"))
    assert meta.etag == hashlib.sha256(WEIGHTS).hexdigest()  # X-Linked-Etag of an LFS file
    assert meta.commit_hash == DEFAULT_COMMIT and meta.size == len(WEIGHTS)


def test_search_finds_repos_by_every_word(hub: HubServer, repo: str) -> None:
    hub.repos["someone/Tiny-GGUF"] = FakeRepo({"t.gguf": WEIGHTS})
    assert [m.id for m in HfApi().list_models(search="tiny GGUF")] == ["someone/Tiny-GGUF"]


def test_missing_and_gated_repos_raise_huggingface_hub_errors(hub: HubServer, tmp_path: Path) -> None:
    hub.repos["meta/gated"] = FakeRepo({"m.gguf": WEIGHTS}, gated=True)
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("nobody/nothing")
    assert HfApi().model_info("meta/gated").gated == "manual"  # metadata stays public
    with pytest.raises(GatedRepoError):
        hf_hub_download("meta/gated", "m.gguf", cache_dir=tmp_path)
