"""Admission, model loading and unloading, keep-alive, and routing engine results to requests.

Knows nothing of HTTP or Textual: dialects call `submit` and iterate the returned stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from kinfer.config import Settings
from kinfer.embedding import EmbedRequest, EmbedResult, check_embed_request, finish_vector
from kinfer.engines.base import Engine, EngineStats, JobUpdate, ModelInfo
from kinfer.errors import Busy, EngineFailure, KinferError
from kinfer.protocol import ChatRequest, validate_request
from kinfer.scheduler.embed_ticket import EmbedTicket
from kinfer.scheduler.jobs import Admission, Cancel, EmbedWork, Measure, PreparedJob
from kinfer.scheduler.stream import RequestSnapshot, RequestStream
from kinfer.scheduler.worker import EngineWorker, WorkerCallbacks

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 0.5
RECENT_FINISHED = 64  # finished requests kept for the dashboard's fade-out and the request log
COMPLETION_WINDOW_S = 60.0


class ModelRef(Protocol):
    """What the scheduler needs of a stored model (kinfer.store.models.StoredModel fits)."""

    name: str
    format: str
    size: int


class ModelResolver(Protocol):
    def __call__(self, name: str | None) -> ModelRef: ...


EngineFactory = Callable[[ModelRef, Settings, int | None], Engine]


@dataclass
class LoadedModel:
    """A model with a live engine thread."""

    model: ModelRef
    worker: EngineWorker
    info: ModelInfo
    loaded_at: float
    keep_alive: float
    active: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float | None = None  # monotonic deadline while idle; None = not idle or never
    load_seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.model.name


@dataclass(frozen=True)
class ModelSnapshot:
    name: str
    engine: str
    rows_total: int
    rows_busy: int
    waiting: int
    context_length: int
    size: int
    expires_in: float | None  # seconds until unload when idle; None = busy or never
    stats: EngineStats


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Everything the dashboard and /metrics read, built on the event loop."""

    taken_at: float
    models: tuple[ModelSnapshot, ...]
    requests: tuple[RequestSnapshot, ...]  # active first, then recently finished
    queue_depth: int
    outcomes: dict[str, int]
    prompt_tokens_total: int
    generated_tokens_total: int
    reused_tokens_total: int
    embedded_inputs_total: int = 0
    embedded_tokens_total: int = 0


