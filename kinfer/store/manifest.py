"""`kinfer.json`: the manifest kinfer writes beside every model it pulls.

It names the model, says where it came from and lists its files (path relative to the model folder,
size, sha256 when known). The store trusts it to list the model without opening any weights.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from kinfer.errors import StoreError

MANIFEST_NAME = "kinfer.json"
MANIFEST_VERSION = 1

ModelFormat = Literal["gguf", "mlx"]


class ManifestError(StoreError):
    """A manifest that cannot be read: bad JSON or a field missing or of the wrong type."""


@dataclass(frozen=True)
class ManifestFile:
    """One file of a model: `path` relative to the model folder (POSIX separators)."""

    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class Manifest:
    """What kinfer knows about a model it installed."""

    name: str
    format: ModelFormat
    source: str | None  # e.g. "hf.co/owner/repo"
    revision: str | None
    files: tuple[ManifestFile, ...]
    pulled_at: str  # ISO 8601

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def pulled_timestamp(self) -> float:
        """`pulled_at` as a Unix timestamp (naive times are taken as UTC)."""
        moment = datetime.fromisoformat(self.pulled_at.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return {"version": MANIFEST_VERSION, **data}


def now_iso() -> str:
    """The current UTC time in the form `pulled_at` uses."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _field(data: dict[str, Any], key: str, kinds: tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise ManifestError(f"{where}: missing field {key!r}")
    value = data[key]
    # bool is an int subclass; a size of `true` is still wrong
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise ManifestError(f"{where}: field {key!r} should be {names}, got {type(value).__name__}")
    return value


def _safe_relative(path: str, where: str) -> str:
    parts = PurePosixPath(path).parts
    if not path or path.startswith("/") or "\\" in path or ".." in parts or ":" in path.split("/")[0]:
        raise ManifestError(f"{where}: file path {path!r} is not a plain relative path")
    return path


def manifest_from_dict(data: Any, where: str = "manifest") -> Manifest:
    """Validate a decoded manifest; raises `ManifestError` naming the first problem."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    fmt = _field(data, "format", (str,), where)
    if fmt not in ("gguf", "mlx"):
        raise ManifestError(f"{where}: format {fmt!r} should be 'gguf' or 'mlx'")
    raw_files = _field(data, "files", (list,), where)
    files = []
    for i, item in enumerate(raw_files):
        at = f"{where}: files[{i}]"
        if not isinstance(item, dict):
            raise ManifestError(f"{at}: expected an object")
        files.append(
            ManifestFile(
                path=_safe_relative(_field(item, "path", (str,), at), at),
                size=_field(item, "size", (int,), at),
                sha256=item.get("sha256") if isinstance(item.get("sha256"), str) else None,
            )
        )
    if not files:
        raise ManifestError(f"{where}: lists no files")
    manifest = Manifest(
        name=_field(data, "name", (str,), where),
        format=fmt,
        source=_field(data, "source", (str, type(None)), where) if "source" in data else None,
        revision=_field(data, "revision", (str, type(None)), where) if "revision" in data else None,
        files=tuple(files),
        pulled_at=_field(data, "pulled_at", (str,), where),
    )
    if not manifest.name.strip():
        raise ManifestError(f"{where}: empty model name")
    try:
        manifest.pulled_timestamp  # noqa: B018 - validates the date
    except ValueError:
        raise ManifestError(f"{where}: pulled_at {manifest.pulled_at!r} is not an ISO 8601 time") from None
    return manifest


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and validate a `kinfer.json`; any problem raises `ManifestError` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    return manifest_from_dict(data, str(path))


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON beside `path` then rename over it, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(folder: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write `folder/kinfer.json` atomically; returns its path."""
    path = Path(folder) / MANIFEST_NAME
    write_json_atomic(path, manifest.to_dict())
    return path
