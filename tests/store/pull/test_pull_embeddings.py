"""Embedding models in the store: pulled from the Hub, sized by can-run, shown with their capability."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinfer.store.can_run import MachineMemory, can_run, embedding_pass_tokens
from kinfer.store.catalog import Store
from kinfer.store.inspect import describe
from kinfer.store.pull import pull
from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.fixtures.tiny_embed import build_tiny_bert_dir, write_tiny_bert_gguf

GiB = 1024**3
MACHINE = MachineMemory(ram_total=8 * GiB, ram_available=5 * GiB)


@pytest.fixture(scope="module")
def bert_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A sentence-transformers repo as the Hub holds it, with files kinfer must leave behind."""
    folder = build_tiny_bert_dir(tmp_path_factory.mktemp("st") / "tiny-embed", pooling="cls")
    files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    files["README.md"] = b"# a tiny embedding model"
    files["onnx/model.onnx"] = b"not for kinfer"
    files["pytorch_model.bin"] = b"not for kinfer either"
    files["config_sentence_transformers.json"] = b'{"similarity_fn_name": "cosine"}'
    return files


@pytest.fixture(scope="module")
def bert_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_bert_gguf(tmp_path_factory.mktemp("gguf") / "tiny-embed.gguf").read_bytes()


def test_a_sentence_transformers_repo_brings_its_pooling_and_shows_as_an_embedding_model(
    hub: HubServer, store: Store, bert_files: dict[str, bytes]
) -> None:
    hub.repos["acme/tiny-embed"] = FakeRepo(bert_files)

    model = pull(store, "acme/tiny-embed")

    on_disk = {str(p.relative_to(model.path)) for p in model.path.rglob("*") if p.is_file()}
    assert on_disk == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
        "modules.json",
        "1_Pooling/config.json",
        "config_sentence_transformers.json",
        "kinfer.json",
    }
    details = describe(model)
    assert details.capabilities == ("embedding",) and details.pooling == "cls"
    assert details.to_dict()["capabilities"] == ["embedding"]


def test_can_run_sizes_an_embedding_repo_for_one_pass_not_for_chat_rows(
    hub: HubServer, bert_files: dict[str, bytes]
) -> None:
    hub.repos["acme/tiny-embed"] = FakeRepo(bert_files)

    narrow = can_run("acme/tiny-embed", machine=MACHINE, parallel=1)
    wide = can_run("acme/tiny-embed", machine=MACHINE, parallel=16, ctx=32768)

    assert narrow.mlx is True and narrow.best is not None
    assert any("embedding model" in note for note in narrow.notes)
    # one pass of max(min(trained context, 8192), 2048) tokens, whatever --parallel and --ctx say
    assert (
        narrow.variants[0].kv_bytes
        == wide.variants[0].kv_bytes
        == narrow.shape.kv_bytes(embedding_pass_tokens(narrow.shape.context_length), 1)
    )


def test_can_run_knows_an_embedding_gguf(hub: HubServer, bert_gguf: bytes) -> None:
    hub.repos["acme/tiny-embed-GGUF"] = FakeRepo({"tiny-embed-F32.gguf": bert_gguf})

    report = can_run("acme/tiny-embed-GGUF", machine=MACHINE)

    assert report.architecture == "bert" and report.llama_cpp is True
    assert any("embedding model" in note for note in report.notes)


def test_a_local_embedding_gguf_shows_its_capability(kinfer_home: Path, bert_gguf: bytes) -> None:
    (kinfer_home / "models").mkdir()
    (kinfer_home / "models" / "tiny-embed.gguf").write_bytes(bert_gguf)
    store = Store(kinfer_home, ollama_models=None, bundled=False)

    details = describe(store.resolve("tiny-embed"))

    assert details.capabilities == ("embedding",) and details.pooling == "mean"
