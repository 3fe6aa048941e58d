"""Scanning `KINFER_HOME/models/`: pulled models (a folder with `kinfer.json`) and loose ones.

Loose models are what a user drops in by hand: a `*.gguf` file (a split set
`name-00001-of-00003.gguf ...` counts as one model) or a folder holding `config.json` (an MLX /
Hugging Face directory). Listing only stats files; no weights or headers are read.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from kinfer.store.manifest import MANIFEST_NAME, Manifest, ManifestError, read_manifest
from kinfer.store.models import StoredModel

logger = logging.getLogger(__name__)

SPLIT_PATTERN = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class GGUFGroup:
    """One GGUF model among loose files: a single file, or every shard of a split set."""

    name: str
    files: tuple[Path, ...]  # first shard first
    missing: tuple[int, ...] = ()  # shard numbers (1-based) not found


def is_visible(path: Path) -> bool:
    return not path.name.startswith(".")


def group_gguf_files(paths: list[Path]) -> list[GGUFGroup]:
    """Group `*.gguf` files into models: shards of one split set become one group named by its base."""
    singles: list[GGUFGroup] = []
    splits: dict[tuple[str, int], dict[int, Path]] = {}
    for path in sorted(paths):
        match = SPLIT_PATTERN.match(path.name)
        if match:
            key = (match.group("base"), int(match.group("count")))
            splits.setdefault(key, {})[int(match.group("no"))] = path
        else:
            singles.append(GGUFGroup(path.stem, (path,)))
    for (base, count), shards in splits.items():
        missing = tuple(n for n in range(1, count + 1) if n not in shards)
        singles.append(GGUFGroup(base, tuple(shards[n] for n in sorted(shards)), missing))
    return sorted(singles, key=lambda g: g.name.lower())


def split_shards(path: Path, files: tuple[Path, ...]) -> tuple[Path, ...]:
    """The shards of the split set `path` starts (just `(path,)` when it is not split)."""
    match = SPLIT_PATTERN.match(path.name)
    if not match:
        return (path,)
    base = match.group("base").lower()
    shards = [f for f in files if (m := SPLIT_PATTERN.match(f.name)) and m.group("base").lower() == base]
    return tuple(sorted(shards, key=lambda f: f.name)) or (path,)


def _stat_files(files: list[Path]) -> tuple[int, float, list[Path]]:
    """Total size, newest mtime, and the files that are missing."""
    size, modified, missing = 0, 0.0, []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            missing.append(f)
            continue
        size += st.st_size
        modified = max(modified, st.st_mtime)
    return size, modified, missing


def _main_gguf(manifest: Manifest, folder: Path) -> Path:
    """The file llama.cpp opens: the first shard, or the only GGUF that is not a vision projector."""
    ggufs = [f.path for f in manifest.files if f.path.lower().endswith(".gguf")]
    weights = [p for p in ggufs if not Path(p).name.lower().startswith("mmproj")] or ggufs
    if not weights:
        return folder / manifest.files[0].path
    firsts = [p for p in weights if (m := SPLIT_PATTERN.match(Path(p).name)) and int(m.group("no")) == 1]
    return folder / (firsts[0] if firsts else weights[0])


def model_from_manifest(folder: Path, warnings: list[str]) -> StoredModel:
    """The model in a pulled folder; raises ManifestError when `kinfer.json` is unusable."""
    manifest = read_manifest(folder / MANIFEST_NAME)
    files = [folder / f.path for f in manifest.files]
    size, _, missing = _stat_files(files)
    if missing:
        names = ", ".join(str(p.relative_to(folder)) for p in missing)
        warnings.append(f"model {manifest.name} ({folder.name}): missing file(s) {names}; pull it again")
    path = _main_gguf(manifest, folder) if manifest.format == "gguf" else folder
    return StoredModel(
        name=manifest.name,
        format=manifest.format,
        source="kinfer",
        path=path,
        files=tuple(files),
        size=size,
        modified=manifest.pulled_timestamp,
        manifest=manifest,
        folder=folder,
    )


def _model_from_mlx_folder(folder: Path) -> StoredModel:
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and all(is_visible(Path(part)) for part in p.relative_to(folder).parts)
    )
    size, modified, _ = _stat_files(files)
    return StoredModel(
        name=folder.name,
        format="mlx",
        source="kinfer",
        path=folder,
        files=tuple(files),
        size=size,
        modified=modified,
        folder=folder,
    )


def _models_from_ggufs(paths: list[Path], what: Path, warnings: list[str]) -> list[StoredModel]:
    models = []
    for group in group_gguf_files(paths):
        if group.missing:
            shards = ", ".join(str(n) for n in group.missing)
            warnings.append(f"split model {group.name} in {what}: shard(s) {shards} missing")
        size, modified, _ = _stat_files(list(group.files))
        models.append(
            StoredModel(
                name=group.name,
                format="gguf",
                source="kinfer",
                path=group.files[0],
                files=group.files,
                size=size,
                modified=modified,
            )
        )
    return models


def model_from_folder(folder: Path, warnings: list[str]) -> list[StoredModel]:
    """The model(s) in one folder of `models/`: pulled (manifest), MLX (config.json) or loose GGUFs."""
    if (folder / MANIFEST_NAME).exists():
        return [model_from_manifest(folder, warnings)]
    if (folder / "config.json").is_file():
        return [_model_from_mlx_folder(folder)]
    ggufs = [p for p in folder.glob("*.gguf") if p.is_file() and is_visible(p)]
    if not ggufs:
        logger.debug("models/%s holds no model; skipped", folder.name)
    return _models_from_ggufs(ggufs, folder, warnings)


def scan_models_dir(models_dir: Path) -> tuple[list[StoredModel], list[str]]:
    """Every model under `models_dir`, and warnings for entries that could not be listed."""
    models: list[StoredModel] = []
    warnings: list[str] = []
    try:
        entries = sorted(p for p in models_dir.iterdir() if is_visible(p))
    except FileNotFoundError:
        return models, warnings
    except OSError as exc:
        return models, [f"cannot read {models_dir}: {exc}"]
    loose: list[Path] = []
    for entry in entries:
        if entry.is_dir():
            try:
                models.extend(model_from_folder(entry, warnings))
            except ManifestError as exc:
                warnings.append(f"skipped models/{entry.name}: {exc.message}")
            except OSError as exc:
                warnings.append(f"skipped models/{entry.name}: {exc}")
        elif entry.suffix.lower() == ".gguf" and entry.is_file():
            loose.append(entry)
    models.extend(_models_from_ggufs(loose, models_dir, warnings))
    return models, warnings
