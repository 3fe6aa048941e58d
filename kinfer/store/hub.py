"""Talking to the Hugging Face Hub: list a repo's files with their hashes, fetch small files and byte
ranges, search for GGUF conversions, and turn the Hub's failures into kinfer errors.

The listing and search go through `huggingface_hub.HfApi`; raw bytes go through httpx with the same
auth headers (`build_hf_headers`), because huggingface_hub no longer resumes partial files itself.
The endpoint is read from `HF_ENDPOINT` at call time, not import time, so a test or a user who sets
it late is still obeyed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import PurePosixPath

import httpx
from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers

from kinfer.errors import KinferError, ModelNotFound, Unauthorized
from kinfer.store.refs import shard_group, shard_info, variant_tag

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
# GGUF files that are not a language model on their own
SKIPPED_GGUF_MARKERS = ("mmproj", "imatrix")
SEARCH_LIMIT = 8


class HubUnreachable(KinferError):
    """The Hub could not be reached (no network, DNS, refused, timed out) or offline mode is on."""

    status = 502
    kind = "server_error"


class GatedRepo(Unauthorized):
    """The repo is gated or private and this machine's token (if any) may not read it."""


@dataclass(frozen=True)
class RemoteFile:
    """One file in a repo as the Hub lists it."""

    path: str
    size: int
    sha256: str | None = None  # LFS files: the hash the Hub promises; verified after download
    blob_id: str | None = None  # the git blob id (sha1); the ETag of a non-LFS file

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class GGUFVariant:
    """One pullable GGUF model in a repo: a single file, or every shard of a split one, in order."""

    tag: str  # as the file name writes it, e.g. "Q4_K_M"; the file stem when the name has no quant
    files: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def first(self) -> RemoteFile:
        return self.files[0]


@dataclass(frozen=True)
class RepoListing:
    """A repo at one commit: its files, with sizes and hashes."""

    repo_id: str
    commit: str | None
    revision: str
    gated: bool
    files: tuple[RemoteFile, ...]

    def file(self, path: str) -> RemoteFile | None:
        return next((f for f in self.files if f.path == path), None)

    def gguf_variants(self) -> list[GGUFVariant]:
        """Every GGUF model in the repo, shards grouped, projector and imatrix files left out."""
        groups: dict[str, list[RemoteFile]] = {}
        for f in self.files:
            lower = f.name.lower()
            if not lower.endswith(".gguf") or any(m in lower for m in SKIPPED_GGUF_MARKERS):
                continue
            groups.setdefault(shard_group(f.path), []).append(f)
        variants = []
        for key, members in sorted(groups.items()):
            members.sort(key=lambda f: (shard_info(f.path) or (0, 0))[0])
            variants.append(GGUFVariant(tag=variant_tag(key), files=tuple(members)))
        return variants

    def safetensors(self) -> list[RemoteFile]:
        """Top-level `*.safetensors` weight files."""
        return [f for f in self.files if "/" not in f.path and f.path.endswith(".safetensors")]


