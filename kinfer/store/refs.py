"""What `kinfer pull REF` may name, parsed into a `HubRef`, and the store names pulled models get.

Accepted forms:
    owner/repo                      owner/repo:Q4_K_M              owner/repo:model-Q8_0.gguf
    hf.co/owner/repo[:QUANT]        huggingface.co/owner/repo[:QUANT]
    https://huggingface.co/owner/repo/resolve/main/model-Q4_K_M.gguf   (one file; /blob/ works too)

Store names: a GGUF pull is `hf.co/owner/repo:quant` (quant tag lowercase), an MLX directory
`hf.co/owner/repo`, so the same model pulled twice gets the same name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from kinfer.errors import InvalidRequest

HOST_PREFIXES = ("hf.co/", "huggingface.co/", "www.huggingface.co/", "hf://")
DEFAULT_REVISION = "main"
# Ollama's default tag; as a selector it means "pick for me"
LATEST = "latest"

_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")  # the Hub allows 96 characters
MAX_REF_LENGTH = 1024  # a URL to one file, with room; anything longer is not a reference
MAX_SELECTOR_LENGTH = 200

# a quantization tag inside a file name: Q4_K_M, IQ4_XS, Q8_0, BF16, F16, UD-Q4_K_XL's Q4_K_XL, MXFP4...
_QUANT_TAG = re.compile(
    r"(?:^|[-._/])("
    r"I?Q\d(?:_[A-Z0-9]+)*|T?Q\d_\d|BF16|FP16|FP32|F16|F32|MXFP4(?:_MOE)?|NVFP4"
    r")(?=[-._/]|$)",
    re.IGNORECASE,
)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class HubRef:
    """A parsed pull reference: a repo, plus a quant tag or file name, or one file from a URL."""

    repo_id: str
    selector: str | None = None  # text after ':' (a quant tag or an exact file name)
    revision: str = DEFAULT_REVISION
    filename: str | None = None  # set when a URL named one file

    def __str__(self) -> str:
        if self.filename:
            return f"hf.co/{self.repo_id}/{self.filename}"
        return f"hf.co/{self.repo_id}" + (f":{self.selector}" if self.selector else "")


def parse_ref(text: str) -> HubRef:
    """Parse a pull reference; raises `InvalidRequest` with the accepted forms when it is not one."""
    raw = text.strip()
    if len(raw) > MAX_REF_LENGTH or any(ord(c) < 32 for c in raw):
        shown = repr(raw[:80]) + ("..." if len(raw) > 80 else "")
        raise InvalidRequest(f"not a model reference: {shown} (too long, or holds control characters)")
    if raw.startswith(("http://", "https://")):
        return _parse_url(raw)
    rest = raw
    for prefix in HOST_PREFIXES:
        if rest.lower().startswith(prefix):
            rest = rest[len(prefix) :]
            break
    repo, _, selector = rest.partition(":")
    repo_id = _check_repo(repo, text)
    selector = selector.strip() or None
    if selector is not None and len(selector) > MAX_SELECTOR_LENGTH:
        raise InvalidRequest(
            f"not a model reference: the part after ':' is over {MAX_SELECTOR_LENGTH} characters"
        )
    if selector is not None and selector.lower() == LATEST:
        selector = None
    return HubRef(repo_id=repo_id, selector=selector)


def _parse_url(url: str) -> HubRef:
    parts = [unquote(p) for p in urlsplit(url).path.split("/") if p]
    if parts and parts[0] == "models":  # https://huggingface.co/models/... is not a repo, but be kind
        parts = parts[1:]
    if len(parts) == 2:
        return HubRef(repo_id=_check_repo("/".join(parts), url))
    if len(parts) >= 5 and parts[2] in ("resolve", "blob"):
        return HubRef(
            repo_id=_check_repo("/".join(parts[:2]), url),
            revision=parts[3],
            filename="/".join(parts[4:]),
        )
    raise InvalidRequest(
        f"not a Hugging Face file URL: {url} (expected https://huggingface.co/OWNER/REPO/resolve/REV/FILE)"
    )


def _check_repo(repo: str, original: str) -> str:
    # "/etc/passwd" looks like a path, not a repo: say so rather than ask the hub for etc/passwd
    pieces = repo.split("/") if repo.startswith("/") else repo.strip("/").split("/")
    if len(pieces) != 2 or not all(_NAME_PART.match(p) for p in pieces):
        raise InvalidRequest(
            f"not a model reference: {original!r} "
            "(use owner/repo, owner/repo:QUANT, hf.co/owner/repo[:QUANT] or a URL to one file)"
        )
    return "/".join(pieces)


def quant_tag(filename: str) -> str | None:
    """The quantization tag a GGUF file name carries ("Q4_K_M"), as written, or None."""
    name = _SHARD.sub(".gguf", filename)
    found = _QUANT_TAG.findall(name)
    # the last tag wins: "Qwen3-0.6B-Q4_K_M" has none earlier, "Q8_0/model-Q8_0" repeats it
    return found[-1] if found else None


def shard_info(filename: str) -> tuple[int, int] | None:
    """(index, count) for a split GGUF shard named `...-00001-of-00003.gguf`, else None."""
    match = _SHARD.search(filename)
    return (int(match.group(1)), int(match.group(2))) if match else None


def shard_group(filename: str) -> str:
    """The name shared by every shard of a split GGUF (the file name itself when not split)."""
    return _SHARD.sub(".gguf", filename)


def gguf_model_name(repo_id: str, tag: str) -> str:
    """The store name of a GGUF pull: `hf.co/owner/repo:quant`, quant lowercase."""
    return f"hf.co/{repo_id}:{tag.lower()}"


def dir_model_name(repo_id: str) -> str:
    """The store name of an MLX directory pull: `hf.co/owner/repo`."""
    return f"hf.co/{repo_id}"


def variant_tag(filename: str) -> str:
    """The tag a GGUF file is known by: its quant tag, else its file stem."""
    tag = quant_tag(filename)
    if tag:
        return tag
    return PurePosixPath(shard_group(filename)).stem
