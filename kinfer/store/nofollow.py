"""Files a pull writes, opened without following symbolic links.

A `.part` file, the pull state or the lock in `partial/` that is a link would make a pull append to,
overwrite or create a file anywhere the user can write. Everything a pull writes goes through here:
a link where a file should be is refused (`LinkInStore`), never followed, and a folder it writes into
must resolve inside the staging folder.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kinfer.errors import StoreError


class LinkInStore(StoreError):
    """A symbolic link where the store expects its own file or folder."""


def _refused(path: Path) -> LinkInStore:
    return LinkInStore(f"refusing to use {path}: it is a symbolic link, not a file kinfer wrote; remove it")


def refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise _refused(path)


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """`os.open` that refuses a link as the last component (O_NOFOLLOW) with a `LinkInStore`."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: FreeBSD's answer to O_NOFOLLOW
            raise _refused(path) from None
        raise


def regular_size(path: Path) -> int:
    """The size of a regular file at `path`; 0 when there is none, or a link or folder is there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def read_text_nofollow(path: Path) -> str | None:
    """The text of a regular file, or None when it is missing or a link."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (FileNotFoundError, LinkInStore):
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read().decode("utf-8", errors="replace")


def resolves_inside(path: Path, root: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def folder_inside(folder: Path, root: Path) -> Path:
    """Create `folder` (under `root`) and check that it resolves inside `root`: no link leads out."""
    refuse_link(root)
    folder.mkdir(parents=True, exist_ok=True)
    if not resolves_inside(folder, root):
        raise LinkInStore(f"refusing to write in {folder}: a symbolic link leads it outside {root}")
    return folder