class Scheduler:
    """Turns `ChatRequest`s into streams of events from engine threads."""

    def __init__(self, settings: Settings, resolve: ModelResolver, engine_factory: EngineFactory) -> None:
        self.settings = settings
        self._resolve = resolve
        self._engine_factory = engine_factory
        self._models: dict[str, LoadedModel] = {}
        self._streams: dict[str, RequestStream] = {}
        self._stream_model: dict[str, str] = {}
        self._finished: deque[RequestStream | EmbedTicket] = deque(maxlen=RECENT_FINISHED)
        self._completions: deque[float] = deque(maxlen=4096)
        self._load_lock = asyncio.Lock()
        self._reaper: asyncio.Task | None = None
        self.outcomes: Counter[str] = Counter()
        self.prompt_tokens_total = 0
        self.generated_tokens_total = 0
        self.reused_tokens_total = 0
        self.embedded_inputs_total = 0
        self.embedded_tokens_total = 0
        self._embeds: dict[str, EmbedTicket] = {}
        # told when a request finishes (an embedding request comes as an EmbedTicket)
        self.listeners: list[Callable[[RequestStream | EmbedTicket], None]] = []
        # told when a request is queued, in the submitting task's context (the HTTP request log)
        self.submitted: list[Callable[[RequestStream | EmbedTicket], None]] = []

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_idle_models(), name="kinfer-keepalive")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for name in list(self._models):
            await self.unload(name)

    # ---- requests ------------------------------------------------------------------------

    async def submit(self, request: ChatRequest) -> RequestStream:
        """Queue a request; returns once its prompt is rendered and fits, so refusals come before headers.

        Every dialect's request is checked here (`validate_request`), so no path skips the checks."""
        validate_request(request)
        model = self._resolve(request.model or None)
        if self.queue_depth() >= self.settings.max_queue:
            self.outcomes["rejected"] += 1
            raise Busy(
                f"{self.queue_depth()} requests are already waiting; try again shortly",
                retry_after=self.retry_after(),
            )
        load_started = time.monotonic()
        loaded = await self.ensure_loaded(model, keep_alive=request.keep_alive, num_ctx=request.num_ctx)
        load_seconds = time.monotonic() - load_started
        job_id = request.request_id or uuid.uuid4().hex
        if job_id in self._streams:
            job_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
        # the request's clock starts before the load, so total time includes it (Ollama's total_duration)
        stream = RequestStream(request, job_id, loaded.name, on_cancel=self._cancel, arrived=load_started)
        stream.load_seconds = load_seconds
        for observer in self.submitted:
            observer(stream)
        self._streams[job_id] = stream
        self._stream_model[job_id] = loaded.name
        loaded.active += 1
        loaded.expires_at = None
        loaded.last_used = time.monotonic()
        if request.keep_alive is not None:
            loaded.keep_alive = request.keep_alive
        loaded.worker.send(Admission(request=request, job_id=job_id))
        try:
            await stream.accepted
        except BaseException:
            stream.cancel()
            self._retire(stream)
            raise
        return stream

    async def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens `request` would take, rendered with the model's template (loads the model)."""
        validate_request(request)
        loaded = await self.ensure_loaded(self._resolve(request.model or None), keep_alive=request.keep_alive)
        reply: Future[PreparedJob] = Future()
        loaded.worker.send(Measure(request=request, reply=reply))
        prepared = await asyncio.wrap_future(reply)
        return prepared.prompt_tokens

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embed every input of `request` on the model's engine thread, batched with the other
        embedding requests of the same model and interleaved with its chat steps."""
        model = self._resolve(request.model or None)
        if self.queue_depth() + len(self._embeds) >= self.settings.max_queue:
            self.outcomes["rejected"] += 1
            raise Busy(f"{self.queue_depth()} requests are already waiting; try again shortly", retry_after=5)
        started = time.monotonic()
        loaded = await self.ensure_loaded(model, keep_alive=request.keep_alive, num_ctx=request.num_ctx)
        check_embed_request(request, loaded.info)
        job_id = request.request_id or uuid.uuid4().hex
        if job_id in self._embeds or job_id in self._streams:
            job_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
        ticket = EmbedTicket(request, job_id, loaded.name)
        ticket.load_seconds = time.monotonic() - started
        for observer in self.submitted:
            observer(ticket)
        self._embeds[job_id] = ticket
        loaded.active += 1
        loaded.expires_at = None
        if request.keep_alive is not None:
            loaded.keep_alive = request.keep_alive
        reply: Future[tuple[list, list[int]]] = Future()
        loaded.worker.send(EmbedWork(request, job_id, reply, ticket.on_progress))
        try:
            vectors, tokens = await asyncio.wrap_future(reply)
            finished = tuple(
                finish_vector(v, normalize=request.normalize, dimensions=request.dimensions) for v in vectors
            )
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            if cancelled:
                loaded.worker.send(Cancel(job_id))
            ticket.on_error(cancelled)
            self._retire_embed(ticket, loaded)
            raise
        ticket.on_done(sum(tokens), finished[0].shape[0] if finished else 0)
        self.embedded_inputs_total += len(finished)
        self.embedded_tokens_total += ticket.prompt_tokens
        self._retire_embed(ticket, loaded)
        return EmbedResult(
            model=loaded.name,
            embeddings=finished,
            prompt_tokens=ticket.prompt_tokens,
            load_seconds=ticket.load_seconds,
            total_seconds=time.monotonic() - started,
        )

    def _retire_embed(self, ticket: EmbedTicket, loaded: LoadedModel) -> None:
        if self._embeds.pop(ticket.job_id, None) is None:
            return
        self.outcomes[ticket.finish or "error"] += 1
        self.prompt_tokens_total += ticket.prompt_tokens
        self._completions.append(time.monotonic())
        self._finished.append(ticket)
        loaded.active = max(0, loaded.active - 1)
        loaded.last_used = time.monotonic()
        if loaded.active == 0:
            self._arm_keep_alive(loaded)
        for listener in self.listeners:
            listener(ticket)

    def _cancel(self, job_id: str) -> None:
        name = self._stream_model.get(job_id)
        if name and name in self._models:
            self._models[name].worker.send(Cancel(job_id))

    # ---- callbacks from engine threads (run on the loop) ---------------------------------

    def _on_ready(self, job_id: str, prepared: PreparedJob) -> None:
        stream = self._streams.get(job_id)
        if stream is not None:
            stream.on_ready(prepared)

    def _on_context(self, job_id: str, tokens: list[int]) -> None:
        stream = self._streams.get(job_id)
        if stream is not None:
            stream.context = tuple(tokens)

    def _on_admitted(self, admitted: list[tuple[str, int]]) -> None:
        for job_id, reused in admitted:
            stream = self._streams.get(job_id)
            if stream is not None:
                stream.on_admitted(reused)

    def _on_updates(self, updates: list[JobUpdate]) -> None:
        for update in updates:
            stream = self._streams.get(update.job_id)
            if stream is None:
                continue
            stream.on_update(update)
            if update.finish is not None:
                self._retire(stream)

    def _on_failed(self, job_id: str, error: Exception) -> None:
        stream = self._streams.get(job_id)
        if stream is None:
            return
        stream.on_error(error)
        self._retire(stream)

    def _retire(self, stream: RequestStream) -> None:
        if self._streams.pop(stream.job_id, None) is None:
            return
        name = self._stream_model.pop(stream.job_id, None)
        self.outcomes[stream.finish or "error"] += 1
        self.prompt_tokens_total += stream.prompt_tokens
        self.generated_tokens_total += stream.generated
        self.reused_tokens_total += stream.reused
        self._completions.append(time.monotonic())
        self._finished.append(stream)
        loaded = self._models.get(name) if name else None
        if loaded is not None:
            loaded.active = max(0, loaded.active - 1)
            loaded.last_used = time.monotonic()
            if loaded.active == 0:
                self._arm_keep_alive(loaded)
        for listener in self.listeners:
            listener(stream)

    # ---- models --------------------------------------------------------------------------

    def resolve(self, name: str | None) -> ModelRef:
        return self._resolve(name)

    async def ensure_loaded(
        self, model: ModelRef, *, keep_alive: float | None = None, num_ctx: int | None = None
    ) -> LoadedModel:
        """Load `model` on its own engine thread unless it is already loaded."""
        async with self._load_lock:
            loaded = self._models.get(model.name)
            if loaded is not None and loaded.worker.alive:
                return loaded
            if loaded is not None:  # its thread died (gave up after faults): start afresh
                self._models.pop(model.name, None)
            await self._make_room()
            started = time.monotonic()
            loop = asyncio.get_running_loop()
            callbacks = WorkerCallbacks(
                ready=self._on_ready,
                admitted=self._on_admitted,
                context=self._on_context,
                updates=self._on_updates,
                failed=self._on_failed,
            )
            worker = EngineWorker(
                model.name,
                lambda: self._engine_factory(model, self.settings, num_ctx),
                callbacks,
                loop.call_soon_threadsafe,
                queue_timeout=self.settings.queue_timeout,
            )
            worker.start()
            try:
                info = await asyncio.wrap_future(worker.loaded)
            except KinferError:
                raise
            except Exception as exc:
                raise EngineFailure(f"could not load {model.name}: {exc}") from exc
            default_keep = self.settings.keep_alive_seconds
            loaded = LoadedModel(
                model=model,
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
                time.monotonic() - started,
            )
            self._models[model.name] = loaded
            self._arm_keep_alive(loaded)
            return loaded

    async def load(self, name: str | None, *, keep_alive: float | None = None) -> LoadedModel:
        """Ollama's empty-prompt generate: load (or refresh keep-alive) without generating."""
        loaded = await self.ensure_loaded(self._resolve(name), keep_alive=keep_alive)
        if keep_alive is not None:
            loaded.keep_alive = keep_alive
        if keep_alive == 0 and loaded.active == 0:
            await self.unload(loaded.name)
        else:
            self._arm_keep_alive(loaded)
        return loaded

    async def unload(self, name: str) -> bool:
        """Stop the model's engine thread; its in-flight requests fail with a clear error."""
        loaded = self._models.pop(name, None)
        if loaded is None:
            return False
        await asyncio.to_thread(loaded.worker.stop)
        log.info("unloaded %s", name)
        return True

    async def unload_matching(self, path_owner: Callable[[ModelRef], bool]) -> None:
        """Unload every loaded model for which `path_owner` says yes (rm of a loaded model)."""
        for name, loaded in list(self._models.items()):
            if path_owner(loaded.model):
                await self.unload(name)

    def loaded_models(self) -> list[LoadedModel]:
        return list(self._models.values())

    async def _make_room(self) -> None:
        """One model at a time by default: wait for the least recently used idle model and unload it."""
        while len(self._models) >= max(1, self.settings.max_loaded):
            idle = [m for m in self._models.values() if m.active == 0]
            if idle:
                victim = min(idle, key=lambda m: m.last_used)
                await self.unload(victim.name)
                continue
            await asyncio.sleep(0.05)

    def _arm_keep_alive(self, loaded: LoadedModel) -> None:
        if loaded.active or loaded.keep_alive < 0:
            loaded.expires_at = None
        else:
            loaded.expires_at = time.monotonic() + loaded.keep_alive

    async def _reap_idle_models(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            now = time.monotonic()
            self._enforce_generation_deadline(now)
            for name, loaded in list(self._models.items()):
                if loaded.active == 0 and loaded.expires_at is not None and now >= loaded.expires_at:
                    await self.unload(name)

    def _enforce_generation_deadline(self, now: float) -> None:
        """End replies that ran past --generation-timeout; they finish with reason "deadline"."""
        limit = self.settings.generation_timeout
        if limit <= 0:
            return
        for stream in list(self._streams.values()):
            if stream.state != "queued" and not stream.deadline_hit and stream.running_for(now) > limit:
                stream.deadline_hit = True
                self._cancel(stream.job_id)

    # ---- numbers -------------------------------------------------------------------------

    def queue_depth(self) -> int:
        """Requests that do not hold a row yet."""
        return sum(1 for s in self._streams.values() if s.state == "queued")

    def retry_after(self) -> float:
        """Seconds until a queued request is likely to get a row, from the recent completion rate."""
        now = time.monotonic()
        recent = [t for t in self._completions if now - t <= COMPLETION_WINDOW_S]
        if len(recent) < 2:
            return 5.0
        rate = len(recent) / max(1.0, now - recent[0])
        return float(min(60.0, max(1.0, self.queue_depth() / rate)))

    def snapshot(self) -> SchedulerSnapshot:
        now = time.monotonic()
        models = []
        for loaded in self._models.values():
            stats = loaded.worker.stats
            models.append(
                ModelSnapshot(
                    name=loaded.name,
                    engine=loaded.info.engine,
                    rows_total=loaded.info.rows,
                    rows_busy=stats.rows_busy,
                    waiting=loaded.worker.waiting_count,
                    context_length=loaded.info.context_length,
                    size=loaded.model.size,
                    expires_in=None if loaded.expires_at is None else max(0.0, loaded.expires_at - now),
                    stats=stats,
                )
            )
        active = [s.snapshot(now) for s in self._streams.values()]
        active += [t.snapshot(now) for t in self._embeds.values()]
        finished = [s.snapshot(now) for s in reversed(self._finished)]
        return SchedulerSnapshot(
            taken_at=time.time(),
            models=tuple(models),
            requests=tuple(active + finished),
            queue_depth=self.queue_depth(),
            outcomes=dict(self.outcomes),
            prompt_tokens_total=self.prompt_tokens_total,
            generated_tokens_total=self.generated_tokens_total,
            reused_tokens_total=self.reused_tokens_total,
            embedded_inputs_total=self.embedded_inputs_total,
            embedded_tokens_total=self.embedded_tokens_total,
        )
