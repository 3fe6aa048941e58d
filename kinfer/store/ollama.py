"""Read-only borrowing of GGUF models from an Ollama store.

Ollama keeps `manifests/<registry>/<namespace>/<model>/<tag>` (an OCI-style JSON manifest) and
content-addressed `blobs/sha256-<hex>`. The layer with media type `application/vnd.ollama.image.model`
is the GGUF itself, so kinfer can serve it in place. Nothing under the Ollama folder is ever written.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from kinfer.store.models import StoredModel

logger = logging.getLogger(__name__)

DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")


def default_ollama_models() -> Path:
    """Where Ollama keeps its models: $OLLAMA_MODELS, else ~/.ollama/models."""
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else Path("~/.ollama/models").expanduser()


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The short name Ollama shows: `model:tag` for the official library, else with its prefixes."""
    if registry == DEFAULT_REGISTRY:
        if namespace == DEFAULT_NAMESPACE:
            return f"{model}:{tag}"
        return f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def blob_path(root: Path, digest: str) -> Path | None:
    """`blobs/sha256-<hex>` for a digest, or None for a digest that is not a plain sha256."""
    match = _DIGEST.match(digest)
    return root / "blobs" / f"sha256-{match.group(1)}" if match else None


def _subdirs(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _read_model(root: Path, manifest: Path, name: str) -> StoredModel | str | None:
    """The model a manifest points at; a warning string when it is broken; None when it has no GGUF."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        layers = data["layers"]
        model_layer = next((layer for layer in layers if layer.get("mediaType") == MODEL_MEDIA_TYPE), None)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"Ollama model {name}: unreadable manifest {manifest} ({exc.__class__.__name__})"
    if model_layer is None:
        # cloud models and safetensors imports carry no GGUF layer; nothing kinfer can serve
        logger.debug("Ollama model %s has no GGUF layer; skipped", name)
        return None
    blob = blob_path(root, str(model_layer.get("digest", "")))
    if blob is None:
        return f"Ollama model {name}: unexpected digest {model_layer.get('digest')!r}"
    try:
        size = blob.stat().st_size
    except OSError:
        return f"Ollama model {name}: blob {blob.name} is missing"
    return StoredModel(
        name=name,
        format="gguf",
        source="ollama",
        path=blob,
        files=(blob,),
        size=size,
        # Ollama's own `list` dates a model by its manifest
        modified=manifest.stat().st_mtime,
    )


def scan_ollama(root: Path) -> tuple[list[StoredModel], list[str]]:
    """Every GGUF model in the Ollama store at `root`, plus warnings for broken entries."""
    models: list[StoredModel] = []
    warnings: list[str] = []
    manifests = root / "manifests"
    if not manifests.is_dir():
        return models, warnings
    for registry in _subdirs(manifests):
        for namespace in _subdirs(registry):
            for model in _subdirs(namespace):
                try:
                    tags = sorted(p for p in model.iterdir() if p.is_file() and not p.name.startswith("."))
                except OSError as exc:
                    warnings.append(f"cannot read Ollama manifests in {model}: {exc}")
                    continue
                for tag in tags:
                    name = ollama_name(registry.name, namespace.name, model.name, tag.name)
                    found = _read_model(root, tag, name)
                    if isinstance(found, str):
                        warnings.append(found)
                    elif found is not None:
                        models.append(found)
    return models, warnings
