"""`StoredModel`: one entry of the store's listing, wherever its files live."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kinfer.engines.base import EngineName
from kinfer.store.manifest import Manifest, ModelFormat

ModelSource = Literal["kinfer", "bundled", "ollama"]


@dataclass(frozen=True)
class StoredModel:
    """A model the store can serve.

    `path` is what an engine loads: the GGUF file (the first shard of a split set) or the MLX folder.
    `files` are every file that makes up the model. `folder` is the model's own folder inside
    `models/` when it has one (removing the model removes it); loose files have none.
    """

    name: str
    format: ModelFormat
    source: ModelSource
    path: Path
    files: tuple[Path, ...]
    size: int
    modified: float  # Unix time
    manifest: Manifest | None = None
    folder: Path | None = None
    alias_of: str | None = None  # set on an alias: the name of the model it points at

    @property
    def engine(self) -> EngineName:
        return "llama.cpp" if self.format == "gguf" else "mlx"

    @property
    def kind_label(self) -> str:
        """Where the model comes from and what runs it, as `kinfer list` shows it."""
        if self.source == "kinfer":
            return "kinfer, llama.cpp" if self.format == "gguf" else "kinfer, MLX"
        return self.source

    @property
    def is_alias(self) -> bool:
        return self.alias_of is not None

    @property
    def removable(self) -> bool:
        """Only kinfer's own models (and any alias) may be removed by kinfer."""
        return self.is_alias or self.source == "kinfer"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "engine": self.engine,
            "source": self.source,
            "kind": self.kind_label,
            "path": str(self.path),
            "files": [str(f) for f in self.files],
            "size": self.size,
            "modified": self.modified,
            "alias_of": self.alias_of,
            "upstream": self.manifest.source if self.manifest else None,
            "revision": self.manifest.revision if self.manifest else None,
        }
