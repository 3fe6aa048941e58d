"""What `kinfer pull` accepts as a reference, and the tags it reads from GGUF file names."""

from __future__ import annotations

import pytest

from kinfer.errors import InvalidRequest
from kinfer.store.refs import HubRef, gguf_model_name, parse_ref, quant_tag, shard_info


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("owner/repo", HubRef("owner/repo")),
        ("owner/repo:Q4_K_M", HubRef("owner/repo", selector="Q4_K_M")),
        ("hf.co/owner/repo:bf16", HubRef("owner/repo", selector="bf16")),
        ("huggingface.co/owner/repo", HubRef("owner/repo")),
        ("hf.co/owner/repo:latest", HubRef("owner/repo")),
        ("owner/repo:model-Q8_0.gguf", HubRef("owner/repo", selector="model-Q8_0.gguf")),
        (
            "https://huggingface.co/owner/repo/resolve/main/model-Q4_K_M.gguf",
            HubRef("owner/repo", filename="model-Q4_K_M.gguf"),
        ),
        (
            "https://huggingface.co/owner/repo/blob/abc123/sub/model.gguf?download=true",
            HubRef("owner/repo", revision="abc123", filename="sub/model.gguf"),
        ),
        ("https://huggingface.co/owner/repo", HubRef("owner/repo")),
    ],
)
def test_accepted_references(text: str, expected: HubRef) -> None:
    assert parse_ref(text) == expected


@pytest.mark.parametrize("text", ["repo", "a/b/c", "../etc/passwd", "owner/", "https://huggingface.co/owner"])
def test_malformed_references_are_refused_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(InvalidRequest, match=r"owner/repo|resolve"):
        parse_ref(text)


@pytest.mark.parametrize(
    ("filename", "tag"),
    [
        ("Qwen3-0.6B-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "q8_0"),
        ("Model-UD-Q4_K_XL-00001-of-00003.gguf", "Q4_K_XL"),
        ("Q8_0/Model-Q8_0-00002-of-00002.gguf", "Q8_0"),
        ("model-BF16.gguf", "BF16"),
        ("tiny-IQ4_XS.gguf", "IQ4_XS"),
        ("model.gguf", None),
    ],
)
def test_quant_tags_are_read_from_file_names(filename: str, tag: str | None) -> None:
    assert quant_tag(filename) == tag


def test_shards_and_store_names() -> None:
    assert shard_info("m-Q2_K-00002-of-00003.gguf") == (2, 3)
    assert shard_info("m-Q2_K.gguf") is None
    assert gguf_model_name("Owner/Repo-GGUF", "Q4_K_M") == "hf.co/Owner/Repo-GGUF:q4_k_m"
