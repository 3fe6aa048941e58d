"""One file from the Hub into a staging folder: resumable, verified, cancellable.

Bytes land in `<name>.part` beside the final name. A later attempt (the next `pull`, or a retry after
a dropped connection) asks for `Range: bytes=<size of .part>-` and appends. Only when the whole file
is there and its sha256 (LFS files) or size and git blob id (small files) match the Hub's does it get
its real name, so a file without `.part` in a staging folder is always complete and verified.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from kinfer.errors import StoreError
from kinfer.store.hub import HubClient, HubUnreachable, RemoteFile, raise_for_hub_status
from kinfer.store.nofollow import is_regular, open_nofollow, refuse_link, regular_size

logger = logging.getLogger(__name__)

HASH_CHUNK_BYTES = 4 * 1024 * 1024
RETRIES = 3  # reconnections per file within one pull after a dropped connection
RETRY_BACKOFF_S = 0.5
# small non-LFS files are also checked against their git blob id (a sha1 of the content)
BLOB_CHECK_MAX_BYTES = 16 * 1024 * 1024


class ChecksumMismatch(StoreError):
    """A downloaded file is not what the Hub says it is; the bad file has been removed."""

    status = 502
    kind = "server_error"


class SizeMismatch(ChecksumMismatch):
    """The hub sent more bytes than it lists for the file (huggingface_hub's "consistency check")."""


class PullCancelled(StoreError):
    """The pull was cancelled; what was fetched stays in partial/ for the next pull to resume."""

    status = 499
    kind = "cancelled"


@dataclass(frozen=True)
class FileTick:
    """Progress of one file, as `fetch_file` reports it."""

    completed: int
    total: int
    resumed_from: int
    verifying: bool = False


def part_path(final: Path) -> Path:
    return final.with_name(final.name + ".part")


def bytes_on_disk(final: Path) -> int:
    """How much of a file a staging folder already holds (complete or partial); links count as none."""
    if is_regular(final):
        return regular_size(final)
    return regular_size(part_path(final))


def fetch_file(
    client: HubClient,
    http: httpx.Client,
    repo_id: str,
    revision: str,
    remote: RemoteFile,
    final: Path,
    *,
    on_tick: Callable[[FileTick], None] | None = None,
    cancel: threading.Event | None = None,
    retries: int = RETRIES,
) -> str:
    """Download `remote` to `final` (resuming a `.part` left by an earlier attempt); returns its sha256.

    Raises ChecksumMismatch (file removed), PullCancelled (partial kept) or HubUnreachable after
    `retries` reconnections fail (partial kept, so the next pull resumes).
    """
    tick = on_tick or (lambda _t: None)
    part = part_path(final)
    refuse_link(final)  # a link here would have us verify, then install, a file from anywhere
    refuse_link(part)  # ... or append the download to one
    if regular_size(final) == remote.size and is_regular(final):
        tick(FileTick(remote.size, remote.size, remote.size))
        return remote.sha256 or sha256_of(final, cancel)
    final.parent.mkdir(parents=True, exist_ok=True)
    url = client.file_url(repo_id, remote.path, revision)
    failures = 0
    resumed_from = regular_size(part)
    while True:
        have = regular_size(part)
        if have > remote.size:
            logger.warning("%s: partial file is larger than the file on the hub; starting over", remote.path)
            part.unlink()
            have = resumed_from = 0
        if have == remote.size:
            break
        try:
            _stream_into(http, url, part, have, remote, repo_id, client.base_url, resumed_from, tick, cancel)
            problem = None if bytes_on_disk(final) > have else "the server sent nothing"
        except httpx.TransportError as exc:
            problem = str(exc) or type(exc).__name__
        if problem is None:
            continue
        failures += 1
        got = bytes_on_disk(final)
        if failures > retries:
            raise HubUnreachable(
                f"connection lost pulling {remote.path} at {got} of {remote.size} bytes ({problem}); "
                "run the same pull again to resume"
            )
        logger.warning(
            "connection lost pulling %s at %d of %d bytes (%s); resuming",
            remote.path,
            got,
            remote.size,
            problem,
        )
        time.sleep(RETRY_BACKOFF_S * failures)
    tick(FileTick(remote.size, remote.size, resumed_from, verifying=True))
    digest = verify(part, remote, cancel)
    part.replace(final)
    return digest


def _stream_into(
    http: httpx.Client,
    url: str,
    part: Path,
    have: int,
    remote: RemoteFile,
    repo_id: str,
    base_url: str,
    resumed_from: int,
    tick: Callable[[FileTick], None],
    cancel: threading.Event | None,
) -> None:
    headers = {"Range": f"bytes={have}-"} if have else {}
    with http.stream("GET", url, headers=headers) as response:
        if response.status_code == 416:
            # nothing past `have` although the Hub lists more: the .part cannot be trusted
            logger.warning("%s: the server refused to resume at %d bytes; starting over", remote.path, have)
            part.unlink(missing_ok=True)
            return
        raise_for_hub_status(response, repo_id, base_url)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        if have and response.status_code != 206:
            logger.info("%s: the server ignored the range request; downloading from the start", remote.path)
            have, flags = 0, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with os.fdopen(open_nofollow(part, flags), "wb") as out:
            # unbuffered: every byte that arrived is on disk when the connection drops
            for chunk in response.iter_bytes():
                if cancel is not None and cancel.is_set():
                    raise PullCancelled(f"pull cancelled at {have} of {remote.size} bytes of {remote.path}")
                if have + len(chunk) > remote.size:
                    # retrying would fetch the same too-long file for ever: fail, as huggingface_hub does
                    out.close()
                    part.unlink(missing_ok=True)
                    raise SizeMismatch(
                        f"consistency check failed: the hub sent more than the {remote.size} bytes it "
                        f"lists for {remote.path}; removed the partial file (try again later, or report "
                        f"it to the repo {repo_id})"
                    )
                out.write(chunk)
                have += len(chunk)
                tick(FileTick(min(have, remote.size), remote.size, resumed_from))


def sha256_of(path: Path, cancel: threading.Event | None = None) -> str:
    digest = hashlib.sha256()
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
        while block := fh.read(HASH_CHUNK_BYTES):
            if cancel is not None and cancel.is_set():
                raise PullCancelled(f"pull cancelled while verifying {path.name}")
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, remote: RemoteFile, cancel: threading.Event | None = None) -> str:
    """Check a downloaded file against the Hub's sha256 / size / blob id; remove it if it fails."""
    size = os.lstat(path).st_size
    if size != remote.size:
        path.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{remote.path}: got {size} bytes, the hub lists {remote.size}; removed it")
    digest = sha256_of(path, cancel)
    if remote.sha256 and digest != remote.sha256.lower():
        path.unlink(missing_ok=True)
        raise ChecksumMismatch(
            f"{remote.path}: sha256 mismatch (expected {remote.sha256}, got {digest}); removed the file"
        )
    if not remote.sha256 and remote.blob_id and size <= BLOB_CHECK_MAX_BYTES:
        with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
            blob = hashlib.sha1(b"blob %d\0" % size + fh.read()).hexdigest()
        if blob != remote.blob_id:
            path.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{remote.path}: git blob id mismatch (expected {remote.blob_id}, got {blob}); "
                "removed the file"
            )
    return digest
