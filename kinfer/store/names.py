"""Model names: matching keys, folder slugs, and the checks that keep a name from acting as a path."""

from __future__ import annotations

import hashlib
import re

from kinfer.errors import StoreError

LATEST = ":latest"
_SLUG_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_MAX_SLUG = 120
# the longest name a model may have: hf.co/ + a Hub repo id (96 + 96) + a tag leaves room to spare
MAX_NAME_LENGTH = 256
# what a new name (an alias) may hold, as Ollama's names: `part/part:tag` of [A-Za-z0-9._-]
_PART = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_NEW_NAME = re.compile(rf"^{_PART}(?:/{_PART})*(?::{_PART})?$")


def name_key(name: str) -> str:
    """The form names are compared in: case-insensitive, and Ollama's `name:latest` equals `name`."""
    key = name.strip().lower()
    return key.removesuffix(LATEST) if key != LATEST else key


def shown(name: str, limit: int = 80) -> str:
    """A name as an error message quotes it: a 20-million-character name is not repeated back."""
    return repr(name) if len(name) <= limit else repr(name[:limit]) + f"... ({len(name):,} characters)"


def check_name(name: str, *, action: str) -> str:
    """Refuse a name that reads as a filesystem path (`../x`, `/etc/passwd`, `C:\\x`, `~/x`), or is
    longer than `MAX_NAME_LENGTH`.

    Model names may contain `/` (`hf.co/owner/repo`), but never a `..` segment, a leading `/` or
    `~`, a backslash or a control character. Checked before any lookup, so a path can never be
    matched by prefix or reach the filesystem.
    """
    stripped = name.strip()
    why = None
    if not stripped:
        why = "the name is empty"
    elif len(stripped) > MAX_NAME_LENGTH:
        why = f"model names are at most {MAX_NAME_LENGTH} characters"
    elif stripped.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", stripped):
        why = "it is a path, not a model name"
    elif "\\" in stripped or any(ord(c) < 32 for c in stripped):
        why = "model names contain no backslashes or control characters"
    elif any(part in (".", "..") for part in stripped.split("/")):
        why = "model names contain no '.' or '..' path segments"
    elif "//" in stripped or stripped.endswith("/"):
        why = "model names contain no empty path segments"
    if why:
        raise StoreError(f"refusing to {action} {shown(name)}: {why}")
    return stripped


def check_new_name(name: str, *, action: str) -> str:
    """`check_name`, plus the characters a name kinfer gives (an alias) may hold."""
    stripped = check_name(name, action=action)
    if not _NEW_NAME.match(stripped):
        raise StoreError(
            f"refusing to {action} {shown(name)}: a model name is letters, digits, '.', '_' and '-', "
            "in parts joined by '/', with an optional ':tag' (e.g. my-model:latest)"
        )
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
