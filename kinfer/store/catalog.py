"""`Store`: the model catalog under KINFER_HOME, plus borrowed Ollama models and the bundled one.

Layout of `home`:
  models/<slug>/kinfer.json + files   a pulled model (or a loose `*.gguf` / MLX folder dropped in)
  partial/<slug>/                     a pull in progress; never listed
  aliases.json                        {"alias": "model name"} (Ollama's /api/copy)
  default                             the name of the default model, one line

Every call re-reads the disk (a stat per file, no weights), so a model pulled or removed by another
process shows up at once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kinfer.config import Settings
from kinfer.errors import AmbiguousModel, ModelNotFound, StoreError
from kinfer.store.bundled import BUNDLED_PACKAGE, BUNDLED_REMOVE_HINT, bundled_model
from kinfer.store.local import model_from_manifest, scan_models_dir
from kinfer.store.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    manifest_from_dict,
    read_manifest,
    write_json_atomic,
    write_manifest,
)
from kinfer.store.models import StoredModel
from kinfer.store.names import MAX_NAME_LENGTH, check_name, check_new_name, name_key, shown, slug_for
from kinfer.store.nofollow import refuse_link
from kinfer.store.ollama import default_ollama_models, scan_ollama

logger = logging.getLogger(__name__)

ALIASES_FILE = "aliases.json"
DEFAULT_FILE = "default"
# exact-name ties (a pulled model and an Ollama one both called hf.co/x/y:q4_k_m): kinfer's own wins
_SOURCE_RANK = {"kinfer": 0, "bundled": 1, "ollama": 2}
_MAX_LISTED = 12
_USE_DEFAULT = object()


def _exact(query: str, models: list[StoredModel]) -> StoredModel | None:
    key = name_key(query)
    exact = [m for m in models if name_key(m.name) == key]
    return min(exact, key=lambda m: (_SOURCE_RANK[m.source], m.is_alias)) if exact else None


def _prefixed(query: str, models: list[StoredModel]) -> list[StoredModel]:
    lowered = query.lower()
    candidates = [m for m in models if m.name.lower().startswith(lowered)]
    if not candidates:
        # `owner/repo` finds `hf.co/owner/repo:q4_k_m`
        candidates = [m for m in models if m.name.lower().removeprefix("hf.co/").startswith(lowered)]
    return candidates


def _names(models: list[StoredModel]) -> str:
    shown = ", ".join(m.name for m in models[:_MAX_LISTED])
    return shown + (f", ... ({len(models) - _MAX_LISTED} more)" if len(models) > _MAX_LISTED else "")


class Store:
    """The models kinfer can serve: its own under `home/models`, Ollama's (read-only), the bundled one.

    `ollama_models` defaults to $OLLAMA_MODELS or ~/.ollama/models; pass None to borrow nothing.
    `configured_model` (Settings.model) overrides the default model when given.
    """

    def __init__(
        self,
        home: Path,
        *,
        ollama_models: Path | None = _USE_DEFAULT,  # type: ignore[assignment]
        bundled: bool = True,
        configured_model: str | None = None,
    ) -> None:
        self.home = Path(home).expanduser()
        self.ollama_models = default_ollama_models() if ollama_models is _USE_DEFAULT else ollama_models
        self.bundled = bundled
        self.configured_model = configured_model
        self.warnings: list[str] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        return cls(settings.home, configured_model=settings.model)

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def partial_dir(self) -> Path:
        return self.home / "partial"

    # ---- listing and lookup -------------------------------------------------------------------

    def list(self) -> list[StoredModel]:
        """Every model, newest first; problems found on the way are left in `self.warnings`."""
        models, warnings = scan_models_dir(self.models_dir)
        if self.bundled and (model := bundled_model()) is not None:
            models.append(model)
        if self.ollama_models is not None:
            borrowed, more = scan_ollama(self.ollama_models)
            models.extend(borrowed)
            warnings.extend(more)
        models.extend(self._alias_entries(models, warnings))
        self.warnings = warnings
        for warning in warnings:
            logger.debug("store: %s", warning)
        return sorted(models, key=lambda m: (-m.modified, m.name.lower()))

    def resolve(self, name: str) -> StoredModel:
        """Find a model by exact name (any case; `x:latest` == `x`), alias, or unique prefix."""
        query = name.strip()
        if not query:
            raise ModelNotFound("no model name given")
        if len(query) > MAX_NAME_LENGTH:  # no model has such a name: say so without matching it
            raise ModelNotFound(
                f"model {shown(query)} not found: names are at most {MAX_NAME_LENGTH} characters"
            )
        models = self.list()
        exact = _exact(query, models)
        if exact is not None:
            return exact
        candidates = _prefixed(query, models)
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            ordered = sorted(candidates, key=lambda m: m.name.lower())
            raise AmbiguousModel(
                f"model name {query!r} matches {len(candidates)} models: {_names(ordered)}; "
                "give more of the name"
            )
        if not models:
            raise ModelNotFound(
                f"model {query!r} not found: the store is empty "
                "(pull one with `kinfer pull hf.co/OWNER/REPO`)"
            )
        ordered = sorted(models, key=lambda m: m.name.lower())
        raise ModelNotFound(f"model {query!r} not found; available: {_names(ordered)}")

    def resolve_exact(self, name: str) -> StoredModel:
        """Find a model by its exact name or alias only (any case; `x:latest` == `x`): what removal
        takes, so `o/b` never deletes `hf.co/o/Beta-GGUF:q4_k_m`. A prefix gets "did you mean"."""
        query = check_name(name, action="look up")
        models = self.list()
        exact = _exact(query, models)
        if exact is not None:
            return exact
        candidates = sorted(_prefixed(query, models), key=lambda m: m.name.lower())
        hint = f"; did you mean {_names(candidates)}? (give the whole name)" if candidates else ""
        raise ModelNotFound(f"model {query!r} not found{hint}")

    def default_model(self, configured: str | None = None) -> StoredModel | None:
        """The model to serve when a request names none.

        In order: `configured` (Settings.model; given here or to the constructor), the model marked
        with `set_default`, the newest pulled model, the bundled one. None when there is none.
        """
        if configured := configured or self.configured_model:
            return self.resolve(configured)
        models = self.list()
        marked = self._read_default()
        if marked:
            try:
                return self.resolve(marked)
            except (ModelNotFound, AmbiguousModel) as exc:
                self.warnings.append(f"default model {marked!r} is gone ({exc.message})")
        own = [m for m in models if m.source == "kinfer" and not m.is_alias]
        if own:
            return max(own, key=lambda m: m.modified)
        return next((m for m in models if m.source == "bundled"), None)

    def set_default(self, name: str) -> StoredModel:
        """Mark a model as the default one (kept in `home/default`)."""
        model = self.resolve(name)
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.home / f".{DEFAULT_FILE}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(model.name + "\n", encoding="utf-8")
        os.replace(tmp, self.home / DEFAULT_FILE)
        return model

    def _read_default(self) -> str | None:
        try:
            text = (self.home / DEFAULT_FILE).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return text or None

    # ---- aliases ------------------------------------------------------------------------------

    def _read_aliases(self, warnings: list[str] | None = None) -> dict[str, str]:
        path = self.home / ALIASES_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            if warnings is not None:
                warnings.append(f"ignored {path}: {exc}")
            return {}
        if not isinstance(data, dict):
            return {}
        aliases = {}
        for alias, target in data.items():
            try:
                check_name(str(alias), action="list the alias")
            except StoreError as exc:  # written by an older kinfer, or by hand
                if warnings is not None:
                    warnings.append(f"ignored an alias in {path}: {exc.message}")
                continue
            if isinstance(target, str):
                aliases[str(alias)] = target
        return aliases

    def _alias_entries(self, models: list[StoredModel], warnings: list[str]) -> list[StoredModel]:
        by_key: dict[str, StoredModel] = {}
        for model in sorted(models, key=lambda m: _SOURCE_RANK[m.source], reverse=True):
            by_key[name_key(model.name)] = model  # the best-ranked source is written last and wins
        entries = []
        for alias, target in self._read_aliases(warnings).items():
            model = by_key.get(name_key(target))
            if model is None:
                warnings.append(f"alias {alias} points at {target}, which is no longer in the store")
                continue
            if name_key(alias) in by_key:
                warnings.append(f"alias {alias} is hidden by a model of the same name")
                continue
            entries.append(replace(model, name=alias, alias_of=model.name))
        return entries

    def copy(self, source: str, alias: str) -> StoredModel:
        """Give a model a second name (Ollama's /api/copy); the files are shared, not copied."""
        alias = check_new_name(alias, action="create the alias")
        target = self.resolve(source)
        target_name = target.alias_of or target.name
        clash = [m for m in self.list() if not m.is_alias and name_key(m.name) == name_key(alias)]
        if clash:
            raise StoreError(f"cannot create the alias {alias!r}: a model already has that name")
        aliases = {k: v for k, v in self._read_aliases().items() if name_key(k) != name_key(alias)}
        aliases[alias] = target_name
        write_json_atomic(self.home / ALIASES_FILE, aliases)
        logger.debug("alias %s -> %s", alias, target_name)
        return replace(target, name=alias, alias_of=target_name)

    def _drop_aliases(self, keep: Callable[[str, str], bool]) -> None:
        aliases = self._read_aliases()
        kept = {k: v for k, v in aliases.items() if keep(k, v)}
        if kept != aliases:
            write_json_atomic(self.home / ALIASES_FILE, kept)

    # ---- removal ------------------------------------------------------------------------------

    def remove(self, name: str) -> StoredModel:
        """Delete a model whole (its folder, or every shard), or just the alias when `name` is one.

        Refuses names that look like paths, borrowed Ollama models, the bundled model and anything
        that would reach outside `home/models`.
        """
        check_name(name, action="remove")
        model = self.resolve_exact(name)
        if model.is_alias:
            self._drop_aliases(lambda alias, _target: name_key(alias) != name_key(model.name))
            return model
        if model.source == "ollama":
            raise StoreError(f"{model.name} is borrowed from Ollama: remove it with `ollama rm {model.name}`")
        if model.source == "bundled":
            raise StoreError(
                f"{model.name} ships with the {BUNDLED_PACKAGE.replace('_', '-')} package: "
                f"{BUNDLED_REMOVE_HINT}"
            )
        entries = [model.folder] if model.folder is not None else list(model.files)
        for entry in entries:
            self._check_inside_models(entry)
        for entry in entries:
            self._delete(entry)
        self._drop_aliases(lambda _alias, target: name_key(target) != name_key(model.name))
        if (marked := self._read_default()) and name_key(marked) == name_key(model.name):
            (self.home / DEFAULT_FILE).unlink(missing_ok=True)
        logger.debug("removed %s", model.name)
        return model

    def _check_inside_models(self, entry: Path) -> None:
        """An entry may be deleted only when it sits directly in models/ or in a model folder there."""
        models_dir = Path(os.path.abspath(self.models_dir))
        path = Path(os.path.abspath(entry))
        if path.parent != models_dir and path.parent.parent != models_dir:
            raise StoreError(f"refusing to remove {entry}: it is outside {models_dir}")
        if path.is_symlink():
            return  # only the link itself is removed, never what it points at
        real_models = Path(os.path.realpath(models_dir))
        if not Path(os.path.realpath(path)).is_relative_to(real_models):
            raise StoreError(f"refusing to remove {entry}: it resolves outside {models_dir}")

    def _delete(self, entry: Path) -> None:
        if entry.is_symlink() or entry.is_file():
            entry.unlink(missing_ok=True)
            return
        if not entry.is_dir():
            return
        # move the folder out of models/ first, so a half-deleted model never lists
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        doomed = self.partial_dir / f".removing-{entry.name}-{uuid.uuid4().hex[:8]}"
        try:
            entry.rename(doomed)
        except OSError:
            doomed = entry  # another filesystem: delete in place
        shutil.rmtree(doomed)

    # ---- installing pulled models -------------------------------------------------------------

    def slug_for(self, name: str) -> str:
        """The folder name under models/ (and partial/) for a model name."""
        return slug_for(name)

    def staging_dir(self, slug: str) -> Path:
        """`home/partial/<slug>`, created if needed: where a pull writes before `install`."""
        if not slug or slug != slug_for(slug):
            raise StoreError(f"not a slug: {slug!r} (use Store.slug_for)")
        folder = self.partial_dir / slug
        refuse_link(folder)  # a link here would have the pull write wherever it points
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def install(self, staging: Path, manifest: Manifest) -> StoredModel:
        """Write the manifest into `staging` and rename it to `models/<slug>` in one step.

        Replaces an older copy of the same model; refuses to replace a different one.
        """
        staging = Path(staging)
        if Path(os.path.abspath(staging)).parent != Path(os.path.abspath(self.partial_dir)):
            raise StoreError(f"can only install from {self.partial_dir}, not {staging}")
        if not staging.is_dir():
            raise StoreError(f"nothing to install: {staging} is not a folder")
        manifest = manifest_from_dict(manifest.to_dict(), f"manifest for {manifest.name}")
        for item in manifest.files:
            file = staging / item.path
            refuse_link(file)
            if not file.is_file():
                raise StoreError(f"cannot install {manifest.name}: {item.path} is missing from {staging}")
            if file.stat().st_size != item.size:
                raise StoreError(
                    f"cannot install {manifest.name}: {item.path} has {file.stat().st_size} bytes, "
                    f"the manifest says {item.size}"
                )
        target = self.models_dir / slug_for(manifest.name)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        old: Path | None = None
        if target.exists() or target.is_symlink():
            self._check_replaceable(target, manifest)
            old = self.partial_dir / f".replaced-{target.name}-{uuid.uuid4().hex[:8]}"
            try:
                target.rename(old)
            except OSError as exc:
                raise StoreError(
                    f"cannot install {manifest.name}: cannot move the old copy aside ({exc})"
                ) from exc
        write_manifest(staging, manifest)
        try:
            staging.rename(target)
        except OSError as exc:
            if old is not None:
                old.rename(target)  # put the previous copy back
            raise StoreError(f"cannot install {manifest.name}: cannot move it into {target} ({exc})") from exc
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        logger.debug("installed %s in %s", manifest.name, target)
        return model_from_manifest(target, [])

    def _check_replaceable(self, target: Path, manifest: Manifest) -> None:
        if target.is_symlink() or not (target / MANIFEST_NAME).is_file():
            raise StoreError(
                f"cannot install {manifest.name}: {target} already exists and was not made by kinfer pull"
            )
        try:
            existing = read_manifest(target / MANIFEST_NAME)
        except ManifestError:
            return  # a corrupt copy of something: the new pull supersedes it
        if name_key(existing.name) != name_key(manifest.name):
            raise StoreError(
                f"cannot install {manifest.name}: {target} holds a different model ({existing.name})"
            )
