"""Admission, model loading and unloading, keep-alive, and routing engine results to requests.

Knows nothing of HTTP or Textual: dialects call `submit` and iterate the returned stream.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from kinfer.config import Settings
from kinfer.embedding import EmbedRequest, EmbedResult, check_embed_request, finish_vector
from kinfer.engines.base import JobUpdate
from kinfer.errors import Busy, EngineFailure, InvalidRequest, KinferError
from kinfer.protocol import ChatRequest, validate_request
from kinfer.scheduler.embed_ticket import EmbedTicket
from kinfer.scheduler.jobs import Admission, Cancel, EmbedWork, PreparedJob
from kinfer.scheduler.models import ModelPool
from kinfer.scheduler.records import (
    EngineFactory,
    IsPresent,
    LoadedModel,
    ModelRef,
    ModelResolver,
    ModelSnapshot,
    SchedulerSnapshot,
    model_key,
)
from kinfer.scheduler.stream import RequestStream
from kinfer.scheduler.worker import WorkerCallbacks

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 0.5
DRAIN_POLL_S = 0.05
RECENT_FINISHED = 64  # finished requests kept for the dashboard's fade-out and the request log
COMPLETION_WINDOW_S = 60.0
# threads that render and tokenize prompts, off the engine threads (tokenizers release the GIL)
PREPARE_THREADS = max(2, min(8, os.cpu_count() or 2))


class Scheduler:
    """Turns `ChatRequest`s into streams of events from engine threads."""

    def __init__(
        self,
        settings: Settings,
        resolve: ModelResolver,
        engine_factory: EngineFactory,
        *,
        is_present: IsPresent | None = None,
    ) -> None:
        self.settings = settings
        self._resolve = resolve
        callbacks = WorkerCallbacks(
            admitted=self._on_admitted,
            context=self._on_context,
            updates=self._on_updates,
            failed=self._on_failed,
        )
        self._pool = ModelPool(
            settings,
            engine_factory,
            callbacks,
            is_present=is_present or (lambda _model: True),
            retry_after=self.retry_after,
        )
        self._prepare_pool = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="kinfer-prepare")
        self._streams: dict[str, RequestStream] = {}
        self._stream_model: dict[str, LoadedModel] = {}
        self._admitting = 0  # requests past the queue check that wait for their model to load
        self._finished: deque[RequestStream | EmbedTicket] = deque(maxlen=RECENT_FINISHED)
        self._completions: deque[float] = deque(maxlen=4096)
        self._reaper: asyncio.Task | None = None
        self.draining = False  # shutting down: new requests are refused, admitted ones finish
        self._ended: KinferError | None = None  # set once the drain's grace is over
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
        # a failure no engine can report, polled (a distributed rank lost while rank 0's engine thread
        # waits in a collective that never returns): its reason ends every reply and refuses new ones
        self.fault: Callable[[], str | None] | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_idle_models(), name="kinfer-keepalive")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        await self._pool.close()
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)

    async def drain(self, grace: float, hurry: asyncio.Event | None = None) -> None:
        """Shutting down: refuse new requests (Busy), let admitted ones finish for up to `grace`
        seconds (or until `hurry` is set), then end the rest with an error their dialect renders."""
        self.draining = True
        deadline = time.monotonic() + max(0.0, grace)
        if self._streams or self._embeds or self._admitting:
            log.info("shutting down: waiting up to %.0fs for %d replies", grace, len(self._streams))
        while (self._streams or self._embeds or self._admitting) and time.monotonic() < deadline:
            if hurry is not None and hurry.is_set():
                break
            await asyncio.sleep(DRAIN_POLL_S)
        self._ended = Busy("the server is shutting down; try again shortly", retry_after=5)
        if self._streams:
            log.warning("shutting down: ending %d replies that did not finish in time", len(self._streams))
        for stream in list(self._streams.values()):
            self._cancel(stream.job_id)  # frees the row; the stream ends with the error below
            stream.on_error(self._ended)
            self._retire(stream)

    def _refuse_when_draining(self) -> None:
        if self.draining:
            raise self._ended or Busy("the server is shutting down; try again shortly", retry_after=5)

    # ---- requests ------------------------------------------------------------------------

    async def submit(self, request: ChatRequest) -> RequestStream:
        """Queue a request; returns once its prompt is rendered and fits, so refusals come before headers.

        The prompt is rendered and tokenized here, in the request's own task on a preparation thread,
        so a long prompt (or a failing template) never holds the engine thread the batch runs on.

        Every dialect's request is checked here (`validate_request`), so no path skips the checks.
        A request waiting for its model to load counts against --max-queue like one waiting for a row."""
        validate_request(request)
        self._refuse_when_draining()
        if (error := self._faulted()) is not None:
            raise error
        model = self._resolve(request.model or None)
        if self.queue_depth() >= self.settings.max_queue:
            self.outcomes["rejected"] += 1
            raise Busy(
                f"{self.queue_depth()} requests are already waiting; try again shortly",
                retry_after=self.retry_after(),
            )
        load_started = time.monotonic()
        self._admitting += 1
        try:
            loaded = await self.ensure_loaded(model, keep_alive=request.keep_alive, num_ctx=request.num_ctx)
        finally:
            self._admitting -= 1
        if self._ended is not None:  # the drain ended while this request waited for its model
            self._unpin(loaded)
            raise self._ended
        if 1 < request.n > loaded.info.rows:  # each choice takes a row: more could never be admitted
            self._unpin(loaded)
            raise InvalidRequest(
                f"n: {model.name} decodes {loaded.info.rows} replies at once here; ask for at most "
                f"{loaded.info.rows} choices (or start kinfer with a larger --parallel)"
            )
        load_seconds = time.monotonic() - load_started
        job_id = request.request_id or uuid.uuid4().hex
        if job_id in self._streams:
            job_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
        # the request's clock starts before the load, so total time includes it (Ollama's total_duration);
        # the reply names the model as asked (an alias stays the alias), not as it was first loaded
        stream = RequestStream(request, job_id, model.name, on_cancel=self._cancel, arrived=load_started)
        stream.load_seconds = load_seconds
        for observer in self.submitted:
            observer(stream)
        self._streams[job_id] = stream
        self._stream_model[job_id] = loaded  # the stream holds the pin ensure_loaded took
        if request.keep_alive is not None:
            loaded.keep_alive = request.keep_alive
        try:
            prepared = await self._prepare(loaded, request, job_id)
        except Exception as exc:
            stream.on_error(exc)
            self._retire(stream)
            raise
        except BaseException:  # the client left while its prompt was prepared
            self._retire(stream)
            raise
        if stream.done:  # the shutdown drain ended it meanwhile
            raise self._ended or Busy("the server is shutting down; try again shortly", retry_after=5)
        stream.on_ready(prepared)
        loaded.worker.send(Admission(request=request, job_id=job_id, prepared=prepared))
        return stream

    async def _prepare(self, loaded: LoadedModel, request: ChatRequest, job_id: str) -> PreparedJob:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._prepare_pool, loaded.worker.prepare, request, job_id)

    async def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens `request` would take, rendered with the model's template (loads the model)."""
        validate_request(request)
        self._refuse_when_draining()
        loaded = await self.ensure_loaded(self._resolve(request.model or None), keep_alive=request.keep_alive)
        try:
            prepared = await self._prepare(loaded, request, "measure")
        finally:
            self._unpin(loaded)
        return prepared.prompt_tokens

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embed every input of `request`: tokenized here (on the preparation pool), embedded on the
        model's engine thread, batched with the other embedding requests of the same model and
        interleaved with its chat steps."""
        self._refuse_when_draining()
        model = self._resolve(request.model or None)
        if self.queue_depth() + len(self._embeds) >= self.settings.max_queue:
            self.outcomes["rejected"] += 1
            raise Busy(f"{self.queue_depth()} requests are already waiting; try again shortly", retry_after=5)
        started = time.monotonic()
        self._admitting += 1
        try:
            loaded = await self.ensure_loaded(model, keep_alive=request.keep_alive, num_ctx=request.num_ctx)
        finally:
            self._admitting -= 1
        try:
            check_embed_request(request, loaded.info)
        except BaseException:
            self._unpin(loaded)
            raise
        job_id = request.request_id or uuid.uuid4().hex
        if job_id in self._embeds or job_id in self._streams:
            job_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
        ticket = EmbedTicket(request, job_id, model.name)
        ticket.load_seconds = time.monotonic() - started
        for observer in self.submitted:
            observer(ticket)
        self._embeds[job_id] = ticket  # the ticket holds the pin ensure_loaded took
        if request.keep_alive is not None:
            loaded.keep_alive = request.keep_alive
        reply: Future[tuple[list, list[int]]] = Future()
        try:
            # tokenized in this request's task: the engine thread only decodes
            loop = asyncio.get_running_loop()
            inputs = await loop.run_in_executor(self._prepare_pool, loaded.worker.prepare_embed, request)
            ticket.prompt_tokens = sum(len(i) for i in inputs)
            loaded.worker.send(EmbedWork(request, job_id, inputs, reply, ticket.on_progress))
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
            model=model.name,
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
        self._unpin(loaded)
        for listener in self.listeners:
            listener(ticket)

    def _cancel(self, job_id: str) -> None:
        loaded = self._stream_model.get(job_id)
        if loaded is not None:
            loaded.worker.send(Cancel(job_id))

    # ---- callbacks from engine threads (run on the loop) ---------------------------------

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
            if stream.done:
                if stream.unfinished_choices():  # one choice failed: the others' rows are freed too
                    self._cancel(stream.job_id)
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
        loaded = self._stream_model.pop(stream.job_id, None)
        if stream.finish is None:  # its client left before the prompt was ready: a cancellation
            for choice in stream.unfinished_choices():
                stream.on_update(JobUpdate(stream.job_id, finish="cancelled", choice=choice))
        self.outcomes[stream.finish or "error"] += 1
        self.prompt_tokens_total += stream.prompt_tokens
        self.generated_tokens_total += stream.generated
        self.reused_tokens_total += stream.reused
        self._completions.append(time.monotonic())
        self._finished.append(stream)
        if loaded is not None:
            self._unpin(loaded)
        for listener in self.listeners:
            listener(stream)

    # ---- models --------------------------------------------------------------------------

    def resolve(self, name: str | None) -> ModelRef:
        return self._resolve(name)

    async def ensure_loaded(
        self, model: ModelRef, *, keep_alive: float | None = None, num_ctx: int | None = None
    ) -> LoadedModel:
        """`model` loaded on its own engine thread, pinned for the caller (`_unpin` when done)."""
        return await self._pool.acquire(model, keep_alive=keep_alive, num_ctx=num_ctx)

    def _unpin(self, loaded: LoadedModel) -> None:
        self._pool.release(loaded)

    async def load(self, name: str | None, *, keep_alive: float | None = None) -> ModelRef:
        """Ollama's empty-prompt generate: load (or refresh keep-alive) without generating.
        Returns the model as `name` resolved (its name is the one to echo)."""
        self._refuse_when_draining()
        model = self._resolve(name)
        loaded = await self.ensure_loaded(model, keep_alive=keep_alive)
        if keep_alive is not None:
            loaded.keep_alive = keep_alive
        self._unpin(loaded)
        if keep_alive == 0 and loaded.active == 0:
            await self._pool.unload(loaded.key)
        return model

    def find_loaded(self, name: str) -> LoadedModel | None:
        """The loaded model `name` reaches, whatever name it was loaded as: an alias finds the model
        loaded under its target's name and the other way round. None when it is not loaded."""
        try:
            model = self._resolve(name)
        except KinferError:  # not in the store (any more): a name it was asked by still finds it
            return self._pool.find(name)
        return self._pool.models.get(model_key(model))

    async def unload(self, name: str) -> bool:
        """Stop the engine thread `name` reaches now; its in-flight requests fail with a clear error."""
        loaded = self.find_loaded(name)
        return loaded is not None and await self._pool.unload(loaded.key)

    async def unload_when_idle(self, name: str) -> bool:
        """Ollama's `keep_alive: 0`: unload once the requests in flight end, never under them."""
        loaded = self.find_loaded(name)
        return loaded is not None and await self._pool.unload_when_idle(loaded.key)

    def forget_alias(self, alias: str, target: str) -> None:
        """The alias `alias` of `target` was deleted: the model it reached stays loaded, named by its
        target from now on when the alias was the name it was loaded by (so /api/ps never shows a
        name the store no longer has)."""
        loaded = self._pool.find(alias)
        if loaded is None:
            return
        if loaded.model.name == alias:
            try:
                loaded.model = self._resolve(target)
            except KinferError:  # the target went too: its files' check unloads it
                return
        first = loaded.model.name
        loaded.names[:] = [first] + [n for n in loaded.names if n not in (alias, first)]

    async def unload_matching(self, path_owner: Callable[[ModelRef], bool]) -> None:
        """Unload every loaded model for which `path_owner` says yes (rm of a loaded model)."""
        for loaded in self.loaded_models():
            if path_owner(loaded.model):
                await self._pool.unload(loaded.key)

    async def forget_removed(self) -> None:
        """Models whose files `kinfer rm` removed elsewhere: unloaded when idle, no new requests."""
        await self._pool.forget_removed()

    def loaded_models(self) -> list[LoadedModel]:
        return list(self._pool.models.values())

    async def _reap_idle_models(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            now = time.monotonic()
            self._enforce_generation_deadline(now)
            self._end_replies_on_fault()
            await self._pool.reap(now)

    def _faulted(self) -> EngineFailure | None:
        reason = self.fault() if self.fault is not None else None
        return None if reason is None else EngineFailure(f"the distributed group failed: {reason}")

    def _end_replies_on_fault(self) -> None:
        """A fault ends the replies in flight here, whatever their engine thread is waiting in."""
        error = self._faulted()
        if error is not None:
            for job_id in list(self._streams):
                self._on_failed(job_id, error)

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
        """Requests that do not hold a row yet, those waiting for their model to load included."""
        return self._admitting + sum(1 for s in self._streams.values() if s.state == "queued")

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
        for loaded in self._pool.models.values():
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
                    names=tuple(loaded.names),
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
