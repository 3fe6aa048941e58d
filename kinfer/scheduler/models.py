"""The loaded models: each on its own engine thread, loaded as a task of the pool's own, pinned while
requests use it, kept for its keep-alive, unloaded to make room (--max-loaded), when idle, or when its
files are gone.

    loaded = await pool.acquire(model)      # loads it if needed; pinned for the caller
    ...                                     # send work to loaded.worker
    pool.release(loaded)                    # the keep-alive starts once nothing pins it

A caller that leaves while its model loads never orphans the engine: the load goes on without it and
the model is kept for its keep-alive, like any other.

Models are keyed by their files (`model_key`), not by name: an alias and the model it names share one
engine, whichever is asked first; callers echo the name they asked by, never `loaded.name`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kinfer.config import Settings
from kinfer.errors import Busy, EngineFailure, KinferError, ModelNotFound
from kinfer.scheduler.heap import settle as settle_heap
from kinfer.scheduler.jobs import Shutdown
from kinfer.scheduler.records import EngineFactory, IsPresent, LoadedModel, ModelRef, model_key
from kinfer.scheduler.worker import EngineWorker, WorkerCallbacks

log = logging.getLogger(__name__)

ROOM_POLL_S = 0.05  # how often a load waiting for --max-loaded room looks again


class ModelPool:
    """The models with a live engine thread, and the loads under way."""

    def __init__(
        self,
        settings: Settings,
        engine_factory: EngineFactory,
        callbacks: WorkerCallbacks,
        *,
        is_present: IsPresent,
        retry_after: Callable[[], float],
    ) -> None:
        self.settings = settings
        self._engine_factory = engine_factory
        self._callbacks = callbacks
        self._is_present = is_present
        self._retry_after = retry_after
        self.models: dict[str, LoadedModel] = {}  # by model_key
        self.loading: dict[str, asyncio.Task[None]] = {}  # by model_key
        self._loading_as: dict[str, str] = {}  # model_key -> the name a load under way was asked by

    async def acquire(
        self, model: ModelRef, *, keep_alive: float | None = None, num_ctx: int | None = None
    ) -> LoadedModel:
        """`model` loaded on its own engine thread, pinned for the caller (`release` when done).

        A loaded model is returned at once, even while another model waits for room. Waiting for
        --max-loaded room is bounded by --queue-timeout (then Busy)."""
        limit = self.settings.queue_timeout
        deadline = time.monotonic() + limit if limit > 0 else None
        key = model_key(model)
        while True:
            loaded = self.models.get(key)
            if loaded is not None and not loaded.worker.alive:  # its thread ended (gave up after faults)
                self.models.pop(key, None)
                loaded = None
            if loaded is not None:
                if loaded.removed or not self._is_present(loaded.model):
                    self._mark_removed(loaded)
                    raise ModelNotFound(f"model {model.name!r} was removed from the store")
                if model.name not in loaded.names:
                    loaded.names.append(model.name)
                self.pin(loaded)
                return loaded
            task = self.loading.get(key) or await self._start_load(model, key, keep_alive, num_ctx, deadline)
            if task is not None:
                await asyncio.shield(task)  # the load's error reaches every caller waiting for it

    def pin(self, loaded: LoadedModel) -> None:
        loaded.active += 1
        loaded.expires_at = None
        loaded.last_used = time.monotonic()

    def release(self, loaded: LoadedModel) -> None:
        loaded.active = max(0, loaded.active - 1)
        loaded.last_used = time.monotonic()
        if loaded.active == 0:
            self.arm_keep_alive(loaded)

    def arm_keep_alive(self, loaded: LoadedModel) -> None:
        if loaded.active or loaded.keep_alive < 0:
            loaded.expires_at = None
        else:
            loaded.expires_at = time.monotonic() + loaded.keep_alive

    # ---- loading -------------------------------------------------------------------------

    def find(self, name: str) -> LoadedModel | None:
        """The loaded model asked by `name` (its first name, or one it was asked by since)."""
        return next((m for m in self.models.values() if name in m.names), None)

    async def _start_load(
        self, model: ModelRef, key: str, keep_alive: float | None, num_ctx: int | None, deadline: float | None
    ) -> asyncio.Task[None] | None:
        """Make room (unload idle models, least recently used first) and start loading `model`.
        None when another caller got there first."""
        while len(self.models) + len(self.loading) >= max(1, self.settings.max_loaded):
            if key in self.models or key in self.loading:
                return None
            idle = [m for m in self.models.values() if m.active == 0]
            if idle:
                await self.unload(min(idle, key=lambda m: m.last_used).key)
                continue
            if deadline is not None and time.monotonic() > deadline:
                names = sorted(m.name for m in self.models.values()) + sorted(self._loading_as.values())
                busy = ", ".join(names)
                raise Busy(
                    f"waited {self.settings.queue_timeout:.0f}s for {busy} to finish its requests "
                    f"before loading {model.name} (--max-loaded {self.settings.max_loaded})",
                    retry_after=self._retry_after(),
                )
            await asyncio.sleep(ROOM_POLL_S)
        if key in self.models or key in self.loading:
            return None
        load = self._load(model, key, keep_alive, num_ctx)
        task = asyncio.create_task(load, name=f"kinfer-load:{model.name}")
        self.loading[key] = task
        self._loading_as[key] = model.name
        task.add_done_callback(_consume_load_error)
        return task

    async def _load(self, model: ModelRef, key: str, keep_alive: float | None, num_ctx: int | None) -> None:
        started = time.monotonic()
        worker = EngineWorker(
            model.name,
            lambda: self._engine_factory(model, self.settings, num_ctx),
            self._callbacks,
            asyncio.get_running_loop().call_soon_threadsafe,
            queue_timeout=self.settings.queue_timeout,
        )
        try:
            worker.start()
            try:
                info = await asyncio.wrap_future(worker.loaded)
            except asyncio.CancelledError:
                worker.send(Shutdown())  # the thread closes the engine as soon as it has one
                raise
            except KinferError:
                raise
            except Exception as exc:
                raise EngineFailure(f"could not load {model.name}: {exc}") from exc
            default_keep = self.settings.keep_alive_seconds
            loaded = LoadedModel(
                model=model,
                key=key,
                worker=worker,
                info=info,
                loaded_at=time.time(),
                keep_alive=default_keep if keep_alive is None else keep_alive,
            )
            loaded.load_seconds = time.monotonic() - started
            log.info(
                "loaded %s (%s, %d rows x %d ctx) in %.2fs",
                model.name,
                info.engine,
                info.rows,
                info.context_length,
                loaded.load_seconds,
            )
            self.models[key] = loaded
            self.arm_keep_alive(loaded)  # owned from now on, whether or not its requester stayed
            settle_heap()  # what the load left alive, out of the collector's full passes (heap.py)
        finally:
            self.loading.pop(key, None)
            self._loading_as.pop(key, None)

    # ---- unloading -----------------------------------------------------------------------

    async def unload(self, key: str) -> bool:
        """Stop the engine thread of the model loaded under `key` (`LoadedModel.key`) now; its
        in-flight requests fail with a clear error."""
        loaded = self.models.pop(key, None)
        if loaded is None:
            return False
        await asyncio.to_thread(loaded.worker.stop)
        names = " = ".join(loaded.names)
        del loaded
        settle_heap()  # the model's own cycles collected, not left frozen
        log.info("unloaded %s", names)
        return True

    async def unload_when_idle(self, key: str) -> bool:
        """Ollama's `keep_alive: 0`: unload now if idle, else as soon as the requests in flight end
        (never under another client's reply). False when the model is not loaded."""
        loaded = self.models.get(key)
        if loaded is None:
            return False
        loaded.keep_alive = 0
        if loaded.active == 0:
            await self.unload(key)
        return True

    async def forget_removed(self) -> None:
        """Models whose files were removed behind the server's back (`kinfer rm` from another
        process): unloaded now when idle, else when their requests end; no new request reaches them."""
        for loaded in list(self.models.values()):
            if loaded.removed or not self._is_present(loaded.model):
                self._mark_removed(loaded)
                if loaded.active == 0:
                    await self.unload(loaded.key)

    def _mark_removed(self, loaded: LoadedModel) -> None:
        if not loaded.removed:
            log.warning("the files of %s are gone; unloading it once idle", loaded.name)
        loaded.removed = True
        loaded.keep_alive = 0
        if loaded.active == 0:
            self.arm_keep_alive(loaded)

    async def reap(self, now: float) -> None:
        """Unload what was removed, and the idle models whose keep-alive ran out."""
        await self.forget_removed()
        for key, loaded in list(self.models.items()):
            if loaded.active == 0 and loaded.expires_at is not None and now >= loaded.expires_at:
                await self.unload(key)

    async def close(self) -> None:
        # a load in progress ends by itself (its engine thread cannot be interrupted); then unload all
        while self.loading:
            await asyncio.gather(*self.loading.values(), return_exceptions=True)
        for key in list(self.models):
            await self.unload(key)


def _consume_load_error(task: asyncio.Task) -> None:
    """A load whose every requester left has nobody to raise to: log its failure instead."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.info("loading failed: %s", error)
