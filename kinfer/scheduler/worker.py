"""The engine thread: owns one loaded model, admits prepared jobs into free rows and steps the batch.

Prompts are rendered and tokenized before they get here, in their request's own task (`prepare`, on
the scheduler's preparation pool): this thread only queues token ids. Nothing here blocks on a
client. Results go back to asyncio with `loop.call_soon_threadsafe`, one call per step for all rows,
so a slow reader only grows its own queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

from kinfer.embedding import EmbedRequest
from kinfer.engines.base import Engine, EngineStats, JobUpdate, ModelInfo
from kinfer.errors import Busy, EngineFailure, InvalidRequest, KinferError
from kinfer.protocol import ChatRequest
from kinfer.scheduler.embed_prepare import EmbedInputs, tokenize_inputs
from kinfer.scheduler.embed_queue import EmbedQueue
from kinfer.scheduler.jobs import Admission, Cancel, Command, EmbedWork, PreparedJob, Shutdown
from kinfer.scheduler.prepare import prepare_job

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.25  # how long an idle engine thread sleeps between checks of its inbox
MAX_RELOADS = 3  # consecutive engine faults before the model is given up
STATS_INTERVAL_S = 0.1  # how stale the published EngineStats may get while the batch runs
LEASE_WAIT_S = 30.0  # how long closing an engine waits for preparations still using its tokenizer


@dataclass(frozen=True)
class WorkerCallbacks:
    """How the engine thread reports back; each callable is invoked on the event loop."""

    admitted: Callable[[list[tuple[str, int]]], None]  # (job, prompt tokens adopted) just took a row
    context: Callable[[str, list[int]], None]  # prompt + reply token ids, for a job that asked
    updates: Callable[[list[JobUpdate]], None]
    failed: Callable[[str, Exception], None]


class EngineWorker:
    """One model on one thread. `loaded` resolves with the model's `ModelInfo` or the load error."""

    def __init__(
        self,
        name: str,
        make_engine: Callable[[], Engine],
        callbacks: WorkerCallbacks,
        call_soon: Callable[..., object],
        *,
        queue_timeout: float,
    ) -> None:
        self.name = name
        self._make_engine = make_engine
        self._callbacks = callbacks
        self._loop_call_soon = call_soon  # loop.call_soon_threadsafe
        self._queue_timeout = queue_timeout
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._waiting: deque[Admission] = deque()
        self._active: dict[str, int] = {}  # job -> its rows (choices) not yet finished
        self._contexts: dict[str, list[str]] = {}  # job -> prompt text and the reply so far, if asked
        self._embeds = EmbedQueue(self._call_soon)
        self.loaded: Future[ModelInfo] = Future()
        self.stats = EngineStats()
        self.waiting_count = 0
        self.faults = 0
        self._engine: Engine | None = None  # owned by the engine thread; closed when it ends
        # preparation threads borrow the engine's tokenizer (`prepare`); closing waits for them
        self._leases = 0
        self._lease_lock = threading.Condition()
        self._gone = False  # the engine thread has ended: no engine will come back
        self._thread = threading.Thread(target=self._run, name=f"engine:{name}", daemon=True)

    # ---- called from the event loop ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def send(self, command: Command) -> None:
        with self._lease_lock:
            if not self._gone:
                self._inbox.put(command)
                return
        self._refuse(command, self._callbacks.failed)  # it arrived while the model was unloaded

    def stop(self, timeout: float = 30.0) -> None:
        self._inbox.put(Shutdown())
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """False from the moment the engine thread stops serving (a new request loads a fresh one)."""
        return self._thread.is_alive() and not self._gone

    # ---- called from preparation threads -------------------------------------------------

    def prepare(self, request: ChatRequest, job_id: str) -> PreparedJob:
        """Render, tokenize and fit `request` with this model's template and tokenizer, on the
        caller's thread (tokenizers release the GIL; llama.cpp's tokenizer reads the vocabulary only).

        A failure the request caused (a template that raises, text the tokenizer rejects) is a 400;
        the rows in the batch never notice it."""
        with self._lease() as engine:
            try:
                return prepare_job(engine.info, engine.tokenize, request, job_id, engine.detokenize)
            except KinferError:
                raise
            except Exception as exc:
                log.info("%s: preparing the prompt failed: %s: %s", job_id, type(exc).__name__, exc)
                raise InvalidRequest(f"could not prepare the prompt: {type(exc).__name__}: {exc}") from exc

    def prepare_embed(self, request: EmbedRequest) -> EmbedInputs:
        """Tokenize and fit an embedding request's inputs on the caller's thread (as `prepare`)."""
        with self._lease() as engine:
            try:
                return tokenize_inputs(engine, request)
            except KinferError:
                raise
            except Exception as exc:
                log.info(
                    "%s: tokenizing the inputs failed: %s: %s", request.request_id, type(exc).__name__, exc
                )
                raise InvalidRequest(f"could not tokenize the inputs: {type(exc).__name__}: {exc}") from exc

    @contextmanager
    def _lease(self) -> Iterator[Engine]:
        with self._lease_lock:
            # while a faulted model reloads, wait for the fresh engine rather than fail the request
            self._lease_lock.wait_for(lambda: self._engine is not None or self._gone, LEASE_WAIT_S)
            engine = self._engine
            if engine is None or self._gone:
                raise EngineFailure(f"model {self.name} is not loaded")
            self._leases += 1
        try:
            yield engine
        finally:
            with self._lease_lock:
                self._leases -= 1
                self._lease_lock.notify_all()

    def _close_engine(self, engine: Engine) -> None:
        """Take the engine away from new preparations, wait for those using it, then close it."""
        with self._lease_lock:
            if self._engine is engine:
                self._engine = None
            if not self._lease_lock.wait_for(lambda: self._leases == 0, LEASE_WAIT_S):
                log.warning("closing %s while %d prompt preparations still run", self.name, self._leases)
        try:
            engine.close()
        except Exception:
            log.exception("closing the engine of %s", self.name)

    # ---- the engine thread ---------------------------------------------------------------

    def _call_soon(self, callback: Callable[..., object], *args: object) -> None:
        try:
            self._loop_call_soon(callback, *args)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening any more
            self._inbox.put(Shutdown())

    def _run(self) -> None:
        # RUNNING from here on: a requester that leaves can no longer cancel `loaded`, so the result
        # below always lands and the scheduler owns the engine; cancelled before we start: skip the load
        if not self.loaded.set_running_or_notify_cancel():
            return
        try:
            engine = self._make_engine()
        except BaseException as exc:  # a load failure is reported, never raised into the void
            log.exception("loading %s failed", self.name)
            self.loaded.set_exception(exc)
            return
        with self._lease_lock:
            self._engine = engine
        self.loaded.set_result(engine.info)
        try:
            self._serve()
        except BaseException as exc:  # a bug here must not leave replies waiting forever
            log.exception("the engine thread of %s failed", self.name)
            self._mark_gone()  # before the replies fail, so that a retry loads a fresh engine
            self._fail_all(EngineFailure(f"the engine thread of {self.name} failed: {type(exc).__name__}"))
        finally:
            self._mark_gone()
            if self._engine is not None:
                self._close_engine(self._engine)
            self._refuse_inbox()

    def _mark_gone(self) -> None:
        with self._lease_lock:
            self._gone = True
            self._lease_lock.notify_all()

    def _refuse_inbox(self) -> None:
        """Fail the jobs that arrived after the last turn: nothing will take them now."""
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._refuse(command, lambda job, error: self._call_soon(self._callbacks.failed, job, error))

    def _refuse(self, command: Command, failed: Callable[[str, Exception], object]) -> None:
        error = EngineFailure(f"model {self.name} was unloaded")
        if isinstance(command, Admission):
            failed(command.job_id, error)
        elif isinstance(command, EmbedWork) and command.reply.set_running_or_notify_cancel():
            command.reply.set_exception(error)

    def _serve(self) -> None:
        """Admit, step and report until shut down (or until the model keeps failing)."""
        engine = self._engine
        assert engine is not None
        self.stats = engine.stats()
        stats_at = time.monotonic()
        reloads = 0
        while True:
            admissible = bool(self._waiting) and engine.free_rows >= self._waiting[0].prepared.job.choices
            busy = engine.has_work or admissible or bool(self._embeds)
            if not self._drain_inbox(engine, block=not busy):
                return
            self._expire_waiting()
            self._admit(engine)
            if self._embeds:  # one bounded embedding pass per turn, between chat steps
                try:
                    self._embeds.run_pass(engine)
                except Exception as exc:  # never the engine thread's end: fail the embeddings only
                    log.exception("embedding on %s failed", self.name)
                    self._embeds.fail_all(EngineFailure(f"embedding failed: {exc}"))
                if not engine.has_work:  # the chat path below refreshes them otherwise
                    self.stats, stats_at = engine.stats(), time.monotonic()
            if not engine.has_work:
                continue
            try:
                updates = engine.step()
            except Exception as exc:  # an engine fault fails its rows, then the model is reloaded
                fresh, reloads = self._recover(engine, exc, reloads)
                if fresh is None:
                    return
                with self._lease_lock:
                    engine = self._engine = fresh
                    self._lease_lock.notify_all()
                continue
            reloads = 0
            if updates:
                held = []  # finishing updates that wait for their context's token ids
                for update in updates:
                    if self._contexts and update.job_id in self._contexts and self._follow_context(update):
                        held.append(update)
                    if update.finish is not None and update.job_id in self._active:
                        self._active[update.job_id] -= 1
                        if self._active[update.job_id] <= 0:
                            del self._active[update.job_id]
                if held:
                    updates = [u for u in updates if all(u is not h for h in held)]
                if updates:
                    self._call_soon(self._callbacks.updates, updates)
            # stats are read a few times a second (dashboard, /metrics): not every step, but always
            # once the batch drains so an idle model never shows stale busy rows
            now = time.monotonic()
            if not engine.has_work or now - stats_at >= STATS_INTERVAL_S:
                self.stats, stats_at = engine.stats(), now

    def _drain_inbox(self, engine: Engine, *, block: bool) -> bool:
        """Handle every pending command; False once asked to shut down."""
        try:
            command = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(command, Shutdown):
                self._mark_gone()
                self._fail_all(EngineFailure(f"model {self.name} was unloaded"))
                return False
            if isinstance(command, Admission):
                self._enqueue(command)
            elif isinstance(command, Cancel):
                self._cancel(engine, command.job_id)
            elif isinstance(command, EmbedWork):
                self._embeds.add(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _enqueue(self, admission: Admission) -> None:
        """Queue a prepared job for a row (its prompt was rendered and tokenized in its own task)."""
        self._waiting.append(admission)
        self.waiting_count = len(self._waiting)
        if admission.request.return_context:
            self._contexts[admission.job_id] = [admission.prepared.rendered.text]

    def _follow_context(self, update: JobUpdate) -> bool:
        """Keep the reply's text for a job that wants its context. At the end, prompt and reply are
        tokenized together (as Ollama does) on a thread of their own, not the engine's (a long
        conversation would stall every row), and the ids are sent ahead of the finishing update, which
        that thread delivers: True when it took the update over."""
        pieces = self._contexts[update.job_id]
        pieces.append(update.text)
        if update.finish is None:
            return False
        del self._contexts[update.job_id]
        if update.finish == "cancelled":
            return False  # nobody is left to read it
        text = "".join(pieces)
        threading.Thread(
            target=self._send_context, args=(update, text), name=f"context:{update.job_id}", daemon=True
        ).start()
        return True

    def _send_context(self, finishing: JobUpdate, text: str) -> None:
        """Tokenize a finished job's context with the engine's tokenizer, then send the ids and the
        job's finishing update, in that order (a reply without its ids rather than none at all)."""
        try:
            with self._lease() as engine:
                tokens = engine.tokenize(text)
            self._call_soon(self._callbacks.context, finishing.job_id, tokens)
        except Exception:
            log.exception("tokenizing the context of %s", finishing.job_id)
        self._call_soon(self._callbacks.updates, [finishing])

    def _admit(self, engine: Engine) -> None:
        admitted = []
        # first come, first served: a job asking for n choices waits until n rows are free
        while self._waiting and engine.free_rows >= self._waiting[0].prepared.job.choices:
            item = self._waiting.popleft()
            try:
                reused = engine.submit(item.prepared.job)
            except Exception as exc:  # a KinferError keeps its status (a refused prompt stays a 400)
                error = exc if isinstance(exc, KinferError) else EngineFailure(str(exc))
                self._call_soon(self._callbacks.failed, item.job_id, error)
                self._contexts.pop(item.job_id, None)
                continue
            self._active[item.prepared.job.job_id] = item.prepared.job.choices
            admitted.append((item.prepared.job.job_id, reused or 0))
        self.waiting_count = len(self._waiting)
        if admitted:
            self._call_soon(self._callbacks.admitted, admitted)

    def _cancel(self, engine: Engine, job_id: str) -> None:
        if self._embeds.cancel(job_id):
            return
        for item in self._waiting:
            if item.job_id == job_id:
                self._waiting.remove(item)
                self.waiting_count = len(self._waiting)
                self._contexts.pop(job_id, None)
                choices = range(item.prepared.job.choices)
                cancelled = [JobUpdate(job_id, finish="cancelled", choice=c) for c in choices]
                self._call_soon(self._callbacks.updates, cancelled)
                return
        if job_id in self._active:
            engine.cancel(job_id)

    def _expire_waiting(self) -> None:
        if not self._waiting or self._queue_timeout <= 0:
            return
        now = time.monotonic()
        while self._waiting and now - self._waiting[0].enqueued_at > self._queue_timeout:
            item = self._waiting.popleft()
            error = Busy(f"waited {self._queue_timeout:.0f}s for a free row", retry_after=5)
            self._call_soon(self._callbacks.failed, item.job_id, error)
            self._contexts.pop(item.job_id, None)
        self.waiting_count = len(self._waiting)

    def _recover(self, engine: Engine, exc: Exception, reloads: int) -> tuple[Engine | None, int]:
        """Fail the rows that were running, reload the model, keep the queue."""
        self.faults += 1
        log.exception(
            "engine %s failed; failing %d running replies and reloading", self.name, len(self._active)
        )
        error = EngineFailure(f"the engine failed while generating: {type(exc).__name__}: {exc}")
        for job_id in list(self._active):
            self._call_soon(self._callbacks.failed, job_id, error)
            self._contexts.pop(job_id, None)
        self._active.clear()
        self._close_engine(engine)
        if reloads + 1 > MAX_RELOADS:
            self._mark_gone()
            self._fail_all(EngineFailure(f"model {self.name} keeps failing; unloaded"))
            return None, reloads
        try:
            fresh = self._make_engine()
        except Exception as load_exc:
            self._mark_gone()
            self._fail_all(EngineFailure(f"reloading {self.name} failed: {load_exc}"))
            return None, reloads
        return fresh, reloads + 1

    def _fail_all(self, error: Exception) -> None:
        self._embeds.fail_all(error)
        for job_id in list(self._active):
            self._call_soon(self._callbacks.failed, job_id, error)
        for item in self._waiting:
            self._call_soon(self._callbacks.failed, item.job_id, error)
        self._active.clear()
        self._waiting.clear()
        self._contexts.clear()
        self.waiting_count = 0
