"""Deciding what a pull fetches: which GGUF file(s) of a repo, or which files of an MLX directory.

GGUF repos: the exact file name given, else the quant tag (any case), else Q4_K_M, else the smallest;
projector (`mmproj`) and `imatrix` files are never picked; a split GGUF brings every shard.
Safetensors repos: only when mlx-lm serves the `model_type`, and then only the weights and the files
that describe them. Anything else is refused, with GGUF conversions from the Hub as suggestions.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from kinfer.engines.embedding import ENCODER_TYPES
from kinfer.errors import InvalidRequest, ModelNotFound, StoreError
from kinfer.store.hub import GGUFVariant, HubClient, RemoteFile, RepoListing
from kinfer.store.refs import HubRef, dir_model_name, gguf_model_name, shard_group, variant_tag
from kinfer.store.support import mlx_support

logger = logging.getLogger(__name__)

DEFAULT_QUANT = "Q4_K_M"
# the files of an MLX / Hugging Face directory that kinfer keeps (plus *.safetensors and their index)
MLX_FILES = frozenset(
    {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "special_tokens_map.json",
        "modules.json",  # sentence-transformers: the embedding pipeline
        "config_sentence_transformers.json",
        "sentence_bert_config.json",
    }
)
# a sentence-transformers module folder's files: 1_Pooling/config.json, 2_Dense/model.safetensors
_ST_MODULE_FILE = re.compile(r"\d+_[A-Za-z]+/(config\.json|model\.safetensors)")


class UnsupportedModel(StoreError):
    """A repo kinfer cannot serve; `suggestions` are GGUF conversions found on the Hub."""

    def __init__(self, message: str, suggestions: tuple[str, ...] = ()) -> None:
        if suggestions:
            message += "; GGUF conversions on the hub: " + ", ".join(suggestions)
            message += f" (e.g. `kinfer pull {suggestions[0]}`)"
        super().__init__(message)
        self.suggestions = suggestions


@dataclass(frozen=True)
class PullPlan:
    """What one pull will fetch and the name it will install under."""

    name: str
    format: Literal["gguf", "mlx"]
    repo_id: str
    revision: str  # the commit every file is fetched at (the branch name if the Hub gave none)
    files: tuple[RemoteFile, ...]
    tag: str | None = None  # the GGUF variant's tag

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


def select_gguf(variants: list[GGUFVariant], selector: str | None) -> GGUFVariant:
    """Pick a variant: exact file name, else quant tag (case-insensitive), else Q4_K_M, else the smallest."""
    if not variants:
        raise ModelNotFound("no GGUF files")
    if selector:
        for variant in variants:
            if any(selector in (f.path, f.name) for f in variant.files):
                return variant
        lowered = selector.lower()
        by_tag = [v for v in variants if v.tag.lower() == lowered]
        if not by_tag:  # a file name given without ".gguf", or in another case
            by_tag = [
                v for v in variants if any(lowered in (f.name.lower(), f.name.lower()[:-5]) for f in v.files)
            ]
        if by_tag:
            if len(by_tag) > 1:
                logger.info("%d GGUF files carry the tag %s; taking the smallest", len(by_tag), selector)
            return min(by_tag, key=lambda v: v.size)
        tags = ", ".join(sorted({v.tag for v in variants}, key=str.lower))
        raise ModelNotFound(f"no GGUF file matches {selector!r}; available: {tags}")
    default = [v for v in variants if v.tag.upper() == DEFAULT_QUANT]
    if default:
        return min(default, key=lambda v: v.size)
    return min(variants, key=lambda v: v.size)


def _variant_for_file(listing: RepoListing, filename: str) -> GGUFVariant:
    if listing.file(filename) is None:
        raise ModelNotFound(f"no such file on the hub: {listing.repo_id}/{filename}")
    if not filename.lower().endswith(".gguf"):
        raise InvalidRequest(
            f"{filename} is not a GGUF file: a URL may name one .gguf file; for a safetensors model "
            f"pull the repo (`kinfer pull {listing.repo_id}`)"
        )
    for variant in listing.gguf_variants():
        if any(f.path == filename for f in variant.files):
            return variant
    # a file the automatic choice skips (an mmproj): the user named it, so fetch it alone
    shards = [f for f in listing.files if shard_group(f.path) == shard_group(filename)]
    return GGUFVariant(tag=variant_tag(filename), files=tuple(shards))


def read_config(client: HubClient, listing: RepoListing) -> dict[str, Any] | None:
    """The repo's config.json, or None when it has none or it is not JSON."""
    if listing.file("config.json") is None:
        return None
    raw = client.fetch(listing.repo_id, "config.json", listing.commit or listing.revision)
    try:
        config = json.loads(raw)
    except ValueError:
        logger.warning("%s: config.json is not JSON", listing.repo_id)
        return None
    return config if isinstance(config, dict) else None


def is_embedding_repo(listing: RepoListing, config: dict[str, Any]) -> bool:
    """A sentence-transformers repo (modules.json) or an encoder-only architecture."""
    return listing.file("modules.json") is not None or config.get("model_type") in ENCODER_TYPES


def mlx_files(listing: RepoListing) -> tuple[RemoteFile, ...]:
    """The files of the MLX directory: the described set, the weights and their index, top level only;
    and a sentence-transformers repo's pipeline (modules.json, 1_Pooling/config.json, Dense layers)."""
    keep = []
    for f in listing.files:
        if "/" in f.path:
            if _ST_MODULE_FILE.fullmatch(f.path):
                keep.append(f)
            continue
        if f.path in MLX_FILES or f.path.endswith((".safetensors", ".safetensors.index.json")):
            keep.append(f)
    return tuple(sorted(keep, key=lambda f: f.path))


def plan_pull(client: HubClient, ref: HubRef) -> PullPlan:
    """List the repo and decide what to fetch; raises UnsupportedModel when kinfer cannot serve it."""
    listing = client.listing(ref.repo_id, ref.revision)
    revision = listing.commit or ref.revision
    if ref.filename:
        variant = _variant_for_file(listing, ref.filename)
        return _gguf_plan(listing, variant, revision)
    variants = listing.gguf_variants()
    if variants:
        return _gguf_plan(listing, select_gguf(variants, ref.selector), revision)
    if ref.selector:
        raise ModelNotFound(f"{listing.repo_id} has no GGUF files, so no quant {ref.selector!r} to pick")
    short = PurePosixPath(listing.repo_id).name
    if not listing.safetensors():
        raise UnsupportedModel(
            f"{listing.repo_id} has no GGUF or safetensors weights",
            tuple(client.search_gguf(short, exclude=listing.repo_id)),
        )
    config = read_config(client, listing)
    if config is None:
        raise UnsupportedModel(
            f"{listing.repo_id} has safetensors but no usable config.json",
            tuple(client.search_gguf(short, exclude=listing.repo_id)),
        )
    support = mlx_support(config, embedding=is_embedding_repo(listing, config))
    if not support.supported:
        raise UnsupportedModel(
            f"MLX cannot serve {listing.repo_id}: {support.reason}",
            tuple(client.search_gguf(short, exclude=listing.repo_id)),
        )
    return PullPlan(
        name=dir_model_name(listing.repo_id),
        format="mlx",
        repo_id=listing.repo_id,
        revision=revision,
        files=mlx_files(listing),
    )


def _gguf_plan(listing: RepoListing, variant: GGUFVariant, revision: str) -> PullPlan:
    return PullPlan(
        name=gguf_model_name(listing.repo_id, variant.tag),
        format="gguf",
        repo_id=listing.repo_id,
        revision=revision,
        files=variant.files,
        tag=variant.tag,
    )
