"""Model names: matching keys, folder slugs, and the checks that keep a name from acting as a path."""

from __future__ import annotations

import hashlib
import re

from kinfer.errors import StoreError

LATEST = ":latest"
_SLUG_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_MAX_SLUG = 120


def name_key(name: str) -> str:
    """The form names are compared in: case-insensitive, and Ollama's `name:latest` equals `name`."""
    key = name.strip().lower()
    return key.removesuffix(LATEST) if key != LATEST else key


def check_name(name: str, *, action: str) -> str:
    """Refuse a name that reads as a filesystem path (`../x`, `/etc/passwd`, `C:\\x`, `~/x`).

    Model names may contain `/` (`hf.co/owner/repo`), but never a `..` segment, a leading `/` or
    `~`, a backslash or a control character. Checked before any lookup, so a path can never be
    matched by prefix or reach the filesystem.
    """
    stripped = name.strip()
    why = None
    if not stripped:
        why = "the name is empty"
    elif stripped.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", stripped):
        why = "it is a path, not a model name"
    elif "\\" in stripped or any(ord(c) < 32 for c in stripped):
        why = "model names contain no backslashes or control characters"
    elif any(part in (".", "..") for part in stripped.split("/")):
        why = "model names contain no '.' or '..' path segments"
    elif "//" in stripped or stripped.endswith("/"):
        why = "model names contain no empty path segments"
    if why:
        raise StoreError(f"refusing to {action} {name!r}: {why}")
    return stripped


def slug_for(name: str) -> str:
    """A filesystem-safe folder name: `hf.co/Owner/Repo:Q4_K_M` -> `hf.co--owner--repo--q4_k_m`.

    Lowercase (names compare case-insensitively, and macOS folders do too); `/` and `:` become `--`;
    anything else outside [a-z0-9._-] becomes `_`. Very long names are cut and given a hash suffix.
    """
    key = name_key(name)
    slug = _SLUG_UNSAFE.sub("_", key.replace("/", "--").replace(":", "--")).strip("._-")
    if not slug:
        slug = "model"
    if len(slug) > _MAX_SLUG:
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        slug = f"{slug[: _MAX_SLUG - 13]}-{digest}"
    return slug
