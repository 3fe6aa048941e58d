"""A pull on a worker thread, its progress handed to the asyncio loop: what `/api/pull` and the
dashboard run.

    pulling = BackgroundPull(store, "owner/repo:Q4_K_M")
    async for progress in pulling.events():    # PullProgress events, on the loop's thread
        ...
    pulling.model                              # the installed StoredModel, once events() has ended

`events()` re-raises what `pull()` raised. Leaving it early (a `break`, a closed stream, a cancelled
task) cancels the pull and waits for its thread to stop; what it fetched stays in partial/ for the
next pull to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from kinfer.store.catalog import Store
from kinfer.store.models import StoredModel
from kinfer.store.progress import PullProgress
from kinfer.store.pull import pull


@dataclass(frozen=True)
class _Ended:
    model: StoredModel | None = None
    error: BaseException | None = None


class BackgroundPull:
    """One pull of `ref` into `store`; `cancel` (yours, or a fresh one) stops it from any thread."""

    def __init__(self, store: Store, ref: str, *, cancel: threading.Event | None = None) -> None:
        self.store = store
        self.ref = ref
        self.cancel = cancel or threading.Event()
        self.model: StoredModel | None = None

    async def events(self) -> AsyncIterator[PullProgress]:
        """Start the pull on a worker thread and yield its progress; returns once it is installed."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[PullProgress | _Ended] = asyncio.Queue()

        def hand_over(item: PullProgress | _Ended) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed while a cancelled pull wound down
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                model = pull(self.store, self.ref, on_progress=hand_over, cancel=self.cancel)
            except BaseException as exc:  # re-raised on the loop, in the consumer
                hand_over(_Ended(error=exc))
            else:
                hand_over(_Ended(model=model))

        ended = False
        worker = loop.run_in_executor(None, work)
        try:
            while not isinstance(item := await queue.get(), _Ended):
                yield item
            ended = True
        finally:
            if not ended:
                self.cancel.set()
                await asyncio.wait([worker])  # it stops within a chunk; leave no pull running behind
        if item.error is not None:
            raise item.error
        self.model = item.model
