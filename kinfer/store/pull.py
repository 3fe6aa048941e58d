"""`pull()`: fetch a model from the Hugging Face Hub into the store, resumable and verified.

    model = pull(store, "hf.co/owner/repo:Q4_K_M", on_progress=print, cancel=threading.Event())

It is synchronous (callers run it in a thread). The steps: list the repo and decide what to fetch
(`pull_plan`), take the per-model lock, check disk space, fetch each file into `partial/<slug>/`
(`transfer`, resuming whatever an earlier pull left), then `Store.install` renames the folder into
`models/` in one step, so a model is listed only once it is complete and verified.

`iter_pull()` is the same as a generator of `PullProgress` events; `background_pull.BackgroundPull`
hands them to an asyncio loop (what the dashboard and `/api/pull` run).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from kinfer.errors import StoreError
from kinfer.store.catalog import Store
from kinfer.store.hub import HubClient, RemoteFile
from kinfer.store.local import model_from_manifest
from kinfer.store.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    ManifestFile,
    now_iso,
    read_manifest,
    write_json_atomic,
)
from kinfer.store.models import StoredModel
from kinfer.store.names import check_name
from kinfer.store.nofollow import (
    folder_inside,
    is_regular,
    open_nofollow,
    read_text_nofollow,
    resolves_inside,
)
from kinfer.store.progress import Phase, PullProgress, format_bytes
from kinfer.store.pull_plan import PullPlan, plan_pull
from kinfer.store.refs import HubRef, parse_ref
from kinfer.store.transfer import RETRIES, FileTick, PullCancelled, bytes_on_disk, fetch_file

logger = logging.getLogger(__name__)

# kept free beyond the model itself, so a pull never fills the disk to the last byte
DISK_RESERVE_BYTES = 256 * 1024 * 1024
LOCK_POLL_S = 0.2
PROGRESS_INTERVAL_S = 0.05
STATE_FILE = ".kinfer-pull.json"  # what the partial files in a staging folder were meant to be

ProgressCallback = Callable[[PullProgress], None]


class NotEnoughSpace(StoreError):
    """The disk holding the store has too little room for the model."""

    status = 507
    kind = "insufficient_storage"


class PullBusy(StoreError):
    """Another pull of the same model holds its lock (raised only when not waiting)."""

    status = 409
    kind = "conflict"


def pull(
    store: Store,
    ref: str | HubRef,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    client: HubClient | None = None,
    wait: bool = True,
    retries: int = RETRIES,
    free_space: Callable[[Path], int] | None = None,
) -> StoredModel:
    """Pull `ref` (owner/repo[:QUANT], hf.co/..., or a file URL) into `store`; returns the installed model.

    `wait`: when another process pulls the same model, wait for it (else raise PullBusy).
    `retries`: reconnections per file after a dropped connection before giving up (the partial
    download stays, and the next pull resumes it). `free_space`: bytes free at a path (tests).
    """
    hub_ref = parse_ref(ref) if isinstance(ref, str) else ref
    report = _Reporter(on_progress)
    client = client or HubClient()
    report.emit("pulling manifest", "resolving")
    plan = plan_pull(client, hub_ref)
    check_listed_paths(plan)
    check_name(plan.name, action="install")  # the tag comes from a file name the hub chose
    report.model = plan.name
    report.overall_total = plan.total
    logger.info(
        "pulling %s from %s@%s: %d file(s), %s",
        plan.name,
        plan.repo_id,
        plan.revision[:12],
        len(plan.files),
        format_bytes(plan.total),
    )
    slug = store.slug_for(plan.name)
    store.partial_dir.mkdir(parents=True, exist_ok=True)
    with _pull_lock(store.partial_dir / f"{slug}.lock", plan.name, wait=wait, cancel=cancel, report=report):
        installed = _already_installed(store, slug, plan)
        if installed is not None:
            logger.info("%s is already in the store and up to date", plan.name)
            report.overall_completed = plan.total
            report.emit("success", "success")
            return installed
        staging = store.staging_dir(slug)
        _forget_stale(staging, plan)
        _check_space(store, staging, plan, free_space or _disk_free)
        try:
            sha256s = _fetch_all(client, plan, staging, report, cancel, retries)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise _disk_full(store, staging, plan, free_space or _disk_free) from None
        report.emit("writing manifest", "installing")
        (staging / STATE_FILE).unlink(missing_ok=True)
        manifest = Manifest(
            name=plan.name,
            format=plan.format,
            source=f"hf.co/{plan.repo_id}",
            revision=plan.revision,
            files=tuple(ManifestFile(f.path, f.size, sha256s[f.path]) for f in plan.files),
            pulled_at=now_iso(),
        )
        model = store.install(staging, manifest)
    report.emit("success", "success")
    return model


def iter_pull(
    store: Store, ref: str | HubRef, *, cancel: threading.Event | None = None, **kwargs
) -> Iterator[PullProgress]:
    """`pull()` in a worker thread, as a generator of its events; the last one has phase "success".

    Re-raises what `pull()` raised. Closing the generator early cancels the pull.
    """
    cancel = cancel or threading.Event()
    events: queue.Queue[PullProgress | BaseException | None] = queue.Queue()

    def work() -> None:
        try:
            pull(store, ref, on_progress=events.put, cancel=cancel, **kwargs)
            events.put(None)
        except BaseException as exc:  # handed to the consumer's thread
            events.put(exc)

    worker = threading.Thread(target=work, name="kinfer-pull", daemon=True)
    worker.start()
    try:
        while True:
            item = events.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        cancel.set()
        worker.join()


# -- steps ----------------------------------------------------------------------------------------


def _fetch_all(
    client: HubClient,
    plan: PullPlan,
    staging: Path,
    report: _Reporter,
    cancel: threading.Event | None,
    retries: int,
) -> dict[str, str]:
    done = 0
    sha256s: dict[str, str] = {}
    with client.http() as http:
        for remote in plan.files:
            status = f"pulling {remote.sha256[:12]}" if remote.sha256 else f"pulling {remote.path}"
            digest = f"sha256:{remote.sha256}" if remote.sha256 else None

            def on_tick(
                tick: FileTick,
                remote: RemoteFile = remote,
                status: str = status,
                digest: str | None = digest,
                base: int = done,
            ) -> None:
                report.overall_completed = base + tick.completed
                if tick.verifying:
                    report.emit(
                        "verifying sha256 digest",
                        "verifying",
                        file=remote.path,
                        completed=tick.completed,
                        total=tick.total,
                        digest=digest,
                    )
                else:
                    report.emit(
                        status,
                        "downloading",
                        file=remote.path,
                        completed=tick.completed,
                        total=tick.total,
                        digest=digest,
                        resumed_from=tick.resumed_from,
                    )

            sha256s[remote.path] = fetch_file(
                client,
                http,
                plan.repo_id,
                plan.revision,
                remote,
                folder_inside((staging / remote.path).parent, staging) / PurePosixPath(remote.path).name,
                on_tick=on_tick,
                cancel=cancel,
                retries=retries,
            )
            done += remote.size
    return sha256s


def _already_installed(store: Store, slug: str, plan: PullPlan) -> StoredModel | None:
    """The installed model when it holds exactly the files this pull would fetch."""
    folder = store.models_dir / slug
    try:
        manifest = read_manifest(folder / MANIFEST_NAME)
    except ManifestError:
        return None
    have = {(f.path, f.size) for f in manifest.files}
    want = {(f.path, f.size) for f in plan.files}
    by_path = {f.path: f.sha256 for f in manifest.files}
    same_hashes = all(by_path.get(f.path) == f.sha256 for f in plan.files if f.sha256)
    if have != want or not same_hashes:
        return None
    if any(bytes_on_disk(folder / f.path) != f.size for f in plan.files):
        return None
    return model_from_manifest(folder, [])


def _forget_stale(staging: Path, plan: PullPlan) -> None:
    """Drop partial files from an earlier pull of a different upstream version of a file."""
    state_path = staging / STATE_FILE
    wanted = {f.path: f.sha256 or f.blob_id or str(f.size) for f in plan.files}
    try:
        before = json.loads(read_text_nofollow(state_path) or "{}")  # a link is no state of ours
    except (OSError, ValueError):
        before = {}
    if isinstance(before, dict):
        for path, ident in before.items():
            if wanted.get(path) != ident and not unsafe_path(path):
                for stale in (staging / path, staging / f"{path}.part"):
                    if is_regular(stale) and resolves_inside(stale.parent, staging):
                        logger.info(
                            "discarding %s from an earlier pull (the file changed upstream)", stale.name
                        )
                        stale.unlink()
    write_json_atomic(state_path, wanted)  # replaces a link by a file; never writes through it


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def _check_space(store: Store, staging: Path, plan: PullPlan, free_space: Callable[[Path], int]) -> None:
    needed = sum(max(0, f.size - bytes_on_disk(staging / f.path)) for f in plan.files)
    free = free_space(staging)
    if needed + DISK_RESERVE_BYTES > free:
        raise NotEnoughSpace(
            f"not enough disk space for {plan.name}: it needs {format_bytes(needed)} more, "
            f"{format_bytes(free)} is free at {store.home} "
            f"(and {format_bytes(DISK_RESERVE_BYTES)} is kept spare)"
        )


def _disk_full(
    store: Store, staging: Path, plan: PullPlan, free_space: Callable[[Path], int]
) -> NotEnoughSpace:
    """The disk filled up during the download (something else wrote to it, or it was nearly full)."""
    needed = sum(max(0, f.size - bytes_on_disk(staging / f.path)) for f in plan.files)
    try:
        free = format_bytes(free_space(staging))
    except OSError:
        free = "nothing"
    return NotEnoughSpace(
        f"the disk is full: {plan.name} needs {format_bytes(needed)} more at {store.home} "
        f"and {free} is free; free some space and run the same pull again to resume"
    )


def check_listed_paths(plan: PullPlan) -> None:
    """Refuse a listing whose file paths would land outside the staging folder (absolute, `..`)."""
    for remote in plan.files:
        if unsafe_path(remote.path):
            raise StoreError(f"the hub lists an unsafe file path {remote.path!r}; refusing to pull")


def unsafe_path(path: object) -> bool:
    """A path that would leave the staging folder: absolute, with a `..` part, or a backslash."""
    if not isinstance(path, str):
        return True
    parts = PurePosixPath(path).parts
    return not parts or path.startswith(("/", "\\")) or ".." in parts or "\\" in path


@contextlib.contextmanager
def _pull_lock(
    path: Path, name: str, *, wait: bool, cancel: threading.Event | None, report: _Reporter
) -> Iterator[None]:
    """An exclusive flock per model, so two pulls of one model never write the same partial files."""
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise PullBusy(f"another pull of {name} is running; wait for it or cancel it") from None
            logger.info("another pull of %s is running; waiting for it", name)
            report.emit(f"waiting for another pull of {name}", "waiting")
            while True:
                if cancel is not None and cancel.is_set():
                    raise PullCancelled(f"pull of {name} cancelled while waiting for another pull") from None
                time.sleep(LOCK_POLL_S)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    continue
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class _Reporter:
    """Builds `PullProgress` events and rate-limits the per-chunk ones."""

    def __init__(self, callback: ProgressCallback | None) -> None:
        self.callback = callback
        self.model: str | None = None
        self.overall_total = 0
        self.overall_completed = 0
        self._last = 0.0
        self._last_file: str | None = None

    def emit(
        self,
        status: str,
        phase: Phase,
        *,
        file: str | None = None,
        completed: int = 0,
        total: int = 0,
        digest: str | None = None,
        resumed_from: int = 0,
    ) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        same_file = phase == "downloading" and file == self._last_file and completed < total
        if same_file and now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last, self._last_file = now, file
        self.callback(
            PullProgress(
                status=status,
                phase=phase,
                model=self.model,
                file=file,
                completed=completed,
                total=total,
                digest=digest,
                overall_completed=self.overall_completed,
                overall_total=self.overall_total,
                resumed_from=resumed_from,
            )
        )