def endpoint() -> str:
    """The Hub's base URL: HF_ENDPOINT now, else what huggingface_hub resolved at import."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


class HubClient:
    """A thin, blocking client for the few Hub calls kinfer makes."""

    def __init__(self, base_url: str | None = None, token: str | None = None) -> None:
        self.base_url = (base_url or endpoint()).rstrip("/")
        self._token = token
        self.api = HfApi(endpoint=self.base_url, token=token)

    # -- metadata -------------------------------------------------------------------------------
    def listing(self, repo_id: str, revision: str = "main") -> RepoListing:
        """The repo's files with sizes, LFS sha256 and blob ids (`model_info(files_metadata=True)`)."""
        _check_online()
        with hub_errors(repo_id, self.base_url):
            info = self.api.model_info(
                repo_id, revision=None if revision == "main" else revision, files_metadata=True
            )
        files = []
        for s in info.siblings or ():
            files.append(
                RemoteFile(
                    path=s.rfilename,
                    size=s.lfs.size if s.lfs else (s.size or 0),
                    sha256=s.lfs.sha256 if s.lfs else None,
                    blob_id=s.blob_id,
                )
            )
        return RepoListing(
            repo_id=info.id or repo_id,
            commit=info.sha,
            revision=revision,
            gated=bool(info.gated),
            files=tuple(files),
        )

    def search_gguf(self, name: str, *, exclude: str | None = None) -> list[str]:
        """Repo ids of GGUF conversions of `name` (a repo's short name), most downloaded first.

        Asks for "<name> GGUF" first (how conversions are named), then for `name` among repos with
        the `gguf` tag, in case the Hub's search does not match every word.
        """
        _check_online()
        try:
            with hub_errors(name, self.base_url):
                for query in ({"search": f"{name} GGUF"}, {"search": name, "filter": "gguf"}):
                    found = self.api.list_models(**query, sort="downloads", limit=SEARCH_LIMIT)
                    ids = [m.id for m in found if m.id != exclude]
                    if ids:
                        return ids
                return []
        except KinferError as exc:
            # suggestions are a courtesy: never let them hide the real answer
            logger.warning("could not search the hub for GGUF conversions of %s: %s", name, exc)
            return []

    # -- bytes ----------------------------------------------------------------------------------
    def file_url(self, repo_id: str, path: str, revision: str) -> str:
        return hf_hub_url(repo_id, path, revision=revision, endpoint=self.base_url)

    def headers(self) -> dict[str, str]:
        """User agent and `Authorization: Bearer $HF_TOKEN` (or the saved token), as huggingface_hub sends."""
        return build_hf_headers(token=self._token)

    def http(self) -> httpx.Client:
        """An httpx client that follows the Hub's redirects to its CDN."""
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        return httpx.Client(follow_redirects=True, timeout=timeout, headers=self.headers())

    def fetch(
        self, repo_id: str, path: str, revision: str, *, start: int = 0, end: int | None = None
    ) -> bytes:
        """A small file, or bytes [start, end) of one: config.json, the head of a GGUF."""
        _check_online()
        headers = {}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        url = self.file_url(repo_id, path, revision)
        with hub_errors(repo_id, self.base_url), self.http() as client:
            response = client.get(url, headers=headers)
            raise_for_hub_status(response, repo_id, self.base_url)
            return response.content


def _check_online() -> None:
    if constants.is_offline_mode():
        raise HubUnreachable("offline mode is on (HF_HUB_OFFLINE): unset it to reach the hub")


def raise_for_hub_status(response: httpx.Response, repo_id: str, base_url: str) -> None:
    """Turn a failed httpx response from the Hub into the kinfer error a user can act on."""
    if response.status_code < 400:
        return
    code = response.headers.get("X-Error-Code", "")
    if code == "GatedRepo" or (response.status_code in (401, 403) and code != "RepoNotFound"):
        raise gated_error(repo_id, base_url)
    if code == "RepoNotFound" or (response.status_code == 404 and code != "EntryNotFound"):
        raise ModelNotFound(f"no such repo on the hub: {repo_id}")
    if code == "EntryNotFound":
        raise ModelNotFound(f"{repo_id}: file not found on the hub: {response.request.url.path}")
    raise HubUnreachable(f"the hub answered {response.status_code} for {response.request.url}")


def gated_error(repo_id: str, base_url: str) -> GatedRepo:
    return GatedRepo(
        f"{repo_id} is gated/private: set HF_TOKEN and accept the license at {base_url}/{repo_id}"
    )


class hub_errors:
    """Map huggingface_hub's and httpx's exceptions to kinfer's, inside a `with` block."""

    def __init__(self, repo_id: str, base_url: str) -> None:
        self.repo_id = repo_id
        self.base_url = base_url

    def __enter__(self) -> hub_errors:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, KinferError):
            return False
        if isinstance(exc, GatedRepoError):
            raise gated_error(self.repo_id, self.base_url) from exc
        if isinstance(exc, RevisionNotFoundError):
            raise ModelNotFound(f"{self.repo_id}: no such revision on the hub") from exc
        if isinstance(exc, RepositoryNotFoundError):
            # the Hub says 401 for private repos as well as missing ones when no token is sent
            hint = "" if os.environ.get("HF_TOKEN") else " (if it is private, set HF_TOKEN)"
            raise ModelNotFound(f"no such repo on the hub: {self.repo_id}{hint}") from exc
        if isinstance(exc, OfflineModeIsEnabled):
            raise HubUnreachable("offline mode is on (HF_HUB_OFFLINE): unset it to reach the hub") from exc
        if isinstance(exc, HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403):
                raise gated_error(self.repo_id, self.base_url) from exc
            raise HubUnreachable(f"the hub answered {status} for {self.repo_id}") from exc
        if isinstance(exc, (httpx.TransportError, OSError)) or type(exc).__module__.startswith("httpx"):
            raise HubUnreachable(f"cannot reach the hub at {self.base_url}: {exc}") from exc
        return False
